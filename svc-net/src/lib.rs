//! svc's networking: tower Services that move bytes.
//!
//! Modules follow a connection as it travels: listen → route (peek, detect, ALPN/SNI) →
//! handlers (web, SSH, databases) → tunnel → dial. [`node`] composes them into the processes
//! `svc start` runs (Auth Service, Proxy Service, agent), and [`diag`] is the health and metrics
//! Service every process serves.
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]

#[cfg(feature = "auth")]
pub mod auth;
pub mod diag;
pub mod dial;
pub mod listen;
#[cfg(feature = "node")]
pub mod node;
pub mod proxy;
pub mod route;
#[cfg(feature = "services")]
pub mod services;
#[cfg(feature = "tunnel")]
pub mod ssh;
pub mod tls;
#[cfg(feature = "tunnel")]
pub mod tunnel;
pub mod web;

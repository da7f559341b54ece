//! svc's networking: tower Services that move bytes.
//!
//! Modules follow a connection as it travels: listen → route (peek, detect, ALPN/SNI) →
//! handlers (web, SSH, databases) → tunnel → dial. [`node`] composes them into the processes
//! `svc start` runs (Auth Service, Proxy Service, agent), and [`diag`] is the health and metrics
//! Service every process serves.
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]

pub mod auth;
pub mod diag;
pub mod dial;
pub mod listen;
pub mod node;
pub mod proxy;
pub mod route;
pub mod services;
pub mod ssh;
pub mod tls;
pub mod tunnel;
pub mod web;

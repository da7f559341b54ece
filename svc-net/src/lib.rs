//! svc's networking: tower Services that move bytes.
//!
//! Modules follow a connection as it travels: listen → route (peek, detect, ALPN/SNI) →
//! handlers (web, SSH, databases) → tunnel → dial.
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]

pub mod auth;
pub mod dial;
pub mod listen;
pub mod proxy;
pub mod route;
pub mod services;
pub mod ssh;
pub mod tls;
pub mod tunnel;
pub mod web;

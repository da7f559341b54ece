//! svc's automatic agent updates: version channels and the critical flag, schedule export,
//! and the Linux and Kubernetes updaters.
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]

pub mod channel;
pub mod export;
#[cfg(feature = "kube")]
pub mod kube;
pub mod linux;
pub mod target;

//! svc's automatic agent updates: the Linux and Kubernetes updaters, and the client that asks
//! a proxy's version server for a channel's target ([`target`]). The version server itself
//! (`svc_net::web::version`) and the agent's schedule export (`svc_net::node::agent::export`)
//! run in the proxy and the agent.
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]

#[cfg(feature = "kube")]
pub mod kube;
pub mod linux;
pub mod target;

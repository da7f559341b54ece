//! The agent side: what runs on a host that offers resources through the cluster.

#[cfg(feature = "node")]
pub mod node;
#[cfg(feature = "services")]
pub mod services;
pub mod ssh;

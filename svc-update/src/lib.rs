//! svc's automatic agent updates: the Linux and Kubernetes updaters, and the client that asks
//! a proxy's version server for a channel's target ([`target`]). The version server itself
//! (`svc_net::proxy::web::version`) and the agent's schedule export (`svc_net::agent::node::export`)
//! run in the proxy and the agent.
//!
//! # Entry points
//!
//! | what | where |
//! |---|---|
//! | ask a version server for a channel's target | [`VersionClient`], [`channel_url`], [`tls_config`] |
//! | one run of the Linux updater (`svc-upgrade run`) | [`linux::Runner`], [`linux::UpgradeConfig`] |
//! | the Linux updater's decision alone | [`linux::decide`] |
//! | the Kubernetes updater controller (feature `kube`) | `kube::UpdaterConfig`, `kube::decide` |
//!
//! Everything else is `pub(crate)`: what stays public is what the binaries (`svc-upgrade`,
//! `svc-kube-updater`) and the integration tests need.
//!
//! # Example
//!
//! Ask a proxy which version the `stable/rolling` channel serves, through the proxy
//! environment (`HTTPS_PROXY`, `NO_PROXY`):
//!
//! ```no_run
//! # async fn run() -> Result<(), svc_update::TargetError> {
//! use svc_update::{Trust, VersionClient, channel_url, tls_config};
//!
//! let url = channel_url("proxy.example.com:443", "stable/rolling")?;
//! let client = VersionClient::from_env(url, tls_config(Trust::Roots(None))?)?;
//! let target = client.target().await?;
//! println!("{target:?}");
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]

#[cfg(feature = "kube")]
pub mod kube;
pub mod linux;
pub mod target;

pub use target::{Target, TargetError, Trust, VersionClient, channel_url, tls_config};

//! Processes as library types: what `svc start` runs, for a product to embed.
//!
//! Each node is built from the validated configuration (`…::from_config`) or by hand, started
//! with `start`, and stopped through the handle `start` returns:
//!
//! | node | runs | handle |
//! |---|---|---|
//! | [`AuthServer`] | the backend, the CAs, the Auth gRPC API, the admin identity for `tctl` | [`RunningAuth`] |
//! | [`ProxyServer`] | the Proxy Service's listeners with login, version server, SSH entry, tunnel server and resource routes | [`RunningProxy`](crate::proxy::RunningProxy) |
//! | [`AgentNode`] | SSH, app, database, Kubernetes and desktop services behind a reverse tunnel (or on their own listeners), heartbeats, schedule export, diagnostics | [`RunningNode`] |
//! | [`Cluster`] | whichever of the three one configuration enables, in one process | [`RunningCluster`] |
//!
//! The binaries in `svc-bins` only parse arguments, set up logging and print; everything a test
//! needs to reach is here.

pub mod agent;
mod auth;
mod cluster;
mod error;
mod proxy;

pub use agent::{AgentNode, RunningNode};
pub use auth::{ADMIN_IDENTITY_FILE, AuthServer, BACKEND_FILE, RunningAuth, admin_identity_path};
pub use cluster::{Cluster, RunningCluster};
pub use error::NodeError;
pub use proxy::{ProxyServer, install_resource_routes, proxy_settings};

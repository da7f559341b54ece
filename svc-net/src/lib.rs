//! svc's networking: tower Services that move bytes.
//!
//! Modules follow a connection as it travels: listen → route (peek, detect, ALPN/SNI) →
//! handlers (web, SSH, databases) → tunnel → dial. [`node`] composes them into the processes
//! `svc start` runs (Auth Service, Proxy Service, agent), and [`diag`] is the health and metrics
//! Service every process serves.
//!
//! # Entry points
//!
//! | what | type | feature |
//! |---|---|---|
//! | dial direct or through `HTTPS_PROXY` (also a hyper-util connector) | [`ProxyDialer`] | — |
//! | peek the ClientHello and route by ALPN/SNI | [`Router`] | — |
//! | the accept loop | [`listen::serve`] | — |
//! | the web API: routes, ping, version server | [`WebApi`], [`web::ping::PingService`], [`web::version`] | — |
//! | health and metrics | [`Diagnostics`] | — |
//! | the Auth gRPC API | `auth::AuthClient`, `auth::serve` | `auth` |
//! | reverse tunnels, the SSH Service | `tunnel::TunnelAgent`, `ssh::SshServer` | `tunnel` / `ssh` |
//! | the processes `svc start` runs | `AgentNode`, `AuthServer`, `ProxyServer`, `Cluster` | `node` |
//!
//! # Features
//!
//! The default feature `full` builds everything. With default features off, this crate is the
//! dialer, the router, the listeners, TLS, the web API (ping and version server), the proxy
//! assembly and diagnostics, without tonic, prost, protox (the build script generates nothing),
//! russh, pty-process, redb or argon2. `auth` adds the gRPC API, `tunnel`/`ssh` the SSH
//! transport, `services` Kubernetes and database access, `login` web sign-in, `node` the
//! processes.
//!
//! # Example
//!
//! The dialer as hyper-util's connector: `HTTPS_PROXY`/`NO_PROXY` decide, per request, whether
//! the connection goes through the proxy.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use http_body_util::Empty;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use svc_net::ProxyDialer;
//!
//! let dialer = ProxyDialer::from_env()?;
//! let client = Client::builder(TokioExecutor::new()).build::<_, Empty<bytes::Bytes>>(dialer);
//! let res = client.get("http://updates.example.com/v1/version".parse()?).await?;
//! println!("{}", res.status());
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]

#[cfg(feature = "auth")]
pub mod auth;
pub mod diag;
pub mod dial;
pub mod idle;
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

pub use diag::Diagnostics;
pub use dial::ProxyDialer;
#[cfg(feature = "node")]
pub use node::{AgentNode, AuthServer, Cluster, NodeError, ProxyServer};
pub use route::Router;
pub use web::{WebApi, WebApiService};

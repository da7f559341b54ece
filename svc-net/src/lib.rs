//! svc's networking: tower Services that move bytes.
//!
//! Modules follow a connection as it travels — [`io`] (the accepted connection, replayable) →
//! [`listen`] (accept loop) → [`route`] (peek, detect, ALPN/SNI) → the handlers of whoever runs
//! them → `tunnel` → [`dial`] — and are grouped by who runs them: [`proxy`]
//! (the Proxy Service: listeners, web API, SSH entry, resource entries), `agent` (the SSH
//! Service, app/db/kube/desktop services, the agent node) and `client` (what `tsh` runs: sign-in,
//! the SSH hop, local proxies), on shared foundations ([`tls`], [`http`], `auth`, `ssh`,
//! `tunnel`, `services`).
//! The processes `svc start` runs are library types: `auth::node::AuthServer`,
//! `proxy::node::ProxyServer`, `agent::node::AgentNode`, and `cluster::Cluster` composing them;
//! [`diag`] is the health and metrics Service every process serves. Modules depend on each other
//! in one direction only (no cycles).
//!
//! # Entry points
//!
//! | what | type | feature |
//! |---|---|---|
//! | dial direct or through `HTTPS_PROXY` (also a hyper-util connector) | [`ProxyDialer`] | — |
//! | HTTP(S) requests over TLS and the dialer, with deadlines and a body cap | [`http::HttpClient`] | — |
//! | peek the ClientHello and route by ALPN/SNI | [`Router`] | — |
//! | the accept loop | [`listen::serve`] | — |
//! | the web API: routes, ping, version server | [`WebApi`], [`proxy::web::ping::PingService`], [`proxy::web::version`] | — |
//! | health and metrics | [`Diagnostics`] | — |
//! | the Auth gRPC API | `auth::AuthClient`, `auth::serve` | `auth` |
//! | reverse tunnels, the SSH Service | `tunnel::TunnelAgent`, `agent::ssh::SshServer` | `tunnel` / `ssh` |
//! | the processes `svc start` runs | `AgentNode`, `AuthServer`, `ProxyServer`, `Cluster` | `node` |
//! | the client side `tsh` runs: sign-in, SSH hop, local proxies, kubeconfig | `client::Profile`, `client::sign_in`, `client::ssh` | `client` |
//!
//! # Features
//!
//! The default feature `full` builds everything. With default features off, this crate is the
//! dialer, the HTTP client, the router, the listeners, TLS, the web API (ping and version server), the proxy
//! assembly and diagnostics, without tonic, prost, protox (the build script generates nothing),
//! russh, pty-process, redb or argon2. `auth` adds the gRPC API, `tunnel`/`ssh` the SSH
//! transport, `services` Kubernetes and database access, `login` web sign-in, `node` the
//! processes, `client` the client side.
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

#[cfg(feature = "tunnel")]
pub mod agent;
#[cfg(feature = "auth")]
pub mod auth;
#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "node")]
pub mod cluster;
pub mod conn_upgrade;
pub mod diag;
pub mod dial;
pub mod http;
pub mod idle;
pub mod io;
pub mod listen;
pub mod proxy;
pub mod route;
#[cfg(feature = "services")]
pub mod services;
#[cfg(feature = "tunnel")]
pub mod ssh;
pub mod tls;
#[cfg(feature = "tunnel")]
pub mod tunnel;

#[cfg(feature = "node")]
pub use agent::node::AgentNode;
#[cfg(feature = "node")]
pub use auth::{NodeError, node::AuthServer};
#[cfg(feature = "node")]
pub use cluster::Cluster;
pub use diag::Diagnostics;
pub use dial::ProxyDialer;
#[cfg(feature = "node")]
pub use proxy::node::ProxyServer;
pub use proxy::web::{WebApi, WebApiService};
pub use route::Router;

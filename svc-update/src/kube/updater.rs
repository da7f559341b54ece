//! The `svc-kube-updater` process as a library: [`Updater`] wires the version client, the
//! Kubernetes client, the health and metrics server, leader election and the controller.
//!
//! ```no_run
//! # async fn run() -> svc_update::kube::updater::UpdaterError {
//! use svc_update::kube::{UpdaterConfig, WorkloadKind, updater::Updater};
//!
//! let config = UpdaterConfig::new("svc", "svc-agent", WorkloadKind::StatefulSet, "svc", "registry.example.com/svc");
//! Updater::new(config, "https://proxy.example.com:443", "stable/cloud")
//!     .run()
//!     .await
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use svc_core::clock::SystemClock;

use super::controller::{self, Context, UpdaterConfig};
use super::health::{self, Metrics};
use super::leader::{LeaderElector, LeaderError, LeaseTiming};
use super::target::channel_base_url;
use crate::target::{TargetError, Trust, VersionClient, tls_config};

/// The default address of `/healthz`, `/readyz` and `/metrics`.
pub const DEFAULT_HEALTH_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8080);
/// The default name of the leader-election Lease.
pub const DEFAULT_LEASE_NAME: &str = "svc-kube-updater";

/// Why the updater stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpdaterError {
    /// The version server's client could not be built (TLS trust, `HTTPS_PROXY`).
    #[error(transparent)]
    Target(#[from] TargetError),
    /// No Kubernetes API client configuration (in-cluster or kubeconfig).
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
    /// The health address could not be bound.
    #[error("binding the health address {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Leadership was lost: the process should exit and restart as a standby.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// The controller returned (it runs until leadership is lost).
    #[error("the controller stopped")]
    Stopped,
}

/// The updater for one agent workload.
#[derive(Debug)]
pub struct Updater {
    config: UpdaterConfig,
    version_base_url: String,
    ca_pem: Option<Vec<u8>>,
    health_addr: SocketAddr,
    lease_name: String,
    identity: Option<String>,
}

impl Updater {
    /// Keeps `config`'s workload on the version `channel` of `version_server` (the cluster's
    /// proxy web address, e.g. `https://proxy.example.com:443`) serves.
    pub fn new(config: UpdaterConfig, version_server: &str, channel: &str) -> Self {
        Updater {
            config,
            version_base_url: channel_base_url(version_server, channel),
            ca_pem: None,
            health_addr: DEFAULT_HEALTH_ADDR,
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            identity: None,
        }
    }

    /// An extra CA (PEM) trusted for the version server, on top of the public web roots.
    pub fn ca_pem(mut self, pem: Option<Vec<u8>>) -> Self {
        self.ca_pem = pem;
        self
    }

    /// Where `/healthz`, `/readyz` and `/metrics` are served ([`DEFAULT_HEALTH_ADDR`]).
    pub fn health_addr(mut self, addr: SocketAddr) -> Self {
        self.health_addr = addr;
        self
    }

    /// The leader-election Lease's name, in the agent's namespace ([`DEFAULT_LEASE_NAME`]).
    pub fn lease_name(mut self, name: impl Into<String>) -> Self {
        self.lease_name = name.into();
        self
    }

    /// This replica's identity in the election (the pod name; default
    /// `svc-kube-updater-<pid>`).
    pub fn identity(mut self, identity: Option<String>) -> Self {
        self.identity = identity;
        self
    }

    /// Serves health and metrics, waits to be the leader, then reconciles until leadership is
    /// lost; returns why it stopped ([`UpdaterError::Leader`] or [`UpdaterError::Stopped`] once
    /// running): the process should then exit and restart as a fresh standby. Dropping the
    /// future stops it.
    pub async fn run(self) -> UpdaterError {
        match self.run_inner().await {
            Ok(()) => UpdaterError::Stopped,
            Err(e) => e,
        }
    }

    async fn run_inner(self) -> Result<(), UpdaterError> {
        // HTTPS_PROXY / NO_PROXY are honoured for the version server, like every outbound
        // connection svc makes.
        let target = VersionClient::from_env(
            self.version_base_url,
            tls_config(Trust::Roots(self.ca_pem.as_deref()))?,
        )?;
        let client = kube::Client::try_default().await.map_err(UpdaterError::Client)?;
        let metrics = Arc::new(Metrics::default());
        let listener = tokio::net::TcpListener::bind(self.health_addr)
            .await
            .map_err(|source| UpdaterError::Bind {
                addr: self.health_addr,
                source,
            })?;
        tokio::spawn(health::serve(listener, metrics.clone()));

        let identity = self
            .identity
            .unwrap_or_else(|| format!("svc-kube-updater-{}", std::process::id()));
        let elector = LeaderElector::new(
            client.clone(),
            &self.config.namespace,
            &self.lease_name,
            &identity,
            LeaseTiming::default(),
            metrics.clone(),
        );
        let ctx = Arc::new(Context {
            client,
            config: self.config,
            target: Arc::new(target),
            clock: Arc::new(SystemClock),
            metrics: metrics.clone(),
        });
        metrics.ready.store(true, Ordering::Relaxed);
        elector.run(controller::run(ctx)).await?;
        Ok(())
    }
}

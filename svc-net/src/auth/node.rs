//! The Auth Service node: the backend, the certificate authorities and the gRPC API on 3025.
//!
//! Order at [`AuthServer::start`]: create the data directory → open the backend
//! (`auth_service.storage`: the embedded database, or etcd; or use the one given) → open the Auth Service (the CAs are created on first start) → bind and
//! serve its API over mutual TLS → write the admin identity `tctl` uses on this host.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use svc_core::auth::{AuthService, HostNamePolicy};
use svc_core::backend::{Backend, EmbeddedBackend};
use svc_core::config::{Config, StorageConfig};
use svc_core::identity::{HostCertRequest, SystemRole};
use svc_core::{Addr, SystemClock};
use tokio_util::sync::CancellationToken;

use super::NodeError;
use crate::auth::{ClientIdentity, KeyMaterial};

/// The admin identity file in the data directory: `tctl` on the Auth host uses it.
pub(crate) const ADMIN_IDENTITY_FILE: &str = "admin-identity.json";
/// The embedded backend's file in the data directory.
pub(crate) const BACKEND_FILE: &str = "backend.redb";

/// The admin identity path for a data directory.
pub fn admin_identity_path(data_dir: &Path) -> PathBuf {
    data_dir.join(ADMIN_IDENTITY_FILE)
}

/// What joining agents may not name in their certificates: every name of this cluster's Proxy
/// and Auth Service (public addresses, the cluster name); no extra names are granted.
fn host_name_policy(config: &Config) -> HostNamePolicy {
    let p = &config.proxy;
    let mut reserved: Vec<String> = p
        .public_addr
        .iter()
        .chain(p.ssh_public_addr.iter())
        .chain(p.tunnel_public_addr.iter())
        .chain(p.kube_public_addr.iter())
        .chain(config.auth.public_addrs.iter())
        .map(|a| a.host_str())
        .collect();
    reserved.push(config.cluster_name().to_owned());
    reserved.retain(|n| !n.is_empty());
    HostNamePolicy {
        reserved,
        allowed: Vec::new(),
    }
}

/// An Auth Service, configured and not yet started.
pub struct AuthServer {
    cluster_name: String,
    node_name: String,
    data_dir: PathBuf,
    listen_addr: Addr,
    public_addrs: Vec<Addr>,
    backend: Option<Arc<dyn Backend>>,
    storage: StorageConfig,
    limits: svc_core::auth::LoginLimits,
    names: HostNamePolicy,
    direct: svc_core::auth::DirectDialPolicy,
    listen: crate::listen::ListenOptions,
    grpc_idle_timeout: std::time::Duration,
    tunnel_strategy: svc_core::config::TunnelStrategy,
}

impl std::fmt::Debug for AuthServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthServer")
            .field("cluster_name", &self.cluster_name)
            .field("data_dir", &self.data_dir)
            .field("listen_addr", &self.listen_addr)
            .finish_non_exhaustive()
    }
}

impl AuthServer {
    /// The Auth Service `config` describes (`auth_service`, `svc.data_dir`, `svc.nodename`).
    pub fn from_config(config: &Config) -> Self {
        AuthServer {
            cluster_name: config.cluster_name().to_owned(),
            node_name: config.svc.nodename.clone(),
            data_dir: config.svc.data_dir.clone(),
            listen_addr: config.auth.listen_addr.clone(),
            public_addrs: config.auth.public_addrs.clone(),
            backend: None,
            storage: config.auth.storage.clone(),
            limits: config.auth.authentication.limits(),
            names: host_name_policy(config),
            direct: svc_core::auth::DirectDialPolicy::default()
                .with_allow_loopback(config.auth.direct_dial.allow_loopback),
            listen: crate::listen::ListenOptions::default()
                .with_max_connections(config.auth.connection_limits.max_connections),
            grpc_idle_timeout: config.auth.grpc_idle_timeout,
            tunnel_strategy: config.auth.tunnel_strategy,
        }
    }

    /// How agents spread their tunnels over the proxies (default
    /// `auth_service.tunnel_strategy`).
    pub fn tunnel_strategy(mut self, strategy: svc_core::config::TunnelStrategy) -> Self {
        self.tunnel_strategy = strategy;
        self
    }

    /// How long an Auth API connection may stay open with no call in flight (default
    /// `auth_service.grpc_idle_timeout`).
    pub fn grpc_idle_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.grpc_idle_timeout = timeout;
        self
    }

    /// The Auth API listener's limits (connection cap, drain time; default
    /// [`ListenOptions::default`](crate::listen::ListenOptions::default)).
    pub fn listen_options(mut self, options: crate::listen::ListenOptions) -> Self {
        self.listen = options;
        self
    }

    /// Stores the cluster's state in `backend` instead of the embedded database of the data
    /// directory.
    pub fn backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Which names joining agents may carry in their certificates (default: none of the
    /// cluster's Proxy and Auth Service names, no extra names).
    pub fn host_name_policy(mut self, names: HostNamePolicy) -> Self {
        self.names = names;
        self
    }

    /// Which listeners directly joined agents may announce (default: from
    /// `auth_service.direct_dial`; the Auth API's and the proxy's bound addresses are added).
    pub fn direct_dial_policy(mut self, policy: svc_core::auth::DirectDialPolicy) -> Self {
        self.direct = policy;
        self
    }

    /// Listens on `addr` instead of `auth_service.listen_addr`.
    pub fn listen_addr(mut self, addr: Addr) -> Self {
        self.listen_addr = addr;
        self
    }

    /// Starts the Auth Service; returns once its API listens.
    pub async fn start(self) -> Result<RunningAuth, NodeError> {
        let data_dir = &self.data_dir;
        // 0700, every file in it 0600 (an older install is repaired, with a log line): it holds
        // the CAs' private keys and the password hashes.
        svc_core::fs::secure_data_dir(data_dir)?;
        let backend: Arc<dyn Backend> = match (self.backend.clone(), &self.storage) {
            (Some(b), _) => b,
            (None, StorageConfig::Etcd(etcd)) => open_etcd(etcd).await?,
            (None, _) => Arc::new(
                EmbeddedBackend::open(data_dir.join(BACKEND_FILE)).map_err(|source| NodeError::Backend {
                    path: data_dir.clone(),
                    source,
                })?,
            ),
        };
        let mut auth = AuthService::open(backend, &self.cluster_name, Arc::new(SystemClock)).await?;
        auth.set_host_name_policy(self.names.clone());
        let auth = Arc::new(auth.with_login_limits(self.limits));
        let (listener, addr) = super::bind("auth_service.listen_addr", &self.listen_addr).await?;
        auth.set_direct_dial_policy(self.direct.clone());
        auth.set_tunnel_strategy(self.tunnel_strategy);
        auth.add_service_addrs([addr]);
        let mut names: Vec<String> = self.public_addrs.iter().map(|a| a.host_str()).collect();
        names.push(self.listen_addr.host_str());
        let server_identity = crate::auth::server_identity(&auth, &self.node_name, &names)?;
        let shutdown = CancellationToken::new();
        let (serve_auth, serve_shutdown, options) = (auth.clone(), shutdown.clone(), self.listen.clone());
        let idle = self.grpc_idle_timeout;
        let task = tokio::spawn(async move {
            if let Err(e) = crate::auth::serve_with_idle(
                listener,
                serve_auth,
                server_identity,
                options,
                idle,
                serve_shutdown,
            )
            .await
            {
                tracing::error!(error = %e, "auth API stopped");
            }
        });
        let running = RunningAuth {
            service: auth,
            addr,
            admin_identity: admin_identity_path(data_dir),
            node_name: self.node_name.clone(),
            public_addrs: self.public_addrs.clone(),
            shutdown,
            task,
        };
        let admin = running.host_identity(&self.node_name, vec![SystemRole::Auth])?;
        admin.save(&running.admin_identity)?;
        Ok(running)
    }
}

/// Connects to the etcd cluster of `auth_service.storage`. Several Auth Services may share it:
/// the first to start creates the CAs, the others load them.
#[cfg(feature = "etcd")]
async fn open_etcd(config: &svc_core::config::EtcdStorageConfig) -> Result<Arc<dyn Backend>, NodeError> {
    let failed = |reason: tower::BoxError| NodeError::Storage {
        peers: config.peers.join(","),
        reason,
    };
    let options = config.options().map_err(|e| failed(e.into()))?;
    let backend = svc_core::backend::EtcdBackend::connect(options)
        .await
        .map_err(|e| failed(e.into()))?;
    Ok(Arc::new(backend))
}

/// This build has no etcd client (svc-net feature `etcd`).
#[cfg(not(feature = "etcd"))]
async fn open_etcd(config: &svc_core::config::EtcdStorageConfig) -> Result<Arc<dyn Backend>, NodeError> {
    Err(NodeError::Storage {
        peers: config.peers.join(","),
        reason: "`type: etcd` is not built into this binary (svc-net feature `etcd`); use `type: embedded`"
            .into(),
    })
}

/// A running Auth Service.
pub struct RunningAuth {
    /// The Auth Service (domain calls in this process).
    pub service: Arc<AuthService>,
    /// Where its API listens.
    pub addr: SocketAddr,
    /// The admin identity file written for `tctl`.
    pub admin_identity: PathBuf,
    node_name: String,
    public_addrs: Vec<Addr>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RunningAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningAuth")
            .field("cluster", &self.service.cluster())
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl RunningAuth {
    /// The cluster name.
    pub fn cluster(&self) -> &str {
        self.service.cluster()
    }

    /// The host CA pin agents join with (`sha256:…`).
    pub fn ca_pin(&self) -> String {
        self.service.ca_pin()
    }

    /// Where processes on this host reach the API (loopback when it listens on all addresses).
    pub fn dialable_addr(&self) -> SocketAddr {
        dialable(self.addr)
    }

    /// The address signed-in clients are told for the Auth API when TLS routing is off: the
    /// first public address, else the local one.
    pub fn public_addr(&self) -> String {
        self.public_addrs
            .first()
            .map(ToString::to_string)
            .unwrap_or_else(|| self.dialable_addr().to_string())
    }

    /// The node name this Auth Service runs under (`svc.nodename`).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Issues a host identity with `roles` in-process (fresh keys, a new host ID), pointing at
    /// this API: what the in-process proxy and agent run with.
    pub fn host_identity(&self, node: &str, roles: Vec<SystemRole>) -> Result<ClientIdentity, NodeError> {
        self.host_identity_named(node, roles, Vec::new())
    }

    /// [`RunningAuth::host_identity`] with `names` as extra principals and certificate names
    /// (the local agent's `ssh_service.public_addr` hosts).
    pub fn host_identity_named(
        &self,
        node: &str,
        roles: Vec<SystemRole>,
        names: Vec<String>,
    ) -> Result<ClientIdentity, NodeError> {
        let keys = KeyMaterial::generate()?;
        let req = HostCertRequest {
            host_uuid: uuid::Uuid::new_v4(),
            node_name: node.to_owned(),
            roles,
            additional_names: names,
            ttl: svc_core::auth::HOST_CERT_TTL,
        };
        let certs = self
            .service
            .issue_host_certs(&req, &keys.tls_public_key(), keys.ssh_public_key())?;
        let mut identity = keys.into_identity(&certs, self.service.cluster())?;
        identity.auth_addr = self.dialable_addr().to_string();
        Ok(identity)
    }

    /// Stops the API.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// Where clients on this host reach a listener bound to `bound`.
pub(crate) fn dialable(bound: SocketAddr) -> SocketAddr {
    if bound.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), bound.port())
    } else {
        bound
    }
}

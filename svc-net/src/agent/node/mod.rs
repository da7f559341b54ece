//! The agent node: the SSH, Application, Database, Kubernetes and Windows Desktop services of
//! one host, reachable through the Proxy Service.
//!
//! Order at [`AgentNode::start`]: the host identity — given ([`AgentNode::identity`], as the
//! all-in-one process does), saved by an earlier start in its [`IdentityStore`] (the data
//! directory, or a Secret per replica in Kubernetes), or a fresh join
//! with `svc.auth_token` (checking `svc.ca_pin`) through `svc.auth_server`, or the proxy's web
//! port with TLS routing → the services behind a reverse tunnel to the proxy (dialed through
//! `HTTPS_PROXY`/`NO_PROXY`), or, joined at `svc.auth_server` without `svc.proxy_server`, on
//! listeners of their own that the proxy dials → heartbeats to the inventory → the maintenance
//! schedule exported for the updater ([`export`]: the Linux updater's directory while it exists,
//! noticed without a restart, plus any [`ScheduleSink`] given with [`AgentNode::schedule_sink`],
//! such as the Kubernetes shared-state Secret) → `/healthz`, `/readyz`, `/metrics` on
//! `svc.diag_addr` ([`crate::diag`]). Every heartbeat reports the updater's status ([`updater`]:
//! the `status` file, or an [`UpdateStatusSource`] given with
//! [`AgentNode::update_status_source`]) and, once accepted, writes the `agent` file the Linux
//! updater checks health with.
//!
//! ```no_run
//! # async fn run() -> Result<(), svc_net::NodeError> {
//! let config = svc_core::config::Config::load(std::path::Path::new("/etc/svc.yaml"))
//!     .map_err(|e| svc_net::NodeError::Config(e.to_string()))?;
//! let node = svc_net::AgentNode::from_config(&config).start().await?;
//! println!("serving as {}", node.host_id);
//! node.shutdown().await;
//! # Ok(()) }
//! ```

pub mod export;
mod heartbeat;
pub mod identity_store;
mod resources;
pub mod updater;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use svc_core::Addr;
use svc_core::auth::{Heartbeat, ServedKind};
use svc_core::config::Config;
use svc_core::identity::SystemRole;
use tokio_util::sync::CancellationToken;

pub use export::ScheduleSink;
pub use identity_store::{DataDirIdentityStore, IdentityStore, StoredIdentity};
pub use resources::{agent_dial_service, agent_principals, agent_roles, served_resources};
pub use updater::UpdateStatusSource;

use self::heartbeat::{ExportTargets, HeartbeatTask, UpdaterLink};
use crate::agent::ssh::{SshServer, SshServerConfig};
use crate::auth::{ClientIdentity, JoinParams};
use crate::auth::{NodeError, bind};
use crate::diag::{Diagnostics, NodeMetrics};
use crate::dial::ProxyDialer;
use crate::ssh::AuthNodeAuthorizer;
use crate::tunnel::{AgentConfig, AgentStatus, DialService, RunningAgent, TunnelAgent};

/// The agent's saved identity in the data directory.
pub(crate) const HOST_IDENTITY_FILE: &str = "host-identity.json";
/// The system roles the saved identity was issued for, comma-separated on one line.
pub(crate) const HOST_ROLES_FILE: &str = "host-identity.roles";
/// The updater that manages this agent (`unit`, `kube`), reported to the inventory.
pub(crate) const UPGRADER_ENV: &str = "SVC_UPGRADER";
/// The updater's version, reported to the inventory.
pub(crate) const UPGRADER_VERSION_ENV: &str = "SVC_UPGRADER_VERSION";
/// How long [`AgentNode::start`] waits for the first tunnel and the first accepted heartbeat
/// before returning anyway (logged; the agent keeps retrying on its own).
pub const FIRST_CONTACT_WAIT: Duration = Duration::from_secs(30);

/// The version endpoint the Linux updater asks (`host:port/path`), for the proxy at `proxy`.
pub fn version_endpoint(proxy: &Addr) -> String {
    format!("{proxy}{}default", svc_core::channel::CHANNEL_PATH_PREFIX)
}

/// An agent, configured and not yet started. Built from the validated configuration
/// ([`AgentNode::from_config`]); the setters override what the configuration (or the
/// environment) would choose.
pub struct AgentNode {
    config: Config,
    identity: Option<ClientIdentity>,
    proxy: Option<(Addr, Option<Vec<u8>>)>,
    insecure: bool,
    dialer: Option<ProxyDialer>,
    upgrade_dir: PathBuf,
    endpoint: Option<String>,
    sinks: Vec<Arc<dyn ScheduleSink>>,
    upgrader: (String, String),
    update_status: Option<Arc<dyn UpdateStatusSource>>,
    dir_check_interval: Duration,
    identity_store: Option<Arc<dyn IdentityStore>>,
}

impl std::fmt::Debug for AgentNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentNode")
            .field("name", &self.config.svc.nodename)
            .field("proxy", &self.proxy.as_ref().map(|(a, _)| a))
            .field("insecure", &self.insecure)
            .field("upgrade_dir", &self.upgrade_dir)
            .finish_non_exhaustive()
    }
}

impl AgentNode {
    /// The agent `config` describes: its enabled services, `svc.proxy_server` (tunnel) or
    /// `svc.auth_server` (direct), its token, CA pin, data directory and `svc.diag_addr`. The
    /// updater's directory and the reported updater come from the environment
    /// (`SVC_UPGRADE_CONFIG`, `SVC_UPGRADER`, `SVC_UPGRADER_VERSION`).
    pub fn from_config(config: &Config) -> Self {
        let env = |k: &str| std::env::var(k).ok();
        AgentNode {
            config: config.clone(),
            identity: None,
            proxy: None,
            insecure: false,
            dialer: None,
            upgrade_dir: export::upgrade_dir_from_env(env),
            endpoint: None,
            sinks: Vec::new(),
            upgrader: (
                env(UPGRADER_ENV).unwrap_or_default(),
                env(UPGRADER_VERSION_ENV).unwrap_or_default(),
            ),
            update_status: None,
            dir_check_interval: export::DIR_CHECK_INTERVAL,
            identity_store: None,
        }
    }

    /// Runs with this host identity instead of loading or joining for one.
    pub fn identity(mut self, identity: ClientIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Keeps the host identity in `store` instead of the data directory
    /// ([`DataDirIdentityStore`]): loaded at start, saved after a join.
    pub fn identity_store(mut self, store: Arc<dyn IdentityStore>) -> Self {
        self.identity_store = Some(store);
        self
    }

    /// Tunnels to the proxy at `addr` (instead of `svc.proxy_server`), trusting `ca_pem` for
    /// its TLS certificate besides the system roots (a generated self-signed one).
    pub fn proxy(mut self, addr: Addr, ca_pem: Option<Vec<u8>>) -> Self {
        self.proxy = Some((addr, ca_pem));
        self
    }

    /// Accepts any TLS certificate from the proxy (`svc start --insecure`), and joins without
    /// `svc.ca_pin` by trusting the first CA seen. SSH inside the tunnel still checks the
    /// proxy's host certificate.
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.insecure = insecure;
        self
    }

    /// Dials out with `dialer` (default: [`ProxyDialer::from_env`]).
    pub fn dialer(mut self, dialer: ProxyDialer) -> Self {
        self.dialer = Some(dialer);
        self
    }

    /// Exports the Linux updater's files to `dir` (when it exists) instead of the directory
    /// the environment names.
    pub fn upgrade_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.upgrade_dir = dir.into();
        self
    }

    /// The version endpoint written for the Linux updater (default: the proxy's
    /// [`version_endpoint`]).
    pub fn version_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Also exports the maintenance schedule to `sink` (the Kubernetes shared-state Secret).
    pub fn schedule_sink(mut self, sink: Arc<dyn ScheduleSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Reports `upgrader` (`unit`, `kube`) and its version in the heartbeats, whatever the
    /// updater's status says (an empty value leaves that one to the status).
    pub fn upgrader(mut self, upgrader: impl Into<String>, version: impl Into<String>) -> Self {
        self.upgrader = (upgrader.into(), version.into());
        self
    }

    /// Reads the updater's status from `source` (the Kubernetes shared-state Secret) instead of
    /// the `status` file in the Linux updater's directory.
    pub fn update_status_source(mut self, source: Arc<dyn UpdateStatusSource>) -> Self {
        self.update_status = Some(source);
        self
    }

    /// Checks whether the Linux updater's directory exists this often (default
    /// [`export::DIR_CHECK_INTERVAL`], jittered ±10 %), besides after every accepted heartbeat.
    pub fn upgrade_dir_check_interval(mut self, every: Duration) -> Self {
        self.dir_check_interval = every;
        self
    }

    /// Starts the agent. Returns once its listeners are bound and its first tunnel is up and
    /// its first heartbeat accepted, or after [`FIRST_CONTACT_WAIT`] (logged) while it keeps
    /// retrying on its own.
    pub async fn start(self) -> Result<RunningNode, NodeError> {
        let roles = agent_roles(&self.config);
        if roles.is_empty() {
            return Err(NodeError::Config(
                "nothing to run: no agent service is enabled (ssh_service, app_service, db_service, \
                 kubernetes_service, windows_desktop_service)"
                    .into(),
            ));
        }
        let dialer = match self.dialer.clone() {
            Some(d) => d,
            None => ProxyDialer::from_env().map_err(|e| NodeError::setup("HTTPS_PROXY/NO_PROXY", e))?,
        };
        let identity = match self.identity.clone() {
            Some(identity) => identity,
            None => {
                let store = self
                    .identity_store
                    .clone()
                    .unwrap_or_else(|| Arc::new(DataDirIdentityStore::new(&self.config.svc.data_dir)));
                agent_identity(&self.config, &dialer, self.insecure, store.as_ref()).await?
            }
        };
        let proxy = self
            .proxy
            .clone()
            .or_else(|| self.config.svc.proxy_server.clone().map(|addr| (addr, None)));
        match proxy {
            Some((addr, ca_pem)) => self.start_tunnel(identity, dialer, addr, ca_pem).await,
            // The configuration check already refused the services that need a tunnel (apps,
            // databases) in this mode.
            None => self.start_direct(identity, dialer).await,
        }
    }

    fn beat(&self, resources: Vec<svc_core::auth::ServedResource>) -> Heartbeat {
        Heartbeat {
            hostname: self.config.svc.nodename.clone(),
            version: svc_core::version::current().to_string(),
            upgrader: self.upgrader.0.clone(),
            upgrader_version: self.upgrader.1.clone(),
            resources,
            // The Auth Service fills this in from the connection; an agent cannot claim it.
            source: None,
            // Filled in before every heartbeat from the updater's status and the exports.
            ..Heartbeat::default()
        }
    }

    async fn start_tunnel(
        self,
        identity: ClientIdentity,
        dialer: ProxyDialer,
        proxy_addr: Addr,
        proxy_ca_pem: Option<Vec<u8>>,
    ) -> Result<RunningNode, NodeError> {
        let config = &self.config;
        let key = identity.ssh_private_key()?;
        let cert = identity.ssh_certificate()?;
        let verifier = Arc::new(identity.verifier()?);
        let ssh = if config.ssh.enabled {
            ssh_server(&identity, &dialer, config)?.dial_service()
        } else {
            refuse_ssh()
        };
        let service = agent_dial_service(config, ssh)?;
        let mut agent_config = AgentConfig::new(
            proxy_addr.clone(),
            identity.name.clone(),
            key,
            cert,
            verifier,
            dialer.clone(),
        );
        // Heartbeats every `auth_service.keep_alive_interval`.
        agent_config = agent_config.with_tunables(keep_alive_tunables(config, false));
        if let Some(pem) = proxy_ca_pem {
            agent_config = agent_config.with_proxy_ca_pem(pem);
        }
        if self.insecure {
            tracing::warn!("--insecure: the proxy's TLS certificate is not checked (SSH inside still is)");
            agent_config = agent_config.with_insecure_proxy_tls();
        }
        let agent = TunnelAgent::new(agent_config, service)
            .map_err(|e| NodeError::setup("the reverse tunnel agent", e))?
            .spawn();
        // Announce the node only once it is reachable, so `tsh ssh` right after start works.
        let first = agent.wait_for(|s| !s.connected.is_empty());
        if tokio::time::timeout(FIRST_CONTACT_WAIT, first).await.is_err() {
            tracing::warn!(
                node = %config.svc.nodename,
                proxy = %proxy_addr,
                last_error = ?agent.status().last_error,
                "no reverse tunnel to the proxy yet; the agent keeps retrying"
            );
        }
        let metrics = NodeMetrics::default();
        let stop = CancellationToken::new();
        let mut tasks = vec![tokio::spawn(track_tunnels(agent.watch(), metrics.clone()))];
        let endpoint = Some(
            self.endpoint
                .clone()
                .unwrap_or_else(|| version_endpoint(&proxy_addr)),
        );
        let beat = self.beat(served_resources(config));
        let status = agent.watch();
        let diag_addr = serve_diag(
            config.svc.diag_addr.as_ref(),
            &metrics,
            &stop,
            &mut tasks,
            move || {
                let s = status.borrow();
                if s.connected.is_empty() {
                    Err(format!(
                        "no reverse tunnel to the proxy yet{}",
                        s.last_error
                            .as_deref()
                            .map(|e| format!(": {e}"))
                            .unwrap_or_default()
                    ))
                } else {
                    Ok(())
                }
            },
        )
        .await?;
        // After the diagnostics: the `agent` file names their address.
        tasks.push(
            self.heartbeats(&identity, dialer, beat, &metrics, endpoint, diag_addr)
                .await,
        );
        Ok(RunningNode {
            name: self.config.svc.nodename.clone(),
            host_id: identity.name,
            agent: Some(agent),
            listeners: Vec::new(),
            diag_addr,
            metrics,
            tasks,
            stop,
        })
    }

    /// Starts the heartbeat task (which also starts the schedule exports once the Auth API
    /// answers) and waits, bounded, for the first accepted heartbeat.
    async fn heartbeats(
        &self,
        identity: &ClientIdentity,
        dialer: ProxyDialer,
        beat: Heartbeat,
        metrics: &NodeMetrics,
        endpoint: Option<String>,
        diag_addr: Option<SocketAddr>,
    ) -> tokio::task::JoinHandle<()> {
        let first_beat = Arc::new(tokio::sync::Notify::new());
        let task = HeartbeatTask {
            identity: identity.clone(),
            auth_addrs: auth_addrs(identity, &self.config),
            dialer,
            beat,
            metrics: metrics.clone(),
            first_beat: first_beat.clone(),
            exports: ExportTargets {
                upgrade_dir: self.upgrade_dir.clone(),
                check_every: self.dir_check_interval,
                endpoint,
                sinks: self.sinks.clone(),
            },
            updater: UpdaterLink {
                overrides: self.upgrader.clone(),
                status: self
                    .update_status
                    .clone()
                    .unwrap_or_else(|| Arc::new(updater::FileStatusSource::new(&self.upgrade_dir))),
                host_id: identity.name.clone(),
                diag_addr,
            },
        };
        let handle = tokio::spawn(task.run());
        if tokio::time::timeout(FIRST_CONTACT_WAIT, first_beat.notified())
            .await
            .is_err()
        {
            tracing::warn!(auth = %identity.auth_addr, "no heartbeat accepted yet; the agent keeps retrying");
        }
        handle
    }

    /// An agent that joined the Auth Service directly (`svc.auth_server`, no
    /// `svc.proxy_server`): no reverse tunnel; the SSH Service listens on
    /// `ssh_service.listen_addr` (users' plain SSH, and the proxy's mutual TLS told apart by
    /// the first bytes), the Kubernetes and Windows Desktop services on their `listen_addr`s;
    /// the proxy always connects with mutual TLS (its host certificate, the agent's for the host
    /// ID the Auth Service named), then sends the dial request a tunnel would carry. The
    /// heartbeats announce each listener as the served resources' `direct_addr`, which is how
    /// the proxy finds them.
    async fn start_direct(
        self,
        identity: ClientIdentity,
        dialer: ProxyDialer,
    ) -> Result<RunningNode, NodeError> {
        let config = &self.config;
        let name = config.svc.nodename.clone();
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        let mut listeners = Vec::new();
        let mut resources = served_resources(config);
        let verifier = Arc::new(identity.verifier()?);
        let ssh = ssh_server(&identity, &dialer, config)?;
        let service = agent_dial_service(
            config,
            if config.ssh.enabled {
                ssh.dial_service()
            } else {
                refuse_ssh()
            },
        )?;
        let tls = crate::tunnel::agent_tls(&identity)
            .map_err(|e| NodeError::setup("the direct listeners' TLS", e))?;
        if config.ssh.enabled {
            let (listener, bound) = bind("ssh_service.listen_addr", &config.ssh.listen_addr).await?;
            let addr = announced(bound, config.ssh.public_addrs.first(), &name);
            for node in resources.iter_mut().filter(|r| r.kind == Some(ServedKind::Node)) {
                node.direct_addr = addr.clone();
            }
            // Users' plain SSH (`ssh -p 3022`) and the proxy's mutual TLS share the port, told
            // apart by their first bytes.
            let mux = crate::route::detect::Multiplexer::builder()
                .ssh(ssh.conn_handler())
                .tls(crate::tunnel::direct_handler(
                    tls.clone(),
                    verifier.clone(),
                    service.clone(),
                ))
                .build();
            tasks.push(tokio::spawn(crate::listen::serve(
                listener,
                mux,
                crate::listen::ListenOptions::default(),
                stop.clone(),
            )));
            listeners.push(("ssh_service", bound));
        }
        let resource_listeners = [
            (
                config.kube.enabled,
                "kubernetes_service",
                &config.kube.listen_addr,
                config.kube.public_addrs.first(),
                ServedKind::Kube,
            ),
            (
                config.windows_desktop.enabled,
                "windows_desktop_service",
                &config.windows_desktop.listen_addr,
                None,
                ServedKind::WindowsDesktop,
            ),
        ];
        for (enabled, section, addr, public, kind) in resource_listeners {
            if !enabled {
                continue;
            }
            let (listener, bound) = bind(&format!("{section}.listen_addr"), addr).await?;
            let direct_addr = announced(bound, public, &name);
            for r in resources.iter_mut().filter(|r| r.kind == Some(kind)) {
                r.direct_addr = direct_addr.clone();
            }
            tasks.push(tokio::spawn(crate::tunnel::serve_direct(
                listener,
                tls.clone(),
                verifier.clone(),
                service.clone(),
                stop.clone(),
            )));
            listeners.push((section, bound));
        }
        for (section, bound) in &listeners {
            tracing::info!(%section, addr = %bound, "listening for the proxy (joined the Auth Service directly)");
        }
        let metrics = NodeMetrics::default();
        // The updater asks a proxy for versions, never the Auth Service (no version server
        // answers there): the one configured here, else one the Auth Service knows (written
        // only while the file is empty, so an operator's own endpoint stays).
        let endpoint = match self.endpoint.clone() {
            Some(e) => Some(e),
            None => direct_version_endpoint(&identity, &dialer).await,
        };
        let beat = self.beat(resources);
        let beats = metrics.heartbeats.clone();
        let diag_addr = serve_diag(
            config.svc.diag_addr.as_ref(),
            &metrics,
            &stop,
            &mut tasks,
            move || {
                if beats.get() == 0 {
                    Err("listening, but no heartbeat accepted by the Auth Service yet".into())
                } else {
                    Ok(())
                }
            },
        )
        .await?;
        tasks.push(
            self.heartbeats(&identity, dialer, beat, &metrics, endpoint, diag_addr)
                .await,
        );
        Ok(RunningNode {
            name,
            host_id: identity.name,
            agent: None,
            listeners,
            diag_addr,
            metrics,
            tasks,
            stop,
        })
    }
}

/// A running agent.
pub struct RunningNode {
    /// The node name: `tsh ssh user@<name>`.
    pub name: String,
    /// The host ID (`<uuid>.<cluster>`).
    pub host_id: String,
    /// The tunnel agent; `None` for an agent that joined the Auth Service directly.
    pub agent: Option<RunningAgent>,
    /// A directly joined agent's listeners: the config section (`ssh_service`,
    /// `kubernetes_service`, `windows_desktop_service`) and the bound address.
    pub listeners: Vec<(&'static str, SocketAddr)>,
    /// Where health and metrics are served, when enabled.
    pub diag_addr: Option<SocketAddr>,
    /// The node's counters (also on `/metrics`).
    pub metrics: NodeMetrics,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for RunningNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningNode")
            .field("name", &self.name)
            .field("host_id", &self.host_id)
            .field("listeners", &self.listeners)
            .field("diag_addr", &self.diag_addr)
            .finish_non_exhaustive()
    }
}

impl RunningNode {
    /// Stops the heartbeats, the exports, the listeners, the diagnostics and the tunnels.
    pub async fn shutdown(self) {
        self.stop.cancel();
        for t in &self.tasks {
            t.abort();
        }
        if let Some(agent) = self.agent {
            agent.shutdown().await;
        }
    }
}

/// The version endpoint a directly joined agent's updater asks: that of a proxy the Auth
/// Service knows (its registered proxies' public addresses, the first by host ID). `None`, with
/// a log line saying why, when no proxy is registered or the Auth Service cannot be asked.
async fn direct_version_endpoint(identity: &ClientIdentity, dialer: &ProxyDialer) -> Option<String> {
    let asked = async {
        let mut client =
            crate::auth::AuthClient::connect_via(&identity.auth_addr, identity, Some(dialer)).await?;
        client.list_proxies().await
    };
    let proxies = match tokio::time::timeout(FIRST_CONTACT_WAIT, asked).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            tracing::warn!(auth = %identity.auth_addr, error = %e, "cannot ask the Auth Service for the cluster's proxies; not writing the updater's endpoint");
            return None;
        }
        Err(_) => {
            tracing::warn!(auth = %identity.auth_addr, after = ?FIRST_CONTACT_WAIT, "the Auth Service did not list the cluster's proxies in time; not writing the updater's endpoint");
            return None;
        }
    };
    let chosen = proxies
        .iter()
        .find_map(|p| Addr::parse(&p.public_addr).ok().map(|a| (p, a)));
    match chosen {
        Some((proxy, addr)) => {
            let endpoint = version_endpoint(&addr);
            tracing::info!(proxy = %proxy.host_id, %endpoint, "the updater asks this proxy for versions");
            Some(endpoint)
        }
        None => {
            tracing::warn!(auth = %identity.auth_addr, "no proxy is registered with the Auth Service, and svc-upgrade asks a proxy (not the Auth Service) for versions: not writing the updater's endpoint");
            None
        }
    }
}

fn roles_line(roles: &[SystemRole]) -> String {
    roles.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(",")
}

/// Where the agent reaches the Auth API: `svc.auth_server` when set (direct join), else the
/// proxy's web port (TLS routing carries the Auth API under ALPN `svc-auth@<cluster>`).
fn auth_target(config: &Config) -> Result<Addr, NodeError> {
    config
        .svc
        .auth_servers
        .first()
        .or(config.svc.proxy_server.as_ref())
        .cloned()
        .ok_or_else(|| {
            NodeError::Config(
                "svc.proxy_server or svc.auth_server is required for an agent to join a cluster".into(),
            )
        })
}

/// The agent's identity: the one saved in `store` (the data directory by default) when it was
/// issued for the same services and has not expired, else a fresh join with `svc.auth_token`
/// (saved in `store` for the next start, so the token is needed once), checking the Auth Service
/// against `svc.ca_pin`. A join without a pin is refused unless `trust_on_first_use`
/// (`svc start --insecure`).
pub(crate) async fn agent_identity(
    config: &Config,
    dialer: &ProxyDialer,
    trust_on_first_use: bool,
    store: &dyn IdentityStore,
) -> Result<ClientIdentity, NodeError> {
    let roles = agent_roles(config);
    let target = auth_target(config)?;
    let place = store.describe();
    if let Some(saved) = store.load().await? {
        let fresh = !saved.identity.is_expired(std::time::SystemTime::now());
        if fresh && saved.roles == roles_line(&roles) {
            tracing::info!(host_id = %saved.identity.name, identity = %place, "using the saved host identity");
            let mut identity = saved.identity;
            identity.auth_addr = target.to_string();
            return Ok(identity);
        }
        tracing::info!(
            identity = %place,
            expired = !fresh,
            saved_services = %saved.roles,
            services = %roles_line(&roles),
            "the saved host identity does not fit this configuration; joining again"
        );
    }
    let Some(token) = config.svc.auth_token.clone() else {
        return Err(NodeError::Config(format!(
            "svc.auth_token is required to join the cluster at {target} (no usable host identity in {place})"
        )));
    };
    let params = JoinParams {
        token,
        ca_pin: config.svc.ca_pins.first().cloned(),
        trust_on_first_use,
        node_name: config.svc.nodename.clone(),
        roles: roles.clone(),
        additional_names: agent_principals(config),
    };
    // Several `svc.auth_server` addresses: the first that can be reached.
    let targets: Vec<String> = if config.svc.auth_servers.is_empty() {
        vec![target.to_string()]
    } else {
        config.svc.auth_servers.iter().map(ToString::to_string).collect()
    };
    let identity = crate::auth::join_any(&targets, params, Some(dialer))
        .await
        .map_err(|source| NodeError::Join {
            target: targets.join(", "),
            source,
        })?;
    store.save(&identity, &roles_line(&roles)).await?;
    tracing::info!(host_id = %identity.name, cluster = %identity.cluster, identity = %place, "joined the cluster");
    Ok(identity)
}

/// The node's SSH Service with its host certificate. It decides on its own who may log in
/// (defence in depth: the proxy asked first), asking the Auth Service about itself.
/// The Auth Service's addresses the agent asks, in turn: the one it joined first, then — when it
/// joined directly at one of several `svc.auth_server` addresses — the others. Behind a tunnel
/// there is one: the proxy's web port (the proxy fails over between Auth Services itself).
fn auth_addrs(identity: &ClientIdentity, config: &Config) -> Vec<String> {
    let mut addrs = vec![identity.auth_addr.clone()];
    let configured: Vec<String> = config.svc.auth_servers.iter().map(ToString::to_string).collect();
    if configured.contains(&identity.auth_addr) {
        addrs.extend(configured.into_iter().filter(|a| *a != identity.auth_addr));
    }
    addrs
}

fn ssh_server(
    identity: &ClientIdentity,
    dialer: &ProxyDialer,
    config: &Config,
) -> Result<SshServer, NodeError> {
    let addrs = auth_addrs(identity, config);
    let mut ssh = SshServerConfig::new(
        identity.ssh_private_key()?,
        identity.ssh_certificate()?,
        Arc::new(identity.verifier()?),
        identity.name.clone(),
        AuthNodeAuthorizer::at(addrs.clone(), identity.clone(), Some(dialer.clone()), false),
    )
    // Sessions the proxy let through survive a short Auth Service outage.
    .with_proxied_authorizer(AuthNodeAuthorizer::at(
        addrs,
        identity.clone(),
        Some(dialer.clone()),
        true,
    ));
    ssh.tunables = keep_alive_tunables(config, true);
    // The sftp subsystem is this binary's `sftp-server` subcommand, started with the login's
    // rights.
    let ssh = match crate::agent::ssh::sftp::SftpLauncher::this_binary() {
        Ok(launcher) => ssh.with_sftp(launcher),
        Err(e) => {
            tracing::warn!(error = %e, "the sftp subsystem is off: the agent's own program cannot be found");
            ssh
        }
    };
    Ok(SshServer::new(ssh))
}

/// The SSH tunables with `auth_service.keep_alive_interval` and `keep_alive_count_max`
/// applied: to the reverse tunnel (`session` false) or to SSH sessions (`session` true).
fn keep_alive_tunables(config: &Config, session: bool) -> crate::ssh::Tunables {
    crate::ssh::Tunables::default().with_keep_alive_config(
        config.auth.keep_alive_interval,
        config.auth.keep_alive_count_max,
        session,
    )
}

fn refuse_ssh() -> DialService {
    crate::tunnel::dial_service_fn(|req: crate::tunnel::DialRequest| async move {
        Err::<crate::io::BoxIo, _>(
            format!(
                "this agent runs no service for {:?} connections (to {})",
                req.conn_type, req.address
            )
            .into(),
        )
    })
}

/// Keeps the tunnel gauges current from the agent's status.
async fn track_tunnels(mut status: tokio::sync::watch::Receiver<AgentStatus>, metrics: NodeMetrics) {
    let mut established = 0;
    loop {
        {
            let s = status.borrow_and_update();
            metrics
                .tunnels_connected
                .set(i64::try_from(s.connected.len()).unwrap_or(i64::MAX));
            if s.established > established {
                metrics.tunnels_established.inc_by(s.established - established);
                established = s.established;
            }
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

/// Serves the diagnostics on `addr` when set; returns the bound address.
async fn serve_diag(
    addr: Option<&Addr>,
    metrics: &NodeMetrics,
    stop: &CancellationToken,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
    ready: impl Fn() -> Result<(), String> + Send + Sync + 'static,
) -> Result<Option<SocketAddr>, NodeError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let (listener, bound) = bind("svc.diag_addr", addr).await?;
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    tracing::info!(addr = %bound, "diagnostics: /healthz /readyz /metrics");
    tasks.push(tokio::spawn(crate::diag::serve(
        listener,
        Diagnostics::new(registry, ready),
        stop.clone(),
    )));
    Ok(Some(bound))
}

/// The address a directly joined agent announces for a listener: the section's first public
/// address when configured, else the bound address (with the node name in place of an
/// unspecified IP such as `0.0.0.0`, which nobody can dial).
fn announced(bound: SocketAddr, public: Option<&Addr>, nodename: &str) -> String {
    match public {
        Some(public) => public.to_string(),
        None if bound.ip().is_unspecified() => format!("{nodename}:{}", bound.port()),
        None => bound.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directly_joined_agent_asks_every_configured_auth_service_in_turn() {
        let yaml = "version: v1\nsvc:\n  auth_server:\n    - 10.0.0.1:3025\n    - 10.0.0.2:3025\n    - 10.0.0.3:3025\n  auth_token: t\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n";
        let config = Config::from_yaml_str_with_hostname(yaml, "h").unwrap();
        let identity = |auth_addr: &str| ClientIdentity {
            cluster: "c".into(),
            name: "h.c".into(),
            auth_addr: auth_addr.into(),
            tls_cert_pem: String::new(),
            tls_key_pem: svc_core::Secret::new(String::new()),
            ssh_cert: String::new(),
            ssh_key: svc_core::Secret::new(String::new()),
            trusted: Vec::new(),
            not_after_unix: 0,
        };
        // Joined at the second: that one first, then the others in their order.
        assert_eq!(
            auth_addrs(&identity("10.0.0.2:3025"), &config),
            ["10.0.0.2:3025", "10.0.0.1:3025", "10.0.0.3:3025"]
        );
        // Behind a tunnel (joined through a proxy's web port): only that address; the proxy fails
        // over between the Auth Services itself.
        assert_eq!(
            auth_addrs(&identity("proxy.example.com:443"), &config),
            ["proxy.example.com:443"]
        );
    }

    #[test]
    fn announced_addresses_prefer_public_then_a_dialable_bound_address() {
        let bound: SocketAddr = "0.0.0.0:3022".parse().unwrap();
        assert_eq!(announced(bound, None, "node1"), "node1:3022");
        let public = Addr::parse_with_default_port("ssh.example.com", 3022).unwrap();
        assert_eq!(announced(bound, Some(&public), "node1"), "ssh.example.com:3022");
        let local: SocketAddr = "127.0.0.1:4022".parse().unwrap();
        assert_eq!(announced(local, None, "node1"), "127.0.0.1:4022");
    }

    #[test]
    fn the_version_endpoint_names_the_default_channel_of_the_proxy() {
        let proxy = Addr::parse_with_default_port("proxy.example.com", 443).unwrap();
        assert_eq!(
            version_endpoint(&proxy),
            "proxy.example.com:443/v1/webapi/automaticupgrades/channel/default"
        );
    }

    #[tokio::test]
    async fn an_agent_without_services_or_a_cluster_to_join_is_refused_by_name() {
        let yaml = "version: v1\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n";
        let config = Config::from_yaml_str_with_hostname(yaml, "h").unwrap();
        let err = AgentNode::from_config(&config).start().await.unwrap_err();
        assert!(err.to_string().contains("nothing to run"), "{err}");

        // An agent without a saved identity needs a token, and says where it would join.
        let dir = tempfile::tempdir().unwrap();
        let yaml = format!(
            "version: v1\nsvc:\n  data_dir: {}\n  proxy_server: 127.0.0.1:9\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n",
            dir.path().display()
        );
        let config = Config::from_yaml_str_with_hostname(&yaml, "h").unwrap();
        let err = AgentNode::from_config(&config).start().await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with("svc.auth_token is required to join the cluster at 127.0.0.1:9"),
            "{err}"
        );
    }
}

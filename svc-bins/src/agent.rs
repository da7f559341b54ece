//! An agent's runtime, shared by the all-in-one `svc start` (whose SSH agent joins its own
//! proxy) and a standalone agent (`auth_service` and `proxy_service` disabled) that joins a
//! cluster run elsewhere.
//!
//! Order for a standalone agent: load the saved host identity from the data directory, or join
//! with `svc.auth_token` (through `svc.auth_server`, or the proxy's web port with TLS routing),
//! checking `svc.ca_pin`, and save it → start the services behind a reverse tunnel to
//! `svc.proxy_server` (dialed through `HTTPS_PROXY`/`NO_PROXY`) → heartbeat to the inventory →
//! export the maintenance schedule: to `/etc/svc-upgrade.d` (or `SVC_UPGRADE_CONFIG`) for the
//! Linux updater when that directory exists, and to the shared-state Secret when running in
//! Kubernetes (`SVC_KUBE_NAMESPACE` and `SVC_KUBE_SHARED_STATE_SECRET`, set by the chart) →
//! serve `/healthz`, `/readyz` and `/metrics` on `svc.diag_addr` when set.
//!
//! Without `svc.proxy_server` (joined at `svc.auth_server` directly, [`start_direct`]): no
//! tunnel; the SSH, Kubernetes and Windows Desktop services open their own listeners, announced
//! in the heartbeats, and the proxy dials them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::Full;
use svc_core::auth::Heartbeat;
use svc_core::config::Config;
use svc_core::identity::SystemRole;
use svc_core::{Addr, SystemClock};
use svc_net::auth::{AuthClient, ClientIdentity, JoinParams};
use svc_net::dial::ProxyDialer;
use svc_net::ssh::{AuthNodeAuthorizer, SshServer, SshServerConfig};
use svc_net::tunnel::{AgentConfig, DialService, RunningAgent, TunnelAgent};
use svc_update::export::{AuthMaintenanceSource, ExportSettings, ScheduleExporter};
use tokio_util::sync::CancellationToken;

/// The agent's saved identity in the data directory.
pub const HOST_IDENTITY_FILE: &str = "host-identity.json";
/// The system roles the saved identity was issued for, comma-separated on one line.
pub const HOST_ROLES_FILE: &str = "host-identity.roles";
/// Set by the chart: the namespace of the agent's shared-state Secret.
pub const KUBE_NAMESPACE_ENV: &str = "SVC_KUBE_NAMESPACE";
/// Set by the chart: the name of the agent's shared-state Secret.
pub const KUBE_SECRET_ENV: &str = "SVC_KUBE_SHARED_STATE_SECRET";
/// The updater that manages this agent (`unit`, `kube`), reported to the inventory.
pub const UPGRADER_ENV: &str = "SVC_UPGRADER";
/// The updater's version, reported to the inventory.
pub const UPGRADER_VERSION_ENV: &str = "SVC_UPGRADER_VERSION";
/// How long `svc start` waits for an agent's first tunnel before reporting ready anyway.
const FIRST_TUNNEL_WAIT: Duration = Duration::from_secs(30);

fn roles_line(roles: &[SystemRole]) -> String {
    roles.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(",")
}

/// Where the agent reaches the Auth API: `svc.auth_server` when set (direct join), else the
/// proxy's web port (TLS routing carries the Auth API under ALPN `svc-auth@<cluster>`).
fn auth_target(config: &Config) -> anyhow::Result<Addr> {
    config
        .svc
        .auth_servers
        .first()
        .or(config.svc.proxy_server.as_ref())
        .cloned()
        .context("svc.proxy_server or svc.auth_server is required for an agent to join a cluster")
}

/// The agent's identity: the one saved in the data directory when it was issued for the same
/// services and has not expired, else a fresh join with `svc.auth_token` (saved for the next
/// start, so the token is needed once).
pub async fn agent_identity(config: &Config, dialer: &ProxyDialer) -> anyhow::Result<ClientIdentity> {
    let roles = crate::services::agent_roles(config);
    let data_dir = &config.svc.data_dir;
    let path = data_dir.join(HOST_IDENTITY_FILE);
    let roles_path = data_dir.join(HOST_ROLES_FILE);
    let target = auth_target(config)?;
    if path.exists() {
        let saved = ClientIdentity::load(&path)?;
        let saved_roles = std::fs::read_to_string(&roles_path).unwrap_or_default();
        let fresh = !saved.is_expired(std::time::SystemTime::now());
        if fresh && saved_roles.trim() == roles_line(&roles) {
            tracing::info!(host_id = %saved.name, identity = %path.display(), "using the saved host identity");
            let mut saved = saved;
            saved.auth_addr = target.to_string();
            return Ok(saved);
        }
        tracing::info!(
            identity = %path.display(),
            expired = !fresh,
            saved_services = saved_roles.trim(),
            services = %roles_line(&roles),
            "the saved host identity does not fit this configuration; joining again"
        );
    }
    let Some(token) = config.svc.auth_token.clone() else {
        bail!(
            "svc.auth_token is required to join the cluster at {target} (no usable host identity in {})",
            path.display()
        );
    };
    let params = JoinParams {
        token,
        ca_pin: config.svc.ca_pins.first().cloned(),
        node_name: config.svc.nodename.clone(),
        roles: roles.clone(),
        additional_names: Vec::new(),
    };
    let identity = svc_net::auth::join_via(&target.to_string(), params, Some(dialer))
        .await
        .with_context(|| format!("joining the cluster at {target}"))?;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    identity.save(&path)?;
    std::fs::write(&roles_path, format!("{}\n", roles_line(&roles)))
        .with_context(|| format!("writing {}", roles_path.display()))?;
    tracing::info!(host_id = %identity.name, cluster = %identity.cluster, "joined the cluster");
    Ok(identity)
}

/// What an agent needs to run.
pub struct NodeOptions {
    /// The node name (`svc.nodename`).
    pub name: String,
    /// The host identity (certificates, keys, trusted CAs, Auth API address).
    pub identity: ClientIdentity,
    /// The proxy's web address.
    pub proxy_addr: Addr,
    /// Extra trust for the proxy's TLS certificate (a generated self-signed one).
    pub proxy_ca_pem: Option<Vec<u8>>,
    /// Accept any TLS certificate from the proxy (`svc start --insecure`).
    pub insecure: bool,
    /// Outbound dialing (direct or HTTP CONNECT).
    pub dialer: ProxyDialer,
    /// The Linux updater's directory to export the schedule to, when it exists.
    pub upgrade_dir: PathBuf,
    /// The version endpoint written for the Linux updater (`host:port/path`).
    pub endpoint: String,
    /// Where to serve health and metrics.
    pub diag_addr: Option<Addr>,
}

/// A running agent.
pub struct Node {
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
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
}

impl Node {
    /// Stops the heartbeats, the exports, the listeners and the tunnels.
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.stop.cancel();
        if let Some(agent) = self.agent {
            agent.shutdown().await;
        }
    }
}

/// Heartbeat counters, for `/metrics`.
#[derive(Default)]
struct Counters {
    heartbeats: AtomicU64,
    heartbeat_failures: AtomicU64,
}

fn refuse_ssh() -> DialService {
    svc_net::tunnel::dial_service_fn(|req: svc_net::tunnel::DialRequest| async move {
        Err::<svc_net::listen::BoxIo, _>(
            format!(
                "this agent runs no service for {:?} connections (to {})",
                req.conn_type, req.address
            )
            .into(),
        )
    })
}

/// Starts the agent: `config`'s services (SSH, apps, databases, Kubernetes, desktops) behind a
/// reverse tunnel, heartbeats announcing them, schedule exports and the diagnostics listener.
/// Returns once the first tunnel is up (or after a bounded wait, logged, while the agent keeps
/// retrying on its own).
pub async fn start_node(opts: NodeOptions, config: &Config) -> anyhow::Result<Node> {
    let identity = &opts.identity;
    let key = identity.ssh_private_key()?;
    let cert = identity.ssh_certificate()?;
    let verifier = Arc::new(identity.verifier()?);
    let ssh = if config.ssh.enabled {
        SshServer::new(SshServerConfig::new(
            key.clone(),
            cert.clone(),
            verifier.clone(),
            identity.name.clone(),
            AuthNodeAuthorizer::new(identity.clone(), Some(opts.dialer.clone())),
        ))
        .dial_service()
    } else {
        refuse_ssh()
    };
    let service = crate::services::agent_dial_service(config, ssh)?;
    let mut agent_config = AgentConfig::new(
        opts.proxy_addr.clone(),
        identity.name.clone(),
        key,
        cert,
        verifier,
        opts.dialer.clone(),
    );
    if let Some(pem) = opts.proxy_ca_pem.clone() {
        agent_config = agent_config.with_proxy_ca_pem(pem);
    }
    if opts.insecure {
        tracing::warn!("--insecure: the proxy's TLS certificate is not checked (SSH inside still is)");
        agent_config = agent_config.with_insecure_proxy_tls();
    }
    let agent = TunnelAgent::new(agent_config, service)?.spawn();
    // Announce the node only once it is reachable, so `tsh ssh` right after the banner works;
    // a proxy that is slow to accept is logged and the agent keeps retrying on its own.
    let first = agent.wait_for(|s| !s.connected.is_empty());
    if tokio::time::timeout(FIRST_TUNNEL_WAIT, first).await.is_err() {
        tracing::warn!(
            node = %opts.name,
            proxy = %opts.proxy_addr,
            last_error = ?agent.status().last_error,
            "no reverse tunnel to the proxy yet; the agent keeps retrying"
        );
    }

    let beat = Heartbeat {
        hostname: opts.name.clone(),
        version: svc_core::version::current().to_string(),
        upgrader: std::env::var(UPGRADER_ENV).unwrap_or_default(),
        upgrader_version: std::env::var(UPGRADER_VERSION_ENV).unwrap_or_default(),
        resources: crate::services::served_resources(config),
    };
    let counters = Arc::new(Counters::default());
    // The first heartbeat before `svc start` reports ready, so the node is in the inventory
    // as soon as the banner is printed (when the Auth API answers within the first wait).
    let first_beat = Arc::new(tokio::sync::Notify::new());
    let heartbeat = tokio::spawn(heartbeat_loop(
        opts.identity.clone(),
        opts.dialer.clone(),
        beat,
        counters.clone(),
        first_beat.clone(),
        ExportTargets {
            upgrade_dir: opts.upgrade_dir.clone(),
            endpoint: opts.endpoint.clone(),
        },
    ));
    if tokio::time::timeout(FIRST_TUNNEL_WAIT, first_beat.notified())
        .await
        .is_err()
    {
        tracing::warn!(auth = %identity.auth_addr, "no heartbeat accepted yet; the agent keeps retrying");
    }
    let mut tasks = vec![heartbeat];
    let diag_addr = match &opts.diag_addr {
        Some(addr) => {
            let (bound, task) = serve_diag(addr, Some(agent.watch()), counters).await?;
            tasks.push(task);
            Some(bound)
        }
        None => None,
    };
    Ok(Node {
        name: opts.name,
        host_id: opts.identity.name,
        agent: Some(agent),
        listeners: Vec::new(),
        diag_addr,
        tasks,
        stop: CancellationToken::new(),
    })
}

/// Where the schedule goes (see [`exports`]).
struct ExportTargets {
    upgrade_dir: PathBuf,
    endpoint: String,
}

/// Connects to the Auth API (retrying with the reconnect backoff: the proxy or the Auth
/// Service may be down when the agent starts), starts the schedule exports, and heartbeats
/// every `HEARTBEAT_INTERVAL`. Aborting the task stops the exports too.
async fn heartbeat_loop(
    identity: ClientIdentity,
    dialer: ProxyDialer,
    beat: Heartbeat,
    counters: Arc<Counters>,
    first_beat: Arc<tokio::sync::Notify>,
    targets: ExportTargets,
) {
    let mut backoff = svc_net::tunnel::Backoff::default();
    let mut client = loop {
        match AuthClient::connect_via(&identity.auth_addr, &identity, Some(&dialer)).await {
            Ok(c) => break c,
            Err(e) => {
                counters.heartbeat_failures.fetch_add(1, Ordering::Relaxed);
                let wait = backoff.next_delay(rand::random::<f64>());
                tracing::warn!(error = %e, retry_in = ?wait, "cannot reach the Auth API; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    };
    beat_once(&mut client, &beat, &counters).await;
    first_beat.notify_one();
    let _exports = exports(&targets, client.clone()).await;
    let mut tick = tokio::time::interval(svc_core::auth::HEARTBEAT_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        beat_once(&mut client, &beat, &counters).await;
    }
}

async fn beat_once(client: &mut AuthClient, beat: &Heartbeat, counters: &Counters) {
    match client.heartbeat(beat).await {
        Ok(()) => {
            counters.heartbeats.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            counters.heartbeat_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "heartbeat to the Auth Service failed; retrying");
        }
    }
}

/// The schedule exports: the Linux updater's files (only when its directory exists: the
/// package owns it, and creating it here would claim a system path nobody asked for; the
/// endpoint file, written only while empty, points the updater at this cluster's proxy) and,
/// in Kubernetes, the shared-state Secret the updater controller reads.
async fn exports(opts: &ExportTargets, client: AuthClient) -> Vec<ScheduleExporter> {
    let source = Arc::new(AuthMaintenanceSource::new(client));
    let mut out = Vec::new();
    if opts.upgrade_dir.is_dir() {
        tracing::info!(dir = %opts.upgrade_dir.display(), "exporting the maintenance schedule for svc-upgrade");
        out.push(ScheduleExporter::spawn(
            source.clone(),
            Arc::new(SystemClock),
            ExportSettings::new(&opts.upgrade_dir).with_endpoint(opts.endpoint.clone()),
        ));
    }
    let namespace = std::env::var(KUBE_NAMESPACE_ENV).unwrap_or_default();
    let secret = std::env::var(KUBE_SECRET_ENV).unwrap_or_default();
    if !namespace.is_empty() && !secret.is_empty() {
        match kube::Client::try_default().await {
            Ok(kube) => {
                tracing::info!(%namespace, %secret, "exporting the maintenance schedule to the shared-state secret");
                out.push(ScheduleExporter::spawn_to(
                    source,
                    Arc::new(SystemClock),
                    Arc::new(svc_update::kube::schedule::SecretSink::new(
                        kube, namespace, secret,
                    )),
                    ExportSettings::default(),
                ));
            }
            Err(e) => tracing::error!(
                error = %e,
                "{KUBE_NAMESPACE_ENV} and {KUBE_SECRET_ENV} are set but there is no Kubernetes API client \
                 configuration; the maintenance schedule is not exported"
            ),
        }
    }
    out
}

/// Serves `/healthz` (the process runs), `/readyz` (a tunnel is up, or for a directly joined
/// agent without tunnels (`status` `None`) a heartbeat was accepted: 503 until then) and
/// `/metrics` (Prometheus text) on `addr`.
async fn serve_diag(
    addr: &Addr,
    status: Option<tokio::sync::watch::Receiver<svc_net::tunnel::AgentStatus>>,
    counters: Arc<Counters>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr.to_string())
        .await
        .with_context(|| format!("svc.diag_addr {addr}"))?;
    let bound = listener.local_addr()?;
    tracing::info!(addr = %bound, "diagnostics: /healthz /readyz /metrics");
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let status = status.clone();
            let counters = counters.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let answer = match &status {
                        Some(status) => diag_answer(req.uri().path(), Some(&status.borrow()), &counters),
                        None => diag_answer(req.uri().path(), None, &counters),
                    };
                    async move { Ok::<_, Infallible>(answer) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Ok((bound, task))
}

fn diag_answer(
    path: &str,
    status: Option<&svc_net::tunnel::AgentStatus>,
    counters: &Counters,
) -> http::Response<Full<Bytes>> {
    let (connected, established) = status.map_or((0, 0), |s| (s.connected.len(), s.established));
    let text = |code: u16, body: String| {
        let mut r = http::Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::OK);
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    match path {
        "/healthz" => text(200, "ok\n".into()),
        "/readyz" if status.is_none() && counters.heartbeats.load(Ordering::Relaxed) == 0 => text(
            503,
            "listening, but no heartbeat accepted by the Auth Service yet\n".into(),
        ),
        "/readyz" if status.is_some_and(|s| s.connected.is_empty()) => text(
            503,
            format!(
                "no reverse tunnel to the proxy yet{}\n",
                status
                    .and_then(|s| s.last_error.as_deref())
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
        ),
        "/readyz" => text(200, "ok\n".into()),
        "/metrics" => text(
            200,
            format!(
                "# HELP svc_tunnels_connected Reverse tunnels up now.\n# TYPE svc_tunnels_connected gauge\nsvc_tunnels_connected {}\n\
                 # HELP svc_tunnels_established_total Reverse tunnels established since start.\n# TYPE svc_tunnels_established_total counter\nsvc_tunnels_established_total {}\n\
                 # HELP svc_heartbeats_total Heartbeats accepted by the Auth Service.\n# TYPE svc_heartbeats_total counter\nsvc_heartbeats_total {}\n\
                 # HELP svc_heartbeat_failures_total Heartbeats that failed.\n# TYPE svc_heartbeat_failures_total counter\nsvc_heartbeat_failures_total {}\n",
                connected,
                established,
                counters.heartbeats.load(Ordering::Relaxed),
                counters.heartbeat_failures.load(Ordering::Relaxed),
            ),
        ),
        _ => text(404, "not found: try /healthz, /readyz or /metrics\n".into()),
    }
}

/// The Linux updater's configuration directory: `SVC_UPGRADE_CONFIG` when set, else
/// `/etc/svc-upgrade.d`.
pub fn upgrade_dir() -> PathBuf {
    svc_update::linux::config::UpgradeConfig::dir_from_env(|k| std::env::var(k).ok())
}

/// The version endpoint the Linux updater asks (`host:port/path`), for the proxy at `proxy`.
pub fn version_endpoint(proxy: &Addr) -> String {
    format!("{proxy}{}default", svc_update::target::CHANNEL_PATH_PREFIX)
}

/// A standalone agent: `svc start` with `auth_service` and `proxy_service` disabled; behind a
/// reverse tunnel to `svc.proxy_server`, or on its own listeners when only `svc.auth_server`
/// is set ([`start_direct`]).
pub async fn start_standalone(config: &Config, insecure: bool) -> anyhow::Result<Node> {
    if crate::services::agent_roles(config).is_empty() {
        bail!(
            "nothing to run: auth_service and proxy_service are disabled and no agent service is \
             enabled (ssh_service, app_service, db_service, kubernetes_service, windows_desktop_service)"
        );
    }
    let Some(proxy) = config.svc.proxy_server.clone() else {
        // The configuration check already refused the services that need a tunnel (apps,
        // databases) in this mode.
        let dialer = ProxyDialer::from_env()?;
        let identity = agent_identity(config, &dialer).await?;
        return start_direct(config, identity, dialer).await;
    };
    let dialer = ProxyDialer::from_env()?;
    let identity = agent_identity(config, &dialer).await?;
    start_node(
        NodeOptions {
            name: config.svc.nodename.clone(),
            endpoint: version_endpoint(&proxy),
            identity,
            proxy_addr: proxy,
            proxy_ca_pem: None,
            insecure,
            dialer,
            upgrade_dir: upgrade_dir(),
            diag_addr: config.svc.diag_addr.clone(),
        },
        config,
    )
    .await
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

async fn bind(field: &str, addr: &Addr) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr.to_string())
        .await
        .with_context(|| format!("{field} {addr}"))?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// An agent that joined the Auth Service directly (`svc.auth_server`, no `svc.proxy_server`):
/// no reverse tunnel; the SSH Service listens on `ssh_service.listen_addr` (the proxy connects
/// in plain TCP: the client's SSH session is end to end), the Kubernetes and Windows Desktop
/// services on their `listen_addr`s (mutual TLS with the proxy's host certificate, then the
/// dial request a tunnel would carry). The heartbeats, straight to the Auth Service, announce
/// each listener as the served resources' `direct_addr` (the SSH node as a `node` resource),
/// which is how the proxy finds them. Returns once the listeners are bound and, within a
/// bounded wait, the first heartbeat was accepted.
pub async fn start_direct(
    config: &Config,
    identity: ClientIdentity,
    dialer: ProxyDialer,
) -> anyhow::Result<Node> {
    let name = config.svc.nodename.clone();
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut listeners = Vec::new();
    let mut resources = crate::services::served_resources(config);
    let key = identity.ssh_private_key()?;
    let cert = identity.ssh_certificate()?;
    let verifier = Arc::new(identity.verifier()?);
    let ssh = SshServer::new(SshServerConfig::new(
        key,
        cert,
        verifier.clone(),
        identity.name.clone(),
        AuthNodeAuthorizer::new(identity.clone(), Some(dialer.clone())),
    ));
    if config.ssh.enabled {
        let (listener, bound) = bind("ssh_service.listen_addr", &config.ssh.listen_addr).await?;
        let addr = announced(bound, config.ssh.public_addrs.first(), &name);
        for node in resources
            .iter_mut()
            .filter(|r| r.kind == Some(svc_core::auth::ServedKind::Node))
        {
            node.direct_addr = addr.clone();
        }
        let (ssh, stop) = (ssh.clone(), stop.clone());
        tasks.push(tokio::spawn(
            async move { ssh.serve_listener(listener, stop).await },
        ));
        listeners.push(("ssh_service", bound));
    }
    let service = crate::services::agent_dial_service(
        config,
        if config.ssh.enabled {
            ssh.dial_service()
        } else {
            refuse_ssh()
        },
    )?;
    let tls = svc_net::tunnel::agent_tls(&identity)?;
    let resource_listeners = [
        (
            config.kube.enabled,
            "kubernetes_service",
            &config.kube.listen_addr,
            config.kube.public_addrs.first(),
            svc_core::auth::ServedKind::Kube,
        ),
        (
            config.windows_desktop.enabled,
            "windows_desktop_service",
            &config.windows_desktop.listen_addr,
            None,
            svc_core::auth::ServedKind::WindowsDesktop,
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
        tasks.push(tokio::spawn(svc_net::tunnel::serve_direct(
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

    let beat = Heartbeat {
        hostname: name.clone(),
        version: svc_core::version::current().to_string(),
        upgrader: std::env::var(UPGRADER_ENV).unwrap_or_default(),
        upgrader_version: std::env::var(UPGRADER_VERSION_ENV).unwrap_or_default(),
        resources,
    };
    let counters = Arc::new(Counters::default());
    let first_beat = Arc::new(tokio::sync::Notify::new());
    // The updater asks the cluster's proxy for versions; with none configured here, the
    // endpoint names the Auth Service's address (written only while the file is empty, so an
    // operator's own endpoint stays).
    let endpoint = version_endpoint(&auth_target(config)?);
    tasks.push(tokio::spawn(heartbeat_loop(
        identity.clone(),
        dialer,
        beat,
        counters.clone(),
        first_beat.clone(),
        ExportTargets {
            upgrade_dir: upgrade_dir(),
            endpoint,
        },
    )));
    if tokio::time::timeout(FIRST_TUNNEL_WAIT, first_beat.notified())
        .await
        .is_err()
    {
        tracing::warn!(auth = %identity.auth_addr, "no heartbeat accepted yet; the agent keeps retrying");
    }
    let diag_addr = match &config.svc.diag_addr {
        Some(addr) => {
            let (bound, task) = serve_diag(addr, None, counters).await?;
            tasks.push(task);
            Some(bound)
        }
        None => None,
    };
    Ok(Node {
        name,
        host_id: identity.name,
        agent: None,
        listeners,
        diag_addr,
        tasks,
        stop,
    })
}

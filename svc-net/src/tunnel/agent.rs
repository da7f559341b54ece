//! The agent side of the reverse tunnel: [`TunnelAgent`] finds where to dial from the proxy's
//! `/webapi/ping`, dials through the [`ProxyDialer`] (direct or HTTP CONNECT), speaks SSH —
//! on the tunnel port, or inside TLS with ALPN `svc-reversetunnel` on the web port — and
//! serves every transport channel with the caller's `tower::Service<DialRequest>`. It sends
//! heartbeats, answers version queries, drains and re-dials on a reconnect request, reconnects
//! after any loss with jittered linear backoff, and keeps a tunnel to every proxy that the
//! discovery channel announces.

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use russh::{
    Channel,
    client::{ChannelOpenHandle, DisconnectReason, Msg, Session},
    keys::{Certificate, PrivateKey, PublicKeyOrCertificate},
};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use svc_core::{
    Addr, Version,
    identity::{SystemRole, Verifier},
};
use tokio::{
    io::{AsyncWriteExt, copy_bidirectional_with_sizes},
    sync::{Notify, watch},
    task::JoinHandle,
};
use tokio_rustls::TlsConnector;
use tokio_util::sync::{CancellationToken, DropGuard};
use tower::{BoxError, ServiceExt, util::BoxCloneSyncService};

use super::backoff::{duplicate_redial, quick_redial};
use super::{
    Backoff, CAP_DIAL_STATUS, CAP_DISCOVERY_PUSH, CAP_OPEN_DIAL, CAPABILITIES_REQUEST, DIAL_OK,
    DISCOVERY_CHANNEL, DRAINING, DialFailure, DialRequest, Discovery, GenerationalDiscovery,
    HEARTBEAT_CHANNEL, MAX_DIAL_REQUEST, OPEN_DIAL_CHANNEL, OPEN_DIAL_STATUS_CHANNEL, PING_ANSWER,
    PING_CHANNEL, RECONNECT_REQUEST, TRANSPORT_CHANNEL, Tunables, TunnelError, VERSION_REQUEST,
    dial_status_line, read_line, sanitize_dial_reason,
};
use crate::{dial::ProxyDialer, io::BoxIo, route::alpn};

/// The service an agent serves dial requests with: a stream to the requested resource.
pub type DialService = BoxCloneSyncService<DialRequest, BoxIo, BoxError>;

/// What the agent needs to keep its tunnels.
#[non_exhaustive]
pub struct AgentConfig {
    /// The proxy's web address (`proxy_server` in the agent's configuration): where
    /// `/webapi/ping` is asked.
    pub proxy_addr: Addr,
    /// The agent's SSH key.
    pub host_key: PrivateKey,
    /// Its host-CA-signed certificate; the SSH user is the certificate's host ID.
    pub host_cert: Certificate,
    /// The host ID (`<uuid>.<cluster>`).
    pub host_id: String,
    /// Verifies the proxy's SSH host certificate (trusts the cluster's host CA).
    pub verifier: Arc<Verifier>,
    /// Trust for the proxy's TLS certificate: the cluster host CA (from the verifier), plus the
    /// public web roots and this PEM bundle (a configured proxy CA), if given.
    pub proxy_ca_pem: Option<Vec<u8>>,
    /// Accept any TLS certificate from the proxy (`svc start --insecure`, for proxies with a
    /// self-signed certificate). The SSH layer inside still verifies the proxy's host
    /// certificate against the cluster's host CA, so this only gives up the check of the
    /// `/webapi/ping` answer and the outer TLS.
    pub insecure_proxy_tls: bool,
    /// The agent's version, answered to the version query.
    pub version: Version,
    /// Outbound dialing (direct, or HTTP CONNECT per `HTTPS_PROXY`/`NO_PROXY`).
    pub dialer: ProxyDialer,
    /// Window, packet and keep-alive settings.
    pub tunables: Tunables,
    /// The reconnect schedule.
    pub backoff: Backoff,
    /// Serve dials carried in the channel-open message and say so to the proxy's capabilities
    /// query (on by default). Off, the agent answers as agents that predate it did (no
    /// capabilities, dial requests on the opened channel only): for tests of mixed versions.
    pub open_dial: bool,
    /// With [`AgentConfig::open_dial`]: also serve dials whose refusal carries the agent's
    /// reason to the proxy (a status line behind the confirmation) and say so to the
    /// capabilities query (on by default). Off, the agent answers as agents that predate it did
    /// (an open failure, whose text the proxy does not see): for tests of mixed versions.
    pub dial_status: bool,
    /// Send heartbeats on short-lived ping channels, take the list of proxies from their
    /// answers and from the proxy's pushes, and say so to the capabilities query (on by
    /// default): with a proxy that answers pings the tunnel holds no channel open at idle. Off
    /// — and with proxies that refuse pings — the agent keeps a heartbeat and a discovery
    /// channel open as agents that predate it did: for tests of mixed versions.
    pub ping: bool,
}

impl AgentConfig {
    /// A configuration with the running binary's version, the environment's proxy settings
    /// given as `dialer`, default tunables and the reference backoff.
    pub fn new(
        proxy_addr: Addr,
        host_id: String,
        host_key: PrivateKey,
        host_cert: Certificate,
        verifier: Arc<Verifier>,
        dialer: ProxyDialer,
    ) -> Self {
        Self {
            proxy_addr,
            host_key,
            host_cert,
            host_id,
            verifier,
            proxy_ca_pem: None,
            insecure_proxy_tls: false,
            version: svc_core::version::current().clone(),
            dialer,
            tunables: Tunables::default(),
            backoff: Backoff::default(),
            open_dial: true,
            dial_status: true,
            ping: true,
        }
    }

    /// Whether to ping on short-lived channels and take pushed discovery (see
    /// [`AgentConfig::ping`]).
    pub fn with_ping(mut self, on: bool) -> Self {
        self.ping = on;
        self
    }

    /// Whether to serve dials carried in the channel-open message (see
    /// [`AgentConfig::open_dial`]).
    pub fn with_open_dial(mut self, on: bool) -> Self {
        self.open_dial = on;
        self
    }

    /// Whether refusals of dials in the open carry the agent's reason (see
    /// [`AgentConfig::dial_status`]).
    pub fn with_dial_status(mut self, on: bool) -> Self {
        self.dial_status = on;
        self
    }

    /// Reports `version` instead of the binary's.
    pub fn with_version(mut self, version: Version) -> Self {
        self.version = version;
        self
    }

    /// Replaces the tunables.
    pub fn with_tunables(mut self, tunables: Tunables) -> Self {
        self.tunables = tunables;
        self
    }

    /// Also trusts these CA certificates (PEM) for the proxy's TLS certificate.
    pub fn with_proxy_ca_pem(mut self, pem: Vec<u8>) -> Self {
        self.proxy_ca_pem = Some(pem);
        self
    }

    /// Accepts any TLS certificate from the proxy (see [`AgentConfig::insecure_proxy_tls`]).
    pub fn with_insecure_proxy_tls(mut self) -> Self {
        self.insecure_proxy_tls = true;
        self
    }

    /// Replaces the reconnect schedule.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
}

/// What an agent's tunnels are doing, for health checks and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentStatus {
    /// Host IDs of the proxies with an established tunnel.
    pub connected: BTreeSet<String>,
    /// How many tunnels were established since start.
    pub established: u64,
    /// The last failure, as logged.
    pub last_error: Option<String>,
    /// The SSH cipher of the tunnel established last: `none` inside a TLS connection whose
    /// certificate was verified (the TLS layer encrypts, [`Tunables::encrypt_inside_tls`]),
    /// an AEAD cipher otherwise.
    pub ssh_cipher: Option<String>,
}

/// Keeps an agent's reverse tunnels.
pub struct TunnelAgent {
    shared: Arc<Shared>,
}

struct Shared {
    config: AgentConfig,
    /// The tunnel's SSH client configuration on the tunnel port (plain TCP).
    ssh: Arc<russh::client::Config>,
    /// The same inside a verified TLS connection: the `none` cipher first (the TLS layer
    /// encrypts), unless [`Tunables::encrypt_inside_tls`] or the proxy's certificate goes
    /// unchecked ([`AgentConfig::insecure_proxy_tls`]).
    ssh_inside_tls: Arc<russh::client::Config>,
    tls: TlsConnector,
    /// The client of the proxy's `/webapi/ping` (same trust as the tunnel, same dialer).
    ping: crate::http::HttpClient,
    key: Arc<PrivateKey>,
    service: DialService,
    status: watch::Sender<AgentStatus>,
    shutdown: CancellationToken,
    /// The tunnel pool: which proxies are held, what each announced, how many dial loops run.
    pool: Mutex<Pool>,
    /// Wakes the pool's manager (a list arrived, a tunnel came or went).
    pool_changed: Notify,
    /// Counts changes of the set of announced proxies: slots waiting out a backoff dial again
    /// at once (a proxy joined or left the registry).
    roster: watch::Sender<u64>,
    /// Counts lists that arrived while some listed proxy has no tunnel: slots waiting out a
    /// backoff start a fresh run of quick redials.
    wanted: watch::Sender<u64>,
}

/// A running agent: its status and its stop switch.
pub struct RunningAgent {
    status: watch::Receiver<AgentStatus>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningAgent {
    /// The current status.
    pub fn status(&self) -> AgentStatus {
        self.status.borrow().clone()
    }

    /// A receiver of status changes.
    pub fn watch(&self) -> watch::Receiver<AgentStatus> {
        self.status.clone()
    }

    /// Waits until `check` holds for the status.
    pub async fn wait_for(&self, mut check: impl FnMut(&AgentStatus) -> bool) {
        let mut rx = self.status.clone();
        let _ = rx.wait_for(|s| check(s)).await;
    }

    /// Stops every tunnel and waits for the agent's tasks.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

impl TunnelAgent {
    /// Builds an agent that serves dial requests with `service`.
    pub fn new<S>(config: AgentConfig, service: S) -> Result<Self, TunnelError>
    where
        S: tower::Service<DialRequest, Response = BoxIo> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        let mut roots = config
            .verifier
            .root_store(Some(svc_core::identity::IdentityKind::Host));
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(pem) = &config.proxy_ca_pem {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| TunnelError::Malformed {
                    what: "proxy CA bundle",
                    reason: format!("expected PEM certificates: {e}"),
                })?;
                roots.add(cert).map_err(|e| TunnelError::Malformed {
                    what: "proxy CA bundle",
                    reason: e.to_string(),
                })?;
            }
        }
        let tls_error = |e: rustls::Error| TunnelError::Malformed {
            what: "TLS configuration",
            reason: e.to_string(),
        };
        let tls = if config.insecure_proxy_tls {
            crate::tls::insecure_client_config().map_err(tls_error)?
        } else {
            rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_safe_default_protocol_versions()
                .map_err(tls_error)?
                .with_root_certificates(roots)
                .with_no_client_auth()
        };
        let client_id = || russh::SshId::Standard(format!("SSH-2.0-svc_agent_{}", config.version).into());
        let mut ssh = crate::ssh::client_config(&config.tunables);
        ssh.client_id = client_id();
        // Without the proxy's certificate checked, TLS proves nothing about who is on the other
        // end: SSH keeps encrypting.
        let mut ssh_inside_tls = if config.insecure_proxy_tls {
            crate::ssh::client_config(&config.tunables)
        } else {
            crate::ssh::client_config_inside_tls(&config.tunables)
        };
        ssh_inside_tls.client_id = client_id();
        let tls = Arc::new(tls);
        let after = config.tunables.handshake_timeout;
        // One ping before each dial: no connection is kept between them.
        let ping = crate::http::HttpClient::builder(tls.clone())
            .connect_timeout(after)
            .timeout(after)
            .pool_max_idle_per_host(0)
            .build(config.dialer.clone());
        Ok(Self {
            shared: Arc::new(Shared {
                key: Arc::new(config.host_key.clone()),
                ssh: Arc::new(ssh),
                ssh_inside_tls: Arc::new(ssh_inside_tls),
                tls: TlsConnector::from(tls),
                ping,
                config,
                service: BoxCloneSyncService::new(service.map_err(Into::into)),
                status: watch::channel(AgentStatus::default()).0,
                shutdown: CancellationToken::new(),
                pool: Mutex::new(Pool::default()),
                pool_changed: Notify::new(),
                roster: watch::channel(0).0,
                wanted: watch::channel(0).0,
            }),
        })
    }

    /// Starts the tunnels in the background.
    pub fn spawn(self) -> RunningAgent {
        let shared = self.shared;
        let status = shared.status.subscribe();
        let shutdown = shared.shutdown.clone();
        let task = tokio::spawn(pool_loop(shared));
        RunningAgent {
            status,
            shutdown,
            task,
        }
    }
}

/// Where a tunnel is dialed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    addr: Addr,
    tls: bool,
}

/// Where an agent dials its tunnel, from a `/webapi/ping` document:
/// with TLS routing the proxy's public web address (`proxy.ssh.public_addr`); otherwise
/// `proxy.ssh.ssh_tunnel_public_addr`, else `proxy.ssh.tunnel_listen_addr`. An unspecified
/// host (`0.0.0.0`) means "the host the ping was asked at". Returns the address and whether
/// it is a TLS-routing port.
pub fn tunnel_addr_from_ping(ping: &serde_json::Value, pinged: &Addr) -> Result<(Addr, bool), TunnelError> {
    let proxy = &ping["proxy"];
    let tls = proxy["tls_routing_enabled"].as_bool().unwrap_or(false);
    let field = |name: &str| {
        proxy["ssh"][name]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let chosen = if tls {
        field("public_addr").or_else(|| field("web_listen_addr"))
    } else {
        field("ssh_tunnel_public_addr").or_else(|| field("tunnel_listen_addr"))
    };
    let text = chosen.ok_or_else(|| TunnelError::Malformed {
        what: "ping",
        reason: "no tunnel address in proxy.ssh".into(),
    })?;
    let default_port = if tls {
        pinged.port()
    } else {
        svc_core::config::ports::PROXY_TUNNEL
    };
    let addr = Addr::parse_with_default_port(&text, default_port).map_err(|e| TunnelError::Malformed {
        what: "ping",
        reason: format!("proxy.ssh tunnel address {text:?}: {e}"),
    })?;
    let unspecified = addr.host().ip().is_some_and(|ip| ip.is_unspecified());
    Ok((
        if unspecified {
            pinged.with_port(addr.port())
        } else {
            addr
        },
        tls,
    ))
}

fn server_name(addr: &Addr) -> Result<ServerName<'static>, TunnelError> {
    let host = addr.host_str();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|e| TunnelError::Malformed {
        what: "proxy address",
        reason: format!("{host:?} is not a valid TLS server name: {e}"),
    })
}

impl Shared {
    fn set_error(&self, e: &dyn std::fmt::Display) {
        let text = e.to_string();
        self.status.send_modify(|s| s.last_error = Some(text));
    }

    async fn fetch_ping(&self) -> Result<serde_json::Value, TunnelError> {
        let url = format!(
            "https://{}{}",
            self.config.proxy_addr,
            svc_core::webapi::PING_PATH
        );
        let err = |reason: String| TunnelError::Ping {
            url: url.clone(),
            reason,
        };
        let resp = self.ping.get(&url).await.map_err(|e| {
            if e.is_timeout() {
                TunnelError::Timeout {
                    what: "fetching the proxy's ping",
                    after: self.config.tunables.handshake_timeout,
                }
            } else {
                err(e.kind().to_string())
            }
        })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(err(format!("status {status}")));
        }
        serde_json::from_slice(resp.body()).map_err(|e| err(format!("not JSON: {e}")))
    }
}

/// The agent's tunnels: one per proxy of the cluster.
///
/// Every dial loop ("slot") is alike: it dials a proxy that discovery announced and no tunnel
/// holds yet (at the address announced for it), else the address from the configured proxy's
/// ping (asked again before every dial: the cluster's addresses may change while the agent is
/// away). Proxies behind a load balancer share one address, so a dial may land on a proxy the
/// agent already holds: that tunnel is closed at once (the proxy is identified by the host ID
/// in its certificate) and the slot tries again after a short pause, for a bounded run of such
/// dials (see [`duplicate_redial`]), then after the reconnect backoff; a tunnel that was up and
/// dropped is dialed again after a short pause too. A list that arrives while a listed proxy
/// has no tunnel starts a fresh run of quick redials (proxies repeat their list every announce
/// interval): a proxy that restarted under the same host ID (the list unchanged) gets its
/// tunnel back soon after it listens. The manager keeps
/// as many slots as there are proxies to hold (at least one): the announced ones and those
/// held. A proxy that no complete list names any more (it left the registry) has its tunnel
/// drained. Older proxies announce nothing: the agent then keeps one tunnel.
#[derive(Default)]
struct Pool {
    /// Proxies with an established tunnel (not draining), by host ID.
    held: std::collections::BTreeMap<String, Arc<ConnShared>>,
    /// The last list each held proxy announced.
    lists: std::collections::BTreeMap<String, Discovery>,
    /// The proxies of the last complete list heard, kept when every tunnel is gone: where to
    /// dial then (with proxy peering the configured address may be the proxy that went away).
    remembered: std::collections::BTreeMap<String, super::DiscoveredProxy>,
    /// Dial loops running.
    slots: usize,
}

impl Pool {
    /// Every proxy announced by any list.
    fn known(&self) -> std::collections::BTreeMap<&str, &super::DiscoveredProxy> {
        self.lists
            .values()
            .flat_map(|d| d.proxies.iter())
            .map(|p| (p.proxy_id.as_str(), p))
            .collect()
    }

    /// The proxies the lists name to hold: with proxy peering each list's `hold`, otherwise
    /// every proxy it names.
    fn named(d: &Discovery) -> BTreeSet<&str> {
        match &d.hold {
            Some(hold) => hold.iter().map(String::as_str).collect(),
            None => d.proxies.iter().map(|p| p.proxy_id.as_str()).collect(),
        }
    }

    /// The announced proxies to hold a tunnel to.
    fn wanted(&self) -> std::collections::BTreeMap<&str, &super::DiscoveredProxy> {
        let named: BTreeSet<&str> = self.lists.values().flat_map(Self::named).collect();
        self.known()
            .into_iter()
            .filter(|(id, _)| named.contains(id))
            .collect()
    }

    /// Held proxies that no complete list names to hold (only when some complete list exists,
    /// and only once the agent holds a proxy that is named: a tunnel is never given up before
    /// one to a named proxy is up — with proxy peering the list may name a proxy that is not
    /// reachable yet, or no longer).
    fn unlisted(&self) -> Vec<String> {
        let complete: BTreeSet<&str> = self
            .lists
            .values()
            .filter(|d| d.complete)
            .flat_map(Self::named)
            .collect();
        if !self.lists.values().any(|d| d.complete) {
            return Vec::new();
        }
        if !self.held.keys().any(|id| complete.contains(id.as_str())) {
            return Vec::new();
        }
        self.held
            .keys()
            .filter(|id| !complete.contains(id.as_str()))
            .cloned()
            .collect()
    }

    /// How many tunnels the agent should hold: every proxy to hold and every held one that is
    /// still listed; at least one.
    fn desired(&self) -> usize {
        let unlisted = self.unlisted();
        let mut ids: BTreeSet<&str> = self.wanted().into_keys().collect();
        ids.extend(
            self.held
                .keys()
                .filter(|id| !unlisted.contains(id))
                .map(String::as_str),
        );
        ids.len().max(1)
    }

    /// A proxy to hold that no tunnel holds, with an address to dial; `turn` rotates among
    /// them. With no list at all (every tunnel lost), a proxy of the last complete list.
    fn missing(&self, turn: usize) -> Option<Target> {
        let wanted = self.wanted();
        let pool: Vec<&super::DiscoveredProxy> = if self.lists.is_empty() {
            self.remembered.values().collect()
        } else {
            wanted.into_values().collect()
        };
        let missing: Vec<&super::DiscoveredProxy> = pool
            .into_iter()
            .filter(|p| !self.held.contains_key(&p.proxy_id) && !p.tunnel_addr.is_empty())
            .collect();
        if missing.is_empty() {
            return None;
        }
        let p = missing[turn % missing.len()];
        Addr::parse(&p.tunnel_addr).ok().map(|addr| Target {
            addr,
            tls: p.tls_routing,
        })
    }
}

fn lock_pool(shared: &Shared) -> std::sync::MutexGuard<'_, Pool> {
    // A panic while holding the lock leaves a map that is still usable; keep serving.
    shared.pool.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Claims `proxy_id` for `conn`; false when another tunnel already holds it.
    fn claim(&self, proxy_id: &str, conn: &Arc<ConnShared>) -> bool {
        let mut pool = lock_pool(self);
        if pool.held.contains_key(proxy_id) {
            return false;
        }
        pool.held.insert(proxy_id.to_owned(), conn.clone());
        drop(pool);
        self.pool_changed.notify_one();
        true
    }

    /// Releases `proxy_id` if `conn` holds it, forgetting its list.
    fn release(&self, proxy_id: &str, conn: &Arc<ConnShared>) {
        let mut pool = lock_pool(self);
        if pool.held.get(proxy_id).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            pool.held.remove(proxy_id);
            pool.lists.remove(proxy_id);
        }
        drop(pool);
        self.pool_changed.notify_one();
    }

    /// Records the list `proxy_id` announced.
    /// Takes the list of proxies `proxy_id` announced; false (nothing done) when the agent
    /// holds no tunnel to it.
    fn announced(&self, proxy_id: &str, discovery: Discovery) -> bool {
        let mut pool = lock_pool(self);
        if !pool.held.contains_key(proxy_id) {
            return false;
        }
        if discovery.complete {
            pool.remembered = discovery
                .proxies
                .iter()
                .map(|p| (p.proxy_id.clone(), p.clone()))
                .collect();
        }
        pool.lists.insert(proxy_id.to_owned(), discovery);
        let missing = pool.wanted().keys().any(|id| !pool.held.contains_key(*id));
        drop(pool);
        if missing {
            self.wanted.send_modify(|n| *n = n.wrapping_add(1));
        }
        self.pool_changed.notify_one();
        true
    }
}

/// Takes the list of proxies a push carries (JSON [`GenerationalDiscovery`]) unless a list of
/// the same or a later generation from this proxy was taken already (pushes may overtake each
/// other).
fn take_list(json: &str, shared: &Shared, conn: &ConnShared, proxy_id: &str) {
    let message = match serde_json::from_str::<GenerationalDiscovery>(json) {
        Ok(message) => message,
        Err(e) => {
            tracing::warn!(%proxy_id, error = %e, "malformed discovery message");
            return;
        }
    };
    let next = message.generation.saturating_add(1);
    let mut applied = conn
        .applied
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if next > *applied && shared.announced(proxy_id, message.discovery) {
        *applied = next;
    }
}

/// Sends one ping: `Ok(true)` when the proxy answered it ([`PING_ANSWER`]), `Ok(false)` when it
/// refused it as an unknown channel (a proxy that predates pings).
async fn ping(handle: &russh::client::Handle<AgentHandler>) -> Result<bool, russh::Error> {
    match handle.channel_open_direct_streamlocal(PING_CHANNEL).await {
        Err(russh::Error::ChannelOpenFailure(russh::ChannelOpenFailure::UnknownChannelType)) => Ok(false),
        Err(russh::Error::ChannelOpenFailure(_)) => Ok(true),
        // Not what a proxy does; taken as an answer, and closed.
        Ok(channel) => {
            let _ = channel.close().await;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// Pings the proxy once per `interval` (the first ping went already); returns if a ping cannot
/// be sent (the tunnel is going away; the proxy then marks the agent offline, as when
/// heartbeats stop).
async fn ping_loop(handle: &russh::client::Handle<AgentHandler>, proxy_id: &str, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = ping(handle).await {
            tracing::debug!(%proxy_id, error = %e, "a ping to the proxy failed; pings stop");
            return;
        }
    }
}

/// The pool's manager: starts slots while fewer run than proxies are wanted, and drains the
/// tunnels of proxies that left the registry.
async fn pool_loop(shared: Arc<Shared>) {
    let tracker = tokio_util::task::TaskTracker::new();
    let mut roster: BTreeSet<String> = BTreeSet::new();
    loop {
        let woken = shared.pool_changed.notified();
        let (start, retire) = {
            let mut pool = lock_pool(&shared);
            let known: BTreeSet<String> = pool.known().into_keys().map(str::to_owned).collect();
            if known != roster {
                roster = known;
                shared.roster.send_modify(|n| *n += 1);
            }
            let retire: Vec<(String, Arc<ConnShared>)> = pool
                .unlisted()
                .into_iter()
                .filter_map(|id| {
                    pool.lists.remove(&id);
                    pool.held.remove(&id).map(|c| (id, c))
                })
                .collect();
            let desired = pool.desired();
            let start = desired.saturating_sub(pool.slots);
            pool.slots += start;
            (start, retire)
        };
        for (proxy_id, conn) in retire {
            tracing::info!(%proxy_id, "the proxy left the cluster's registry; draining its tunnel");
            conn.reconnect.notify_one();
        }
        for _ in 0..start {
            tracker.spawn(slot_loop(shared.clone(), tracker.clone()));
        }
        tokio::select! {
            _ = woken => {}
            _ = shared.shutdown.cancelled() => break,
        }
    }
    tracker.close();
    tracker.wait().await;
}

/// One dial loop of the pool (see [`Pool`]).
async fn slot_loop(shared: Arc<Shared>, tracker: tokio_util::task::TaskTracker) {
    let mut backoff = shared.config.backoff.clone();
    let mut turn = rand::random::<u32>() as usize;
    let mut roster = shared.roster.subscribe();
    roster.mark_unchanged();
    let mut wanted = shared.wanted.subscribe();
    wanted.mark_unchanged();
    // Dials in a row that reached a proxy already held.
    let mut duplicates: u32 = 0;
    loop {
        if shared.shutdown.is_cancelled() {
            return;
        }
        {
            let mut pool = lock_pool(&shared);
            if pool.slots > pool.desired() {
                pool.slots -= 1;
                return;
            }
        }
        turn = turn.wrapping_add(1);
        let announced = {
            let pool = lock_pool(&shared);
            if pool.lists.is_empty() {
                // Every tunnel lost: the configured address and the proxies last heard of, in
                // turn.
                (turn % 2 == 1).then(|| pool.missing(turn / 2)).flatten()
            } else {
                pool.missing(turn)
            }
        };
        let mut established = false;
        // Shutdown is watched inside: a tunnel that is up must be closed, not dropped.
        let attempt = async {
            let target = match announced {
                Some(t) => t,
                None => {
                    let ping = tokio::select! {
                        p = shared.fetch_ping() => p?,
                        _ = shared.shutdown.cancelled() => return Ok(()),
                    };
                    let (addr, tls) = tunnel_addr_from_ping(&ping, &shared.config.proxy_addr)?;
                    Target { addr, tls }
                }
            };
            run_tunnel(&shared, &target, &mut backoff, &tracker, &mut established).await
        };
        let result = attempt.await;
        if established {
            duplicates = 0;
        }
        let unit = rand::random::<f64>();
        let delay = match result {
            // A reconnect request (or a drained, unlisted proxy): dial again at once.
            Ok(()) if !shared.shutdown.is_cancelled() => continue,
            Ok(()) => return,
            Err(TunnelError::AlreadyHeld(proxy_id)) => {
                duplicates = duplicates.saturating_add(1);
                let wanted = lock_pool(&shared).desired();
                tracing::debug!(%proxy_id, duplicates, "reached a proxy this agent already holds a tunnel to; trying again");
                duplicate_redial(duplicates, wanted, unit).unwrap_or_else(|| backoff.next_delay(unit))
            }
            // The tunnel was up (the proxy restarted, the network blinked): dial again soon.
            Err(e) if established => {
                tracing::warn!(proxy = %shared.config.proxy_addr, error = %e, "reverse tunnel lost");
                shared.set_error(&e);
                quick_redial(unit)
            }
            Err(e) => {
                tracing::warn!(proxy = %shared.config.proxy_addr, error = %e, "reverse tunnel failed");
                shared.set_error(&e);
                backoff.next_delay(unit)
            }
        };
        tracing::debug!(?delay, "reconnecting the reverse tunnel after a pause");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            // A proxy joined or left: count again, and dial at once if still needed.
            r = roster.changed() => {
                if r.is_ok() {
                    backoff.reset();
                    duplicates = 0;
                }
            }
            // A list arrived while a listed proxy has no tunnel: a fresh run of quick redials.
            r = wanted.changed() => {
                if r.is_ok() {
                    duplicates = 0;
                }
            }
            _ = shared.shutdown.cancelled() => return,
        }
    }
}

/// One tunnel connection, from dial to loss (`Err`) or reconnect request (`Ok`, after which
/// the caller dials again at once while this connection drains in the background).
async fn run_tunnel(
    shared: &Arc<Shared>,
    target: &Target,
    backoff: &mut Backoff,
    tracker: &tokio_util::task::TaskTracker,
    established: &mut bool,
) -> Result<(), TunnelError> {
    let conn = Arc::new(ConnShared {
        draining: AtomicBool::new(false),
        reconnect: Notify::new(),
        proxy_id: Mutex::new(None),
        disconnect_reason: Mutex::new(None),
        active: std::sync::atomic::AtomicUsize::new(0),
        idle: Notify::new(),
        applied: Mutex::new(0),
        cipher: Mutex::new(None),
    });
    let result = run_tunnel_on(conn.clone(), shared, target, backoff, tracker, established).await;
    // The proxy's own words (a refusal such as an incompatible version) say more than the
    // error the cut connection caused.
    match (result, conn.disconnect_reason.lock().ok().and_then(|r| r.clone())) {
        (Err(_), Some(reason)) => Err(TunnelError::ProxyClosed(reason)),
        (result, _) => result,
    }
}

async fn run_tunnel_on(
    conn: Arc<ConnShared>,
    shared: &Arc<Shared>,
    target: &Target,
    backoff: &mut Backoff,
    tracker: &tokio_util::task::TaskTracker,
    came_up: &mut bool,
) -> Result<(), TunnelError> {
    let cfg = &shared.config;
    let after = cfg.tunables.handshake_timeout;
    let closed = CancellationToken::new();
    let handler = AgentHandler {
        shared: shared.clone(),
        conn: conn.clone(),
        _closed: closed.clone().drop_guard(),
    };
    let connect = async {
        let dial = || async {
            cfg.dialer
                .dial(&target.addr)
                .await
                .map_err(|source| TunnelError::Dial {
                    addr: target.addr.to_string(),
                    source,
                })
        };
        let (io, ssh): (BoxIo, _) = if target.tls {
            let mut tls_config = (**shared.tls.config()).clone();
            tls_config.alpn_protocols = vec![alpn::REVERSE_TUNNEL.as_bytes().to_vec()];
            // Behind a load balancer that terminates TLS the tunnel rides the connection
            // upgrade (`conn_upgrade`); directly, this is one TLS handshake as before.
            let buffered = || async {
                dial().await.map(|tcp| {
                    Box::new(super::readbuf::IdleReadBuffer::new(super::TLS_READ_BUFFER, tcp)) as BoxIo
                })
            };
            let tls = crate::conn_upgrade::connect_tls(
                buffered,
                Arc::new(tls_config),
                &crate::conn_upgrade::OuterTrust {
                    extra_ca_pem: cfg.proxy_ca_pem.clone(),
                    insecure: cfg.insecure_proxy_tls,
                },
                server_name(&target.addr)?,
                &target.addr.to_string(),
            )
            .await
            .map_err(|source| TunnelError::Upgrade(Box::new(source)))?;
            (Box::new(tls), shared.ssh_inside_tls.clone())
        } else {
            (Box::new(dial().await?), shared.ssh.clone())
        };
        let mut handle = russh::client::connect_stream(ssh, io, handler).await?;
        let auth = handle
            .authenticate_openssh_cert(cfg.host_id.clone(), shared.key.clone(), cfg.host_cert.clone())
            .await?;
        if !auth.success() {
            return Err(TunnelError::AuthRefused(target.addr.to_string()));
        }
        Ok::<_, TunnelError>(handle)
    };
    let handle = tokio::select! {
        r = tokio::time::timeout(after, connect) => r.map_err(|_| TunnelError::Timeout {
            what: "connecting the reverse tunnel",
            after,
        })??,
        _ = shared.shutdown.cancelled() => return Ok(()),
    };

    // The proxy is known by the host ID in its certificate: behind a load balancer this dial
    // may have reached a proxy another tunnel already holds.
    let proxy_id = conn
        .proxy_id
        .lock()
        .ok()
        .and_then(|p| p.clone())
        .unwrap_or_else(|| target.addr.to_string());
    if !shared.claim(&proxy_id, &conn) {
        let _ = handle
            .disconnect(
                russh::Disconnect::ByApplication,
                "the agent already holds a tunnel to this proxy",
                "",
            )
            .await;
        return Err(TunnelError::AlreadyHeld(proxy_id));
    }
    let established = async {
        // A ping right away: a proxy that answers it takes pings as heartbeats and pushes the
        // list of proxies, and the tunnel holds no channel open at idle. A proxy that predates
        // pings: the heartbeat and discovery channels.
        if cfg.ping && ping(&handle).await? {
            return Ok::<_, TunnelError>(true);
        }
        // Heartbeats: a ping right away, then every interval.
        let heartbeat = handle.channel_open_direct_streamlocal(HEARTBEAT_CHANNEL).await?;
        let interval = cfg.tunables.keepalive_interval;
        let hb_closed = closed.clone();
        let hb_shutdown = shared.shutdown.clone();
        tracker.spawn(async move {
            let mut stream = heartbeat.into_stream();
            let mut tick = tokio::time::interval(interval);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = hb_closed.cancelled() => return,
                    _ = hb_shutdown.cancelled() => return,
                }
                if stream.write_all(b"ping\n").await.is_err() || stream.flush().await.is_err() {
                    return;
                }
            }
        });
        // Discovery: every announced list goes to the pool, which opens the missing tunnels. A
        // proxy without the channel announces nothing; the tunnel works all the same.
        match handle.channel_open_direct_streamlocal(DISCOVERY_CHANNEL).await {
            Ok(discovery) => {
                let (d_closed, d_shutdown) = (closed.clone(), shared.shutdown.clone());
                let (d_shared, d_proxy) = (shared.clone(), proxy_id.clone());
                tracker.spawn(async move {
                    let mut stream = discovery.into_stream();
                    loop {
                        let line = tokio::select! {
                            l = read_line(&mut stream, 64 * 1024) => match l {
                                Ok(Some(line)) => line,
                                _ => return,
                            },
                            _ = d_closed.cancelled() => return,
                            _ = d_shutdown.cancelled() => return,
                        };
                        match serde_json::from_str::<Discovery>(&line) {
                            Ok(d) => {
                                d_shared.announced(&d_proxy, d);
                            }
                            Err(e) => {
                                tracing::warn!(proxy_id = %d_proxy, error = %e, "malformed discovery message")
                            }
                        }
                    }
                });
            }
            Err(e) => tracing::debug!(%proxy_id, error = %e, "the proxy has no discovery channel"),
        }
        Ok::<_, TunnelError>(false)
    };
    let pings = match established.await {
        Ok(pings) => pings,
        Err(e) => {
            shared.release(&proxy_id, &conn);
            return Err(e);
        }
    };

    backoff.reset();
    *came_up = true;
    let cipher = conn.cipher.lock().ok().and_then(|c| *c);
    let cipher = cipher.as_ref().map_or("unknown", AsRef::as_ref);
    shared.status.send_modify(|s| {
        s.connected.insert(proxy_id.clone());
        s.established += 1;
        s.ssh_cipher = Some(cipher.to_owned());
    });
    tracing::info!(proxy = %target.addr, %proxy_id, tls = target.tls, ssh_cipher = cipher, "reverse tunnel established");

    let interval = cfg.tunables.keepalive_interval;
    let outcome = tokio::select! {
        _ = closed.cancelled() => Err(TunnelError::Closed { server: proxy_id.clone(), reason: "the proxy closed the connection".into() }),
        // Pings stop only when one cannot be opened: the tunnel then waits for its end as
        // one whose heartbeats stopped does.
        () = async {
            if pings {
                ping_loop(&handle, &proxy_id, interval).await;
            }
            std::future::pending::<()>().await
        } => Ok(()),
        _ = conn.reconnect.notified() => Ok(()),
        _ = shared.shutdown.cancelled() => Ok(()),
    };
    shared.status.send_modify(|s| {
        s.connected.remove(&proxy_id);
    });
    shared.release(&proxy_id, &conn);
    if outcome.is_ok() {
        // Drain: new work is refused; the connection closes when its sessions are done (or at
        // shutdown), while the caller dials a fresh tunnel at once.
        conn.draining.store(true, Ordering::SeqCst);
        tracing::info!(%proxy_id, "draining the reverse tunnel");
        let shutdown = shared.shutdown.clone();
        let conn = conn.clone();
        tracker.spawn(async move {
            loop {
                let idle = conn.idle.notified();
                if conn.active.load(Ordering::SeqCst) == 0 {
                    break;
                }
                tokio::select! {
                    _ = idle => {}
                    _ = closed.cancelled() => return,
                    _ = shutdown.cancelled() => break,
                }
            }
            let _ = handle
                .disconnect(russh::Disconnect::ByApplication, "agent connection drained", "")
                .await;
        });
        if shared.shutdown.is_cancelled() {
            return Ok(());
        }
    }
    outcome
}

struct ConnShared {
    disconnect_reason: Mutex<Option<String>>,
    // Transport channels being served, and a wake-up for the drain when it reaches zero.
    active: std::sync::atomic::AtomicUsize,
    idle: Notify,
    draining: AtomicBool,
    reconnect: Notify,
    proxy_id: Mutex<Option<String>>,
    /// One more than the generation of the last list of proxies applied from a ping's answer
    /// or a push (0: none yet).
    applied: Mutex<u64>,
    /// The SSH cipher the last key exchange chose.
    cipher: Mutex<Option<russh::cipher::Name>>,
}

struct AgentHandler {
    shared: Arc<Shared>,
    conn: Arc<ConnShared>,
    // Cancels `closed` when russh drops the handler, i.e. when the connection is gone.
    _closed: DropGuard,
}

impl AgentHandler {
    /// Runs one of the tunnel's sessions on a task of its own, counted as active until it
    /// ends: a draining tunnel waits for the count to reach zero.
    fn spawn_counted(&self, session: impl std::future::Future<Output = ()> + Send + 'static) {
        let conn = self.conn.clone();
        conn.active.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            session.await;
            if conn.active.fetch_sub(1, Ordering::SeqCst) == 1 {
                conn.idle.notify_waiters();
            }
        });
    }
}

impl russh::client::Handler for AgentHandler {
    type Error = russh::Error;

    async fn kex_done(
        &mut self,
        _shared_secret: Option<&[u8]>,
        names: &russh::Names,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        if let Ok(mut cipher) = self.conn.cipher.lock() {
            *cipher = Some(names.cipher);
        }
        Ok(())
    }

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::Certificate(cert) = key else {
            tracing::warn!("the proxy presented a plain SSH key, not a host certificate; refusing it");
            return Ok(false);
        };
        match self
            .shared
            .config
            .verifier
            .verify_host_ssh(cert, SystemTime::now(), Some(SystemRole::Proxy))
        {
            Ok(host) => {
                if let Ok(mut p) = self.conn.proxy_id.lock() {
                    *p = Some(host.host_id);
                }
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the proxy's host certificate is not trusted; refusing it");
                Ok(false)
            }
        }
    }

    async fn server_channel_open_forwarded_streamlocal(
        &mut self,
        channel: Channel<Msg>,
        socket_path: &str,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        match socket_path {
            VERSION_REQUEST => {
                reply.accept().await;
                let version = self.shared.config.version.to_string();
                tokio::spawn(async move {
                    let _ = channel.data_bytes(Bytes::from(version)).await;
                    let _ = channel.eof().await;
                    let _ = channel.close().await;
                });
            }
            CAPABILITIES_REQUEST if self.shared.config.open_dial || self.shared.config.ping => {
                reply.accept().await;
                let config = &self.shared.config;
                let words = [
                    (config.open_dial, CAP_OPEN_DIAL),
                    (config.open_dial && config.dial_status, CAP_DIAL_STATUS),
                    (config.ping, CAP_DISCOVERY_PUSH),
                ]
                .into_iter()
                .filter_map(|(on, word)| on.then_some(word))
                .collect::<Vec<_>>()
                .join(" ");
                tokio::spawn(async move {
                    let _ = channel.data_bytes(Bytes::from(words)).await;
                    let _ = channel.eof().await;
                    let _ = channel.close().await;
                });
            }
            RECONNECT_REQUEST => {
                reply.accept().await;
                tracing::info!("the proxy asked the agent to reconnect");
                self.conn.reconnect.notify_one();
                tokio::spawn(async move {
                    let _ = channel.close().await;
                });
            }
            other => {
                tracing::debug!(request = other, "refusing an unknown request from the proxy");
                reply.reject(russh::ChannelOpenFailure::UnknownChannelType).await;
            }
        }
        Ok(())
    }

    async fn server_channel_open_forwarded_tcpip(
        &mut self,
        channel: Channel<Msg>,
        connected_address: &str,
        _connected_port: u32,
        originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let config = &self.shared.config;
        if connected_address == DISCOVERY_CHANNEL && config.ping {
            // A push: the list is in the open message, and the refusal is the receipt (no
            // channel is opened, so none is left behind).
            if let Some(proxy_id) = self.conn.proxy_id.lock().ok().and_then(|p| p.clone()) {
                take_list(originator_address, &self.shared, &self.conn, &proxy_id);
            }
            drop(channel);
            reply.reject(PING_ANSWER).await;
            return Ok(());
        }
        let with_status = connected_address == OPEN_DIAL_STATUS_CHANNEL && config.dial_status;
        if config.open_dial && (connected_address == OPEN_DIAL_CHANNEL || with_status) {
            // The request is in the open message: dial the target first (on a task of its
            // own: this handler runs on the tunnel's session loop), then confirm or refuse.
            // With the status line the channel is confirmed either way and its first line says
            // how the dial went: a refusal's reason reaches the proxy, which an open failure's
            // description does not.
            let req = DialRequest::decode(originator_address);
            let draining = self.conn.draining.load(Ordering::SeqCst);
            let service = self.shared.service.clone();
            self.spawn_counted(async move {
                match dial_target(req.map_err(|e| e.to_string()), service, draining).await {
                    Ok(mut io) => {
                        reply.accept().await;
                        if with_status
                            && channel
                                .data_bytes(Bytes::from(dial_status_line(Ok(()))))
                                .await
                                .is_err()
                        {
                            return;
                        }
                        // The channel's data moves as `Bytes`, without the copies of its
                        // `AsyncRead`/`AsyncWrite`.
                        let mut stream = channel.into_stream();
                        let _ = crate::io::relay::relay(&mut io, &mut stream).await;
                    }
                    Err((failure, text)) if with_status => {
                        tracing::info!(error = %text, "refusing a dial request");
                        reply.accept().await;
                        let status = Bytes::from(dial_status_line(Err((failure, &text))));
                        let _ = channel.data_bytes(status).await;
                        let _ = channel.eof().await;
                        let _ = channel.close().await;
                    }
                    Err((failure, text)) => {
                        tracing::info!(error = %text, "refusing a dial request");
                        reply
                            .reject(russh::ChannelOpenFailure::Other {
                                code: failure.code(),
                                reason: text,
                            })
                            .await;
                    }
                }
            });
            return Ok(());
        }
        if connected_address != TRANSPORT_CHANNEL {
            reply
                .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        reply.accept().await;
        let draining = self.conn.draining.load(Ordering::SeqCst);
        let service = self.shared.service.clone();
        self.spawn_counted(serve_transport(channel, service, draining));
        Ok(())
    }

    async fn disconnected(&mut self, reason: DisconnectReason<Self::Error>) -> Result<(), Self::Error> {
        match reason {
            DisconnectReason::ReceivedDisconnect(info) => {
                tracing::error!(reason = %info.message, "the proxy closed the reverse tunnel");
                if !info.message.is_empty()
                    && let Ok(mut r) = self.conn.disconnect_reason.lock()
                {
                    *r = Some(info.message);
                }
                Ok(())
            }
            DisconnectReason::Error(e) => Err(e),
        }
    }
}

/// One transport channel: read the dial request, ask the service, answer, pipe.
async fn serve_transport(channel: Channel<Msg>, service: DialService, draining: bool) {
    serve_dial_stream(channel.into_stream(), service, draining).await;
}

/// One dial stream (a tunnel's transport channel, or a connection on a directly joined
/// agent's listener): read the dial request line, ask the service, answer `ok` or the error
/// on one line, then pipe bytes.
pub(crate) async fn serve_dial_stream<S>(mut stream: S, service: DialService, draining: bool)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let req = match read_line(&mut stream, MAX_DIAL_REQUEST).await {
        Ok(Some(line)) => DialRequest::decode(&line).map_err(|e| e.to_string()),
        Ok(None) => return,
        Err(e) => Err(format!("reading the dial request: {e}")),
    };
    let outcome = dial_target(req, service, draining)
        .await
        .map_err(|(_, text)| text);
    match outcome {
        Ok(mut io) => {
            if stream.write_all(format!("{DIAL_OK}\n").as_bytes()).await.is_err() {
                return;
            }
            let _ = copy_bidirectional_with_sizes(&mut stream, &mut io, 64 * 1024, 64 * 1024).await;
        }
        Err(text) => {
            tracing::info!(error = %text, "refusing a dial request");
            let line = format!("{}\n", sanitize_dial_reason(&text));
            let _ = stream.write_all(line.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }
}

/// Asks the service for the stream a decoded dial request names; on failure, what kind and the
/// text to answer with.
async fn dial_target(
    req: Result<DialRequest, String>,
    service: DialService,
    draining: bool,
) -> Result<BoxIo, (DialFailure, String)> {
    match req {
        Err(e) => Err((DialFailure::Refused, e)),
        Ok(_) if draining => Err((DialFailure::Draining, DRAINING.to_owned())),
        Ok(req) => {
            let address = req.address.clone();
            service
                .oneshot(req)
                .await
                .map_err(|e| (DialFailure::ConnectFailed, format!("dialing {address}: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinged() -> Addr {
        Addr::parse("proxy.example.com:443").unwrap()
    }

    fn conn() -> Arc<ConnShared> {
        Arc::new(ConnShared {
            disconnect_reason: Mutex::new(None),
            active: std::sync::atomic::AtomicUsize::new(0),
            idle: Notify::new(),
            draining: AtomicBool::new(false),
            reconnect: Notify::new(),
            proxy_id: Mutex::new(None),
            applied: Mutex::new(0),
            cipher: Mutex::new(None),
        })
    }

    fn only(proxy_id: &str) -> Discovery {
        Discovery {
            proxies: vec![super::super::DiscoveredProxy {
                proxy_id: proxy_id.into(),
                tunnel_addr: format!("{proxy_id}.example.com:3024"),
                tls_routing: false,
            }],
            complete: true,
            hold: None,
        }
    }

    #[test]
    fn a_held_proxy_is_let_go_only_once_a_listed_one_is_held() {
        // Proxy peering: the agent reached proxy a, which tells it to hold b instead.
        let mut pool = Pool::default();
        pool.held.insert("a".into(), conn());
        pool.lists.insert("a".into(), only("b"));
        assert!(
            pool.unlisted().is_empty(),
            "a is the only tunnel: kept until b is up"
        );
        assert_eq!(pool.desired(), 2, "a kept, b wanted");
        assert_eq!(pool.missing(0).unwrap().addr.to_string(), "b.example.com:3024");
        // b is up: a is let go.
        pool.held.insert("b".into(), conn());
        pool.lists.insert("b".into(), only("b"));
        assert_eq!(pool.unlisted(), vec!["a".to_owned()]);
        assert_eq!(pool.desired(), 1);
    }

    #[test]
    fn with_a_hold_list_the_agent_holds_its_share_and_remembers_the_rest() {
        let all = |hold: &str| Discovery {
            proxies: ["a", "b", "c"]
                .iter()
                .map(|id| super::super::DiscoveredProxy {
                    proxy_id: (*id).into(),
                    tunnel_addr: format!("{id}.example.com:3024"),
                    tls_routing: false,
                })
                .collect(),
            complete: true,
            hold: Some(vec![hold.into()]),
        };
        let mut pool = Pool::default();
        pool.held.insert("b".into(), conn());
        pool.lists.insert("b".into(), all("b"));
        pool.remembered = all("b")
            .proxies
            .into_iter()
            .map(|p| (p.proxy_id.clone(), p))
            .collect();
        assert_eq!(pool.desired(), 1, "only b is held");
        assert!(pool.missing(0).is_none() && pool.unlisted().is_empty());
        // b's tunnel is lost: the agent turns to the other proxies it heard of.
        pool.held.clear();
        pool.lists.clear();
        let targets: BTreeSet<String> = (0..3)
            .filter_map(|t| pool.missing(t))
            .map(|t| t.addr.to_string())
            .collect();
        let expected: BTreeSet<String> = ["a", "b", "c"]
            .iter()
            .map(|id| format!("{id}.example.com:3024"))
            .collect();
        assert_eq!(targets, expected);
    }

    #[test]
    fn tls_routing_dials_the_public_web_address() {
        let ping = serde_json::json!({"proxy": {"tls_routing_enabled": true,
            "ssh": {"public_addr": "proxy.example.com:443", "ssh_tunnel_public_addr": "proxy.example.com:3024"}}});
        let (addr, tls) = tunnel_addr_from_ping(&ping, &pinged()).unwrap();
        assert_eq!((addr.to_string().as_str(), tls), ("proxy.example.com:443", true));
    }

    #[test]
    fn separate_ports_dial_the_tunnel_address() {
        let ping = serde_json::json!({"proxy": {"tls_routing_enabled": false,
            "ssh": {"public_addr": "proxy.example.com:3080", "ssh_tunnel_public_addr": "tun.example.com:3024",
                    "tunnel_listen_addr": "0.0.0.0:3024"}}});
        let (addr, tls) = tunnel_addr_from_ping(&ping, &pinged()).unwrap();
        assert_eq!((addr.to_string().as_str(), tls), ("tun.example.com:3024", false));
        let ping = serde_json::json!({"proxy": {"ssh": {"tunnel_listen_addr": "0.0.0.0:4024"}}});
        let (addr, _) = tunnel_addr_from_ping(&ping, &pinged()).unwrap();
        assert_eq!(
            addr.to_string(),
            "proxy.example.com:4024",
            "an unspecified host means the pinged host"
        );
        let err = tunnel_addr_from_ping(&serde_json::json!({}), &pinged()).unwrap_err();
        assert!(err.to_string().contains("no tunnel address"), "{err}");
    }
}

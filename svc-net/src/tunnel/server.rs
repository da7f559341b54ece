//! The proxy side of the reverse tunnel: [`TunnelServer`] accepts agents' tunnels (plain SSH
//! on the tunnel listener, or SSH inside TLS with ALPN `svc-reversetunnel` on the web port),
//! verifies them and registers them; [`TunnelDialer`] opens a transport channel on a
//! registered tunnel for each client connection.

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Weak},
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use futures_util::future::BoxFuture;
use russh::{
    Channel,
    keys::{Certificate, PrivateKey},
    server::{Auth, ChannelOpenHandle, Msg, Session},
};
use svc_core::{
    Version,
    identity::{HostIdentity, Verifier},
    version::Compatibility,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf},
    sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch},
    time::Instant,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::{BoxError, Service};

use super::{
    CAP_DIAL_STATUS, CAP_DISCOVERY_PUSH, CAP_OPEN_DIAL, CAPABILITIES_REQUEST, DIAL_OK, DISCOVERY_CHANNEL,
    DialFailure, DialRequest, DirectDialer, Discovery, HEARTBEAT_CHANNEL, MAX_DIAL_REQUEST,
    OPEN_DIAL_CHANNEL, OPEN_DIAL_STATUS_CHANNEL, PING_CHANNEL, PeerDialer, RECONNECT_REQUEST,
    TRANSPORT_CHANNEL, Tunables, TunnelError, TunnelStrategy, VERSION_REQUEST, agent_proxies,
    read_dial_status, read_line,
    registry::{AgentInfo, AgentRegistry, ConnState, LiveGuard},
    sanitize_dial_reason,
};
use crate::io::{BoxIo, ConnFuture, ConnService, Connection, Io, conn_service};

/// What the proxy needs to accept tunnels.
#[non_exhaustive]
pub struct TunnelServerConfig {
    /// The cluster's version: agents are checked against it.
    pub cluster_version: Version,
    /// The proxy's SSH host key and its host-CA-signed certificate (role `proxy`).
    pub host_key: PrivateKey,
    /// The certificate for `host_key`.
    pub host_cert: Certificate,
    /// Verifies agents' host certificates (trusts the cluster's host CA).
    pub verifier: Arc<Verifier>,
    /// The web port's TLS configuration, for tunnels arriving with ALPN `svc-reversetunnel`
    /// (`ServerIdentity::server_config(&[alpn::REVERSE_TUNNEL])`). Without it only plain-SSH
    /// tunnels are served.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Window, packet and keep-alive settings.
    pub tunables: Tunables,
    /// How long a tunnel may stay open after the proxy began shutting down: the agent is asked
    /// to reconnect elsewhere at once and closes the tunnel when its sessions are done; past
    /// this bound the proxy closes it.
    pub drain_timeout: Duration,
    /// How many tunnels may be in their handshake at once (TLS, SSH, the certificate check
    /// and the version query, until the tunnel is registered); the others wait for a place
    /// for up to half the handshake deadline ([`Tunables::handshake_timeout`], which runs from
    /// the moment the connection reached the tunnel server and covers the wait), then are
    /// closed and dial again after their backoff. So a reconnect storm is served a bounded batch
    /// at a time instead of every handshake at once, and a peer that never finishes holds a
    /// place for one deadline at most. One source address (an IPv6 address's `/64`) holds or
    /// queues for at most half the places, its further handshakes waiting behind its own, so
    /// peers from one address that never finish cannot keep agents from elsewhere out.
    /// Default [`default_max_handshakes`].
    pub max_handshakes: usize,
    /// Answer agents' pings ([`super::PING_CHANNEL`]) and push lists of proxies to the agents
    /// that take them (on by default). Off, pings are refused as by proxies that predate them,
    /// and agents keep their heartbeat and discovery channels open: for tests of mixed
    /// versions.
    pub answer_pings: bool,
}

/// The default of [`TunnelServerConfig::drain_timeout`].
pub const DEFAULT_TUNNEL_DRAIN: Duration = Duration::from_secs(30);

/// Concurrent tunnel handshakes per CPU by default ([`default_max_handshakes`]): a handshake
/// is a few milliseconds of CPU spread over several network round trips, so a few dozen per
/// CPU keep the CPUs busy while the round trips are under way.
pub const HANDSHAKES_PER_CPU: usize = 32;

/// The default of [`TunnelServerConfig::max_handshakes`]: [`HANDSHAKES_PER_CPU`] per CPU this
/// process may run on.
pub fn default_max_handshakes() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .saturating_mul(HANDSHAKES_PER_CPU)
}

impl TunnelServerConfig {
    /// A configuration with default tunables and no TLS.
    pub fn new(
        cluster_version: Version,
        host_key: PrivateKey,
        host_cert: Certificate,
        verifier: Arc<Verifier>,
    ) -> Self {
        Self {
            cluster_version,
            host_key,
            host_cert,
            verifier,
            tls: None,
            tunables: Tunables::default(),
            drain_timeout: DEFAULT_TUNNEL_DRAIN,
            max_handshakes: default_max_handshakes(),
            answer_pings: true,
        }
    }

    /// Replaces [`TunnelServerConfig::answer_pings`].
    pub fn with_answer_pings(mut self, on: bool) -> Self {
        self.answer_pings = on;
        self
    }

    /// Replaces [`TunnelServerConfig::max_handshakes`] (at least 1).
    pub fn with_max_handshakes(mut self, max: usize) -> Self {
        self.max_handshakes = max.max(1);
        self
    }

    /// Replaces [`TunnelServerConfig::drain_timeout`].
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Serves the TLS path with `tls`.
    pub fn with_tls(mut self, tls: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Replaces the tunables.
    pub fn with_tunables(mut self, tunables: Tunables) -> Self {
        self.tunables = tunables;
        self
    }
}

struct Inner {
    /// Replaced when the proxy's host certificates are renewed ([`TunnelServer::set_host_key`]).
    ssh: std::sync::RwLock<SshConfigs>,
    verifier: Arc<Verifier>,
    cluster_version: Version,
    tls: Option<TlsAcceptor>,
    tunables: Tunables,
    drain_timeout: Duration,
    /// [`TunnelServerConfig::answer_pings`].
    answer_pings: bool,
    /// Places for tunnels in their handshake ([`TunnelServerConfig::max_handshakes`]).
    handshakes: Arc<Semaphore>,
    /// The places each source address holds or waits for, and the most one may.
    handshakes_by_source: Arc<SourceCounts>,
    registry: AgentRegistry,
    announce: watch::Sender<Announce>,
    peers: Arc<std::sync::RwLock<Option<PeerDialer>>>,
}

/// The tunnel's SSH server configurations: one for plain TCP (the tunnel port), one for
/// sessions inside TLS (the single port's ALPN route), which also accepts the `none` cipher
/// ([`crate::ssh::server_config_inside_tls`]).
struct SshConfigs {
    plain: Arc<russh::server::Config>,
    inside_tls: Arc<russh::server::Config>,
}

impl SshConfigs {
    fn new(tunables: &Tunables, host_key: PrivateKey, host_cert: Certificate) -> Self {
        Self {
            plain: Arc::new(crate::ssh::server_config(
                tunables,
                host_key.clone(),
                Some(host_cert.clone()),
            )),
            inside_tls: Arc::new(crate::ssh::server_config_inside_tls(
                tunables,
                host_key,
                Some(host_cert),
            )),
        }
    }
}

/// What the discovery channel tells agents: the cluster's proxies, and how many of them each
/// agent should hold.
#[derive(Clone, Debug, Default)]
struct Announce {
    discovery: Discovery,
    strategy: TunnelStrategy,
    /// Counts the changes: pushed with each list ([`super::GenerationalDiscovery`]).
    generation: u64,
}

impl Announce {
    /// The list for the agent `agent_id`: every proxy, and with proxy peering and a complete
    /// list, the agent's [`agent_proxies`] as the ones to hold (the agent lets go of any other
    /// proxy it reached, and turns to the others when those are out of reach).
    fn for_agent(&self, agent_id: &str) -> Discovery {
        match self.strategy.agent_connection_count() {
            Some(count) if self.discovery.complete && !self.discovery.proxies.is_empty() => Discovery {
                proxies: self.discovery.proxies.clone(),
                complete: true,
                hold: Some(
                    agent_proxies(agent_id, &self.discovery.proxies, count)
                        .into_iter()
                        .map(|p| p.proxy_id)
                        .collect(),
                ),
            },
            _ => self.discovery.clone(),
        }
    }
}

/// Accepts and registers agents' tunnels. Cheap to clone.
#[derive(Clone)]
pub struct TunnelServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TunnelServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelServer")
            .field("registry", &self.inner.registry)
            .finish_non_exhaustive()
    }
}

impl TunnelServer {
    /// Builds the server and starts its offline sweeper (a task that ends with the server).
    /// Must be called inside a tokio runtime.
    pub fn new(config: TunnelServerConfig) -> Self {
        let ssh = SshConfigs::new(&config.tunables, config.host_key, config.host_cert);
        let inner = Arc::new(Inner {
            ssh: std::sync::RwLock::new(ssh),
            verifier: config.verifier,
            cluster_version: config.cluster_version,
            tls: config.tls.map(TlsAcceptor::from),
            tunables: config.tunables,
            drain_timeout: config.drain_timeout,
            answer_pings: config.answer_pings,
            handshakes: Arc::new(Semaphore::new(config.max_handshakes.max(1))),
            handshakes_by_source: Arc::new(SourceCounts {
                counts: std::sync::Mutex::default(),
                max: (config.max_handshakes / 2).max(1),
            }),
            registry: AgentRegistry::default(),
            announce: watch::channel(Announce::default()).0,
            peers: Arc::default(),
        });
        tokio::spawn(sweep(Arc::downgrade(&inner)));
        tokio::spawn(push_discovery_changes(
            Arc::downgrade(&inner),
            inner.announce.subscribe(),
        ));
        Self { inner }
    }

    /// Presents `host_key` and its certificate `host_cert` to agents from now on (the proxy's
    /// renewed host certificates); tunnels already up keep the session they have.
    pub fn set_host_key(&self, host_key: PrivateKey, host_cert: Certificate) {
        let ssh = SshConfigs::new(&self.inner.tunables, host_key, host_cert);
        *self
            .inner
            .ssh
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = ssh;
    }

    /// The registry of connected agents.
    pub fn registry(&self) -> &AgentRegistry {
        &self.inner.registry
    }

    /// A dialer over this server's tunnels.
    pub fn dialer(&self) -> TunnelDialer {
        TunnelDialer {
            registry: self.inner.registry.clone(),
            timeout: self.inner.tunables.handshake_timeout,
            direct: None,
            attach_wait: DEFAULT_ATTACH_WAIT,
            peers: self.inner.peers.clone(),
        }
    }

    /// Announces the cluster's proxies to every agent (pushed to agents that ping, on the
    /// discovery channel to the others).
    pub fn set_proxies(&self, discovery: Discovery) {
        // Every call reaches the agents' discovery channels (a periodic announcement resends
        // the list); agents that ping are pushed a list only when it changed, and again after
        // each of their pings.
        self.inner.announce.send_modify(|a| {
            if a.discovery != discovery {
                a.discovery = discovery;
                a.generation += 1;
            }
        });
    }

    /// How many of the announced proxies each agent is told to hold (the cluster's
    /// `tunnel_strategy`): all of them, or with proxy peering its
    /// [`agent_proxies`]. Agents hear the change at once.
    pub fn set_strategy(&self, strategy: TunnelStrategy) {
        self.inner.announce.send_if_modified(|a| {
            let changed = a.strategy != strategy;
            a.strategy = strategy;
            if changed {
                a.generation += 1;
            }
            changed
        });
    }

    /// The strategy agents are told to follow.
    pub fn strategy(&self) -> TunnelStrategy {
        self.inner.announce.borrow().strategy
    }

    /// Dials agents without a tunnel here through `peers` (proxy peering), from every dialer of
    /// this server, including those made before.
    pub fn set_peer_dialer(&self, peers: PeerDialer) {
        *self
            .inner
            .peers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(peers);
    }

    /// The peer dialer, if one was set.
    pub fn peer_dialer(&self) -> Option<PeerDialer> {
        self.inner
            .peers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Asks every agent's every tunnel to drain and reconnect (elsewhere, when this proxy is
    /// going away); returns how many were asked.
    pub async fn request_reconnect_all(&self) -> usize {
        let mut asked = 0;
        let hosts: std::collections::BTreeSet<String> = self
            .inner
            .registry
            .list()
            .into_iter()
            .map(|a| a.host_id)
            .collect();
        for host_id in hosts {
            asked += self.request_reconnect(&host_id).await;
        }
        asked
    }

    /// Asks every tunnel of `host_id` to drain and reconnect; returns how many were asked.
    pub async fn request_reconnect(&self, host_id: &str) -> usize {
        let mut asked = 0;
        for handle in self.inner.registry.handles(host_id) {
            if let Ok(ch) = handle.channel_open_forwarded_streamlocal(RECONNECT_REQUEST).await {
                let _ = ch.close().await;
                asked += 1;
            }
        }
        asked
    }

    /// The handler for the plain-SSH tunnel listener (`ProxyBuilder::tunnel`, port 3024).
    pub fn plain_service(&self) -> ConnService {
        let server = self.clone();
        conn_service(tower::service_fn(move |mut conn: Connection| {
            let server = server.clone();
            ConnFuture::new(async move {
                conn.classified();
                let peer = conn.peer_addr;
                let Some(slot) = server.handshake_slot(peer).await else {
                    return Ok(());
                };
                if let Err(e) = server
                    .serve_in_slot(conn.io, peer, conn.shutdown.clone(), slot)
                    .await
                {
                    tracing::info!(%peer, error = %e, "agent tunnel ended with an error");
                }
                Ok(())
            })
        }))
    }

    /// The handler for ALPN `svc-reversetunnel` (`ProxyBuilder::route`): terminates TLS, then
    /// serves SSH inside it. Without a TLS configuration every such connection is refused.
    pub fn tls_service(&self) -> ConnService {
        conn_service(TlsService(self.clone()))
    }

    /// Serves one tunnel on an established byte stream until it closes, or until `shutdown`
    /// is cancelled: then the agent is told the proxy is going away and dials again (to this
    /// proxy once it is back, or to another).
    ///
    /// The handshake takes one of the server's places ([`TunnelServerConfig::max_handshakes`])
    /// until the tunnel is registered; without one within the handshake deadline the stream
    /// is closed.
    pub async fn serve_stream<S: Io>(
        &self,
        io: S,
        peer: SocketAddr,
        shutdown: CancellationToken,
    ) -> Result<(), TunnelError> {
        let Some(slot) = self.handshake_slot(peer).await else {
            return Err(TunnelError::Timeout {
                what: "waiting for a place among the tunnel handshakes under way",
                after: self.inner.tunables.handshake_timeout,
            });
        };
        self.serve_in_slot(io, peer, shutdown, slot).await
    }

    /// A place among the handshakes under way, and the handshake's deadline
    /// ([`Tunables::handshake_timeout`] from now, the wait for the place included); `None`
    /// (logged) when no place came free within half of it: a handshake that gets a place
    /// always has at least half its deadline left to finish in, so a place is never spent on
    /// a handshake that cannot finish (nor turned over in a rush of peers at their deadline).
    async fn handshake_slot(&self, peer: SocketAddr) -> Option<HandshakeSlot> {
        let after = self.inner.tunables.handshake_timeout;
        let arrived = Instant::now();
        let deadline = arrived + after;
        // First the source's share, then a place: a source's handshakes beyond its share wait
        // behind its own, never in the queue for the places, so other sources always find
        // at least half of them.
        let source = SourceCounts::enter(&self.inner.handshakes_by_source, peer);
        let share = source.share.clone();
        let places = self.inner.handshakes.clone();
        let acquire = async move {
            let share = share.acquire_owned().await?;
            let place = places.acquire_owned().await?;
            Ok::<_, tokio::sync::AcquireError>((share, place))
        };
        match tokio::time::timeout_at(arrived + after / 2, acquire).await {
            Ok(Ok((share, place))) => Some(HandshakeSlot {
                _place: place,
                _share: share,
                _source: source,
                deadline,
            }),
            Ok(Err(_closed)) => None,
            Err(_) => {
                tracing::info!(%peer, waited = ?(after / 2), "agent tunnel closed: no place among the tunnel handshakes under way came free within half the handshake deadline");
                None
            }
        }
    }

    /// [`TunnelServer::serve_stream`] once the handshake holds its place; the place is given
    /// back when the tunnel is registered (or the handshake fails).
    async fn serve_in_slot<S: Io>(
        &self,
        io: S,
        peer: SocketAddr,
        shutdown: CancellationToken,
        slot: HandshakeSlot,
    ) -> Result<(), TunnelError> {
        // Boxed: see [`Registered`].
        match Box::pin(self.handshake(io, peer, slot, Transport::Plain)).await? {
            Some(registered) => self.serve_registered(registered, shutdown).await,
            None => Ok(()),
        }
    }

    /// The tunnel's handshake on `io` — SSH, the agent's certificate, its version and
    /// capabilities — then its registration (which gives the place back); `None` when the
    /// agent went away or was refused (logged).
    async fn handshake<S: Io>(
        &self,
        io: S,
        peer: SocketAddr,
        slot: HandshakeSlot,
        transport: Transport,
    ) -> Result<Option<Registered>, TunnelError> {
        let inner = &self.inner;
        let state = ConnState::new();
        let (auth_tx, auth_rx) = oneshot::channel();
        let handler = TunnelHandler {
            inner: self.inner.clone(),
            state: state.clone(),
            auth: Some(auth_tx),
            peer,
            agent_id: String::new(),
        };
        let after = inner.tunables.handshake_timeout;
        // The SSH authentication's own bound, within what is left of the handshake's.
        let auth_after = inner
            .tunables
            .auth_timeout
            .min(slot.deadline.saturating_duration_since(Instant::now()));
        let ssh = {
            let configs = inner
                .ssh
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match transport {
                Transport::Plain => configs.plain.clone(),
                Transport::InsideTls => configs.inside_tls.clone(),
            }
        };
        let started = crate::ssh::authenticate_before(ssh, io, handler, auth_rx, auth_after).await;
        let (session, host) = match started {
            Ok(Some(started)) => started,
            Ok(None) => return Ok(None),
            Err(crate::ssh::StartError::Deadline { after }) => {
                return Err(TunnelError::Timeout {
                    what: "the tunnel's SSH handshake and authentication",
                    after,
                });
            }
            Err(crate::ssh::StartError::Session(e)) => return Err(e.into()),
        };
        let handle = session.handle();

        // Query the version right after authentication; refuse incompatible agents with a
        // message the agent logs.
        // The capabilities in the same round trip: agents that predate the query refuse it.
        let queries = async { tokio::join!(query_version(&handle), query_capabilities(&handle)) };
        let (version, capabilities) = match tokio::time::timeout_at(slot.deadline, queries).await {
            Ok((Ok(v), caps)) => (v, caps),
            Ok((Err(e), _)) => {
                let _ = handle
                    .disconnect(
                        russh::Disconnect::ByApplication,
                        format!("version query failed: {e}"),
                        String::new(),
                    )
                    .await;
                return Err(e);
            }
            Err(_) => {
                return Err(TunnelError::Timeout {
                    what: "the agent's version query",
                    after,
                });
            }
        };
        if let Some(msg) = incompatibility(&version, &inner.cluster_version) {
            tracing::warn!(host_id = %host.host_id, agent_version = %version, cluster_version = %inner.cluster_version, "refusing the agent's tunnel: {msg}");
            let _ = handle
                .disconnect(russh::Disconnect::ByApplication, msg, String::new())
                .await;
            let _ = session.await;
            return Ok(None);
        }

        let open_dial = capabilities.iter().any(|c| c == CAP_OPEN_DIAL);
        state
            .open_dial
            .store(open_dial, std::sync::atomic::Ordering::SeqCst);
        let dial_status = open_dial && capabilities.iter().any(|c| c == CAP_DIAL_STATUS);
        state
            .dial_status
            .store(dial_status, std::sync::atomic::Ordering::SeqCst);
        let discovery_push = inner.answer_pings && capabilities.iter().any(|c| c == CAP_DISCOVERY_PUSH);
        state
            .discovery_push
            .store(discovery_push, std::sync::atomic::Ordering::SeqCst);
        let info = AgentInfo {
            open_dial,
            host_id: host.host_id.clone(),
            node_name: host.node_name.clone(),
            version,
            remote_addr: peer,
            connected_at: SystemTime::now(),
            online: true,
            live_sessions: 0,
        };
        state.heartbeat();
        let handle_for_shutdown = handle.clone();
        let pushes = state.clone();
        let id = inner.registry.insert(info, handle, state);
        drop(slot);
        // The list of proxies, now that the agent is known to take pushes (each of its pings
        // brings another, and every change one).
        if discovery_push {
            push_discovery(inner, &host.host_id, handle_for_shutdown.clone(), &pushes);
        }
        tracing::info!(host_id = %host.host_id, node = %host.node_name, %peer, "agent tunnel registered");
        Ok(Some(Registered {
            session,
            handle: handle_for_shutdown,
            host_id: host.host_id,
            node_name: host.node_name,
            id,
        }))
    }

    /// Serves a registered tunnel until it closes or `shutdown` is cancelled (then drains it),
    /// and takes it out of the registry.
    async fn serve_registered(
        &self,
        registered: Registered,
        shutdown: CancellationToken,
    ) -> Result<(), TunnelError> {
        let inner = &self.inner;
        let Registered {
            mut session,
            handle: handle_for_shutdown,
            host_id,
            node_name,
            id,
        } = registered;
        let result = tokio::select! {
            r = &mut session => r,
            _ = shutdown.cancelled() => {
                // Boxed: the drain's futures are larger than the wait above, and inline they
                // would size every idle tunnel's task.
                Box::pin(drain(inner, &mut session, &handle_for_shutdown, &host_id)).await;
                Ok(())
            }
        };
        inner.registry.remove(&host_id, id);
        tracing::info!(host_id = %host_id, node = %node_name, "agent tunnel closed");
        result.map_err(Into::into)
    }
}

/// Drains a registered tunnel as the proxy shuts down: the agent is asked to reconnect
/// (elsewhere: this proxy no longer accepts) and closes the tunnel once its sessions are done;
/// past the drain bound the proxy closes it.
async fn drain(
    inner: &Inner,
    session: &mut russh::server::RunningSession<TunnelHandler>,
    handle: &russh::server::Handle,
    host_id: &str,
) {
    let asked = match handle.channel_open_forwarded_streamlocal(RECONNECT_REQUEST).await {
        Ok(ch) => {
            let _ = ch.close().await;
            true
        }
        Err(_) => false,
    };
    tracing::info!(host_id = %host_id, asked, bound = ?inner.drain_timeout, "proxy shutting down: asked the agent to reconnect elsewhere; draining its tunnel");
    let drained = asked && tokio::time::timeout(inner.drain_timeout, session).await.is_ok();
    if !drained {
        let _ = handle
            .disconnect(
                russh::Disconnect::ByApplication,
                "the proxy is shutting down".into(),
                String::new(),
            )
            .await;
    }
}

/// A tunnel past its handshake, in the registry.
///
/// The handshake runs in a future of its own, boxed, which is freed once the tunnel is
/// registered: the futures of the TLS and SSH handshakes (the TLS stream itself, russh's
/// start-up, the queries) are kilobytes, and awaited inline they would size the connection's
/// task for the tunnel's whole life, while an idle tunnel's task only waits for the session's
/// end or the proxy's shutdown (docs/performance.md, "Memory per idle tunnel").
struct Registered {
    session: russh::server::RunningSession<TunnelHandler>,
    handle: russh::server::Handle,
    host_id: String,
    node_name: String,
    /// The registry entry's ID.
    id: u64,
}

/// Why an agent at `agent` may not join a cluster at `cluster`, if it may not.
fn incompatibility(agent: &Version, cluster: &Version) -> Option<String> {
    match agent.agent_compatibility(cluster) {
        Compatibility::Compatible => None,
        Compatibility::AgentAhead => Some(format!(
            "agent version {agent} is incompatible with cluster version {cluster}: agents must not run a newer major version than the cluster; install the cluster's version"
        )),
        Compatibility::AgentTooOld => Some(format!(
            "agent version {agent} is incompatible with cluster version {cluster}: agents may be at most one major version behind; upgrade the agent"
        )),
        _ => Some(format!(
            "agent version {agent} is incompatible with cluster version {cluster}"
        )),
    }
}

/// What the agent writes on a query channel, up to `max` bytes, once it has closed the channel
/// (it writes, sends EOF and closes): the proxy never closes first, since russh keeps a channel
/// the server closed first in its table for the session's life
/// (docs/upstream/russh-close-first.patch). `None` when the session ends first.
async fn read_until_closed(mut channel: Channel<Msg>, max: usize) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    loop {
        match channel.wait().await? {
            russh::ChannelMsg::Data { data } => {
                let room = max.saturating_sub(buf.len());
                buf.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
            }
            russh::ChannelMsg::Close => return Some(buf),
            _ => {}
        }
    }
}

async fn query_version(handle: &russh::server::Handle) -> Result<Version, TunnelError> {
    let channel = handle.channel_open_forwarded_streamlocal(VERSION_REQUEST).await?;
    let buf = read_until_closed(channel, 256)
        .await
        .ok_or_else(|| TunnelError::Io {
            what: "reading the agent's version",
            source: std::io::ErrorKind::UnexpectedEof.into(),
        })?;
    let text = String::from_utf8_lossy(&buf);
    text.trim()
        .parse()
        .map_err(|e: svc_core::version::VersionError| TunnelError::Malformed {
            what: "agent version",
            reason: e.to_string(),
        })
}

/// The agent's capabilities (words); none from agents that refuse the query (those that
/// predate it) or answer it badly.
async fn query_capabilities(handle: &russh::server::Handle) -> Vec<String> {
    let Ok(channel) = handle
        .channel_open_forwarded_streamlocal(CAPABILITIES_REQUEST)
        .await
    else {
        return Vec::new();
    };
    let Some(buf) = read_until_closed(channel, 1024).await else {
        return Vec::new();
    };
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The list of proxies for `agent_id` as a push carries it (JSON), and its generation.
fn discovery_json(announce: &watch::Sender<Announce>, agent_id: &str) -> Option<(String, u64)> {
    let announce = announce.borrow();
    let msg = super::GenerationalDiscovery {
        discovery: announce.for_agent(agent_id),
        generation: announce.generation,
    };
    Some((serde_json::to_string(&msg).ok()?, msg.generation))
}

/// Pushes the current list of proxies to the agent `agent_id` (which named
/// [`CAP_DISCOVERY_PUSH`]), on a task of its own: a channel open that carries the list and
/// that the agent refuses once it has taken it (no channel is opened, so none is left behind).
fn push_discovery(inner: &Inner, agent_id: &str, handle: russh::server::Handle, state: &ConnState) {
    let Some((json, generation)) = discovery_json(&inner.announce, agent_id) else {
        return;
    };
    state
        .sent_generation
        .store(generation, std::sync::atomic::Ordering::SeqCst);
    let after = inner.tunables.handshake_timeout;
    let agent_id = agent_id.to_owned();
    tokio::spawn(async move {
        let push = handle.channel_open_forwarded_tcpip(DISCOVERY_CHANNEL, 0, json, 0);
        match tokio::time::timeout(after, push).await {
            // The agent's refusal is its receipt.
            Ok(Err(russh::Error::ChannelOpenFailure(_))) => {}
            // Not what an agent does; closed.
            Ok(Ok(channel)) => {
                let _ = channel.close().await;
            }
            Ok(Err(e)) => tracing::debug!(%agent_id, error = %e, "pushing the list of proxies failed"),
            Err(_) => tracing::debug!(%agent_id, ?after, "pushing the list of proxies timed out"),
        }
    });
}

/// Pushes every change of the list of proxies (or of the strategy) to the registered agents
/// that take pushes and were not sent it yet, until the server is dropped.
async fn push_discovery_changes(inner: Weak<Inner>, mut changes: watch::Receiver<Announce>) {
    while changes.changed().await.is_ok() {
        let Some(inner) = inner.upgrade() else { return };
        let generation = inner.announce.borrow().generation;
        for (host_id, handle, state) in inner.registry.discovery_subscribers() {
            if state.sent_generation.load(std::sync::atomic::Ordering::SeqCst) != generation {
                push_discovery(&inner, &host_id, handle, &state);
            }
        }
    }
}

/// Marks silent agents offline and closes their idle tunnels, until the server is dropped.
async fn sweep(inner: Weak<Inner>) {
    let period = match inner.upgrade() {
        Some(i) => {
            (i.tunables.keepalive_interval / 2).clamp(Duration::from_millis(50), Duration::from_secs(5))
        }
        None => return,
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let stale = inner
            .registry
            .sweep(tokio::time::Instant::now(), inner.tunables.offline_after());
        for (host_id, handle) in stale {
            tracing::info!(%host_id, "closing a silent agent tunnel that carries no sessions");
            let _ = handle
                .disconnect(
                    russh::Disconnect::ByApplication,
                    "no heartbeat from the agent".into(),
                    String::new(),
                )
                .await;
        }
    }
}

/// A place among the tunnel handshakes under way (given back when dropped), and the
/// handshake's deadline.
struct HandshakeSlot {
    _place: OwnedSemaphorePermit,
    _share: OwnedSemaphorePermit,
    _source: SourceSlot,
    deadline: Instant,
}

/// Each source address's share of the handshake places: a semaphore of `max` permits per
/// source, kept while a handshake from it holds or waits for one.
struct SourceCounts {
    counts: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, SourceEntry>>,
    max: usize,
}

struct SourceEntry {
    /// Handshakes from the source that hold or wait for a permit of `share`.
    users: usize,
    share: Arc<Semaphore>,
}

impl SourceCounts {
    /// Counts one more handshake from `peer`'s source and hands out the source's share.
    fn enter(this: &Arc<SourceCounts>, peer: SocketAddr) -> SourceSlot {
        let source = crate::listen::client_source(peer.ip());
        let mut counts = this
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = counts.entry(source).or_insert_with(|| SourceEntry {
            users: 0,
            share: Arc::new(Semaphore::new(this.max)),
        });
        entry.users += 1;
        SourceSlot {
            counts: this.clone(),
            source,
            share: entry.share.clone(),
        }
    }
}

/// One handshake counted against its source address (uncounted when dropped; the source is
/// forgotten with its last handshake).
struct SourceSlot {
    counts: Arc<SourceCounts>,
    source: std::net::IpAddr,
    share: Arc<Semaphore>,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut counts = self
            .counts
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = counts.get_mut(&self.source) {
            entry.users = entry.users.saturating_sub(1);
            if entry.users == 0 {
                counts.remove(&self.source);
            }
        }
    }
}

struct TunnelHandler {
    inner: Arc<Inner>,
    state: Arc<ConnState>,
    auth: Option<oneshot::Sender<HostIdentity>>,
    peer: SocketAddr,
    /// The agent's host ID once authenticated.
    agent_id: String,
}

impl russh::server::Handler for TunnelHandler {
    type Error = russh::Error;

    async fn auth_openssh_certificate(
        &mut self,
        user: &str,
        certificate: &Certificate,
    ) -> Result<Auth, Self::Error> {
        match self
            .inner
            .verifier
            .verify_host_ssh(certificate, SystemTime::now(), None)
        {
            Ok(host) if host.host_id == user => {
                self.agent_id = host.host_id.clone();
                if let Some(tx) = self.auth.take() {
                    let _ = tx.send(host);
                }
                Ok(Auth::Accept)
            }
            Ok(host) => {
                tracing::warn!(peer = %self.peer, user, cert_host_id = %host.host_id, "tunnel refused: the SSH user is not the certificate's host ID");
                Ok(Auth::reject())
            }
            Err(e) => {
                tracing::warn!(peer = %self.peer, user, error = %e, "tunnel refused: bad agent certificate");
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_direct_streamlocal(
        &mut self,
        channel: Channel<Msg>,
        socket_path: &str,
        reply: ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match socket_path {
            PING_CHANNEL if self.inner.answer_pings => {
                // A heartbeat, answered by refusing the channel (nothing stays open), then the
                // list of proxies pushed to agents that take pushes.
                self.state.heartbeat();
                drop(channel);
                reply.reject(super::PING_ANSWER).await;
                if self
                    .state
                    .discovery_push
                    .load(std::sync::atomic::Ordering::SeqCst)
                {
                    push_discovery(&self.inner, &self.agent_id, session.handle(), &self.state);
                }
            }
            HEARTBEAT_CHANNEL => {
                reply.accept().await;
                let state = self.state.clone();
                tokio::spawn(async move {
                    let mut stream = channel.into_stream();
                    while let Ok(Some(_ping)) = read_line(&mut stream, 256).await {
                        state.heartbeat();
                    }
                });
            }
            DISCOVERY_CHANNEL => {
                reply.accept().await;
                let mut rx = self.inner.announce.subscribe();
                let agent_id = self.agent_id.clone();
                tokio::spawn(async move {
                    let mut stream = channel.into_stream();
                    loop {
                        let msg = rx.borrow_and_update().for_agent(&agent_id);
                        let Ok(mut line) = serde_json::to_vec(&msg) else {
                            return;
                        };
                        line.push(b'\n');
                        if stream.write_all(&line).await.is_err() || stream.flush().await.is_err() {
                            return;
                        }
                        if rx.changed().await.is_err() {
                            return;
                        }
                    }
                });
            }
            other => {
                tracing::debug!(peer = %self.peer, channel = other, "refusing an unknown tunnel channel");
                reply.reject(russh::ChannelOpenFailure::UnknownChannelType).await;
            }
        }
        Ok(())
    }
}

/// What carries a tunnel's SSH session to the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// Plain TCP (the tunnel port, [`TunnelServer::serve_stream`]): SSH encrypts.
    Plain,
    /// The proxy's TLS (ALPN `svc-reversetunnel`): the agent may ask for the `none` cipher.
    InsideTls,
}

/// SSH inside TLS (ALPN `svc-reversetunnel`). Not [`TlsTerminate`](crate::tls::TlsTerminate):
/// the TLS layer reads through a 64 KiB buffer while bytes flow ([`super::TLS_READ_BUFFER`]), which bulk
/// transfers through the tunnel need, and the handshake deadline is the tunnel's own.
#[derive(Clone)]
struct TlsService(TunnelServer);

impl Service<Connection> for TlsService {
    type Response = ();
    type Error = BoxError;
    type Future = ConnFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut conn: Connection) -> Self::Future {
        let server = self.0.clone();
        ConnFuture::new(async move {
            conn.classified();
            let peer = conn.peer_addr;
            let Some(acceptor) = server.inner.tls.clone() else {
                tracing::warn!(%peer, "a TLS reverse tunnel arrived but the tunnel server has no TLS configuration; closing");
                return Ok(());
            };
            // The TLS handshake is part of the tunnel's handshake: it waits for a place, and
            // the place's deadline bounds it.
            let Some(slot) = server.handshake_slot(peer).await else {
                return Ok(());
            };
            // The bytes the router peeked (the ClientHello) are replayed from the read buffer,
            // which lets go of them once read: the router's replay buffer would keep them for
            // the tunnel's life.
            let (peeked, tcp) = conn.io.into_parts();
            let io = super::readbuf::IdleReadBuffer::with_prefix(super::TLS_READ_BUFFER, peeked, tcp);
            // TLS and the tunnel's handshake in one boxed future, freed at registration: the
            // TLS stream moves into the SSH session and this task keeps only what an idle
            // tunnel needs ([`Registered`]).
            let handshake = Box::pin(async {
                let tls = match crate::tls::accept_before(&acceptor, io, slot.deadline).await {
                    Ok(tls) => tls,
                    Err(e) => {
                        tracing::info!(%peer, error = %e, "TLS handshake of an agent tunnel failed");
                        return Ok(None);
                    }
                };
                // Boxed for russh: its session future keeps its stream argument inline (the
                // TLS session is over a kilobyte) besides the copy it reads from.
                let io = Box::new(super::readbuf::IdleTls::new(tls)) as BoxIo;
                server.handshake(io, peer, slot, Transport::InsideTls).await
            });
            let served = match handshake.await {
                Ok(Some(registered)) => server.serve_registered(registered, conn.shutdown.clone()).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = served {
                tracing::info!(%peer, error = %e, "agent tunnel ended with an error");
            }
            Ok(())
        })
    }
}

/// Opens a stream to an agent's resource over its tunnel: `DialRequest` → [`TunnelStream`].
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct TunnelDialer {
    registry: AgentRegistry,
    timeout: Duration,
    direct: Option<DirectDialer>,
    attach_wait: Duration,
    peers: Arc<std::sync::RwLock<Option<PeerDialer>>>,
}

/// How long a dial to an agent without a tunnel here waits for one to appear (see
/// [`TunnelDialer::with_attach_wait`]).
pub const DEFAULT_ATTACH_WAIT: Duration = Duration::from_secs(5);

impl TunnelDialer {
    /// The registry it dials through.
    pub fn registry(&self) -> &AgentRegistry {
        &self.registry
    }

    /// The host ID of `server` once it has a tunnel here, waiting at most the attach wait.
    async fn attached(&self, server: &str) -> Option<String> {
        if self.attach_wait.is_zero() {
            return None;
        }
        let appeared = self.registry.wait_for(server, |agent| agent.is_some());
        tokio::time::timeout(self.attach_wait, appeared).await.ok()?;
        tracing::debug!(%server, "the agent attached while a dial waited for it");
        self.registry.resolve(server)
    }

    /// How long a dial to an agent that has no tunnel to this proxy (and no listener of its own)
    /// waits for one before failing: the agent may be attaching right now — behind a load
    /// balancer a proxy that has just started receives clients before every agent has found it
    /// (default [`DEFAULT_ATTACH_WAIT`]; zero fails at once). Only agents the cluster routed the
    /// client to get here: an unknown name was refused before the dial.
    pub fn with_attach_wait(mut self, wait: Duration) -> Self {
        self.attach_wait = wait;
        self
    }

    /// Also dials agents that joined the Auth Service directly: when no tunnel serves a
    /// request's server, `direct` dials the listener the agent announced.
    pub fn with_direct(mut self, direct: DirectDialer) -> Self {
        self.direct = Some(direct);
        self
    }

    /// Dials `req.address` through the tunnel of `req.server_id` (a host ID, UUID or node
    /// name; the request sent down the tunnel always names the host ID); without a tunnel,
    /// on the agent's own listener when it joined directly ([`with_direct`](Self::with_direct)).
    ///
    /// With proxy peering ([`TunnelServer::set_peer_dialer`]), an agent without a tunnel here
    /// is dialed through the peer proxies before waiting for it to attach; when that fails too,
    /// the error names the agent and every peer tried.
    pub async fn dial(&self, req: DialRequest) -> Result<TunnelStream, TunnelError> {
        self.dial_with(req, true).await
    }

    /// Dials over this proxy's own tunnels (and direct listeners) only, never through a peer:
    /// what the peering server serves peers with.
    pub(crate) async fn dial_local(&self, req: DialRequest) -> Result<TunnelStream, TunnelError> {
        self.dial_with(req, false).await
    }

    fn peer_dialer(&self) -> Option<PeerDialer> {
        self.peers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .filter(PeerDialer::has_peers)
    }

    async fn dial_with(&self, mut req: DialRequest, via_peers: bool) -> Result<TunnelStream, TunnelError> {
        let host_id = match self.registry.resolve(&req.server_id) {
            Some(host_id) => host_id,
            None => {
                let server = req.server_id.clone();
                if let Some(direct) = &self.direct
                    && let Some(io) = direct.dial(req.clone()).await?
                {
                    return Ok(TunnelStream {
                        inner: StreamInner::Direct(io),
                    });
                }
                let mut peering = None;
                if via_peers && let Some(peers) = self.peer_dialer() {
                    match peers.dial(&req).await {
                        Ok(io) => {
                            return Ok(TunnelStream {
                                inner: StreamInner::Direct(io),
                            });
                        }
                        Err(e) => peering = Some(e),
                    }
                }
                match (self.attached(&server).await, peering) {
                    (Some(host_id), _) => host_id,
                    (None, Some(e)) => return Err(TunnelError::Peering(e)),
                    (None, None) => return Err(TunnelError::NoAgent(server)),
                }
            }
        };
        req.server_id = host_id.clone();
        let (handle, state) = self
            .registry
            .pick(&host_id)
            .ok_or_else(|| TunnelError::NoAgent(host_id.clone()))?;
        let open_dial = state.open_dial.load(std::sync::atomic::Ordering::SeqCst);
        let dial_status = state.dial_status.load(std::sync::atomic::Ordering::SeqCst);
        let guard = LiveGuard::new(state);
        if open_dial {
            return self.dial_in_open(&handle, req, host_id, guard, dial_status).await;
        }
        let (src_host, src_port) = split_host_port(&req.client_src_addr);
        let open = async {
            let channel = handle
                .channel_open_forwarded_tcpip(TRANSPORT_CHANNEL, 0, src_host, src_port)
                .await
                .map_err(|e| TunnelError::Closed {
                    server: host_id.clone(),
                    reason: e.to_string(),
                })?;
            let mut stream = channel.into_stream();
            let mut line = serde_json::to_vec(&req).map_err(|e| TunnelError::Malformed {
                what: "dial request",
                reason: e.to_string(),
            })?;
            line.push(b'\n');
            stream.write_all(&line).await.map_err(|source| TunnelError::Io {
                what: "sending the dial request",
                source,
            })?;
            stream.flush().await.map_err(|source| TunnelError::Io {
                what: "sending the dial request",
                source,
            })?;
            let answer = read_line(&mut stream, MAX_DIAL_REQUEST)
                .await
                .map_err(|source| TunnelError::Io {
                    what: "reading the agent's answer",
                    source,
                })?
                .unwrap_or_else(|| "the agent closed the channel".into());
            if answer == DIAL_OK {
                Ok(stream)
            } else {
                Err(TunnelError::DialRefused {
                    server: host_id.clone(),
                    address: req.address.clone(),
                    reason: sanitize_dial_reason(&answer),
                })
            }
        };
        let stream = tokio::time::timeout(self.timeout, open)
            .await
            .map_err(|_| TunnelError::Timeout {
                what: "dialing through the tunnel",
                after: self.timeout,
            })??;
        Ok(TunnelStream {
            inner: StreamInner::Channel {
                stream: Box::new(stream),
                _live: guard,
            },
        })
    }
}

impl TunnelDialer {
    /// Dials with the request in the channel-open message (one round trip on the tunnel): the
    /// agent's confirmation is the success and its open failure the refusal — or, with
    /// `dial_status` (the agent named [`CAP_DIAL_STATUS`]), the status line right behind the
    /// confirmation says which, a refusal with the agent's reason.
    async fn dial_in_open(
        &self,
        handle: &russh::server::Handle,
        req: DialRequest,
        host_id: String,
        guard: LiveGuard,
        dial_status: bool,
    ) -> Result<TunnelStream, TunnelError> {
        let json = serde_json::to_string(&req).map_err(|e| TunnelError::Malformed {
            what: "dial request",
            reason: e.to_string(),
        })?;
        let tunnel = handle.clone();
        let address = if dial_status {
            OPEN_DIAL_STATUS_CHANNEL
        } else {
            OPEN_DIAL_CHANNEL
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut open =
            Box::pin(async move { tunnel.channel_open_forwarded_tcpip(address, 0, json, 0).await });
        let Ok(opened) = tokio::time::timeout_at(deadline, &mut open).await else {
            // The agent may still confirm once its dial completes: close that channel then, so
            // that neither end keeps a connection nobody reads.
            tokio::spawn(async move {
                if let Ok(channel) = open.await {
                    let _ = channel.close().await;
                }
            });
            return Err(TunnelError::Timeout {
                what: "dialing through the tunnel",
                after: self.timeout,
            });
        };
        match opened {
            Ok(channel) if dial_status => {
                // Dropping the stream (on a refusal or past the deadline) closes the channel.
                let mut stream = channel.into_stream();
                let status = tokio::time::timeout_at(deadline, read_dial_status(&mut stream))
                    .await
                    .map_err(|_| TunnelError::Timeout {
                        what: "reading the agent's dial status",
                        after: self.timeout,
                    })?
                    .map_err(|source| TunnelError::Io {
                        what: "reading the agent's dial status",
                        source,
                    })?;
                match status {
                    Ok(()) => Ok(TunnelStream {
                        inner: StreamInner::Channel {
                            stream: Box::new(stream),
                            _live: guard,
                        },
                    }),
                    Err((_, reason)) => Err(TunnelError::DialRefused {
                        server: host_id,
                        address: req.address,
                        reason,
                    }),
                }
            }
            Ok(channel) => Ok(TunnelStream {
                inner: StreamInner::Channel {
                    stream: Box::new(channel.into_stream()),
                    _live: guard,
                },
            }),
            Err(russh::Error::ChannelOpenFailure(reason)) => Err(TunnelError::DialRefused {
                server: host_id,
                address: req.address,
                reason: DialFailure::from_code(reason.code()).text().to_owned(),
            }),
            Err(e) => Err(TunnelError::Closed {
                server: host_id,
                reason: e.to_string(),
            }),
        }
    }
}

fn split_host_port(addr: &str) -> (String, u32) {
    match addr.parse::<SocketAddr>() {
        Ok(sa) => (sa.ip().to_string(), u32::from(sa.port())),
        Err(_) => (addr.to_owned(), 0),
    }
}

impl Service<DialRequest> for TunnelDialer {
    type Response = TunnelStream;
    type Error = TunnelError;
    type Future = BoxFuture<'static, Result<TunnelStream, TunnelError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: DialRequest) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.dial(req).await })
    }
}

/// A client connection carried by a tunnel's transport channel (while it lives, the tunnel
/// counts it as a live session, kept open even if the agent's heartbeats stop), or by a
/// directly joined agent's listener.
pub struct TunnelStream {
    inner: StreamInner,
}

enum StreamInner {
    Channel {
        stream: Box<russh::ChannelStream<Msg>>,
        _live: LiveGuard,
    },
    Direct(BoxIo),
}

impl StreamInner {
    fn io(&mut self) -> Pin<&mut dyn Io> {
        match self {
            StreamInner::Channel { stream, .. } => Pin::new(&mut **stream),
            StreamInner::Direct(io) => Pin::new(&mut **io),
        }
    }
}

impl TunnelStream {
    /// Copies bytes both ways between `client` and this connection until both directions have
    /// ended, like [`tokio::io::copy_bidirectional`]; returns the bytes copied from `client`
    /// and to it. Through a tunnel's channel the payloads move without the copies of the
    /// channel's `AsyncRead`/`AsyncWrite` ([`relay`](crate::io::relay::relay)).
    pub async fn relay<S>(&mut self, client: &mut S) -> std::io::Result<(u64, u64)>
    where
        S: AsyncRead + AsyncWrite + Unpin + ?Sized,
    {
        match &mut self.inner {
            StreamInner::Channel { stream, .. } => crate::io::relay::relay(client, &mut **stream).await,
            StreamInner::Direct(io) => {
                tokio::io::copy_bidirectional_with_sizes(client, io, 64 * 1024, 64 * 1024).await
            }
        }
    }
}

impl std::fmt::Debug for TunnelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunnelStream")
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.inner.io().poll_read(cx, buf)
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.inner.io().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.inner.io().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.inner.io().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_holds_at_most_its_share_of_the_handshakes() {
        let counts = Arc::new(SourceCounts {
            counts: std::sync::Mutex::default(),
            max: 2,
        });
        let take = |addr: &str| {
            let slot = SourceCounts::enter(&counts, addr.parse().unwrap());
            let permit = slot.share.clone().try_acquire_owned().ok();
            (slot, permit)
        };
        let first = take("192.0.2.1:1000");
        let second = take("[::ffff:192.0.2.1]:1001");
        assert!(first.1.is_some() && second.1.is_some());
        let third = take("192.0.2.1:1002");
        assert!(
            third.1.is_none(),
            "a third from one address (IPv4-mapped or not) waits"
        );
        let other = take("192.0.2.2:1000");
        assert!(other.1.is_some(), "another address is not held up");
        drop(first);
        assert!(
            third.0.share.clone().try_acquire_owned().is_ok(),
            "room again once one ends"
        );
        drop((second, third, other));
        assert!(
            counts.counts.lock().unwrap().is_empty(),
            "nothing is kept for idle sources"
        );
        // One host's /64 is one source.
        let _x = take("[2001:db8:1:2::1]:1");
        let _y = take("[2001:db8:1:2:ffff::9]:1");
        assert!(take("[2001:db8:1:2::5]:1").1.is_none());
        assert!(take("[2001:db8:1:3::1]:1").1.is_some());
    }

    #[test]
    fn incompatibility_messages() {
        let cluster: Version = "17.0.0".parse().unwrap();
        assert!(incompatibility(&"17.2.0".parse().unwrap(), &cluster).is_none());
        assert!(incompatibility(&"16.4.0".parse().unwrap(), &cluster).is_none());
        let ahead = incompatibility(&"18.0.0".parse().unwrap(), &cluster).unwrap();
        assert!(
            ahead.contains("v18.0.0") && ahead.contains("newer major"),
            "{ahead}"
        );
        let old = incompatibility(&"15.0.0".parse().unwrap(), &cluster).unwrap();
        assert!(old.contains("one major version behind"), "{old}");
    }
}

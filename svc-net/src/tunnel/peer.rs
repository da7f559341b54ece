//! Proxy peering (`proxy_service.peer_listen_addr`, port 3021): with
//! `auth_service.tunnel_strategy: {type: proxy_peering}` each agent keeps tunnels to only
//! `agent_connection_count` proxies, and a proxy that receives a client for an agent it holds
//! no tunnel to reaches it through a peer proxy that does.
//!
//! - [`serve_peers`]: the server on the peer address — gRPC ([`proto`]) over mutual TLS. The
//!   client must present a host certificate of the cluster with the `proxy` role; any other
//!   certificate (a node's, a user's) or none is refused. Each call is one client connection:
//!   the first frame is the tunnel's [`DialRequest`], the server dials the agent over a tunnel
//!   it holds (never through another peer) and answers `established`, then data frames flow
//!   both ways. HTTP/2 keepalive every [`PEER_KEEPALIVE`], a silent peer is dropped after
//!   [`PEER_KEEPALIVE_TIMEOUT`].
//! - [`PeerDialer`]: the client side, attached to the [`TunnelServer`](super::TunnelServer)
//!   ([`set_peer_dialer`](super::TunnelServer::set_peer_dialer)): a dial for an agent without a
//!   local tunnel tries first the peers whose registry record says they hold the agent, then
//!   every other peer (records lag behind an agent that just moved); the failure names the
//!   agent and every peer tried with its answer.
//! - [`agent_proxies`]: which proxies an agent is told to keep tunnels to (rendezvous hashing of
//!   the agent's host ID over the live proxies).
//! - [`PeerKeys`]: the certificate and key both sides present, shared and replaced in place when
//!   the proxy renews its host certificates: every TLS handshake after
//!   [`renew`](PeerKeys::renew) presents the new ones (no restart; connections already up keep
//!   the ones they were made with until they reconnect).
//!
//! Hostile peers: a TLS handshake must finish within [`PEER_HANDSHAKE_TIMEOUT`] (each connection
//! has its own deadline, so a stalled one holds up no other), the first frame must arrive within
//! [`PEER_DIAL_TIMEOUT`] and be a well-formed dial request, and no frame may exceed
//! [`MAX_FRAME_MESSAGE`] bytes.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, SystemTime},
};

use futures_util::stream::BoxStream;
use rustls::{
    SignatureScheme,
    client::ResolvesClientCert,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
    sign::CertifiedKey,
};
use svc_core::identity::{IdentityKind, SystemRole, Verifier};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::Channel};
use tower::BoxError;

use super::{DialRequest, DiscoveredProxy, TunnelDialer, TunnelError};
use crate::io::BoxIo;
use crate::listen::ListenOptions;
use crate::tls::{HandshakeDeadline, TlsConnection, TlsTerminate};

/// The proxy peering gRPC API (`proto/peer.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("svc.peer.v1");
}

use proto::{
    Data, Established, Frame,
    frame::Message,
    proxy_peer_client::ProxyPeerClient,
    proxy_peer_server::{ProxyPeer, ProxyPeerServer},
};

/// How often a peer connection is pinged (HTTP/2 keepalive), both ways.
pub const PEER_KEEPALIVE: Duration = Duration::from_secs(10);
/// How long a ping may go unanswered before the peer connection is closed.
pub const PEER_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long connecting to a peer, its TLS handshake, and the dial through it may take; also
/// how long the server waits for a call's first frame.
pub const PEER_DIAL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the server lets a connection take to finish its TLS handshake before closing it.
pub const PEER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes per data frame at most.
const FRAME_BYTES: usize = 32 * 1024;
/// The largest gRPC message either side accepts (a data frame and its envelope, or a dial
/// request); a larger one ends the call with `OutOfRange`.
pub const MAX_FRAME_MESSAGE: usize = FRAME_BYTES + 1024;
const ALPN_H2: &[u8] = b"h2";

/// Why proxy peering failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// No peer reached the agent; `tried` names each peer tried and its answer.
    #[error("no proxy peer reached agent {agent} (peers tried: {tried})")]
    NotReached {
        /// The agent (as the client named it).
        agent: String,
        /// `<proxy id> at <address>: <answer>` for each peer, `; `-separated, or `none`.
        tried: String,
    },
    /// The TLS configuration could not be built from the proxy's identity.
    #[error("proxy peering TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// A (renewed) identity is not a proxy certificate of this cluster for this proxy.
    #[error("proxy peering identity for {host_id}: {reason}")]
    Identity {
        /// The proxy's host ID.
        host_id: String,
        /// What is wrong with the certificate.
        reason: String,
    },
}

/// What a proxy presents to its peers and how it checks them: its host certificate chain and
/// key (the `proxy` role, from the cluster's host CA), and the cluster's verifier.
pub struct PeerIdentity {
    /// The proxy's host ID (`<uuid>.<cluster>`).
    pub host_id: String,
    /// Checks the peers' certificates.
    pub verifier: Arc<Verifier>,
    /// The proxy's TLS certificate chain (leaf first).
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for PeerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerIdentity")
            .field("host_id", &self.host_id)
            .finish_non_exhaustive()
    }
}

/// The certificate and key this proxy presents on peering connections, as both the server and
/// the client side: shared by [`serve_peers_with_keys`] and [`PeerDialer::with_keys`] and replaced
/// in place by [`renew`](Self::renew), so a renewal takes effect at the next handshake without
/// a restart. Cheap to clone.
#[derive(Clone)]
pub struct PeerKeys {
    inner: Arc<KeysInner>,
}

struct KeysInner {
    host_id: String,
    verifier: Arc<Verifier>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for PeerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerKeys")
            .field("host_id", &self.inner.host_id)
            .finish_non_exhaustive()
    }
}

impl PeerKeys {
    /// Keys presenting `identity` (its chain must be a proxy certificate of the cluster).
    pub fn new(identity: &PeerIdentity) -> Result<Self, PeerError> {
        let key = certified(
            &identity.host_id,
            identity.chain.clone(),
            identity.key.clone_key(),
        )?;
        Ok(Self {
            inner: Arc::new(KeysInner {
                host_id: identity.host_id.clone(),
                verifier: identity.verifier.clone(),
                current: RwLock::new(key),
            }),
        })
    }

    /// Presents `chain` and `key` from the next handshake on. Refused (the current ones stay)
    /// unless the chain is a valid `proxy` host certificate of this cluster for the same host
    /// ID and the key is the certificate's.
    pub fn renew(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), PeerError> {
        let host_id = &self.inner.host_id;
        let host = self
            .inner
            .verifier
            .verify_host_x509(&chain, SystemTime::now(), Some(SystemRole::Proxy))
            .map_err(|e| PeerError::Identity {
                host_id: host_id.clone(),
                reason: e.to_string(),
            })?;
        if host.host_id != *host_id {
            return Err(PeerError::Identity {
                host_id: host_id.clone(),
                reason: format!("the renewed certificate names {}", host.host_id),
            });
        }
        let fresh = certified(host_id, chain, key)?;
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// The leaf certificate presented now.
    pub fn certificate(&self) -> Option<CertificateDer<'static>> {
        self.current().cert.first().cloned()
    }

    /// The proxy's host ID.
    pub fn host_id(&self) -> &str {
        &self.inner.host_id
    }

    fn current(&self) -> Arc<CertifiedKey> {
        self.inner
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The server side's TLS configuration: presents the current keys, requires a client
    /// certificate from the cluster's host CA (its `proxy` role is checked after the handshake),
    /// ALPN `h2`.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
        let roots = Arc::new(self.inner.verifier.root_store(Some(IdentityKind::Host)));
        // A client certificate is required and must chain to the host CA; the role is checked
        // once the handshake is done (a node's host certificate chains there too).
        let clients = WebPkiClientVerifier::builder_with_provider(roots, crate::tls::provider())
            .build()
            .map_err(|e| rustls::Error::General(format!("client verifier: {e}")))?;
        let mut config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(clients)
            .with_cert_resolver(Arc::new(CurrentKey(self.clone())));
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        // No resumption: every connection authenticates with the certificates of the moment
        // (a resumed session would carry a peer's previous, possibly expired, certificate).
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }

    /// The client side's TLS configuration: presents the current keys, accepts only a peer
    /// presenting a `proxy` host certificate of the cluster, ALPN `h2`.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
        let mut config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(crate::tls::ServerIdentityVerifier::new(PeerServerVerifier {
                verifier: self.inner.verifier.clone(),
            }))
            .with_client_cert_resolver(Arc::new(CurrentKey(self.clone())));
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        // No resumption: a renewed certificate is presented at the next connection.
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(config))
    }
}

/// A certificate chain and key as rustls presents them (the key must match the leaf).
fn certified(
    host_id: &str,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, PeerError> {
    let bad = |reason: String| PeerError::Identity {
        host_id: host_id.to_owned(),
        reason,
    };
    if chain.is_empty() {
        return Err(bad("no certificate".into()));
    }
    let signing = crate::tls::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| bad(format!("the private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| bad(format!("the key is not the certificate's: {e}")))?;
    Ok(Arc::new(certified))
}

/// Presents whatever [`PeerKeys`] holds at the moment of each handshake, as server and client.
#[derive(Debug)]
struct CurrentKey(PeerKeys);

impl ResolvesServerCert for CurrentKey {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

impl ResolvesClientCert for CurrentKey {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Which of `proxies` the agent `agent_id` keeps tunnels to when each agent keeps `count`:
/// rendezvous (highest random weight) hashing — each proxy scores SHA-256 of
/// `agent_id \0 proxy_id`, the `count` highest win. Every proxy computes the same answer from
/// the same registry list, agents spread evenly over the proxies, and when a proxy leaves only
/// the agents it held move (each to its next-ranked proxy).
pub fn agent_proxies(agent_id: &str, proxies: &[DiscoveredProxy], count: usize) -> Vec<DiscoveredProxy> {
    let mut ranked: Vec<(u64, &DiscoveredProxy)> = proxies
        .iter()
        .map(|p| (score(agent_id, &p.proxy_id), p))
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.proxy_id.cmp(&b.1.proxy_id)));
    ranked
        .into_iter()
        .take(count.max(1))
        .map(|(_, p)| p.clone())
        .collect()
}

fn score(agent_id: &str, proxy_id: &str) -> u64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(agent_id.as_bytes());
    ctx.update(&[0]);
    ctx.update(proxy_id.as_bytes());
    let digest = ctx.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
}

/// A peer proxy as the registry lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Peer {
    /// Its host ID.
    pub proxy_id: String,
    /// Where it serves peering (`host:port`).
    pub peer_addr: String,
    /// Host IDs of the agents its record says it holds a tunnel to.
    pub agents: Vec<String>,
}

impl Peer {
    /// A peer at `peer_addr` holding `agents`.
    pub fn new(proxy_id: impl Into<String>, peer_addr: impl Into<String>, agents: Vec<String>) -> Self {
        Self {
            proxy_id: proxy_id.into(),
            peer_addr: peer_addr.into(),
            agents,
        }
    }

    fn holds(&self, server: &str) -> bool {
        self.agents
            .iter()
            .any(|a| a == server || a.split_once('.').is_some_and(|(uuid, _)| uuid == server))
    }
}

/// Dials agents through peer proxies. Cheap to clone.
#[derive(Clone)]
pub struct PeerDialer {
    inner: Arc<DialerInner>,
}

struct DialerInner {
    host_id: String,
    keys: PeerKeys,
    tls: Arc<rustls::ClientConfig>,
    peers: RwLock<Vec<Peer>>,
    channels: Mutex<HashMap<String, Channel>>,
}

impl std::fmt::Debug for PeerDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerDialer")
            .field("host_id", &self.inner.host_id)
            .field("peers", &self.peers().len())
            .finish_non_exhaustive()
    }
}

impl PeerDialer {
    /// A dialer presenting `identity` to the peers (no peers until [`set_peers`](Self::set_peers)).
    pub fn new(identity: &PeerIdentity) -> Result<Self, PeerError> {
        Self::with_keys(PeerKeys::new(identity)?)
    }

    /// A dialer presenting whatever `keys` holds at each new connection to a peer (renewed
    /// keys are used from the next connection on; connections already up keep working).
    pub fn with_keys(keys: PeerKeys) -> Result<Self, PeerError> {
        Ok(Self {
            inner: Arc::new(DialerInner {
                host_id: keys.host_id().to_owned(),
                tls: keys.client_config()?,
                keys,
                peers: RwLock::new(Vec::new()),
                channels: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Replaces the peers (this proxy itself and peers without an address are ignored).
    pub fn set_peers(&self, peers: Vec<Peer>) {
        let peers: Vec<Peer> = peers
            .into_iter()
            .filter(|p| p.proxy_id != self.inner.host_id && !p.peer_addr.is_empty())
            .collect();
        let addrs: std::collections::HashSet<&str> = peers.iter().map(|p| p.peer_addr.as_str()).collect();
        self.channels().retain(|addr, _| addrs.contains(addr.as_str()));
        *self
            .inner
            .peers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = peers;
    }

    /// The current peers.
    pub fn peers(&self) -> Vec<Peer> {
        self.inner
            .peers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The keys this dialer presents.
    pub fn keys(&self) -> &PeerKeys {
        &self.inner.keys
    }

    /// Whether any peer is known (without peers, dials stay local).
    pub fn has_peers(&self) -> bool {
        !self.peers().is_empty()
    }

    /// Dials `req` through the peers: first those whose record holds `req.server_id`, then the
    /// others.
    pub async fn dial(&self, req: &DialRequest) -> Result<BoxIo, PeerError> {
        let mut peers = self.peers();
        peers.sort_by_key(|p| !p.holds(&req.server_id));
        let mut tried = Vec::new();
        for peer in &peers {
            match tokio::time::timeout(PEER_DIAL_TIMEOUT, self.dial_one(peer, req)).await {
                Ok(Ok(io)) => {
                    tracing::debug!(agent = %req.server_id, peer = %peer.proxy_id, "dialed the agent through a peer proxy");
                    return Ok(io);
                }
                Ok(Err(reason)) => tried.push(format!("{} at {}: {reason}", peer.proxy_id, peer.peer_addr)),
                Err(_) => tried.push(format!(
                    "{} at {}: timed out after {PEER_DIAL_TIMEOUT:?}",
                    peer.proxy_id, peer.peer_addr
                )),
            }
        }
        Err(PeerError::NotReached {
            agent: req.server_id.clone(),
            tried: if tried.is_empty() {
                "none".to_owned()
            } else {
                tried.join("; ")
            },
        })
    }

    async fn channel(&self, addr: &str) -> Result<Channel, String> {
        if let Some(c) = self.channels().get(addr) {
            return Ok(c.clone());
        }
        let target = svc_core::Addr::parse(addr).map_err(|e| format!("bad peer address: {e}"))?;
        let config = self.inner.tls.clone();
        let connector = tower::service_fn(move |_uri: http::Uri| {
            let target = target.clone();
            let config = config.clone();
            async move {
                let tcp = crate::dial::TcpConnector::new()
                    .connect(&target)
                    .await
                    .map_err(std::io::Error::other)?;
                // Names are not checked (the verifier checks the proxy identity); SNI only.
                let name = ServerName::try_from("peer.svc")
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        });
        let channel = tonic::transport::Endpoint::from_static("http://peer.svc")
            .connect_timeout(PEER_DIAL_TIMEOUT)
            .http2_keep_alive_interval(PEER_KEEPALIVE)
            .keep_alive_timeout(PEER_KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_with_connector(connector)
            .await
            .map_err(|e| error_chain(&e))?;
        self.channels().insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }

    async fn dial_one(&self, peer: &Peer, req: &DialRequest) -> Result<BoxIo, String> {
        let channel = self.channel(&peer.peer_addr).await?;
        let result = open(channel, req).await;
        if let Err(Failure::Transport(_)) = &result {
            // A broken connection is made again on the next dial.
            self.channels().remove(&peer.peer_addr);
        }
        result.map_err(|f| match f {
            Failure::Transport(s) | Failure::Refused(s) => s,
        })
    }
}

enum Failure {
    Transport(String),
    Refused(String),
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        source = s.source();
    }
    out
}

fn status_failure(s: Status) -> Failure {
    match std::error::Error::source(&s) {
        // The connection failed (refused, TLS alert, closed by the peer): say what happened.
        Some(source) => Failure::Transport(format!("{}: {}", s.message(), error_chain(source))),
        // The peer answered (no tunnel to the agent there, the agent refused the dial).
        None => Failure::Refused(s.message().to_owned()),
    }
}

/// One call: send the dial request, wait for `established`, then pump bytes between a local
/// duplex pipe (handed to the caller) and the call's streams.
async fn open(channel: Channel, req: &DialRequest) -> Result<BoxIo, Failure> {
    let json = serde_json::to_string(req).map_err(|e| Failure::Refused(format!("dial request: {e}")))?;
    let (tx, rx) = mpsc::channel::<Frame>(8);
    let first = Frame {
        message: Some(Message::DialRequest(proto::DialRequest { json })),
    };
    tx.send(first)
        .await
        .map_err(|_| Failure::Transport("request stream closed".into()))?;
    let outbound = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    let mut client = ProxyPeerClient::new(channel).max_decoding_message_size(MAX_FRAME_MESSAGE);
    let mut inbound = client
        .dial_node(outbound)
        .await
        .map_err(status_failure)?
        .into_inner();
    match inbound.message().await.map_err(status_failure)? {
        Some(Frame {
            message: Some(Message::Established(_)),
        }) => {}
        _ => return Err(Failure::Refused("the peer did not answer established".into())),
    }
    let (near, far) = tokio::io::duplex(2 * FRAME_BYTES);
    let (mut far_read, mut far_write) = tokio::io::split(far);
    tokio::spawn(async move {
        let mut buf = vec![0u8; FRAME_BYTES];
        loop {
            match far_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let frame = Frame {
                        message: Some(Message::Data(Data {
                            bytes: buf[..n].to_vec(),
                        })),
                    };
                    if tx.send(frame).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping `tx` ends the request stream: the peer shuts down its write to the agent.
    });
    tokio::spawn(async move {
        while let Ok(Some(frame)) = inbound.message().await {
            if let Some(Message::Data(d)) = frame.message
                && far_write.write_all(&d.bytes).await.is_err()
            {
                break;
            }
        }
        let _ = far_write.shutdown().await;
    });
    Ok(Box::new(near))
}

/// The identity a peer connection authenticated as (its certificate's host ID).
#[derive(Clone, Debug)]
struct CallerProxy(String);

/// The gRPC service: dials over this proxy's own tunnels only.
#[derive(Clone)]
struct PeerService {
    dialer: TunnelDialer,
}

#[tonic::async_trait]
impl ProxyPeer for PeerService {
    type DialNodeStream = BoxStream<'static, Result<Frame, Status>>;

    async fn dial_node(
        &self,
        request: Request<tonic::Streaming<Frame>>,
    ) -> Result<Response<Self::DialNodeStream>, Status> {
        let caller = request
            .extensions()
            .get::<CallerProxy>()
            .map(|c| c.0.clone())
            .ok_or_else(|| Status::unauthenticated("a proxy identity is required"))?;
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(PEER_DIAL_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no dial request"))??;
        let Some(Frame {
            message: Some(Message::DialRequest(d)),
        }) = first
        else {
            return Err(Status::invalid_argument(
                "the first frame must be the dial request",
            ));
        };
        let req = DialRequest::decode(&d.json).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let agent = req.server_id.clone();
        let stream = self.dialer.dial_local(req).await.map_err(|e| match e {
            TunnelError::NoAgent(_) => Status::not_found(format!("no tunnel to agent {agent} on this proxy")),
            other => Status::unavailable(other.to_string()),
        })?;
        tracing::debug!(%agent, peer = %caller, "serving a peer proxy's dial");
        let (mut agent_read, mut agent_write) = tokio::io::split(stream);
        let (tx, rx) = mpsc::channel::<Result<Frame, Status>>(8);
        let established = Frame {
            message: Some(Message::Established(Established {})),
        };
        tx.send(Ok(established))
            .await
            .map_err(|_| Status::cancelled("the peer went away"))?;
        tokio::spawn(async move {
            while let Ok(Some(frame)) = inbound.message().await {
                if let Some(Message::Data(d)) = frame.message
                    && agent_write.write_all(&d.bytes).await.is_err()
                {
                    break;
                }
            }
            let _ = agent_write.shutdown().await;
        });
        tokio::spawn(async move {
            let mut buf = vec![0u8; FRAME_BYTES];
            loop {
                match agent_read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let frame = Frame {
                            message: Some(Message::Data(Data {
                                bytes: buf[..n].to_vec(),
                            })),
                        };
                        if tx.send(Ok(frame)).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let out = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
        Ok(Response::new(Box::pin(out)))
    }
}

/// Serves proxy peering on `listener` until `shutdown` is cancelled: dials arrive from peer
/// proxies (mutual TLS; a client whose certificate is not a `proxy` host certificate of the
/// cluster is refused and logged) and are served over `tunnel`'s own tunnels.
pub async fn serve_peers(
    listener: TcpListener,
    tunnel: super::TunnelServer,
    identity: &PeerIdentity,
    options: ListenOptions,
    shutdown: CancellationToken,
) -> Result<(), PeerError> {
    serve_peers_with_keys(listener, tunnel, PeerKeys::new(identity)?, options, shutdown).await
}

/// Like [`serve_peers`], presenting whatever `keys` holds at each handshake (so a renewal
/// through [`PeerKeys::renew`] takes effect without a restart).
pub async fn serve_peers_with_keys(
    listener: TcpListener,
    tunnel: super::TunnelServer,
    keys: PeerKeys,
    options: ListenOptions,
    shutdown: CancellationToken,
) -> Result<(), PeerError> {
    let config = keys.server_config()?;
    let verifier = keys.inner.verifier.clone();
    let grpc = ProxyPeerServer::new(PeerService {
        dialer: tunnel.dialer().with_attach_wait(Duration::ZERO),
    })
    .max_decoding_message_size(MAX_FRAME_MESSAGE);
    let per_conn = tower::service_fn(move |conn: TlsConnection| {
        let grpc = grpc.clone();
        let verifier = verifier.clone();
        async move {
            let addr = conn.peer_addr;
            let caller = match peer_proxy(&conn, &verifier) {
                Ok(id) => id,
                Err(reason) => {
                    tracing::warn!(peer = %addr, %reason, "refused a proxy peering connection: not a proxy of this cluster");
                    return Ok::<(), BoxError>(());
                }
            };
            let ext = CallerProxy(caller);
            let svc = tower::ServiceBuilder::new()
                .map_request(move |mut req: http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ext.clone());
                    req
                })
                .service(grpc);
            let served = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(Some(PEER_KEEPALIVE))
                .keep_alive_timeout(PEER_KEEPALIVE_TIMEOUT)
                .serve_connection(
                    hyper_util::rt::TokioIo::new(conn.io),
                    hyper_util::service::TowerToHyperService::new(svc),
                );
            tokio::pin!(served);
            tokio::select! {
                r = served.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(peer = %addr, error = %e, "proxy peering connection ended");
                    }
                }
                _ = conn.shutdown.cancelled() => {
                    served.as_mut().graceful_shutdown();
                    let _ = served.await;
                }
            }
            Ok(())
        }
    });
    let service = TlsTerminate::new(
        config,
        HandshakeDeadline::Timeout(PEER_HANDSHAKE_TIMEOUT),
        per_conn,
    );
    crate::listen::serve(listener, service, options, shutdown).await;
    Ok(())
}

/// The host ID of a connection's client certificate, if it is a proxy of this cluster.
fn peer_proxy(conn: &TlsConnection, verifier: &Verifier) -> Result<String, String> {
    let certs = conn
        .io
        .get_ref()
        .1
        .peer_certificates()
        .map(<[CertificateDer<'_>]>::to_vec)
        .unwrap_or_default();
    if certs.is_empty() {
        return Err("no client certificate".into());
    }
    verifier
        .verify_host_x509(&certs, SystemTime::now(), Some(SystemRole::Proxy))
        .map(|host| host.host_id)
        .map_err(|e| e.to_string())
}

/// The client's check of the peer: a host certificate of the cluster with the `proxy` role.
#[derive(Debug)]
struct PeerServerVerifier {
    verifier: Arc<Verifier>,
}

impl crate::tls::ServerIdentityCheck for PeerServerVerifier {
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        now: UnixTime,
    ) -> Result<(), rustls::Error> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now.as_secs());
        self.verifier
            .verify_host_x509(std::slice::from_ref(end_entity), now, Some(SystemRole::Proxy))
            .map_err(|e| rustls::Error::General(format!("the peer proxy's certificate: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(n: usize) -> Vec<DiscoveredProxy> {
        (0..n)
            .map(|i| DiscoveredProxy {
                proxy_id: format!("proxy-{i}.example.com"),
                tunnel_addr: format!("10.0.0.{i}:3024"),
                tls_routing: false,
            })
            .collect()
    }

    #[test]
    fn agents_spread_evenly_and_only_the_departed_proxys_agents_move() {
        let three = proxies(3);
        let mut counts = [0usize; 3];
        let mut before = Vec::new();
        for a in 0..3000 {
            let agent = format!("{a:08x}-agent.example.com");
            let chosen = agent_proxies(&agent, &three, 1);
            assert_eq!(chosen.len(), 1);
            let i = three.iter().position(|p| *p == chosen[0]).unwrap();
            counts[i] += 1;
            before.push((agent, i));
        }
        for c in counts {
            assert!((800..=1200).contains(&c), "uneven spread: {counts:?}");
        }
        // Proxy 1 leaves: agents held elsewhere stay where they are.
        let two = vec![three[0].clone(), three[2].clone()];
        for (agent, i) in before {
            let now = &agent_proxies(&agent, &two, 1)[0];
            if i != 1 {
                assert_eq!(*now, three[i], "{agent} moved although its proxy stayed");
            }
        }
        // N = 2 of 3: two distinct proxies; N larger than the list: all of them.
        let two_of_three = agent_proxies("x.example.com", &three, 2);
        assert_eq!(two_of_three.len(), 2);
        assert_ne!(two_of_three[0], two_of_three[1]);
        assert_eq!(agent_proxies("x.example.com", &three, 5).len(), 3);
    }

    #[test]
    fn holders_match_host_ids_and_their_uuid() {
        let p = Peer::new("p", "127.0.0.1:3021", vec!["6f1c.example.com".into()]);
        assert!(p.holds("6f1c.example.com") && p.holds("6f1c"));
        assert!(!p.holds("node-1"));
    }
}

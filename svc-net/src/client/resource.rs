//! The client end of resource access, for local proxies (`tsh proxy app|db`): TLS to the
//! proxy's web port with the user's certificate and the resource's ALPN name, the
//! [`ResourceRequest`] line, the proxy's answer; then the stream carries the client's bytes.
//! Also the local half of Postgres' TLS negotiation, so `psql` connects to the local listener
//! unchanged, and [`LocalProxy`], the local listener itself: everyday clients (`curl`, `psql`)
//! connect to `127.0.0.1:PORT` and each connection is carried to the resource. A refusal by the
//! proxy reaches psql as a Postgres `FATAL` error carrying the proxy's text, so the user sees why.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use svc_core::Addr;
use svc_core::auth::ServedKind;
use svc_core::config::DbProtocol;
use svc_core::identity::IdentityKind;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::auth::ClientIdentity;
use crate::dial::ProxyDialer;
use crate::io::BoxIo;
use crate::route::alpn;
use crate::services::{MAX_LINE, RESOURCE_OK, ResourceRequest};
use crate::tunnel::read_line;

/// Why a resource could not be reached through the proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The proxy could not be reached or its TLS handshake failed.
    #[error("connecting to the proxy at {addr}: {reason}")]
    Proxy {
        /// The proxy address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The proxy refused: its text names the resource (access denied, not found, agent down).
    #[error("{0}")]
    Refused(String),
    /// The local identity is unusable.
    #[error("identity: {0}")]
    Identity(String),
}

/// Where the proxy is and who the user is.
#[derive(Clone, Debug)]
pub struct ResourceClient {
    /// The proxy's web address.
    pub proxy: Addr,
    /// The user's identity (the `tsh` profile's).
    pub identity: ClientIdentity,
    /// Skip checking the proxy's certificate (`tsh login --insecure`, self-signed test
    /// clusters). The user is still authenticated by the certificate.
    pub insecure: bool,
    /// Extra CAs (PEM) for the proxy's certificate.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// How the proxy is reached (direct or HTTP CONNECT).
    pub dialer: ProxyDialer,
    /// The TLS configurations built so far, one per ALPN name, shared by clones: every
    /// connection of a local proxy uses the same one, and so the same session cache, so a new
    /// client connection resumes the TLS session instead of a full handshake.
    pub tls_configs: TlsConfigs,
    /// The multiplexed connection to the proxy shared by clones ([`Multiplexer::new`]: client
    /// connections travel as streams of one TLS connection; [`Multiplexer::disabled`]: each on
    /// a TLS connection of its own).
    pub multiplexer: Multiplexer,
}

/// One TLS connection to the proxy carrying many resource connections as HTTP/2 streams
/// (ALPN `svc-mux`, [`services::mux`](crate::services::mux)), shared by the clones of a
/// [`ResourceClient`]: made when first needed, made again when it breaks. When the proxy does not
/// serve it (an older proxy), or [`MAX_STREAMS`](crate::services::mux::MAX_STREAMS) streams are
/// open, a connection is made on its own, as with [`Multiplexer::disabled`]; the multiplexed
/// connection is tried again 30 s later.
#[derive(Clone)]
pub struct Multiplexer(Arc<MuxInner>);

struct MuxInner {
    enabled: bool,
    /// The connection's sender; `None` before the first stream and after it broke.
    sender: tokio::sync::Mutex<Option<MuxSender>>,
    /// Until when connections go on their own after the multiplexed one failed.
    off_until: std::sync::Mutex<Option<std::time::Instant>>,
    /// Streams open now.
    open: Arc<std::sync::atomic::AtomicUsize>,
    streams: std::sync::atomic::AtomicU64,
    connections: std::sync::atomic::AtomicU64,
}

type MuxSender = hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>;

/// How long connections go on their own after the multiplexed connection could not be made.
const MUX_RETRY: Duration = Duration::from_secs(30);

impl Default for Multiplexer {
    fn default() -> Self {
        Self::new()
    }
}

impl Multiplexer {
    /// Client connections travel as streams of one TLS connection.
    pub fn new() -> Self {
        Self::with(true)
    }

    /// Every client connection makes a TLS connection of its own (how local proxies connected
    /// before the multiplexed connection; for measurements and for proxies in front of which
    /// something forbids long-lived connections).
    pub fn disabled() -> Self {
        Self::with(false)
    }

    fn with(enabled: bool) -> Self {
        Self(Arc::new(MuxInner {
            enabled,
            sender: tokio::sync::Mutex::new(None),
            off_until: std::sync::Mutex::new(None),
            open: Arc::default(),
            streams: Default::default(),
            connections: Default::default(),
        }))
    }

    /// How many streams were opened, over all multiplexed connections made.
    pub fn streams_opened(&self) -> u64 {
        self.0.streams.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many multiplexed connections were made.
    pub fn connections_made(&self) -> u64 {
        self.0.connections.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn off_until(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.0
            .off_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Connections go on their own for [`MUX_RETRY`] (unless already so).
    fn back_off(&self) {
        self.off_until()
            .get_or_insert_with(|| std::time::Instant::now() + MUX_RETRY);
    }

    /// Whether to try a stream now.
    fn usable(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.0.enabled || self.0.open.load(Relaxed) >= crate::services::mux::MAX_STREAMS as usize {
            return false;
        }
        let mut off = self.off_until();
        match *off {
            Some(until) if std::time::Instant::now() < until => false,
            Some(_) => {
                *off = None;
                true
            }
            None => true,
        }
    }
}

impl std::fmt::Debug for Multiplexer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Multiplexer")
            .field("enabled", &self.0.enabled)
            .field("connections_made", &self.connections_made())
            .field("streams_opened", &self.streams_opened())
            .finish()
    }
}

/// Why a stream could not be opened.
enum MuxError {
    /// Final: the proxy refused the resource, or the identity is unusable.
    Final(ConnectError),
    /// The multiplexed connection could not be made or broke: connect on its own instead.
    Unavailable(String),
}

/// The client TLS configurations of a [`ResourceClient`] by ALPN name (see
/// [`ResourceClient::tls_configs`]); empty by default, filled as connections are made. Also
/// counts the handshakes made with them, full and resumed.
#[derive(Clone, Default)]
pub struct TlsConfigs(Arc<TlsConfigsInner>);

#[derive(Default)]
struct TlsConfigsInner {
    configs: std::sync::Mutex<std::collections::HashMap<String, Arc<rustls::ClientConfig>>>,
    full: std::sync::atomic::AtomicU64,
    resumed: std::sync::atomic::AtomicU64,
    /// Build a configuration for every connection (no session to resume).
    uncached: bool,
    /// The crypto provider, when not [`crate::tls::provider`].
    provider: Option<Arc<rustls::crypto::CryptoProvider>>,
}

impl TlsConfigs {
    /// Configurations built afresh for every connection, so every handshake is a full one (how
    /// local proxies connected before sessions were resumed): for measurements.
    pub fn uncached() -> Self {
        Self(Arc::new(TlsConfigsInner {
            uncached: true,
            ..Default::default()
        }))
    }

    /// Configurations built with `provider` instead of [`crate::tls::provider`] (e.g. ring's
    /// default order of cipher suites, AES-256 first): for measurements.
    pub fn with_provider(provider: Arc<rustls::crypto::CryptoProvider>) -> Self {
        Self(Arc::new(TlsConfigsInner {
            provider: Some(provider),
            ..Default::default()
        }))
    }

    /// How many TLS handshakes to the proxy were full ones (certificates exchanged and
    /// verified).
    pub fn full_handshakes(&self) -> u64 {
        self.0.full.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many TLS handshakes to the proxy resumed an earlier session.
    pub fn resumed_handshakes(&self) -> u64 {
        self.0.resumed.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<rustls::ClientConfig>>> {
        self.0
            .configs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn count(&self, kind: Option<rustls::HandshakeKind>) {
        let counter = match kind {
            Some(rustls::HandshakeKind::Resumed) => &self.0.resumed,
            _ => &self.0.full,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::fmt::Debug for TlsConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let alpns: Vec<String> = self.lock().keys().cloned().collect();
        f.debug_struct("TlsConfigs")
            .field("alpns", &alpns)
            .field("full_handshakes", &self.full_handshakes())
            .field("resumed_handshakes", &self.resumed_handshakes())
            .finish()
    }
}

/// The ALPN name for a resource kind (and database protocol).
pub fn alpn_for(kind: ServedKind, protocol: Option<DbProtocol>) -> &'static str {
    match (kind, protocol) {
        (ServedKind::Db, Some(DbProtocol::Mysql)) => alpn::MYSQL,
        (ServedKind::Db, Some(DbProtocol::Mongodb)) => alpn::MONGODB,
        (ServedKind::Db, Some(DbProtocol::Redis)) => alpn::REDIS,
        (ServedKind::Db, _) => alpn::POSTGRES,
        _ => alpn::TCP,
    }
}

impl ResourceClient {
    /// The configuration for ALPN `protocol`: built once, then shared (with its session cache).
    fn tls(&self, protocol: &str) -> Result<Arc<rustls::ClientConfig>, ConnectError> {
        if self.tls_configs.0.uncached {
            return self.build_tls(protocol);
        }
        let cached = self.tls_configs.lock().get(protocol).cloned();
        if let Some(config) = cached {
            return Ok(config);
        }
        let config = self.build_tls(protocol)?;
        self.tls_configs
            .lock()
            .insert(protocol.to_owned(), config.clone());
        Ok(config)
    }

    fn build_tls(&self, protocol: &str) -> Result<Arc<rustls::ClientConfig>, ConnectError> {
        let id = |e: String| ConnectError::Identity(e);
        let (chain, key) = self.identity.tls_parts().map_err(|e| id(e.to_string()))?;
        let provider = self
            .tls_configs
            .0
            .provider
            .clone()
            .unwrap_or_else(crate::tls::provider);
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| id(e.to_string()))?;
        let builder = if self.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(crate::tls::insecure_verifier())
        } else {
            let verifier = self.identity.verifier().map_err(|e| id(e.to_string()))?;
            let mut roots = crate::tls::client_roots(self.extra_ca_pem.as_deref())
                .map_err(|e| id(format!("proxy CA bundle: {e}")))?;
            roots.extend(verifier.root_store(Some(IdentityKind::Host)).roots);
            builder.with_root_certificates(roots)
        };
        let mut config = builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| id(e.to_string()))?;
        config.alpn_protocols = vec![protocol.as_bytes().to_vec()];
        Ok(Arc::new(config))
    }

    /// Opens a stream to `kind`/`name` with the ALPN `protocol` ([`alpn_for`]); the proxy's
    /// refusal comes back as [`ConnectError::Refused`] with its text.
    pub async fn connect(&self, kind: ServedKind, name: &str, protocol: &str) -> Result<BoxIo, ConnectError> {
        let req = ResourceRequest {
            kind,
            name: name.to_owned(),
            db_user: None,
            db_name: None,
        };
        self.connect_request(&req, protocol).await
    }

    /// [`connect`](Self::connect) with a whole request line (databases: with the database
    /// user and name).
    pub async fn connect_request(
        &self,
        req: &ResourceRequest,
        protocol: &str,
    ) -> Result<BoxIo, ConnectError> {
        if self.multiplexer.usable() {
            match self.connect_stream(req, protocol).await {
                Ok(io) => return Ok(io),
                Err(MuxError::Final(e)) => return Err(e),
                Err(MuxError::Unavailable(reason)) => {
                    tracing::debug!(proxy = %self.proxy, %reason, "no multiplexed connection: connecting on its own");
                    self.multiplexer.back_off();
                }
            }
        }
        self.connect_own(req, protocol).await
    }

    /// A TLS connection to the proxy with ALPN `protocol` (through the connection upgrade when
    /// a load balancer terminates TLS in front of the proxy, [`conn_upgrade`](crate::conn_upgrade)).
    async fn connect_tls(
        &self,
        protocol: &str,
    ) -> Result<tokio_rustls::client::TlsStream<BoxIo>, ConnectError> {
        let addr = self.proxy.to_string();
        let proxy_err = |reason: String| ConnectError::Proxy {
            addr: addr.clone(),
            reason,
        };
        let config = self.tls(protocol)?;
        let dial = || async {
            self.dialer
                .dial(&self.proxy)
                .await
                .map(|tcp| Box::new(tcp) as BoxIo)
        };
        let host = self
            .proxy
            .host_str()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let sni = ServerName::try_from(host).map_err(|e| proxy_err(e.to_string()))?;
        let outer = crate::conn_upgrade::OuterTrust {
            extra_ca_pem: self.extra_ca_pem.clone(),
            insecure: self.insecure,
        };
        let tls = crate::conn_upgrade::connect_tls(dial, config, &outer, sni, &addr)
            .await
            .map_err(|e| proxy_err(e.to_string()))?;
        self.tls_configs.count(tls.get_ref().1.handshake_kind());
        Ok(tls)
    }

    /// The multiplexed connection's sender: the one made before while it lasts, else a new
    /// connection.
    async fn mux_sender(&self) -> Result<MuxSender, MuxError> {
        let mut held = self.multiplexer.0.sender.lock().await;
        if let Some(sender) = held.as_ref().filter(|s| !s.is_closed()) {
            return Ok(sender.clone());
        }
        *held = None;
        // Those that waited here while a connection failed do not each try again in turn.
        if !self.multiplexer.usable() {
            return Err(MuxError::Unavailable(
                "the multiplexed connection could not be made a moment ago".into(),
            ));
        }
        let made = self.mux_connect().await;
        match &made {
            Ok(sender) => *held = Some(sender.clone()),
            // Set while the lock is held, so that those waiting for it see it.
            Err(MuxError::Unavailable(_)) => self.multiplexer.back_off(),
            Err(MuxError::Final(_)) => {}
        }
        made
    }

    /// A new multiplexed connection to the proxy.
    async fn mux_connect(&self) -> Result<MuxSender, MuxError> {
        use crate::services::mux;
        let unavailable = |e: &dyn std::fmt::Display| MuxError::Unavailable(e.to_string());
        let tls = match self.connect_tls(alpn::MUX).await {
            Ok(tls) => tls,
            Err(e @ ConnectError::Identity(_)) => return Err(MuxError::Final(e)),
            Err(e) => return Err(unavailable(&e)),
        };
        if tls.get_ref().1.alpn_protocol() != Some(alpn::MUX.as_bytes()) {
            return Err(MuxError::Unavailable(format!(
                "the proxy did not take ALPN {}",
                alpn::MUX
            )));
        }
        let mut builder = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .initial_stream_window_size(mux::STREAM_WINDOW)
            .initial_connection_window_size(mux::CONNECTION_WINDOW)
            .max_frame_size(mux::MAX_FRAME)
            .max_header_list_size(mux::MAX_HEADER_LIST)
            .keep_alive_interval(mux::KEEPALIVE)
            .keep_alive_timeout(mux::KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let (sender, conn) = builder
            .handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| unavailable(&e))?;
        let proxy = self.proxy.to_string();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%proxy, error = %e, "the multiplexed connection to the proxy ended");
            }
        });
        self.multiplexer
            .0
            .connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(sender)
    }

    /// One resource connection as a stream of the multiplexed connection.
    async fn connect_stream(&self, req: &ResourceRequest, protocol: &str) -> Result<BoxIo, MuxError> {
        use crate::services::mux;
        use http_body_util::BodyExt;
        let unavailable = |e: &dyn std::fmt::Display| MuxError::Unavailable(e.to_string());
        let json = serde_json::to_vec(req).map_err(|e| unavailable(&e))?;
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(mux::AUTHORITY)
            .header(mux::ALPN_HEADER, protocol)
            .header(
                mux::REQUEST_HEADER,
                http::HeaderValue::from_bytes(&json).map_err(|e| unavailable(&e))?,
            )
            .body(http_body_util::Empty::new())
            .map_err(|e| unavailable(&e))?;
        let mut sender = self.mux_sender().await?;
        // The connection may have broken since it was last used: one more try on a new one.
        let response = match sender.send_request(request.clone()).await {
            Ok(r) => r,
            Err(e) if e.is_canceled() || e.is_closed() => {
                sender = self.mux_sender().await?;
                sender.send_request(request).await.map_err(|e| unavailable(&e))?
            }
            Err(e) => return Err(unavailable(&e)),
        };
        self.multiplexer
            .0
            .streams
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if response.status() != http::StatusCode::OK {
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_LINE);
            let text = match body.collect().await {
                Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                Err(e) => format!("the proxy refused the stream ({status}): {e}"),
            };
            return Err(MuxError::Final(ConnectError::Refused(text)));
        }
        let stream = hyper::upgrade::on(response).await.map_err(|e| unavailable(&e))?;
        let mut io = MuxStream {
            io: hyper_util::rt::TokioIo::new(stream),
            _open: OpenStream::count(&self.multiplexer.0.open),
        };
        let answer = match read_line(&mut io, MAX_LINE).await {
            Ok(Some(a)) => a,
            Ok(None) => "the proxy closed the connection without an answer".into(),
            Err(e) => {
                return Err(MuxError::Final(ConnectError::Proxy {
                    addr: self.proxy.to_string(),
                    reason: format!("reading the answer: {e}"),
                }));
            }
        };
        if answer != RESOURCE_OK {
            return Err(MuxError::Final(ConnectError::Refused(answer)));
        }
        Ok(Box::new(io))
    }

    /// One resource connection on a TLS connection of its own.
    async fn connect_own(&self, req: &ResourceRequest, protocol: &str) -> Result<BoxIo, ConnectError> {
        let addr = self.proxy.to_string();
        let proxy_err = |reason: String| ConnectError::Proxy {
            addr: addr.clone(),
            reason,
        };
        let mut tls = self.connect_tls(protocol).await?;
        let mut line = serde_json::to_vec(req).map_err(|e| proxy_err(e.to_string()))?;
        line.push(b'\n');
        tls.write_all(&line).await.map_err(|e| proxy_err(e.to_string()))?;
        tls.flush().await.map_err(|e| proxy_err(e.to_string()))?;
        let answer = read_line(&mut tls, MAX_LINE)
            .await
            .map_err(|e| proxy_err(format!("reading the answer: {e}")))?
            .unwrap_or_else(|| "the proxy closed the connection without an answer".into());
        if answer != RESOURCE_OK {
            return Err(ConnectError::Refused(answer));
        }
        Ok(Box::new(tls))
    }
}

/// A stream of the multiplexed connection, counted while open.
struct MuxStream {
    io: hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>,
    _open: OpenStream,
}

impl AsyncRead for MuxStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for MuxStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// One open stream in [`MuxInner::open`], until dropped.
struct OpenStream(Arc<std::sync::atomic::AtomicUsize>);

impl OpenStream {
    fn count(open: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(open.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The local side of a Postgres client's negotiation: answers `N` to its SSLRequest and
/// GSSENCRequest (the hop to the proxy is TLS already, and the agent does TLS to the server)
/// and returns the startup message, which the caller forwards first.
pub(crate) async fn postgres_startup<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
) -> std::io::Result<Vec<u8>> {
    crate::services::postgres::read_startup_raw(io).await
}

/// A local listener for one resource (`tsh proxy app|db|desktop`): each accepted connection is
/// carried to the resource through the proxy with [`ResourceClient`].
///
/// Postgres: the local side answers psql's SSLRequest with `N` (the hop to the proxy is TLS with
/// the user's certificate, and the agent runs TLS to the server), then forwards the startup
/// message and everything after it.
#[derive(Debug, Clone)]
pub struct LocalProxy {
    /// The resource kind.
    pub kind: ServedKind,
    /// The resource name.
    pub name: String,
    /// The database protocol (databases only).
    pub protocol: Option<DbProtocol>,
    /// The database user (`--db-user`; databases only).
    pub db_user: Option<String>,
    /// The database name (`--db-name`; databases only).
    pub db_name: Option<String>,
}

impl LocalProxy {
    /// Serves connections accepted on `listener` until `shutdown`. A connection that fails is
    /// handed to `on_error` with the client's address (`tsh` prints it for the user; the
    /// proxy's refusal text is in the error) and the loop goes on; accept errors (out of file
    /// descriptors) pause the loop briefly instead of spinning.
    pub async fn serve<F>(
        self,
        listener: TcpListener,
        client: ResourceClient,
        shutdown: CancellationToken,
        on_error: F,
    ) where
        F: Fn(SocketAddr, LocalProxyError) + Send + Sync + 'static,
    {
        let on_error = Arc::new(on_error);
        let this = Arc::new(self);
        let mut pause = Duration::from_millis(5);
        loop {
            let (sock, peer) = tokio::select! {
                () = shutdown.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(c) => {
                        pause = Duration::from_millis(5);
                        c
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?pause, "local proxy: accept failed");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                        continue;
                    }
                },
            };
            let (client, this, on_error) = (client.clone(), this.clone(), on_error.clone());
            tokio::spawn(async move {
                if let Err(e) = this.carry(sock, &client).await {
                    on_error(peer, e);
                }
            });
        }
    }

    async fn carry(&self, mut sock: TcpStream, client: &ResourceClient) -> Result<(), LocalProxyError> {
        let _ = sock.set_nodelay(true);
        let postgres = self.kind == ServedKind::Db && self.protocol.is_none_or(|p| p == DbProtocol::Postgres);
        let startup = if postgres {
            Some(
                postgres_startup(&mut sock)
                    .await
                    .map_err(LocalProxyError::Startup)?,
            )
        } else {
            None
        };
        let alpn = alpn_for(self.kind, self.protocol);
        let req = ResourceRequest {
            kind: self.kind,
            name: self.name.clone(),
            db_user: self.db_user.clone(),
            db_name: self.db_name.clone(),
        };
        let mut upstream = match client.connect_request(&req, alpn).await {
            Ok(s) => s,
            Err(e) => {
                if postgres {
                    let _ = sock.write_all(&postgres_error(&e)).await;
                }
                return Err(e.into());
            }
        };
        if let Some(startup) = startup {
            upstream
                .write_all(&startup)
                .await
                .map_err(LocalProxyError::Copy)?;
        }
        tokio::io::copy_bidirectional_with_sizes(&mut sock, &mut upstream, 64 * 1024, 64 * 1024)
            .await
            .map_err(LocalProxyError::Copy)?;
        Ok(())
    }
}

/// Why one local proxy connection ended early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalProxyError {
    /// The Postgres client's startup could not be read.
    #[error("the Postgres startup: {0}")]
    Startup(std::io::Error),
    /// The connection to the resource through the proxy failed or was refused.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Copying between the client and the resource failed.
    #[error("copying: {0}")]
    Copy(std::io::Error),
}

/// Binds `127.0.0.1:port` (0: any free port) for a [`LocalProxy`]; returns the listener and its
/// address.
pub async fn bind_local(port: u16) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

/// A Postgres `ErrorResponse` (severity FATAL, SQLSTATE 28000 for refusals, 08006 otherwise).
fn postgres_error(e: &ConnectError) -> Vec<u8> {
    use crate::services::postgres::{REFUSED, UNREACHABLE, error_response};
    let code = match e {
        ConnectError::Refused(_) => REFUSED,
        _ => UNREACHABLE,
    };
    error_response(code, &e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn postgres_negotiation_refuses_encryption_and_returns_the_startup() {
        let (mut client, mut local) = tokio::io::duplex(1024);
        let startup: Vec<u8> = {
            let params = b"\0\x03\0\0user\0alice\0\0";
            let mut m = ((params.len() + 4) as u32).to_be_bytes().to_vec();
            m.extend_from_slice(params);
            m
        };
        let sent = startup.clone();
        let client_side = tokio::spawn(async move {
            client
                .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30])
                .await
                .unwrap();
            let mut b = [0u8; 1];
            client.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"N");
            client
                .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
                .await
                .unwrap();
            client.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"N");
            client.write_all(&sent).await.unwrap();
            client
        });
        let limit = std::time::Duration::from_secs(30);
        let got = tokio::time::timeout(limit, postgres_startup(&mut local))
            .await
            .expect("the startup message was not read within 30 s");
        assert_eq!(got.unwrap(), startup);
        tokio::time::timeout(limit, client_side)
            .await
            .expect("the client side did not get its two `N` answers within 30 s")
            .unwrap();
    }

    #[test]
    fn alpn_names() {
        assert_eq!(alpn_for(ServedKind::App, None), "svc-tcp");
        assert_eq!(
            alpn_for(ServedKind::Db, Some(DbProtocol::Postgres)),
            "svc-postgres"
        );
        assert_eq!(alpn_for(ServedKind::Db, Some(DbProtocol::Redis)), "svc-redis");
        assert_eq!(alpn_for(ServedKind::WindowsDesktop, None), "svc-tcp");
    }

    #[test]
    fn refusals_become_postgres_errors() {
        let msg = postgres_error(&ConnectError::Refused("access denied to db \"pg\"".into()));
        assert_eq!(msg[0], b'E');
        let len = u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize;
        assert_eq!(len + 1, msg.len());
        let text = String::from_utf8_lossy(&msg[5..]);
        assert!(text.contains("SFATAL\0") && text.contains("C28000\0"), "{text}");
        assert!(text.contains("Maccess denied to db \"pg\"\0"), "{text}");
    }
}

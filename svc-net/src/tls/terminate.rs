//! Server-side TLS termination under a deadline: the step between `route` (which classified the
//! connection as TLS for this handler) and the handler that speaks the inner protocol.
//!
//! [`accept_before`] is the one place a TLS handshake is run on the server side; the
//! [`TlsTerminate`] Service wraps it for [`Connection`]s so a handler is written as a
//! `Service<TlsConnection>` and never sees a half-open peer. A peer that connects and stays
//! silent (or sends a ClientHello and stops) is dropped at the deadline; its classification slot
//! is held until then, so a flood of such peers is bounded by the listener's caps.

use std::{
    fmt, io,
    net::SocketAddr,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite},
    time::Instant,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_util::sync::CancellationToken;
use tower::{BoxError, Layer, Service, ServiceExt};

use crate::io::rewind::Rewind;
use crate::io::{BoxIo, ConnFuture, Connection};

/// Why a server-side TLS handshake did not produce a stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer did not finish the handshake in time (silent, slow or stalled).
    #[error(
        "TLS handshake did not finish within {after:?}: expected a complete handshake, found a peer still silent or slow at the deadline"
    )]
    Timeout {
        /// How long the handshake was given.
        after: Duration,
    },
    /// The handshake failed (not TLS, no shared version or cipher, a refused certificate).
    #[error("TLS handshake: {0}")]
    Failed(#[source] io::Error),
}

impl From<HandshakeError> for io::Error {
    fn from(e: HandshakeError) -> Self {
        match e {
            HandshakeError::Timeout { .. } => io::Error::new(io::ErrorKind::TimedOut, e),
            HandshakeError::Failed(e) => e,
        }
    }
}

/// Runs the server side of a TLS handshake on `io`, giving up at `deadline`.
pub async fn accept_before<IO>(
    acceptor: &TlsAcceptor,
    io: IO,
    deadline: Instant,
) -> Result<TlsStream<IO>, HandshakeError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let after = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout_at(deadline, acceptor.accept(io)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => Err(HandshakeError::Failed(e)),
        Err(_) => Err(HandshakeError::Timeout { after }),
    }
}

/// When a [`TlsTerminate`] handshake must be done by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeDeadline {
    /// The connection's peek deadline (set by the accept loop): classification and handshake
    /// share one budget, as on the multiplexed web port.
    PeekDeadline,
    /// A fixed time from when the handshake starts (a listener that classifies nothing, or a
    /// protocol whose detection already used the peek budget).
    Timeout(Duration),
}

impl HandshakeDeadline {
    fn at(self, conn: &Connection) -> Instant {
        match self {
            Self::PeekDeadline => conn.peek_deadline,
            Self::Timeout(d) => Instant::now() + d,
        }
    }
}

/// A connection after TLS termination, as [`TlsTerminate`] hands it to the inner service.
pub struct TlsConnection {
    /// The decrypted stream (the negotiated ALPN, SNI and client certificates are on
    /// `io.get_ref().1`).
    pub io: TlsStream<Rewind<BoxIo>>,
    /// The client's address.
    pub peer_addr: SocketAddr,
    /// The local address the client connected to.
    pub local_addr: SocketAddr,
    /// Cancelled when the server shuts down; long-lived handlers start draining then.
    pub shutdown: CancellationToken,
}

impl TlsConnection {
    /// The ALPN protocol the handshake chose, if any.
    pub fn alpn(&self) -> Option<&[u8]> {
        self.io.get_ref().1.alpn_protocol()
    }
}

impl fmt::Debug for TlsConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnection")
            .field("peer_addr", &self.peer_addr)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// Terminates TLS on each [`Connection`] under a [`HandshakeDeadline`] and hands the
/// [`TlsConnection`] to `S`. A handshake that fails or times out ends the connection with a
/// [`HandshakeError`]; `S` is never called for it.
#[derive(Clone)]
pub struct TlsTerminate<S> {
    acceptor: TlsAcceptor,
    deadline: HandshakeDeadline,
    inner: S,
}

impl<S> TlsTerminate<S> {
    /// Terminates with `config` (its ALPN list is what the handler speaks) before `deadline`.
    pub fn new(config: Arc<rustls::ServerConfig>, deadline: HandshakeDeadline, inner: S) -> Self {
        Self {
            acceptor: TlsAcceptor::from(config),
            deadline,
            inner,
        }
    }
}

impl<S> fmt::Debug for TlsTerminate<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsTerminate")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<S> Service<Connection> for TlsTerminate<S>
where
    S: Service<TlsConnection, Response = ()> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ();
    type Error = BoxError;
    type Future = ConnFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is cloned per connection and driven with `oneshot`, which honours
        // its readiness after the handshake.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, conn: Connection) -> Self::Future {
        let acceptor = self.acceptor.clone();
        let inner = self.inner.clone();
        let deadline = self.deadline.at(&conn);
        let (peer_addr, local_addr) = (conn.peer_addr, conn.local_addr);
        ConnFuture::new(async move {
            let (io, _, shutdown, slot) = conn.into_parts();
            let io = accept_before(&acceptor, io, deadline).await.inspect_err(|e| {
                tracing::debug!(peer = %peer_addr, error = %e, "TLS handshake did not complete");
            })?;
            // Past the handshake the connection no longer counts as being classified.
            drop(slot);
            let conn = TlsConnection {
                io,
                peer_addr,
                local_addr,
                shutdown,
            };
            inner.oneshot(conn).await.map_err(Into::into)
        })
    }
}

/// Wraps a service in [`TlsTerminate`] (one `rustls::ServerConfig`, one deadline).
#[derive(Clone)]
pub struct TlsTerminateLayer {
    config: Arc<rustls::ServerConfig>,
    deadline: HandshakeDeadline,
}

impl TlsTerminateLayer {
    /// A layer terminating with `config` before `deadline`.
    pub fn new(config: Arc<rustls::ServerConfig>, deadline: HandshakeDeadline) -> Self {
        Self { config, deadline }
    }
}

impl fmt::Debug for TlsTerminateLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsTerminateLayer")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for TlsTerminateLayer {
    type Service = TlsTerminate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TlsTerminate::new(self.config.clone(), self.deadline, inner)
    }
}

//! The accept loop: the first step of every connection the proxy receives.
//!
//! [`serve`] accepts TCP connections, wraps each in a [`Connection`] (a replayable stream plus
//! the peer's address and the deadline for classifying it) and hands it to a
//! `tower::Service<Connection>` — the multiplexer or router in `route`. The loop never dies on
//! one bad peer; every peek runs under a deadline; connections still being classified are capped
//! by a semaphore so silent peers cannot exhaust the proxy; shutdown stops accepting and drains.

use std::{
    error::Error as StdError,
    fmt,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::{Service, ServiceExt};

use crate::route::rewind::Rewind;

/// A boxed error, as tower services in this crate return.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// Any byte stream a handler can serve: a TCP socket, a TLS stream, an in-memory pipe.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A type-erased stream; handlers see this so that the route table has one type.
pub type BoxIo = Box<dyn Io>;

/// An accepted connection travelling through detection and routing to its handler.
pub struct Connection {
    // Declared first so it is dropped first: the classification slot is free before the peer
    // can see the socket close.
    peek_permit: Option<OwnedSemaphorePermit>,
    /// The stream; bytes peeked by detection are replayed from its front.
    pub io: Rewind<BoxIo>,
    /// The client's address: the TCP peer, or the source a trusted PROXY header named.
    pub peer_addr: SocketAddr,
    /// The local address the client connected to.
    pub local_addr: SocketAddr,
    /// When classification (PROXY header, protocol detection, ClientHello) must be done by.
    pub peek_deadline: Instant,
    /// Cancelled when the server shuts down; long-lived handlers start draining then.
    pub shutdown: CancellationToken,
}

impl Connection {
    /// Wraps a stream (for embedding and tests; [`serve`] builds these itself).
    pub fn new(io: BoxIo, peer_addr: SocketAddr, local_addr: SocketAddr, peek_timeout: Duration) -> Self {
        Self {
            io: Rewind::new(io),
            peer_addr,
            local_addr,
            peek_deadline: Instant::now() + peek_timeout,
            shutdown: CancellationToken::new(),
            peek_permit: None,
        }
    }

    /// Marks the connection classified: it no longer counts against the cap on connections
    /// being peeked. Handlers call this (the router does it before handing over).
    pub fn classified(&mut self) {
        self.peek_permit = None;
    }

    /// Takes the connection apart for a handler that consumes the stream: the stream, the peek
    /// deadline, the shutdown token, and the classification slot (drop it once classified).
    pub fn into_parts(self) -> (Rewind<BoxIo>, Instant, CancellationToken, ClassifySlot) {
        (
            self.io,
            self.peek_deadline,
            self.shutdown,
            ClassifySlot {
                _permit: self.peek_permit,
            },
        )
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("peer_addr", &self.peer_addr)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// The future of every connection service in this crate (multiplexer, router, web handler):
/// named so that stacks have one nameable type; boxed because each holds an `async` block.
pub struct ConnFuture(Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>);

impl ConnFuture {
    /// Wraps a connection-serving future.
    pub fn new(fut: impl Future<Output = Result<(), BoxError>> + Send + 'static) -> Self {
        Self(Box::pin(fut))
    }
}

impl Future for ConnFuture {
    type Output = Result<(), BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl fmt::Debug for ConnFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConnFuture")
    }
}

/// A connection's place among those being classified; dropping it frees the place.
#[derive(Debug)]
pub struct ClassifySlot {
    // Held only for its Drop, which returns the place to the semaphore.
    _permit: Option<OwnedSemaphorePermit>,
}

/// Limits of the accept loop.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ListenOptions {
    /// How long a peer has to send enough bytes to be classified (generous: slow clients exist).
    pub peek_timeout: Duration,
    /// How many connections may be in classification at once; beyond it new ones are closed.
    pub max_peeking: usize,
    /// How long shutdown waits for in-flight connections before giving up on them.
    pub drain_timeout: Duration,
}

impl Default for ListenOptions {
    fn default() -> Self {
        Self {
            peek_timeout: Duration::from_secs(15),
            max_peeking: 4096,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

impl ListenOptions {
    /// Sets [`ListenOptions::peek_timeout`].
    pub fn with_peek_timeout(mut self, timeout: Duration) -> Self {
        self.peek_timeout = timeout;
        self
    }

    /// Sets [`ListenOptions::max_peeking`].
    pub fn with_max_peeking(mut self, max: usize) -> Self {
        self.max_peeking = max;
        self
    }

    /// Sets [`ListenOptions::drain_timeout`].
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }
}

/// Accepts connections on `listener` and hands each to `service` until `shutdown` is cancelled,
/// then waits up to [`ListenOptions::drain_timeout`] for in-flight connections.
pub async fn serve<S>(listener: TcpListener, service: S, options: ListenOptions, shutdown: CancellationToken)
where
    S: Service<Connection, Response = ()> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    let peeking = Arc::new(Semaphore::new(options.max_peeking));
    let tracker = TaskTracker::new();
    let local = listener.local_addr().ok();
    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer_addr) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of descriptors or a reset before accept: back off briefly, keep serving.
                tracing::warn!(listener = ?local, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = peeking.clone().try_acquire_owned() else {
            tracing::warn!(%peer_addr, limit = options.max_peeking, "too many connections being classified; closing a new one");
            continue;
        };
        // Small answers (ping, version) must not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let local_addr = tcp.local_addr().unwrap_or(peer_addr);
        let conn = Connection {
            io: Rewind::new(Box::new(tcp)),
            peer_addr,
            local_addr,
            peek_deadline: Instant::now() + options.peek_timeout,
            shutdown: shutdown.clone(),
            peek_permit: Some(permit),
        };
        let svc = service.clone();
        tracker.spawn(async move {
            if let Err(e) = svc.oneshot(conn).await {
                let e: BoxError = e.into();
                tracing::debug!(%peer_addr, error = %e, "connection ended with an error");
            }
        });
    }
    // Close the socket first: new clients are refused at once rather than queued in the
    // backlog of a listener that will never accept them.
    drop(listener);
    tracker.close();
    tracing::info!(listener = ?local, in_flight = tracker.len(), "stopped accepting; draining");
    if tokio::time::timeout(options.drain_timeout, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(listener = ?local, left = tracker.len(), "drain timeout: abandoning connections");
    }
}

//! Byte streams as every other module sees them: an accepted [`Connection`] (the stream with
//! its peeked bytes replayable, the peer's address, the classification deadline), the boxed
//! stream type [`BoxIo`], and the one shape of connection handler, [`ConnService`].
//!
//! This module depends on nothing else in the crate: the accept loop (`listen`), the router
//! (`route`), TLS termination and every handler build on it.

pub mod relay;
pub mod rewind;
pub mod splice;

use std::{
    fmt,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::OwnedSemaphorePermit,
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tower::{BoxError, Service, ServiceExt, util::BoxCloneSyncService};

use self::rewind::Rewind;

/// Any byte stream a handler can serve: a TCP socket, a TLS stream, an in-memory pipe.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A type-erased stream; handlers see this so that the route table has one type.
pub type BoxIo = Box<dyn Io>;

/// An accepted connection travelling through detection and routing to its handler.
pub struct Connection {
    // Declared first so it is dropped first: the classification slot is free before the peer
    // can see the socket close.
    pub(crate) peek_permit: Option<OwnedSemaphorePermit>,
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
    /// Wraps a stream (for embedding and tests; [`listen::serve`](crate::listen::serve) builds these itself).
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
    pub(crate) fn new(fut: impl Future<Output = Result<(), BoxError>> + Send + 'static) -> Self {
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

/// A handler of connections: what routes and the multiplexer hand connections to.
pub type ConnService = BoxCloneSyncService<Connection, (), BoxError>;

/// Wraps any suitable service as a [`ConnService`].
pub fn conn_service<S>(svc: S) -> ConnService
where
    S: Service<Connection, Response = ()> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    BoxCloneSyncService::new(svc.map_err(Into::into))
}

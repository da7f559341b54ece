//! Idle timeouts for HTTP connections (web API over HTTP/1.1 and HTTP/2, Auth API over gRPC).
//!
//! hyper closes a connection only when its peer goes away or fails keepalive pings; a live peer
//! that sends nothing keeps its connection forever. [`IdleTracker`] counts the requests in
//! flight on one connection (from the service call until the response body is fully sent or
//! dropped) and [`IdleTracker::idle_for`] resolves once none has been in flight for the idle
//! time; the connection's driver then shuts the connection down gracefully (HTTP/2: GOAWAY).

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use tokio::{sync::Notify, time::Instant};

/// The default idle timeout of the web port's HTTP/1.1 and HTTP/2 connections.
pub const DEFAULT_WEB_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The default idle timeout of the Auth API's gRPC connections: longer than the agents' default
/// heartbeat interval (5 minutes), so a steadily beating agent keeps its connection.
pub const DEFAULT_GRPC_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Inner {
    in_flight: AtomicUsize,
    /// When the last request finished (or the connection opened).
    idle_since: Mutex<Instant>,
    changed: Notify,
}

/// Counts the requests in flight on one connection; clones share the count.
#[derive(Debug, Clone)]
pub struct IdleTracker(Arc<Inner>);

impl Default for IdleTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl IdleTracker {
    /// A tracker for a connection that has just opened (idle from now).
    pub fn new() -> Self {
        Self(Arc::new(Inner {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            changed: Notify::new(),
        }))
    }

    /// How many requests are in flight.
    pub fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::SeqCst)
    }

    /// Marks a request in flight until the returned guard is dropped.
    pub fn start(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
        InFlight(self.0.clone())
    }

    fn idle_since(&self) -> Instant {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves once no request has been in flight for `timeout`, counting idle time from
    /// `not_before` at the earliest.
    pub async fn idle_for(&self, timeout: Duration, not_before: Instant) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.in_flight() > 0 {
                changed.await;
                continue;
            }
            let deadline = self.idle_since().max(not_before) + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Wraps `svc` so that each of its requests counts as in flight until its response body
    /// ends.
    pub fn service<S>(&self, svc: S) -> Tracked<S> {
        Tracked {
            inner: svc,
            tracker: self.clone(),
        }
    }
}

/// A request in flight; dropping it ends the request (the connection's idle time restarts).
#[derive(Debug)]
pub struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// A hyper service that tracks its requests (see [`IdleTracker::service`]).
#[derive(Debug, Clone)]
pub struct Tracked<S> {
    inner: S,
    tracker: IdleTracker,
}

/// A response body that keeps its request in flight until it ends or is dropped.
#[derive(Debug)]
pub struct TrackedBody<B> {
    inner: B,
    guard: Option<InFlight>,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None)) {
            self.guard = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqB, ResB> hyper::service::Service<Request<ReqB>> for Tracked<S>
where
    S: tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Body + Unpin,
{
    type Response = Response<TrackedBody<ResB>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn call(&self, req: Request<ReqB>) -> Self::Future {
        let guard = self.tracker.start();
        let mut svc = self.inner.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await?;
            let resp = svc.call(req).await?;
            Ok(resp.map(|inner| TrackedBody {
                inner,
                guard: Some(guard),
            }))
        })
    }
}

/// A hyper server connection that can be shut down gracefully.
pub(crate) trait GracefulConn: Future<Output = Result<(), hyper::Error>> {
    /// Starts a graceful shutdown (HTTP/2: GOAWAY; HTTP/1.1: close once idle).
    fn shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> GracefulConn for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<tower::BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<tower::BoxError>,
{
    fn shutdown(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, B> GracefulConn for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<tower::BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<tower::BoxError>,
{
    fn shutdown(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, B, E> GracefulConn for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<tower::BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<tower::BoxError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn shutdown(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Drives `c` to its end: on server shutdown, or once no request has been in flight for
/// `idle_timeout`, it is shut down gracefully. A connection that stays idle for another
/// `idle_timeout` after that (a peer that never closes its side) is dropped.
pub(crate) async fn drive<C: GracefulConn>(
    mut c: Pin<&mut C>,
    tracker: &IdleTracker,
    idle_timeout: std::time::Duration,
    shutdown: &tokio_util::sync::CancellationToken,
    peer: std::net::SocketAddr,
) -> Result<(), hyper::Error> {
    let mut closing = false;
    let mut not_before = tokio::time::Instant::now();
    loop {
        tokio::select! {
            r = c.as_mut() => return r,
            () = shutdown.cancelled(), if !closing => {
                c.as_mut().shutdown();
                closing = true;
                not_before = tokio::time::Instant::now();
            }
            () = tracker.idle_for(idle_timeout, not_before) => {
                if closing {
                    tracing::debug!(%peer, "idle connection did not close after shutdown; dropped");
                    return Ok(());
                }
                tracing::debug!(%peer, idle_timeout = ?idle_timeout, "closing idle connection");
                c.as_mut().shutdown();
                closing = true;
                not_before = tokio::time::Instant::now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_fires_only_without_requests_in_flight() {
        let t = IdleTracker::new();
        let start = Instant::now();
        let guard = t.start();
        let idle = t.clone();
        let waiter = tokio::spawn(async move {
            idle.idle_for(Duration::from_secs(5), Instant::now()).await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!waiter.is_finished(), "fired while a request was in flight");
        drop(guard);
        let fired = waiter.await.expect("waiter");
        assert!(fired - start >= Duration::from_secs(25), "{:?}", fired - start);
        assert_eq!(t.in_flight(), 0);
    }
}

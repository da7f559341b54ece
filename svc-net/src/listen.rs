//! The accept loop: the first step of every connection the proxy receives.
//!
//! [`serve`] accepts TCP connections, wraps each in a [`Connection`] (a replayable stream plus
//! the peer's address and the deadline for classifying it) and hands it to a
//! `tower::Service<Connection>` — the multiplexer or router in `route`. The loop never dies on
//! one bad peer; every peek runs under a deadline; connections still being classified are capped
//! by a semaphore so silent peers cannot exhaust the proxy; all connections of a listener are
//! capped too ([`ListenOptions::max_connections`]): the excess is closed at once, established
//! connections are untouched; accept errors (EMFILE) back off instead of spinning; shutdown stops
//! accepting and drains.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use tokio::{net::TcpListener, sync::Semaphore, time::Instant};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::{Service, ServiceExt};

use tower::BoxError;

use crate::io::{BoxIo, Connection, rewind::Rewind};

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
    /// How many connections this listener serves at once (classified or not); a connection
    /// accepted beyond it is closed at once, without affecting the established ones.
    pub max_connections: usize,
}

/// The default of [`ListenOptions::max_connections`].
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = svc_core::config::DEFAULT_MAX_CONNECTIONS;

/// The first pause after a failed accept; it doubles on each further failure up to
/// [`ACCEPT_BACKOFF_MAX`] and resets on the next success.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// The longest pause between accepts after repeated failures (out of descriptors, say).
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

impl Default for ListenOptions {
    fn default() -> Self {
        Self {
            peek_timeout: Duration::from_secs(15),
            max_peeking: 4096,
            drain_timeout: Duration::from_secs(30),
            max_connections: DEFAULT_MAX_CONNECTIONS,
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

    /// Sets [`ListenOptions::max_connections`].
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max;
        self
    }

    /// Sets [`ListenOptions::drain_timeout`].
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }
}

/// A source of accepted connections: a `TcpListener`, or a fake in tests.
pub(crate) trait Accept: Send {
    /// The next connection: the stream, the peer's address and the local address.
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(BoxIo, SocketAddr, SocketAddr)>> + Send;
    /// The listening address, for logs.
    fn local(&self) -> Option<SocketAddr>;
}

impl Accept for TcpListener {
    async fn accept(&mut self) -> std::io::Result<(BoxIo, SocketAddr, SocketAddr)> {
        let (tcp, peer_addr) = TcpListener::accept(self).await?;
        // Small answers (ping, version) must not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let local_addr = tcp.local_addr().unwrap_or(peer_addr);
        Ok((Box::new(tcp), peer_addr, local_addr))
    }

    fn local(&self) -> Option<SocketAddr> {
        self.local_addr().ok()
    }
}

/// The source a per-client limit counts `ip` against: an IPv4 address (IPv4-mapped IPv6
/// included), or the `/64` of an IPv6 address, since one host usually owns a whole `/64` and
/// could otherwise pass as thousands of clients.
#[cfg_attr(not(any(feature = "tunnel", feature = "login")), allow(dead_code))]
pub(crate) fn client_source(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Accepts connections on `listener` and hands each to `service` until `shutdown` is cancelled,
/// then waits up to [`ListenOptions::drain_timeout`] for in-flight connections.
///
/// At most [`ListenOptions::max_connections`] connections are served at once and at most
/// [`ListenOptions::max_peeking`] are being classified; beyond either a new connection is closed
/// at once (with a warning) and the others carry on. An accept error is logged and retried after
/// a pause that doubles from [`ACCEPT_BACKOFF_MIN`] to [`ACCEPT_BACKOFF_MAX`].
pub async fn serve<S>(listener: TcpListener, service: S, options: ListenOptions, shutdown: CancellationToken)
where
    S: Service<Connection, Response = ()> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    accept_loop(listener, service, options, shutdown).await;
}

pub(crate) async fn accept_loop<A, S>(
    mut listener: A,
    service: S,
    options: ListenOptions,
    shutdown: CancellationToken,
) where
    A: Accept,
    S: Service<Connection, Response = ()> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    let peeking = Arc::new(Semaphore::new(options.max_peeking));
    let open = Arc::new(Semaphore::new(options.max_connections));
    let tracker = TaskTracker::new();
    let local = listener.local();
    let mut pause = ACCEPT_BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (io, peer_addr, local_addr) = match accepted {
            Ok(accepted) => {
                pause = ACCEPT_BACKOFF_MIN;
                accepted
            }
            Err(e) => {
                // Out of descriptors or a reset before accept: back off, keep serving.
                tracing::warn!(listener = ?local, error = %e, retry_in = ?pause, "accept failed");
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let Ok(held) = open.clone().try_acquire_owned() else {
            tracing::warn!(listener = ?local, %peer_addr, limit = options.max_connections, "connection cap reached; closing a new connection");
            continue;
        };
        let Ok(permit) = peeking.clone().try_acquire_owned() else {
            tracing::warn!(listener = ?local, %peer_addr, limit = options.max_peeking, "too many connections being classified; closing a new one");
            continue;
        };
        let conn = Connection {
            io: Rewind::new(io),
            peer_addr,
            local_addr,
            peek_deadline: Instant::now() + options.peek_timeout,
            shutdown: shutdown.clone(),
            peek_permit: Some(permit),
        };
        let svc = service.clone();
        tracker.spawn(async move {
            // Held until the connection is served: it counts against the cap until then.
            let _held = held;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_source_is_an_ipv4_address_or_an_ipv6_64() {
        let source = |a: &str| client_source(a.parse().unwrap()).to_string();
        assert_eq!(source("192.0.2.1"), "192.0.2.1");
        assert_eq!(source("::ffff:192.0.2.1"), "192.0.2.1");
        assert_eq!(source("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::");
        assert_eq!(
            source("2001:db8:1:2::"),
            source("2001:db8:1:2:ffff:ffff:ffff:ffff")
        );
        assert_ne!(source("2001:db8:1:2::"), source("2001:db8:1:3::"));
    }

    /// Hands out what the test pushes: accept errors or in-memory streams.
    struct Fake(tokio::sync::mpsc::UnboundedReceiver<std::io::Result<BoxIo>>);

    impl Accept for Fake {
        async fn accept(&mut self) -> std::io::Result<(BoxIo, SocketAddr, SocketAddr)> {
            let addr: SocketAddr = ([127, 0, 0, 1], 1).into();
            match self.0.recv().await {
                Some(r) => r.map(|io| (io, addr, addr)),
                None => std::future::pending().await,
            }
        }

        fn local(&self) -> Option<SocketAddr> {
            None
        }
    }

    fn emfile() -> std::io::Error {
        std::io::Error::from_raw_os_error(24)
    }

    #[tokio::test(start_paused = true)]
    async fn survives_accept_errors_with_backoff_and_caps_connections() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (served_tx, mut served) = tokio::sync::mpsc::unbounded_channel::<()>();
        let release = CancellationToken::new();
        let svc = tower::service_fn({
            let release = release.clone();
            move |_conn: Connection| {
                let served_tx = served_tx.clone();
                let release = release.clone();
                async move {
                    let _ = served_tx.send(());
                    // Hold the connection open (an established session) until released.
                    release.cancelled().await;
                    Ok::<(), BoxError>(())
                }
            }
        });
        let shutdown = CancellationToken::new();
        let opts = ListenOptions::default()
            .with_max_connections(2)
            .with_drain_timeout(Duration::from_secs(1));
        let started = Instant::now();
        let task = tokio::spawn(accept_loop(Fake(rx), svc, opts, shutdown.clone()));
        for _ in 0..4 {
            tx.send(Err(emfile())).unwrap();
        }
        let (a, _a_peer) = tokio::io::duplex(64);
        tx.send(Ok(Box::new(a))).unwrap();
        tokio::time::timeout(Duration::from_secs(10), served.recv())
            .await
            .expect("the loop serves a connection after four accept errors within 10 s")
            .expect("the service is alive");
        // Four failures pause 5 + 10 + 20 + 40 ms: the loop neither spun nor gave up.
        assert!(
            started.elapsed() >= Duration::from_millis(75),
            "expected a backoff of at least 75 ms, found {:?}",
            started.elapsed()
        );
        let (b, _b_peer) = tokio::io::duplex(64);
        tx.send(Ok(Box::new(b))).unwrap();
        tokio::time::timeout(Duration::from_secs(10), served.recv())
            .await
            .expect("the second connection is served within 10 s")
            .expect("the service is alive");
        // A third connection is over the cap: closed at once, the service never sees it.
        let (c, mut c_peer) = tokio::io::duplex(64);
        tx.send(Ok(Box::new(c))).unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read(&mut c_peer, &mut buf),
        )
        .await
        .expect("the connection over the cap is closed within 10 s")
        .expect("reading a closed duplex gives EOF");
        assert_eq!(n, 0, "expected EOF on the shed connection");
        assert!(
            served.try_recv().is_err(),
            "the shed connection must not reach the service"
        );
        // Once an established connection ends, there is room again.
        release.cancel();
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the loop drains within 10 s")
            .expect("the loop does not panic");
    }
}

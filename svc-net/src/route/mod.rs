//! TLS routing: one port, every protocol, chosen by the ClientHello.
//!
//! Sits after the accept loop (and, in multiplex mode, after [`detect`]): the [`Router`] reads
//! the ClientHello without terminating TLS ([`client_hello`]), picks a route — the SNI prefix
//! `kube-svc-proxy-alpn.` for Kubernetes, else the first of the client's ALPN names (in the
//! client's order; none counts as `http/1.1`) that a registered route serves — and hands the
//! connection, its peeked bytes replayed by [`Rewind`](crate::io::rewind::Rewind), to that route's service, which
//! terminates TLS itself. With no match the connection is closed with a log line naming the
//! protocols offered.
//!
//! The router is embeddable on its own: a product can put it in front of its own TLS server
//! (see `examples/router_in_front.rs`).

pub mod client_hello;
pub mod detect;

use std::{
    collections::HashMap,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::BytesMut;
use tower::{BoxError, Service, ServiceExt};

pub use client_hello::ClientHello;

use crate::io::{ConnFuture, ConnService, Connection};

/// The ALPN names of svc's protocols.
pub mod alpn {
    /// Agents' reverse tunnels (SSH inside TLS).
    pub const REVERSE_TUNNEL: &str = "svc-reversetunnel";
    /// SSH clients through the proxy.
    pub const PROXY_SSH: &str = "svc-proxy-ssh";
    /// Postgres clients.
    pub const POSTGRES: &str = "svc-postgres";
    /// Native Postgres clients (Postgres 17+ send it, with `sslnegotiation=direct` straight
    /// into TLS).
    pub const POSTGRES_NATIVE: &str = "postgresql";
    /// MySQL clients.
    pub const MYSQL: &str = "svc-mysql";
    /// MongoDB clients.
    pub const MONGODB: &str = "svc-mongodb";
    /// Redis clients.
    pub const REDIS: &str = "svc-redis";
    /// Raw TCP applications.
    pub const TCP: &str = "svc-tcp";
    /// Many resource connections over one TLS connection (HTTP/2 inside): local proxies
    /// (`tsh proxy app|db`); see [`services::mux`](crate::services::mux).
    pub const MUX: &str = "svc-mux";
    /// The Auth Service API through the proxy; a prefix: `svc-auth@<cluster>`.
    pub const AUTH_PREFIX: &str = "svc-auth@";
    /// The proxy's gRPC API.
    pub const PROXY_GRPC: &str = "svc-proxy-grpc";
    /// The connection-upgrade probe: served by the web API's TLS so that a client can tell
    /// the proxy itself (which negotiates it) from a load balancer that terminates TLS (which
    /// refuses it or negotiates nothing). See [`conn_upgrade`](crate::conn_upgrade).
    pub const PING: &str = "svc-ping";
    /// HTTP/2.
    pub const H2: &str = "h2";
    /// HTTP/1.1; also the route of clients that send no ALPN.
    pub const HTTP1: &str = "http/1.1";
    /// The SNI prefix that routes to the Kubernetes proxy.
    pub const KUBE_SNI_PREFIX: &str = "kube-svc-proxy-alpn.";
}

/// Registers routes, then [`build`](RouterBuilder::build)s the [`Router`].
#[derive(Clone, Default)]
pub struct RouterBuilder {
    exact: HashMap<Vec<u8>, ConnService>,
    prefixes: Vec<(Vec<u8>, ConnService)>,
    kube: Option<ConnService>,
}

impl RouterBuilder {
    /// Routes connections whose ALPN list names `protocol` to `svc` (replacing an earlier one).
    pub fn route(mut self, protocol: impl AsRef<[u8]>, svc: ConnService) -> Self {
        self.exact.insert(protocol.as_ref().to_vec(), svc);
        self
    }

    /// Routes ALPN names that start with `prefix` (`svc-auth@`) to `svc`.
    pub fn route_prefix(mut self, prefix: impl AsRef<[u8]>, svc: ConnService) -> Self {
        self.prefixes.push((prefix.as_ref().to_vec(), svc));
        self
    }

    /// Routes SNI names starting with [`alpn::KUBE_SNI_PREFIX`] to `svc`, whatever the ALPN.
    pub fn kube(mut self, svc: ConnService) -> Self {
        self.kube = Some(svc);
        self
    }

    /// Whether some route serves `protocol`.
    pub fn serves(&self, protocol: &[u8]) -> bool {
        self.exact.contains_key(protocol) || self.prefixes.iter().any(|(p, _)| protocol.starts_with(p))
    }

    /// Builds the router.
    pub fn build(self) -> Router {
        Router {
            table: Arc::new(self),
        }
    }
}

/// The TLS router: `Connection → ()`.
#[derive(Clone)]
pub struct Router {
    table: Arc<RouterBuilder>,
}

/// Why the router closed a connection without handing it over.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RouterError {
    /// The ClientHello did not arrive before the peek deadline.
    #[error("ClientHello incomplete after {0} bytes at the peek deadline")]
    Timeout(usize),
    /// The peer closed before the ClientHello was complete.
    #[error("peer closed after {0} bytes of an incomplete ClientHello")]
    Eof(usize),
    /// Reading failed.
    #[error("reading the ClientHello: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a ClientHello.
    #[error(transparent)]
    Hello(#[from] client_hello::HelloError),
    /// No route serves any protocol the client offered.
    #[error("no route for ALPN {offered} (server name {server_name:?})")]
    NoRoute {
        /// The client's ALPN list, as text.
        offered: String,
        /// The client's SNI.
        server_name: Option<String>,
    },
}

impl Router {
    /// Starts registering routes.
    pub fn builder() -> RouterBuilder {
        RouterBuilder::default()
    }

    /// The route for a parsed hello, and the protocol it was chosen by.
    pub fn select(&self, hello: &ClientHello) -> Option<(ConnService, String)> {
        let t = &self.table;
        if let (Some(kube), Some(name)) = (&t.kube, &hello.server_name)
            && name.starts_with(alpn::KUBE_SNI_PREFIX)
        {
            return Some((kube.clone(), format!("sni {name}")));
        }
        let default = [alpn::HTTP1.as_bytes().to_vec()];
        let offered: &[Vec<u8>] = if hello.alpn.is_empty() {
            &default
        } else {
            &hello.alpn
        };
        offered.iter().find_map(|proto| {
            let svc = t.exact.get(proto).or_else(|| {
                t.prefixes
                    .iter()
                    .find(|(p, _)| proto.starts_with(p))
                    .map(|(_, s)| s)
            })?;
            Some((svc.clone(), String::from_utf8_lossy(proto).into_owned()))
        })
    }
}

/// Reads the ClientHello under the connection's deadline; the bytes read are rewound.
pub(crate) async fn peek_client_hello(conn: &mut Connection) -> Result<ClientHello, RouterError> {
    let mut buf = BytesMut::with_capacity(2048);
    let result = loop {
        match client_hello::parse(&buf) {
            Ok(client_hello::Parsed::Complete(hello)) => break Ok(hello),
            Ok(client_hello::Parsed::NeedMore) => {}
            Err(e) => break Err(e.into()),
        }
        match tokio::time::timeout_at(conn.peek_deadline, conn.io.read_more(&mut buf)).await {
            Err(_) => break Err(RouterError::Timeout(buf.len())),
            Ok(Ok(0)) => break Err(RouterError::Eof(buf.len())),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => break Err(e.into()),
        }
    };
    conn.io.rewind(buf.freeze());
    result
}

impl Service<Connection> for Router {
    type Response = ();
    type Error = BoxError;
    type Future = ConnFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut conn: Connection) -> Self::Future {
        let router = self.clone();
        ConnFuture::new(async move {
            let peer = conn.peer_addr;
            let hello = match peek_client_hello(&mut conn).await {
                Ok(hello) => hello,
                Err(e) => {
                    tracing::info!(%peer, reason = %e, "TLS connection closed before routing");
                    return Err(e.into());
                }
            };
            let Some((svc, by)) = router.select(&hello) else {
                let e = RouterError::NoRoute {
                    offered: hello.alpn_display(),
                    server_name: hello.server_name,
                };
                tracing::info!(%peer, reason = %e, "TLS connection closed: no route");
                return Err(e.into());
            };
            tracing::debug!(%peer, route = %by, "routing TLS connection");
            conn.classified();
            svc.oneshot(conn).await
        })
    }
}

//! [`TcpConnector`]: plain TCP with `TCP_NODELAY`, keepalive and a connect deadline.
//!
//! The bottom of every dial: the direct route connects here, and the proxied route reaches the
//! proxy here before [`HttpConnect`](super::HttpConnect) speaks CONNECT over it.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use http::Uri;
use hyper_util::rt::TokioIo;
use socket2::{SockRef, TcpKeepalive};
use svc_core::{Addr, Host};
use tokio::net::{TcpSocket, TcpStream};
use tower::Service;

use super::{Error, connect::target_from_uri};

/// The default deadline for a TCP connect (all resolved addresses together).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The default TCP keepalive idle time: long-lived tunnels behind NAT and proxies must not be
/// dropped silently.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);

/// Connects TCP sockets with `TCP_NODELAY`, keepalive and a deadline.
#[derive(Clone, Debug)]
pub struct TcpConnector {
    connect_timeout: Duration,
    keepalive: Option<Duration>,
    overrides: Arc<HashMap<String, IpAddr>>,
}

impl Default for TcpConnector {
    fn default() -> Self {
        Self::new()
    }
}

impl TcpConnector {
    /// A connector with [`DEFAULT_CONNECT_TIMEOUT`] and [`DEFAULT_KEEPALIVE`].
    pub fn new() -> Self {
        Self {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            keepalive: Some(DEFAULT_KEEPALIVE),
            overrides: Arc::default(),
        }
    }

    /// Sets the connect deadline.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the keepalive idle time; `None` turns keepalive off.
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive = idle;
        self
    }

    /// Resolves `name` to `ip` without DNS, like curl's `--resolve` (for split-horizon setups and
    /// tests). The name is compared case-insensitively.
    pub fn resolve_override(mut self, name: &str, ip: IpAddr) -> Self {
        Arc::make_mut(&mut self.overrides).insert(name.to_ascii_lowercase(), ip);
        self
    }

    /// Connects to `addr`, trying each resolved address in turn within the deadline.
    pub async fn connect(&self, addr: &Addr) -> Result<TcpStream, Error> {
        let attempt = async {
            let candidates: Vec<SocketAddr> = match addr.host() {
                Host::Name(name) => match self.overrides.get(name) {
                    Some(ip) => vec![SocketAddr::new(*ip, addr.port())],
                    None => tokio::net::lookup_host((name.as_str(), addr.port()))
                        .await
                        .map_err(|source| Error::Io {
                            during: format!("resolving {name}"),
                            source,
                        })?
                        .collect(),
                },
                host => host
                    .ip()
                    .map(|ip| vec![SocketAddr::new(ip, addr.port())])
                    .unwrap_or_default(),
            };
            let mut last = io::Error::new(io::ErrorKind::NotFound, "no address found");
            for sa in candidates {
                match self.connect_one(sa).await {
                    Ok(stream) => return Ok(stream),
                    Err(e) => last = e,
                }
            }
            Err(Error::Io {
                during: format!("connecting to {addr}"),
                source: last,
            })
        };
        tokio::time::timeout(self.connect_timeout, attempt)
            .await
            .map_err(|_| Error::Timeout {
                during: format!("connecting to {addr}"),
                after: self.connect_timeout,
            })?
    }

    async fn connect_one(&self, sa: SocketAddr) -> io::Result<TcpStream> {
        let socket = match sa {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        // Interactive traffic (SSH keystrokes, TLS handshakes) must not wait for Nagle.
        socket.set_nodelay(true)?;
        if let Some(idle) = self.keepalive {
            SockRef::from(&socket)
                .set_tcp_keepalive(&TcpKeepalive::new().with_time(idle).with_interval(idle / 3))?;
        }
        socket.connect(sa).await
    }
}

impl Service<Addr> for TcpConnector {
    type Response = TcpStream;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<TcpStream, Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, addr: Addr) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.connect(&addr).await })
    }
}

/// As a hyper-util connector: `http://host:port` → a TCP stream to `host:port`.
impl Service<Uri> for TcpConnector {
    type Response = TokioIo<TcpStream>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let addr = target_from_uri(&uri)?;
            this.connect(&addr).await.map(TokioIo::new)
        })
    }
}

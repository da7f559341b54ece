//! [`ProxyDialer`]: the dialer agents, updaters and the proxy's outbound fetches use.
//!
//! Per target it asks the core proxy environment ([`ProxyEnv::route`]) whether to go direct or
//! through a proxy, then either connects with [`TcpConnector`] or opens a CONNECT tunnel with
//! [`HttpConnect`] over [`ProxyConnector`] (TCP to the proxy, plus TLS for `https://` proxies).
//! The caller gets one stream type, [`DialedStream`], either way.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use http::Uri;
use hyper_util::{
    client::legacy::connect::{Connected, Connection},
    rt::TokioIo,
};
use rustls::{ClientConfig, pki_types::ServerName};
use svc_core::{
    Addr,
    proxy_env::{ProxyEnv, ProxyScheme, ProxyUrl, Route},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::TlsConnector;
use tower::{Service, ServiceExt};
use tracing::{debug, warn};

use super::{
    DEFAULT_HANDSHAKE_TIMEOUT, Error, HttpConnect, TcpConnector, Tunneled, connect::target_from_uri,
};

/// TLS settings for `https://` proxies: the webpki roots plus `extra_ca_pem` (one or more PEM
/// certificates, e.g. a corporate CA) when given.
pub fn proxy_tls_config(extra_ca_pem: Option<&[u8]>) -> Result<Arc<ClientConfig>, Error> {
    let roots = crate::tls::client_roots(extra_ca_pem).map_err(|e| Error::InvalidCa {
        reason: match e {
            crate::tls::TlsError::Pem { .. } => {
                "expected at least one PEM CERTIFICATE block, found none".into()
            }
            e => format!("expected PEM CA certificates: {e}"),
        },
    })?;
    let config = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::InvalidCa {
            reason: format!("TLS settings: {e}"),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The stream to a proxy: plain TCP for `http://` proxies, TLS for `https://` ones.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProxyStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl ProxyStream {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            ProxyStream::Plain(s) => s,
            ProxyStream::Tls(s) => s.get_ref().0,
        }
    }
}

macro_rules! delegate_io {
    ($ty:ident { $($variant:ident),+ }) => {
        impl AsyncRead for $ty {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() { $($ty::$variant(s) => Pin::new(s).poll_read(cx, buf),)+ }
            }
        }
        impl AsyncWrite for $ty {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() { $($ty::$variant(s) => Pin::new(s).poll_write(cx, buf),)+ }
            }
            fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
                match self.get_mut() { $($ty::$variant(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+ }
            }
            fn is_write_vectored(&self) -> bool {
                match self { $($ty::$variant(s) => s.is_write_vectored(),)+ }
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() { $($ty::$variant(s) => Pin::new(s).poll_flush(cx),)+ }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() { $($ty::$variant(s) => Pin::new(s).poll_shutdown(cx),)+ }
            }
        }
    };
}

delegate_io!(ProxyStream { Plain, Tls });
delegate_io!(DialedStream { Direct, Proxied });

impl Connection for ProxyStream {
    fn connected(&self) -> Connected {
        self.tcp().connected()
    }
}

/// Reaches a proxy: TCP, then TLS when the proxy URI's scheme is `https`.
///
/// A `tower::Service<Uri>` for [`HttpConnect`], which calls it with `http://proxy:port` or
/// `https://proxy:port`.
#[derive(Clone)]
pub struct ProxyConnector {
    tcp: TcpConnector,
    tls: TlsConnector,
}

impl std::fmt::Debug for ProxyConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConnector")
            .field("tcp", &self.tcp)
            .finish_non_exhaustive()
    }
}

impl ProxyConnector {
    /// Connects with `tcp`; `https://` proxies are verified with `tls` (see [`proxy_tls_config`]).
    pub fn new(tcp: TcpConnector, tls: Arc<ClientConfig>) -> Self {
        Self {
            tcp,
            tls: TlsConnector::from(tls),
        }
    }

    /// Connects to the proxy at `addr`.
    pub async fn connect(&self, scheme: ProxyScheme, addr: &Addr) -> Result<ProxyStream, Error> {
        let tcp = self.tcp.connect(addr).await?;
        match scheme {
            ProxyScheme::Https => {
                let name = ServerName::try_from(addr.host_str()).map_err(|e| Error::ProxyTls {
                    proxy: addr.to_string(),
                    source: io::Error::new(io::ErrorKind::InvalidInput, e),
                })?;
                let tls = self
                    .tls
                    .connect(name, tcp)
                    .await
                    .map_err(|source| Error::ProxyTls {
                        proxy: addr.to_string(),
                        source,
                    })?;
                Ok(ProxyStream::Tls(Box::new(tls)))
            }
            _ => Ok(ProxyStream::Plain(tcp)),
        }
    }
}

impl Service<Uri> for ProxyConnector {
    type Response = TokioIo<ProxyStream>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let scheme = match uri.scheme_str() {
                Some("https") => ProxyScheme::Https,
                _ => ProxyScheme::Http,
            };
            let addr = target_from_uri(&uri)?;
            this.connect(scheme, &addr).await.map(TokioIo::new)
        })
    }
}

/// A dialed connection: direct TCP, or a CONNECT tunnel through a proxy.
#[derive(Debug)]
#[non_exhaustive]
pub enum DialedStream {
    /// Straight to the target.
    Direct(TcpStream),
    /// Through a proxy; bytes the proxy sent after its reply head are read first.
    Proxied(Tunneled<ProxyStream>),
}

impl DialedStream {
    /// Whether the connection goes through a proxy.
    pub fn is_proxied(&self) -> bool {
        matches!(self, DialedStream::Proxied(_))
    }

    /// The local TCP socket (to the target, or to the proxy).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            DialedStream::Direct(s) => s,
            DialedStream::Proxied(t) => t.get_ref().tcp(),
        }
    }
}

impl Connection for DialedStream {
    fn connected(&self) -> Connected {
        match self {
            DialedStream::Direct(s) => s.connected(),
            // hyper-util's `HttpInfo` would name the proxy as the remote address here, which is
            // misleading for the tunnelled connection; report none.
            DialedStream::Proxied(_) => Connected::new(),
        }
    }
}

/// Chooses direct or proxied per target, and dials.
///
/// Cheap to clone (shared state behind `Arc`s). Also a `tower::Service<Addr>` (→ [`DialedStream`])
/// and a `tower::Service<Uri>` (→ `TokioIo<DialedStream>`, usable as a hyper-util connector).
#[derive(Clone, Debug)]
pub struct ProxyDialer {
    env: Arc<ProxyEnv>,
    tcp: TcpConnector,
    https_proxy: Option<HttpConnect<ProxyConnector>>,
    http_proxy: Option<HttpConnect<ProxyConnector>>,
}

/// Settings for a [`ProxyDialer`].
#[derive(Debug)]
pub struct ProxyDialerBuilder {
    env: ProxyEnv,
    tcp: TcpConnector,
    extra_ca_pem: Option<Vec<u8>>,
    handshake_timeout: Duration,
}

impl ProxyDialerBuilder {
    /// The TCP connector for direct dials and for reaching the proxy.
    pub fn tcp(mut self, tcp: TcpConnector) -> Self {
        self.tcp = tcp;
        self
    }

    /// Extra CA certificates (PEM) trusted for `https://` proxies, besides the webpki roots.
    pub fn extra_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.extra_ca_pem = Some(pem.into());
        self
    }

    /// Deadline for reaching the proxy, sending CONNECT and reading its reply head.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Builds the dialer; fails on an unusable CA bundle.
    pub fn build(self) -> Result<ProxyDialer, Error> {
        for entry in self.env.no_proxy().ignored() {
            warn!(entry = %entry, "NO_PROXY entry not understood, it matches nothing");
        }
        let tls = proxy_tls_config(self.extra_ca_pem.as_deref())?;
        let connector = ProxyConnector::new(self.tcp.clone(), tls);
        let tunnel = |p: Option<&ProxyUrl>| {
            p.map(|p| HttpConnect::new(connector.clone(), p).map(|c| c.with_timeout(self.handshake_timeout)))
                .transpose()
        };
        Ok(ProxyDialer {
            https_proxy: tunnel(self.env.https_proxy())?,
            http_proxy: tunnel(self.env.http_proxy())?,
            env: Arc::new(self.env),
            tcp: self.tcp,
        })
    }
}

impl ProxyDialer {
    /// Settings from `env`, with defaults for the rest.
    pub fn builder(env: ProxyEnv) -> ProxyDialerBuilder {
        ProxyDialerBuilder {
            env,
            tcp: TcpConnector::new(),
            extra_ca_pem: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }

    /// A dialer configured from `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` (and lower case).
    pub fn from_env() -> Result<Self, Error> {
        Self::builder(ProxyEnv::from_env()?).build()
    }

    /// The proxy settings in use.
    pub fn env(&self) -> &ProxyEnv {
        &self.env
    }

    /// Which way a dial to `target` would go.
    pub fn route(&self, target: &Addr) -> Route<'_> {
        self.env.route(target)
    }

    /// Dials `target`, directly or through the proxy as [`ProxyDialer::route`] says.
    pub async fn dial(&self, target: &Addr) -> Result<DialedStream, Error> {
        let tunnel = match self.env.route(target) {
            Route::Direct => None,
            Route::Proxy(p) if self.env.https_proxy() == Some(p) => self.https_proxy.as_ref(),
            Route::Proxy(_) => self.http_proxy.as_ref(),
        };
        match tunnel {
            None => {
                debug!(%target, route = "direct", "dialing");
                self.tcp.connect(target).await.map(DialedStream::Direct)
            }
            Some(tunnel) => {
                debug!(%target, route = "proxied", proxy = %tunnel.proxy(), "dialing through HTTP CONNECT proxy");
                let tunneled = tunnel.clone().oneshot(target.clone()).await?;
                let (io, leftover) = tunneled.into_parts();
                Ok(DialedStream::Proxied(Tunneled::new(io.into_inner(), leftover)))
            }
        }
    }
}

impl Service<Addr> for ProxyDialer {
    type Response = DialedStream;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<DialedStream, Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, target: Addr) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.dial(&target).await })
    }
}

/// As a hyper-util connector: the URI's host and port (or its scheme's default port).
impl Service<Uri> for ProxyDialer {
    type Response = TokioIo<DialedStream>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let target = target_from_uri(&uri)?;
            this.dial(&target).await.map(TokioIo::new)
        })
    }
}

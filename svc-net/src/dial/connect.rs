//! [`HttpConnect`]: a connector that wraps a connector and speaks HTTP CONNECT to a proxy.
//!
//! The wrapped connector `C` reaches the proxy (plain TCP, or TLS for an `https://` proxy); this
//! layer sends `CONNECT target HTTP/1.1`, reads the reply head and hands the raw stream (with any
//! bytes the proxy sent after the head) to the caller. It is a `tower::Service<http::Uri>` whose
//! response implements hyper's `rt::Read`/`rt::Write` and hyper-util's `Connection`, so a
//! `hyper_util::client::legacy::Client` can use it unchanged.

use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::Uri;
use svc_core::{Addr, Host, Secret, proxy_env::ProxyUrl};
use tower::{Layer, Service};

use tower::BoxError;

use super::{Error, HttpConnectFuture, Tunneled};

/// The default deadline for the whole CONNECT exchange: reaching the proxy, sending the request
/// and reading the reply head (the reverse tunnel's dial-and-handshake timeout).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// What every call needs about the proxy; shared between clones.
pub(crate) struct ProxyHop {
    /// Passed to the inner connector: `http://host:port` or `https://host:port`.
    pub(crate) uri: Uri,
    /// `host:port`, for logs and errors.
    pub(crate) display: String,
    /// `Basic …`, sent only in the CONNECT request.
    pub(crate) authorization: Option<Secret>,
    pub(crate) timeout: Duration,
}

impl ProxyHop {
    fn new(proxy: &ProxyUrl, timeout: Duration) -> Result<Self, Error> {
        let uri = format!("{}://{}", proxy.scheme().as_str(), proxy.addr())
            .parse::<Uri>()
            .map_err(|e| Error::InvalidTarget {
                target: proxy.addr().to_string(),
                reason: format!("not usable as a proxy URI: {e}"),
            })?;
        Ok(Self {
            uri,
            display: proxy.addr().to_string(),
            authorization: proxy.credentials().map(|c| c.basic_authorization()),
            timeout,
        })
    }

    /// The CONNECT request for `target`. The credentials go only here: this request is read by
    /// the proxy and never forwarded to the target.
    pub(crate) fn request(&self, target: &Addr) -> Bytes {
        let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &self.authorization {
            req.push_str("Proxy-Authorization: ");
            req.push_str(auth.expose());
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        Bytes::from(req)
    }
}

/// A connector that reaches targets through an HTTP CONNECT proxy, over the connector `C`.
///
/// `C` is called with the proxy's URI (`http://proxy:3128`, or `https://…` for a TLS proxy: `C`
/// must then do the TLS, as [`ProxyConnector`](super::ProxyConnector) does). Each call to
/// `HttpConnect` with a target URI yields a [`Tunneled`] stream to that target.
#[derive(Clone)]
pub struct HttpConnect<C> {
    inner: C,
    hop: Arc<ProxyHop>,
}

impl<C> std::fmt::Debug for HttpConnect<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConnect")
            .field("proxy", &self.hop.display)
            .field("authorization", &self.hop.authorization)
            .field("timeout", &self.hop.timeout)
            .finish_non_exhaustive()
    }
}

impl<C> HttpConnect<C> {
    /// Tunnels through `proxy` over `inner`, with [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub fn new(inner: C, proxy: &ProxyUrl) -> Result<Self, Error> {
        Ok(Self {
            inner,
            hop: Arc::new(ProxyHop::new(proxy, DEFAULT_HANDSHAKE_TIMEOUT)?),
        })
    }

    /// Sets the deadline for reaching the proxy, sending CONNECT and reading the reply head.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        let hop = &*self.hop;
        self.hop = Arc::new(ProxyHop {
            uri: hop.uri.clone(),
            display: hop.display.clone(),
            authorization: hop.authorization.clone(),
            timeout,
        });
        self
    }

    /// The proxy, `host:port`.
    pub fn proxy(&self) -> &str {
        &self.hop.display
    }

    /// The wrapped connector.
    pub fn get_ref(&self) -> &C {
        &self.inner
    }
}

/// The target of a CONNECT, from a URI: host required, port from the URI or its scheme.
///
/// The host must be a DNS name or an IP address ([`Host::parse`]); anything else (an IPv6 zone
/// like `[::1%25.example.com]`) is refused rather than passed to the proxy.
pub fn target_from_uri(uri: &Uri) -> Result<Addr, Error> {
    let invalid = |reason: &str| Error::InvalidTarget {
        target: uri.to_string(),
        reason: reason.to_owned(),
    };
    let host = uri.host().ok_or_else(|| invalid("no host"))?;
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(p), _) => p,
        (None, Some("https" | "wss")) => 443,
        (None, Some("http" | "ws")) => 80,
        (None, _) => return Err(invalid("no port and no http/https scheme to imply one")),
    };
    let host = Host::parse(host).map_err(|e| invalid(e.reason()))?;
    Ok(Addr::new(host, port))
}

impl<C> Service<Uri> for HttpConnect<C>
where
    C: Service<Uri>,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin,
    C::Error: Into<BoxError>,
{
    type Response = Tunneled<C::Response>;
    type Error = Error;
    type Future = HttpConnectFuture<C::Future, C::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| connect_error(&self.hop.display, e.into()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        match target_from_uri(&dst) {
            Ok(target) => {
                let connecting = self.inner.call(self.hop.uri.clone());
                HttpConnectFuture::new(connecting, self.hop.clone(), target)
            }
            Err(e) => HttpConnectFuture::failed(e),
        }
    }
}

/// The same, for a target already parsed.
impl<C> Service<Addr> for HttpConnect<C>
where
    C: Service<Uri>,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin,
    C::Error: Into<BoxError>,
{
    type Response = Tunneled<C::Response>;
    type Error = Error;
    type Future = HttpConnectFuture<C::Future, C::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| connect_error(&self.hop.display, e.into()))
    }

    fn call(&mut self, target: Addr) -> Self::Future {
        let connecting = self.inner.call(self.hop.uri.clone());
        HttpConnectFuture::new(connecting, self.hop.clone(), target)
    }
}

/// Keeps our own errors flat when the inner connector is one of ours.
pub(crate) fn connect_error(proxy: &str, e: BoxError) -> Error {
    match e.downcast::<Error>() {
        Ok(ours) => *ours,
        Err(source) => Error::ConnectProxy {
            proxy: proxy.to_owned(),
            source,
        },
    }
}

/// A `tower::Layer` that wraps a connector in [`HttpConnect`].
#[derive(Clone)]
pub struct HttpConnectLayer {
    hop: Arc<ProxyHop>,
}

impl std::fmt::Debug for HttpConnectLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConnectLayer")
            .field("proxy", &self.hop.display)
            .finish_non_exhaustive()
    }
}

impl HttpConnectLayer {
    /// Tunnels through `proxy` with the given handshake timeout.
    pub fn new(proxy: &ProxyUrl, timeout: Duration) -> Result<Self, Error> {
        Ok(Self {
            hop: Arc::new(ProxyHop::new(proxy, timeout)?),
        })
    }
}

impl<C> Layer<C> for HttpConnectLayer {
    type Service = HttpConnect<C>;

    fn layer(&self, inner: C) -> Self::Service {
        HttpConnect {
            inner,
            hop: self.hop.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn request_bytes_carry_credentials_only_as_proxy_authorization() {
        let proxy = ProxyUrl::parse("HTTPS_PROXY", "http://alice:s3cr%3At@proxy.corp:3128").unwrap();
        let c = HttpConnect::new((), &proxy).unwrap();
        let req = c.hop.request(&Addr::parse("[2001:db8::1]:3024").unwrap());
        assert_eq!(
            std::str::from_utf8(&req).unwrap(),
            "CONNECT [2001:db8::1]:3024 HTTP/1.1\r\nHost: [2001:db8::1]:3024\r\n\
             Proxy-Authorization: Basic YWxpY2U6czNjcjp0\r\n\r\n"
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr") && !shown.contains("YWxpY2U6"), "{shown}");
        let plain = ProxyUrl::parse("HTTP_PROXY", "proxy.corp:3128").unwrap();
        let req = HttpConnect::new((), &plain)
            .unwrap()
            .hop
            .request(&Addr::parse("a.b:443").unwrap());
        assert_eq!(&req[..], b"CONNECT a.b:443 HTTP/1.1\r\nHost: a.b:443\r\n\r\n");
    }

    #[test]
    fn targets_from_uris() {
        let t = |s: &str| target_from_uri(&s.parse().unwrap());
        assert_eq!(
            t("https://Proxy.Example.com/x").unwrap().to_string(),
            "proxy.example.com:443"
        );
        assert_eq!(t("http://10.0.0.1/").unwrap().to_string(), "10.0.0.1:80");
        assert_eq!(t("http://[::1]:3080").unwrap().to_string(), "[::1]:3080");
        assert_eq!(t("tcp://example.com:3024").unwrap().port(), 3024);
        assert!(t("tcp://example.com").is_err());
        assert!(t("/relative").is_err());
        if let Ok(uri) = "https://[::1%25.example.com]/".parse::<Uri>() {
            assert!(target_from_uri(&uri).is_err());
        }
    }
}

//! [`HttpClient`]: hyper-util's legacy `Client` over `hyper-rustls` over a connector, with
//! deadlines and a body cap.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, Uri, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::Connection},
    rt::{TokioExecutor, TokioTimer},
};
use tower::{BoxError, Service};

use super::error::{HttpError, HttpErrorKind, chain};
use crate::dial::ProxyDialer;

/// How long connecting may take by default: TCP, the proxy's CONNECT and the TLS handshake.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a whole request may take by default: connecting, sending, the answer and its body.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The most body bytes read from an answer by default.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// The request body the client sends: the whole body in memory (`Full::default()` for none).
pub type RequestBody = Full<Bytes>;

/// What the client dials with: a hyper-util connector (`tower::Service<Uri>` yielding a hyper
/// IO that reports its [`Connection`] details). [`ProxyDialer`], svc's
/// [`TcpConnector`](crate::dial::TcpConnector) and hyper-util's `HttpConnector` (with
/// `enforce_http(false)`: TLS is added above it) all are. Implemented for every type that
/// qualifies.
pub trait Connector:
    Service<
        Uri,
        Response: hyper::rt::Read + hyper::rt::Write + Connection + Send + Unpin + 'static,
        Error: Into<BoxError>,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<C> Connector for C
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Connection + Send + Unpin + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
}

/// The connect deadline ran out (found in the hyper-util error's causes).
#[derive(Debug, thiserror::Error)]
#[error("no connection within {0:?}")]
struct ConnectTimedOut(Duration);

/// Bounds a connector's connect (TCP, CONNECT and TLS when wrapping the TLS connector).
#[derive(Clone)]
struct TimedConnect<C> {
    inner: C,
    after: Duration,
}

impl<C> Service<Uri> for TimedConnect<C>
where
    C: Service<Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let after = self.after;
        Box::pin(async move {
            match tokio::time::timeout(after, connecting).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimedOut(after)) as BoxError),
            }
        })
    }
}

struct Settings {
    timeout: Duration,
    connect_timeout: Duration,
    max_body: usize,
    user_agent: HeaderValue,
}

/// svc's HTTP(S) client: hyper-util's pooled `Client` over TLS over connector `C` (by default
/// the environment-aware [`ProxyDialer`]).
///
/// `https://` URLs are verified with the `rustls::ClientConfig` given to
/// [`HttpClient::builder`] (e.g. [`tls::client_config`](crate::tls::client_config) with the
/// cluster's CA); `http://` URLs go over the connector as they are. Cheap to clone: clones share
/// the connection pool.
///
/// Also a `tower::Service<Request<RequestBody>>` answering `Response<Bytes>`.
pub struct HttpClient<C = ProxyDialer> {
    client: Client<TimedConnect<HttpsConnector<C>>, RequestBody>,
    settings: Arc<Settings>,
}

impl<C: Clone> Clone for HttpClient<C> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<C> std::fmt::Debug for HttpClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("connect_timeout", &self.settings.connect_timeout)
            .field("timeout", &self.settings.timeout)
            .field("max_body", &self.settings.max_body)
            .finish_non_exhaustive()
    }
}

/// Settings for an [`HttpClient`]; [`build`](Self::build) over a connector, or
/// [`from_env`](Self::from_env) over the environment's [`ProxyDialer`].
pub struct HttpClientBuilder {
    tls: Arc<rustls::ClientConfig>,
    connect_timeout: Duration,
    timeout: Duration,
    max_body: usize,
    user_agent: HeaderValue,
    http2: bool,
    pool_max_idle_per_host: usize,
    pool_idle_timeout: Duration,
}

impl std::fmt::Debug for HttpClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClientBuilder")
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .field("http2", &self.http2)
            .field("pool_max_idle_per_host", &self.pool_max_idle_per_host)
            .field("pool_idle_timeout", &self.pool_idle_timeout)
            .finish_non_exhaustive()
    }
}

impl HttpClient<ProxyDialer> {
    /// Settings for a client verifying `https://` servers with `tls`, with the defaults:
    /// [`DEFAULT_CONNECT_TIMEOUT`], [`DEFAULT_TIMEOUT`], [`DEFAULT_MAX_BODY`], HTTP/1.1, idle
    /// connections kept for 30 s.
    pub fn builder(tls: Arc<rustls::ClientConfig>) -> HttpClientBuilder {
        HttpClientBuilder {
            tls,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            max_body: DEFAULT_MAX_BODY,
            user_agent: HeaderValue::from_static(concat!("svc/", env!("CARGO_PKG_VERSION"))),
            http2: false,
            pool_max_idle_per_host: usize::MAX,
            pool_idle_timeout: Duration::from_secs(30),
        }
    }

    /// A client with the default settings over the environment's [`ProxyDialer`]
    /// (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`).
    pub fn from_env(tls: Arc<rustls::ClientConfig>) -> Result<Self, crate::dial::Error> {
        Self::builder(tls).from_env()
    }
}

impl HttpClientBuilder {
    /// The deadline for connecting: TCP (or the proxy's CONNECT) and the TLS handshake.
    pub fn connect_timeout(mut self, after: Duration) -> Self {
        self.connect_timeout = after;
        self
    }

    /// The deadline for a whole request: connecting, sending, the answer and its body.
    pub fn timeout(mut self, after: Duration) -> Self {
        self.timeout = after;
        self
    }

    /// The most body bytes read from an answer; a larger body is
    /// [`HttpErrorKind::BodyTooLarge`].
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The `User-Agent` sent when a request has none (`svc/<version>` by default).
    pub fn user_agent(mut self, agent: HeaderValue) -> Self {
        self.user_agent = agent;
        self
    }

    /// Offer HTTP/2 as well in TLS (ALPN `h2`, `http/1.1`); HTTP/1.1 only by default.
    pub fn http2(mut self, enabled: bool) -> Self {
        self.http2 = enabled;
        self
    }

    /// How many idle connections per host the pool keeps; `0` closes each connection after its
    /// answer (for rare requests, where a kept connection would only hold the server's slot).
    pub fn pool_max_idle_per_host(mut self, max: usize) -> Self {
        self.pool_max_idle_per_host = max;
        self
    }

    /// How long an idle pooled connection is kept.
    pub fn pool_idle_timeout(mut self, after: Duration) -> Self {
        self.pool_idle_timeout = after;
        self
    }

    /// The client over the environment's [`ProxyDialer`] (`HTTPS_PROXY`, `HTTP_PROXY`,
    /// `NO_PROXY`); fails when those cannot be used.
    pub fn from_env(self) -> Result<HttpClient<ProxyDialer>, crate::dial::Error> {
        Ok(self.build(ProxyDialer::from_env()?))
    }

    /// The client over `connector` (a [`ProxyDialer`] built by hand, a plain TCP connector).
    pub fn build<C: Connector>(self, connector: C) -> HttpClient<C> {
        // ALPN is set here, whatever the given configuration says: svc's proxy routes TLS by
        // ALPN, and an HTTP/1 client must not inherit `h2` from a shared configuration.
        let mut tls = (*self.tls).clone();
        tls.alpn_protocols = if self.http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        // `https://` through rustls, `http://` straight over the connector.
        let https = HttpsConnector::from((connector, tls));
        let connector = TimedConnect {
            inner: https,
            after: self.connect_timeout,
        };
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(self.pool_max_idle_per_host)
            .pool_idle_timeout(self.pool_idle_timeout)
            .build(connector);
        HttpClient {
            client,
            settings: Arc::new(Settings {
                timeout: self.timeout,
                connect_timeout: self.connect_timeout,
                max_body: self.max_body,
                user_agent: self.user_agent,
            }),
        }
    }
}

impl<C: Connector> HttpClient<C> {
    /// `GET url`: the answer with its whole body (any status; check it).
    pub async fn get(&self, url: &str) -> Result<Response<Bytes>, HttpError> {
        let uri: Uri = match url.parse() {
            Ok(uri) => uri,
            Err(_) => {
                // Not a URI at all: name it as given, user info cut off by hand.
                let shown = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
                let uri = Uri::try_from(shown).unwrap_or_default();
                return Err(HttpError::new(&Method::GET, &uri, HttpErrorKind::Url));
            }
        };
        let mut req = Request::new(RequestBody::default());
        *req.uri_mut() = uri;
        self.send(req).await
    }

    /// Sends `req` (an absolute `http://` or `https://` URI) and reads the answer's whole body,
    /// within the client's deadlines and body cap. Adds `User-Agent` when missing; `Host` comes
    /// from the URI.
    pub async fn send(&self, mut req: Request<RequestBody>) -> Result<Response<Bytes>, HttpError> {
        let (method, uri) = (req.method().clone(), req.uri().clone());
        let fail = |kind| HttpError::new(&method, &uri, kind);
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none_or(str::is_empty) {
            return Err(fail(HttpErrorKind::Url));
        }
        if !req.headers().contains_key(header::USER_AGENT) {
            req.headers_mut()
                .insert(header::USER_AGENT, self.settings.user_agent.clone());
        }
        let max_body = self.settings.max_body;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| fail(classify(&e)))?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, max_body)
                .collect()
                .await
                .map_err(|e| {
                    fail(if e.is::<LengthLimitError>() {
                        HttpErrorKind::BodyTooLarge(max_body)
                    } else {
                        HttpErrorKind::Body(chain(e.as_ref(), false))
                    })
                })?
                .to_bytes();
            Ok(Response::from_parts(parts, body))
        };
        let after = self.settings.timeout;
        match tokio::time::timeout(after, exchange).await {
            Ok(result) => result,
            Err(_) => Err(fail(HttpErrorKind::Timeout(after))),
        }
    }
}

/// Sorts a hyper-util client error: the connect deadline, a failed TLS handshake, a failed
/// connect, or a failed exchange; the message is the chain of causes (hyper-util's own "client error (Connect)" left
/// out).
fn classify(e: &hyper_util::client::legacy::Error) -> HttpErrorKind {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(ConnectTimedOut(after)) = c.downcast_ref::<ConnectTimedOut>() {
            return HttpErrorKind::ConnectTimeout(*after);
        }
        if let Some(tls) = rustls_error(c) {
            return HttpErrorKind::Tls(tls.to_string());
        }
        cause = c.source();
    }
    let reason = chain(e, true);
    if e.is_connect() {
        HttpErrorKind::Connect(reason)
    } else {
        HttpErrorKind::Request(reason)
    }
}

/// The rustls error inside `e`: hyper-rustls and tokio-rustls report a failed handshake as an
/// `io::Error` around an `io::Error` around it (`io::Error::source` skips the wrapped error).
fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner: &(dyn std::error::Error + 'static) = e.downcast_ref::<std::io::Error>()?.get_ref()?;
    rustls_error(inner)
}

impl<C: Connector> Service<Request<RequestBody>> for HttpClient<C> {
    type Response = Response<Bytes>;
    type Error = HttpError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HttpError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<RequestBody>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.send(req).await })
    }
}

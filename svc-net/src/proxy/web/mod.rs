//! The web API: HTTPS on hyper, HTTP/1.1 and HTTP/2 by ALPN.
//!
//! Sits behind the router's `http/1.1` and `h2` routes (or directly behind the web listener):
//! [`WebHandler`] terminates TLS (advertising `http/1.1` before `h2`), then serves [`WebApi`]:
//! services mounted under path prefixes — the ping ([`ping::PingService`]), sign-in
//! ([`login`]), the version server ([`version`]), the Web UI's sessions and APIs
//! (`session`, `api`, `terminal`) — then the Web UI itself (`ui`, feature `web-ui`: `/` and
//! `/web/…`), and JSON errors `{"error":{"message":…}}` for everything else.

#[cfg(feature = "node")]
pub mod api;
#[cfg(feature = "services")]
pub mod app_access;
#[cfg(feature = "login")]
pub mod login;
pub mod ping;
#[cfg(feature = "node")]
pub mod session;
#[cfg(feature = "login")]
pub mod sso;
#[cfg(feature = "node")]
pub mod terminal;
#[cfg(feature = "web-ui")]
pub mod ui;
pub mod upgrade;
pub mod version;

use std::{
    convert::Infallible,
    future::{Future, Ready, ready},
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tower::{BoxError, Service, util::BoxCloneSyncService};

use crate::io::{ConnFuture, Connection};
use crate::tls::{HandshakeDeadline, TlsConnection, TlsTerminate};

/// The request body handlers receive.
pub type Body = hyper::body::Incoming;
/// The response body handlers return.
pub type ResponseBody = BoxBody<Bytes, BoxError>;
/// A mounted HTTP service.
pub type WebService = BoxCloneSyncService<Request<Body>, Response<ResponseBody>, Infallible>;

/// Wraps any suitable service as a [`WebService`].
pub fn web_service<S>(svc: S) -> WebService
where
    S: Service<Request<Body>, Response = Response<ResponseBody>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    BoxCloneSyncService::new(svc)
}

/// A response with a fixed body.
pub fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// A JSON error `{"error":{"message":…}}` with `status`.
pub(crate) fn json_error(status: StatusCode, message: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({ "error": { "message": message } }).to_string();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn request_host_header<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
}

/// The request's host name (HTTP/2 `:authority` or HTTP/1.1 `Host`), port removed, lowercase.
pub(crate) fn request_host<B>(req: &Request<B>) -> Option<String> {
    let host = request_host_header(req)?;
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(']') && port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host.as_str(),
    };
    Some(name.trim_end_matches('.').to_ascii_lowercase())
}

/// The app named by `host` under `public_host`: one DNS label before `.<public_host>`.
pub(crate) fn app_of_host(host: &str, public_host: &str) -> Option<String> {
    let host = host.to_ascii_lowercase();
    let label = host.strip_suffix(public_host)?.strip_suffix('.')?;
    (!label.is_empty() && !label.contains('.')).then(|| label.to_owned())
}

/// The routes of the web API.
#[derive(Clone, Default)]
pub struct WebApi {
    mounts: Vec<(String, WebService)>,
    app_hosts: Option<(String, WebService)>,
}

impl WebApi {
    /// A web API with nothing mounted (every path answers 404).
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves every path starting with `prefix` with `svc` (checked in mounting order).
    pub fn mount(mut self, prefix: impl Into<String>, svc: WebService) -> Self {
        self.mounts.push((prefix.into(), svc));
        self
    }

    /// Serves every request whose host is `<label>.<public_host>` (one DNS label, port
    /// ignored) with `svc`, whatever the path: browser app access
    /// ([`app_access`](crate::proxy::web)). Other hosts go to the mounted paths.
    pub fn app_hosts(mut self, public_host: impl Into<String>, svc: WebService) -> Self {
        self.app_hosts = Some((public_host.into().to_ascii_lowercase(), svc));
        self
    }
}

/// The per-request service: `Arc`ed so cloning it per connection is cheap.
#[derive(Clone)]
pub struct WebApiService {
    api: Arc<WebApi>,
    client: Option<ClientAddr>,
    upgraded: Option<UpgradedTask>,
}

/// Where the connection upgrade ([`upgrade`]) leaves the task serving an upgraded stream, so
/// that the web connection's own task lasts as long as that stream: the listener's connection
/// cap and shutdown drain count it. Put in each request's extensions by [`WebHttp`].
#[derive(Clone, Default)]
pub(crate) struct UpgradedTask(Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>);

impl UpgradedTask {
    /// Records the task serving the upgraded stream.
    pub(crate) fn set(&self, task: tokio::task::JoinHandle<()>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(task);
        }
    }

    fn take(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

impl WebApiService {
    /// Wraps the routes.
    pub fn new(api: WebApi) -> Self {
        Self {
            api: Arc::new(api),
            client: None,
            upgraded: None,
        }
    }

    /// The same routes for one connection from `client`: each request carries it as a
    /// [`ClientAddr`] extension.
    pub fn for_client(&self, client: SocketAddr) -> Self {
        Self {
            api: self.api.clone(),
            client: Some(ClientAddr(client)),
            upgraded: None,
        }
    }

    fn with_upgraded(mut self, slot: UpgradedTask) -> Self {
        self.upgraded = Some(slot);
        self
    }
}

/// The client's address of a web request (after a trusted PROXY protocol header, the address it
/// names), put in the request's extensions for mounted services such as the sign-in handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// The future of [`WebApiService`]: ready for built-in routes, boxed for mounted services.
pub enum WebFuture {
    /// A response computed in place.
    Ready(Ready<Result<Response<ResponseBody>, Infallible>>),
    /// A mounted service's future.
    Mounted(Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, Infallible>> + Send>>),
}

impl Future for WebFuture {
    type Output = Result<Response<ResponseBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            WebFuture::Ready(r) => Pin::new(r).poll(cx),
            WebFuture::Mounted(f) => f.as_mut().poll(cx),
        }
    }
}

impl WebApiService {
    fn route(&self, mut req: Request<Body>) -> WebFuture {
        if let Some(client) = self.client {
            req.extensions_mut().insert(client);
        }
        if let Some(slot) = &self.upgraded {
            req.extensions_mut().insert(slot.clone());
        }
        let api = &self.api;
        if let Some((public_host, svc)) = &api.app_hosts
            && request_host(&req).is_some_and(|h| app_of_host(&h, public_host).is_some())
        {
            let mut svc = svc.clone();
            return WebFuture::Mounted(Box::pin(async move {
                std::future::poll_fn(|cx| svc.poll_ready(cx)).await?;
                svc.call(req).await
            }));
        }
        let path = req.uri().path();
        if let Some((_, svc)) = api
            .mounts
            .iter()
            .find(|(prefix, _)| path.starts_with(prefix.as_str()))
        {
            let mut svc = svc.clone();
            return WebFuture::Mounted(Box::pin(async move {
                std::future::poll_fn(|cx| svc.poll_ready(cx)).await?;
                svc.call(req).await
            }));
        }
        // The Web UI: after the mounted services, so no mount is shadowed by it.
        #[cfg(feature = "web-ui")]
        if let Some(resp) = ui::respond(&req) {
            return WebFuture::Ready(ready(Ok(resp)));
        }
        let msg = format!("not found: {path}");
        WebFuture::Ready(ready(Ok(json_error(StatusCode::NOT_FOUND, &msg))))
    }
}

impl Service<Request<Body>> for WebApiService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = WebFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        self.route(req)
    }
}

impl hyper::service::Service<Request<Body>> for WebApiService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = WebFuture;

    fn call(&self, req: Request<Body>) -> Self::Future {
        self.route(req)
    }
}

/// How long an HTTP/1.1 client has to send a request head (the first one, and each one after
/// on a kept-alive connection: an idle HTTP/1.1 connection is closed after this long, or after
/// the web idle timeout when that is shorter).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How often an HTTP/2 connection is pinged, and how long the peer has to answer: a dead or
/// unresponsive HTTP/2 peer is closed after at most twice this long.
pub const H2_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(30);

/// The ALPN names the web API advertises, in the server's order of preference; the last is
/// the connection-upgrade probe ([`alpn::PING`](crate::route::alpn::PING)), whose client
/// closes once the handshake is done.
pub(crate) const WEB_ALPN: [&str; 3] = ["http/1.1", "h2", crate::route::alpn::PING];

/// Terminates TLS (under the connection's peek deadline) and serves [`WebApi`] on each
/// connection: `Connection → ()`.
#[derive(Clone)]
pub struct WebHandler(TlsTerminate<WebHttp>);

/// Serves [`WebApi`] over HTTP/1.1 or HTTP/2 (by ALPN) on a terminated TLS connection.
#[derive(Clone)]
pub(crate) struct WebHttp {
    api: WebApiService,
    idle_timeout: std::time::Duration,
}

/// Why a web connection ended early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum WebError {
    /// Serving HTTP failed.
    #[error("serving HTTP: {0}")]
    Http(#[from] hyper::Error),
}

impl WebHandler {
    /// A handler presenting `tls` (its ALPN list should be [`WEB_ALPN`]), closing a connection
    /// gracefully once no request has been in flight on it for `idle_timeout` (HTTP/2: GOAWAY;
    /// HTTP/1.1: the kept-alive connection is closed, at the latest after
    /// [`HEADER_READ_TIMEOUT`]). The Proxy Service's default is
    /// [`DEFAULT_WEB_IDLE_TIMEOUT`](crate::idle::DEFAULT_WEB_IDLE_TIMEOUT).
    pub(crate) fn with_idle_timeout(
        api: WebApi,
        tls: Arc<rustls::ServerConfig>,
        idle_timeout: std::time::Duration,
    ) -> Self {
        Self(TlsTerminate::new(
            tls,
            HandshakeDeadline::PeekDeadline,
            WebHttp {
                api: WebApiService::new(api),
                idle_timeout,
            },
        ))
    }
}

impl WebHttp {
    async fn serve(self, conn: TlsConnection) -> Result<(), WebError> {
        let tracker = crate::idle::IdleTracker::new();
        let upgraded = UpgradedTask::default();
        let api = tracker.service(
            self.api
                .for_client(conn.peer_addr)
                .with_upgraded(upgraded.clone()),
        );
        let h2 = conn.alpn() == Some(b"h2");
        let (shutdown, peer) = (conn.shutdown, conn.peer_addr);
        let io = TokioIo::new(conn.io);
        if h2 {
            // Keepalive pings close an HTTP/2 connection whose peer died or went silent; the idle
            // timeout closes a live one that has had no stream open for that long.
            let c = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(H2_KEEPALIVE))
                .keep_alive_timeout(H2_KEEPALIVE)
                .serve_connection(io, api);
            tokio::pin!(c);
            crate::idle::drive(c, &tracker, self.idle_timeout, &shutdown, peer).await?;
        } else {
            // A client that completes TLS and then sends no request head is cut off rather than
            // holding a connection forever; so is a kept-alive one that sends no next request.
            let c = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT.min(self.idle_timeout))
                .serve_connection(io, api)
                // The connection upgrade (`/webapi/connectionupgrade`) takes the stream over.
                .with_upgrades();
            tokio::pin!(c);
            crate::idle::drive(c, &tracker, self.idle_timeout, &shutdown, peer).await?;
        }
        // An upgraded connection lives on in its own task: this connection ends with it.
        if let Some(task) = upgraded.take() {
            let _ = task.await;
        }
        Ok(())
    }
}

impl Service<TlsConnection> for WebHttp {
    type Response = ();
    type Error = BoxError;
    type Future = ConnFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, conn: TlsConnection) -> Self::Future {
        let this = self.clone();
        let peer = conn.peer_addr;
        ConnFuture::new(async move {
            this.serve(conn).await.map_err(|e| {
                tracing::debug!(%peer, error = %e, "web connection ended");
                e.into()
            })
        })
    }
}

impl Service<Connection> for WebHandler {
    type Response = ();
    type Error = BoxError;
    type Future = ConnFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, conn: Connection) -> Self::Future {
        self.0.call(conn)
    }
}

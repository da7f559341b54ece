//! Browser app access: web apps served per subdomain of the proxy's public address.
//!
//! Data flow: a signed-in user asks for an app session (`POST /webapi/sessions/app`,
//! [`AppAccess::create`]) → the proxy checks that the user's roles allow the app and answers
//! `https://<app>.<proxy host>:<port>/x-svc-auth?token=<one-time>` → the browser follows it;
//! the token (single use, [`TOKEN_TTL`]) becomes the app-session cookie [`APP_COOKIE`]
//! (host-only on the app's subdomain) and a redirect to `/` → every later request on that host
//! with the cookie is forwarded to the app through the agent's tunnel, with every identity
//! header a client sent removed ([`is_identity_header`]) and [`JWT_HEADER`] set to a JWT the
//! Auth Service signs with the cluster's JWT key. The verification keys are served at
//! [`JWKS_PATH`].
//!
//! An app session lasts as long as the user's certificate at most; on each request the user's
//! roles, locks and existence are checked again (the proxy's decisions over its watched view),
//! and the web session it came from must still be live (logout ends its app sessions).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use svc_core::auth::ServedKind;
use tower::BoxError;

use super::{
    Body, ClientAddr, ResponseBody, WebService, app_of_host, full, json_error, request_host,
    request_host_header, web_service,
};
use crate::auth::FailoverClient;
use crate::proxy::app_http::is_identity_header;
use crate::proxy::cache::RouteResolver;
use crate::tunnel::{DialRequest, TunnelDialer};

/// The path the one-time token is exchanged at, on the app's host.
pub const AUTH_PATH: &str = "/x-svc-auth";
/// The app-session cookie.
pub const APP_COOKIE: &str = "svc_app_session";
/// The header carrying the JWT to the app.
pub const JWT_HEADER: &str = "svc-jwt-assertion";
/// Where the JWT verification keys are served on the web port.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";
/// Where a signed-in user asks for an app session.
pub const SESSIONS_PATH: &str = "/webapi/sessions/app";
/// How long a one-time token may wait to be exchanged.
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// A JWT with less than this left is replaced before a request is forwarded.
const JWT_REFRESH: Duration = Duration::from_secs(60);

/// Whether the web session an app session came from is still live (checked on every request).
pub type Liveness = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// Authenticates a request to [`SESSIONS_PATH`] (its headers: the web session cookie and the
/// CSRF token) and names the signed-in user, or refuses it (401/403 with the reason).
pub type SignedIn = Arc<
    dyn Fn(http::HeaderMap) -> BoxFuture<'static, Result<AppSessionUser, (StatusCode, String)>> + Send + Sync,
>;

/// [`SignedIn`] over the proxy's web sessions: the request's `svc_session` cookie and CSRF
/// token ([`WebSessions::authenticate`](super::session::WebSessions::authenticate)); the app
/// session lives while that web session does (logout, lock, deletion or expiry end it).
#[cfg(feature = "node")]
pub fn signed_in_with(sessions: super::session::WebSessions) -> SignedIn {
    use super::session::{COOKIE_NAME, WebError};
    Arc::new(move |headers: http::HeaderMap| {
        let sessions = sessions.clone();
        Box::pin(async move {
            let user = sessions
                .authenticate(&headers, true)
                .await
                .map_err(|e: WebError| (e.status(), e.to_string()))?;
            let chain = user.identity.tls_parts().map_err(|e| {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the web session's certificate: {e}"),
                )
            })?;
            let cert_der = chain.0.first().map(|c| c.to_vec()).ok_or_else(|| {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the web session holds no certificate".to_owned(),
                )
            })?;
            // Only the web session's cookie is kept, to ask whether it is still live.
            let mut only_cookie = http::HeaderMap::new();
            if let Some(id) = super::session::cookie(&headers, COOKIE_NAME)
                && let Ok(v) = HeaderValue::from_str(&format!("{COOKIE_NAME}={id}"))
            {
                only_cookie.insert(header::COOKIE, v);
            }
            let only_cookie = Arc::new(only_cookie);
            let live: Liveness = Arc::new(move || {
                let (sessions, headers) = (sessions.clone(), only_cookie.clone());
                Box::pin(async move { sessions.authenticate(&headers, false).await.is_ok() })
            });
            Ok(AppSessionUser {
                username: user.username.clone(),
                cert_der,
                expires: user.expires,
                live,
            })
        })
    })
}

/// The signed-in user an app session is for.
#[derive(Clone)]
pub struct AppSessionUser {
    /// The user name.
    pub username: String,
    /// The user's certificate (DER): the proxy presents it to the Auth Service.
    pub cert_der: Vec<u8>,
    /// When the certificate (and so the app session) ends.
    pub expires: SystemTime,
    /// Whether the web session is still live.
    pub live: Liveness,
}

impl std::fmt::Debug for AppSessionUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppSessionUser")
            .field("username", &self.username)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// What browser app access needs.
#[non_exhaustive]
pub struct AppAccessConfig {
    /// The proxy's public host name: apps are `<app>.<public_host>`.
    pub public_host: String,
    /// The web port browsers reach (0: set later with [`AppAccess::set_public_port`]).
    pub public_port: u16,
    /// The Auth Service (signs JWTs, serves the JWKS), as the proxy.
    pub auth: Arc<FailoverClient>,
    /// Decides whether a user may reach an app, and where it is.
    pub routes: RouteResolver,
    /// Reaches agents.
    pub dialer: TunnelDialer,
}

impl AppAccessConfig {
    /// The configuration.
    pub fn new(
        public_host: impl Into<String>,
        public_port: u16,
        auth: Arc<FailoverClient>,
        routes: RouteResolver,
        dialer: TunnelDialer,
    ) -> Self {
        Self {
            public_host: public_host.into().to_ascii_lowercase(),
            public_port,
            auth,
            routes,
            dialer,
        }
    }
}

struct Pending {
    app: String,
    user: AppSessionUser,
    until: SystemTime,
}

struct AppSession {
    app: String,
    user: AppSessionUser,
    jwt: Option<(String, SystemTime)>,
}

struct Inner {
    config: AppAccessConfig,
    port: std::sync::atomic::AtomicU16,
    tokens: Mutex<HashMap<String, Pending>>,
    sessions: Mutex<HashMap<String, AppSession>>,
}

/// Browser app access. Cheap to clone.
#[derive(Clone)]
pub struct AppAccess {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AppAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppAccess")
            .field("public_host", &self.inner.config.public_host)
            .finish_non_exhaustive()
    }
}

/// A refusal: status and message.
type Refusal = (StatusCode, String);

fn random_id() -> Result<String, Refusal> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(|_| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "no randomness for a session ID".to_owned(),
        )
    })?;
    Ok(hex::encode(bytes))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl AppAccess {
    /// Browser app access with `config`.
    pub fn new(config: AppAccessConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                port: std::sync::atomic::AtomicU16::new(config.public_port),
                config,
                tokens: Mutex::new(HashMap::new()),
                sessions: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Sets the web port browsers reach (once the listener is bound).
    pub fn set_public_port(&self, port: u16) {
        self.inner.port.store(port, std::sync::atomic::Ordering::Relaxed);
    }

    fn public_port(&self) -> u16 {
        self.inner.port.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The public host suffix apps live under (`<app>.<this>`).
    pub fn public_host(&self) -> &str {
        &self.inner.config.public_host
    }

    /// The app a request's host names (`<app>.<public host>`, port ignored), if any.
    pub fn app_of_host(&self, host: &str) -> Option<String> {
        app_of_host(host, &self.inner.config.public_host)
    }

    /// Starts an app session for `user` on `app`: the user's roles must allow it (403
    /// otherwise) and it must be an HTTP(S) app. Returns the URL the browser follows.
    pub async fn create(&self, user: AppSessionUser, app: &str) -> Result<String, Refusal> {
        let cfg = &self.inner.config;
        if app.is_empty() || !app.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("app: {app:?} cannot be a host name label (letters, digits and '-' only)"),
            ));
        }
        let route = match cfg
            .routes
            .resolve_resource(ServedKind::App, app, &user.cert_der)
            .await
        {
            Ok(Ok(route)) => route,
            Ok(Err(denied)) => return Err((StatusCode::FORBIDDEN, denied)),
            Err(e) => return Err((StatusCode::BAD_GATEWAY, format!("asking the Auth Service: {e}"))),
        };
        if !matches!(route.resource.protocol.as_str(), "http" | "https") {
            return Err((
                StatusCode::BAD_REQUEST,
                format!(
                    "app \"{app}\" is a {} app: only HTTP(S) apps open in the browser (use tsh proxy app)",
                    route.resource.protocol
                ),
            ));
        }
        let token = random_id()?;
        let now = SystemTime::now();
        let mut tokens = lock(&self.inner.tokens);
        tokens.retain(|_, p| p.until > now);
        tokens.insert(
            token.clone(),
            Pending {
                app: app.to_owned(),
                user,
                until: now + TOKEN_TTL,
            },
        );
        Ok(format!(
            "https://{app}.{}:{}{AUTH_PATH}?token={token}",
            cfg.public_host,
            self.public_port()
        ))
    }

    /// The service for requests whose host is an app's (`<app>.<public host>`).
    pub fn app_service(&self) -> WebService {
        let this = self.clone();
        web_service(tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move { Ok::<_, Infallible>(this.serve_app(req).await) }
        }))
    }

    /// The service for `POST` [`SESSIONS_PATH`] with body `{"app":"<name>"}`: `signed_in`
    /// authenticates the request (web session cookie and CSRF token) and names the user; the
    /// answer is `{"url":"…"}` ([`AppAccess::create`]).
    pub fn sessions_service(&self, signed_in: SignedIn) -> WebService {
        let this = self.clone();
        web_service(tower::service_fn(move |req: Request<Body>| {
            let (this, signed_in) = (this.clone(), signed_in.clone());
            async move {
                Ok::<_, Infallible>(match this.create_from_request(&signed_in, req).await {
                    Ok(url) => {
                        let body = serde_json::json!({ "url": url }).to_string();
                        let mut resp = Response::new(full(body));
                        resp.headers_mut()
                            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                        resp.headers_mut()
                            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                        resp
                    }
                    Err((status, msg)) => json_error(status, &msg),
                })
            }
        }))
    }

    async fn create_from_request(&self, signed_in: &SignedIn, req: Request<Body>) -> Result<String, Refusal> {
        if req.uri().path() != SESSIONS_PATH {
            return Err((StatusCode::NOT_FOUND, format!("not found: {}", req.uri().path())));
        }
        if req.method() != Method::POST {
            return Err((
                StatusCode::METHOD_NOT_ALLOWED,
                format!("use POST on {SESSIONS_PATH}"),
            ));
        }
        let user = signed_in(req.headers().clone()).await?;
        let bytes = http_body_util::Limited::new(req.into_body(), 16 * 1024)
            .collect()
            .await
            .map_err(|e| (StatusCode::BAD_REQUEST, format!("reading the request body: {e}")))?
            .to_bytes();
        #[derive(serde::Deserialize)]
        struct CreateBody {
            app: String,
        }
        let body: CreateBody = serde_json::from_slice(&bytes).map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("app: expected a body {{\"app\":\"<name>\"}}: {e}"),
            )
        })?;
        let url = self.create(user.clone(), &body.app).await?;
        tracing::info!(user = %user.username, app = %body.app, "app session started");
        Ok(url)
    }

    /// The service for [`JWKS_PATH`]: the cluster's JWT verification keys.
    pub fn jwks_service(&self) -> WebService {
        let auth = self.inner.config.auth.clone();
        web_service(tower::service_fn(move |req: Request<Body>| {
            let auth = auth.clone();
            async move {
                if req.uri().path() != JWKS_PATH {
                    return Ok(json_error(StatusCode::NOT_FOUND, "not found"));
                }
                let jwks = async {
                    let mut client = auth.client().await?;
                    client.jwks().await
                }
                .await;
                Ok::<_, Infallible>(match jwks {
                    Ok(jwks) => {
                        let mut resp = Response::new(full(serde_json::to_vec(&jwks).unwrap_or_default()));
                        resp.headers_mut()
                            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                        resp
                    }
                    Err(e) => {
                        if FailoverClient::is_transport_failure(&e) {
                            auth.reset().await;
                        }
                        json_error(
                            StatusCode::BAD_GATEWAY,
                            &format!("asking the Auth Service for the JWT keys: {e}"),
                        )
                    }
                })
            }
        }))
    }

    /// Ends every app session of `username` (its user signed out, was locked or deleted).
    pub fn end_user(&self, username: &str) {
        lock(&self.inner.sessions).retain(|_, s| s.user.username != username);
        lock(&self.inner.tokens).retain(|_, p| p.user.username != username);
    }

    async fn serve_app(&self, req: Request<Body>) -> Response<ResponseBody> {
        let Some(app) = request_host(&req).and_then(|h| self.app_of_host(&h)) else {
            return json_error(StatusCode::NOT_FOUND, "not an app's host");
        };
        if req.uri().path() == AUTH_PATH {
            return self.exchange(&app, &req);
        }
        let Some(id) = cookie(req.headers(), APP_COOKIE) else {
            return json_error(
                StatusCode::UNAUTHORIZED,
                &format!("no app session for app \"{app}\": open the app from the Web UI"),
            );
        };
        match self.forward(&app, &id, req).await {
            Ok(resp) => resp,
            Err((status, msg)) => json_error(status, &msg),
        }
    }

    /// `/x-svc-auth?token=…`: the token (single use) becomes the app-session cookie.
    fn exchange(&self, app: &str, req: &Request<Body>) -> Response<ResponseBody> {
        if req.method() != Method::GET {
            return json_error(StatusCode::METHOD_NOT_ALLOWED, "use GET on /x-svc-auth");
        }
        let token = req
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .find_map(|kv| kv.strip_prefix("token="))
            .unwrap_or_default();
        let now = SystemTime::now();
        let pending = lock(&self.inner.tokens).remove(token);
        let pending = match pending {
            Some(p) if p.app == app && p.until > now && p.user.expires > now => p,
            _ => {
                return json_error(
                    StatusCode::FORBIDDEN,
                    &format!("invalid, used or expired app token for app \"{app}\""),
                );
            }
        };
        let id = match random_id() {
            Ok(id) => id,
            Err((status, msg)) => return json_error(status, &msg),
        };
        let max_age = pending
            .user
            .expires
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
            .as_secs();
        {
            let mut sessions = lock(&self.inner.sessions);
            sessions.retain(|_, s| s.user.expires > now);
            sessions.insert(
                id.clone(),
                AppSession {
                    app: app.to_owned(),
                    user: pending.user,
                    jwt: None,
                },
            );
        }
        let cookie = format!("{APP_COOKIE}={id}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={max_age}");
        let mut resp = Response::new(full(""));
        *resp.status_mut() = StatusCode::FOUND;
        resp.headers_mut()
            .insert(header::LOCATION, HeaderValue::from_static("/"));
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().insert(header::SET_COOKIE, v);
        }
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }

    /// Checks the app session `id` for `app` and forwards the request to the app.
    async fn forward(
        &self,
        app: &str,
        id: &str,
        mut req: Request<Body>,
    ) -> Result<Response<ResponseBody>, Refusal> {
        let cfg = &self.inner.config;
        let now = SystemTime::now();
        let (user, cached_jwt) = {
            let sessions = lock(&self.inner.sessions);
            let Some(s) = sessions.get(id) else {
                return Err((
                    StatusCode::UNAUTHORIZED,
                    format!(
                        "the app session for app \"{app}\" is unknown or has ended: open the app from the Web UI again"
                    ),
                ));
            };
            if s.app != app {
                return Err((
                    StatusCode::FORBIDDEN,
                    format!("this app session is not for app \"{app}\""),
                ));
            }
            (s.user.clone(), s.jwt.clone())
        };
        let ended = |why: &str| {
            lock(&self.inner.sessions).remove(id);
            (
                StatusCode::UNAUTHORIZED,
                format!("the app session for app \"{app}\" ended: {why}"),
            )
        };
        if user.expires <= now {
            return Err(ended("the user's certificate expired"));
        }
        if !(user.live)().await {
            return Err(ended("the web session ended"));
        }
        // Roles, locks and the user's existence, as now.
        let route = match cfg
            .routes
            .resolve_resource(ServedKind::App, app, &user.cert_der)
            .await
        {
            Ok(Ok(route)) => route,
            Ok(Err(denied)) => {
                lock(&self.inner.sessions).remove(id);
                return Err((StatusCode::FORBIDDEN, denied));
            }
            Err(e) => return Err((StatusCode::BAD_GATEWAY, format!("asking the Auth Service: {e}"))),
        };
        let jwt = match cached_jwt {
            Some((jwt, until)) if until > now + JWT_REFRESH => jwt,
            _ => {
                let signed = async {
                    let mut client = cfg.auth.client().await?;
                    client.sign_app_jwt(&user.cert_der, app).await
                }
                .await;
                match signed {
                    Ok(Ok((jwt, until))) => {
                        if let Some(s) = lock(&self.inner.sessions).get_mut(id) {
                            s.jwt = Some((jwt.clone(), until));
                        }
                        jwt
                    }
                    Ok(Err(denied)) => {
                        lock(&self.inner.sessions).remove(id);
                        return Err((StatusCode::FORBIDDEN, denied));
                    }
                    Err(e) => {
                        if FailoverClient::is_transport_failure(&e) {
                            cfg.auth.reset().await;
                        }
                        return Err((
                            StatusCode::BAD_GATEWAY,
                            format!("asking the Auth Service for the app's JWT: {e}"),
                        ));
                    }
                }
            }
        };
        let client = req.extensions().get::<ClientAddr>().map(|c| c.0);
        prepare_request(&mut req, &jwt, client).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
        let dial = DialRequest {
            address: app.to_owned(),
            server_id: route.server_id.clone(),
            conn_type: ServedKind::App,
            client_src_addr: client.map(|c| c.to_string()).unwrap_or_default(),
            client_dst_addr: format!("{}:{}", cfg.public_host, self.public_port()),
            db_route: None,
        };
        let stream = cfg
            .dialer
            .dial(dial)
            .await
            .map_err(|e| (StatusCode::BAD_GATEWAY, format!("app \"{app}\": {e}")))?;
        tracing::debug!(user = %user.username, app, agent = %route.server_id, path = %req.uri().path(), "app request");
        send(req, stream)
            .await
            .map_err(|e| (StatusCode::BAD_GATEWAY, format!("app \"{app}\": {e}")))
    }
}

/// Sends `req` over `stream` (HTTP/1.1) and relays an upgrade (WebSocket) both ways.
async fn send<S>(mut req: Request<Body>, stream: S) -> Result<Response<ResponseBody>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Body>(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP to the app: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "app upstream connection ended");
        }
    });
    let upgrade = req.headers().contains_key(header::UPGRADE);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("HTTP to the app: {e}"))?;
    if let Some(client_upgrade) = client_upgrade
        && resp.status() == StatusCode::SWITCHING_PROTOCOLS
    {
        let app_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, app_upgrade) {
                Ok((c, a)) => {
                    let (mut c, mut a) = (TokioIo::new(c), TokioIo::new(a));
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut a).await;
                }
                Err(e) => tracing::debug!(error = %e, "app upgrade failed"),
            }
        });
    }
    Ok(resp.map(|b| b.map_err(BoxError::from).boxed()))
}

/// Readies a browser's request for the app: origin-form URI, `Host` kept, every identity
/// header the client sent removed, the app-session cookie removed, [`JWT_HEADER`] and
/// `X-Forwarded-For` set.
pub(crate) fn prepare_request(
    req: &mut Request<Body>,
    jwt: &str,
    client: Option<SocketAddr>,
) -> Result<(), String> {
    let host = request_host_header(req);
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    *req.uri_mut() = path.parse().map_err(|e| format!("request path: {e}"))?;
    *req.version_mut() = http::Version::HTTP_11;
    strip_identity(req.headers_mut());
    let headers = req.headers_mut();
    if let Some(host) = host
        && let Ok(v) = HeaderValue::from_str(&host)
    {
        headers.insert(header::HOST, v);
    }
    let jwt = HeaderValue::from_str(jwt).map_err(|e| format!("JWT header: {e}"))?;
    headers.insert(HeaderName::from_static(JWT_HEADER), jwt);
    if let Some(c) = client
        && let Ok(v) = HeaderValue::from_str(&c.ip().to_canonical().to_string())
    {
        headers.insert(HeaderName::from_static("x-forwarded-for"), v);
    }
    Ok(())
}

/// Removes identity headers ([`is_identity_header`]) and the app-session cookie.
pub(crate) fn strip_identity(headers: &mut http::HeaderMap) {
    let owned: Vec<HeaderName> = headers
        .keys()
        .filter(|k| is_identity_header(k.as_str()))
        .cloned()
        .collect();
    for name in owned {
        headers.remove(&name);
    }
    let cookies: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.split('=').next() != Some(APP_COOKIE))
        .map(str::to_owned)
        .collect();
    headers.remove(header::COOKIE);
    if !cookies.is_empty()
        && let Ok(v) = HeaderValue::from_str(&cookies.join("; "))
    {
        headers.insert(header::COOKIE, v);
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::proxy::web::{app_of_host, request_host};

    #[test]
    fn hosts_name_one_app_label_under_the_public_host() {
        assert_eq!(
            app_of_host("grafana.proxy.example.com", "proxy.example.com").as_deref(),
            Some("grafana")
        );
        assert_eq!(
            app_of_host("Grafana.Proxy.Example.com", "proxy.example.com").as_deref(),
            Some("grafana")
        );
        assert_eq!(app_of_host("proxy.example.com", "proxy.example.com"), None);
        assert_eq!(app_of_host("a.b.proxy.example.com", "proxy.example.com"), None);
        assert_eq!(app_of_host("evilproxy.example.com", "proxy.example.com"), None);
        let req = Request::builder()
            .header("host", "Grafana.proxy.example.com:3080")
            .body(())
            .unwrap();
        assert_eq!(request_host(&req).as_deref(), Some("grafana.proxy.example.com"));
    }

    #[test]
    fn identity_headers_and_the_app_cookie_never_reach_the_app() {
        let mut h = http::HeaderMap::new();
        h.insert("svc-jwt-assertion", HeaderValue::from_static("forged"));
        h.insert("x-forwarded-user", HeaderValue::from_static("admin"));
        h.insert("x-svc-user", HeaderValue::from_static("admin"));
        h.append("cookie", HeaderValue::from_static("a=1; svc_app_session=secret"));
        h.append("cookie", HeaderValue::from_static("b=2"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        assert_eq!(cookie(&h, APP_COOKIE).as_deref(), Some("secret"));
        strip_identity(&mut h);
        assert!(
            !h.contains_key("svc-jwt-assertion")
                && !h.contains_key("x-forwarded-user")
                && !h.contains_key("x-svc-user")
        );
        assert_eq!(h.get_all("cookie").iter().collect::<Vec<_>>(), ["a=1; b=2"]);
        assert_eq!(h["accept"], "*/*");
    }
}

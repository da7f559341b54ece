//! Web sessions: `POST|GET|DELETE /webapi/sessions/web`, the `svc_session` cookie and CSRF.
//!
//! Data flow: the browser posts the user name and password → the proxy generates a key pair and
//! signs the user in at the Auth Service exactly as `tsh login` does through `/webapi/login`
//! (`Login` with the proxy's host identity: password check, lockout, the user's address for the
//! per-address limit) → the user's certificates and private keys stay in this process, in the
//! session; the browser receives an opaque session id (256 bits from the OS random number
//! generator) in a `Secure; HttpOnly; SameSite=Strict` cookie and a CSRF token in the body.
//!
//! Every later request is checked by [`WebSessions::authenticate`]: the session must exist in
//! this process (sessions live in memory only: a restarted proxy knows none), its certificate
//! must not have expired, and the proxy's watched view of the cluster (the in-process Auth
//! Service's backend, or the watched cache of a proxy apart) must not say the user was deleted
//! or locked — checked on each request, so `tctl lock` and `tctl users rm` end open sessions.
//! State-changing requests also carry `X-CSRF-Token`. Calls to the Auth Service on the user's
//! behalf use the user's own certificate ([`WebUser::auth_client`]), so the Auth Service
//! enforces the user's roles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use ring::rand::SecureRandom;
use svc_core::Secret;
use svc_core::webapi::{
    SSO_RESPONSE_PARAM, SSO_SECRET_KEY_PARAM, SSO_WEB_BEGIN_PATH, SSO_WEB_RETURN_PATH, SsoResult,
};

use super::login::{SignInCallError, call_auth};
use super::{Body, ResponseBody, WebService, full, json_error, web_service};
use crate::auth::{AuthClient, ClientError, ClientIdentity, FailoverClient, KeyMaterial, proto};
use crate::proxy::cache::ProxyDecisions;

/// The path of the web session API.
pub const SESSIONS_PATH: &str = "/webapi/sessions/web";
/// The name of the session cookie.
pub const COOKIE_NAME: &str = "svc_session";
/// The header carrying the CSRF token on state-changing requests.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How many bytes of OS randomness a session id and a CSRF token hold (256 bits each).
pub const TOKEN_BYTES: usize = 32;
/// At most this many live sessions per proxy process; a sign-in beyond it is refused (503).
pub const MAX_SESSIONS: usize = 10_000;
/// The cookie binding a single sign-on to the browser that started it.
pub const SSO_BINDING_COOKIE: &str = "svc_sso_web";
/// How long a browser has to finish a single sign-on at its provider.
pub const SSO_WEB_TTL: Duration = Duration::from_secs(600);
/// At most this many unfinished single sign-ons per proxy process.
pub const MAX_PENDING_SSO: usize = 1_000;
/// At most this many unfinished single sign-ons per client address, so that one client cannot
/// fill [`MAX_PENDING_SSO`] and make everyone else wait; one more is refused (429).
pub const MAX_PENDING_SSO_PER_ADDR: usize = 20;
/// Where the browser goes once signed in.
const WEB_UI_HOME: &str = "/web/";
/// The paths under which [`WebSessions::service`] also serves the Web UI's single sign-on.
pub const SSO_WEB_PREFIX: &str = "/webapi/sso/web/";
/// Requests larger than this are refused (a sign-in body is well under 1 KiB).
const MAX_BODY: usize = 16 * 1024;

/// Why a web request was refused; [`into_response`](Self::into_response) makes it the JSON
/// error with the matching status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    /// No session, an unknown or ended one (401).
    #[error("{0}")]
    Unauthenticated(String),
    /// A state-changing request without the session's CSRF token (403).
    #[error("missing or invalid CSRF token")]
    Csrf,
    /// The Auth Service (or the proxy's rules) refused; the message says why (403).
    #[error("{0}")]
    Forbidden(String),
    /// The request is malformed; the message names the field (400).
    #[error("{0}")]
    BadRequest(String),
    /// The thing asked for does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The change conflicts with the current state (409).
    #[error("{0}")]
    Conflict(String),
    /// Too many failed sign-ins: the lockout (429).
    #[error("{0}")]
    TooManyRequests(String),
    /// The Auth Service could not be reached or the proxy is at a limit (503).
    #[error("{0}")]
    Unavailable(String),
    /// The Auth Service failed the call (502).
    #[error("{0}")]
    Upstream(String),
}

impl WebError {
    /// The HTTP status of this refusal.
    pub fn status(&self) -> StatusCode {
        match self {
            WebError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            WebError::Csrf | WebError::Forbidden(_) => StatusCode::FORBIDDEN,
            WebError::BadRequest(_) => StatusCode::BAD_REQUEST,
            WebError::NotFound(_) => StatusCode::NOT_FOUND,
            WebError::Conflict(_) => StatusCode::CONFLICT,
            WebError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            WebError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            WebError::Upstream(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The JSON error response `{"error":{"message":…}}`.
    pub fn into_response(self) -> Response<ResponseBody> {
        json_error(self.status(), &self.to_string())
    }

    /// An Auth Service answer as a web refusal: its message with the status its code means.
    pub fn from_auth(e: ClientError) -> Self {
        let message = e.to_string();
        match e.code() {
            Some(tonic::Code::Unauthenticated) => WebError::Unauthenticated(message),
            Some(tonic::Code::PermissionDenied) => WebError::Forbidden(message),
            Some(tonic::Code::InvalidArgument) => WebError::BadRequest(message),
            Some(tonic::Code::NotFound) => WebError::NotFound(message),
            Some(tonic::Code::AlreadyExists) | Some(tonic::Code::FailedPrecondition) => {
                WebError::Conflict(message)
            }
            Some(tonic::Code::ResourceExhausted) => WebError::TooManyRequests(message),
            Some(tonic::Code::Unavailable) | None => {
                WebError::Unavailable(format!("the Auth Service is unavailable: {message}"))
            }
            Some(_) => WebError::Upstream(message),
        }
    }
}

/// A signed-in web user, as [`WebSessions::authenticate`] found the session.
#[derive(Clone)]
pub struct WebUser {
    /// The user name.
    pub username: String,
    /// The user's role names (from the certificate).
    pub roles: Vec<String>,
    /// When the session ends: the certificate's expiry.
    pub expires: SystemTime,
    /// The OS logins the certificate allows over SSH (placeholders starting with `-` removed).
    pub logins: Vec<String>,
    /// The user's client identity (certificates and private keys) for Auth calls and SSH.
    pub identity: Arc<ClientIdentity>,
    /// Where the Auth Service is reached with [`identity`](Self::identity).
    auth_addrs: Arc<[String]>,
    /// The session's connected Auth client, shared by its requests.
    client: Arc<tokio::sync::Mutex<Option<AuthClient>>>,
}

impl std::fmt::Debug for WebUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The identity holds private keys: never printed.
        f.debug_struct("WebUser")
            .field("username", &self.username)
            .field("roles", &self.roles)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl WebUser {
    /// An Auth API client presenting the user's own certificate (connected once per session,
    /// then shared): the Auth Service decides every call by the user's roles.
    pub async fn auth_client(&self) -> Result<AuthClient, WebError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let (client, _) = AuthClient::connect_any(&self.auth_addrs, &self.identity, None)
            .await
            .map_err(WebError::from_auth)?;
        Ok(slot.insert(client).clone())
    }

    /// Forgets the session's Auth connection after a transport failure: the next call
    /// connects again.
    pub async fn reset_auth_client(&self) {
        *self.client.lock().await = None;
    }

    /// Runs `call` with the user's Auth client; a transport failure resets the connection
    /// (the next call connects again) and is reported as 503.
    pub async fn with_auth<T, F, Fut>(&self, call: F) -> Result<T, WebError>
    where
        F: FnOnce(AuthClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let client = self.auth_client().await?;
        match call(client).await {
            Ok(v) => Ok(v),
            Err(e) => {
                if FailoverClient::is_transport_failure(&e) {
                    self.reset_auth_client().await;
                }
                Err(WebError::from_auth(e))
            }
        }
    }
}

/// One live session.
struct Session {
    user: WebUser,
    csrf: String,
}

/// The web sessions of this proxy process (shared: clones see the same sessions).
#[derive(Clone)]
pub struct WebSessions {
    inner: Arc<Inner>,
}

struct Inner {
    /// Signs users in (the proxy's host identity).
    link: Arc<FailoverClient>,
    /// Where a user's own Auth client connects.
    auth_addrs: Arc<[String]>,
    /// The proxy's watched view: whether a user was deleted or locked.
    decisions: Arc<ProxyDecisions>,
    /// How long a sign-in may wait for the Auth Service.
    deadline: Option<Duration>,
    /// Sessions by the SHA-256 of their id (the lookup never compares the secret itself).
    sessions: Mutex<HashMap<[u8; 32], Session>>,
    /// Single sign-ons the Web UI started here, by the SHA-256 of their id.
    pending_sso: Mutex<HashMap<[u8; 32], PendingSso>>,
    rng: ring::rand::SystemRandom,
}

/// A single sign-on started by [`WebSessions`] for a browser: the keys the certificates will
/// be issued for and the key the result comes back sealed with. Both stay in this process.
struct PendingSso {
    /// The address of the client that started it (`None`: not known to the handler).
    addr: Option<std::net::IpAddr>,
    keys: KeyMaterial,
    secret_key: Secret,
    started: std::time::Instant,
}

impl std::fmt::Debug for WebSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSessions")
            .field("auth_addrs", &self.inner.auth_addrs)
            .field("sessions", &self.len())
            .finish_non_exhaustive()
    }
}

/// The body of `POST /webapi/sessions/web`.
#[derive(serde::Deserialize)]
struct SignInBody {
    user: String,
    pass: Secret,
}

/// The answer of `POST` and `GET /webapi/sessions/web`.
#[derive(serde::Serialize)]
struct SessionAnswer<'a> {
    user: &'a str,
    roles: &'a [String],
    expires: String,
    csrf_token: &'a str,
}

/// `t` in RFC 3339 (UTC).
pub fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn session_key(id: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// Equal in time independent of where they differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` among the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

impl WebSessions {
    /// Sessions signing users in through `link` (the proxy's host identity), giving each user
    /// an Auth client to `auth_addrs`, and ending them by `decisions`' view of users and locks.
    /// With a `deadline`, a sign-in the Auth Service does not answer in time fails with 503.
    pub fn new(
        link: Arc<FailoverClient>,
        auth_addrs: Vec<String>,
        decisions: Arc<ProxyDecisions>,
        deadline: Option<Duration>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                link,
                auth_addrs: auth_addrs.into(),
                decisions,
                deadline,
                sessions: Mutex::new(HashMap::new()),
                pending_sso: Mutex::new(HashMap::new()),
                rng: ring::rand::SystemRandom::new(),
            }),
        }
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.sessions().len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A fresh random token: [`TOKEN_BYTES`] from the OS, URL-safe base64.
    fn token(&self) -> Result<String, WebError> {
        let mut bytes = [0u8; TOKEN_BYTES];
        self.inner
            .rng
            .fill(&mut bytes)
            .map_err(|_| WebError::Unavailable("the OS random number generator failed".into()))?;
        Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }

    /// The signed-in user of the request's `svc_session` cookie, if the session is live: known
    /// to this process, not expired, its user neither deleted nor locked (ended otherwise), and
    /// with `require_csrf`, the request's `X-CSRF-Token` is the session's.
    pub async fn authenticate(&self, headers: &HeaderMap, require_csrf: bool) -> Result<WebUser, WebError> {
        self.session(headers, require_csrf).await.map(|(user, _)| user)
    }

    async fn session(&self, headers: &HeaderMap, require_csrf: bool) -> Result<(WebUser, String), WebError> {
        let id = cookie(headers, COOKIE_NAME).ok_or_else(|| {
            WebError::Unauthenticated(format!(
                "not signed in: no {COOKIE_NAME} cookie (sign in with POST {SESSIONS_PATH})"
            ))
        })?;
        let key = session_key(id);
        let (user, csrf) = {
            let sessions = self.sessions();
            let s = sessions.get(&key).ok_or_else(|| {
                WebError::Unauthenticated("the web session has ended or is unknown: sign in again".into())
            })?;
            (s.user.clone(), s.csrf.clone())
        };
        if SystemTime::now() >= user.expires {
            self.sessions().remove(&key);
            return Err(WebError::Unauthenticated(format!(
                "the web session of {} expired at {}: sign in again",
                user.username,
                rfc3339(user.expires)
            )));
        }
        match self.inner.decisions.user_revoked(&user.username).await {
            Ok(None) => {}
            Ok(Some(reason)) => {
                self.sessions().remove(&key);
                tracing::info!(user = %user.username, %reason, "web session ended");
                return Err(WebError::Unauthenticated(format!(
                    "the web session has ended: {reason}"
                )));
            }
            Err(e) => {
                return Err(WebError::Unavailable(format!(
                    "checking the session of {} against the cluster's users and locks: {e}",
                    user.username
                )));
            }
        }
        if require_csrf {
            let given = headers
                .get(CSRF_HEADER)
                .map(HeaderValue::as_bytes)
                .unwrap_or_default();
            if !ct_eq(given, csrf.as_bytes()) {
                return Err(WebError::Csrf);
            }
        }
        Ok((user, csrf))
    }

    /// Signs `user` in at the Auth Service (as `tsh login` does) and starts a session: its id
    /// and the user.
    async fn sign_in(
        &self,
        user: String,
        pass: Secret,
        client_addr: String,
    ) -> Result<(String, Session), WebError> {
        let keys = KeyMaterial::generate()
            .map_err(|e| WebError::Unavailable(format!("generating the session's keys: {e}")))?;
        let ssh_public_key = keys
            .ssh_public_key_line()
            .map_err(|e| WebError::Unavailable(format!("encoding the session's SSH key: {e}")))?;
        let request = proto::LoginRequest {
            username: user.clone(),
            password: pass.into_inner(),
            tls_public_key: keys.tls_public_key(),
            ssh_public_key,
            ttl_seconds: 0,
            client_addr,
        };
        let certs = self
            .call_auth(|mut auth| async move { auth.raw().login(request).await.map_err(ClientError::from) })
            .await
            .map_err(|e| match e {
                // The Auth Service refuses a locked-out sign-in as "permission denied"; to the
                // browser it is the lockout (429), whatever the password.
                WebError::Forbidden(message) if message.contains(" is locked after ") => {
                    WebError::TooManyRequests(message)
                }
                e => e,
            })?
            .into_inner();
        self.start_session(keys, certs)
    }

    /// Calls the Auth Service with the proxy's own identity under the sign-in deadline
    /// ([`call_auth`]: the link is reset after a missed deadline or a transport failure); its
    /// refusal as a web error.
    async fn call_auth<T, F, Fut>(&self, call: F) -> Result<T, WebError>
    where
        F: FnOnce(AuthClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        call_auth(&self.inner.link, self.inner.deadline, call)
            .await
            .map_err(|e| match e {
                e @ SignInCallError::Deadline { .. } => WebError::Unavailable(e.to_string()),
                SignInCallError::Auth(e) => WebError::from_auth(e),
            })
    }

    /// A session for the certificates the Auth Service issued for `keys` (checked against the
    /// cluster's CAs before anything is kept): its id and the session.
    fn start_session(&self, keys: KeyMaterial, certs: proto::Certs) -> Result<(String, Session), WebError> {
        let user = certs.name.clone();
        let mut identity = keys
            .into_identity_from_proto(certs)
            .map_err(|e| WebError::Upstream(format!("the Auth Service's certificates for {user}: {e}")))?;
        identity.auth_addr = self.inner.auth_addrs.first().cloned().unwrap_or_default();
        let verified = identity
            .verifier()
            .and_then(|v| Ok((v, identity.tls_parts()?.0)))
            .map_err(|e| e.to_string())
            .and_then(|(v, chain)| {
                v.verify_user_x509(&chain, SystemTime::now())
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| WebError::Upstream(format!("the Auth Service's certificate for {user}: {e}")))?;
        let id = self.token()?;
        let csrf = self.token()?;
        let session = Session {
            user: WebUser {
                username: verified.username,
                roles: verified.roles,
                expires: verified.validity.not_after,
                logins: verified
                    .logins
                    .into_iter()
                    .filter(|l| !l.starts_with('-'))
                    .collect(),
                identity: Arc::new(identity),
                auth_addrs: self.inner.auth_addrs.clone(),
                client: Arc::default(),
            },
            csrf,
        };
        Ok((id, session))
    }

    /// Keeps `session` under `id`, dropping expired sessions first; refused at [`MAX_SESSIONS`].
    fn insert(&self, id: &str, session: Session) -> Result<(), WebError> {
        let mut sessions = self.sessions();
        let now = SystemTime::now();
        sessions.retain(|_, s| s.user.expires > now);
        if sessions.len() >= MAX_SESSIONS {
            return Err(WebError::Unavailable(format!(
                "this proxy holds {MAX_SESSIONS} web sessions already: try again later"
            )));
        }
        sessions.insert(session_key(id), session);
        Ok(())
    }

    /// Ends the session of the request's cookie, if any; whether there was one.
    fn end(&self, headers: &HeaderMap) -> bool {
        cookie(headers, COOKIE_NAME)
            .map(|id| self.sessions().remove(&session_key(id)).is_some())
            .unwrap_or(false)
    }

    /// The `/webapi/sessions/web` handler.
    pub fn service(&self) -> WebService {
        let this = self.clone();
        web_service(tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move {
                Ok::<_, std::convert::Infallible>(match this.handle(req).await {
                    Ok(r) => r,
                    Err(e) => e.into_response(),
                })
            }
        }))
    }

    async fn handle(&self, req: Request<Body>) -> Result<Response<ResponseBody>, WebError> {
        match (req.method(), req.uri().path()) {
            (&Method::GET, SSO_WEB_BEGIN_PATH) => {
                let addr = req
                    .extensions()
                    .get::<super::ClientAddr>()
                    .map(|c| crate::listen::client_source(c.0.ip()));
                return self.sso_begin(req.uri().query().unwrap_or_default(), addr).await;
            }
            (&Method::GET, SSO_WEB_RETURN_PATH) => {
                return self.sso_return(req.uri().query().unwrap_or_default(), req.headers());
            }
            (_, SSO_WEB_BEGIN_PATH | SSO_WEB_RETURN_PATH) => {
                return Err(WebError::BadRequest(format!("use GET on {}", req.uri().path())));
            }
            _ => {}
        }
        if req.uri().path() != SESSIONS_PATH {
            return Err(WebError::NotFound(format!("not found: {}", req.uri().path())));
        }
        match *req.method() {
            Method::POST => {
                // The user's address, for the Auth Service's per-address limit on failed sign-ins.
                let client_addr = req
                    .extensions()
                    .get::<super::ClientAddr>()
                    .map(|c| c.0.ip().to_canonical().to_string())
                    .unwrap_or_default();
                let bytes = Limited::new(req.into_body(), MAX_BODY)
                    .collect()
                    .await
                    .map_err(|e| WebError::BadRequest(format!("reading the request body: {e}")))?
                    .to_bytes();
                // serde_json's errors name a position, never the content: the password stays out.
                let body: SignInBody = serde_json::from_slice(&bytes)
                    .map_err(|e| WebError::BadRequest(format!("expected {{\"user\":…,\"pass\":…}}: {e}")))?;
                if body.user.is_empty() {
                    return Err(WebError::BadRequest("user: expected a user name".into()));
                }
                let (id, session) = self.sign_in(body.user, body.pass, client_addr).await?;
                let max_age = seconds_left(session.user.expires);
                let mut resp = answer(&session.user, &session.csrf);
                let cookie = format!(
                    "{COOKIE_NAME}={id}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={max_age}"
                );
                tracing::info!(user = %session.user.username, expires = %rfc3339(session.user.expires), "web session started");
                self.insert(&id, session)?;
                resp.headers_mut().insert(
                    header::SET_COOKIE,
                    HeaderValue::from_str(&cookie)
                        .map_err(|e| WebError::Upstream(format!("the session cookie: {e}")))?,
                );
                Ok(resp)
            }
            Method::GET => {
                let (user, csrf) = self.session(req.headers(), false).await?;
                Ok(answer(&user, &csrf))
            }
            Method::DELETE => {
                // Signing out changes state: the CSRF token is required like everywhere else.
                let (user, _) = self.session(req.headers(), true).await?;
                self.end(req.headers());
                tracing::info!(user = %user.username, "web session ended by logout");
                let mut resp = json(&serde_json::json!({ "message": "signed out" }));
                resp.headers_mut().insert(
                    header::SET_COOKIE,
                    HeaderValue::from_static(
                        "svc_session=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0",
                    ),
                );
                Ok(resp)
            }
            _ => Err(WebError::BadRequest(format!(
                "use POST, GET or DELETE on {SESSIONS_PATH}"
            ))),
        }
    }
}

impl WebSessions {
    /// `GET /webapi/sso/web/begin?kind=…&connector_id=…`: starts a single sign-on for this
    /// browser. The proxy makes the session's keys, asks the Auth Service for the provider's URL
    /// with [`SSO_WEB_RETURN_PATH`] as the way back, binds the sign-in to this browser with a
    /// short-lived cookie (so nobody can sign a victim's browser into their own account) and
    /// sends the browser to the provider.
    async fn sso_begin(
        &self,
        query: &str,
        addr: Option<std::net::IpAddr>,
    ) -> Result<Response<ResponseBody>, WebError> {
        let mut kind = String::new();
        let mut connector = String::new();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                "kind" => kind = v.into_owned(),
                "connector_id" => connector = v.into_owned(),
                _ => {}
            }
        }
        if !super::sso::SSO_KINDS.contains(&kind.as_str()) {
            return Err(WebError::BadRequest(format!(
                "kind: expected one of {}, got {kind:?}",
                super::sso::SSO_KINDS.join(", ")
            )));
        }
        if connector.is_empty() {
            return Err(WebError::BadRequest(
                "connector_id: expected a connector name".into(),
            ));
        }
        // Refused before the Auth Service stores anything; checked again when it is kept.
        room_for_sso(&mut self.pending(), addr)?;
        let keys = KeyMaterial::generate()
            .map_err(|e| WebError::Unavailable(format!("generating the session's keys: {e}")))?;
        let ssh_public_key = keys
            .ssh_public_key_line()
            .map_err(|e| WebError::Unavailable(format!("encoding the session's SSH key: {e}")))?;
        let id = self.token()?;
        let mut secret = [0u8; 32];
        self.inner
            .rng
            .fill(&mut secret)
            .map_err(|_| WebError::Unavailable("the OS random number generator failed".into()))?;
        let secret_key: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let back = format!("{SSO_WEB_RETURN_PATH}?id={id}&{SSO_SECRET_KEY_PARAM}={secret_key}");
        let request = proto::SsoBeginRequest {
            kind,
            connector: connector.clone(),
            client_redirect_url: back,
            tls_public_key: keys.tls_public_key(),
            ssh_public_key,
            ttl_seconds: 0,
        };
        let provider = self
            .call_auth(
                |mut auth| async move { auth.raw().sso_begin(request).await.map_err(ClientError::from) },
            )
            .await?
            .into_inner()
            .redirect_url;
        {
            let mut pending = self.pending();
            room_for_sso(&mut pending, addr)?;
            pending.insert(
                session_key(&id),
                PendingSso {
                    addr,
                    keys,
                    secret_key: Secret::new(secret_key),
                    started: std::time::Instant::now(),
                },
            );
        }
        tracing::info!(%connector, "web single sign-on started");
        let mut resp = redirect(&provider)?;
        let binding = format!(
            "{SSO_BINDING_COOKIE}={id}; Path={SSO_WEB_RETURN_PATH}; Secure; HttpOnly; SameSite=Lax; Max-Age={}",
            SSO_WEB_TTL.as_secs()
        );
        resp.headers_mut().append(
            header::SET_COOKIE,
            HeaderValue::from_str(&binding)
                .map_err(|e| WebError::Upstream(format!("the sign-in cookie: {e}")))?,
        );
        Ok(resp)
    }

    /// `GET /webapi/sso/web/return?id=…&response=…`: the browser back from the provider (through
    /// the callback, which sealed the Auth Service's answer). The sign-in must have been started
    /// here, by this browser (its binding cookie), within [`SSO_WEB_TTL`]; then the certificates
    /// become a web session and the browser goes to the Web UI.
    fn sso_return(&self, query: &str, headers: &HeaderMap) -> Result<Response<ResponseBody>, WebError> {
        let mut id = String::new();
        let mut sealed = String::new();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                "id" => id = v.into_owned(),
                SSO_RESPONSE_PARAM => sealed = v.into_owned(),
                _ => {}
            }
        }
        let bound = cookie(headers, SSO_BINDING_COOKIE).unwrap_or_default();
        if id.is_empty() || !ct_eq(bound.as_bytes(), id.as_bytes()) {
            return Err(WebError::Forbidden(
                "this sign-in was not started in this browser: start it again from the sign-in page".into(),
            ));
        }
        let pending = self
            .pending()
            .remove(&session_key(&id))
            .filter(|p| p.started.elapsed() < SSO_WEB_TTL)
            .ok_or_else(|| {
                WebError::Unauthenticated("the sign-in is unknown or took too long: start it again".into())
            })?;
        let plain = svc_core::webapi::open(pending.secret_key.expose(), &sealed)
            .map_err(|e| WebError::BadRequest(format!("{SSO_RESPONSE_PARAM}: {e}")))?;
        let result: SsoResult = serde_json::from_slice(&plain)
            .map_err(|e| WebError::Upstream(format!("the sign-in's result: {e}")))?;
        let answer = match result {
            SsoResult::Ok(a) => a,
            SsoResult::Error(why) => return Err(WebError::Forbidden(format!("sign-in refused: {why}"))),
        };
        let certs = proto::Certs::from(answer);
        let (session_id, session) = self.start_session(pending.keys, certs)?;
        let max_age = seconds_left(session.user.expires);
        tracing::info!(user = %session.user.username, roles = %session.user.roles.join(","), expires = %rfc3339(session.user.expires), "web session started by single sign-on");
        self.insert(&session_id, session)?;
        let mut resp = redirect(WEB_UI_HOME)?;
        for c in [
            format!(
                "{COOKIE_NAME}={session_id}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={max_age}"
            ),
            format!(
                "{SSO_BINDING_COOKIE}=; Path={SSO_WEB_RETURN_PATH}; Secure; HttpOnly; SameSite=Lax; Max-Age=0"
            ),
        ] {
            resp.headers_mut().append(
                header::SET_COOKIE,
                HeaderValue::from_str(&c)
                    .map_err(|e| WebError::Upstream(format!("the session cookie: {e}")))?,
            );
        }
        Ok(resp)
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], PendingSso>> {
        self.inner
            .pending_sso
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Drops the expired sign-ins of `pending`, then whether one more started by `addr` fits:
/// refused (429) when that address has [`MAX_PENDING_SSO_PER_ADDR`] unfinished already, and
/// (503) when the proxy holds [`MAX_PENDING_SSO`].
fn room_for_sso(
    pending: &mut HashMap<[u8; 32], PendingSso>,
    addr: Option<std::net::IpAddr>,
) -> Result<(), WebError> {
    pending.retain(|_, p| p.started.elapsed() < SSO_WEB_TTL);
    if pending.values().filter(|p| p.addr == addr).count() >= MAX_PENDING_SSO_PER_ADDR {
        let who = match addr {
            None => "this client".to_owned(),
            Some(a @ std::net::IpAddr::V4(_)) => format!("address {a}"),
            Some(a @ std::net::IpAddr::V6(_)) => format!("the addresses {a}/64"),
        };
        let has = if matches!(addr, Some(std::net::IpAddr::V6(_))) {
            "have"
        } else {
            "has"
        };
        return Err(WebError::TooManyRequests(format!(
            "{who} {has} {MAX_PENDING_SSO_PER_ADDR} unfinished single sign-ons already: finish one, \
             or start again once they expire ({} minutes after they began)",
            SSO_WEB_TTL.as_secs() / 60
        )));
    }
    if pending.len() >= MAX_PENDING_SSO {
        return Err(WebError::Unavailable(format!(
            "this proxy holds {MAX_PENDING_SSO} unfinished sign-ins already: try again later"
        )));
    }
    Ok(())
}

/// Whole seconds from now until `expires` (0 once it has passed): a cookie's `Max-Age`.
fn seconds_left(expires: SystemTime) -> u64 {
    expires
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .as_secs()
}

/// A `302 Found` to `location`.
fn redirect(location: &str) -> Result<Response<ResponseBody>, WebError> {
    let mut resp = Response::new(full(Vec::new()));
    *resp.status_mut() = StatusCode::FOUND;
    resp.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(location)
            .map_err(|e| WebError::Upstream(format!("the redirect address: {e}")))?,
    );
    Ok(resp)
}

fn answer(user: &WebUser, csrf: &str) -> Response<ResponseBody> {
    json(&SessionAnswer {
        user: &user.username,
        roles: &user.roles,
        expires: rfc3339(user.expires),
        csrf_token: csrf,
    })
}

/// A 200 JSON response of `value`.
pub fn json<T: serde::Serialize>(value: &T) -> Response<ResponseBody> {
    match serde_json::to_vec(value) {
        Ok(body) => {
            let mut resp = Response::new(full(body));
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            resp
        }
        Err(e) => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("encoding the answer: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; svc_session=abc ; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE_NAME), Some("abc"));
        assert_eq!(cookie(&h, "svc"), None);
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("x=1"));
        h.append(header::COOKIE, HeaderValue::from_static("svc_session=z"));
        assert_eq!(cookie(&h, COOKIE_NAME), Some("z"));
    }

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"", b"a"));
    }

    fn pending_from(addr: Option<std::net::IpAddr>, age: Duration) -> PendingSso {
        PendingSso {
            addr,
            keys: KeyMaterial::generate().expect("generating a key pair"),
            secret_key: Secret::new("00".into()),
            started: std::time::Instant::now()
                .checked_sub(age)
                .expect("the monotonic clock reaches back that far"),
        }
    }

    #[test]
    fn unfinished_sign_ins_are_capped_per_client_address() {
        let attacker: std::net::IpAddr = "192.0.2.7".parse().expect("an address");
        let other: std::net::IpAddr = "198.51.100.9".parse().expect("an address");
        let mut pending = HashMap::new();
        for i in 0..MAX_PENDING_SSO_PER_ADDR {
            room_for_sso(&mut pending, Some(attacker)).expect("below the per-address cap");
            pending.insert(
                session_key(&format!("a{i}")),
                pending_from(Some(attacker), Duration::ZERO),
            );
        }
        let refused = room_for_sso(&mut pending, Some(attacker)).expect_err("one more from the same address");
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            refused.to_string(),
            "address 192.0.2.7 has 20 unfinished single sign-ons already: finish one, or start \
             again once they expire (10 minutes after they began)"
        );
        // Another client is not kept waiting by the first one's sign-ins.
        room_for_sso(&mut pending, Some(other)).expect("another address has room");
        // Finishing one (the return removes it) makes room again for that address.
        pending.remove(&session_key("a0"));
        room_for_sso(&mut pending, Some(attacker)).expect("room after one finished");
        // Expired sign-ins do not count: they are dropped first.
        pending.insert(session_key("a0"), pending_from(Some(attacker), SSO_WEB_TTL));
        room_for_sso(&mut pending, Some(attacker)).expect("the expired one was dropped");
        assert_eq!(pending.len(), MAX_PENDING_SSO_PER_ADDR - 1);
        // A client whose address the handler does not know counts as one client.
        for i in 0..MAX_PENDING_SSO_PER_ADDR {
            pending.insert(session_key(&format!("u{i}")), pending_from(None, Duration::ZERO));
        }
        let refused = room_for_sso(&mut pending, None).expect_err("the unknown-address bucket is full");
        assert!(
            refused.to_string().starts_with("this client has 20 unfinished"),
            "{refused}"
        );
        // An IPv6 client is its /64: changing the last 64 bits is not another client.
        for i in 0..MAX_PENDING_SSO_PER_ADDR {
            let addr: std::net::IpAddr = format!("2001:db8:1:2::{:x}", i + 1).parse().expect("an address");
            let source = crate::listen::client_source(addr);
            room_for_sso(&mut pending, Some(source)).expect("below the cap");
            pending.insert(
                session_key(&format!("v{i}")),
                pending_from(Some(source), Duration::ZERO),
            );
        }
        let next = crate::listen::client_source("2001:db8:1:2:ffff::1".parse().expect("an address"));
        let refused = room_for_sso(&mut pending, Some(next)).expect_err("the /64 is full");
        assert!(
            refused
                .to_string()
                .starts_with("the addresses 2001:db8:1:2::/64 have 20 unfinished"),
            "{refused}"
        );
    }

    #[test]
    fn unfinished_sign_ins_are_capped_per_proxy() {
        let mut pending = HashMap::new();
        for i in 0..MAX_PENDING_SSO {
            // 50 addresses, each below its own cap.
            let addr = std::net::IpAddr::from([10, 0, 0, u8::try_from(i % 50).expect("below 50")]);
            pending.insert(
                session_key(&format!("p{i}")),
                pending_from(Some(addr), Duration::ZERO),
            );
        }
        let refused = room_for_sso(&mut pending, Some("203.0.113.1".parse().expect("an address")))
            .expect_err("the proxy is full");
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn web_errors_map_to_statuses() {
        let forbidden = WebError::from_auth(ClientError::Status {
            code: tonic::Code::PermissionDenied,
            message: "access denied".into(),
        });
        assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
        assert_eq!(WebError::Csrf.status(), StatusCode::FORBIDDEN);
        assert_eq!(WebError::Csrf.to_string(), "missing or invalid CSRF token");
        let locked = WebError::from_auth(ClientError::Status {
            code: tonic::Code::ResourceExhausted,
            message: "locked out".into(),
        });
        assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS);
    }
}

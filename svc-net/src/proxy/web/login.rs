//! `POST /webapi/login`: password sign-in through the Proxy.
//!
//! Data flow: `tsh login` generates its keys and sends the user name, the password and the
//! public keys ([`LoginBody`]) → this handler (mounted with `ProxyBuilder::web_mount`) calls the
//! Auth Service's `Login` with the proxy's own host identity → the user certificates come back
//! as [`LoginAnswer`]; `tsh` combines them with its private keys ([`login_via_proxy`]). Private
//! keys never leave the client; the password only passes through, in [`Secret`].

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use serde::{Deserialize, Serialize};
use svc_core::Secret;

use super::{Body, ResponseBody, WebService, full, json_error, web_service};
use crate::auth::{AuthClient, ClientError, ClientIdentity, KeyMaterial, proto};
use crate::dial::ProxyDialer;
use crate::http::HttpClient;

/// The path the handler is mounted at.
pub const LOGIN_PATH: &str = "/webapi/login";
/// Requests larger than this are refused (a login body is well under 2 KiB).
const MAX_BODY: usize = 64 * 1024;

/// The request body.
#[derive(Debug, Serialize, Deserialize)]
pub struct LoginBody {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: Secret,
    /// The TLS public key: DER SubjectPublicKeyInfo, standard base64.
    pub tls_public_key: String,
    /// The SSH public key (`authorized_keys` line).
    pub ssh_public_key: String,
    /// Requested certificate lifetime in seconds (0: the default).
    #[serde(default)]
    pub ttl_seconds: u64,
}

/// The answer: the signed certificates and where the Auth API is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoginAnswer {
    /// The user name.
    pub name: String,
    /// The cluster.
    pub cluster_name: String,
    /// The X.509 certificate (PEM).
    pub tls_cert_pem: String,
    /// The OpenSSH certificate.
    pub ssh_cert: String,
    /// The host and user CA certificates (PEM).
    pub tls_ca_pems: Vec<String>,
    /// The host and user OpenSSH CA keys.
    pub ssh_ca_keys: Vec<String>,
    /// When the certificates end (Unix seconds).
    pub not_after_unix: i64,
    /// The Auth API address clients such as `tctl` use with these certificates; absent: the
    /// proxy itself (TLS routing carries the Auth API on its web port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_addr: Option<String>,
}

/// The `/webapi/login` handler: calls the Auth Service with the proxy's identity. Clients are
/// told to reach the Auth API at `public_auth_addr`, or through this proxy when `None`.
pub fn login_service(auth: AuthClient, public_auth_addr: Option<String>) -> WebService {
    let state = Arc::new((auth, public_auth_addr));
    web_service(tower::service_fn(move |req: Request<Body>| {
        let state = state.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(&state.0, &state.1, req).await) }
    }))
}

async fn handle(auth: &AuthClient, auth_addr: &Option<String>, req: Request<Body>) -> Response<ResponseBody> {
    if req.method() != Method::POST {
        return json_error(StatusCode::METHOD_NOT_ALLOWED, "use POST on /webapi/login");
    }
    // The user's address, for the Auth Service's per-address limit on failed sign-ins.
    let client_addr = req
        .extensions()
        .get::<super::ClientAddr>()
        .map(|c| c.0.ip().to_canonical().to_string())
        .unwrap_or_default();
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &format!("reading the request body: {e}")),
    };
    // serde_json's errors name a position, never the content: the password stays out of them.
    let body: LoginBody = match serde_json::from_slice(&bytes) {
        Ok(b) => b,
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("expected a login JSON body: {e}"),
            );
        }
    };
    let Ok(tls_public_key) = base64::engine::general_purpose::STANDARD.decode(&body.tls_public_key) else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "tls_public_key: expected standard base64",
        );
    };
    let mut auth = auth.clone();
    let request = proto::LoginRequest {
        username: body.user,
        password: body.password.into_inner(),
        tls_public_key,
        ssh_public_key: body.ssh_public_key,
        ttl_seconds: body.ttl_seconds,
        client_addr,
    };
    match auth.raw().login(request).await {
        Ok(certs) => {
            let c = certs.into_inner();
            let answer = LoginAnswer {
                name: c.name,
                cluster_name: c.cluster_name,
                tls_cert_pem: c.tls_cert_pem,
                ssh_cert: c.ssh_cert,
                tls_ca_pems: c.tls_ca_pems,
                ssh_ca_keys: c.ssh_ca_keys,
                not_after_unix: c.not_after_unix,
                auth_addr: auth_addr.clone(),
            };
            let mut resp = Response::new(full(serde_json::to_vec(&answer).unwrap_or_default()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(status) => {
            let code = match status.code() {
                tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
                tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
                tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::BAD_GATEWAY,
            };
            json_error(code, ClientError::from(status).to_string().as_str())
        }
    }
}

/// Why signing in through the proxy failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoginError {
    /// The proxy could not be reached, or its certificate was refused.
    #[error("cannot reach the proxy at {addr}: {reason}")]
    Connect {
        /// The proxy address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The proxy answered with an error.
    #[error("sign-in failed ({status}): {message}")]
    Refused {
        /// The HTTP status.
        status: StatusCode,
        /// The server's message.
        message: String,
    },
    /// The answer could not be used.
    #[error("unexpected answer from the proxy: {0}")]
    Invalid(String),
}

/// Signs in through the proxy at `proxy` (`host:port`): sends fresh public keys with the
/// password and returns the full identity (certificates + the private keys generated here).
/// `insecure` skips the proxy certificate check (self-signed test clusters only); otherwise
/// the proxy must present a certificate from the public web roots or `extra_ca_pem`.
pub async fn login_via_proxy(
    proxy: &str,
    insecure: bool,
    extra_ca_pem: Option<&[u8]>,
    user: &str,
    password: &Secret,
    ttl: Option<Duration>,
) -> Result<ClientIdentity, LoginError> {
    login_via_proxy_with(proxy, insecure, extra_ca_pem, None, user, password, ttl).await
}

/// Like [`login_via_proxy`], dialing the proxy through `dialer` (direct or HTTP CONNECT per
/// its `HTTPS_PROXY`/`NO_PROXY` settings) when given.
pub async fn login_via_proxy_with(
    proxy: &str,
    insecure: bool,
    extra_ca_pem: Option<&[u8]>,
    dialer: Option<&ProxyDialer>,
    user: &str,
    password: &Secret,
    ttl: Option<Duration>,
) -> Result<ClientIdentity, LoginError> {
    let keys = KeyMaterial::generate().map_err(|e| LoginError::Invalid(e.to_string()))?;
    let body = LoginBody {
        user: user.to_owned(),
        password: password.clone(),
        tls_public_key: base64::engine::general_purpose::STANDARD.encode(keys.tls_public_key()),
        ssh_public_key: keys
            .ssh_public_key_line()
            .map_err(|e| LoginError::Invalid(e.to_string()))?,
        ttl_seconds: ttl.map(|t| t.as_secs()).unwrap_or(0),
    };
    let body = serde_json::to_vec(&body).map_err(|e| LoginError::Invalid(e.to_string()))?;

    let bytes = proxy_request(
        proxy,
        insecure,
        extra_ca_pem,
        dialer,
        Method::POST,
        LOGIN_PATH,
        Some(Bytes::from(body)),
    )
    .await?;
    let answer: LoginAnswer =
        serde_json::from_slice(&bytes).map_err(|e| LoginError::Invalid(e.to_string()))?;
    let auth_addr = answer.auth_addr.clone().unwrap_or_else(|| proxy.to_owned());
    let certs = proto::Certs {
        name: answer.name,
        tls_cert_pem: answer.tls_cert_pem,
        ssh_cert: answer.ssh_cert,
        tls_ca_pems: answer.tls_ca_pems,
        ssh_ca_keys: answer.ssh_ca_keys,
        cluster_name: answer.cluster_name,
        not_after_unix: answer.not_after_unix,
    };
    let mut identity = keys
        .into_identity_from_proto(certs)
        .map_err(|e| LoginError::Invalid(e.to_string()))?;
    identity.auth_addr = auth_addr;
    Ok(identity)
}

/// The proxy's `/webapi/ping` document (unauthenticated): where its SSH and tunnel entries
/// are and whether TLS routing is on. Same trust and dialing rules as [`login_via_proxy_with`].
pub async fn ping_via_proxy(
    proxy: &str,
    insecure: bool,
    extra_ca_pem: Option<&[u8]>,
    dialer: Option<&ProxyDialer>,
) -> Result<serde_json::Value, LoginError> {
    let bytes = proxy_request(
        proxy,
        insecure,
        extra_ca_pem,
        dialer,
        Method::GET,
        crate::proxy::web::ping::PING_PATH,
        None,
    )
    .await?;
    serde_json::from_slice(&bytes).map_err(|e| LoginError::Invalid(e.to_string()))
}

/// One HTTPS request to the proxy's web API, through svc's [`HttpClient`]; the body of a 2xx
/// answer, else the JSON error's message as [`LoginError::Refused`].
async fn proxy_request(
    proxy: &str,
    insecure: bool,
    extra_ca_pem: Option<&[u8]>,
    dialer: Option<&ProxyDialer>,
    method: Method,
    path: &str,
    body: Option<Bytes>,
) -> Result<Bytes, LoginError> {
    let connect = |reason: String| LoginError::Connect {
        addr: proxy.to_owned(),
        reason,
    };
    let config = if insecure {
        Arc::new(crate::tls::insecure_client_config().map_err(|e| connect(e.to_string()))?)
    } else {
        crate::tls::client_config(extra_ca_pem).map_err(|e| connect(e.to_string()))?
    };
    let target = svc_core::Addr::parse(proxy).map_err(|e| connect(e.to_string()))?;
    let dialer = match dialer {
        Some(d) => d.clone(),
        None => ProxyDialer::builder(svc_core::proxy_env::ProxyEnv::default())
            .build()
            .map_err(|e| connect(e.to_string()))?,
    };
    // One request per sign-in: no connection is kept.
    let client = HttpClient::builder(config)
        .pool_max_idle_per_host(0)
        .build(dialer);
    let mut req = Request::builder()
        .method(method)
        .uri(format!("https://{target}{path}"));
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(body.unwrap_or_default()))
        .map_err(|e| LoginError::Invalid(e.to_string()))?;
    let resp = client
        .send(req)
        .await
        .map_err(|e| connect(e.kind().to_string()))?;
    let status = resp.status();
    let bytes = resp.into_body();
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        return Err(LoginError::Refused { status, message });
    }
    Ok(bytes)
}

//! Signing in through the proxy's web API: `POST /webapi/login` with fresh public keys and the
//! password, and the unauthenticated `/webapi/ping` document, over svc's [`HttpClient`]
//! (`HTTPS_PROXY`/`NO_PROXY` honoured through the [`ProxyDialer`]). Private keys never leave the
//! client.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::Full;
use svc_core::Secret;
use svc_core::webapi::{LOGIN_PATH, LoginAnswer, LoginBody, PING_PATH};

use crate::auth::{ClientIdentity, KeyMaterial, proto};
use crate::dial::ProxyDialer;
use crate::http::HttpClient;

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
    let certs = proto::Certs::from(answer);
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
        PING_PATH,
        None,
    )
    .await?;
    serde_json::from_slice(&bytes).map_err(|e| LoginError::Invalid(e.to_string()))
}

/// One HTTPS request to the proxy's web API, through svc's [`HttpClient`]; the body of a 2xx
/// answer, else the JSON error's message as [`LoginError::Refused`].
pub(super) async fn proxy_request(
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

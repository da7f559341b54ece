//! `tsh login --auth=<connector>`: single sign-on through the proxy with a one-shot callback
//! listener on loopback.
//!
//! Data flow: the proxy's `/webapi/ping/<connector>` says the connector's kind → fresh keys, a
//! listener on `127.0.0.1` (random port) and a random 256-bit sealing key → `POST
//! /webapi/<kind>/login/console` with the public keys and `http://127.0.0.1:<port>/callback?
//! secret_key=<key>` → the provider's URL, shown to the user (or opened in a browser) → after
//! the provider and the proxy, the browser arrives at the listener with the result sealed under
//! the key; only this process can open it. Private keys never leave the client.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::Method;
use ring::rand::SecureRandom;
use svc_core::webapi::{
    LoginAnswer, SSO_RESPONSE_PARAM, SSO_SECRET_KEY_PARAM, SsoConsoleAnswer, SsoConsoleBody, SsoResult, open,
    sso_console_path,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::login::{LoginError, proxy_request};
use crate::auth::{ClientIdentity, KeyMaterial, proto};
use crate::dial::ProxyDialer;

/// What a single sign-on needs besides the proxy.
#[derive(Debug, Clone)]
pub struct SsoLogin {
    /// The connector's name.
    pub connector: String,
    /// Requested certificate lifetime.
    pub ttl: Option<Duration>,
    /// How long to wait for the browser to come back.
    pub timeout: Duration,
}

fn invalid(e: impl std::fmt::Display) -> LoginError {
    LoginError::Invalid(e.to_string())
}

/// Signs in through the connector `login.connector`: `show_url` gets the provider's URL (print
/// it, open a browser), then the browser must come back to the loopback listener within
/// `login.timeout`.
pub async fn login_via_sso(
    proxy: &str,
    insecure: bool,
    extra_ca_pem: Option<&[u8]>,
    dialer: Option<&ProxyDialer>,
    login: &SsoLogin,
    show_url: impl FnOnce(&str),
) -> Result<ClientIdentity, LoginError> {
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let ping = proxy_request(
        proxy,
        insecure,
        extra_ca_pem,
        dialer,
        Method::GET,
        &format!("{}/{}", svc_core::webapi::PING_PATH, enc(&login.connector)),
        None,
    )
    .await?;
    let ping: serde_json::Value = serde_json::from_slice(&ping).map_err(invalid)?;
    let kind = ping["auth"]["type"].as_str().unwrap_or_default().to_owned();
    if !matches!(kind.as_str(), "oidc" | "github" | "saml") {
        return Err(LoginError::Invalid(format!(
            "connector \"{}\" is of type \"{kind}\": sign in with a user name and password instead",
            login.connector
        )));
    }

    let keys = KeyMaterial::generate().map_err(invalid)?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| {
        LoginError::Invalid(format!(
            "cannot listen on 127.0.0.1 for the sign-in callback: {e}"
        ))
    })?;
    let port = listener.local_addr().map_err(invalid)?.port();
    let mut raw_key = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut raw_key)
        .map_err(|_| invalid("the system random source failed"))?;
    let key = hex::encode(raw_key);
    let body = SsoConsoleBody {
        connector_id: login.connector.clone(),
        redirect_url: svc_core::Secret::new(format!(
            "http://127.0.0.1:{port}/callback?{SSO_SECRET_KEY_PARAM}={key}"
        )),
        tls_public_key: base64::engine::general_purpose::STANDARD.encode(keys.tls_public_key()),
        ssh_public_key: keys.ssh_public_key_line().map_err(invalid)?,
        ttl_seconds: login.ttl.map(|t| t.as_secs()).unwrap_or(0),
    };
    let body = serde_json::to_vec(&body).map_err(invalid)?;
    let answer = proxy_request(
        proxy,
        insecure,
        extra_ca_pem,
        dialer,
        Method::POST,
        &sso_console_path(&kind),
        Some(Bytes::from(body)),
    )
    .await?;
    let answer: SsoConsoleAnswer = serde_json::from_slice(&answer).map_err(invalid)?;
    show_url(&answer.redirect_url);

    let result = tokio::time::timeout(login.timeout, wait_for_result(&listener, &key))
        .await
        .map_err(|_| {
            LoginError::Invalid(format!(
                "the browser did not come back from the sign-in within {:?}; run tsh login again",
                login.timeout
            ))
        })??;
    let answer = match result {
        SsoResult::Ok(a) => a,
        SsoResult::Error(message) => {
            return Err(LoginError::Refused {
                status: http::StatusCode::FORBIDDEN,
                message,
            });
        }
    };
    identity(keys, answer, proxy)
}

fn identity(keys: KeyMaterial, answer: LoginAnswer, proxy: &str) -> Result<ClientIdentity, LoginError> {
    let auth_addr = answer.auth_addr.clone().unwrap_or_else(|| proxy.to_owned());
    let certs = proto::Certs::from(answer);
    let mut identity = keys.into_identity_from_proto(certs).map_err(invalid)?;
    identity.auth_addr = auth_addr;
    Ok(identity)
}

/// Serves the loopback listener until a request brings a result that opens with `key`; other
/// requests (a favicon, a forged result) get an error page and the listener keeps waiting.
async fn wait_for_result(listener: &TcpListener, key: &str) -> Result<SsoResult, LoginError> {
    loop {
        let (mut conn, _) = listener.accept().await.map_err(invalid)?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        // The request head only (a GET); bounded in size and time.
        let head = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let n = conn.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.len() > 64 * 1024 {
                    break;
                }
            }
            Ok::<_, std::io::Error>(())
        })
        .await;
        if !matches!(head, Ok(Ok(()))) {
            continue;
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let path = match req.parse(&buf) {
            Ok(_) => req.path.unwrap_or_default().to_owned(),
            Err(_) => String::new(),
        };
        let query = path.split_once('?').map(|(_, q)| q).unwrap_or_default();
        let sealed = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == SSO_RESPONSE_PARAM)
            .map(|(_, v)| v.into_owned());
        let result = sealed
            .as_deref()
            .and_then(|s| open(key, s).ok())
            .and_then(|plain| serde_json::from_slice::<SsoResult>(&plain).ok());
        let (status, page) = match &result {
            Some(SsoResult::Ok(a)) => (
                "200 OK",
                format!(
                    "Signed in as {}. You can close this window and return to the terminal.",
                    a.name
                ),
            ),
            Some(SsoResult::Error(why)) => ("403 Forbidden", format!("Sign-in failed: {why}")),
            None => (
                "400 Bad Request",
                "This is tsh's sign-in callback; it expects the result of a sign-in.".to_owned(),
            ),
        };
        let resp = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}\n",
            page.len() + 1
        );
        let _ = conn.write_all(resp.as_bytes()).await;
        let _ = conn.shutdown().await;
        if let Some(r) = result {
            return Ok(r);
        }
    }
}

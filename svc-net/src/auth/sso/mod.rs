//! Single sign-on inside the Auth Service: the flow, generic over the connector kind, and the
//! provider-specific checks ([`oidc`], [`github`], [`saml`]).
//!
//! [`SsoEngine::begin`] creates the sign-in request (random state, nonce, PKCE verifier, the
//! user's public keys and loopback URL, stored for ten minutes) and returns the provider's URL.
//! [`SsoEngine::callback`] takes the request named by the callback's state exactly once, lets
//! the kind check the provider's answer and map it to roles, and issues certificates; once the
//! state is known, a refusal still goes back to `tsh` (its loopback URL) so that the user sees
//! why. Outbound calls (discovery, keys, token exchange, GitHub's API) go through svc's
//! [`HttpClient`] over the environment's dialer (`HTTPS_PROXY`/`NO_PROXY`). Nothing secret —
//! codes, tokens, the client secret — is logged or put in an error.

mod github;
mod jws;
mod oidc;
mod saml;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use ring::rand::SecureRandom;
use svc_core::Secret;
use svc_core::auth::sso::{SsoIdentity, SsoRequest};
use svc_core::auth::{AuthError, AuthService, Caller, IssuedCerts};
use svc_core::resource::{Kind, Resource};
use svc_core::webapi::SSO_SECRET_KEY_PARAM;

use crate::dial::ProxyDialer;
use crate::http::HttpClient;

/// How long one call to a provider may take.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(15);
/// Key sets are refetched at least this often, even when every `kid` is known.
const JWKS_MAX_AGE: Duration = Duration::from_secs(3600);
/// At most one refetch of a key set per this interval (an unknown `kid` triggers one): a flood
/// of tokens with made-up key IDs costs the provider one request a second.
const JWKS_REFETCH_INTERVAL: Duration = Duration::from_secs(1);

/// A refusal by a provider-specific check: the text says which check, never a secret.
#[derive(Debug)]
pub(super) struct Refused(pub(super) String);

impl<E: std::fmt::Display> From<E> for Refused {
    fn from(e: E) -> Self {
        Refused(e.to_string())
    }
}

struct CachedKeys {
    keys: Vec<jws::Jwk>,
    fetched: Instant,
}

/// What [`SsoEngine::begin`] needs from the proxy's request.
#[derive(Clone)]
pub(crate) struct Begin {
    pub(crate) kind: Kind,
    pub(crate) connector: String,
    pub(crate) client_redirect_url: Secret,
    pub(crate) tls_public_key: Vec<u8>,
    pub(crate) ssh_public_key: String,
    pub(crate) ttl_seconds: u64,
}

/// The end of a sign-in whose state was known: where `tsh` listens, and the certificates or
/// why not.
pub(crate) struct Finished {
    pub(crate) client_redirect_url: Secret,
    pub(crate) outcome: Result<IssuedCerts, String>,
}

/// The sign-in flow over an [`AuthService`].
pub(crate) struct SsoEngine {
    auth: Arc<AuthService>,
    http: Option<HttpClient<ProxyDialer>>,
    keys: tokio::sync::Mutex<HashMap<String, CachedKeys>>,
    /// SAML assertion IDs already used, until they expire.
    saml_replay: saml::ReplayCache,
}

impl std::fmt::Debug for SsoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsoEngine").finish_non_exhaustive()
    }
}

fn random_token() -> Result<String, AuthError> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| AuthError::Invalid("the system random source failed".into()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Checks that `url` is where `tsh` listens: `http://` on a loopback address with a port, with a
/// 64-hex-digit sealing key. Anything else could send the result elsewhere.
///
/// The one other form is the Web UI's: the path [`svc_core::webapi::SSO_WEB_RETURN_PATH`] alone
/// (no scheme, no host), so the browser comes back to the proxy that handled the provider's
/// redirect, which turns the result into a web session; it cannot point anywhere else.
pub(crate) fn check_loopback_url(url: &str) -> Result<(), AuthError> {
    let bad = |why: &str| AuthError::Invalid(format!("redirect_url: {why}"));
    let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
    if uri.scheme().is_none()
        && uri.authority().is_none()
        && uri.path() == svc_core::webapi::SSO_WEB_RETURN_PATH
    {
        return check_secret_key(&uri);
    }
    if uri.scheme_str() != Some("http") {
        return Err(bad("expected an http:// loopback URL (tsh's callback listener)"));
    }
    let host = uri.host().unwrap_or_default();
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback || uri.port_u16().is_none() {
        return Err(bad("expected a loopback address with a port"));
    }
    check_secret_key(&uri)
}

/// The URL carries a sealing key of 64 hex digits.
fn check_secret_key(uri: &http::Uri) -> Result<(), AuthError> {
    let bad = |why: &str| AuthError::Invalid(format!("redirect_url: {why}"));
    let key = form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .find(|(k, _)| k == SSO_SECRET_KEY_PARAM)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("expected a secret_key of 64 hex digits"));
    }
    Ok(())
}

impl SsoEngine {
    /// The engine over `auth`, calling providers through the environment's dialer with the
    /// public web roots.
    pub(crate) fn new(auth: Arc<AuthService>) -> Self {
        let http = crate::tls::client_config(None)
            .map_err(|e| e.to_string())
            .and_then(|tls| {
                HttpClient::builder(tls)
                    .timeout(PROVIDER_TIMEOUT)
                    .pool_max_idle_per_host(0)
                    .from_env()
                    .map_err(|e| e.to_string())
            });
        let http = match http {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "auth: single sign-on cannot call providers");
                None
            }
        };
        Self {
            auth,
            http,
            keys: tokio::sync::Mutex::new(HashMap::new()),
            saml_replay: saml::ReplayCache::new(),
        }
    }

    fn http(&self) -> Result<&HttpClient<ProxyDialer>, Refused> {
        self.http.as_ref().ok_or_else(|| {
            Refused("the Auth Service cannot make outbound HTTPS calls (see its log at start)".into())
        })
    }

    /// Starts a sign-in: stores the request and returns the provider's URL for the browser.
    pub(crate) async fn begin(&self, caller: &Caller, b: Begin) -> Result<String, AuthError> {
        check_loopback_url(b.client_redirect_url.expose())?;
        ssh_key::PublicKey::from_openssh(&b.ssh_public_key)
            .map_err(|e| AuthError::Invalid(format!("ssh_public_key: {e}")))?;
        let connector = self.auth.sso_connector(caller, b.kind, &b.connector).await?;
        let req = SsoRequest {
            state: random_token()?,
            kind: b.kind.as_str().to_owned(),
            connector: b.connector.clone(),
            nonce: Secret::new(random_token()?),
            pkce_verifier: Secret::new(random_token()?),
            tls_public_key: b.tls_public_key,
            ssh_public_key: b.ssh_public_key,
            ttl_seconds: b.ttl_seconds,
            client_redirect_url: b.client_redirect_url,
        };
        // One arm per kind: the provider's URL for this request (its `state` travels as OAuth's
        // `state` or SAML's `RelayState`; the nonce can serve as SAML's request ID).
        let url = match &connector {
            Resource::Oidc(c) => oidc::auth_url(self, &c.spec, &req).await,
            Resource::Github(c) => Ok(github::auth_url(&c.spec, &req)),
            Resource::Saml(c) => saml::auth_url(self, c, &req).await,
            _ => Err(Refused(format!(
                "sign-in through {} connectors is not available in this version",
                b.kind
            ))),
        }
        .map_err(|Refused(why)| AuthError::SsoRefused(format!("{}/{}: {why}", b.kind, b.connector)))?;
        self.auth.create_sso_request(caller, &req).await?;
        tracing::info!(kind = %b.kind, connector = %b.connector, "auth: single sign-on started");
        Ok(url)
    }

    /// Finishes a sign-in from what the provider sent to the proxy's callback. `Err` when the
    /// state names no request in progress (nothing to send back); otherwise the loopback URL
    /// and the certificates or the refusal.
    pub(crate) async fn callback(
        &self,
        caller: &Caller,
        kind: Kind,
        query: &str,
        form: &[u8],
    ) -> Result<Finished, AuthError> {
        // OAuth answers in the query (`state`, `code`); SAML's POST binding in the form body
        // (`RelayState`, `SAMLResponse`). Query parameters win over form fields of the same name.
        let mut params: HashMap<String, String> = form_urlencoded::parse(form).into_owned().collect();
        params.extend(form_urlencoded::parse(query.as_bytes()).into_owned());
        let state = params
            .get("state")
            .or_else(|| params.get("RelayState"))
            .map(String::as_str)
            .unwrap_or_default();
        let req = self.auth.take_sso_request(caller, state).await?;
        let via = format!("{}/{}", req.kind, req.connector);
        let outcome = match self.finish(caller, kind, &req, &params).await {
            Ok(certs) => {
                tracing::info!(user = %certs.name, connector = %via, "auth: user signed in through single sign-on");
                Ok(certs)
            }
            Err(why) => {
                tracing::info!(connector = %via, error = %why, "auth: single sign-on refused");
                Err(why)
            }
        };
        Ok(Finished {
            client_redirect_url: req.client_redirect_url,
            outcome,
        })
    }

    async fn finish(
        &self,
        caller: &Caller,
        kind: Kind,
        req: &SsoRequest,
        params: &HashMap<String, String>,
    ) -> Result<IssuedCerts, String> {
        let via = format!("{}/{}", req.kind, req.connector);
        if req.kind != kind.as_str() {
            return Err(format!("the {kind} callback got a {via} sign-in"));
        }
        if let Some(error) = params.get("error") {
            let description = params.get("error_description").map(String::as_str).unwrap_or("");
            return Err(format!("the identity provider refused: {error} {description}")
                .trim_end()
                .to_owned());
        }
        let connector = self
            .auth
            .sso_connector(caller, kind, &req.connector)
            .await
            .map_err(|e| e.to_string())?;
        let code = || {
            params
                .get("code")
                .map(String::as_str)
                .filter(|c| !c.is_empty())
                .ok_or_else(|| Refused("the callback carries no authorization code".into()))
        };
        // One arm per kind: check the provider's answer and map it to a user and roles.
        let who: Result<SsoIdentity, Refused> = match &connector {
            Resource::Oidc(c) => match code() {
                Ok(code) => oidc::finish(self, &c.spec, req, code).await,
                Err(e) => Err(e),
            },
            Resource::Github(c) => match code() {
                Ok(code) => github::finish(self, &c.spec, code).await,
                Err(e) => Err(e),
            },
            Resource::Saml(c) => saml::finish(self, c, req, params).await,
            _ => Err(Refused(format!(
                "sign-in through {kind} connectors is not available in this version"
            ))),
        };
        let who = who.map_err(|Refused(why)| format!("{via}: {why}"))?;
        self.auth
            .issue_sso_certs(caller, req, &who)
            .await
            .map_err(|e| e.to_string())
    }

    /// The key set at `uri`: cached, or fetched when missing, older than [`JWKS_MAX_AGE`], or
    /// `refresh` is asked (an unknown `kid`: the provider rotated its keys). Refetches are spaced
    /// by [`JWKS_REFETCH_INTERVAL`].
    async fn jwks(&self, uri: &str, refresh: bool) -> Result<Vec<jws::Jwk>, Refused> {
        let mut cache = self.keys.lock().await;
        if let Some(c) = cache.get(uri)
            && !refresh
            && c.fetched.elapsed() < JWKS_MAX_AGE
        {
            return Ok(c.keys.clone());
        }
        if let Some(c) = cache.get(uri) {
            let since = c.fetched.elapsed();
            if since < JWKS_REFETCH_INTERVAL {
                tokio::time::sleep(JWKS_REFETCH_INTERVAL - since).await;
            }
        }
        let resp = self
            .http()?
            .get(uri)
            .await
            .map_err(|e| Refused(format!("fetching the provider's keys: {e}")))?;
        if !resp.status().is_success() {
            return Err(Refused(format!(
                "fetching the provider's keys: {uri} answered {}",
                resp.status()
            )));
        }
        let set: jws::Jwks = serde_json::from_slice(resp.body())
            .map_err(|e| Refused(format!("the provider's keys at {uri} are not a JWKS: {e}")))?;
        cache.insert(
            uri.to_owned(),
            CachedKeys {
                keys: set.keys.clone(),
                fetched: Instant::now(),
            },
        );
        Ok(set.keys)
    }
}

/// Reads a provider's JSON answer: an error status or a body that is not JSON is refused,
/// naming `what` and the OAuth `error` if the body has one (never the body itself otherwise).
fn json_answer(what: &str, resp: &http::Response<bytes::Bytes>) -> Result<serde_json::Value, Refused> {
    let value: Option<serde_json::Value> = serde_json::from_slice(resp.body()).ok();
    let oauth_error = value.as_ref().and_then(|v| {
        v.get("error").and_then(|e| e.as_str()).map(|e| {
            let d = v.get("error_description").and_then(|d| d.as_str()).unwrap_or("");
            format!("{e} {d}").trim_end().to_owned()
        })
    });
    if let Some(e) = oauth_error {
        return Err(Refused(format!(
            "{what}: the provider answered {}: {e}",
            resp.status()
        )));
    }
    if !resp.status().is_success() {
        return Err(Refused(format!(
            "{what}: the provider answered {}",
            resp.status()
        )));
    }
    value.ok_or_else(|| Refused(format!("{what}: the answer is not JSON")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_urls_only() {
        let key = "ab".repeat(32);
        assert!(
            super::check_loopback_url(&format!("http://127.0.0.1:4000/callback?secret_key={key}")).is_ok()
        );
        assert!(super::check_loopback_url(&format!("http://[::1]:4000/callback?secret_key={key}")).is_ok());
        assert!(super::check_loopback_url(&format!("http://localhost:4000/?secret_key={key}")).is_ok());
        assert!(
            super::check_loopback_url(&format!("/webapi/sso/web/return?id=abc&secret_key={key}")).is_ok()
        );
        for bad in [
            format!("https://127.0.0.1:4000/?secret_key={key}"),
            format!("http://evil.example:4000/?secret_key={key}"),
            format!("http://127.0.0.1/?secret_key={key}"),
            "http://127.0.0.1:4000/?secret_key=abc".to_owned(),
            // The Web UI's form is the proxy's own return path, nothing else.
            format!("//evil.example/webapi/sso/web/return?id=x&secret_key={key}"),
            format!("/webapi/sso/web/return/../../x?secret_key={key}"),
            format!("/elsewhere?secret_key={key}"),
            "/webapi/sso/web/return?id=x".to_owned(),
        ] {
            assert!(super::check_loopback_url(&bad).is_err(), "{bad}");
        }
    }
}

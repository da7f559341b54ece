//! OpenID Connect: discovery, the authorization URL (state, nonce, PKCE S256), the code
//! exchange (client secret in HTTP Basic), the ID token (signature by the provider's published
//! keys, issuer, audience, nonce, expiry), the userinfo claims, and `claims_to_roles`.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;
use serde::Deserialize;
use svc_core::auth::sso::{SsoIdentity, SsoRequest, oidc_roles};
use svc_core::resource::OidcSpec;

use super::{Refused, SsoEngine, json_answer, jws};

/// Clock skew tolerated on `exp` and `iat`.
const LEEWAY_SECS: i64 = 60;

#[derive(Debug, Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    userinfo_endpoint: Option<String>,
}

fn same_issuer(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

async fn discover(engine: &SsoEngine, spec: &OidcSpec) -> Result<Discovery, Refused> {
    let url = format!(
        "{}/.well-known/openid-configuration",
        spec.issuer_url.trim_end_matches('/')
    );
    let resp = engine
        .http()?
        .get(&url)
        .await
        .map_err(|e| Refused(format!("reading the provider's discovery document: {e}")))?;
    let doc = json_answer("the discovery document", &resp)?;
    let doc: Discovery =
        serde_json::from_value(doc).map_err(|e| Refused(format!("the discovery document at {url}: {e}")))?;
    if !same_issuer(&doc.issuer, &spec.issuer_url) {
        return Err(Refused(format!(
            "the discovery document names issuer \"{}\", the connector's issuer_url is \"{}\"",
            doc.issuer, spec.issuer_url
        )));
    }
    Ok(doc)
}

fn pkce_challenge(verifier: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.as_ref())
}

fn redirect_uri(spec: &OidcSpec) -> Result<&str, Refused> {
    spec.redirect_url
        .first()
        .map(String::as_str)
        .ok_or_else(|| Refused("the connector has no redirect_url".into()))
}

/// The provider's authorization URL for `req`.
pub(super) async fn auth_url(
    engine: &SsoEngine,
    spec: &OidcSpec,
    req: &SsoRequest,
) -> Result<String, Refused> {
    let doc = discover(engine, spec).await?;
    let mut scope = vec!["openid".to_owned()];
    for s in &spec.scope {
        if !scope.contains(s) {
            scope.push(s.clone());
        }
    }
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("response_type", "code")
        .append_pair("client_id", &spec.client_id)
        .append_pair("redirect_uri", redirect_uri(spec)?)
        .append_pair("scope", &scope.join(" "))
        .append_pair("state", &req.state)
        .append_pair("nonce", req.nonce.expose())
        .append_pair("code_challenge", &pkce_challenge(req.pkce_verifier.expose()))
        .append_pair("code_challenge_method", "S256");
    if let Some(prompt) = &spec.prompt {
        q.append_pair("prompt", prompt);
    }
    let sep = if doc.authorization_endpoint.contains('?') {
        '&'
    } else {
        '?'
    };
    Ok(format!("{}{sep}{}", doc.authorization_endpoint, q.finish()))
}

#[derive(Deserialize)]
struct TokenAnswer {
    id_token: Option<String>,
    access_token: Option<String>,
}

/// Exchanges `code`, checks the ID token, merges the userinfo claims and maps them to roles.
pub(super) async fn finish(
    engine: &SsoEngine,
    spec: &OidcSpec,
    req: &SsoRequest,
    code: &str,
) -> Result<SsoIdentity, Refused> {
    let doc = discover(engine, spec).await?;
    let secret = spec
        .client_secret
        .as_ref()
        .ok_or_else(|| Refused("the connector has no client_secret".into()))?;
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "authorization_code")
        .append_pair("code", code)
        .append_pair("redirect_uri", redirect_uri(spec)?)
        .append_pair("code_verifier", req.pkce_verifier.expose())
        .append_pair("client_id", &spec.client_id)
        .finish();
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        enc(&spec.client_id),
        enc(secret.expose())
    ));
    let request = Request::builder()
        .method(Method::POST)
        .uri(&doc.token_endpoint)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, "application/json")
        .header(header::AUTHORIZATION, format!("Basic {basic}"))
        .body(Full::new(Bytes::from(form)))
        .map_err(|_| {
            Refused(format!(
                "the token endpoint \"{}\" is not a URL",
                doc.token_endpoint
            ))
        })?;
    let resp = engine
        .http()?
        .send(request)
        .await
        .map_err(|e| Refused(format!("exchanging the code: {e}")))?;
    let answer = json_answer("exchanging the code", &resp)?;
    let answer: TokenAnswer =
        serde_json::from_value(answer).map_err(|e| Refused(format!("the token endpoint's answer: {e}")))?;
    let id_token = answer
        .id_token
        .ok_or_else(|| Refused("the token endpoint's answer has no id_token".into()))?;

    // The signature, with a refetch of the provider's keys when the kid is unknown (rotation).
    let mut keys = engine.jwks(&doc.jwks_uri, false).await?;
    let kid = jws::header_kid(&id_token)?;
    if !kid.is_empty() && !keys.iter().any(|k| k.kid.as_deref() == Some(kid.as_str())) {
        keys = engine.jwks(&doc.jwks_uri, true).await?;
    }
    let claims = jws::verify(&id_token, &keys)?;
    check_claims(
        &claims,
        &doc.issuer,
        &spec.client_id,
        req.nonce.expose(),
        now_unix(),
    )?;

    let mut all = claims.clone();
    if let (Some(endpoint), Some(access)) = (&doc.userinfo_endpoint, &answer.access_token) {
        let request = Request::builder()
            .method(Method::GET)
            .uri(endpoint)
            .header(header::ACCEPT, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {access}"))
            .body(Full::default())
            .map_err(|_| Refused(format!("the userinfo endpoint \"{endpoint}\" is not a URL")))?;
        let resp = engine
            .http()?
            .send(request)
            .await
            .map_err(|e| Refused(format!("reading userinfo: {e}")))?;
        let info = json_answer("reading userinfo", &resp)?;
        if info.get("sub") != claims.get("sub") {
            return Err(Refused("userinfo names another subject than the ID token".into()));
        }
        if let (Some(all), Some(info)) = (all.as_object_mut(), info.as_object()) {
            for (k, v) in info {
                all.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    let username = ["email", "preferred_username", "sub"]
        .iter()
        .find_map(|c| all.get(*c).and_then(|v| v.as_str()).filter(|s| !s.is_empty()))
        .ok_or_else(|| Refused("the ID token names no user (email, preferred_username or sub)".into()))?
        .to_owned();
    Ok(SsoIdentity {
        roles: oidc_roles(spec, &all),
        username,
    })
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Issuer, audience (and `azp`), nonce, expiry and issue time of verified ID token claims.
fn check_claims(
    claims: &serde_json::Value,
    issuer: &str,
    client_id: &str,
    nonce: &str,
    now: i64,
) -> Result<(), Refused> {
    let iss = claims.get("iss").and_then(|v| v.as_str()).unwrap_or_default();
    if !same_issuer(iss, issuer) {
        return Err(Refused(format!(
            "the ID token's issuer \"{iss}\" is not the provider's \"{issuer}\""
        )));
    }
    let aud: Vec<&str> = match claims.get("aud") {
        Some(serde_json::Value::String(s)) => vec![s.as_str()],
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_str()).collect(),
        _ => vec![],
    };
    if !aud.contains(&client_id) {
        return Err(Refused(format!(
            "the ID token's audience {aud:?} does not include the client_id \"{client_id}\""
        )));
    }
    if let Some(azp) = claims.get("azp").and_then(|v| v.as_str())
        && aud.len() > 1
        && azp != client_id
    {
        return Err(Refused(format!(
            "the ID token's authorized party \"{azp}\" is not the client_id"
        )));
    }
    if claims.get("nonce").and_then(|v| v.as_str()) != Some(nonce) {
        return Err(Refused("the ID token's nonce is not this sign-in's".into()));
    }
    let exp = claims
        .get("exp")
        .and_then(serde_json::Value::as_i64)
        .ok_or_else(|| Refused("the ID token has no expiry (exp)".into()))?;
    if exp + LEEWAY_SECS < now {
        return Err(Refused(format!("the ID token expired {}s ago", now - exp)));
    }
    if let Some(iat) = claims.get("iat").and_then(serde_json::Value::as_i64)
        && iat - LEEWAY_SECS > now
    {
        return Err(Refused(
            "the ID token is issued in the future (iat); check the clocks".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_checked() {
        let ok = serde_json::json!({"iss": "https://idp/", "aud": ["svc", "other"], "azp": "svc",
            "nonce": "n", "exp": 1_000, "iat": 900, "sub": "a"});
        check_claims(&ok, "https://idp", "svc", "n", 950).unwrap();
        let cases = [
            ("iss", serde_json::json!("https://evil"), "issuer"),
            ("aud", serde_json::json!("other"), "audience"),
            ("azp", serde_json::json!("other"), "authorized party"),
            ("nonce", serde_json::json!("m"), "nonce"),
            ("exp", serde_json::json!(800), "expired"),
            ("iat", serde_json::json!(2_000), "future"),
        ];
        for (field, value, says) in cases {
            let mut c = ok.clone();
            c[field] = value;
            let Err(Refused(why)) = check_claims(&c, "https://idp", "svc", "n", 950) else {
                panic!("{field} accepted");
            };
            assert!(why.contains(says), "{field}: {why}");
        }
    }

    #[test]
    fn pkce_matches_rfc7636_example() {
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }
}

//! Single sign-on through the Proxy: `POST /webapi/<kind>/login/console` (from `tsh login
//! --auth=<connector>`) and the identity provider's redirect to `/v1/webapi/<kind>/callback`
//! (`<kind>`: `oidc`, `github`, `saml`), plus the connectors the ping shows.
//!
//! Data flow: `tsh` sends its public keys and its loopback URL → the Auth Service stores the
//! sign-in and answers with the provider's URL → the browser signs in at the provider, which
//! sends it to the callback here → the Auth Service checks the answer and issues certificates
//! → this handler seals them (AES-256-GCM, [`svc_core::webapi::seal`]) with the key only `tsh`
//! put in its loopback URL and redirects the browser there. A refusal whose sign-in is known goes
//! back to `tsh` the same way; an unknown state is refused here, to the browser.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use svc_core::webapi::{
    LoginAnswer, SSO_RESPONSE_PARAM, SSO_SECRET_KEY_PARAM, SsoConsoleAnswer, SsoConsoleBody, SsoResult, seal,
};

use super::login::{SignInCallError, call_auth};
use super::{Body, ResponseBody, WebService, full, json_error, web_service};
use crate::auth::{ClientError, FailoverClient, proto};

/// The sign-in kinds served.
pub const SSO_KINDS: [&str; 3] = ["oidc", "github", "saml"];

/// The path prefixes to mount [`sso_service`] under.
pub fn sso_mount_prefixes() -> Vec<String> {
    SSO_KINDS
        .iter()
        .flat_map(|k| [format!("/webapi/{k}/"), format!("/v1/webapi/{k}/")])
        .collect()
}

/// Bodies larger than this are refused (a SAML response form is the largest, well under this).
const MAX_BODY: usize = 256 * 1024;

struct State {
    link: Arc<FailoverClient>,
    auth_addr: Option<String>,
    deadline: Duration,
}

/// The console and callback handler over `link`. Clients are told to reach the Auth API at
/// `public_auth_addr`, or through this proxy when `None`; a call the Auth Service does not
/// answer within `deadline` fails with `503`.
pub fn sso_service(
    link: Arc<FailoverClient>,
    public_auth_addr: Option<String>,
    deadline: Duration,
) -> WebService {
    let state = Arc::new(State {
        link,
        auth_addr: public_auth_addr,
        deadline,
    });
    web_service(tower::service_fn(move |req: Request<Body>| {
        let state = state.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(&state, req).await) }
    }))
}

fn text(status: StatusCode, message: &str) -> Response<ResponseBody> {
    let mut resp = Response::new(full(format!("{message}\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn http_status(code: tonic::Code) -> StatusCode {
    match code {
        tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// One call to the Auth Service under the deadline ([`call_auth`]): `Err((status, message))` to
/// answer with.
async fn call<T, F, Fut>(state: &State, f: F) -> Result<T, (StatusCode, String)>
where
    F: FnOnce(crate::auth::AuthClient) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    match call_auth(&state.link, Some(state.deadline), f).await {
        Ok(v) => Ok(v),
        Err(e @ SignInCallError::Deadline { .. }) => Err((StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
        Err(SignInCallError::Auth(ClientError::Status { code, message })) => {
            Err((http_status(code), message))
        }
        Err(SignInCallError::Auth(e)) => Err((
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "sign-in needs the Auth Service ({}), which is unavailable: {e}",
                state.link.addrs().join(", ")
            ),
        )),
    }
}

async fn handle(state: &State, req: Request<Body>) -> Response<ResponseBody> {
    let path = req.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/webapi/")
        && let Some((kind, "login/console")) = rest.split_once('/')
        && SSO_KINDS.contains(&kind)
    {
        return console(state, kind, req).await;
    }
    if let Some(rest) = path.strip_prefix("/v1/webapi/")
        && let Some((kind, tail)) = rest.split_once('/')
        && SSO_KINDS.contains(&kind)
        && (matches!(tail, "callback" | "acs") || (kind == "saml" && tail.starts_with("acs/")))
    {
        return callback(state, kind, req).await;
    }
    json_error(StatusCode::NOT_FOUND, &format!("no such sign-in path: {path}"))
}

async fn console(state: &State, kind: &str, req: Request<Body>) -> Response<ResponseBody> {
    if req.method() != Method::POST {
        return json_error(StatusCode::METHOD_NOT_ALLOWED, "use POST to start a sign-in");
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &format!("reading the request body: {e}")),
    };
    let body: SsoConsoleBody = match serde_json::from_slice(&bytes) {
        Ok(b) => b,
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("expected a sign-in JSON body: {e}"),
            );
        }
    };
    let Ok(tls_public_key) = base64::engine::general_purpose::STANDARD.decode(&body.tls_public_key) else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "tls_public_key: expected standard base64",
        );
    };
    let request = proto::SsoBeginRequest {
        kind: kind.to_owned(),
        connector: body.connector_id,
        client_redirect_url: body.redirect_url.into_inner(),
        tls_public_key,
        ssh_public_key: body.ssh_public_key,
        ttl_seconds: body.ttl_seconds,
    };
    match call(state, |mut c| async move {
        c.raw().sso_begin(request).await.map_err(ClientError::from)
    })
    .await
    {
        Ok(answer) => {
            let answer = SsoConsoleAnswer {
                redirect_url: answer.into_inner().redirect_url,
            };
            let mut resp = Response::new(full(serde_json::to_vec(&answer).unwrap_or_default()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err((status, message)) => json_error(status, &message),
    }
}

async fn callback(state: &State, kind: &str, req: Request<Body>) -> Response<ResponseBody> {
    let query = req.uri().query().unwrap_or_default().to_owned();
    let form = if req.method() == Method::POST {
        match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes().to_vec(),
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    &format!("reading the callback body: {e}"),
                );
            }
        }
    } else if req.method() == Method::GET {
        Vec::new()
    } else {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the sign-in callback takes GET or POST",
        );
    };
    let request = proto::SsoCallbackRequest {
        kind: kind.to_owned(),
        query,
        form,
    };
    let answer = match call(state, |mut c| async move {
        c.raw().sso_callback(request).await.map_err(ClientError::from)
    })
    .await
    {
        Ok(a) => a.into_inner(),
        Err((status, message)) => {
            return text(status, &format!("Sign-in failed: {message}"));
        }
    };
    let result = match answer.certs {
        Some(c) if answer.error.is_empty() => SsoResult::Ok(LoginAnswer {
            name: c.name,
            cluster_name: c.cluster_name,
            tls_cert_pem: c.tls_cert_pem,
            ssh_cert: c.ssh_cert,
            tls_ca_pems: c.tls_ca_pems,
            ssh_ca_keys: c.ssh_ca_keys,
            not_after_unix: c.not_after_unix,
            auth_addr: state.auth_addr.clone(),
        }),
        _ => SsoResult::Error(if answer.error.is_empty() {
            "the Auth Service issued nothing".into()
        } else {
            answer.error
        }),
    };
    match back_to_client(&answer.client_redirect_url, &result) {
        Ok(location) => {
            let mut resp = text(StatusCode::FOUND, "Back to tsh…");
            match header::HeaderValue::from_str(&location) {
                Ok(v) => {
                    resp.headers_mut().insert(header::LOCATION, v);
                    resp
                }
                Err(_) => text(
                    StatusCode::BAD_GATEWAY,
                    "Sign-in failed: the client's address is unusable",
                ),
            }
        }
        Err(why) => text(StatusCode::BAD_GATEWAY, &format!("Sign-in failed: {why}")),
    }
}

/// The loopback URL with its `secret_key` replaced by the sealed result.
fn back_to_client(client_redirect_url: &str, result: &SsoResult) -> Result<String, String> {
    let (base, query) = client_redirect_url
        .split_once('?')
        .unwrap_or((client_redirect_url, ""));
    let mut key = None;
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == SSO_SECRET_KEY_PARAM {
            key = Some(v.into_owned());
        } else if k != SSO_RESPONSE_PARAM {
            out.append_pair(&k, &v);
        }
    }
    let key = key.ok_or("the client's address carries no sealing key")?;
    let plain = serde_json::to_vec(result).map_err(|e| e.to_string())?;
    let sealed = seal(&key, &plain).map_err(|e| e.to_string())?;
    out.append_pair(SSO_RESPONSE_PARAM, &sealed);
    Ok(format!("{base}?{}", out.finish()))
}

/// The configured connectors as the ping shows them, asked of the Auth Service at most once per
/// `max_age` (an unknown name asks again at once).
pub struct ConnectorCache {
    link: Arc<FailoverClient>,
    max_age: Duration,
    cached: tokio::sync::Mutex<Option<(Instant, Vec<proto::AuthConnector>)>>,
}

impl std::fmt::Debug for ConnectorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorCache").finish_non_exhaustive()
    }
}

impl ConnectorCache {
    /// A cache over `link`.
    pub fn new(link: Arc<FailoverClient>, max_age: Duration) -> Self {
        Self {
            link,
            max_age,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// The connectors (empty when the Auth Service cannot say: the ping still answers), fresh
    /// when `need` names one not in the cached list.
    pub async fn connectors(&self, need: Option<&str>) -> Vec<proto::AuthConnector> {
        let mut cached = self.cached.lock().await;
        if let Some((at, list)) = &*cached
            && at.elapsed() < self.max_age
            && need.is_none_or(|n| list.iter().any(|c| c.name == n))
        {
            return list.clone();
        }
        let fetch = async {
            let mut c = self.link.client().await?;
            c.raw()
                .list_auth_connectors(proto::Empty {})
                .await
                .map_err(ClientError::from)
        };
        match tokio::time::timeout(Duration::from_secs(5), fetch).await {
            Ok(Ok(list)) => {
                let list = list.into_inner().connectors;
                *cached = Some((Instant::now(), list.clone()));
                list
            }
            _ => cached.as_ref().map(|(_, l)| l.clone()).unwrap_or_default(),
        }
    }
}

/// `/webapi/ping` with the connectors in its `auth` section (`auth.<kind>` for the first
/// connector of each kind, every one in `auth.connectors`), and `/webapi/ping/<connector>`: the
/// ping as a client signing in through that connector sees it (`auth.type` its kind; `local`
/// for the local one). `/webapi/find` and everything else is `inner`'s.
pub fn ping_with_connectors(inner: super::ping::PingService, cache: Arc<ConnectorCache>) -> WebService {
    let inner = Arc::new(inner);
    web_service(tower::service_fn(move |req: Request<Body>| {
        let (inner, cache) = (inner.clone(), cache.clone());
        async move {
            let path = req.uri().path();
            let pick = match path.strip_prefix(super::ping::PING_PATH) {
                Some("") => None,
                Some(rest) if rest.starts_with('/') && rest.len() > 1 => Some(rest[1..].to_owned()),
                _ => return Ok::<_, std::convert::Infallible>(inner.answer(req.method(), path)),
            };
            let base = inner.answer(req.method(), super::ping::PING_PATH);
            if !base.status().is_success() {
                return Ok(base);
            }
            let connectors = cache.connectors(pick.as_deref()).await;
            let resp = match dynamic_ping(inner.ping_body(), &connectors, pick.as_deref()) {
                Ok(body) => {
                    let mut resp = Response::new(full(body));
                    resp.headers_mut().insert(
                        header::CONTENT_TYPE,
                        header::HeaderValue::from_static("application/json"),
                    );
                    resp
                }
                Err(why) => json_error(StatusCode::NOT_FOUND, &why),
            };
            Ok(resp)
        }
    }))
}

/// The ping document `body` with the connectors added to its `auth` section.
fn dynamic_ping(
    body: &[u8],
    connectors: &[proto::AuthConnector],
    pick: Option<&str>,
) -> Result<Vec<u8>, String> {
    let mut ping: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let auth = ping
        .get_mut("auth")
        .and_then(|a| a.as_object_mut())
        .ok_or("the ping has no auth section")?;
    let entry = |c: &proto::AuthConnector| serde_json::json!({"name": c.name, "display": c.display});
    match pick {
        Some("local") => {
            auth.insert("type".into(), "local".into());
        }
        Some(name) => {
            let c = connectors.iter().find(|c| c.name == name).ok_or_else(|| {
                format!("no sign-in connector named \"{name}\" (see tctl get oidc, github, saml)")
            })?;
            auth.insert("type".into(), c.kind.clone().into());
            auth.insert(c.kind.clone(), entry(c));
        }
        None => {
            for c in connectors {
                auth.entry(c.kind.clone()).or_insert_with(|| entry(c));
            }
        }
    }
    auth.insert(
        "connectors".into(),
        connectors
            .iter()
            .map(|c| serde_json::json!({"kind": c.kind, "name": c.name, "display": c.display}))
            .collect::<Vec<_>>()
            .into(),
    );
    serde_json::to_vec(&ping).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_result_replaces_the_key() {
        let key = "0f".repeat(32);
        let url = format!("http://127.0.0.1:4000/callback?{SSO_SECRET_KEY_PARAM}={key}");
        let location = back_to_client(&url, &SsoResult::Error("no role".into())).unwrap();
        assert!(
            location.starts_with("http://127.0.0.1:4000/callback?response="),
            "{location}"
        );
        assert!(!location.contains(&key));
        let sealed = location.split_once("response=").unwrap().1;
        let plain = svc_core::webapi::open(&key, sealed).unwrap();
        assert!(String::from_utf8(plain).unwrap().contains("no role"));
        assert!(back_to_client("http://127.0.0.1:4000/", &SsoResult::Error("x".into())).is_err());
    }

    #[test]
    fn ping_names_the_connectors() {
        let body =
            br#"{"auth":{"type":"local","second_factor":"off","local":{"name":""}},"cluster_name":"c"}"#;
        let c = |kind: &str, name: &str| proto::AuthConnector {
            kind: kind.into(),
            name: name.into(),
            display: name.to_uppercase(),
        };
        let all = [c("github", "gh"), c("oidc", "corp"), c("oidc", "other")];
        let v: serde_json::Value = serde_json::from_slice(&dynamic_ping(body, &all, None).unwrap()).unwrap();
        assert_eq!(v["auth"]["type"], "local");
        assert_eq!(v["auth"]["oidc"]["name"], "corp");
        assert_eq!(v["auth"]["github"]["display"], "GH");
        assert_eq!(v["auth"]["connectors"].as_array().unwrap().len(), 3);
        let v: serde_json::Value =
            serde_json::from_slice(&dynamic_ping(body, &all, Some("other")).unwrap()).unwrap();
        assert_eq!(v["auth"]["type"], "oidc");
        assert_eq!(v["auth"]["oidc"]["name"], "other");
        let v: serde_json::Value =
            serde_json::from_slice(&dynamic_ping(body, &all, Some("local")).unwrap()).unwrap();
        assert_eq!(v["auth"]["type"], "local");
        assert!(
            dynamic_ping(body, &all, Some("nope"))
                .unwrap_err()
                .contains("no sign-in connector named")
        );
    }
}

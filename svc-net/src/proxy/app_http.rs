//! HTTP-aware relay for `http://` and `https://` apps: the proxy reads the user's requests
//! (HTTP/1.1, WebSocket and other upgrades included), removes every header through which svc
//! tells an app who the user is, sets its own, and forwards the requests to the app over the
//! agent's stream (the agent adds TLS for `https://` apps).
//!
//! Headers svc owns ([`is_identity_header`]): any `X-Svc-*` or `Svc-*` header, `Forwarded`,
//! `X-Forwarded-*` and `X-Real-IP`. A client's value for any of them never reaches the app.
//! svc sets [`USER_HEADER`] (the user name from the certificate), [`ROLES_HEADER`] (the
//! user's roles, comma-separated) and `X-Forwarded-For` (the client's address as the proxy saw
//! it). `tcp://` apps stay raw TCP: svc cannot see inside them.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Mutex;

use crate::io::BoxIo;

/// The user name svc vouches for.
pub const USER_HEADER: &str = "x-svc-user";
/// The user's roles (comma-separated) svc vouches for.
pub const ROLES_HEADER: &str = "x-svc-roles";

/// Whether `name` is a header svc owns: removed from the client's requests before they reach
/// the app, whatever its value.
pub fn is_identity_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with("x-svc-")
        || name.starts_with("svc-")
        || name.starts_with("x-forwarded-")
        || name == "forwarded"
        || name == "x-real-ip"
}

/// Who the user is, as the proxy verified it from the user's certificate.
#[derive(Debug, Clone)]
pub struct AppUser {
    /// The user name.
    pub username: String,
    /// The user's roles.
    pub roles: Vec<String>,
    /// The client's address as the proxy saw it.
    pub client: IpAddr,
}

/// Removes every header svc owns from `headers` and sets svc's own for `user`. A user or role
/// name that is not a valid header value keeps only its visible ASCII characters.
pub fn rewrite_identity_headers(headers: &mut HeaderMap, user: &AppUser) {
    let owned: Vec<HeaderName> = headers
        .keys()
        .filter(|k| is_identity_header(k.as_str()))
        .cloned()
        .collect();
    for name in owned {
        headers.remove(&name);
    }
    let value = |text: &str| {
        HeaderValue::from_str(text).unwrap_or_else(|_| {
            let visible: String = text
                .chars()
                .filter(|c| c.is_ascii_graphic() || *c == ' ')
                .collect();
            HeaderValue::from_str(&visible).unwrap_or_else(|_| HeaderValue::from_static(""))
        })
    };
    headers.insert(HeaderName::from_static(USER_HEADER), value(&user.username));
    headers.insert(
        HeaderName::from_static(ROLES_HEADER),
        value(&user.roles.join(",")),
    );
    headers.insert(
        HeaderName::from_static("x-forwarded-for"),
        value(&user.client.to_string()),
    );
}

/// Opens a new stream to the app through the agent (when the app closed the previous one).
pub type Redial = Arc<dyn Fn() -> BoxFuture<'static, Result<BoxIo, String>> + Send + Sync>;

type Body = Either<Incoming, Full<Bytes>>;

struct Upstream {
    first: Option<BoxIo>,
    sender: Option<SendRequest<Incoming>>,
}

/// Serves the user's HTTP/1.1 connection `client` for app `app`: each request has its identity
/// headers rewritten ([`rewrite_identity_headers`]) and goes to the app over `first` (then over
/// streams from `redial` when the app closed it); an upgrade (WebSocket) is relayed both ways
/// once the app answers `101 Switching Protocols`.
pub async fn relay<C>(client: C, first: BoxIo, redial: Redial, user: AppUser, app: String)
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let upstream = Arc::new(Mutex::new(Upstream {
        first: Some(first),
        sender: None,
    }));
    let user = Arc::new(user);
    let app = Arc::new(app);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (upstream, redial, user, app) = (upstream.clone(), redial.clone(), user.clone(), app.clone());
        async move {
            Ok::<_, Infallible>(match forward(req, &upstream, &redial, &user).await {
                Ok(resp) => resp,
                Err(e) => {
                    tracing::info!(app = %app, user = %user.username, error = %e, "app request failed");
                    bad_gateway(&format!("svc: app \"{app}\": {e}\n"))
                }
            })
        }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(error = %e, "app client connection ended");
    }
}

fn bad_gateway(text: &str) -> Response<Body> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(text.to_owned()))));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}

async fn sender(up: &mut Upstream, redial: &Redial) -> Result<SendRequest<Incoming>, String> {
    if let Some(mut s) = up.sender.take()
        && s.ready().await.is_ok()
    {
        return Ok(s);
    }
    let io = match up.first.take() {
        Some(io) => io,
        None => redial().await?,
    };
    let (mut s, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP to the app: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "app upstream connection ended");
        }
    });
    s.ready().await.map_err(|e| format!("HTTP to the app: {e}"))?;
    Ok(s)
}

async fn forward(
    mut req: Request<Incoming>,
    upstream: &Mutex<Upstream>,
    redial: &Redial,
    user: &AppUser,
) -> Result<Response<Body>, String> {
    rewrite_identity_headers(req.headers_mut(), user);
    let upgrade = req.headers().contains_key(http::header::UPGRADE);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let mut up = upstream.lock().await;
    let mut s = sender(&mut up, redial).await?;
    let resp = s.send_request(req).await;
    if !upgrade {
        // Kept for the next request; an upgraded connection belongs to the upgrade.
        up.sender = Some(s);
    }
    drop(up);
    let mut resp = resp.map_err(|e| format!("HTTP to the app: {e}"))?;
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
    Ok(resp.map(Either::Left))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_identity_header_a_client_sends_is_replaced_by_svcs() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("X-Svc-User", "admin"),
            ("x-svc-roles", "editor"),
            ("Svc-Jwt-Assertion", "forged"),
            ("X-Forwarded-For", "10.9.9.9"),
            ("X-Forwarded-Host", "evil"),
            ("Forwarded", "for=10.9.9.9"),
            ("X-Real-IP", "10.9.9.9"),
            ("Accept", "text/html"),
        ] {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_static(v),
            );
        }
        h.append("x-svc-user", HeaderValue::from_static("root"));
        let user = AppUser {
            username: "alice".into(),
            roles: vec!["access".into(), "dev".into()],
            client: "192.0.2.7".parse().unwrap(),
        };
        rewrite_identity_headers(&mut h, &user);
        assert_eq!(h.get_all("x-svc-user").iter().collect::<Vec<_>>(), ["alice"]);
        assert_eq!(
            h.get_all("x-svc-roles").iter().collect::<Vec<_>>(),
            ["access,dev"]
        );
        assert_eq!(
            h.get_all("x-forwarded-for").iter().collect::<Vec<_>>(),
            ["192.0.2.7"]
        );
        for gone in ["svc-jwt-assertion", "x-forwarded-host", "forwarded", "x-real-ip"] {
            assert!(!h.contains_key(gone), "{gone}");
        }
        assert_eq!(h["accept"], "text/html");
        assert!(!is_identity_header("x-svcuser") && !is_identity_header("authorization"));
    }

    proptest::proptest! {
        #[test]
        fn no_client_value_survives(name in "(x-svc-|svc-|x-forwarded-)[a-z0-9-]{0,12}", value in "[a-zA-Z0-9]{1,16}") {
            let mut h = HeaderMap::new();
            h.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(&value).unwrap());
            let user = AppUser { username: "alice".into(), roles: vec![], client: "192.0.2.7".parse().unwrap() };
            rewrite_identity_headers(&mut h, &user);
            let own = [("x-svc-user", "alice"), ("x-svc-roles", ""), ("x-forwarded-for", "192.0.2.7")];
            proptest::prop_assert_eq!(h.len(), own.len());
            for (k, v) in own {
                proptest::prop_assert_eq!(h.get_all(k).iter().collect::<Vec<_>>(), [v]);
            }
        }
    }
}

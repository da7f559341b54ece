//! What both Kubernetes ends (the proxy's entry and the agent's service) share: the Kubernetes
//! `Status` object kubectl prints, and the relay of connection upgrades (`kubectl exec`,
//! `attach`, `cp` and `port-forward` switch to WebSocket or SPDY/3.1 with `101 Switching
//! Protocols`, then carry their streams both ways over the same connection).

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// The body of the HTTP/1.1 responses both Kubernetes ends write.
pub(crate) type Body = UnsyncBoxBody<Bytes, hyper::Error>;

pub(crate) fn text_body(text: String) -> Body {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Whether `req` asks to switch protocols (`Upgrade: websocket` or `Upgrade: SPDY/3.1`).
pub(crate) fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.headers().contains_key(header::UPGRADE)
}

/// Takes the client's side of an upgrade out of `req` (before it is sent on), if it asks for one.
pub(crate) fn client_upgrade<B>(req: &mut Request<B>) -> Option<OnUpgrade> {
    is_upgrade(req).then(|| hyper::upgrade::on(req))
}

/// When `resp` switches protocols (`101`) and the client asked to, relays the upgraded
/// connections both ways until either side closes; `what` names the hop in the logs.
pub(crate) fn relay_upgrade(client: Option<OnUpgrade>, resp: &mut Response<Incoming>, what: &'static str) {
    let Some(client) = client else { return };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return;
    }
    let upstream = hyper::upgrade::on(resp);
    tokio::spawn(async move {
        match tokio::try_join!(client, upstream) {
            Ok((c, u)) => {
                let (mut c, mut u) = (TokioIo::new(c), TokioIo::new(u));
                if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut u).await {
                    tracing::debug!(hop = what, error = %e, "kubernetes upgraded stream ended");
                }
            }
            Err(e) => tracing::info!(hop = what, error = %e, "kubernetes upgrade failed"),
        }
    });
}

/// A Kubernetes `Status` failure, the shape kubectl prints.
pub(crate) fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    let mut resp = Response::new(text_body(body.to_string()));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_kubernetes_status_objects() {
        let resp = status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "access denied to kube_cluster \"c\"",
        );
        assert_eq!(resp.status(), 403);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    }
}

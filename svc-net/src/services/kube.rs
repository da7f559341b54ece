//! What both Kubernetes ends (the proxy's entry and the agent's service) answer with: the
//! Kubernetes `Status` object kubectl prints.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};

/// The body of the HTTP/1.1 responses both Kubernetes ends write.
pub(crate) type Body = UnsyncBoxBody<Bytes, hyper::Error>;

pub(crate) fn text_body(text: String) -> Body {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed_unsync()
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

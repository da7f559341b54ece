//! The server end of the connection upgrade ([`conn_upgrade`](crate::conn_upgrade)):
//! `GET /webapi/connectionupgrade` with `Upgrade: alpn`, or `Upgrade: websocket` with
//! `Sec-WebSocket-Protocol: alpn`, answers `101 Switching Protocols` and hands the upgraded
//! stream (unframed from WebSocket binary frames in that form) to the proxy's ALPN router as a
//! new [`Connection`]: the client's address, a fresh peek deadline (a client that never sends
//! its inner ClientHello is cut off by it, like one on the web port) and the proxy's shutdown.
//! The web connection's task waits for the upgraded one, so the listener's connection cap and
//! drain count upgraded connections.
//! A request without an upgrade this endpoint knows is answered `400` as plain HTTP.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
    time::Duration,
};

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

use super::{Body, ClientAddr, ResponseBody, UpgradedTask, WebFuture, full, json_error};
use crate::conn_upgrade::{
    UPGRADE_ALPN, UPGRADE_WEBSOCKET, WEBSOCKET_PROTOCOL, websocket_accept,
    ws::{Role, WsStream},
};
use crate::io::{BoxIo, ConnService, Connection};

/// The router upgraded streams go to; set once the proxy has built it (the web API is one of
/// the router's own routes, so it exists first).
pub(crate) type RouterCell = Arc<OnceLock<ConnService>>;

/// The upgrade endpoint (mounted at [`PATH`](crate::conn_upgrade::PATH)).
#[derive(Clone)]
pub struct UpgradeService {
    router: RouterCell,
    local_addr: SocketAddr,
    peek_timeout: Duration,
    shutdown: CancellationToken,
}

impl UpgradeService {
    /// Hands upgraded streams to the router in `router` (once set), as connections to
    /// `local_addr` with `peek_timeout` to send their ClientHello, ended by `shutdown`.
    pub(crate) fn new(
        router: RouterCell,
        local_addr: SocketAddr,
        peek_timeout: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            router,
            local_addr,
            peek_timeout,
            shutdown,
        }
    }
}

/// Which form the request asks for, or why it is not an upgrade.
#[derive(Debug, PartialEq, Eq)]
enum Form {
    Alpn,
    WebSocket { accept: String },
}

fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

fn form(headers: &HeaderMap) -> Result<Form, &'static str> {
    if has_token(headers, header::UPGRADE, UPGRADE_ALPN) {
        return Ok(Form::Alpn);
    }
    if has_token(headers, header::UPGRADE, UPGRADE_WEBSOCKET) {
        if !has_token(headers, header::SEC_WEBSOCKET_PROTOCOL, WEBSOCKET_PROTOCOL) {
            return Err("a WebSocket upgrade here must ask for Sec-WebSocket-Protocol: alpn");
        }
        let key = headers
            .get(header::SEC_WEBSOCKET_KEY)
            .and_then(|k| k.to_str().ok())
            .ok_or("a WebSocket upgrade needs a Sec-WebSocket-Key")?;
        return Ok(Form::WebSocket {
            accept: websocket_accept(key.trim()),
        });
    }
    Err("expected Upgrade: alpn, or Upgrade: websocket with Sec-WebSocket-Protocol: alpn")
}

impl UpgradeService {
    fn handle(&self, mut req: Request<Body>) -> Response<ResponseBody> {
        if req.method() != http::Method::GET {
            return json_error(StatusCode::METHOD_NOT_ALLOWED, "the connection upgrade takes GET");
        }
        if req.version() != http::Version::HTTP_11 {
            // HTTP/2 has no `Upgrade` (and HTTP/1.0 no `101`).
            return json_error(
                StatusCode::BAD_REQUEST,
                "the connection upgrade needs HTTP/1.1 (is the load balancer speaking HTTP/2 to the proxy?)",
            );
        }
        let form = match form(req.headers()) {
            Ok(f) => f,
            Err(msg) => return json_error(StatusCode::BAD_REQUEST, msg),
        };
        let Some(router) = self.router.get().cloned() else {
            return json_error(StatusCode::SERVICE_UNAVAILABLE, "the proxy is starting");
        };
        let peer = req
            .extensions()
            .get::<ClientAddr>()
            .map_or(self.local_addr, |c| c.0);
        let on_upgrade = hyper::upgrade::on(&mut req);
        let (local, peek, shutdown) = (self.local_addr, self.peek_timeout, self.shutdown.clone());
        let websocket = matches!(form, Form::WebSocket { .. });
        let slot = req.extensions().get::<UpgradedTask>().cloned();
        let task = tokio::spawn(async move {
            let upgraded = match on_upgrade.await {
                Ok(u) => TokioIo::new(u),
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "connection upgrade did not complete");
                    return;
                }
            };
            let io: BoxIo = if websocket {
                Box::new(WsStream::new(upgraded, Role::Server))
            } else {
                Box::new(upgraded)
            };
            let mut conn = Connection::new(io, peer, local, peek);
            conn.shutdown = shutdown;
            if websocket {
                tracing::debug!(%peer, "upgraded connection (WebSocket form) handed to the router");
            } else {
                tracing::debug!(%peer, "upgraded connection handed to the router");
            }
            if let Err(e) = router.oneshot(conn).await {
                tracing::debug!(%peer, error = %e, "upgraded connection ended");
            }
        });
        if let Some(slot) = slot {
            slot.set(task);
        }
        let mut resp = Response::new(full(""));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        match form {
            Form::Alpn => {
                h.insert(header::UPGRADE, HeaderValue::from_static(UPGRADE_ALPN));
            }
            Form::WebSocket { accept } => {
                h.insert(header::UPGRADE, HeaderValue::from_static(UPGRADE_WEBSOCKET));
                h.insert(
                    header::SEC_WEBSOCKET_PROTOCOL,
                    HeaderValue::from_static(WEBSOCKET_PROTOCOL),
                );
                if let Ok(v) = HeaderValue::from_str(&accept) {
                    h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
                }
            }
        }
        resp
    }
}

impl Service<Request<Body>> for UpgradeService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = WebFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        WebFuture::Ready(std::future::ready(Ok(self.handle(req))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn forms_are_recognised_and_others_refused() {
        assert_eq!(form(&headers(&[("upgrade", "alpn")])), Ok(Form::Alpn));
        assert_eq!(
            form(&headers(&[
                ("upgrade", "websocket"),
                ("sec-websocket-protocol", "chat, alpn"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ])),
            Ok(Form::WebSocket {
                accept: "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".into()
            })
        );
        assert!(form(&headers(&[("upgrade", "websocket")])).is_err());
        assert!(form(&headers(&[])).is_err());
    }
}

//! The proxy's end of multiplexed resource connections (ALPN `svc-mux`, the protocol in
//! [`services::mux`](crate::services::mux)): one TLS connection with the user's certificate,
//! HTTP/2 inside, each `CONNECT` stream served as a resource connection of its own.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use svc_core::identity::UserIdentity;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::{ALPNS, Refusal, ResourceProxy};
use crate::io::rewind::Rewind;
use crate::route::alpn;
use crate::services::{MAX_LINE, ResourceRequest, mux};

/// What an HTTP/2 client sends first (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Who holds the connection, checked again for every stream.
struct Holder {
    chain: Vec<CertificateDer<'static>>,
    leaf: Vec<u8>,
    peer: SocketAddr,
    local: SocketAddr,
}

impl ResourceProxy {
    /// Serves HTTP/2 on `tls`, whose certificate `chain` was verified as `user`: each `CONNECT`
    /// stream is a resource connection. New streams are refused once the certificate expires
    /// or the proxy shuts down (`shutdown`); the open ones go on.
    pub(super) async fn serve_mux<S>(
        &self,
        mut tls: S,
        chain: Vec<CertificateDer<'static>>,
        user: UserIdentity,
        peer: SocketAddr,
        local: SocketAddr,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<(), Refusal>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // A client that says nothing after its TLS handshake is not kept: the HTTP/2 preface
        // is due under the handshake's deadline (pings only keep connections that started).
        let mut preface = [0u8; PREFACE.len()];
        let deadline = tokio::time::Instant::now() + self.inner.handshake_timeout;
        match tokio::time::timeout_at(deadline, tls.read_exact(&mut preface)).await {
            Ok(Ok(_)) if preface == *PREFACE => {}
            Ok(Ok(_)) => {
                return Err(Refusal::Text(
                    "a multiplexed connection without the HTTP/2 preface".into(),
                ));
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {
                return Err(Refusal::Text(
                    "no HTTP/2 preface on a multiplexed connection before the deadline".into(),
                ));
            }
        }
        let mut tls = Rewind::new(tls);
        tls.rewind(Bytes::from_static(PREFACE));
        let leaf = chain.first().map(|c| c.to_vec()).unwrap_or_default();
        let holder = Arc::new(Holder {
            chain,
            leaf,
            peer,
            local,
        });
        let proxy = self.clone();
        let service = hyper::service::service_fn(move |req| {
            let answer = proxy.mux_stream(req, &holder);
            async move { Ok::<_, Infallible>(answer) }
        });
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(mux::MAX_STREAMS)
            .initial_stream_window_size(mux::STREAM_WINDOW)
            .initial_connection_window_size(mux::CONNECTION_WINDOW)
            .max_frame_size(mux::MAX_FRAME)
            .max_header_list_size(mux::MAX_HEADER_LIST)
            .keep_alive_interval(Some(mux::KEEPALIVE))
            .keep_alive_timeout(mux::KEEPALIVE_TIMEOUT);
        let conn = builder.serve_connection(TokioIo::new(tls), service);
        tokio::pin!(conn);
        let left = user
            .validity
            .not_after
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tracing::debug!(%peer, user = %user.username, "multiplexed resource connection");
        let result = tokio::select! {
            r = conn.as_mut() => r,
            () = tokio::time::sleep(left) => {
                tracing::info!(%peer, user = %user.username, "the certificate of a multiplexed connection expired: no new streams");
                conn.as_mut().graceful_shutdown();
                conn.await
            }
            () = shutdown.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        result.map_err(|e| Refusal::Text(format!("multiplexed connection: {e}")))
    }

    /// Checks one stream and, when it may go on, serves it once upgraded; the answer is sent
    /// at once, the resource's own answer travelling in the stream.
    fn mux_stream(&self, mut req: Request<Incoming>, holder: &Arc<Holder>) -> Response<Full<Bytes>> {
        let peer = holder.peer;
        if req.method() != Method::CONNECT {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "only CONNECT streams are served here".into(),
            );
        }
        let user = match self
            .inner
            .verifier
            .verify_user_x509(&holder.chain, SystemTime::now())
        {
            Ok(user) => user,
            Err(e) => {
                tracing::info!(%peer, reason = %e, "multiplexed stream refused");
                return text(
                    StatusCode::FORBIDDEN,
                    format!("a user certificate is required: {e}"),
                );
            }
        };
        let header = |name: &str| req.headers().get(name).map(|v| v.as_bytes());
        let protocol = match header(mux::ALPN_HEADER).and_then(|p| std::str::from_utf8(p).ok()) {
            Some(p) if stream_protocols().any(|s| s == p) => p.to_owned(),
            other => {
                let msg = format!(
                    "header {} must name a resource protocol ({}), not {:?}",
                    mux::ALPN_HEADER,
                    stream_protocols().collect::<Vec<_>>().join(", "),
                    other
                );
                return text(StatusCode::BAD_REQUEST, msg);
            }
        };
        let request: ResourceRequest = match header(mux::REQUEST_HEADER) {
            Some(json) if json.len() <= MAX_LINE => match serde_json::from_slice(json) {
                Ok(r) => r,
                Err(e) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!("malformed resource request: {e}"),
                    );
                }
            },
            Some(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("header {} is longer than {MAX_LINE} bytes", mux::REQUEST_HEADER),
                );
            }
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("header {} is missing", mux::REQUEST_HEADER),
                );
            }
        };
        let upgrade = hyper::upgrade::on(&mut req);
        let (proxy, holder) = (self.clone(), holder.clone());
        tokio::spawn(async move {
            let stream = match upgrade.await {
                Ok(stream) => TokioIo::new(stream),
                Err(e) => {
                    tracing::debug!(peer = %holder.peer, error = %e, "a multiplexed stream ended before it opened");
                    return;
                }
            };
            let served = proxy
                .serve_request(
                    stream,
                    &protocol,
                    request,
                    &user,
                    &holder.leaf,
                    holder.peer,
                    holder.local,
                )
                .await;
            if let Err(e) = served {
                tracing::info!(peer = %holder.peer, reason = %e, "resource connection refused");
            }
        });
        Response::new(Full::new(Bytes::new()))
    }
}

/// The resource protocols a stream may name.
fn stream_protocols() -> impl Iterator<Item = &'static str> {
    ALPNS
        .iter()
        .copied()
        .filter(|p| *p != alpn::MUX && *p != alpn::POSTGRES_NATIVE)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

//! Diagnostics every node serves on `svc.diag_addr`: `/healthz`, `/readyz` and `/metrics`.
//!
//! Beside the data path, not on it: [`Diagnostics`] is a `tower::Service` over HTTP requests
//! (mount it in your own server, or run [`serve`] on a listener of its own). Metrics live in a
//! [`prometheus_client`] registry that the node fills ([`NodeMetrics`]); readiness is a check the
//! node supplies (a tunnel is up, a heartbeat was accepted) whose refusal text becomes the 503
//! body, so an operator reading the probe sees why.

use std::{
    convert::Infallible,
    fmt,
    future::{Ready, ready},
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// The content type of `/metrics` (the OpenMetrics text format, which Prometheus reads).
pub(crate) const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections served at once by [`serve`]; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`serve`] lets open connections finish after shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

type ReadyCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The diagnostics endpoints as a `tower::Service<http::Request<B>>`.
///
/// - `/healthz`: 200 while the process answers;
/// - `/readyz`: 200 when the readiness check passes, else 503 with its reason;
/// - `/metrics`: the registry in the OpenMetrics text format;
/// - anything else: 404 naming the three paths.
#[derive(Clone)]
pub struct Diagnostics {
    registry: Arc<Registry>,
    ready: ReadyCheck,
}

impl fmt::Debug for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Diagnostics").finish_non_exhaustive()
    }
}

impl Diagnostics {
    /// Serves `registry`; `ready` answers `/readyz` (`Err(reason)` → 503 with the reason).
    pub fn new(registry: Registry, ready: impl Fn() -> Result<(), String> + Send + Sync + 'static) -> Self {
        Diagnostics {
            registry: Arc::new(registry),
            ready: Arc::new(ready),
        }
    }

    /// The answer for a request path.
    pub fn answer(&self, path: &str) -> Response<Full<Bytes>> {
        match path {
            "/healthz" => text(StatusCode::OK, "ok\n".into(), "text/plain; charset=utf-8"),
            "/readyz" => match (self.ready)() {
                Ok(()) => text(StatusCode::OK, "ok\n".into(), "text/plain; charset=utf-8"),
                Err(reason) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{reason}\n"),
                    "text/plain; charset=utf-8",
                ),
            },
            "/metrics" => {
                let mut body = String::new();
                match encode(&mut body, &self.registry) {
                    Ok(()) => text(StatusCode::OK, body, METRICS_CONTENT_TYPE),
                    Err(e) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("encoding the metrics failed: {e}\n"),
                        "text/plain; charset=utf-8",
                    ),
                }
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: try /healthz, /readyz or /metrics\n".into(),
                "text/plain; charset=utf-8",
            ),
        }
    }
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

impl<B> tower::Service<Request<B>> for Diagnostics {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        ready(Ok(self.answer(req.uri().path())))
    }
}

/// The metrics every node reports. Cloning shares the same counters.
#[derive(Clone, Debug, Default)]
pub struct NodeMetrics {
    /// Reverse tunnels up now (`svc_tunnels_connected`).
    pub tunnels_connected: Gauge,
    /// Reverse tunnels established since start (`svc_tunnels_established_total`).
    pub tunnels_established: Counter,
    /// Heartbeats the Auth Service accepted (`svc_heartbeats_total`).
    pub heartbeats: Counter,
    /// Heartbeats (or connections to the Auth API for them) that failed
    /// (`svc_heartbeat_failures_total`).
    pub heartbeat_failures: Counter,
}

impl NodeMetrics {
    /// Registers the metrics (with the `svc_` prefix) in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let svc = registry.sub_registry_with_prefix("svc");
        svc.register(
            "tunnels_connected",
            "Reverse tunnels up now",
            self.tunnels_connected.clone(),
        );
        svc.register(
            "tunnels_established",
            "Reverse tunnels established since start",
            self.tunnels_established.clone(),
        );
        svc.register(
            "heartbeats",
            "Heartbeats accepted by the Auth Service",
            self.heartbeats.clone(),
        );
        svc.register(
            "heartbeat_failures",
            "Heartbeats that failed",
            self.heartbeat_failures.clone(),
        );
    }
}

/// Serves `diag` over HTTP/1 on `listener` until `shutdown`, then lets open requests finish
/// (up to a few seconds).
///
/// At most 64 connections are served at once; a client gets 10 seconds for its request head;
/// accept errors (the process out of file descriptors, say) are logged and retried after a
/// pause instead of spinning or ending the loop.
pub async fn serve(listener: TcpListener, diag: Diagnostics, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut pause = Duration::from_millis(5);
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = slots.clone().acquire_owned() => p,
        };
        let Ok(permit) = permit else {
            break;
        };
        let tcp = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((tcp, _)) => {
                    pause = Duration::from_millis(5);
                    tcp
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?pause, "diagnostics: accept failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        let service = hyper_util::service::TowerToHyperService::new(diag.clone());
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let _permit = permit;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    tracker.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, tracker.wait()).await.is_err() {
        tracing::debug!("diagnostics: connections still open after the drain timeout");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(r: Response<Full<Bytes>>) -> (u16, String) {
        use http_body_util::BodyExt;
        let status = r.status().as_u16();
        let bytes = futures_util::FutureExt::now_or_never(r.into_body().collect())
            .and_then(Result::ok)
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[test]
    fn the_three_paths_answer_and_metrics_are_openmetrics() {
        let metrics = NodeMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.tunnels_connected.set(1);
        metrics.heartbeats.inc_by(3);
        let connected = metrics.tunnels_connected.clone();
        let diag = Diagnostics::new(registry, move || {
            if connected.get() > 0 {
                Ok(())
            } else {
                Err("no reverse tunnel to the proxy yet".into())
            }
        });
        assert_eq!(body(diag.answer("/healthz")), (200, "ok\n".into()));
        assert_eq!(body(diag.answer("/readyz")), (200, "ok\n".into()));
        let (status, text) = body(diag.answer("/metrics"));
        assert_eq!(status, 200);
        assert!(text.contains("svc_tunnels_connected 1"), "{text}");
        assert!(text.contains("svc_heartbeats_total 3"), "{text}");
        assert!(text.contains("svc_heartbeat_failures_total 0"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        metrics.tunnels_connected.set(0);
        assert_eq!(
            body(diag.answer("/readyz")),
            (503, "no reverse tunnel to the proxy yet\n".into())
        );
        assert_eq!(body(diag.answer("/nope")).0, 404);
    }

    #[tokio::test]
    async fn serve_answers_over_http_and_stops_on_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let diag = Diagnostics::new(Registry::default(), || Ok(()));
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(listener, diag, stop.clone()));
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut out))
            .await
            .expect("no answer from /healthz within 10 s")
            .unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("serve did not stop within 10 s of shutdown")
            .unwrap();
    }
}

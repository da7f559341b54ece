//! The updater's diagnostics: `/healthz`, `/readyz` and Prometheus-text `/metrics`.
//!
//! Sits beside the controller: [`Metrics`] is shared with [`super::controller`] and
//! [`super::leader`], which count what they do; [`serve`] answers the kubelet's probes and the
//! scraper on the diagnostics address.

use std::{
    convert::Infallible,
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// Counters and gauges of one updater process. All fields are monotonic counters unless named
/// as a gauge.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Reconciles that ended without error.
    pub reconciles_ok: AtomicU64,
    /// Reconciles that ended in an error (and were retried soon).
    pub reconciles_failed: AtomicU64,
    /// Image patches applied to the workload.
    pub updates: AtomicU64,
    /// Reconciles that found no new version.
    pub no_new_version: AtomicU64,
    /// Reconciles skipped: suspended, outside the window, refused major.
    pub skipped: AtomicU64,
    /// Unhealthy old-revision pods deleted to unstick a StatefulSet rollout.
    pub pods_deleted: AtomicU64,
    /// Attempts to acquire or renew the leader Lease.
    pub lease_attempts: AtomicU64,
    /// Gauge: 1 while this replica holds the Lease.
    pub leader: AtomicBool,
    /// Gauge: 1 once the process is serving (leader or standby).
    pub ready: AtomicBool,
}

impl Metrics {
    /// Renders the Prometheus text exposition format (version 0.0.4).
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP svc_kube_updater_reconciles_total Reconciles by result.\n\
             # TYPE svc_kube_updater_reconciles_total counter\n\
             svc_kube_updater_reconciles_total{{result=\"ok\"}} {}\n\
             svc_kube_updater_reconciles_total{{result=\"error\"}} {}",
            get(&self.reconciles_ok),
            get(&self.reconciles_failed)
        );
        counter(
            &mut out,
            "svc_kube_updater_updates_total",
            "Image updates applied.",
            get(&self.updates),
        );
        counter(
            &mut out,
            "svc_kube_updater_no_new_version_total",
            "Reconciles that found no new version.",
            get(&self.no_new_version),
        );
        counter(
            &mut out,
            "svc_kube_updater_skipped_total",
            "Reconciles that skipped an update.",
            get(&self.skipped),
        );
        counter(
            &mut out,
            "svc_kube_updater_pods_deleted_total",
            "Unhealthy old-revision pods deleted.",
            get(&self.pods_deleted),
        );
        counter(
            &mut out,
            "svc_kube_updater_lease_attempts_total",
            "Attempts to acquire or renew the leader lease.",
            get(&self.lease_attempts),
        );
        let _ = writeln!(
            out,
            "# HELP svc_kube_updater_leader Whether this replica holds the leader lease.\n\
             # TYPE svc_kube_updater_leader gauge\nsvc_kube_updater_leader {}",
            u8::from(self.leader.load(Ordering::Relaxed))
        );
        out
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

/// Answers one diagnostics request.
pub fn respond<B>(metrics: &Metrics, request: &Request<B>) -> Response<Full<Bytes>> {
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n", "text/plain"),
        "/readyz" if metrics.ready.load(Ordering::Relaxed) => text(StatusCode::OK, "ok\n", "text/plain"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "starting\n", "text/plain"),
        "/metrics" => text(StatusCode::OK, metrics.render(), "text/plain; version=0.0.4"),
        _ => text(StatusCode::NOT_FOUND, "not found\n", "text/plain"),
    }
}

/// Serves diagnostics on `listener` until the task is dropped. A failing connection is logged
/// and the loop goes on.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "diagnostics accept failed");
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let response = respond(&metrics, &request);
                async move { Ok::<_, Infallible>(response) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%error, %peer, "diagnostics connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_and_metrics() {
        let m = Metrics::default();
        let req = |p: &str| Request::get(p).body(()).unwrap();
        assert_eq!(respond(&m, &req("/healthz")).status(), StatusCode::OK);
        assert_eq!(
            respond(&m, &req("/readyz")).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        m.ready.store(true, Ordering::Relaxed);
        assert_eq!(respond(&m, &req("/readyz")).status(), StatusCode::OK);
        m.updates.fetch_add(2, Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("svc_kube_updater_updates_total 2\n"), "{text}");
        assert!(
            text.contains("svc_kube_updater_reconciles_total{result=\"ok\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE svc_kube_updater_leader gauge\nsvc_kube_updater_leader 0\n"));
        assert_eq!(respond(&m, &req("/nope")).status(), StatusCode::NOT_FOUND);
    }
}

//! The updater's diagnostics: `/healthz`, `/readyz` and `/metrics`.
//!
//! Sits beside the controller: [`Metrics`] is shared with [`super::controller`] and
//! [`super::leader`], which count what they do; [`serve`] answers the kubelet's probes and the
//! scraper on the diagnostics address with the diagnostics Service every svc process shares
//! (`svc_net::diag`).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use svc_net::diag::Diagnostics;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

type ResultLabel = Vec<(String, String)>;

/// Counters and gauges of one updater process. Clones of a counter share its value.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles that ended without error.
    pub reconciles_ok: Counter,
    /// Reconciles that ended in an error (and were retried soon).
    pub reconciles_failed: Counter,
    /// Image patches applied to the workload.
    pub updates: Counter,
    /// Reconciles that found no new version.
    pub no_new_version: Counter,
    /// Reconciles skipped: suspended, outside the window, refused major.
    pub skipped: Counter,
    /// Updates rolled back because the new image's pods did not become ready in time.
    pub rollbacks: Counter,
    /// Unhealthy old-revision pods deleted to unstick a StatefulSet rollout.
    pub pods_deleted: Counter,
    /// Attempts to acquire or renew the leader Lease.
    pub lease_attempts: Counter,
    /// 1 while this replica holds the Lease.
    pub leader: Gauge,
    /// Set once the process is serving (leader or standby): `/readyz` answers 200 from then on.
    pub ready: AtomicBool,
    reconciles: Family<ResultLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let reconciles = Family::<ResultLabel, Counter>::default();
        let result = |r: &str| vec![("result".to_owned(), r.to_owned())];
        let reconciles_ok = reconciles.get_or_create(&result("ok")).clone();
        let reconciles_failed = reconciles.get_or_create(&result("error")).clone();
        Metrics {
            reconciles_ok,
            reconciles_failed,
            updates: Counter::default(),
            no_new_version: Counter::default(),
            skipped: Counter::default(),
            rollbacks: Counter::default(),
            pods_deleted: Counter::default(),
            lease_attempts: Counter::default(),
            leader: Gauge::default(),
            ready: AtomicBool::new(false),
            reconciles,
        }
    }
}

impl Metrics {
    /// The metrics, named `svc_kube_updater_*`, in a registry of their own.
    pub fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        let r = registry.sub_registry_with_prefix("svc_kube_updater");
        r.register("reconciles", "Reconciles by result", self.reconciles.clone());
        r.register("updates", "Image updates applied", self.updates.clone());
        r.register(
            "no_new_version",
            "Reconciles that found no new version",
            self.no_new_version.clone(),
        );
        r.register(
            "skipped",
            "Reconciles that skipped an update",
            self.skipped.clone(),
        );
        r.register(
            "rollbacks",
            "Updates rolled back: the new pods were not ready in time",
            self.rollbacks.clone(),
        );
        r.register(
            "pods_deleted",
            "Unhealthy old-revision pods deleted",
            self.pods_deleted.clone(),
        );
        r.register(
            "lease_attempts",
            "Attempts to acquire or renew the leader lease",
            self.lease_attempts.clone(),
        );
        r.register(
            "leader",
            "Whether this replica holds the leader lease",
            self.leader.clone(),
        );
        registry
    }

    /// The diagnostics Service for these metrics: `/readyz` is 503 (`starting`) until
    /// [`Metrics::ready`] is set.
    pub fn diagnostics(self: &Arc<Self>) -> Diagnostics {
        let this = self.clone();
        Diagnostics::new(self.registry(), move || {
            if this.ready.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err("starting".into())
            }
        })
    }
}

/// Serves diagnostics on `listener` until the task is dropped. A failing connection is logged
/// and the loop goes on.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    svc_net::diag::serve(listener, metrics.diagnostics(), CancellationToken::new()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn body(d: &Diagnostics, path: &str) -> (StatusCode, String) {
        use http_body_util::BodyExt;
        let r = d.answer(path);
        let status = r.status();
        let bytes = futures_util::FutureExt::now_or_never(r.into_body().collect())
            .and_then(Result::ok)
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[test]
    fn probes_and_metrics() {
        let m = Arc::new(Metrics::default());
        let d = m.diagnostics();
        assert_eq!(body(&d, "/healthz").0, StatusCode::OK);
        assert_eq!(
            body(&d, "/readyz"),
            (StatusCode::SERVICE_UNAVAILABLE, "starting\n".into())
        );
        m.ready.store(true, Ordering::Relaxed);
        assert_eq!(body(&d, "/readyz").0, StatusCode::OK);
        m.updates.inc_by(2);
        m.reconciles_ok.inc();
        let (_, text) = body(&d, "/metrics");
        assert!(text.contains("svc_kube_updater_updates_total 2\n"), "{text}");
        assert!(
            text.contains("svc_kube_updater_reconciles_total{result=\"ok\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE svc_kube_updater_leader gauge\n"), "{text}");
        assert!(text.contains("svc_kube_updater_leader 0\n"), "{text}");
        assert_eq!(body(&d, "/nope").0, StatusCode::NOT_FOUND);
    }
}

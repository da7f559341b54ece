//! The real updater controller (kube-rs `Controller`, leader election, the HTTP target source)
//! against the fake API server and a real in-process version server.
//!
//! Periods are configured short instead of pausing time, because the controller's HTTP clients
//! have their own timers; nothing asserts on timing, only on what happened (reconcile counts,
//! recorded requests, the stored objects, the logs).

mod support;

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, SystemTime},
};

use serde_json::{Value, json};
use support::{Logs, fake_apiserver::FakeApiServer, version_server::VersionServer, wait_until};
use svc_core::{
    clock::{Clock, ManualClock},
    maintenance::Window,
};
use svc_update::kube::{
    UpdaterConfig, WorkloadKind,
    controller::{self, Context},
    health::Metrics,
    leader::{LeaderElector, LeaseTiming},
    schedule::{read_schedule, write_windows},
    target::{TargetSource, channel_base_url},
};

const NS: &str = "svc";
const AGENT: &str = "svc-agent";
const BASE: &str = "public.ecr.aws/svc/svc-ent-distroless";
const CHANNEL: &str = "stable/cloud";

fn load(metric: &prometheus_client::metrics::counter::Counter) -> u64 {
    metric.get()
}

fn workload(kind: &str, image: &str, annotations: Value, status: Value) -> Value {
    let mut obj = json!({
        "apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": AGENT, "namespace": NS, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": AGENT}},
            "template": {
                "metadata": {"labels": {"app": AGENT}},
                "spec": {"containers": [
                    {"name": "sidecar", "image": "busybox:1.36"},
                    {"name": "svc", "image": image}
                ]}
            }
        },
        "status": status
    });
    if kind == "StatefulSet" {
        obj["spec"]["serviceName"] = json!(AGENT);
    }
    obj
}

fn pod(name: &str, revision: &str, ready: bool, since: SystemTime) -> Value {
    let since = time::OffsetDateTime::from(since)
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "creationTimestamp": since,
                     "labels": {"app": AGENT, "controller-revision-hash": revision}},
        "spec": {"containers": [{"name": "svc", "image": "x"}]},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": since}]}
    })
}

fn image_of(api: &FakeApiServer, kind: &str) -> String {
    let obj = api.get(kind, NS, AGENT).expect("workload");
    obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "svc")
        .unwrap()["image"]
        .as_str()
        .unwrap()
        .to_owned()
}

struct Harness {
    api: FakeApiServer,
    versions: VersionServer,
    clock: Arc<ManualClock>,
    metrics: Arc<Metrics>,
    logs: Logs,
    _guard: tracing::subscriber::DefaultGuard,
    task: Option<tokio::task::JoinHandle<()>>,
    kubelet: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for t in [self.task.take(), self.kubelet.take()].into_iter().flatten() {
            t.abort();
        }
    }
}

fn config(kind: WorkloadKind) -> UpdaterConfig {
    let mut c = UpdaterConfig::new(NS, AGENT, kind, "svc", BASE);
    // Long enough that only events and explicit scenarios cause reconciles.
    c.sync_period = Duration::from_secs(3600);
    c.retry_after = Duration::from_millis(50);
    c
}

impl Harness {
    /// Fake API server with the workload (and `pods`), a version server answering
    /// `version`/`critical`, a clock at the current time.
    async fn new(workload: Value, pods: Vec<Value>, version: &str, critical: bool) -> Self {
        let logs = Logs::default();
        let guard = logs.install();
        let api = FakeApiServer::start().await;
        api.insert(workload);
        for p in pods {
            api.insert(p);
        }
        let versions = VersionServer::start(CHANNEL, version, critical).await;
        Self {
            api,
            versions,
            clock: Arc::new(ManualClock::new(SystemTime::now())),
            metrics: Arc::new(Metrics::default()),
            logs,
            _guard: guard,
            task: None,
            kubelet: None,
        }
    }

    fn context(&self, config: UpdaterConfig, metrics: Arc<Metrics>) -> Arc<Context> {
        Arc::new(Context {
            client: self.api.client(NS),
            config,
            target: Arc::new(support::version_client(channel_base_url(
                &self.versions.url(),
                CHANNEL,
            ))),
            clock: self.clock.clone(),
            metrics,
        })
    }

    /// Runs the controller, with a fake kubelet whose pods become ready with every image.
    fn run(&mut self, config: UpdaterConfig) {
        self.run_with_kubelet(config, |_| true);
    }

    /// Runs the controller, with a fake kubelet whose pods are ready as `ready(image)` says.
    fn run_with_kubelet(
        &mut self,
        config: UpdaterConfig,
        ready: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) {
        let kind = match config.kind {
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::Deployment => "Deployment",
        };
        self.kubelet = Some(self.api.kubelet(kind, NS, AGENT, "svc", ready));
        let ctx = self.context(config, self.metrics.clone());
        self.task = Some(tokio::spawn(controller::run(ctx)));
    }

    fn workload_patches(&self) -> usize {
        self.api.count("PATCH", &format!("/statefulsets/{AGENT}"))
            + self.api.count("PATCH", &format!("/deployments/{AGENT}"))
            + self.api.count("PUT", &format!("/statefulsets/{AGENT}"))
            + self.api.count("PUT", &format!("/deployments/{AGENT}"))
    }

    /// Annotates the workload as `kubectl annotate` would (a merge patch from another client).
    async fn annotate(&self, kind: &str, key: &str, value: &str) {
        use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
        use kube::api::{Api, Patch, PatchParams};
        let patch = json!({"metadata": {"annotations": {key: value}}});
        let client = self.api.client(NS);
        if kind == "StatefulSet" {
            Api::<StatefulSet>::namespaced(client, NS)
                .patch(AGENT, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        } else {
            Api::<Deployment>::namespaced(client, NS)
                .patch(AGENT, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }

    fn reconciles(&self) -> u64 {
        load(&self.metrics.reconciles_ok)
    }
}

fn sts(image_version: &str) -> Value {
    workload(
        "StatefulSet",
        &format!("{BASE}:{image_version}"),
        json!({}),
        json!({"currentRevision": "rev1", "updateRevision": "rev1"}),
    )
}

#[tokio::test]
async fn resyncs_periodically_and_no_new_version_leaves_the_workload_untouched() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.0.0", false).await;
    let mut c = config(WorkloadKind::StatefulSet);
    c.sync_period = Duration::from_millis(100);
    h.run(c);
    wait_until("three reconciles", || h.reconciles() >= 3).await;
    // One watch event (the initial list) and three reconciles: the rest came from the resync,
    // and every one of them found nothing to do.
    assert!(load(&h.metrics.no_new_version) >= 3);
    assert_eq!(load(&h.metrics.updates) + load(&h.metrics.skipped), 0);
    assert_eq!(
        h.workload_patches(),
        0,
        "no new version must send no write at all"
    );
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.0.0"));
    assert!(
        h.logs.text().contains("no new version available"),
        "{}",
        h.logs.text()
    );
}

#[tokio::test]
async fn channel_advertising_none_is_no_new_version() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "none", true).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("a reconcile", || h.reconciles() >= 1).await;
    assert_eq!(load(&h.metrics.no_new_version), 1);
    assert_eq!(h.workload_patches(), 0);
}

#[tokio::test]
async fn trigger_annotation_reconciles_at_once() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.0.0", false).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("the first reconcile", || h.reconciles() >= 1).await;
    assert_eq!(h.reconciles(), 1);
    // A new critical version appears; with a one-hour sync period only an event can react now.
    h.versions.set("v17.0.1", true);
    h.annotate("StatefulSet", "debug.svc.dev/trigger-event", "1")
        .await;
    wait_until("the triggered update", || load(&h.metrics.updates) == 1).await;
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.0.1"));
}

#[tokio::test]
async fn skip_annotation_suspends_updates() {
    let obj = workload(
        "StatefulSet",
        &format!("{BASE}:17.0.0"),
        json!({"svc.dev/skipreconcile": "true"}),
        json!({}),
    );
    let mut h = Harness::new(obj, vec![], "v17.1.0", true).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("a skipped reconcile", || load(&h.metrics.skipped) >= 1).await;
    h.annotate("StatefulSet", "debug.svc.dev/trigger-event", "1")
        .await;
    wait_until("the triggered skipped reconcile", || {
        load(&h.metrics.skipped) >= 2
    })
    .await;
    assert_eq!(load(&h.metrics.updates), 0);
    // Only the test's own annotation patch: the controller wrote nothing.
    assert_eq!(h.workload_patches(), 1);
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.0.0"));
    assert!(h.logs.text().contains("automatic updates suspended"));
    // Lifting the suspension is an event, and the critical update goes ahead.
    h.annotate("StatefulSet", "svc.dev/skipreconcile", "false").await;
    wait_until("the update", || load(&h.metrics.updates) == 1).await;
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.1.0"));
}

#[tokio::test]
async fn critical_update_applies_outside_the_window() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.1.0", true).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("the update", || load(&h.metrics.updates) == 1).await;
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.1.0"));
    // The update is a strategic-merge patch that touched only the agent container.
    let patch = h
        .api
        .requests()
        .into_iter()
        .find(|r| r.method == "PATCH" && r.path.ends_with("/statefulsets/svc-agent"))
        .unwrap();
    assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
    let obj = h.api.get("StatefulSet", NS, AGENT).unwrap();
    assert_eq!(
        obj["spec"]["template"]["spec"]["containers"][0]["image"],
        "busybox:1.36"
    );
    // The update's own watch event reconciles again and finds nothing more to do.
    wait_until("the follow-up reconcile", || load(&h.metrics.no_new_version) >= 1).await;
    assert_eq!(load(&h.metrics.updates), 1);
}

#[tokio::test]
async fn window_from_the_secret_gates_non_critical_updates() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.1.0", false).await;
    let now = h.clock.now();
    let hour = Duration::from_secs(3600);
    // The agent exported a schedule whose next window starts in an hour.
    write_windows(
        h.api.client(NS),
        NS,
        "svc-agent-shared-state",
        &[Window {
            start: now + hour,
            end: now + 2 * hour,
        }],
    )
    .await
    .unwrap();
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("a skipped reconcile", || load(&h.metrics.skipped) >= 1).await;
    assert_eq!(h.workload_patches(), 0);
    assert!(
        h.logs
            .text()
            .contains("non-critical and we are outside of maintenance window, not attempting")
    );
    // Time moves into the window; the next reconcile (here triggered) updates.
    h.clock.set(now + hour + Duration::from_secs(60));
    h.annotate("StatefulSet", "debug.svc.dev/trigger-event", "1")
        .await;
    wait_until("the update", || load(&h.metrics.updates) == 1).await;
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.1.0"));
}

#[tokio::test]
async fn unhealthy_pods_update_outside_the_window() {
    let h0 = SystemTime::now() - Duration::from_secs(3 * 3600);
    let pods = vec![pod("svc-agent-0", "rev1", false, h0)];
    let mut h = Harness::new(sts("17.0.0"), pods, "v17.1.0", false).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("the update", || load(&h.metrics.updates) == 1).await;
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.1.0"));
    assert!(h.logs.text().contains("agent pods unhealthy"));
}

#[tokio::test]
async fn recently_unready_pods_do_not_count_as_unhealthy() {
    let pods = vec![pod("svc-agent-0", "rev1", false, SystemTime::now())];
    let mut h = Harness::new(sts("17.0.0"), pods, "v17.1.0", false).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("a skipped reconcile", || load(&h.metrics.skipped) >= 1).await;
    assert_eq!(h.workload_patches(), 0);
}

#[tokio::test]
async fn version_server_down_leaves_the_workload_unchanged_and_retries() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.1.0", true).await;
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut ctx_config = config(WorkloadKind::StatefulSet);
    ctx_config.retry_after = Duration::from_millis(20);
    let ctx = Arc::new(Context {
        client: h.api.client(NS),
        config: ctx_config,
        target: Arc::new(support::version_client(channel_base_url(
            &format!("http://{closed}"),
            CHANNEL,
        ))),
        clock: h.clock.clone(),
        metrics: h.metrics.clone(),
    });
    h.task = Some(tokio::spawn(controller::run(ctx)));
    wait_until("two failed reconciles (retried)", || {
        load(&h.metrics.reconciles_failed) >= 2
    })
    .await;
    assert_eq!(h.workload_patches(), 0);
    assert_eq!(h.reconciles(), 0);
    assert!(h.logs.text().contains("reconcile failed, the agent is unchanged"));
}

#[tokio::test]
async fn malformed_version_is_an_error_not_an_update() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "<html>oops</html>", true).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("a failed reconcile", || load(&h.metrics.reconciles_failed) >= 1).await;
    assert_eq!(h.workload_patches(), 0);
    assert!(
        h.logs
            .text()
            .contains("invalid version \"<html>oops</html>\": expected v<major>.<minor>.<patch>")
    );
}

#[tokio::test]
async fn other_major_than_the_channel_is_refused() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v18.0.0", true).await;
    let mut c = config(WorkloadKind::StatefulSet);
    c.channel_major = Some(17);
    h.run(c);
    wait_until("a refused reconcile", || load(&h.metrics.skipped) >= 1).await;
    assert_eq!(h.workload_patches(), 0);
    assert!(
        h.logs
            .text()
            .contains("refusing v18.0.0: expected major version 17 as the channel serves, got 18")
    );
}

#[tokio::test]
async fn deployment_is_updated_too() {
    let obj = workload("Deployment", &format!("{BASE}:17.0.0"), json!({}), json!({}));
    let mut h = Harness::new(obj, vec![], "v17.1.0-dev", true).await;
    h.run(config(WorkloadKind::Deployment));
    wait_until("the update", || load(&h.metrics.updates) == 1).await;
    assert_eq!(image_of(&h.api, "Deployment"), format!("{BASE}:17.1.0-dev"));
}

#[tokio::test]
async fn stuck_statefulset_rollout_loses_its_unhealthy_old_pods() {
    let now = SystemTime::now();
    let obj = workload(
        "StatefulSet",
        &format!("{BASE}:17.1.0"),
        json!({}),
        json!({"currentRevision": "rev1", "updateRevision": "rev2"}),
    );
    let pods = vec![
        pod("svc-agent-0", "rev2", false, now),
        pod("svc-agent-1", "rev1", false, now),
        pod("svc-agent-2", "rev1", true, now),
    ];
    let mut h = Harness::new(obj, pods, "v17.1.0", false).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("the stuck pod deleted", || load(&h.metrics.pods_deleted) == 1).await;
    assert!(
        h.api.get("Pod", NS, "svc-agent-1").is_none(),
        "old revision, not ready: deleted"
    );
    assert!(
        h.api.get("Pod", NS, "svc-agent-0").is_some(),
        "new revision: kept"
    );
    assert!(h.api.get("Pod", NS, "svc-agent-2").is_some(), "ready: kept");
    assert_eq!(h.workload_patches(), 0);
}

#[tokio::test]
async fn watch_survives_410_gone() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.0.0", false).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("the first reconcile", || h.reconciles() >= 1).await;
    // History compacted and the watch cut: the watcher's resourceVersion is now too old, it
    // gets 410 Gone, lists again and goes on watching.
    // An unrelated write moves the server past the watcher's resourceVersion first.
    h.api.insert(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unrelated", "namespace": NS}}),
    );
    h.api.compact();
    h.api.disconnect_watches();
    h.versions.set("v17.0.1", true);
    let lists = |h: &Harness| {
        h.api
            .requests()
            .iter()
            .filter(|r| {
                r.method == "GET" && r.path.ends_with("/statefulsets") && !r.query.contains("watch=true")
            })
            .count()
    };
    let lists_before = lists(&h);
    wait_until("a relist after 410 Gone", || lists(&h) > lists_before).await;
    assert!(
        h.api.gone_watches() >= 1,
        "the watcher asked from a compacted resourceVersion"
    );
    h.annotate("StatefulSet", "debug.svc.dev/trigger-event", "2")
        .await;
    wait_until("the triggered update", || load(&h.metrics.updates) == 1).await;
}

#[tokio::test]
async fn two_replicas_with_leader_election_only_one_acts() {
    let h = Harness::new(sts("17.0.0"), vec![], "v17.1.0", true).await;
    let timing = LeaseTiming {
        lease_duration: Duration::from_secs(30),
        renew_every: Duration::from_millis(50),
        retry_every: Duration::from_millis(20),
    };
    let mut tasks = Vec::new();
    let mut metrics = Vec::new();
    for id in ["replica-a", "replica-b"] {
        let m = Arc::new(Metrics::default());
        let ctx = h.context(config(WorkloadKind::StatefulSet), m.clone());
        let elector = LeaderElector::new(h.api.client(NS), NS, "svc-agent-updater", id, timing, m.clone());
        tasks.push(tokio::spawn(elector.run(controller::run(ctx))));
        metrics.push(m);
    }
    wait_until("an update", || {
        metrics.iter().map(|m| load(&m.updates)).sum::<u64>() >= 1
    })
    .await;
    let leader = metrics
        .iter()
        .position(|m| m.leader.get() == 1)
        .expect("a leader");
    let standby = 1 - leader;
    // Let the standby try the Lease several more times while the leader renews.
    let seen = load(&metrics[standby].lease_attempts);
    wait_until("standby retries", || {
        load(&metrics[standby].lease_attempts) >= seen + 5
    })
    .await;
    assert_eq!(metrics[standby].leader.get(), 0);
    assert_eq!(
        load(&metrics[standby].reconciles_ok) + load(&metrics[standby].reconciles_failed),
        0
    );
    assert_eq!(load(&metrics[leader].updates), 1);
    assert_eq!(h.workload_patches(), 1);
    let lease = h.api.get("Lease", NS, "svc-agent-updater").unwrap();
    assert_eq!(
        lease["spec"]["holderIdentity"],
        ["replica-a", "replica-b"][leader]
    );
    for t in tasks {
        t.abort();
    }
}

#[tokio::test]
async fn standby_takes_over_an_expired_lease() {
    let h = Harness::new(sts("17.0.0"), vec![], "v17.0.0", false).await;
    // A holder that stopped renewing long ago (its record never changes again).
    h.api.insert(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "lease", "namespace": NS},
        "spec": {"holderIdentity": "gone", "leaseDurationSeconds": 1, "leaseTransitions": 3}
    }));
    let m = Arc::new(Metrics::default());
    let timing = LeaseTiming {
        lease_duration: Duration::from_secs(1),
        renew_every: Duration::from_millis(50),
        retry_every: Duration::from_millis(50),
    };
    let ctx = h.context(config(WorkloadKind::StatefulSet), m.clone());
    let elector = LeaderElector::new(h.api.client(NS), NS, "lease", "replica-c", timing, m.clone());
    let task = tokio::spawn(elector.run(controller::run(ctx)));
    wait_until("a reconcile by the new leader", || load(&m.reconciles_ok) >= 1).await;
    let lease = h.api.get("Lease", NS, "lease").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-c");
    assert_eq!(lease["spec"]["leaseTransitions"], 4);
    task.abort();
}

#[tokio::test]
async fn leader_that_loses_its_lease_stops_acting() {
    let h = Harness::new(sts("17.0.0"), vec![], "v17.0.0", false).await;
    let m = Arc::new(Metrics::default());
    let timing = LeaseTiming {
        lease_duration: Duration::from_secs(30),
        renew_every: Duration::from_millis(20),
        retry_every: Duration::from_millis(20),
    };
    let ctx = h.context(config(WorkloadKind::StatefulSet), m.clone());
    let elector = LeaderElector::new(h.api.client(NS), NS, "lease", "replica-d", timing, m.clone());
    let task = tokio::spawn(elector.run(controller::run(ctx)));
    wait_until("leadership", || m.leader.get() == 1).await;
    // Another replica writes itself into the Lease.
    h.api.merge(
        "Lease",
        NS,
        "lease",
        json!({"spec": {"holderIdentity": "intruder"}}),
    );
    let result = task.await.unwrap();
    let err = result.expect_err("leadership lost");
    assert!(
        err.to_string().contains("another replica holds the lease"),
        "{err}"
    );
    assert_eq!(m.leader.get(), 0);
}

#[tokio::test]
async fn agent_schedule_export_creates_then_merges_the_secret() {
    let h = Harness::new(sts("17.0.0"), vec![], "v17.0.0", false).await;
    let client = h.api.client(NS);
    let schedule = svc_core::maintenance::AgentUpgradeWindow::new(3, []).unwrap();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200); // 2024-01-01 00:00 UTC
    svc_update::kube::schedule::export_schedule(client.clone(), NS, "svc-agent-shared-state", &schedule, now)
        .await
        .unwrap();
    assert_eq!(h.api.count("POST", "/secrets"), 1, "created when missing");
    // Another key of the shared state is kept by the next export's merge patch.
    h.api.merge(
        "Secret",
        NS,
        "svc-agent-shared-state",
        json!({"data": {"other": "eA=="}}),
    );
    let later = now + Duration::from_secs(86_400);
    svc_update::kube::schedule::export_schedule(
        client.clone(),
        NS,
        "svc-agent-shared-state",
        &schedule,
        later,
    )
    .await
    .unwrap();
    let secret = h.api.get("Secret", NS, "svc-agent-shared-state").unwrap();
    assert_eq!(secret["data"]["other"], "eA==");
    let windows = read_schedule(client, NS, "svc-agent-shared-state").await.unwrap();
    assert_eq!(windows, schedule.next_windows(later, 4));
    let raw = secret["data"]["agent-maintenance-schedule"].as_str().unwrap();
    use base64::Engine as _;
    let text = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(raw).unwrap()).unwrap();
    assert!(
        text.starts_with(r#"{"windows":[{"start":"2024-01-02T03:00:00Z","stop":"2024-01-02T04:00:00Z"}"#),
        "{text}"
    );
}

#[tokio::test]
async fn http_target_source_reads_the_reference_bodies() {
    let versions = VersionServer::start(CHANNEL, "v17.2.3", true).await;
    let source = support::version_client(channel_base_url(&versions.url(), CHANNEL));
    let target = source.fetch().await.unwrap();
    assert_eq!(target.version, Some(svc_core::Version::new(17, 2, 3)));
    assert!(target.critical);
    versions.set("none", false);
    let target = source.fetch().await.unwrap();
    assert_eq!(target.version, None);
    assert!(!target.critical);
    let unknown = support::version_client(channel_base_url(&versions.url(), "stable/other"));
    let err = unknown.fetch().await.unwrap_err().to_string();
    assert!(err.contains("expected status 200, got 404"), "{err}");
}

#[tokio::test]
async fn diagnostics_endpoints_answer_over_http() {
    use http_body_util::{BodyExt, Empty};
    let metrics = Arc::new(Metrics::default());
    metrics.updates.inc();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(svc_update::kube::health::serve(listener, metrics.clone()));
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let get = |path: &str| client.get(format!("http://{addr}{path}").parse().unwrap());
    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    assert_eq!(get("/readyz").await.unwrap().status(), 503);
    metrics.ready.store(true, Ordering::Relaxed);
    assert_eq!(get("/readyz").await.unwrap().status(), 200);
    let body = get("/metrics")
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("svc_kube_updater_updates_total 1\n"));
    server.abort();
}

/// A version server that never answers: the reconcile's own timeout ends it, the workload is
/// unchanged, and it is retried.
#[tokio::test]
async fn reconcile_timeout_bounds_a_hung_target_source() {
    struct Hung;
    impl TargetSource for Hung {
        fn fetch(
            &self,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<
                        Output = Result<svc_update::kube::Target, svc_update::kube::TargetError>,
                    > + Send
                    + '_,
            >,
        > {
            Box::pin(std::future::pending())
        }
    }
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.1.0", true).await;
    let mut c = config(WorkloadKind::StatefulSet);
    c.reconcile_timeout = Duration::from_millis(50);
    c.retry_after = Duration::from_millis(10);
    let ctx = Arc::new(Context {
        client: h.api.client(NS),
        config: c,
        target: Arc::new(Hung),
        clock: h.clock.clone(),
        metrics: h.metrics.clone(),
    });
    h.task = Some(tokio::spawn(controller::run(ctx)));
    wait_until("two timed-out reconciles", || {
        load(&h.metrics.reconciles_failed) >= 2
    })
    .await;
    assert_eq!(h.workload_patches(), 0);
    assert!(
        h.logs.text().contains("reconcile did not finish within 50ms"),
        "{}",
        h.logs.text()
    );
}

/// The agent in Kubernetes runs the same exporter loop as on Linux, into its Secret: windows
/// while the cluster answers, an empty schedule once contact is lost.
#[tokio::test]
async fn the_schedule_exporter_loop_writes_and_resets_the_secret() {
    use std::sync::atomic::AtomicBool;
    use svc_net::agent::node::export::{ExportSettings, MaintenanceSource, ScheduleExporter};
    use svc_update::kube::schedule::SecretSink;

    struct Cluster {
        reachable: AtomicBool,
        window: svc_core::maintenance::AgentUpgradeWindow,
    }
    #[async_trait::async_trait]
    impl MaintenanceSource for Cluster {
        async fn agent_upgrades(
            &self,
        ) -> Result<Option<svc_core::maintenance::AgentUpgradeWindow>, Box<dyn std::error::Error + Send + Sync>>
        {
            if self.reachable.load(Ordering::SeqCst) {
                Ok(Some(self.window.clone()))
            } else {
                Err("auth service unreachable".into())
            }
        }
    }

    let h = Harness::new(sts("17.0.0"), vec![], "v17.0.0", false).await;
    let client = h.api.client(NS);
    let cluster = Arc::new(Cluster {
        reachable: AtomicBool::new(true),
        window: svc_core::maintenance::AgentUpgradeWindow::new(3, []).unwrap(),
    });
    let clock = Arc::new(ManualClock::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200),
    ));
    let mut settings = ExportSettings::default();
    settings.interval = Duration::from_millis(10);
    settings.retry = Duration::from_millis(10);
    settings.contact_timeout = Duration::ZERO;
    let exporter = ScheduleExporter::spawn_to(
        cluster.clone(),
        clock.clone(),
        Arc::new(SecretSink::new(client.clone(), NS, "svc-agent-shared-state")),
        settings.clone(),
    );
    let status = exporter.status();
    wait_until("the first export", || status.borrow().exports >= 1).await;
    let windows = read_schedule(client.clone(), NS, "svc-agent-shared-state")
        .await
        .unwrap();
    assert_eq!(
        windows,
        cluster.window.next_windows(clock.now(), settings.windows)
    );

    cluster.reachable.store(false, Ordering::SeqCst);
    wait_until("the reset after lost contact", || status.borrow().resets >= 1).await;
    let windows = read_schedule(client, NS, "svc-agent-shared-state").await.unwrap();
    assert!(windows.is_empty(), "{windows:?}");
}

/// The update status the controller left in the shared-state Secret.
async fn status(h: &Harness) -> Option<svc_core::updater::UpdaterStatus> {
    svc_update::kube::status::read_update_status(h.api.client(NS), NS, "svc-agent-shared-state")
        .await
        .expect("a readable status")
}

/// The versions marked bad, as stored.
fn bad_versions(h: &Harness) -> Option<Value> {
    let secret = h.api.get("Secret", NS, "svc-agent-shared-state")?;
    let encoded = secret["data"]["agent-bad-versions"].as_str()?;
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("base64");
    Some(serde_json::from_slice(&bytes).expect("a JSON list"))
}

#[tokio::test]
async fn an_update_whose_pods_become_ready_is_recorded_as_updated() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.1.0", true).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("the update", || load(&h.metrics.updates) == 1).await;
    // The follow-up reconcile (the new image is a watch event) overwrites the stored status
    // with "none" soon, possibly before this test reads the Secret: the "updated" record is
    // checked in the log the controller writes with it, which nothing overwrites.
    support::wait_until_async("the status recorded as updated", || async {
        h.logs
            .text()
            .contains("recorded the update status result=updated from=17.0.0 to=17.1.0")
    })
    .await;
    if let Some(s) = status(&h)
        .await
        .filter(|s| s.result == svc_core::updater::UpdateResult::Updated)
    {
        assert_eq!(
            (s.upgrader.as_str(), s.from.as_str(), s.to.as_str()),
            ("kube", "17.0.0", "17.1.0")
        );
        assert!(s.at > 0);
    }
    assert_eq!(load(&h.metrics.rollbacks), 0);
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.1.0"));
    // The next reconcile finds nothing to do and says so.
    wait_until("the follow-up reconcile", || load(&h.metrics.no_new_version) >= 1).await;
    support::wait_until_async("the status says none", || async {
        status(&h)
            .await
            .is_some_and(|s| s.result == svc_core::updater::UpdateResult::None)
    })
    .await;
    assert_eq!(status(&h).await.unwrap().reason, "no new version available");
}

/// New pods that never become ready: the previous image comes back, the version is marked bad
/// and not tried again, until the annotation clears the list or a newer version is published.
#[tokio::test]
async fn pods_never_ready_roll_back_and_mark_the_version_bad() {
    use svc_core::updater::UpdateResult;
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.1.0", true).await;
    let mut c = config(WorkloadKind::StatefulSet);
    c.rollout_timeout = Duration::from_secs(1);
    c.rollout_poll = Duration::from_millis(50);
    h.run_with_kubelet(c, |image| !image.ends_with(":17.1.0"));
    wait_until("the rollback", || load(&h.metrics.rollbacks) == 1).await;
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.0.0"));
    assert_eq!(bad_versions(&h), Some(json!(["17.1.0"])));
    // The follow-up reconcile (the restored image is a watch event) replaces the status with
    // its "not installing again" soon, so the rolled_back record is checked in the log the
    // controller writes with it, and in the Secret when the test reads it first.
    let logs = h.logs.text();
    assert!(
        logs.contains(
            "recorded the update status result=rolled_back from=17.1.0 to=17.0.0 reason=pods not ready with 17.1.0 within 1s: 0 of 1 ready"
        ),
        "{logs}"
    );
    let s = status(&h).await.expect("a status");
    if s.result == UpdateResult::RolledBack {
        assert_eq!((s.from.as_str(), s.to.as_str()), ("17.1.0", "17.0.0"));
        assert!(
            s.reason.starts_with("pods not ready with 17.1.0 within 1s"),
            "{}",
            s.reason
        );
    } else {
        assert_eq!(s.result, UpdateResult::None, "{s:?}");
        assert!(
            s.reason.starts_with("not installing v17.1.0 again"),
            "{}",
            s.reason
        );
    }
    assert_eq!(s.bad_versions, vec!["17.1.0".to_owned()]);
    assert!(h.logs.text().contains("rolling back"), "{}", h.logs.text());
    // The restored image's pod comes back ready.
    support::wait_until("the agent pod back on 17.0.0", || {
        h.api.get("Pod", NS, "svc-agent-0").is_some_and(|p| {
            p["spec"]["containers"][1]["image"] == format!("{BASE}:17.0.0")
                && p["status"]["conditions"][0]["status"] == "True"
        })
    })
    .await;

    // The next reconcile (triggered) does not try 17.1.0 again, critical as it is.
    let patches = h.workload_patches();
    let skipped = load(&h.metrics.skipped);
    h.annotate("StatefulSet", "debug.svc.dev/trigger-event", "1")
        .await;
    wait_until("the refused reconcile", || load(&h.metrics.skipped) > skipped).await;
    assert_eq!(h.workload_patches(), patches + 1, "only the test's annotation");
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.0.0"));
    assert!(
        h.logs.text().contains("not installing v17.1.0 again"),
        "{}",
        h.logs.text()
    );
    support::wait_until_async("the status says why nothing was installed", || async {
        status(&h).await.is_some_and(|s| {
            s.result == UpdateResult::None && s.reason.starts_with("not installing v17.1.0 again")
        })
    })
    .await;

    // The operator clears the list: the annotation and the list go, and 17.1.0 is tried again
    // (and, still not ready, rolled back again).
    h.annotate("StatefulSet", "svc.dev/clear-bad-versions", "true")
        .await;
    wait_until("the second rollback", || load(&h.metrics.rollbacks) == 2).await;
    let annotations = h.api.get("StatefulSet", NS, AGENT).unwrap()["metadata"]["annotations"].clone();
    assert!(
        annotations.get("svc.dev/clear-bad-versions").is_none(),
        "the annotation is removed: {annotations}"
    );
    assert!(h.logs.text().contains("the versions marked bad are cleared"));
    assert_eq!(bad_versions(&h), Some(json!(["17.1.0"])), "marked bad again");

    // A newer version is published: it is installed, and the list no longer holds what it
    // replaced.
    h.versions.set("v17.1.1", true);
    h.annotate("StatefulSet", "debug.svc.dev/trigger-event", "2")
        .await;
    // Updated, or already the follow-up reconcile's "none" from the new version.
    support::wait_until_async("the newer version installed", || async {
        status(&h).await.is_some_and(|s| {
            (s.result == UpdateResult::Updated && s.to == "17.1.1")
                || (s.result == UpdateResult::None && s.from == "17.1.1")
        })
    })
    .await;
    assert!(
        h.logs
            .text()
            .contains("recorded the update status result=updated from=17.0.0 to=17.1.1"),
        "{}",
        h.logs.text()
    );
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.1.1"));
    assert_eq!(bad_versions(&h), None, "17.1.0 can no longer be offered");
    assert_eq!(load(&h.metrics.rollbacks), 2);
}

/// The version server advertising an older version than the agent runs: refused, critical or
/// not, with the reason in the status; the workload is not written.
#[tokio::test]
async fn a_downgrade_is_refused_and_the_status_says_why() {
    let mut h = Harness::new(sts("17.1.0"), vec![], "v17.0.5", true).await;
    h.run(config(WorkloadKind::StatefulSet));
    wait_until("a refused reconcile", || load(&h.metrics.skipped) >= 1).await;
    assert_eq!(h.workload_patches(), 0);
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.1.0"));
    support::wait_until_async("the status", || async { status(&h).await.is_some() }).await;
    let s = status(&h).await.unwrap();
    assert_eq!(s.result, svc_core::updater::UpdateResult::None);
    assert_eq!((s.from.as_str(), s.to.as_str()), ("17.1.0", "17.0.5"));
    assert!(
        s.reason
            .starts_with("refusing to downgrade from v17.1.0 to v17.0.5"),
        "{}",
        s.reason
    );
    assert_eq!(load(&h.metrics.updates), 0);
}

/// An updater that stops while it waits for a rollout (a new leader, a crash): the next one
/// finds the rollout recorded in the shared-state Secret and finishes the wait — here with the
/// rollback.
#[tokio::test]
async fn a_restarted_updater_resumes_the_rollout_wait() {
    let mut h = Harness::new(sts("17.0.0"), vec![], "v17.1.0", true).await;
    let mut c = config(WorkloadKind::StatefulSet);
    c.rollout_timeout = Duration::from_secs(3600);
    c.rollout_poll = Duration::from_millis(50);
    h.run_with_kubelet(c.clone(), |image| !image.ends_with(":17.1.0"));
    wait_until("the update", || load(&h.metrics.updates) == 1).await;
    let recorded = || {
        h.api
            .get("Secret", NS, "svc-agent-shared-state")
            .is_some_and(|s| s["data"]["agent-update-rollout"].is_string())
    };
    wait_until("the rollout recorded", recorded).await;
    // The updater stops in the middle of its hour-long wait.
    h.task.take().unwrap().abort();

    // Its successor, with a short timeout, resumes the wait and rolls back.
    c.rollout_timeout = Duration::from_secs(1);
    let ctx = h.context(c, h.metrics.clone());
    h.task = Some(tokio::spawn(controller::run(ctx)));
    wait_until("the rollback", || load(&h.metrics.rollbacks) == 1).await;
    assert_eq!(load(&h.metrics.updates), 1, "17.1.0 was not set again");
    assert_eq!(image_of(&h.api, "StatefulSet"), format!("{BASE}:17.0.0"));
    assert_eq!(bad_versions(&h), Some(json!(["17.1.0"])));
    assert!(
        h.logs.text().contains("resuming the wait for a rollout"),
        "{}",
        h.logs.text()
    );
    wait_until("the recorded rollout forgotten", || !recorded()).await;
}

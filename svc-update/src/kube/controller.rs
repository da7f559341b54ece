//! The reconcile loop: watch the agent's StatefulSet or Deployment, gather the facts, ask
//! [`decide`], act.
//!
//! Data flow of one reconcile (triggered by any watch event on the workload — an annotation
//! such as `debug.svc.dev/trigger-event=1` included — and every sync period whatever the
//! outcome):
//!
//! 1. `svc.dev/skipreconcile: "true"` → log and stop (nothing else is read).
//! 2. Fetch the target from the version server (an error leaves the workload unchanged and
//!    retries soon).
//! 3. Read the windows from the shared-state Secret and the health of the agent's pods.
//! 4. [`decide`]: patch the container image to `<base-image>:<version without v>` with a
//!    strategic-merge patch, or log `no new version available` / the skip reason and send no
//!    write at all.
//! 5. StatefulSets: while a rollout is in progress, delete not-ready pods of the old revision
//!    (with the default `OrderedReady` policy such a pod blocks the rollout for ever).
//! 6. After an image patch: wait (bounded by the rollout timeout, 5 min by default) until as
//!    many pods as the workload wants run the new image and are ready. Otherwise restore the
//!    previous image, delete the new image's not-ready pods (so an `OrderedReady` StatefulSet
//!    can roll back), and mark the version bad (`agent-bad-versions` in the shared-state
//!    Secret): it is refused until a newer version is published or the workload carries
//!    `svc.dev/clear-bad-versions: "true"` (removed again, with the list, at the next reconcile).
//! 7. The decision — none (with the reason), updated, rolled back, failed — is written to the
//!    shared-state Secret (`agent-update-status`), where the agent reads it for the inventory.
//!
//! Steps 1–5 are bounded by the reconcile timeout (2 min); step 6 by the rollout timeout.

use std::{
    fmt::Debug,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures_util::StreamExt;
use k8s_openapi::{
    NamespaceResourceScope,
    api::{
        apps::v1::{Deployment, StatefulSet},
        core::v1::{Pod, PodSpec},
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    runtime::{Controller, controller::Action, watcher},
};
use serde::de::DeserializeOwned;
use svc_core::{
    Version,
    clock::Clock,
    maintenance::in_window,
    updater::{UPGRADER_KUBE, UpdateResult, UpdaterStatus},
};

use super::{
    CLEAR_BAD_VERSIONS_ANNOTATION, SKIP_RECONCILE_ANNOTATION,
    decision::{Decision, DecisionInput, decide},
    health::Metrics,
    schedule::read_schedule,
    status::{
        PendingRollout, StatusError, plain_version, read_bad_versions, read_pending_rollout,
        write_bad_versions, write_pending_rollout, write_status,
    },
    target::{TargetError, TargetSource},
};

/// Default period between reconciles when nothing happens (specification §8: 30 minutes).
pub(crate) const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30 * 60);
/// Default bound on one reconcile.
pub(crate) const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(120);
/// Default delay before retrying a failed reconcile.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(10);
/// Default time a pod must stay not ready before the agent counts as unhealthy.
pub(crate) const DEFAULT_UNHEALTHY_AFTER: Duration = Duration::from_secs(10 * 60);
/// Default bound on the wait for the new image's pods to become ready after an update.
pub(crate) const DEFAULT_ROLLOUT_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Default period between readiness checks while waiting for a rollout.
pub(crate) const DEFAULT_ROLLOUT_POLL: Duration = Duration::from_secs(2);
/// Label the StatefulSet controller puts on each pod: the revision it was created from.
pub(crate) const REVISION_LABEL: &str = "controller-revision-hash";

/// Which kind of workload runs the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    /// An `apps/v1` StatefulSet (the chart's default).
    StatefulSet,
    /// An `apps/v1` Deployment.
    Deployment,
}

/// What the updater manages and how.
#[derive(Debug, Clone)]
pub struct UpdaterConfig {
    /// Namespace of the agent (and of its Secret and pods).
    pub namespace: String,
    /// Name of the agent's StatefulSet or Deployment.
    pub agent_name: String,
    /// Whether that is a StatefulSet or a Deployment.
    pub kind: WorkloadKind,
    /// Name of the agent container inside the pod template.
    pub container: String,
    /// Image repository without tag; the tag is the version without `v`.
    pub base_image: String,
    /// Name of the shared-state Secret holding the maintenance schedule.
    pub secret_name: String,
    /// Major version the channel is pinned to, when known: other majors are refused.
    pub channel_major: Option<u64>,
    /// Period between reconciles when nothing happens.
    pub sync_period: Duration,
    /// Delay before retrying a failed reconcile.
    pub retry_after: Duration,
    /// Bound on one reconcile.
    pub reconcile_timeout: Duration,
    /// Time a pod must stay not ready before the agent counts as unhealthy.
    pub unhealthy_after: Duration,
    /// Bound on the wait for the new image's pods to become ready after an update; not ready
    /// by then → the previous image is restored and the version marked bad.
    pub rollout_timeout: Duration,
    /// Period between readiness checks during that wait.
    pub rollout_poll: Duration,
}

impl UpdaterConfig {
    /// A config with the defaults: shared-state Secret `<agent>-shared-state`, 30 min sync,
    /// 10 s retry, 2 min reconcile timeout, 10 min before not-ready pods count as unhealthy,
    /// 5 min for a rollout's pods to become ready (checked every 2 s).
    pub fn new(
        namespace: impl Into<String>,
        agent_name: impl Into<String>,
        kind: WorkloadKind,
        container: impl Into<String>,
        base_image: impl Into<String>,
    ) -> Self {
        let agent_name = agent_name.into();
        Self {
            namespace: namespace.into(),
            secret_name: super::default_shared_state_secret(&agent_name),
            agent_name,
            kind,
            container: container.into(),
            base_image: base_image.into(),
            channel_major: None,
            sync_period: DEFAULT_SYNC_PERIOD,
            retry_after: DEFAULT_RETRY_AFTER,
            reconcile_timeout: DEFAULT_RECONCILE_TIMEOUT,
            unhealthy_after: DEFAULT_UNHEALTHY_AFTER,
            rollout_timeout: DEFAULT_ROLLOUT_TIMEOUT,
            rollout_poll: DEFAULT_ROLLOUT_POLL,
        }
    }

    /// The full image for `version`: `<base-image>:<version without v>`.
    pub(crate) fn image_for(&self, version: &Version) -> String {
        format!("{}:{}", self.base_image, version.without_v())
    }
}

/// Why a reconcile failed. The workload is left as it was and the reconcile retried soon.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// The version server could not be asked or answered nonsense.
    #[error("fetching the target version: {0}")]
    Target(#[from] TargetError),
    /// The API server failed a request.
    #[error("{action}: {source}")]
    Kube {
        /// What the controller was doing.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The pod template has no container of the configured name.
    #[error("{kind} {name}: expected a container named \"{container}\" in the pod template, found [{found}]")]
    NoContainer {
        /// Workload kind.
        kind: &'static str,
        /// Workload name.
        name: String,
        /// The configured container name.
        container: String,
        /// The containers present, comma-separated.
        found: String,
    },
    /// The reconcile took longer than its timeout.
    #[error("reconcile did not finish within {0:?}")]
    Timeout(Duration),
    /// The versions marked bad could not be read or changed.
    #[error("the versions marked bad: {0}")]
    BadVersions(#[source] StatusError),
}

/// A workload that runs the agent: what the controller needs from a StatefulSet or Deployment.
pub trait Workload:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The kind's name for logs and errors.
    const KIND: &'static str;
    /// The pod template's spec.
    fn pod_spec(&self) -> Option<&PodSpec>;
    /// The pod selector.
    fn selector(&self) -> Option<&LabelSelector>;
    /// How many pods the workload wants (`spec.replicas`, default 1).
    fn replicas(&self) -> i32;
    /// `(currentRevision, updateRevision)` while a StatefulSet rollout is in progress.
    fn rollout_revisions(&self) -> Option<(Option<&str>, &str)> {
        None
    }
}

impl Workload for StatefulSet {
    const KIND: &'static str = "statefulset";
    fn pod_spec(&self) -> Option<&PodSpec> {
        self.spec.as_ref()?.template.spec.as_ref()
    }
    fn selector(&self) -> Option<&LabelSelector> {
        Some(&self.spec.as_ref()?.selector)
    }
    fn replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }
    fn rollout_revisions(&self) -> Option<(Option<&str>, &str)> {
        let status = self.status.as_ref()?;
        let update = status.update_revision.as_deref()?;
        Some((status.current_revision.as_deref(), update))
    }
}

impl Workload for Deployment {
    const KIND: &'static str = "deployment";
    fn pod_spec(&self) -> Option<&PodSpec> {
        self.spec.as_ref()?.template.spec.as_ref()
    }
    fn selector(&self) -> Option<&LabelSelector> {
        Some(&self.spec.as_ref()?.selector)
    }
    fn replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }
}

/// Everything a reconcile needs, shared by all reconciles.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// What to manage.
    pub config: UpdaterConfig,
    /// Where the target comes from.
    pub target: Arc<dyn TargetSource>,
    /// Wall time, for windows and pod readiness.
    pub clock: Arc<dyn Clock>,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
}

impl Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Runs the controller for the configured workload until the watch ends (it does not end on
/// its own; drop the future to stop it).
pub async fn run(ctx: Arc<Context>) {
    match ctx.config.kind {
        WorkloadKind::StatefulSet => run_for::<StatefulSet>(ctx).await,
        WorkloadKind::Deployment => run_for::<Deployment>(ctx).await,
    }
}

async fn run_for<K: Workload>(ctx: Arc<Context>) {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    // Watch only our agent: every event on it (image, annotations, status) is a trigger.
    let watch = watcher::Config::default().fields(&format!("metadata.name={}", ctx.config.agent_name));
    tracing::info!(
        kind = K::KIND,
        namespace = %ctx.config.namespace,
        name = %ctx.config.agent_name,
        "watching the agent"
    );
    Controller::new(api, watch)
        .run(reconcile::<K>, error_policy::<K>, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "controller event");
            }
        })
        .await;
}

fn error_policy<K: Workload>(_obj: Arc<K>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconciles_failed.inc();
    tracing::warn!(%error, "reconcile failed, the agent is unchanged; retrying soon");
    Action::requeue(ctx.config.retry_after)
}

/// One reconcile of the workload, bounded by the configured timeout.
pub async fn reconcile<K: Workload>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let timeout = ctx.config.reconcile_timeout;
    let rollout = match tokio::time::timeout(timeout, reconcile_once(obj.as_ref(), &ctx)).await {
        Ok(result) => result?,
        Err(_) => return Err(ReconcileError::Timeout(timeout)),
    };
    if let Some(rollout) = rollout {
        verify_rollout::<K>(&ctx, rollout).await?;
    }
    ctx.metrics.reconciles_ok.inc();
    Ok(Action::requeue(ctx.config.sync_period))
}

/// An image patch whose pods are still to prove themselves.
#[derive(Debug)]
struct Rollout {
    name: String,
    previous_image: Option<String>,
    new_version: Version,
    new_image: String,
    /// How long the pods may still take.
    timeout: Duration,
}

async fn reconcile_once<K: Workload>(obj: &K, ctx: &Context) -> Result<Option<Rollout>, ReconcileError> {
    let config = &ctx.config;
    let name = obj.name_any();
    if obj
        .annotations()
        .get(SKIP_RECONCILE_ANNOTATION)
        .map(String::as_str)
        == Some("true")
    {
        ctx.metrics.skipped.inc();
        let reason = format!("{SKIP_RECONCILE_ANNOTATION} is \"true\": automatic updates suspended");
        tracing::info!(kind = K::KIND, %name, "{reason}");
        let current = current_image_version(obj, config);
        record(
            ctx,
            UpdateResult::None,
            current.as_ref(),
            current.as_ref(),
            &reason,
            None,
        )
        .await;
        return Ok(None);
    }
    if obj
        .annotations()
        .get(CLEAR_BAD_VERSIONS_ANNOTATION)
        .map(String::as_str)
        == Some("true")
    {
        clear_bad_versions::<K>(ctx, &name).await?;
    }
    let bad_versions = read_bad_versions(ctx.client.clone(), &config.namespace, &config.secret_name)
        .await
        .map_err(ReconcileError::BadVersions)?;
    if let Some(rollout) = pending_rollout(obj, ctx).await {
        return Ok(Some(rollout));
    }
    let containers = obj
        .pod_spec()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let Some(container) = containers.iter().find(|c| c.name == config.container) else {
        return Err(ReconcileError::NoContainer {
            kind: K::KIND,
            name,
            container: config.container.clone(),
            found: containers
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let current = container.image.as_deref().and_then(image_version);

    let target = ctx.target.fetch().await?;
    let now = ctx.clock.now();
    let windows = match read_schedule(ctx.client.clone(), &config.namespace, &config.secret_name).await {
        Ok(windows) => windows,
        Err(error) => {
            // A bad schedule must not block critical updates; it only keeps the window shut.
            tracing::warn!(%error, "maintenance schedule unreadable, treating the window as closed");
            Vec::new()
        }
    };
    let pods = list_pods(obj, ctx).await?;
    let unhealthy: Vec<&Pod> = pods
        .iter()
        .filter(|p| pod_unhealthy(p, now, config.unhealthy_after))
        .collect();

    let decision = decide(DecisionInput {
        current: current.as_ref(),
        target: &target,
        channel_major: config.channel_major,
        window_open: in_window(&windows, now),
        pods_unhealthy: !unhealthy.is_empty(),
        bad_versions: &bad_versions,
    });
    let mut rollout = None;
    match &decision {
        Decision::NoNewVersion => {
            ctx.metrics.no_new_version.inc();
            tracing::info!(kind = K::KIND, %name, current = ?current.as_ref().map(ToString::to_string), "no new version available");
            let to = target.version.as_ref().or(current.as_ref());
            record(
                ctx,
                UpdateResult::None,
                current.as_ref(),
                to,
                "no new version available",
                Some(&bad_versions),
            )
            .await;
        }
        Decision::Skip(reason) => {
            ctx.metrics.skipped.inc();
            tracing::info!(kind = K::KIND, %name, "{reason}");
            let to = target.version.as_ref();
            record(
                ctx,
                UpdateResult::None,
                current.as_ref(),
                to,
                &reason.to_string(),
                Some(&bad_versions),
            )
            .await;
        }
        Decision::Update(version, reason) => {
            let image = config.image_for(version);
            tracing::info!(kind = K::KIND, %name, %image, %reason, "updating the agent");
            let patch = serde_json::json!({
                "spec": { "template": { "spec": { "containers": [
                    { "name": config.container, "image": image }
                ]}}}
            });
            let api: Api<K> = Api::namespaced(ctx.client.clone(), &config.namespace);
            let patched = api
                .patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .map(drop)
                .map_err(|source| ReconcileError::Kube {
                    action: format!("patching {} {name}", K::KIND),
                    source,
                });
            if let Err(error) = patched {
                let reason = format!("setting the image {image}: {error}");
                record(
                    ctx,
                    UpdateResult::Failed,
                    current.as_ref(),
                    Some(version),
                    &reason,
                    Some(&bad_versions),
                )
                .await;
                return Err(error);
            }
            ctx.metrics.updates.inc();
            let pending = PendingRollout {
                version: plain_version(version),
                image: image.clone(),
                previous_image: container.image.clone(),
                deadline: unix_seconds(now + config.rollout_timeout),
            };
            if let Err(error) = write_pending_rollout(
                ctx.client.clone(),
                &config.namespace,
                &config.secret_name,
                Some(&pending),
            )
            .await
            {
                tracing::warn!(%error, "could not record the rollout; an updater restarted during the wait will not resume it");
            }
            rollout = Some(Rollout {
                name: name.clone(),
                previous_image: container.image.clone(),
                new_version: version.clone(),
                new_image: image,
                timeout: config.rollout_timeout,
            });
        }
    }
    if let Some((current_revision, update_revision)) = obj.rollout_revisions()
        && current_revision != Some(update_revision)
    {
        unstick_rollout(ctx, &pods, update_revision).await?;
    }
    Ok(rollout)
}

/// A rollout an earlier updater (or reconcile) started and did not see through, when the
/// workload still runs its image: it is resumed for the rest of its time (at most the rollout
/// timeout). A recorded rollout the workload no longer runs (the image was changed since) is
/// forgotten.
async fn pending_rollout<K: Workload>(obj: &K, ctx: &Context) -> Option<Rollout> {
    let config = &ctx.config;
    let pending = match read_pending_rollout(ctx.client.clone(), &config.namespace, &config.secret_name).await
    {
        Ok(pending) => pending?,
        Err(error) => {
            tracing::warn!(%error, "the recorded rollout is unreadable; forgetting it");
            forget_rollout(ctx).await;
            return None;
        }
    };
    let image = obj
        .pod_spec()?
        .containers
        .iter()
        .find(|c| c.name == config.container)?
        .image
        .clone();
    let version = Version::parse(&pending.version).ok();
    match (image, version) {
        (Some(image), Some(new_version)) if image == pending.image => {
            let left = u64::try_from(pending.deadline - unix_seconds(ctx.clock.now())).unwrap_or(0);
            let timeout = Duration::from_secs(left).min(config.rollout_timeout);
            tracing::info!(name = %obj.name_any(), %image, ?timeout, "resuming the wait for a rollout an earlier reconcile started");
            Some(Rollout {
                name: obj.name_any(),
                previous_image: pending.previous_image,
                new_version,
                new_image: image,
                timeout,
            })
        }
        _ => {
            forget_rollout(ctx).await;
            None
        }
    }
}

async fn forget_rollout(ctx: &Context) {
    let config = &ctx.config;
    if let Err(error) =
        write_pending_rollout(ctx.client.clone(), &config.namespace, &config.secret_name, None).await
    {
        tracing::warn!(%error, "could not clear the recorded rollout");
    }
}

/// The version in the agent container's image tag.
fn current_image_version<K: Workload>(obj: &K, config: &UpdaterConfig) -> Option<Version> {
    obj.pod_spec()?
        .containers
        .iter()
        .find(|c| c.name == config.container)?
        .image
        .as_deref()
        .and_then(image_version)
}

/// Writes the decision to the shared-state Secret. `bad` is the current list of versions
/// marked bad (read again when `None`). A failed write is logged: the status informs, it does
/// not decide.
async fn record(
    ctx: &Context,
    result: UpdateResult,
    from: Option<&Version>,
    to: Option<&Version>,
    reason: &str,
    bad: Option<&[Version]>,
) {
    let config = &ctx.config;
    let bad_versions = match bad {
        Some(bad) => bad.to_vec(),
        None => read_bad_versions(ctx.client.clone(), &config.namespace, &config.secret_name)
            .await
            .unwrap_or_default(),
    };
    let status = UpdaterStatus {
        upgrader: UPGRADER_KUBE.to_owned(),
        upgrader_version: plain_version(svc_core::version::current()),
        result,
        from: from.map(plain_version).unwrap_or_default(),
        to: to.map(plain_version).unwrap_or_default(),
        reason: reason.to_owned(),
        at: u64::try_from(unix_seconds(ctx.clock.now())).unwrap_or(0),
        bad_versions: bad_versions.iter().map(plain_version).collect(),
    };
    match write_status(
        ctx.client.clone(),
        &config.namespace,
        &config.secret_name,
        &status,
    )
    .await
    {
        Ok(()) if result != UpdateResult::None => tracing::info!(
            result = %status.result,
            from = %status.from,
            to = %status.to,
            reason = %status.reason,
            "recorded the update status"
        ),
        Ok(()) => {}
        Err(error) => tracing::warn!(%error, "could not record the update status"),
    }
}

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Removes the versions marked bad and the annotation that asked for it.
async fn clear_bad_versions<K: Workload>(ctx: &Context, name: &str) -> Result<(), ReconcileError> {
    let config = &ctx.config;
    write_bad_versions(ctx.client.clone(), &config.namespace, &config.secret_name, &[])
        .await
        .map_err(ReconcileError::BadVersions)?;
    let patch = serde_json::json!({ "metadata": { "annotations": { CLEAR_BAD_VERSIONS_ANNOTATION: null } } });
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &config.namespace);
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| ReconcileError::Kube {
            action: format!(
                "removing the annotation {CLEAR_BAD_VERSIONS_ANNOTATION} from {} {name}",
                K::KIND
            ),
            source,
        })?;
    tracing::info!(kind = K::KIND, %name, "{CLEAR_BAD_VERSIONS_ANNOTATION}: the versions marked bad are cleared");
    Ok(())
}

/// Waits, bounded by the rollout timeout, for the new image's pods to be ready; then records
/// the update, or restores the previous image and marks the version bad.
async fn verify_rollout<K: Workload>(ctx: &Context, rollout: Rollout) -> Result<(), ReconcileError> {
    let result = wait_for_rollout::<K>(ctx, &rollout).await;
    forget_rollout(ctx).await;
    result
}

async fn wait_for_rollout<K: Workload>(ctx: &Context, rollout: &Rollout) -> Result<(), ReconcileError> {
    let config = &ctx.config;
    let previous = rollout.previous_image.as_deref().and_then(image_version);
    let deadline = tokio::time::Instant::now() + rollout.timeout;
    let mut last;
    loop {
        match rollout_progress::<K>(ctx, rollout).await {
            Ok(Ok(())) => {
                tracing::info!(kind = K::KIND, name = %rollout.name, image = %rollout.new_image, "the agent's pods are ready with the new image");
                // Versions at or below the one now running can no longer be offered as updates.
                let bad = read_bad_versions(ctx.client.clone(), &config.namespace, &config.secret_name)
                    .await
                    .unwrap_or_default();
                let kept: Vec<Version> = bad
                    .iter()
                    .filter(|v| **v > rollout.new_version)
                    .cloned()
                    .collect();
                if kept.len() != bad.len()
                    && let Err(error) =
                        write_bad_versions(ctx.client.clone(), &config.namespace, &config.secret_name, &kept)
                            .await
                {
                    tracing::warn!(%error, "could not prune the versions marked bad");
                }
                record(
                    ctx,
                    UpdateResult::Updated,
                    previous.as_ref(),
                    Some(&rollout.new_version),
                    "",
                    Some(&kept),
                )
                .await;
                return Ok(());
            }
            Ok(Err(not_ready)) => last = not_ready,
            Err(error) => last = error.to_string(),
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep(config.rollout_poll.min(deadline - now)).await;
    }
    let reason = format!(
        "pods not ready with {} within {}: {last}",
        plain_version(&rollout.new_version),
        humanize(config.rollout_timeout)
    );
    tracing::warn!(kind = K::KIND, name = %rollout.name, %reason, "rolling back");
    roll_back::<K>(ctx, rollout, previous.as_ref(), &reason).await
}

fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else if secs > 0 {
        format!("{secs}s")
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// `Ok(Ok(()))` once as many ready pods as the workload wants run the new image;
/// `Ok(Err(what))` with what is missing otherwise.
async fn rollout_progress<K: Workload>(
    ctx: &Context,
    rollout: &Rollout,
) -> Result<Result<(), String>, ReconcileError> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let obj = api
        .get(&rollout.name)
        .await
        .map_err(|source| ReconcileError::Kube {
            action: format!("reading {} {}", K::KIND, rollout.name),
            source,
        })?;
    let wanted = usize::try_from(obj.replicas()).unwrap_or(0);
    let pods = list_pods(&obj, ctx).await?;
    let new: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && runs_image(p, &ctx.config.container, &rollout.new_image)
        })
        .collect();
    let ready = new.iter().filter(|p| pod_ready(p)).count();
    if ready >= wanted {
        return Ok(Ok(()));
    }
    let waiting: Vec<String> = new
        .iter()
        .filter(|p| !pod_ready(p))
        .map(|p| {
            let why = ready_condition(p)
                .and_then(|c| c.message.clone().or_else(|| c.reason.clone()))
                .unwrap_or_else(|| "not ready".to_owned());
            format!("{} {why}", p.name_any())
        })
        .collect();
    Ok(Err(format!(
        "{ready} of {wanted} ready{}",
        if waiting.is_empty() {
            String::new()
        } else {
            format!(" ({})", waiting.join("; "))
        }
    )))
}

fn runs_image(pod: &Pod, container: &str, image: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .any(|c| c.name == container && c.image.as_deref() == Some(image))
    })
}

/// Restores the previous image, deletes the bad image's not-ready pods, marks the version bad
/// and records `rolled_back` (or `failed` when the image could not be restored).
async fn roll_back<K: Workload>(
    ctx: &Context,
    rollout: &Rollout,
    previous: Option<&Version>,
    reason: &str,
) -> Result<(), ReconcileError> {
    let config = &ctx.config;
    let name = &rollout.name;
    let Some(previous_image) = rollout.previous_image.as_deref() else {
        let reason = format!("{reason}; no previous image to restore");
        record(
            ctx,
            UpdateResult::Failed,
            Some(&rollout.new_version),
            None,
            &reason,
            None,
        )
        .await;
        return Ok(());
    };
    let patch = serde_json::json!({
        "spec": { "template": { "spec": { "containers": [
            { "name": config.container, "image": previous_image }
        ]}}}
    });
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &config.namespace);
    let restored = tokio::time::timeout(
        config.reconcile_timeout,
        api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)),
    )
    .await;
    let error = match restored {
        Ok(Ok(_)) => None,
        Ok(Err(source)) => Some(ReconcileError::Kube {
            action: format!("restoring the image {previous_image} of {} {name}", K::KIND),
            source,
        }),
        Err(_) => Some(ReconcileError::Timeout(config.reconcile_timeout)),
    };
    if let Some(error) = error {
        let reason = format!("{reason}; restoring {previous_image} failed: {error}");
        record(
            ctx,
            UpdateResult::Failed,
            Some(&rollout.new_version),
            previous,
            &reason,
            None,
        )
        .await;
        return Err(error);
    }
    tracing::warn!(kind = K::KIND, %name, image = %previous_image, bad = %rollout.new_version, "restored the previous image; the version is marked bad");
    // A not-ready pod of the bad image blocks an OrderedReady StatefulSet's way back.
    if let Ok(obj) = api.get(name).await
        && let Ok(pods) = list_pods(&obj, ctx).await
    {
        let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &config.namespace);
        for pod in pods.iter().filter(|p| {
            runs_image(p, &config.container, &rollout.new_image)
                && !pod_ready(p)
                && p.metadata.deletion_timestamp.is_none()
        }) {
            let pod_name = pod.name_any();
            match pod_api.delete(&pod_name, &DeleteParams::default()).await {
                Ok(_) => {
                    ctx.metrics.pods_deleted.inc();
                }
                Err(error) => {
                    tracing::warn!(pod = %pod_name, %error, "could not delete a not-ready pod of the bad image");
                }
            }
        }
    }
    let mut bad = read_bad_versions(ctx.client.clone(), &config.namespace, &config.secret_name)
        .await
        .unwrap_or_default();
    if !bad.contains(&rollout.new_version) {
        bad.push(rollout.new_version.clone());
    }
    if let Err(error) =
        write_bad_versions(ctx.client.clone(), &config.namespace, &config.secret_name, &bad).await
    {
        tracing::warn!(%error, "could not mark the version bad");
    }
    record(
        ctx,
        UpdateResult::RolledBack,
        Some(&rollout.new_version),
        previous,
        reason,
        Some(&bad),
    )
    .await;
    ctx.metrics.rollbacks.inc();
    Ok(())
}

async fn list_pods<K: Workload>(obj: &K, ctx: &Context) -> Result<Vec<Pod>, ReconcileError> {
    let Some(selector) = obj.selector().and_then(selector_string) else {
        // No selector: no pods can be attributed to the agent (and "everything" is not them).
        return Ok(Vec::new());
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    api.list(&ListParams::default().labels(&selector))
        .await
        .map(|list| list.items)
        .map_err(|source| ReconcileError::Kube {
            action: format!("listing pods {selector}"),
            source,
        })
}

/// Deletes the not-ready pods that do not belong to `update_revision`: the StatefulSet
/// controller recreates them at the new revision.
async fn unstick_rollout(ctx: &Context, pods: &[Pod], update_revision: &str) -> Result<(), ReconcileError> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    for pod in pods {
        let revision = pod.labels().get(REVISION_LABEL).map(String::as_str);
        if revision == Some(update_revision) || pod_ready(pod) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.name_any();
        tracing::info!(pod = %name, ?revision, %update_revision, "deleting an unhealthy pod of the old revision so the rollout can proceed");
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.metrics.pods_deleted.inc();
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(ReconcileError::Kube {
                    action: format!("deleting pod {name}"),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// The equality-based selector string of `matchLabels` (`a=b,c=d`); `None` when empty.
/// `matchExpressions` are not used by the chart and are ignored here.
pub(crate) fn selector_string(selector: &LabelSelector) -> Option<String> {
    let labels = selector.match_labels.as_ref()?;
    if labels.is_empty() {
        return None;
    }
    Some(
        labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// The version in an image reference's tag: `repo/svc:17.1.0` → 17.1.0. `None` for no tag,
/// `latest`, or a digest-only reference.
pub fn image_version(image: &str) -> Option<Version> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let (_, tag) = last.split_once(':')?;
    Version::parse(tag).ok()
}

/// Whether the pod's `Ready` condition is `True`.
pub(crate) fn pod_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// Whether a pod has been not ready for at least `after` at `now`.
///
/// "Not ready since" is the `Ready` condition's `lastTransitionTime`, or the pod's creation time
/// when it has no `Ready` condition yet (stuck pulling its image, unschedulable). Pods being
/// deleted and pods whose times are unknown do not count.
pub(crate) fn pod_unhealthy(pod: &Pod, now: SystemTime, after: Duration) -> bool {
    if pod.metadata.deletion_timestamp.is_some() || pod_ready(pod) {
        return false;
    }
    let since = ready_condition(pod)
        .and_then(|c| c.last_transition_time.as_ref())
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| SystemTime::from(t.0));
    since.is_some_and(|since| now.duration_since(since).is_ok_and(|d| d >= after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{PodCondition, PodStatus},
        apimachinery::pkg::apis::meta::v1::Time,
        jiff::Timestamp,
    };
    use kube::api::ObjectMeta;

    fn at(secs: i64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
    }

    fn time(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn pod(created: i64, ready: Option<(&str, i64)>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                creation_timestamp: Some(time(created)),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                conditions: ready.map(|(status, t)| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: status.into(),
                        last_transition_time: Some(time(t)),
                        ..PodCondition::default()
                    }]
                }),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn image_versions() {
        assert_eq!(
            image_version("repo.example.com:5000/svc/agent:17.1.0"),
            Some(Version::new(17, 1, 0))
        );
        assert_eq!(image_version("agent:v17.1.0"), Some(Version::new(17, 1, 0)));
        assert_eq!(
            image_version("agent:17.1.0@sha256:abcd"),
            Some(Version::new(17, 1, 0))
        );
        assert_eq!(image_version("repo.example.com:5000/agent"), None);
        assert_eq!(image_version("agent:latest"), None);
        assert_eq!(image_version("agent@sha256:abcd"), None);
    }

    #[test]
    fn sustained_not_ready_is_unhealthy() {
        let after = Duration::from_secs(600);
        assert!(!pod_unhealthy(&pod(0, Some(("True", 0))), at(10_000), after));
        assert!(!pod_unhealthy(&pod(0, Some(("False", 9_500))), at(10_000), after));
        assert!(pod_unhealthy(&pod(0, Some(("False", 9_400))), at(10_000), after));
        assert!(
            pod_unhealthy(&pod(0, None), at(10_000), after),
            "never became ready"
        );
        assert!(
            !pod_unhealthy(&pod(9_900, None), at(10_000), after),
            "just created"
        );
        let mut deleting = pod(0, Some(("False", 0)));
        deleting.metadata.deletion_timestamp = Some(time(1));
        assert!(!pod_unhealthy(&deleting, at(10_000), after));
    }

    #[test]
    fn selectors_and_images() {
        let s = LabelSelector {
            match_labels: Some(
                [
                    ("app".to_owned(), "svc-agent".to_owned()),
                    ("x".to_owned(), "y".to_owned()),
                ]
                .into(),
            ),
            ..LabelSelector::default()
        };
        assert_eq!(selector_string(&s).as_deref(), Some("app=svc-agent,x=y"));
        assert_eq!(selector_string(&LabelSelector::default()), None);
        let c = UpdaterConfig::new(
            "svc",
            "svc-agent",
            WorkloadKind::StatefulSet,
            "svc",
            "public.ecr.aws/svc/agent",
        );
        assert_eq!(
            c.image_for(&Version::parse("v17.2.0-dev").unwrap()),
            "public.ecr.aws/svc/agent:17.2.0-dev"
        );
        assert_eq!(c.secret_name, "svc-agent-shared-state");
        assert_eq!(c.sync_period, Duration::from_secs(1800));
    }
}

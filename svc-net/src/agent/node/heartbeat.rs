//! The agent's heartbeats to the inventory, the schedule exports that start with them, and what
//! the agent and its updater tell each other around every heartbeat ([`super::updater`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use svc_core::SystemClock;
use svc_core::auth::{Heartbeat, NextWindow};
use svc_core::maintenance::Window;

use super::export::{
    AuthMaintenanceSource, ExportSettings, ScheduleExporter, ScheduleSink, UpgradeDirWatcher,
};
use super::updater::{UpdateStatusSource, agent_report, reported_upgrader, write_agent_file};
use crate::auth::{ClientIdentity, FailoverClient};
use crate::diag::NodeMetrics;
use crate::dial::ProxyDialer;

/// Where the schedule goes.
pub(super) struct ExportTargets {
    /// The Linux updater's directory: exported to only while it exists (the package owns it,
    /// and creating it here would claim a system path nobody asked for), checked about every
    /// `check_every` and after every accepted heartbeat.
    pub(super) upgrade_dir: PathBuf,
    /// How often the directory is checked (before jitter).
    pub(super) check_every: Duration,
    /// The version endpoint written there while the endpoint file is empty (`None`: none known;
    /// nothing is written).
    pub(super) endpoint: Option<String>,
    /// Further sinks (the Kubernetes shared-state Secret).
    pub(super) sinks: Vec<Arc<dyn ScheduleSink>>,
}

/// What the heartbeats say about the updater, and what the agent tells the updater.
pub(super) struct UpdaterLink {
    /// `SVC_UPGRADER` / `SVC_UPGRADER_VERSION` or `AgentNode::upgrader`: each wins over the
    /// status when not empty.
    pub(super) overrides: (String, String),
    /// Where the updater's status is read, before every heartbeat.
    pub(super) status: Arc<dyn UpdateStatusSource>,
    /// The host ID written to the `agent` file.
    pub(super) host_id: String,
    /// The bound diagnostics address, written to the `agent` file.
    pub(super) diag_addr: Option<SocketAddr>,
}

/// Connects to the Auth API (retrying with the reconnect backoff: the proxy or the Auth
/// Service may be down when the agent starts), starts the schedule exports, and heartbeats
/// every `HEARTBEAT_INTERVAL`. Aborting the task stops the exports too.
pub(super) struct HeartbeatTask {
    pub(super) identity: ClientIdentity,
    /// The Auth Service's addresses, tried in turn (the one joined first).
    pub(super) auth_addrs: Vec<String>,
    pub(super) dialer: ProxyDialer,
    pub(super) beat: Heartbeat,
    pub(super) metrics: NodeMetrics,
    pub(super) first_beat: Arc<tokio::sync::Notify>,
    pub(super) exports: ExportTargets,
    pub(super) updater: UpdaterLink,
}

/// The running exports: the watched Linux directory and the extra sinks.
struct Exports {
    dir: UpgradeDirWatcher,
    sinks: Vec<ScheduleExporter>,
}

/// How long the first heartbeat waits for the first schedule export.
const FIRST_EXPORT_WAIT: Duration = Duration::from_secs(5);

impl Exports {
    /// Waits (at most `limit`) until the exports to the Linux updater's directory (when it
    /// exists) and to every sink have been attempted once.
    async fn first_export(&self, upgrade_dir: &std::path::Path, limit: Duration) {
        let attempted = |s: &super::export::ExportStatus| s.exports + s.failures > 0;
        let mut statuses: Vec<_> = self.sinks.iter().map(|e| e.status()).collect();
        if upgrade_dir.is_dir() {
            statuses.push(self.dir.status());
        }
        let all = async {
            for status in &mut statuses {
                let _ = status.wait_for(attempted).await;
            }
        };
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// The first exported window that has not ended at `now` (the Linux files first, then the
    /// sinks).
    fn next_window(&self, now: SystemTime) -> Option<Window> {
        let from_dir = (*self.dir.exporting().borrow())
            .then(|| self.dir.status().borrow().next_window(now))
            .flatten();
        from_dir.or_else(|| {
            self.sinks
                .iter()
                .find_map(|e| e.status().borrow().next_window(now))
        })
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl HeartbeatTask {
    pub(super) async fn run(mut self) {
        let link = Arc::new(FailoverClient::new(
            self.auth_addrs.clone(),
            self.identity.clone(),
            Some(self.dialer.clone()),
        ));
        let mut backoff = crate::tunnel::Backoff::default();
        loop {
            match link.client().await {
                Ok(_) => break,
                Err(e) => {
                    self.metrics.heartbeat_failures.inc();
                    let wait = backoff.next_delay(rand::random::<f64>());
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot reach the Auth API; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
        let exports = self.exports(link.clone());
        // The first heartbeat carries the next window when the first export is quick (it asks
        // the Auth Service once): wait for it a little, never long.
        exports
            .first_export(&self.exports.upgrade_dir, FIRST_EXPORT_WAIT)
            .await;
        let mut last_status_error = None;
        self.beat_once(&link, &exports, &mut last_status_error).await;
        self.first_beat.notify_one();
        let mut tick = tokio::time::interval(svc_core::auth::HEARTBEAT_INTERVAL);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.beat_once(&link, &exports, &mut last_status_error).await;
        }
    }

    /// One heartbeat with the updater's current status and the next exported window; once
    /// accepted, the `agent` file for the updater (when its directory exists).
    async fn beat_once(
        &mut self,
        auth: &FailoverClient,
        exports: &Exports,
        last_status_error: &mut Option<String>,
    ) {
        let link = &self.updater;
        let status = match link.status.status().await {
            Ok(status) => {
                *last_status_error = None;
                status
            }
            Err(e) => {
                // Logged once per distinct problem, not every heartbeat.
                let text = e.to_string();
                if last_status_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, from = %link.status.describe(), "ignoring the updater's status");
                    *last_status_error = Some(text);
                }
                None
            }
        };
        (self.beat.upgrader, self.beat.upgrader_version) =
            reported_upgrader(&link.overrides, status.as_ref());
        self.beat.update_status = status.as_ref().map(svc_core::auth::UpdateStatus::from);
        self.beat.next_window = exports.next_window(SystemTime::now()).map(|w| NextWindow {
            start: unix(w.start),
            end: unix(w.end),
        });
        let sent = async { auth.client().await?.heartbeat(&self.beat).await };
        match sent.await {
            Ok(()) => {
                self.metrics.heartbeats.inc();
                self.after_accepted(exports);
            }
            Err(e) => {
                self.metrics.heartbeat_failures.inc();
                tracing::warn!(error = %e, auth_servers = %auth.addrs().join(", "), "heartbeat to the Auth Service failed; retrying");
                if FailoverClient::is_transport_failure(&e) {
                    // The next heartbeat connects again, to the next address that answers.
                    auth.reset().await;
                }
            }
        };
    }

    /// Tells the updater the agent is alive (the `agent` file), and the directory watcher to
    /// look now when the directory appeared since its last check.
    fn after_accepted(&self, exports: &Exports) {
        let dir = &self.exports.upgrade_dir;
        if !dir.is_dir() {
            return;
        }
        if !*exports.dir.exporting().borrow() {
            exports.dir.check_now();
        }
        let agent = agent_report(
            &self.beat.version,
            &self.updater.host_id,
            unix(SystemTime::now()),
            self.updater.diag_addr,
        );
        if let Err(e) = write_agent_file(dir, &agent) {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot write the agent file for svc-upgrade");
        }
    }

    /// The schedule exports: the Linux updater's files while its directory exists (the endpoint
    /// file, written only while empty, points the updater at this cluster's proxy) and the
    /// extra sinks. Dropping them stops them.
    fn exports(&self, link: Arc<FailoverClient>) -> Exports {
        let targets = &self.exports;
        let source = Arc::new(AuthMaintenanceSource::failover(link));
        let settings = match &targets.endpoint {
            Some(endpoint) => ExportSettings::new(&targets.upgrade_dir).with_endpoint(endpoint.clone()),
            None => ExportSettings::new(&targets.upgrade_dir),
        };
        let dir = UpgradeDirWatcher::spawn(
            source.clone(),
            Arc::new(SystemClock),
            settings,
            targets.check_every,
        );
        let mut sinks = Vec::new();
        for sink in &targets.sinks {
            tracing::info!(sink = %sink.describe(), "exporting the maintenance schedule");
            sinks.push(ScheduleExporter::spawn_to(
                source.clone(),
                Arc::new(SystemClock),
                sink.clone(),
                ExportSettings::default(),
            ));
        }
        Exports { dir, sinks }
    }
}

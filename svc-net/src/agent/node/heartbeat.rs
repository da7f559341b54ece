//! The agent's heartbeats to the inventory, and the schedule exports that start with them.

use std::path::PathBuf;
use std::sync::Arc;

use svc_core::SystemClock;
use svc_core::auth::Heartbeat;

use super::export::{AuthMaintenanceSource, ExportSettings, ScheduleExporter, ScheduleSink};
use crate::auth::{AuthClient, ClientIdentity};
use crate::diag::NodeMetrics;
use crate::dial::ProxyDialer;

/// Where the schedule goes.
pub(super) struct ExportTargets {
    /// The Linux updater's directory: exported to only when it exists (the package owns it,
    /// and creating it here would claim a system path nobody asked for).
    pub(super) upgrade_dir: PathBuf,
    /// The version endpoint written there while the endpoint file is empty (`None`: none known;
    /// nothing is written).
    pub(super) endpoint: Option<String>,
    /// Further sinks (the Kubernetes shared-state Secret).
    pub(super) sinks: Vec<Arc<dyn ScheduleSink>>,
}

/// Connects to the Auth API (retrying with the reconnect backoff: the proxy or the Auth
/// Service may be down when the agent starts), starts the schedule exports, and heartbeats
/// every `HEARTBEAT_INTERVAL`. Aborting the task stops the exports too.
pub(super) struct HeartbeatTask {
    pub(super) identity: ClientIdentity,
    pub(super) dialer: ProxyDialer,
    pub(super) beat: Heartbeat,
    pub(super) metrics: NodeMetrics,
    pub(super) first_beat: Arc<tokio::sync::Notify>,
    pub(super) exports: ExportTargets,
}

impl HeartbeatTask {
    pub(super) async fn run(self) {
        let mut backoff = crate::tunnel::Backoff::default();
        let mut client = loop {
            match AuthClient::connect_via(&self.identity.auth_addr, &self.identity, Some(&self.dialer)).await
            {
                Ok(c) => break c,
                Err(e) => {
                    self.metrics.heartbeat_failures.inc();
                    let wait = backoff.next_delay(rand::random::<f64>());
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot reach the Auth API; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        self.beat_once(&mut client).await;
        self.first_beat.notify_one();
        let _exports = self.exports(client.clone());
        let mut tick = tokio::time::interval(svc_core::auth::HEARTBEAT_INTERVAL);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.beat_once(&mut client).await;
        }
    }

    async fn beat_once(&self, client: &mut AuthClient) {
        match client.heartbeat(&self.beat).await {
            Ok(()) => {
                self.metrics.heartbeats.inc();
            }
            Err(e) => {
                self.metrics.heartbeat_failures.inc();
                tracing::warn!(error = %e, "heartbeat to the Auth Service failed; retrying");
            }
        };
    }

    /// The schedule exports: the Linux updater's files (the endpoint file, written only while
    /// empty, points the updater at this cluster's proxy) and the extra sinks. Dropping the
    /// exporters stops them.
    fn exports(&self, client: AuthClient) -> Vec<ScheduleExporter> {
        let targets = &self.exports;
        let source = Arc::new(AuthMaintenanceSource::new(client));
        let mut out = Vec::new();
        if targets.upgrade_dir.is_dir() {
            tracing::info!(dir = %targets.upgrade_dir.display(), "exporting the maintenance schedule for svc-upgrade");
            out.push(ScheduleExporter::spawn(
                source.clone(),
                Arc::new(SystemClock),
                match &targets.endpoint {
                    Some(endpoint) => {
                        ExportSettings::new(&targets.upgrade_dir).with_endpoint(endpoint.clone())
                    }
                    None => ExportSettings::new(&targets.upgrade_dir),
                },
            ));
        }
        for sink in &targets.sinks {
            tracing::info!(sink = %sink.describe(), "exporting the maintenance schedule");
            out.push(ScheduleExporter::spawn_to(
                source.clone(),
                Arc::new(SystemClock),
                sink.clone(),
                ExportSettings::default(),
            ));
        }
        out
    }
}

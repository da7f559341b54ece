//! Schedule export: the agent tells its updater when it may be updated.
//!
//! One loop ([`ScheduleExporter`]) serves both updaters through a [`ScheduleSink`]: the Linux
//! files below ([`FileSink`], the default) or the agent's shared-state Secret in Kubernetes
//! (`svc_update::kube::schedule::SecretSink`, given to the agent node as an extra sink).
//!
//! Sits on the agent, between the cluster (the `cluster_maintenance_config` resource, reached
//! through a [`MaintenanceSource`]) and `svc-upgrade`, which reads the files written here
//! (`/etc/svc-upgrade.d/`, read by `svc_update::linux::config`):
//! - `schedule`: the next [`EXPORTED_WINDOWS`] windows in the REFERENCE format
//!   ([`render_schedule_file`]), rewritten about every [`EXPORT_INTERVAL`] (jittered by ±10 % so a
//!   fleet does not ask the cluster in step). After losing contact with the cluster for
//!   [`CONTACT_TIMEOUT`] the file is reset to empty — not deleted — so an agent cut off from its
//!   cluster is not updated on a schedule it can no longer confirm;
//! - `endpoint`: the proxy's version endpoint (`host[:port]/path`), written only when the file is
//!   missing or empty, so an administrator's choice stays.
//!
//! Files are 0644 in a 0755 directory. Written atomically (temporary file and rename) when the
//! directory allows it; an agent running as another user, which owns only the file it was given
//! (`install.sh` with `SVC_AGENT_USER`), rewrites it in place.
//!
//! The Linux updater's directory belongs to its package: the agent exports there only while it
//! exists, and notices it appearing or going away without a restart ([`UpgradeDirWatcher`]
//! checks at start and about every [`DIR_CHECK_INTERVAL`]).
//!
//! The pure parts ([`schedule_text`], [`jittered`]) are separate from the task
//! ([`ScheduleExporter::spawn`]), which takes its clock for the window arithmetic and tokio's
//! timer for waiting, so tests run it with paused time.

use std::{
    io::{self, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use svc_core::{
    Clock,
    maintenance::{AgentUpgradeWindow, Window, render_schedule_file},
};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
    time::Instant,
};

use tower::BoxError;

/// The Linux updater's configuration directory, where the schedule and endpoint files go.
pub const DEFAULT_UPGRADE_DIR: &str = "/etc/svc-upgrade.d";

/// Names another updater configuration directory than [`DEFAULT_UPGRADE_DIR`] (self-hosting,
/// tests).
pub const UPGRADE_DIR_ENV: &str = "SVC_UPGRADE_CONFIG";

/// The updater configuration directory: `SVC_UPGRADE_CONFIG` when set and not empty, else
/// [`DEFAULT_UPGRADE_DIR`]. `env` looks a variable up (`|k| std::env::var(k).ok()`).
pub fn upgrade_dir_from_env(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    match env(UPGRADE_DIR_ENV) {
        Some(dir) if !dir.trim().is_empty() => PathBuf::from(dir.trim()),
        _ => PathBuf::from(DEFAULT_UPGRADE_DIR),
    }
}

/// How often the schedule is exported (before jitter).
pub const EXPORT_INTERVAL: Duration = Duration::from_secs(40 * 60);
/// How often the source is asked again after a failure.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_secs(60);
/// How long without contact before the schedule is reset.
pub const CONTACT_TIMEOUT: Duration = Duration::from_secs(9 * 60);
/// How many windows the schedule lists.
pub const EXPORTED_WINDOWS: usize = 3;
/// How often the agent checks whether the Linux updater's directory exists (before jitter).
pub const DIR_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// The spread of every wait: ±10 %.
pub(crate) const JITTER: f64 = 0.1;

/// Where the agent learns the cluster's maintenance configuration (the agent's cache of the
/// `cluster_maintenance_config` resource, an Auth API call, a test's table).
#[async_trait]
pub trait MaintenanceSource: Send + Sync + 'static {
    /// `spec.agent_upgrades` of the cluster: `Ok(None)` when the cluster has no maintenance
    /// configuration; `Err` when the cluster cannot be reached.
    async fn agent_upgrades(&self) -> Result<Option<AgentUpgradeWindow>, BoxError>;
}

/// The agent's [`MaintenanceSource`]: the cluster's `cluster_maintenance_config`, read through
/// the Auth API with the agent's own host identity (agents may read it, and nothing more).
#[derive(Debug, Clone)]
pub struct AuthMaintenanceSource {
    link: Arc<crate::auth::FailoverClient>,
}

impl AuthMaintenanceSource {
    /// Reads through `client`, connected with the agent's identity.
    pub fn new(client: crate::auth::AuthClient) -> Self {
        Self::failover(Arc::new(crate::auth::FailoverClient::with_client(
            client,
            "the Auth Service".into(),
        )))
    }

    /// Reads through whichever of the Auth Service's addresses answers (`link` presents the
    /// agent's identity).
    pub fn failover(link: Arc<crate::auth::FailoverClient>) -> Self {
        AuthMaintenanceSource { link }
    }
}

#[async_trait]
impl MaintenanceSource for AuthMaintenanceSource {
    async fn agent_upgrades(&self) -> Result<Option<AgentUpgradeWindow>, BoxError> {
        use svc_core::resource::{CLUSTER_MAINTENANCE_CONFIG_NAME, Kind, Resource};
        let mut client = self.link.client().await?;
        match client
            .get_resources(
                Kind::ClusterMaintenanceConfig,
                Some(CLUSTER_MAINTENANCE_CONFIG_NAME),
                false,
            )
            .await
        {
            Ok(found) => Ok(found.into_iter().find_map(|r| match r {
                Resource::ClusterMaintenanceConfig(c) => c.spec.agent_upgrades,
                _ => None,
            })),
            // No maintenance configuration yet: an empty schedule, not lost contact.
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => {
                if crate::auth::FailoverClient::is_transport_failure(&e) {
                    self.link.reset().await;
                }
                Err(e.into())
            }
        }
    }
}

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ExportError {
    /// Creating the directory or writing the file failed.
    #[error("exporting to {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
}

/// The schedule file for `config` at `now`: the header and the next `n` windows (none when the
/// cluster has no maintenance configuration).
pub fn schedule_text(config: Option<&AgentUpgradeWindow>, now: SystemTime, n: usize) -> String {
    let windows = config.map(|c| c.next_windows(now, n)).unwrap_or_default();
    render_schedule_file(&windows)
}

/// `base` spread by `±fraction`, `unit` (0 to 1) choosing where: 0 is the shortest, 1 the
/// longest.
pub fn jittered(base: Duration, fraction: f64, unit: f64) -> Duration {
    let factor = 1.0 - fraction + 2.0 * fraction * unit.clamp(0.0, 1.0);
    base.mul_f64(factor.max(0.0))
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Creates `dir` with mode 0755 when it is missing.
fn ensure_dir(dir: &Path) -> Result<(), ExportError> {
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(io_err(dir))?;
    }
    Ok(())
}

/// Writes `text` to `dir/name`, mode 0644: atomically when the directory is writable, else in
/// place (a non-root agent owns only the file).
pub(crate) fn write_file(dir: &Path, name: &str, text: &str) -> Result<(), ExportError> {
    ensure_dir(dir)?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    match std::fs::File::create(&tmp) {
        Ok(mut file) => {
            file.write_all(text.as_bytes()).map_err(io_err(&tmp))?;
            file.set_permissions(std::fs::Permissions::from_mode(0o644))
                .map_err(io_err(&tmp))?;
            file.sync_all().map_err(io_err(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io_err(&path))
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&path)
                .map_err(io_err(&path))?;
            file.write_all(text.as_bytes()).map_err(io_err(&path))?;
            file.sync_all().map_err(io_err(&path))
        }
        Err(e) => Err(io_err(&tmp)(e)),
    }
}

/// Writes `endpoint` to `dir/endpoint` when that file is missing or blank; returns whether it
/// wrote.
pub(crate) fn write_endpoint_if_empty(dir: &Path, endpoint: &str) -> Result<bool, ExportError> {
    let path = dir.join("endpoint");
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => Ok(false),
        Ok(_) => write_file(dir, "endpoint", &format!("{endpoint}\n")).map(|()| true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            write_file(dir, "endpoint", &format!("{endpoint}\n")).map(|()| true)
        }
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Where exported windows go: the Linux updater's files, or the Kubernetes agent's Secret.
#[async_trait]
pub trait ScheduleSink: Send + Sync + 'static {
    /// Publishes `windows` (empty when the cluster has no maintenance configuration).
    async fn export(&self, windows: &[Window]) -> Result<(), BoxError>;
    /// Withdraws the schedule after contact with the cluster was lost: an empty schedule, not a
    /// missing one.
    async fn reset(&self) -> Result<(), BoxError>;
    /// Where the schedule goes, for logs.
    fn describe(&self) -> String;
}

/// The Linux sink: `schedule` (and, once, `endpoint`) in the updater's configuration directory.
#[derive(Debug, Clone)]
pub struct FileSink {
    dir: PathBuf,
    endpoint: Option<String>,
}

impl FileSink {
    /// Exports to `dir`, also writing `endpoint` there when that file is empty.
    pub(crate) fn new(dir: impl Into<PathBuf>, endpoint: Option<String>) -> Self {
        FileSink {
            dir: dir.into(),
            endpoint,
        }
    }
}

#[async_trait]
impl ScheduleSink for FileSink {
    async fn export(&self, windows: &[Window]) -> Result<(), BoxError> {
        write_file(&self.dir, "schedule", &render_schedule_file(windows))?;
        if let Some(endpoint) = &self.endpoint {
            write_endpoint_if_empty(&self.dir, endpoint)?;
        }
        Ok(())
    }

    async fn reset(&self) -> Result<(), BoxError> {
        Ok(write_file(&self.dir, "schedule", "")?)
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
}

/// Settings of a [`ScheduleExporter`]; [`Default`] gives the system's directory and the
/// documented intervals.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExportSettings {
    /// The updater's configuration directory.
    pub dir: PathBuf,
    /// The proxy's version endpoint (`host[:port]/path`), written when `endpoint` is empty.
    pub endpoint: Option<String>,
    /// The export period, before jitter.
    pub interval: Duration,
    /// The retry period after a failure, before jitter.
    pub retry: Duration,
    /// How long without contact before the reset.
    pub contact_timeout: Duration,
    /// How many windows to list.
    pub windows: usize,
}

impl Default for ExportSettings {
    fn default() -> Self {
        ExportSettings {
            dir: PathBuf::from(DEFAULT_UPGRADE_DIR),
            endpoint: None,
            interval: EXPORT_INTERVAL,
            retry: RETRY_INTERVAL,
            contact_timeout: CONTACT_TIMEOUT,
            windows: EXPORTED_WINDOWS,
        }
    }
}

impl ExportSettings {
    /// The defaults, exporting to `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ExportSettings {
            dir: dir.into(),
            ..Self::default()
        }
    }

    /// Also write `endpoint` when the `endpoint` file is empty.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }
}

/// What the exporter has done so far (for health checks and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportStatus {
    /// Schedules written.
    pub exports: u64,
    /// Resets to an empty file after losing contact.
    pub resets: u64,
    /// Failures (of the source or of writing).
    pub failures: u64,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// The windows of the last export; empty before the first export, when the cluster has no
    /// maintenance configuration, and after a reset.
    pub windows: Vec<Window>,
}

impl ExportStatus {
    /// The first exported window that has not ended at `now` (the one open now, or the next).
    pub fn next_window(&self, now: SystemTime) -> Option<Window> {
        self.windows.iter().find(|w| w.end > now).copied()
    }
}

/// The running export task: dropping the handle stops it.
#[derive(Debug)]
pub struct ScheduleExporter {
    task: JoinHandle<()>,
    status: watch::Receiver<ExportStatus>,
}

impl Drop for ScheduleExporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScheduleExporter {
    /// Starts exporting to the Linux files of `settings.dir` at once, then about every
    /// `settings.interval`.
    pub fn spawn(
        source: Arc<dyn MaintenanceSource>,
        clock: Arc<dyn Clock>,
        settings: ExportSettings,
    ) -> Self {
        let sink = Arc::new(FileSink::new(settings.dir.clone(), settings.endpoint.clone()));
        Self::spawn_to(source, clock, sink, settings)
    }

    /// Starts exporting to `sink` at once, then about every `settings.interval` (`settings.dir`
    /// and `settings.endpoint` are the file sink's and are not used here).
    pub fn spawn_to(
        source: Arc<dyn MaintenanceSource>,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn ScheduleSink>,
        settings: ExportSettings,
    ) -> Self {
        let (tx, _) = watch::channel(ExportStatus::default());
        Self::spawn_reporting(source, clock, sink, settings, Arc::new(tx))
    }

    /// Starts exporting to `sink`, reporting into `status` (shared by the exporters an
    /// [`UpgradeDirWatcher`] starts one after another).
    fn spawn_reporting(
        source: Arc<dyn MaintenanceSource>,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn ScheduleSink>,
        settings: ExportSettings,
        status: Arc<watch::Sender<ExportStatus>>,
    ) -> Self {
        let receiver = status.subscribe();
        let task = tokio::spawn(export_loop(source, clock, sink, settings, status));
        ScheduleExporter {
            task,
            status: receiver,
        }
    }

    /// The status, updated after every attempt.
    pub fn status(&self) -> watch::Receiver<ExportStatus> {
        self.status.clone()
    }
}

async fn export_loop(
    source: Arc<dyn MaintenanceSource>,
    clock: Arc<dyn Clock>,
    sink: Arc<dyn ScheduleSink>,
    settings: ExportSettings,
    status: Arc<watch::Sender<ExportStatus>>,
) {
    // Since when the cluster has not answered; `None` while in contact.
    let mut lost_since: Option<Instant> = None;
    let mut reset_done = false;
    loop {
        let wait = match source.agent_upgrades().await {
            Ok(config) => {
                lost_since = None;
                reset_done = false;
                let windows = config
                    .map(|c| c.next_windows(clock.now(), settings.windows))
                    .unwrap_or_default();
                match sink.export(&windows).await {
                    Ok(()) => {
                        tracing::debug!(to = %sink.describe(), "exported the maintenance schedule");
                        status.send_modify(|s| {
                            s.exports += 1;
                            s.windows = windows.clone();
                        });
                        settings.interval
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, to = %sink.describe(), "cannot export the maintenance schedule");
                        status.send_modify(|s| {
                            s.failures += 1;
                            s.last_error = Some(e.to_string());
                        });
                        settings.retry
                    }
                }
            }
            Err(e) => {
                let since = *lost_since.get_or_insert_with(Instant::now);
                tracing::warn!(error = %e, "cannot read the cluster's maintenance configuration");
                let reset = !reset_done && since.elapsed() >= settings.contact_timeout;
                if reset {
                    match sink.reset().await {
                        Ok(()) => {
                            reset_done = true;
                            status.send_modify(|s| s.windows.clear());
                            tracing::warn!(
                                to = %sink.describe(),
                                "no contact with the cluster for {:?}: reset the exported maintenance schedule",
                                settings.contact_timeout
                            );
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot reset the maintenance schedule"),
                    }
                }
                status.send_modify(|s| {
                    s.failures += 1;
                    s.resets += u64::from(reset && reset_done);
                    s.last_error = Some(e.to_string());
                });
                settings.retry
            }
        };
        tokio::time::sleep(jittered(wait, JITTER, rand::random::<f64>())).await;
    }
}

/// Watches for the Linux updater's directory: exports to it (a [`ScheduleExporter`] on the
/// [`FileSink`]) while it exists, starting as soon as it appears — checked at once, then about
/// every `check_every` (jittered ±10 %), and whenever [`check_now`](Self::check_now) asks — and
/// stopping when it goes away (the updater was removed). Dropping the handle stops it.
#[derive(Debug)]
pub struct UpgradeDirWatcher {
    task: JoinHandle<()>,
    check: Arc<Notify>,
    status: watch::Receiver<ExportStatus>,
    exporting: watch::Receiver<bool>,
}

impl Drop for UpgradeDirWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl UpgradeDirWatcher {
    /// Watches `settings.dir`, exporting there with `settings` while it exists.
    pub fn spawn(
        source: Arc<dyn MaintenanceSource>,
        clock: Arc<dyn Clock>,
        settings: ExportSettings,
        check_every: Duration,
    ) -> Self {
        let (status_tx, status) = watch::channel(ExportStatus::default());
        let (exporting_tx, exporting) = watch::channel(false);
        let check = Arc::new(Notify::new());
        let task = tokio::spawn(watch_loop(
            source,
            clock,
            settings,
            check_every,
            check.clone(),
            Arc::new(status_tx),
            exporting_tx,
        ));
        UpgradeDirWatcher {
            task,
            check,
            status,
            exporting,
        }
    }

    /// Checks for the directory now instead of at the next interval.
    pub fn check_now(&self) {
        self.check.notify_one();
    }

    /// The exports' status (counting over every exporter this watcher started).
    pub fn status(&self) -> watch::Receiver<ExportStatus> {
        self.status.clone()
    }

    /// Whether the directory exists and is exported to.
    pub fn exporting(&self) -> watch::Receiver<bool> {
        self.exporting.clone()
    }
}

async fn watch_loop(
    source: Arc<dyn MaintenanceSource>,
    clock: Arc<dyn Clock>,
    settings: ExportSettings,
    check_every: Duration,
    check: Arc<Notify>,
    status: Arc<watch::Sender<ExportStatus>>,
    exporting: watch::Sender<bool>,
) {
    let dir = settings.dir.clone();
    let mut exporter: Option<ScheduleExporter> = None;
    loop {
        match (dir.is_dir(), exporter.is_some()) {
            (true, false) => {
                tracing::info!(dir = %dir.display(), "exporting the maintenance schedule for svc-upgrade");
                let sink = Arc::new(FileSink::new(dir.clone(), settings.endpoint.clone()));
                exporter = Some(ScheduleExporter::spawn_reporting(
                    source.clone(),
                    clock.clone(),
                    sink,
                    settings.clone(),
                    status.clone(),
                ));
                exporting.send_replace(true);
            }
            (false, true) => {
                tracing::info!(dir = %dir.display(), "the svc-upgrade directory is gone: no longer exporting the maintenance schedule");
                exporter = None;
                status.send_modify(|s| s.windows.clear());
                exporting.send_replace(false);
            }
            _ => {}
        }
        tokio::select! {
            () = tokio::time::sleep(jittered(check_every, JITTER, rand::random::<f64>())) => {}
            () = check.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use svc_core::{ManualClock, maintenance::parse_schedule_file};
    use time::macros::datetime;

    use super::*;

    #[test]
    fn the_schedule_lists_the_next_windows() {
        let now: SystemTime = datetime!(2026-11-20 09:30 UTC).into(); // a Friday
        let config = AgentUpgradeWindow::new(10, [time::Weekday::Friday, time::Weekday::Monday]).unwrap();
        let text = schedule_text(Some(&config), now, 3);
        let fri: SystemTime = datetime!(2026-11-20 10:00 UTC).into();
        let unix = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "# periodically exported by svc, modifications are not preserved"
        );
        assert_eq!(lines[1], format!("{} {}", unix(fri), unix(fri) + 3600));
        assert_eq!(lines.len(), 4);
        assert_eq!(parse_schedule_file(&text).unwrap().len(), 3);
        assert_eq!(
            schedule_text(None, now, 3),
            "# periodically exported by svc, modifications are not preserved\n"
        );
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let base = Duration::from_secs(2400);
        assert_eq!(jittered(base, 0.1, 0.0), Duration::from_secs(2160));
        assert_eq!(jittered(base, 0.1, 1.0), Duration::from_secs(2640));
        assert_eq!(jittered(base, 0.1, 0.5), base);
        assert_eq!(jittered(base, 0.1, 7.0), Duration::from_secs(2640));
    }

    #[test]
    fn files_modes_and_the_endpoint_rule() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("svc-upgrade.d");
        write_file(&dir, "schedule", "x\n").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&dir.join("schedule")), 0o644);
        assert!(write_endpoint_if_empty(&dir, "proxy.example.com:443/v1/x").unwrap());
        assert!(!write_endpoint_if_empty(&dir, "other:443/v1/y").unwrap());
        assert_eq!(
            std::fs::read_to_string(dir.join("endpoint")).unwrap(),
            "proxy.example.com:443/v1/x\n"
        );
        std::fs::write(dir.join("endpoint"), "\n").unwrap();
        assert!(write_endpoint_if_empty(&dir, "other:443/v1/y").unwrap());
    }

    /// Answers from a script of results; `Err` while `down` is set.
    struct Scripted {
        config: Option<AgentUpgradeWindow>,
        down: Mutex<bool>,
    }

    #[async_trait]
    impl MaintenanceSource for Scripted {
        async fn agent_upgrades(&self) -> Result<Option<AgentUpgradeWindow>, BoxError> {
            if *self.down.lock().unwrap() {
                Err("cluster unreachable".into())
            } else {
                Ok(self.config.clone())
            }
        }
    }

    async fn wait_for(
        status: &mut watch::Receiver<ExportStatus>,
        what: impl Fn(&ExportStatus) -> bool,
    ) -> ExportStatus {
        status.wait_for(|s| what(s)).await.unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn exports_periodically_and_resets_after_losing_contact() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("svc-upgrade.d");
        let source = Arc::new(Scripted {
            config: Some(AgentUpgradeWindow::new(3, []).unwrap()),
            down: Mutex::new(false),
        });
        let clock = Arc::new(ManualClock::new(datetime!(2026-11-20 09:30 UTC).into()));
        let exporter = ScheduleExporter::spawn(
            source.clone(),
            clock.clone(),
            ExportSettings::new(&dir)
                .with_endpoint("proxy.example.com:3080/v1/webapi/automaticupgrades/channel/default"),
        );
        let mut status = exporter.status();
        let started = Instant::now();
        wait_for(&mut status, |s| s.exports == 1).await;
        let schedule = dir.join("schedule");
        let first = std::fs::read_to_string(&schedule).unwrap();
        assert_eq!(parse_schedule_file(&first).unwrap().len(), 3);
        assert!(
            std::fs::read_to_string(dir.join("endpoint"))
                .unwrap()
                .starts_with("proxy.example.com:3080/")
        );

        // The next export comes 36 to 44 minutes later, with the clock's windows.
        clock.advance(Duration::from_secs(86_400));
        wait_for(&mut status, |s| s.exports == 2).await;
        let waited = started.elapsed();
        assert!(
            (Duration::from_secs(36 * 60)..=Duration::from_secs(44 * 60)).contains(&waited),
            "{waited:?}"
        );
        let second = std::fs::read_to_string(&schedule).unwrap();
        assert_ne!(first, second, "a day later the windows moved");

        // Contact lost: retries every minute or so, and after about 9 minutes the reset.
        *source.down.lock().unwrap() = true;
        let lost = Instant::now();
        let s = wait_for(&mut status, |s| s.failures >= 1).await;
        assert_eq!(s.resets, 0);
        assert_eq!(
            std::fs::read_to_string(&schedule).unwrap(),
            second,
            "kept while contact is young"
        );
        let s = wait_for(&mut status, |s| s.resets == 1).await;
        let after = lost.elapsed();
        assert!(
            after >= CONTACT_TIMEOUT && after <= CONTACT_TIMEOUT + Duration::from_secs(50 * 60),
            "{after:?}"
        );
        assert!(s.failures >= 9, "{s:?}");
        assert!(s.windows.is_empty(), "no next window reported after the reset");
        assert_eq!(
            std::fs::read_to_string(&schedule).unwrap(),
            "",
            "reset to an empty file"
        );
        assert!(schedule.exists());

        // Back in contact: exported again.
        *source.down.lock().unwrap() = false;
        wait_for(&mut status, |s| s.exports == 3).await;
        assert_eq!(
            parse_schedule_file(&std::fs::read_to_string(&schedule).unwrap())
                .unwrap()
                .len(),
            3
        );
        drop(exporter);
    }

    #[tokio::test(start_paused = true)]
    async fn exports_start_when_the_directory_appears_and_stop_when_it_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("svc-upgrade.d");
        let source = Arc::new(Scripted {
            config: Some(AgentUpgradeWindow::new(3, []).unwrap()),
            down: Mutex::new(false),
        });
        let clock = Arc::new(ManualClock::new(datetime!(2026-11-20 09:30 UTC).into()));
        let watcher = UpgradeDirWatcher::spawn(
            source,
            clock,
            ExportSettings::new(&dir)
                .with_endpoint("proxy.example.com:443/v1/webapi/automaticupgrades/channel/default"),
            DIR_CHECK_INTERVAL,
        );
        let mut exporting = watcher.exporting();
        let mut status = watcher.status();

        // Several checks without the directory: nothing exported, and the directory (the
        // package's) is not created.
        tokio::time::sleep(Duration::from_secs(5 * 60)).await;
        assert!(!*exporting.borrow());
        assert!(!dir.exists());
        assert_eq!(status.borrow().exports, 0);

        // The updater is installed: the next check (within about a minute) starts the exports.
        std::fs::create_dir(&dir).unwrap();
        let created = Instant::now();
        exporting.wait_for(|e| *e).await.unwrap();
        let waited = created.elapsed();
        assert!(waited <= Duration::from_secs(66), "{waited:?}");
        let s = wait_for(&mut status, |s| s.exports == 1).await;
        let schedule = std::fs::read_to_string(dir.join("schedule")).unwrap();
        assert_eq!(parse_schedule_file(&schedule).unwrap().len(), 3);
        let exported = parse_schedule_file(&schedule).unwrap();
        assert_eq!(s.windows, exported);
        let at: SystemTime = datetime!(2026-11-20 09:30 UTC).into();
        assert_eq!(s.next_window(at), Some(exported[0]));
        // Once the first has ended, the next one.
        assert_eq!(s.next_window(exported[0].end), Some(exported[1]));
        assert!(
            std::fs::read_to_string(dir.join("endpoint"))
                .unwrap()
                .starts_with("proxy.example.com:443/")
        );

        // The updater is removed: the exports stop and the directory stays gone.
        std::fs::remove_dir_all(&dir).unwrap();
        watcher.check_now();
        exporting.wait_for(|e| !*e).await.unwrap();
        assert!(status.borrow().windows.is_empty());
        tokio::time::sleep(EXPORT_INTERVAL * 2).await;
        assert!(!dir.exists(), "not recreated by the agent");

        // Installed again, and the agent told at once (after a heartbeat saw it).
        std::fs::create_dir(&dir).unwrap();
        let asked = Instant::now();
        watcher.check_now();
        exporting.wait_for(|e| *e).await.unwrap();
        assert_eq!(asked.elapsed(), Duration::ZERO);
        wait_for(&mut status, |s| s.exports == 2).await;
        assert!(dir.join("schedule").exists());
    }
}

//! What the agent and its updater tell each other besides the schedule: the updater's `status`
//! (read by the agent and reported in its heartbeats) and the agent's `agent` file (written by
//! the agent after every accepted heartbeat, the updater's proof of health).
//!
//! Both are JSON files in the Linux updater's directory (`/etc/svc-upgrade.d`, or
//! `SVC_UPGRADE_CONFIG`), 0644, written atomically; readers ignore fields they do not know.
//!
//! - `status`, written by `svc-upgrade` at the end of every run (and by the updater package when
//!   it is installed, with `"result":"none"` and `"reason":"enrolled"`):
//!   `{"upgrader":"unit","upgrader_version":"1.2.3","result":"rolled_back","from":"1.3.0",
//!   "to":"1.2.3","reason":"…","at":1764000000,"bad_versions":["1.3.0"]}`;
//! - `agent`: `{"version":"1.3.0","host_id":"…","pid":1234,"heartbeat_at":1764000000,
//!   "diag_addr":"127.0.0.1:3000"}` (`diag_addr` absent without `svc.diag_addr`).
//!
//! Where the status comes from is an [`UpdateStatusSource`]: the `status` file
//! ([`FileStatusSource`], the default) or, in Kubernetes, the agent's shared-state Secret
//! (key `agent-update-status`, the same JSON), given with
//! [`AgentNode::update_status_source`](super::AgentNode::update_status_source). A source that
//! cannot be read, or holds something that is not a status, is logged and ignored: the agent
//! then reports no updater decision, and keeps running.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
pub use svc_core::updater::{AGENT_FILE, AgentReport, STATUS_FILE, SharedFileError, UpdaterStatus};
use tower::BoxError;

/// Where the agent reads its updater's status.
#[async_trait]
pub trait UpdateStatusSource: Send + Sync + 'static {
    /// The updater's latest status: `Ok(None)` when there is none yet (no updater, or it has
    /// not run); `Err` when it cannot be read or is not a status (the agent logs it and reports
    /// no decision).
    async fn status(&self) -> Result<Option<UpdaterStatus>, BoxError>;
    /// Where the status comes from, for logs.
    fn describe(&self) -> String;
}

/// The Linux updater's `status` file in its directory (the default [`UpdateStatusSource`]).
#[derive(Debug, Clone)]
pub struct FileStatusSource {
    dir: PathBuf,
}

impl FileStatusSource {
    /// Reads `dir/status`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileStatusSource { dir: dir.into() }
    }

    /// The status file, read now: `None` when it is missing or empty.
    pub fn read(&self) -> Result<Option<UpdaterStatus>, SharedFileError> {
        UpdaterStatus::load(&self.dir.join(STATUS_FILE))
    }
}

#[async_trait]
impl UpdateStatusSource for FileStatusSource {
    async fn status(&self) -> Result<Option<UpdaterStatus>, BoxError> {
        Ok(self.read()?)
    }

    fn describe(&self) -> String {
        self.dir.join(STATUS_FILE).display().to_string()
    }
}

/// The agent's report for `version` (with or without `v`; written without), as the process
/// `pid` of host `host_id`, whose heartbeat the Auth Service accepted at `heartbeat_at` (Unix
/// seconds), serving `/readyz` at `diag_addr`.
pub(crate) fn agent_report(
    version: &str,
    host_id: &str,
    heartbeat_at: u64,
    diag_addr: Option<SocketAddr>,
) -> AgentReport {
    AgentReport {
        version: version.trim_start_matches('v').to_owned(),
        host_id: host_id.to_owned(),
        pid: Some(std::process::id()),
        heartbeat_at,
        diag_addr: diag_addr.map(|a| a.to_string()),
    }
}

/// Writes `report` to `dir/agent` (0644) when `dir` exists; returns whether it wrote. The
/// directory is the updater package's: it is never created here. An agent that may not create
/// files there (not root) rewrites the file it was given in place.
pub fn write_agent_file(dir: &Path, report: &AgentReport) -> Result<bool, BoxError> {
    if !dir.is_dir() {
        return Ok(false);
    }
    super::export::write_file(dir, AGENT_FILE, &format!("{}\n", report.to_json()))?;
    Ok(true)
}

/// Reads `dir/agent` (for tests and tools): `None` when the agent has not reported yet.
pub fn read_agent_file(dir: &Path) -> Result<Option<AgentReport>, SharedFileError> {
    AgentReport::load(&dir.join(AGENT_FILE))
}

/// What the heartbeat reports about the updater: the explicit choice (`SVC_UPGRADER`,
/// `SVC_UPGRADER_VERSION`, [`AgentNode::upgrader`](super::AgentNode::upgrader)) wins over the
/// status, each value on its own; empty values mean "not set".
pub(crate) fn reported_upgrader(
    overrides: &(String, String),
    status: Option<&UpdaterStatus>,
) -> (String, String) {
    let pick = |explicit: &str, read: Option<&str>| {
        if explicit.is_empty() {
            read.unwrap_or_default().to_owned()
        } else {
            explicit.to_owned()
        }
    };
    (
        pick(&overrides.0, status.map(|s| s.upgrader.as_str())),
        pick(&overrides.1, status.map(|s| s.upgrader_version.as_str())),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use svc_core::auth::{UpdateResult, UpdateStatus};

    use super::*;

    #[test]
    fn status_files_round_trip_and_ignore_unknown_fields() {
        let tmp = tempfile::tempdir().unwrap();
        let source = FileStatusSource::new(tmp.path());
        assert!(source.read().unwrap().is_none(), "no file: no status");
        let status = UpdaterStatus {
            upgrader: "unit".into(),
            upgrader_version: "1.2.3".into(),
            result: UpdateResult::RolledBack,
            from: "1.3.0".into(),
            to: "1.2.3".into(),
            reason: "no heartbeat with 1.3.0 within 120s".into(),
            at: 1_764_000_000,
            bad_versions: vec!["1.3.0".into()],
        };
        std::fs::write(
            tmp.path().join(STATUS_FILE),
            serde_json::to_string(&status).unwrap(),
        )
        .unwrap();
        assert_eq!(source.read().unwrap(), Some(status.clone()));
        assert_eq!(UpdateStatus::from(&status).result, UpdateResult::RolledBack);

        // The package's first status, with a field from a later version.
        std::fs::write(
            tmp.path().join(STATUS_FILE),
            r#"{"upgrader":"unit","upgrader_version":"1.2.3","result":"none","reason":"enrolled","at":5,"future":true}"#,
        )
        .unwrap();
        let first = source.read().unwrap().unwrap();
        assert_eq!(
            (first.result, first.reason.as_str(), first.from.as_str()),
            (UpdateResult::None, "enrolled", "")
        );
    }

    #[test]
    fn a_garbage_status_is_an_error_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let source = FileStatusSource::new(tmp.path());
        for garbage in ["not json", r#"{"result":"exploded"}"#, "{}", "[]"] {
            std::fs::write(tmp.path().join(STATUS_FILE), garbage).unwrap();
            let err = source.read().unwrap_err();
            assert!(
                err.to_string()
                    .contains(&tmp.path().join("status").display().to_string()),
                "{err}"
            );
        }
    }

    #[test]
    fn the_agent_file_is_written_only_into_an_existing_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("svc-upgrade.d");
        let agent = agent_report(
            "v1.3.0",
            "abc.example.com",
            1_764_000_000,
            Some("127.0.0.1:3000".parse().unwrap()),
        );
        assert_eq!(agent.version, "1.3.0", "written without the v");
        assert!(!write_agent_file(&dir, &agent).unwrap());
        assert!(
            !dir.exists(),
            "the updater's directory is never created by the agent"
        );
        std::fs::create_dir(&dir).unwrap();
        assert!(write_agent_file(&dir, &agent).unwrap());
        assert_eq!(read_agent_file(&dir).unwrap(), Some(agent.clone()));
        let mode = std::fs::metadata(dir.join(AGENT_FILE))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o644);
        let text = std::fs::read_to_string(dir.join(AGENT_FILE)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["diag_addr"], "127.0.0.1:3000");
        assert_eq!(v["heartbeat_at"], 1_764_000_000);

        let without = AgentReport {
            diag_addr: None,
            ..agent
        };
        write_agent_file(&dir, &without).unwrap();
        let text = std::fs::read_to_string(dir.join(AGENT_FILE)).unwrap();
        assert!(!text.contains("diag_addr"), "{text}");
        assert_eq!(read_agent_file(&dir).unwrap(), Some(without));
    }

    #[test]
    fn explicit_upgrader_settings_override_the_status() {
        let status = UpdaterStatus {
            upgrader: "unit".into(),
            upgrader_version: "1.2.3".into(),
            result: UpdateResult::None,
            from: String::new(),
            to: String::new(),
            reason: String::new(),
            at: 0,
            bad_versions: Vec::new(),
        };
        let none = (String::new(), String::new());
        assert_eq!(
            reported_upgrader(&none, Some(&status)),
            ("unit".into(), "1.2.3".into())
        );
        assert_eq!(reported_upgrader(&none, None), (String::new(), String::new()));
        let kube = ("kube".to_owned(), String::new());
        assert_eq!(
            reported_upgrader(&kube, Some(&status)),
            ("kube".into(), "1.2.3".into())
        );
        let both = ("kube".to_owned(), "2.0.0".to_owned());
        assert_eq!(reported_upgrader(&both, None), both);
    }
}

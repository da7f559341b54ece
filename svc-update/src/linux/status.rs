//! The files `svc-upgrade` shares with the agent in the configuration directory: `status`, the
//! updater's last result, which it writes at the end of every `run` and `force`; and `agent`,
//! the agent's last heartbeat the Auth Service accepted, which the agent writes and the updater
//! reads as its proof of health ([`super::health`]).
//!
//! Both are JSON, written atomically (temporary file, rename) with mode 0644; readers ignore
//! fields they do not know. Versions are written without the leading `v`, times as Unix seconds:
//!
//! ```json
//! {"upgrader":"unit","upgrader_version":"17.0.1","result":"rolled_back",
//!  "from":"17.0.2","to":"17.0.1","reason":"no heartbeat with 17.0.2 within 120s",
//!  "at":1764000000,"bad_versions":["17.0.2"]}
//! ```

use std::{
    fmt, io,
    path::{Path, PathBuf},
    time::SystemTime,
};

use serde::{Deserialize, Serialize};
use svc_core::Version;

/// The `upgrader` the Linux updater writes into `status`.
pub const UPGRADER_UNIT: &str = "unit";

/// What the last run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UpdateResult {
    /// Nothing was installed (the reason says why: the decision, or the error that stopped the
    /// run before installing).
    None,
    /// The target was installed and the agent proved healthy with it (or, with `restart-mode`
    /// `none` or without systemd, installed and not restarted; the reason says so).
    Updated,
    /// The target was installed, the agent did not prove healthy in time, and the previous
    /// version was installed again.
    RolledBack,
    /// Installing, or rolling back, failed.
    Failed,
}

impl UpdateResult {
    /// The value as written in `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateResult::None => "none",
            UpdateResult::Updated => "updated",
            UpdateResult::RolledBack => "rolled_back",
            UpdateResult::Failed => "failed",
        }
    }
}

impl fmt::Display for UpdateResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `status` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateStatus {
    /// Always [`UPGRADER_UNIT`] for this updater.
    pub upgrader: String,
    /// The updater's own version, without `v`.
    pub upgrader_version: String,
    /// What the run did.
    pub result: UpdateResult,
    /// `none`: the installed version; `updated`: the version replaced; `rolled_back`: the
    /// version that was not healthy; `failed`: the version installed before the run. Empty when
    /// unknown.
    pub from: String,
    /// `none`: the advertised version; `updated`: the version installed; `rolled_back`: the
    /// version restored; `failed`: the version the run tried to install. Empty when unknown.
    pub to: String,
    /// Why: the decision message, the health check's finding, the error. Empty when there is
    /// nothing to add.
    #[serde(default)]
    pub reason: String,
    /// When the run ended, in Unix seconds.
    pub at: u64,
    /// Versions the updater will not install again until an operator runs `svc-upgrade force`
    /// or a newer version is published, without `v`.
    #[serde(default)]
    pub bad_versions: Vec<String>,
}

impl UpdateStatus {
    /// A status of this updater build, at `now`.
    pub fn new(
        result: UpdateResult,
        from: Option<&Version>,
        to: Option<&Version>,
        reason: impl Into<String>,
        now: SystemTime,
        bad_versions: &[Version],
    ) -> Self {
        UpdateStatus {
            upgrader: UPGRADER_UNIT.to_owned(),
            upgrader_version: svc_core::version::current().without_v(),
            result,
            from: from.map(Version::without_v).unwrap_or_default(),
            to: to.map(Version::without_v).unwrap_or_default(),
            reason: reason.into(),
            at: unix(now),
            bad_versions: bad_versions.iter().map(Version::without_v).collect(),
        }
    }

    /// Reads `path`; `None` when it is missing or empty.
    pub fn load(path: &Path) -> Result<Option<Self>, FileError> {
        read_json(path)
    }

    /// Writes the status to `path` atomically with mode 0644.
    pub fn save(&self, path: &Path) -> Result<(), FileError> {
        let text = serde_json::to_string(self).map_err(|e| FileError::Invalid {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        write_atomically(path, text.as_bytes())
    }
}

/// The `agent` file: the agent's last heartbeat the Auth Service accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReport {
    /// The version the agent runs (with or without `v`).
    pub version: String,
    /// The agent's host ID.
    #[serde(default)]
    pub host_id: Option<String>,
    /// The agent's process ID.
    #[serde(default)]
    pub pid: Option<u32>,
    /// When the heartbeat was accepted, in Unix seconds.
    pub heartbeat_at: u64,
    /// The agent's diagnostics address (`svc.diag_addr`), serving `/readyz`; absent when not set.
    #[serde(default)]
    pub diag_addr: Option<String>,
}

impl AgentReport {
    /// Reads `path`; `None` when it is missing or empty (an agent that has not reported yet).
    pub fn load(path: &Path) -> Result<Option<Self>, FileError> {
        read_json(path)
    }

    /// The reported version, when it is one.
    pub fn parsed_version(&self) -> Option<Version> {
        Version::parse(self.version.trim()).ok()
    }
}

/// Why a shared file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// Reading, writing or renaming failed.
    #[error("{path}: {source}")]
    Io {
        /// The file (or its temporary sibling).
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The content is not the JSON expected.
    #[error("{path}: expected JSON as svc writes it ({reason})")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What the parser objected to.
        reason: String,
    },
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, FileError> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| FileError::Invalid {
                path: path.to_owned(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FileError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes `bytes` and a newline to `path` through a temporary sibling and a rename, mode 0644.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |source| FileError::Io { path, source }
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    // The mode above is filtered by the umask; the file must be readable by the agent's user.
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .map_err(io_err(&tmp))?;
    file.write_all(bytes).map_err(io_err(&tmp))?;
    file.write_all(b"\n").map_err(io_err(&tmp))?;
    file.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

pub(crate) fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::PermissionsExt, time::Duration};

    use super::*;

    #[test]
    fn status_is_the_contracts_json() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("status");
        assert_eq!(UpdateStatus::load(&path).expect("absent"), None);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        let bad = [Version::new(17, 0, 2)];
        let status = UpdateStatus::new(
            UpdateResult::RolledBack,
            Some(&Version::new(17, 0, 2)),
            Some(&Version::new(17, 0, 1)),
            "no heartbeat with 17.0.2 within 120s",
            now,
            &bad,
        );
        status.save(&path).expect("save");
        let text = std::fs::read_to_string(&path).expect("read");
        let json: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(json["upgrader"], "unit");
        assert_eq!(json["result"], "rolled_back");
        assert_eq!(json["from"], "17.0.2");
        assert_eq!(json["to"], "17.0.1");
        assert_eq!(json["at"], 1_764_000_000);
        assert_eq!(json["bad_versions"], serde_json::json!(["17.0.2"]));
        assert!(
            !json["upgrader_version"]
                .as_str()
                .expect("string")
                .starts_with('v')
        );
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert_eq!(UpdateStatus::load(&path).expect("load"), Some(status));
        // The package's initial status, and fields a later version may add.
        std::fs::write(
            &path,
            r#"{"upgrader":"unit","upgrader_version":"17.0.0","result":"none","from":"","to":"","reason":"enrolled","at":1,"bad_versions":[],"new":1}"#,
        )
        .expect("write");
        let back = UpdateStatus::load(&path).expect("load").expect("present");
        assert_eq!(
            (back.result, back.reason.as_str()),
            (UpdateResult::None, "enrolled")
        );
    }

    #[test]
    fn agent_report_reads_the_agents_json() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("agent");
        std::fs::write(
            &path,
            r#"{"version":"17.0.2","host_id":"h","pid":12,"heartbeat_at":1764000000,"diag_addr":null,"extra":true}"#,
        )
        .expect("write");
        let report = AgentReport::load(&path).expect("load").expect("present");
        assert_eq!(report.parsed_version(), Some(Version::new(17, 0, 2)));
        assert_eq!(report.diag_addr, None);
        std::fs::write(&path, "").expect("write");
        assert_eq!(AgentReport::load(&path).expect("empty"), None);
        std::fs::write(&path, "{").expect("write");
        let err = AgentReport::load(&path).expect_err("garbage").to_string();
        assert!(
            err.starts_with(&format!("{}: expected JSON", path.display())),
            "{err}"
        );
    }
}

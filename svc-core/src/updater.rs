//! What an agent and its updater tell each other besides the maintenance schedule: one home for
//! the formats the agent, `svc-upgrade` and the Kubernetes updater share.
//!
//! - The updater's **status** ([`UpdaterStatus`]): its last decision, written by `svc-upgrade`
//!   to [`STATUS_FILE`] in its configuration directory after every run (and by the updater
//!   package when it is installed, with result `none` and reason `enrolled`), or by the
//!   Kubernetes updater to the agent's shared-state Secret. The agent reads it and reports it in
//!   its heartbeats, so `tctl inventory ls` shows it.
//! - The agent's **report** ([`AgentReport`]): written by the agent to [`AGENT_FILE`] after
//!   every heartbeat the Auth Service accepted; the Linux updater's proof that a new version
//!   came up healthy.
//!
//! Both are JSON objects; readers ignore fields they do not know and default the ones that are
//! missing, so either side may be newer. Versions are written without a leading `v`, times as
//! Unix seconds:
//!
//! ```json
//! {"upgrader":"unit","upgrader_version":"17.0.1","result":"rolled_back",
//!  "from":"17.0.2","to":"17.0.1","reason":"no heartbeat with 17.0.2 within 120s",
//!  "at":1764000000,"bad_versions":["17.0.2"]}
//! ```
//!
//! ```json
//! {"version":"17.0.1","host_id":"…","pid":1234,"heartbeat_at":1764000000,"diag_addr":"127.0.0.1:3000"}
//! ```
//!
//! Writing is left to each side (the updater replaces its file atomically as root; an agent
//! running as another user may only rewrite the one file it owns).

use std::{
    fmt, io,
    path::{Path, PathBuf},
    str::FromStr,
};

use serde::{Deserialize, Serialize};

use crate::Version;

/// The updater's status file, in its configuration directory.
pub const STATUS_FILE: &str = "status";
/// The agent's report file, in the updater's configuration directory.
pub const AGENT_FILE: &str = "agent";
/// The `upgrader` of the Linux updater (`svc-upgrade`, run by a systemd timer).
pub const UPGRADER_UNIT: &str = "unit";
/// The `upgrader` of the Kubernetes updater controller.
pub const UPGRADER_KUBE: &str = "kube";

/// What the updater's last run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateResult {
    /// Nothing was installed (already current, outside the window, suspended, refused, just
    /// enrolled; the reason says which).
    #[default]
    None,
    /// A new version was installed and proven healthy.
    Updated,
    /// A new version was installed, was not healthy in time, and the previous one was installed
    /// again.
    RolledBack,
    /// The updater could not install, or could not roll back.
    Failed,
}

impl UpdateResult {
    /// Every result, in declaration order.
    pub const ALL: [UpdateResult; 4] = [
        UpdateResult::None,
        UpdateResult::Updated,
        UpdateResult::RolledBack,
        UpdateResult::Failed,
    ];

    /// The name in the status and on the wire: `none`, `updated`, `rolled_back`, `failed`.
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

/// A `result` that is not one of [`UpdateResult::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown update result {0:?}, expected none, updated, rolled_back or failed")]
pub struct UnknownUpdateResult(pub String);

impl FromStr for UpdateResult {
    type Err = UnknownUpdateResult;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UpdateResult::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownUpdateResult(s.to_owned()))
    }
}

/// The updater's status: its last decision and the versions it will not install again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdaterStatus {
    /// [`UPGRADER_UNIT`] or [`UPGRADER_KUBE`].
    #[serde(default)]
    pub upgrader: String,
    /// The updater's own version, without `v`.
    #[serde(default)]
    pub upgrader_version: String,
    /// What the run did (required: a status without it is not one).
    pub result: UpdateResult,
    /// `none`: the installed version; `updated`: the version replaced; `rolled_back`: the
    /// version that was not healthy; `failed`: the version before the run. Empty when unknown.
    #[serde(default)]
    pub from: String,
    /// `none`: the advertised version; `updated`: the version installed; `rolled_back`: the
    /// version restored; `failed`: the version the run tried to install. Empty when unknown.
    #[serde(default)]
    pub to: String,
    /// Why: the decision, the health check's finding, the error. May be empty.
    #[serde(default)]
    pub reason: String,
    /// When the run ended, in Unix seconds.
    #[serde(default)]
    pub at: u64,
    /// Versions the updater will not install again until an operator clears them or a newer
    /// version is published, without `v`.
    #[serde(default)]
    pub bad_versions: Vec<String>,
}

impl UpdaterStatus {
    /// Parses a status; `from` names where it came from (a file, a Secret's key) in the error.
    pub fn parse(text: &str, from: &str) -> Result<Self, SharedFileError> {
        serde_json::from_str(text).map_err(|e| SharedFileError::Invalid {
            path: PathBuf::from(from),
            reason: e.to_string(),
        })
    }

    /// Reads the status at `path`: `None` when the file is missing or empty.
    pub fn load(path: &Path) -> Result<Option<Self>, SharedFileError> {
        read_json(path)
    }

    /// The status as one line of JSON (without the newline).
    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The agent's report: which version runs, and when the Auth Service last accepted its
/// heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReport {
    /// The running agent's version, without `v` (readers accept it with one).
    pub version: String,
    /// The agent's host ID.
    #[serde(default)]
    pub host_id: String,
    /// The agent's process ID.
    #[serde(default)]
    pub pid: Option<u32>,
    /// When the Auth Service accepted the last heartbeat, in Unix seconds.
    pub heartbeat_at: u64,
    /// Where the agent serves `/readyz` (`svc.diag_addr`); absent when it serves none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diag_addr: Option<String>,
}

impl AgentReport {
    /// Reads the report at `path`: `None` when the file is missing or empty (an agent that has
    /// not reported yet).
    pub fn load(path: &Path) -> Result<Option<Self>, SharedFileError> {
        read_json(path)
    }

    /// The reported version, when it is one.
    pub fn parsed_version(&self) -> Option<Version> {
        Version::parse(self.version.trim()).ok()
    }

    /// The report as one line of JSON (without the newline).
    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Why a shared file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedFileError {
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
        /// The file (or the Secret's key).
        path: PathBuf,
        /// What the parser objected to.
        reason: String,
    },
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, SharedFileError> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| SharedFileError::Invalid {
                path: path.to_owned(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SharedFileError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_round_trip_by_name() {
        for r in UpdateResult::ALL {
            assert_eq!(r.as_str().parse::<UpdateResult>(), Ok(r));
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{}\"", r.as_str()));
        }
        let err = "exploded".parse::<UpdateResult>().unwrap_err();
        assert!(err.to_string().contains("\"exploded\""), "{err}");
    }

    #[test]
    fn status_is_the_shared_json_and_tolerant_when_read() {
        let status = UpdaterStatus {
            upgrader: UPGRADER_KUBE.into(),
            upgrader_version: "17.0.0".into(),
            result: UpdateResult::RolledBack,
            from: "17.1.0".into(),
            to: "17.0.0".into(),
            reason: "pods not ready".into(),
            at: 1_764_000_000,
            bad_versions: vec!["17.1.0".into()],
        };
        let json: serde_json::Value = serde_json::from_str(&status.to_json()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"upgrader": "kube", "upgrader_version": "17.0.0", "result": "rolled_back",
                "from": "17.1.0", "to": "17.0.0", "reason": "pods not ready", "at": 1_764_000_000u64,
                "bad_versions": ["17.1.0"]})
        );
        // The package's first status, and a field from a later version.
        let read = UpdaterStatus::parse(
            r#"{"upgrader":"unit","upgrader_version":"1.2.3","result":"none","reason":"enrolled","at":5,"future":true}"#,
            "status",
        )
        .unwrap();
        assert_eq!(
            (read.result, read.reason.as_str(), read.from.as_str()),
            (UpdateResult::None, "enrolled", "")
        );
        let err = UpdaterStatus::parse(r#"{"result":"exploded"}"#, "/x/status").unwrap_err();
        assert!(err.to_string().starts_with("/x/status: expected JSON"), "{err}");
    }

    #[test]
    fn reports_load_missing_empty_and_garbage() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(AGENT_FILE);
        assert_eq!(AgentReport::load(&path).unwrap(), None);
        std::fs::write(&path, "").unwrap();
        assert_eq!(AgentReport::load(&path).unwrap(), None);
        std::fs::write(
            &path,
            r#"{"version":"v17.0.2","heartbeat_at":1764000000,"extra":true}"#,
        )
        .unwrap();
        let report = AgentReport::load(&path).unwrap().unwrap();
        assert_eq!(report.parsed_version(), Some(Version::new(17, 0, 2)));
        assert_eq!((report.pid, report.diag_addr), (None, None));
        std::fs::write(&path, "{").unwrap();
        let err = AgentReport::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}: expected JSON", path.display())),
            "{err}"
        );
    }
}

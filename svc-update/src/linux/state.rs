//! What `svc-upgrade` remembers between runs: `/var/lib/svc-upgrade/state.json`.
//!
//! Read at the start of a run, before the [decision](super::decision); written just before an
//! install starts (`in_progress`) and when it ends (`last_install`). Two facts come from it:
//! - an install already done in the current maintenance window (or, outside windows, a critical
//!   install within the last hour) means no second one: during a rolling upgrade the proxies
//!   behind one address answer different versions (specification §2.6 rule 3, "agents flip
//!   between versions"), and without this every other run would reinstall;
//! - an `in_progress` entry left behind means the previous run was killed mid-install: the next
//!   run repairs the package database and holds before it does anything else;
//! - `bad_versions`: versions that were installed, did not prove healthy and were rolled back;
//!   `run` does not install them again (`force` clears the list).
//!
//! The file is written atomically (temporary file, fsync, rename), so a kill leaves the old or
//! the new state, never half of one. `SVC_UPGRADE_STATE` names another file.

use std::{
    io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};
use svc_core::{Version, maintenance::Window};

/// The default state file.
pub const DEFAULT_STATE_FILE: &str = "/var/lib/svc-upgrade/state.json";

/// The environment variable that overrides [`DEFAULT_STATE_FILE`].
pub(crate) const STATE_ENV: &str = "SVC_UPGRADE_STATE";

/// Why the state file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// Reading, writing or renaming failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The file (or its temporary sibling).
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The file is not the JSON this version writes.
    #[error("state file {path}: expected the JSON svc-upgrade writes ({reason}); delete it to start afresh")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the parser objected to.
        reason: String,
    },
}

/// An install, finished or started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallRecord {
    /// The version installed (or being installed).
    pub version: Version,
    /// When, in Unix seconds.
    pub at: u64,
    /// The maintenance window it happened in, `[start, end]` in Unix seconds; `None` for a
    /// critical or forced install outside any window.
    pub window: Option<(u64, u64)>,
}

impl InstallRecord {
    /// A record of `version` at `now`, in `window`.
    pub fn new(version: Version, now: SystemTime, window: Option<Window>) -> Self {
        InstallRecord {
            version,
            at: unix(now),
            window: window.map(|w| (unix(w.start), unix(w.end))),
        }
    }

    /// Whether this install happened in `window`.
    pub fn in_window(&self, window: &Window) -> bool {
        self.window == Some((unix(window.start), unix(window.end)))
    }

    /// How long ago it happened; zero when the clock went backwards.
    pub fn age(&self, now: SystemTime) -> Duration {
        Duration::from_secs(unix(now).saturating_sub(self.at))
    }
}

/// The updater's memory between runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpgradeState {
    /// The last install that finished.
    #[serde(default)]
    pub last_install: Option<InstallRecord>,
    /// An install that started and has not finished: the run doing it was killed.
    #[serde(default)]
    pub in_progress: Option<InstallRecord>,
    /// Versions installed, found unhealthy and rolled back: not installed again by `run` until
    /// `svc-upgrade force` clears the list. A newer version is installed as usual.
    #[serde(default)]
    pub bad_versions: Vec<Version>,
}

impl UpgradeState {
    /// The state file: `SVC_UPGRADE_STATE` when set and not empty, else [`DEFAULT_STATE_FILE`].
    pub fn path_from_env(env: impl Fn(&str) -> Option<String>) -> PathBuf {
        match env(STATE_ENV) {
            Some(path) if !path.trim().is_empty() => PathBuf::from(path.trim()),
            _ => PathBuf::from(DEFAULT_STATE_FILE),
        }
    }

    /// Reads `path`; a missing or empty file is the empty state.
    pub fn load(path: &Path) -> Result<Self, StateError> {
        match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => Ok(Self::default()),
            Ok(text) => serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
                path: path.to_owned(),
                reason: e.to_string(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(StateError::Io {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Writes the state to `path` atomically, creating its directory (0755) when missing.
    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        use std::io::Write;
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| StateError::Io { path, source }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = PathBuf::from(tmp_name);
        let text = serde_json::to_string_pretty(self).map_err(|e| StateError::Corrupt {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let mut file = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
        file.write_all(text.as_bytes()).map_err(io_err(&tmp))?;
        file.write_all(b"\n").map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_tolerates_absence() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sub/state.json");
        assert_eq!(UpgradeState::load(&path).unwrap(), UpgradeState::default());
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let window = Window {
            start: now - Duration::from_secs(60),
            end: now + Duration::from_secs(3540),
        };
        let state = UpgradeState {
            last_install: Some(InstallRecord::new(Version::new(17, 0, 1), now, Some(window))),
            in_progress: Some(InstallRecord::new(Version::new(17, 0, 2), now, None)),
            bad_versions: vec![Version::new(17, 0, 3)],
        };
        state.save(&path).unwrap();
        let back = UpgradeState::load(&path).unwrap();
        assert_eq!(back, state);
        assert!(back.last_install.as_ref().unwrap().in_window(&window));
        assert!(!back.in_progress.as_ref().unwrap().in_window(&window));
        assert_eq!(
            back.last_install.unwrap().age(now + Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"version\": \"v17.0.1\""), "{text}");
        // A state file written before bad versions were recorded still reads.
        std::fs::write(&path, "{\"last_install\": null, \"in_progress\": null}").unwrap();
        assert_eq!(UpgradeState::load(&path).unwrap(), UpgradeState::default());
    }

    #[test]
    fn garbage_is_an_error_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        std::fs::write(&path, "{\"last\":1}").unwrap();
        let err = UpgradeState::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("state file {}: expected", path.display())),
            "{err}"
        );
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(UpgradeState::load(&path).unwrap(), UpgradeState::default());
    }

    #[test]
    fn environment_overrides_the_path() {
        assert_eq!(
            UpgradeState::path_from_env(|_| None),
            PathBuf::from(DEFAULT_STATE_FILE)
        );
        assert_eq!(
            UpgradeState::path_from_env(|k| (k == STATE_ENV).then(|| "/tmp/s.json".to_owned())),
            PathBuf::from("/tmp/s.json")
        );
    }
}

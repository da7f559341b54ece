//! Writing the updater's `status` (the format is [`svc_core::updater`]'s, shared with the agent
//! and the Kubernetes updater): at the end of every `run` and `force`, atomically (temporary file,
//! fsync, rename) with mode 0644, so the agent, which may run as another user, can read it.

use std::{
    path::{Path, PathBuf},
    time::SystemTime,
};

use svc_core::{
    Version,
    updater::{SharedFileError, UPGRADER_UNIT, UpdateResult, UpdaterStatus},
};

/// A status of this updater build (`upgrader` [`UPGRADER_UNIT`], its own version), at `now`.
pub fn new_status(
    result: UpdateResult,
    from: Option<&Version>,
    to: Option<&Version>,
    reason: impl Into<String>,
    now: SystemTime,
    bad_versions: &[Version],
) -> UpdaterStatus {
    UpdaterStatus {
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

/// Writes `status` to `path` atomically with mode 0644.
pub fn save_status(status: &UpdaterStatus, path: &Path) -> Result<(), SharedFileError> {
    write_atomically(path, status.to_json().as_bytes())
}

/// Writes `bytes` and a newline to `path` through a temporary sibling and a rename, mode 0644.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), SharedFileError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |source| SharedFileError::Io { path, source }
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
        assert_eq!(UpdaterStatus::load(&path).expect("absent"), None);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        let bad = [Version::new(17, 0, 2)];
        let status = new_status(
            UpdateResult::RolledBack,
            Some(&Version::new(17, 0, 2)),
            Some(&Version::new(17, 0, 1)),
            "no heartbeat with 17.0.2 within 120s",
            now,
            &bad,
        );
        save_status(&status, &path).expect("save");
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
        assert_eq!(UpdaterStatus::load(&path).expect("load"), Some(status));
        // The package's initial status, and fields a later version may add.
        std::fs::write(
            &path,
            r#"{"upgrader":"unit","upgrader_version":"17.0.0","result":"none","from":"","to":"","reason":"enrolled","at":1,"bad_versions":[],"new":1}"#,
        )
        .expect("write");
        let back = UpdaterStatus::load(&path).expect("load").expect("present");
        assert_eq!(
            (back.result, back.reason.as_str()),
            (UpdateResult::None, "enrolled")
        );
    }
}

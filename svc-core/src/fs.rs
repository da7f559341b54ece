//! Private files and directories: what holds CA private keys, password hashes, host and user
//! keys is readable by its owner only.
//!
//! Every place that writes such a file calls this module, so the rule has one home:
//!
//! - [`ensure_private_dir`]: a directory created `0700`, an existing one tightened to `0700`;
//! - [`write_private_file`]: the file written `0600` through a fresh temporary file and a rename,
//!   so an existing file with looser permissions is replaced by a private one (a mode given to
//!   `open` applies only when the file is created, which is why a plain rewrite is not enough);
//! - [`repair_private_file`]: an existing file tightened to `0600`;
//! - [`secure_data_dir`]: the data directory `0700` and every file in it `0600`, each repair of
//!   an existing install logged (a warning naming the file and both modes).
//!
//! On platforms without Unix permissions the functions create and write, and repair nothing.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The mode of private directories.
pub(crate) const PRIVATE_DIR_MODE: u32 = 0o700;
/// The mode of private files.
pub(crate) const PRIVATE_FILE_MODE: u32 = 0o600;

/// Why a private file or directory could not be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrivateFsError {
    /// A file system call failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (`creating the directory`, `writing`, …).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A directory was expected and something else is there.
    #[error("{}: expected a directory, found {found}", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
        /// What was found (`a file`, `a symbolic link`, `something else`).
        found: &'static str,
    },
}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PrivateFsError + 'a {
    move |source| PrivateFsError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// A permission tightened on something that existed before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repaired {
    /// The file or directory.
    pub path: PathBuf,
    /// Its permission bits before (for example `0o644`).
    pub from: u32,
    /// Its permission bits now (`0o600` or `0o700`).
    pub to: u32,
}

impl std::fmt::Display for Repaired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: mode {:04o} -> {:04o}",
            self.path.display(),
            self.from,
            self.to
        )
    }
}

#[cfg(unix)]
fn mode_of(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o7777
}

/// Sets `path` to exactly `mode` when it grants anything to group or others (or is not
/// `mode`'s owner bits); returns what changed.
#[cfg(unix)]
fn tighten(path: &Path, meta: &std::fs::Metadata, mode: u32) -> Result<Option<Repaired>, PrivateFsError> {
    use std::os::unix::fs::PermissionsExt;
    let from = mode_of(meta);
    if from == mode {
        return Ok(None);
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_error("setting the permissions of", path))?;
    Ok(Some(Repaired {
        path: path.to_owned(),
        from,
        to: mode,
    }))
}

/// Creates `path` (and missing parents) with mode `0700`, or tightens an existing directory to
/// `0700`. Returns the repair made to an existing directory, if any.
pub fn ensure_private_dir(path: &Path) -> Result<Option<Repaired>, PrivateFsError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(PRIVATE_DIR_MODE);
    }
    builder
        .create(path)
        .map_err(io_error("creating the directory", path))?;
    let meta = std::fs::metadata(path).map_err(io_error("reading the metadata of", path))?;
    if !meta.is_dir() {
        return Err(PrivateFsError::NotADirectory {
            path: path.to_owned(),
            found: if meta.is_file() {
                "a file"
            } else {
                "something else"
            },
        });
    }
    #[cfg(unix)]
    {
        tighten(path, &meta, PRIVATE_DIR_MODE)
    }
    #[cfg(not(unix))]
    {
        Ok(None)
    }
}

/// Writes `bytes` to `path` with mode `0600`: a new temporary file next to it (mode `0600` from
/// creation, so the content is never readable by others), synced, then renamed over `path`.
/// An existing `path` is replaced whatever its mode was. A missing parent directory is created
/// `0700`; an existing parent is left as it is.
pub fn write_private_file(path: &Path, bytes: &[u8]) -> Result<(), PrivateFsError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    if !dir.exists() {
        ensure_private_dir(&dir)?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    // A temporary file left by a crash may have any mode: start from a new one.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("removing", &tmp)(e)),
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(PRIVATE_FILE_MODE);
    }
    let mut file = opts.open(&tmp).map_err(io_error("creating", &tmp))?;
    file.write_all(bytes).map_err(io_error("writing", &tmp))?;
    file.sync_all().map_err(io_error("syncing", &tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io_error("replacing", path))
}

/// Tightens an existing regular file to `0600`. A missing file, a directory or a symbolic link
/// is left alone (`Ok(None)`). Returns the repair made, if any.
pub fn repair_private_file(path: &Path) -> Result<Option<Repaired>, PrivateFsError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("reading the metadata of", path)(e)),
    };
    if !meta.is_file() {
        return Ok(None);
    }
    #[cfg(unix)]
    {
        tighten(path, &meta, PRIVATE_FILE_MODE)
    }
    #[cfg(not(unix))]
    {
        Ok(None)
    }
}

/// Logs one repair of an existing install.
pub fn log_repair(repair: &Repaired) {
    tracing::warn!(
        path = %repair.path.display(),
        from = %format!("{:04o}", repair.from),
        to = %format!("{:04o}", repair.to),
        "repaired the permissions of an existing install: only the owner may read it now"
    );
}

/// Prepares a service's data directory: created `0700` (or tightened to it), and every regular
/// file directly inside tightened to `0600` (the database, identity files, TLS keys). Each
/// repair is logged with [`log_repair`] and returned.
pub fn secure_data_dir(dir: &Path) -> Result<Vec<Repaired>, PrivateFsError> {
    let mut repaired: Vec<Repaired> = ensure_private_dir(dir)?.into_iter().collect();
    let entries = std::fs::read_dir(dir).map_err(io_error("listing", dir))?;
    for entry in entries {
        let entry = entry.map_err(io_error("listing", dir))?;
        if let Some(r) = repair_private_file(&entry.path())? {
            repaired.push(r);
        }
    }
    repaired.sort_by(|a, b| a.path.cmp(&b.path));
    for r in &repaired {
        log_repair(r);
    }
    Ok(repaired)
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn set_mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_new_directory_and_its_parents_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        assert_eq!(ensure_private_dir(&dir).unwrap(), None);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
    }

    #[test]
    fn an_existing_open_directory_is_tightened_and_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        set_mode(&dir, 0o755);
        let r = ensure_private_dir(&dir).unwrap().unwrap();
        assert_eq!((r.from, r.to), (0o755, 0o700));
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(r.to_string(), format!("{}: mode 0755 -> 0700", dir.display()));
        // Once private, nothing more to do.
        assert_eq!(ensure_private_dir(&dir).unwrap(), None);
    }

    #[test]
    fn a_file_where_a_directory_should_be_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("data");
        std::fs::write(&file, b"x").unwrap();
        let e = ensure_private_dir(&file).unwrap_err();
        assert!(
            e.to_string().contains("expected a directory, found a file")
                || e.to_string().starts_with("creating the directory"),
            "{e}"
        );
    }

    #[test]
    fn writing_replaces_an_open_file_with_a_private_one() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("key");
        std::fs::write(&file, b"old").unwrap();
        set_mode(&file, 0o644);
        // A leftover temporary file from a crash, world-readable.
        let leftover = tmp.path().join(".key.tmp");
        std::fs::write(&leftover, b"stale").unwrap();
        set_mode(&leftover, 0o666);
        write_private_file(&file, b"new").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        assert_eq!(mode(&file), 0o600);
        assert!(!leftover.exists());
    }

    #[test]
    fn writing_creates_a_missing_parent_privately() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("home/keys/key");
        write_private_file(&file, b"k").unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&tmp.path().join("home/keys")), 0o700);
    }

    #[test]
    fn the_data_directory_and_its_files_are_repaired() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        set_mode(&dir, 0o755);
        for (name, m) in [
            ("backend.redb", 0o644),
            ("admin-identity.json", 0o640),
            ("ok", 0o600),
        ] {
            std::fs::write(dir.join(name), b"x").unwrap();
            set_mode(&dir.join(name), m);
        }
        std::fs::create_dir(dir.join("sub")).unwrap();
        let repaired = secure_data_dir(&dir).unwrap();
        let summary: Vec<(String, u32)> = repaired
            .iter()
            .map(|r| (r.path.file_name().unwrap().to_string_lossy().into_owned(), r.from))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("data".to_owned(), 0o755),
                ("admin-identity.json".to_owned(), 0o640),
                ("backend.redb".to_owned(), 0o644),
            ]
        );
        assert_eq!(mode(&dir), 0o700);
        for name in ["backend.redb", "admin-identity.json", "ok"] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
        // A second start repairs nothing.
        assert!(secure_data_dir(&dir).unwrap().is_empty());
    }

    #[test]
    fn repairing_a_missing_file_or_a_symlink_does_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(repair_private_file(&tmp.path().join("none")).unwrap(), None);
        let target = tmp.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        set_mode(&target, 0o644);
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(repair_private_file(&link).unwrap(), None);
        assert_eq!(mode(&target), 0o644);
    }
}

//! The `sftp` subsystem's server (what OpenSSH `sftp` and `scp` speak), run as a process of
//! its own with the login user's rights.
//!
//! Where it sits: the SSH Service answers a `subsystem sftp` request by starting the program
//! its [`SftpLauncher`] names (the `svc` binary's hidden `sftp-server` subcommand) with the
//! login's uid, gid and groups; the channel's data is that process's stdin and stdout. The
//! process drops to the user with [`drop_privileges`] before it does anything else (on its one
//! thread, before any runtime starts), then serves the protocol ([`serve_stdio`]) with plain
//! file-system calls: every file access is the kernel's decision for that user, so an sftp
//! session reads exactly what the user could read in a shell.

use std::{
    collections::HashMap,
    ffi::OsString,
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt},
    path::{Component, Path, PathBuf},
    time::{Duration, UNIX_EPOCH},
};

use russh_sftp::{
    protocol::{Attrs, Data, FileAttributes, Handle, Name, OpenFlags, Status, StatusCode, Version},
    server::StatusReply,
};

/// The most a single read returns (OpenSSH asks for up to 255 KiB).
const MAX_READ: u32 = 255 * 1024;

/// How the SSH Service starts the sftp server: `program` with `args`, then
/// `--uid U --gid G --groups G1,G2`.
#[derive(Clone, Debug)]
pub struct SftpLauncher {
    /// The program (the `svc` binary).
    pub program: PathBuf,
    /// Its leading arguments (the hidden subcommand).
    pub args: Vec<OsString>,
}

impl SftpLauncher {
    /// The running `svc` binary's `sftp-server` subcommand, through `/proc/self/exe` (the
    /// running image, even after a package upgrade replaced the file on disk).
    pub fn this_binary() -> io::Result<Self> {
        let program = PathBuf::from("/proc/self/exe");
        std::fs::metadata(&program)?;
        Ok(Self {
            program,
            args: vec!["sftp-server".into()],
        })
    }
}

/// Becomes `uid`/`gid` with supplementary `groups` for good (real, effective and saved IDs).
/// Call it first thing in the process, while it has a single thread: the IDs are set for the
/// calling thread. Checks the result: afterwards the process cannot regain root.
pub fn drop_privileges(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    use rustix::process::{Gid, Uid};
    let gids: Vec<Gid> = groups.iter().map(|g| Gid::from_raw(*g)).collect();
    rustix::thread::set_thread_groups(&gids)?;
    let g = Gid::from_raw(gid);
    rustix::thread::set_thread_res_gid(g, g, g)?;
    let u = Uid::from_raw(uid);
    rustix::thread::set_thread_res_uid(u, u, u)?;
    if rustix::process::getuid().as_raw() != uid
        || rustix::process::geteuid().as_raw() != uid
        || rustix::process::getegid().as_raw() != gid
    {
        return Err(io::Error::other(format!(
            "the process did not become uid {uid} gid {gid}"
        )));
    }
    if uid != 0 && rustix::thread::set_thread_res_uid(Uid::ROOT, Uid::ROOT, Uid::ROOT).is_ok() {
        return Err(io::Error::other(
            "the process could regain root after dropping it",
        ));
    }
    Ok(())
}

/// Serves sftp on standard input and output until the client closes it.
pub async fn serve_stdio() {
    let stream = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let server = FsServer {
        handles: HashMap::new(),
        next: 0,
        _done: done_tx,
    };
    russh_sftp::server::run(stream, server).await;
    // The server task ends with the stream; the handler is dropped then.
    let _ = done_rx.await;
}

/// An open file or directory listing.
enum Open {
    File(File),
    /// The listing not sent yet (`None` once sent).
    Dir(Option<Vec<russh_sftp::protocol::File>>),
}

/// The protocol on the local file system, with this process's rights.
struct FsServer {
    handles: HashMap<String, Open>,
    next: u64,
    /// Dropped with the server: tells [`serve_stdio`] the session is over.
    _done: tokio::sync::oneshot::Sender<()>,
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".into(),
        language_tag: "en-US".into(),
    }
}

fn io_err(e: io::Error) -> StatusReply {
    let code = match e.kind() {
        io::ErrorKind::NotFound => StatusCode::NoSuchFile,
        io::ErrorKind::PermissionDenied => StatusCode::PermissionDenied,
        _ => StatusCode::Failure,
    };
    StatusReply::new(code).with_message(e.to_string())
}

fn attrs_of(meta: &std::fs::Metadata) -> FileAttributes {
    let mut attrs = FileAttributes::from(meta);
    // The type bits as they are (a symbolic link from lstat stays one).
    attrs.permissions = Some(std::os::unix::fs::MetadataExt::mode(meta));
    attrs
}

/// `path` made absolute against the working directory (the login's home) and normalised
/// lexically (`.` and `..`), for paths that need not exist yet.
fn absolute(path: &str) -> PathBuf {
    let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let joined = if path.is_empty() { base } else { base.join(path) };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

fn apply_attrs(path: &Path, file: Option<&File>, attrs: &FileAttributes) -> io::Result<()> {
    if let Some(size) = attrs.size {
        match file {
            Some(f) => f.set_len(size)?,
            None => OpenOptions::new().write(true).open(path)?.set_len(size)?,
        }
    }
    if let Some(mode) = attrs.permissions {
        let perms = std::fs::Permissions::from_mode(mode & 0o7777);
        match file {
            Some(f) => f.set_permissions(perms)?,
            None => std::fs::set_permissions(path, perms)?,
        }
    }
    if attrs.uid.is_some() || attrs.gid.is_some() {
        match file {
            Some(f) => std::os::unix::fs::fchown(f, attrs.uid, attrs.gid)?,
            None => std::os::unix::fs::chown(path, attrs.uid, attrs.gid)?,
        }
    }
    if let (Some(atime), Some(mtime)) = (attrs.atime, attrs.mtime) {
        let times = std::fs::FileTimes::new()
            .set_accessed(UNIX_EPOCH + Duration::from_secs(u64::from(atime)))
            .set_modified(UNIX_EPOCH + Duration::from_secs(u64::from(mtime)));
        match file {
            Some(f) => f.set_times(times)?,
            None => File::open(path)?.set_times(times)?,
        }
    }
    Ok(())
}

impl FsServer {
    fn insert(&mut self, open: Open) -> String {
        self.next += 1;
        let handle = self.next.to_string();
        self.handles.insert(handle.clone(), open);
        handle
    }

    fn file(&self, handle: &str) -> Result<&File, StatusReply> {
        match self.handles.get(handle) {
            Some(Open::File(f)) => Ok(f),
            _ => Err(StatusReply::new(StatusCode::Failure).with_message("no such file handle")),
        }
    }
}

impl russh_sftp::server::Handler for FsServer {
    type Error = StatusReply;

    fn unimplemented(&self) -> Self::Error {
        StatusReply::new(StatusCode::OpUnsupported)
    }

    async fn init(&mut self, _version: u32, _ext: HashMap<String, String>) -> Result<Version, Self::Error> {
        Ok(Version::new())
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        pflags: OpenFlags,
        attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        let mut options = OpenOptions::new();
        options
            .read(pflags.contains(OpenFlags::READ))
            .write(pflags.contains(OpenFlags::WRITE) || pflags.contains(OpenFlags::APPEND))
            .append(pflags.contains(OpenFlags::APPEND))
            .truncate(pflags.contains(OpenFlags::TRUNCATE))
            .mode(attrs.permissions.map_or(0o666, |m| m & 0o7777));
        if pflags.contains(OpenFlags::EXCLUDE) {
            options.create_new(true);
        } else if pflags.contains(OpenFlags::CREATE) {
            options.create(true);
        }
        let file = options.open(absolute(&filename)).map_err(io_err)?;
        let handle = self.insert(Open::File(file));
        Ok(Handle { id, handle })
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        match self.handles.remove(&handle) {
            Some(_) => Ok(ok(id)),
            None => Err(StatusReply::new(StatusCode::Failure).with_message("no such handle")),
        }
    }

    async fn read(&mut self, id: u32, handle: String, offset: u64, len: u32) -> Result<Data, Self::Error> {
        let file = self.file(&handle)?;
        let mut buf = vec![0u8; len.min(MAX_READ) as usize];
        let n = file.read_at(&mut buf, offset).map_err(io_err)?;
        if n == 0 && !buf.is_empty() {
            return Err(StatusCode::Eof.into());
        }
        buf.truncate(n);
        Ok(Data { id, data: buf })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        let file = self.file(&handle)?;
        file.write_all_at(&data, offset).map_err(io_err)?;
        Ok(ok(id))
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let meta = std::fs::symlink_metadata(absolute(&path)).map_err(io_err)?;
        Ok(Attrs {
            id,
            attrs: attrs_of(&meta),
        })
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let meta = std::fs::metadata(absolute(&path)).map_err(io_err)?;
        Ok(Attrs {
            id,
            attrs: attrs_of(&meta),
        })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, Self::Error> {
        let meta = self.file(&handle)?.metadata().map_err(io_err)?;
        Ok(Attrs {
            id,
            attrs: attrs_of(&meta),
        })
    }

    async fn setstat(&mut self, id: u32, path: String, attrs: FileAttributes) -> Result<Status, Self::Error> {
        apply_attrs(&absolute(&path), None, &attrs).map_err(io_err)?;
        Ok(ok(id))
    }

    async fn fsetstat(
        &mut self,
        id: u32,
        handle: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let file = self.file(&handle)?;
        apply_attrs(Path::new(""), Some(file), &attrs).map_err(io_err)?;
        Ok(ok(id))
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        let dir = absolute(&path);
        let mut files = Vec::new();
        for name in [".", ".."] {
            if let Ok(meta) = std::fs::metadata(dir.join(name)) {
                files.push(russh_sftp::protocol::File::new(name, attrs_of(&meta)));
            }
        }
        for entry in std::fs::read_dir(&dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let attrs = entry
                .metadata()
                .map(|m| attrs_of(&m))
                .unwrap_or_else(|_| FileAttributes::empty());
            files.push(russh_sftp::protocol::File::new(name, attrs));
        }
        let handle = self.insert(Open::Dir(Some(files)));
        Ok(Handle { id, handle })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        match self.handles.get_mut(&handle) {
            Some(Open::Dir(listing)) => match listing.take() {
                Some(files) if !files.is_empty() => Ok(Name { id, files }),
                _ => Err(StatusCode::Eof.into()),
            },
            _ => Err(StatusReply::new(StatusCode::Failure).with_message("no such directory handle")),
        }
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        std::fs::remove_file(absolute(&filename)).map_err(io_err)?;
        Ok(ok(id))
    }

    async fn mkdir(&mut self, id: u32, path: String, attrs: FileAttributes) -> Result<Status, Self::Error> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(attrs.permissions.map_or(0o777, |m| m & 0o7777))
            .create(absolute(&path))
            .map_err(io_err)?;
        Ok(ok(id))
    }

    async fn rmdir(&mut self, id: u32, path: String) -> Result<Status, Self::Error> {
        std::fs::remove_dir(absolute(&path)).map_err(io_err)?;
        Ok(ok(id))
    }

    async fn realpath(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let abs = absolute(&path);
        let real = std::fs::canonicalize(&abs).unwrap_or(abs);
        Ok(Name {
            id,
            files: vec![russh_sftp::protocol::File::dummy(real.to_string_lossy())],
        })
    }

    async fn rename(&mut self, id: u32, oldpath: String, newpath: String) -> Result<Status, Self::Error> {
        std::fs::rename(absolute(&oldpath), absolute(&newpath)).map_err(io_err)?;
        Ok(ok(id))
    }

    async fn readlink(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let target = std::fs::read_link(absolute(&path)).map_err(io_err)?;
        Ok(Name {
            id,
            files: vec![russh_sftp::protocol::File::dummy(target.to_string_lossy())],
        })
    }

    async fn symlink(
        &mut self,
        id: u32,
        linkpath: String,
        targetpath: String,
    ) -> Result<Status, Self::Error> {
        std::os::unix::fs::symlink(&targetpath, absolute(&linkpath)).map_err(io_err)?;
        Ok(ok(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_lexically() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(absolute(""), absolute("."));
        assert_eq!(absolute("/a/b/../c/./d"), PathBuf::from("/a/c/d"));
        assert_eq!(absolute("/.."), PathBuf::from("/"));
        assert_eq!(absolute("x"), cwd.join("x"));
    }
}

//! Package managers: install an exact version of the agent package, hold it there, query it.
//!
//! Last step of a `svc-upgrade` run: once the updater has decided on a target [`Version`], one
//! [`PackageManager`] installs it. [`install_and_hold`] is the whole operation: unhold, install
//! the exact version, hold again (also after a failed install, so a routine `apt upgrade` or
//! `dnf upgrade` never moves the agent off the version the cluster chose).
//!
//! Each implementation runs the real tool with [`tokio::process`], logs its output with
//! `tracing`, and turns a failure into [`PkgError::Failed`] carrying the exit code and the tool's
//! stderr:
//!
//! | installer | install | hold / unhold | installed version |
//! |---|---|---|---|
//! | [`Apt`] | `apt-get install -y svc=<v>` (`--allow-downgrades` only when forced) | `apt-mark hold` / `unhold` | `dpkg-query` |
//! | [`Dnf`] (`yum`) | `dnf install -y svc-<v>` (`downgrade` when forced below the installed one) | `versionlock add` / `delete` when the plugin exists, else `exclude=` in the main configuration | `rpm -q` |
//! | [`Zypper`] | `zypper --non-interactive install svc=<v>` (`--oldpackage` when forced) | `addlock` / `removelock` | `rpm -q` |
//! | [`Nop`] | records what it would do | records | what it was given |
//!
//! Without `force`, a version below the installed one is refused: by apt itself, and for the
//! others with [`PkgError::Downgrade`] before the tool runs.
//!
//! Versions go through [`to_package_version`] (`17.0.0-dev` → `17.0.0~dev`), the same mapping
//! `deploy/packaging/build-packages.sh` uses.

use std::{
    fmt, io,
    path::{Path, PathBuf},
    process::Stdio,
    str::FromStr,
    sync::Mutex,
};

use async_trait::async_trait;
use svc_core::Version;
use tokio::sync::OnceCell;

use super::version::{PackageVersionError, from_package_version, to_package_version};

/// Which package manager the updater uses: the value of the `installer` configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InstallerKind {
    /// Debian and Ubuntu: `apt-get`, `apt-mark`, `dpkg-query`.
    Apt,
    /// RHEL, Fedora, Amazon Linux: `yum`, or `dnf` where `yum` is absent.
    Yum,
    /// SUSE: `zypper`.
    Zypper,
    /// Installs nothing; records what it would do (dry runs, tests).
    Nop,
}

impl InstallerKind {
    /// The value as written in the `installer` file.
    pub fn as_str(self) -> &'static str {
        match self {
            InstallerKind::Apt => "apt",
            InstallerKind::Yum => "yum",
            InstallerKind::Zypper => "zypper",
            InstallerKind::Nop => "nop",
        }
    }
}

impl fmt::Display for InstallerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InstallerKind {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "apt" => Ok(InstallerKind::Apt),
            "yum" => Ok(InstallerKind::Yum),
            "zypper" => Ok(InstallerKind::Zypper),
            "nop" => Ok(InstallerKind::Nop),
            _ => Err(()),
        }
    }
}

/// Why a package manager operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PkgError {
    /// The program could not be started (usually: not installed).
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The program ran and reported failure.
    #[error("`{command}` failed ({}): {stderr}", describe_exit(*code))]
    Failed {
        /// The command line.
        command: String,
        /// The exit code; `None` when a signal ended the program.
        code: Option<i32>,
        /// What the program wrote to stderr (trimmed).
        stderr: String,
    },
    /// The version cannot be written as a package version, or an installed package's version
    /// is not an svc version.
    #[error(transparent)]
    Version(#[from] PackageVersionError),
    /// The package manager's configuration file (the `exclude=` hold) could not be updated.
    #[error("cannot update {path}: {source}")]
    Conf {
        /// The configuration file.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// Without force, a version below the installed one is not installed.
    #[error("refusing to downgrade {package} from {installed} to {requested} without force")]
    Downgrade {
        /// The package.
        package: String,
        /// The installed version.
        installed: Version,
        /// The version asked for.
        requested: Version,
    },
    /// No supported package manager was found.
    #[error("no supported package manager found: expected one of apt-get, dnf, yum, zypper on PATH")]
    NotFound,
}

fn describe_exit(code: Option<i32>) -> String {
    match code {
        Some(code) => format!("exit code {code}"),
        None => "killed by a signal".to_owned(),
    }
}

/// Installs, holds and queries one package with the system's package manager.
///
/// Methods take the package name (`svc` unless the `package` file says otherwise) so one value
/// serves every package of the product.
#[async_trait]
pub trait PackageManager: fmt::Debug + Send + Sync {
    /// Which installer this is.
    fn kind(&self) -> InstallerKind;

    /// Installs exactly `version` of `package`. Without `force`, a version below the installed
    /// one is refused (by the package manager where it has that rule).
    async fn install(&self, package: &str, version: &Version, force: bool) -> Result<(), PkgError>;

    /// Pins `package` at its installed version so routine system upgrades leave it alone.
    async fn hold(&self, package: &str) -> Result<(), PkgError>;

    /// Removes the pin set by [`hold`](Self::hold); succeeds when there is none.
    async fn unhold(&self, package: &str) -> Result<(), PkgError>;

    /// The installed version of `package`, `None` when it is not installed.
    async fn installed_version(&self, package: &str) -> Result<Option<Version>, PkgError>;
}

/// Installs exactly `version` of `package` and holds it there: unhold, install, hold.
///
/// The package is held again even when the install fails, so the version left installed stays
/// pinned; the install error is the one returned.
pub async fn install_and_hold(
    pm: &dyn PackageManager,
    package: &str,
    version: &Version,
    force: bool,
) -> Result<(), PkgError> {
    pm.unhold(package).await?;
    let installed = pm.install(package, version, force).await;
    let held = pm.hold(package).await;
    installed.and(held)
}

/// The package manager for `installer`, or the one detected on this system when `None`
/// (`apt-get`, then `dnf`, `yum`, `zypper` on `PATH`).
pub fn package_manager(installer: Option<InstallerKind>) -> Result<Box<dyn PackageManager>, PkgError> {
    let kind = match installer {
        Some(kind) => kind,
        None => detect_installer(|program| find_program(program).is_some()).ok_or(PkgError::NotFound)?,
    };
    Ok(match kind {
        InstallerKind::Apt => Box::new(Apt::system()),
        InstallerKind::Yum => Box::new(Dnf::system()),
        InstallerKind::Zypper => Box::new(Zypper::new()),
        InstallerKind::Nop => Box::new(Nop::new(None)),
    })
}

/// The installer whose program `exists`, in order: `apt-get`, `dnf`, `yum`, `zypper`.
pub(crate) fn detect_installer(exists: impl Fn(&str) -> bool) -> Option<InstallerKind> {
    [
        ("apt-get", InstallerKind::Apt),
        ("dnf", InstallerKind::Yum),
        ("yum", InstallerKind::Yum),
        ("zypper", InstallerKind::Zypper),
    ]
    .into_iter()
    .find(|(program, _)| exists(program))
    .map(|(_, kind)| kind)
}

/// The path of `program` in one of the `PATH` directories.
pub(crate) fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// What a finished command printed.
#[derive(Debug)]
struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// One package manager command line.
struct Invocation {
    program: String,
    args: Vec<String>,
    env: Vec<(&'static str, &'static str)>,
}

impl Invocation {
    fn new(program: &str) -> Self {
        Invocation {
            program: program.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    fn env(mut self, key: &'static str, value: &'static str) -> Self {
        self.env.push((key, value));
        self
    }

    /// Runs the command to completion, logging its output; any exit status is returned.
    async fn output(&self) -> Result<Output, PkgError> {
        tracing::info!(command = %self, "running package manager");
        let output = tokio::process::Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().copied())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|source| PkgError::Spawn {
                command: self.to_string(),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
            tracing::info!(program = %self.program, "{line}");
        }
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            tracing::warn!(program = %self.program, "{line}");
        }
        tracing::info!(command = %self, code = ?output.status.code(), "package manager finished");
        Ok(Output {
            code: output.status.code(),
            stdout,
            stderr,
        })
    }

    /// Runs the command; an exit code outside `ok_codes` is [`PkgError::Failed`].
    async fn run_accepting(&self, ok_codes: &[i32]) -> Result<Output, PkgError> {
        let output = self.output().await?;
        match output.code {
            Some(code) if ok_codes.contains(&code) => Ok(output),
            code => Err(self.failed(code, &output.stderr)),
        }
    }

    async fn run(&self) -> Result<Output, PkgError> {
        self.run_accepting(&[0]).await
    }

    fn failed(&self, code: Option<i32>, stderr: &str) -> PkgError {
        PkgError::Failed {
            command: self.to_string(),
            code,
            stderr: stderr.trim().to_owned(),
        }
    }
}

impl fmt::Display for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.program)?;
        for arg in &self.args {
            write!(f, " {arg}")?;
        }
        Ok(())
    }
}

/// [`PkgError::Downgrade`] when `requested` is below `installed` and the caller did not force
/// it: dnf and zypper would otherwise downgrade (or not) by rules of their own.
fn refuse_unforced_downgrade(
    package: &str,
    installed: Option<Version>,
    requested: &Version,
    force: bool,
) -> Result<(), PkgError> {
    match installed {
        Some(installed) if !force && *requested < installed => Err(PkgError::Downgrade {
            package: package.to_owned(),
            installed,
            requested: requested.clone(),
        }),
        _ => Ok(()),
    }
}

/// The installed version of an rpm package, `None` when it is not installed.
async fn rpm_installed_version(package: &str) -> Result<Option<Version>, PkgError> {
    let query = Invocation::new("rpm").args(["-q", "--queryformat", "%{VERSION}\\n", package]);
    let output = query.output().await?;
    match output.code {
        Some(0) => {
            // Several versions can be installed side by side only by force; the newest counts.
            let mut newest = None;
            for line in output.stdout.lines().filter(|l| !l.trim().is_empty()) {
                let version = from_package_version(line)?;
                if newest.as_ref().is_none_or(|n| &version > n) {
                    newest = Some(version);
                }
            }
            Ok(newest)
        }
        Some(1) if output.stdout.contains("is not installed") => Ok(None),
        code => Err(query.failed(code, &output.stderr)),
    }
}

/// `apt-get` on Debian and Ubuntu.
#[derive(Debug, Clone)]
pub struct Apt {
    options: Vec<String>,
    update_options: Vec<String>,
}

/// The sources file the install script writes for the svc repository.
pub const APT_SOURCES_FILE: &str = "/etc/apt/sources.list.d/svc.list";

impl Apt {
    /// The system's apt. Before an install it refreshes only the svc repository's list
    /// ([`APT_SOURCES_FILE`]) when that file exists, so an unreachable unrelated mirror cannot
    /// block an agent update; otherwise it refreshes every source.
    pub fn system() -> Self {
        let update_options = if Path::new(APT_SOURCES_FILE).is_file() {
            vec![
                "-o".to_owned(),
                format!("Dir::Etc::sourcelist={APT_SOURCES_FILE}"),
                "-o".to_owned(),
                "Dir::Etc::sourceparts=-".to_owned(),
                "-o".to_owned(),
                "APT::Get::List-Cleanup=0".to_owned(),
            ]
        } else {
            Vec::new()
        };
        Apt {
            options: Vec::new(),
            update_options,
        }
    }

    /// apt with `options` (`-o Key=Value` pairs, as separate arguments) passed to every
    /// `apt-get` and `apt-mark` call, for example other sources and lists directories.
    pub fn with_options(options: Vec<String>) -> Self {
        Apt {
            options,
            update_options: Vec::new(),
        }
    }

    fn apt_mark(&self) -> Invocation {
        Invocation::new("apt-mark")
            .args(self.options.iter().cloned())
            .args(["-o", "DPkg::Lock::Timeout=300"])
    }

    fn apt_get(&self) -> Invocation {
        Invocation::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(self.options.iter().cloned())
            // The timer may fire while unattended-upgrades holds the lock; wait for it.
            .args(["-o", "DPkg::Lock::Timeout=300"])
    }
}

#[async_trait]
impl PackageManager for Apt {
    fn kind(&self) -> InstallerKind {
        InstallerKind::Apt
    }

    async fn install(&self, package: &str, version: &Version, force: bool) -> Result<(), PkgError> {
        let package_version = to_package_version(version)?;
        self.apt_get()
            .args(self.update_options.iter().cloned())
            .args(["-q", "update"])
            .run()
            .await?;
        let mut install = self.apt_get().args([
            "-y",
            "-q",
            // Keep a locally changed configuration file without asking.
            "-o",
            "Dpkg::Options::=--force-confdef",
            "-o",
            "Dpkg::Options::=--force-confold",
        ]);
        if force {
            install = install.args(["--allow-downgrades"]);
        }
        install
            .args(["install".to_owned(), format!("{package}={package_version}")])
            .run()
            .await?;
        Ok(())
    }

    async fn hold(&self, package: &str) -> Result<(), PkgError> {
        self.apt_mark().args(["hold", package]).run().await.map(drop)
    }

    async fn unhold(&self, package: &str) -> Result<(), PkgError> {
        // apt-mark refuses a package it knows nothing of; nothing installed, nothing held.
        if self.installed_version(package).await?.is_none() {
            return Ok(());
        }
        self.apt_mark().args(["unhold", package]).run().await.map(drop)
    }

    async fn installed_version(&self, package: &str) -> Result<Option<Version>, PkgError> {
        let query = Invocation::new("dpkg-query").args(["-W", "-f=${db:Status-Abbrev}|${Version}", package]);
        let output = query.output().await?;
        match output.code {
            Some(0) => {
                let (status, version) = output.stdout.split_once('|').unwrap_or((&output.stdout, ""));
                // The second letter is the current state: `ii` installed, `hi` held and
                // installed, `rc` removed with its configuration files left.
                if status.as_bytes().get(1) == Some(&b'i') {
                    Ok(Some(from_package_version(version)?))
                } else {
                    Ok(None)
                }
            }
            Some(1) if output.stderr.contains("no packages found") => Ok(None),
            code => Err(query.failed(code, &output.stderr)),
        }
    }
}

/// How [`Dnf`] holds a package.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DnfHold {
    /// The versionlock plugin: `versionlock add` / `versionlock delete`.
    VersionLock,
    /// The package name in `exclude=` of the `[main]` section of this configuration file.
    Exclude(PathBuf),
}

/// `dnf`, or `yum` on systems that still have it.
#[derive(Debug)]
pub struct Dnf {
    program: String,
    options: Vec<String>,
    hold: OnceCell<DnfHold>,
}

impl Dnf {
    /// `yum` where it exists (on current systems a link to dnf), else `dnf`; the hold method is
    /// detected on first use.
    pub fn system() -> Self {
        let program = if find_program("yum").is_some() {
            "yum"
        } else {
            "dnf"
        };
        Dnf::new(program, Vec::new())
    }

    /// `program` (`dnf` or `yum`) with `options` before every subcommand, for example
    /// `--releasever=9`.
    pub fn new(program: &str, options: Vec<String>) -> Self {
        Dnf {
            program: program.to_owned(),
            options,
            hold: OnceCell::new(),
        }
    }

    /// Uses `hold` instead of detecting it.
    pub fn with_hold(self, hold: DnfHold) -> Self {
        Dnf {
            hold: OnceCell::new_with(Some(hold)),
            ..self
        }
    }

    /// The hold method: versionlock when `<program> versionlock --help` works, else `exclude=`
    /// in `/etc/dnf/dnf.conf` (`/etc/yum.conf` for yum).
    pub async fn hold_method(&self) -> Result<&DnfHold, PkgError> {
        self.hold
            .get_or_try_init(|| async {
                let probe = self.invocation().args(["versionlock", "--help"]).output().await?;
                Ok(if probe.code == Some(0) {
                    DnfHold::VersionLock
                } else if self.program == "yum" && Path::new("/etc/yum.conf").is_file() {
                    DnfHold::Exclude(PathBuf::from("/etc/yum.conf"))
                } else {
                    DnfHold::Exclude(PathBuf::from("/etc/dnf/dnf.conf"))
                })
            })
            .await
    }

    fn invocation(&self) -> Invocation {
        Invocation::new(&self.program).args(self.options.iter().cloned())
    }

    async fn set_excluded(&self, conf: &Path, package: &str, excluded: bool) -> Result<(), PkgError> {
        let conf_error = |source| PkgError::Conf {
            path: conf.to_owned(),
            source,
        };
        let text = match tokio::fs::read_to_string(conf).await {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(conf_error(e)),
        };
        let updated = set_excluded(&text, package, excluded);
        if updated != text {
            tracing::info!(path = %conf.display(), package, excluded, "updating exclude= in the main section");
            tokio::fs::write(conf, updated).await.map_err(conf_error)?;
        }
        Ok(())
    }
}

#[async_trait]
impl PackageManager for Dnf {
    fn kind(&self) -> InstallerKind {
        InstallerKind::Yum
    }

    async fn install(&self, package: &str, version: &Version, force: bool) -> Result<(), PkgError> {
        let spec = format!("{package}-{}", to_package_version(version)?);
        let installed = self.installed_version(package).await?;
        let below_installed = installed.as_ref().is_some_and(|v| version < v);
        refuse_unforced_downgrade(package, installed, version, force)?;
        let command = if below_installed { "downgrade" } else { "install" };
        self.invocation()
            .args(["-y", "--refresh", command, &spec])
            .run()
            .await
            .map(drop)
    }

    async fn hold(&self, package: &str) -> Result<(), PkgError> {
        match self.hold_method().await? {
            DnfHold::VersionLock => self
                .invocation()
                .args(["versionlock", "add", package])
                .run()
                .await
                .map(drop),
            DnfHold::Exclude(conf) => self.set_excluded(conf, package, true).await,
        }
    }

    async fn unhold(&self, package: &str) -> Result<(), PkgError> {
        match self.hold_method().await? {
            DnfHold::VersionLock => self
                .invocation()
                .args(["versionlock", "delete", package])
                .run()
                .await
                .map(drop),
            DnfHold::Exclude(conf) => self.set_excluded(conf, package, false).await,
        }
    }

    async fn installed_version(&self, package: &str) -> Result<Option<Version>, PkgError> {
        rpm_installed_version(package).await
    }
}

/// `conf` (dnf.conf / yum.conf syntax) with `package` added to or removed from `exclude=` in
/// the `[main]` section. Other lines are kept as they are; `excludepkgs=` (dnf's name for the
/// same option) is edited when present; an emptied option line is dropped.
pub(crate) fn set_excluded(conf: &str, package: &str, excluded: bool) -> String {
    let mut lines: Vec<String> = conf.lines().map(str::to_owned).collect();
    let main_start = lines.iter().position(|l| l.trim() == "[main]");
    let Some(main_start) = main_start else {
        if !excluded {
            return conf.to_owned();
        }
        let mut out = conf.to_owned();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!("[main]\nexclude={package}\n"));
        return out;
    };
    let main_end = lines[main_start + 1..]
        .iter()
        .position(|l| l.trim_start().starts_with('['))
        .map_or(lines.len(), |i| main_start + 1 + i);
    let option = (main_start + 1..main_end).find(|&i| {
        lines[i]
            .split_once('=')
            .is_some_and(|(key, _)| matches!(key.trim(), "exclude" | "excludepkgs"))
    });
    match option {
        Some(i) => {
            let (key, value) = lines[i].split_once('=').unwrap_or((&lines[i], ""));
            let key = key.trim().to_owned();
            let mut names: Vec<&str> = value
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|n| !n.is_empty() && *n != package)
                .collect();
            if excluded {
                names.push(package);
            }
            if names.is_empty() {
                lines.remove(i);
            } else {
                lines[i] = format!("{key}={}", names.join(" "));
            }
        }
        None if excluded => lines.insert(main_start + 1, format!("exclude={package}")),
        None => return conf.to_owned(),
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// `zypper` on SUSE.
#[derive(Debug, Clone, Default)]
pub struct Zypper {
    options: Vec<String>,
}

/// zypper exit codes that mean success with a remark: 100 updates needed, 101 security updates
/// needed, 102 reboot needed, 103 restart of the package manager needed.
const ZYPPER_OK: [i32; 5] = [0, 100, 101, 102, 103];

impl Zypper {
    /// The system's zypper.
    pub fn new() -> Self {
        Zypper::default()
    }

    /// zypper with global `options` before every command, for example `--root DIR`.
    pub fn with_options(options: Vec<String>) -> Self {
        Zypper { options }
    }

    fn invocation(&self) -> Invocation {
        Invocation::new("zypper")
            .args(["--non-interactive"])
            .args(self.options.iter().cloned())
    }
}

#[async_trait]
impl PackageManager for Zypper {
    fn kind(&self) -> InstallerKind {
        InstallerKind::Zypper
    }

    async fn install(&self, package: &str, version: &Version, force: bool) -> Result<(), PkgError> {
        let spec = format!("{package}={}", to_package_version(version)?);
        refuse_unforced_downgrade(package, self.installed_version(package).await?, version, force)?;
        let mut install = self.invocation().args(["install"]);
        if force {
            install = install.args(["--oldpackage"]);
        }
        install.args([spec]).run_accepting(&ZYPPER_OK).await.map(drop)
    }

    async fn hold(&self, package: &str) -> Result<(), PkgError> {
        self.invocation()
            .args(["addlock", package])
            .run_accepting(&ZYPPER_OK)
            .await
            .map(drop)
    }

    async fn unhold(&self, package: &str) -> Result<(), PkgError> {
        self.invocation()
            .args(["removelock", package])
            .run_accepting(&ZYPPER_OK)
            .await
            .map(drop)
    }

    async fn installed_version(&self, package: &str) -> Result<Option<Version>, PkgError> {
        rpm_installed_version(package).await
    }
}

/// A package manager that installs nothing: it records each operation (dry runs, tests).
#[derive(Debug, Default)]
pub struct Nop {
    state: Mutex<NopState>,
}

#[derive(Debug, Default)]
struct NopState {
    installed: Option<Version>,
    actions: Vec<String>,
}

impl Nop {
    /// A Nop that reports `installed` as the installed version until told to install another.
    pub fn new(installed: Option<Version>) -> Self {
        Nop {
            state: Mutex::new(NopState {
                installed,
                actions: Vec::new(),
            }),
        }
    }

    /// What it was asked to do, in order: `install svc=17.0.0~dev`, `hold svc`, `unhold svc`
    /// (`install --force …` when forced).
    pub fn actions(&self) -> Vec<String> {
        self.lock().actions.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NopState> {
        // The state is a plain log; a panic elsewhere cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, action: String) {
        tracing::info!(action = %action, "nop installer: not doing");
        self.lock().actions.push(action);
    }
}

#[async_trait]
impl PackageManager for Nop {
    fn kind(&self) -> InstallerKind {
        InstallerKind::Nop
    }

    async fn install(&self, package: &str, version: &Version, force: bool) -> Result<(), PkgError> {
        let package_version = to_package_version(version)?;
        refuse_unforced_downgrade(package, self.lock().installed.clone(), version, force)?;
        let force = if force { "--force " } else { "" };
        self.record(format!("install {force}{package}={package_version}"));
        self.lock().installed = Some(version.clone());
        Ok(())
    }

    async fn hold(&self, package: &str) -> Result<(), PkgError> {
        self.record(format!("hold {package}"));
        Ok(())
    }

    async fn unhold(&self, package: &str) -> Result<(), PkgError> {
        self.record(format!("unhold {package}"));
        Ok(())
    }

    async fn installed_version(&self, _package: &str) -> Result<Option<Version>, PkgError> {
        Ok(self.lock().installed.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).expect("valid version")
    }

    #[test]
    fn installer_names_round_trip() {
        for kind in [
            InstallerKind::Apt,
            InstallerKind::Yum,
            InstallerKind::Zypper,
            InstallerKind::Nop,
        ] {
            assert_eq!(kind.as_str().parse::<InstallerKind>(), Ok(kind));
        }
        assert_eq!("dnf".parse::<InstallerKind>(), Err(()));
    }

    #[test]
    fn detection_prefers_apt_then_dnf_yum_zypper() {
        assert_eq!(detect_installer(|_| true), Some(InstallerKind::Apt));
        assert_eq!(
            detect_installer(|p| p == "yum" || p == "zypper"),
            Some(InstallerKind::Yum)
        );
        assert_eq!(detect_installer(|p| p == "dnf"), Some(InstallerKind::Yum));
        assert_eq!(detect_installer(|p| p == "zypper"), Some(InstallerKind::Zypper));
        assert_eq!(detect_installer(|_| false), None);
    }

    #[test]
    fn exclude_is_added_and_removed_in_main_only() {
        let conf = "# see man dnf.conf\n[main]\ngpgcheck=True\n\n[other]\nexclude=kernel\n";
        let held = set_excluded(conf, "svc", true);
        assert_eq!(
            held,
            "# see man dnf.conf\n[main]\nexclude=svc\ngpgcheck=True\n\n[other]\nexclude=kernel\n"
        );
        assert_eq!(
            set_excluded(&held, "svc", true),
            held,
            "holding twice changes nothing"
        );
        assert_eq!(set_excluded(&held, "svc", false), conf);
        assert_eq!(
            set_excluded(conf, "svc", false),
            conf,
            "unholding what is not held changes nothing"
        );
    }

    #[test]
    fn exclude_keeps_other_packages_and_dnf_spelling() {
        let conf = "[main]\nexcludepkgs=kernel*, svc-old\n";
        assert_eq!(
            set_excluded(conf, "svc", true),
            "[main]\nexcludepkgs=kernel* svc-old svc\n"
        );
        assert_eq!(set_excluded("[main]\nexclude = svc\n", "svc", false), "[main]\n");
        assert_eq!(set_excluded("", "svc", true), "[main]\nexclude=svc\n");
        assert_eq!(set_excluded("a=b", "svc", true), "a=b\n[main]\nexclude=svc\n");
    }

    #[tokio::test]
    async fn nop_records_and_reports() {
        let nop = Nop::new(Some(v("16.4.0")));
        assert_eq!(
            nop.installed_version("svc").await.expect("nop").as_ref(),
            Some(&v("16.4.0"))
        );
        install_and_hold(&nop, "svc", &v("17.0.0-dev"), false)
            .await
            .expect("nop install");
        install_and_hold(&nop, "svc", &v("16.4.1"), true)
            .await
            .expect("nop install");
        assert_eq!(
            nop.actions(),
            [
                "unhold svc",
                "install svc=17.0.0~dev",
                "hold svc",
                "unhold svc",
                "install --force svc=16.4.1",
                "hold svc"
            ]
        );
        assert_eq!(
            nop.installed_version("svc").await.expect("nop"),
            Some(v("16.4.1"))
        );
        let err = nop
            .install("svc", &v("16.4.0"), false)
            .await
            .expect_err("unforced downgrade");
        assert_eq!(
            err.to_string(),
            "refusing to downgrade svc from v16.4.1 to v16.4.0 without force"
        );
    }

    #[tokio::test]
    async fn failure_carries_exit_code_and_stderr() {
        let err = Invocation::new("sh")
            .args([
                "-c",
                "echo out; echo 'E: Version 9 for svc was not found' >&2; exit 100",
            ])
            .run()
            .await
            .expect_err("exit 100");
        match &err {
            PkgError::Failed { code, stderr, .. } => {
                assert_eq!(*code, Some(100));
                assert_eq!(stderr, "E: Version 9 for svc was not found");
            }
            other => panic!("expected Failed, got {other:?}"),
        }
        assert!(
            err.to_string()
                .ends_with("failed (exit code 100): E: Version 9 for svc was not found")
        );
    }

    /// A stand-in `dnf` that appends its arguments to a log and succeeds only for `versionlock`
    /// when `plugin` is true. The real versionlock plugin cannot be installed on the test
    /// machines (its Debian package conflicts with zypper); the exclude= path runs against the
    /// real dnf in tests/linux_packages.rs.
    fn recording_dnf(dir: &Path, plugin: bool) -> PathBuf {
        let script = dir.join("dnf");
        let log = dir.join("log");
        let plugin = if plugin {
            "exit 0"
        } else {
            "echo 'No such command: versionlock' >&2; exit 1"
        };
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\ncase \"$1\" in versionlock) {plugin};; esac\nexit 0\n",
                log.display()
            ),
        )
        .expect("write script");
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        script
    }

    #[tokio::test]
    async fn dnf_holds_with_versionlock_when_the_plugin_answers() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dnf = Dnf::new(
            recording_dnf(tmp.path(), true).to_str().expect("utf-8"),
            vec!["--releasever=9".into()],
        );
        assert_eq!(dnf.hold_method().await.expect("probe"), &DnfHold::VersionLock);
        dnf.hold("svc").await.expect("hold");
        dnf.unhold("svc").await.expect("unhold");
        let log = std::fs::read_to_string(tmp.path().join("log")).expect("log");
        assert_eq!(
            log,
            "--releasever=9 versionlock --help\n--releasever=9 versionlock add svc\n--releasever=9 versionlock delete svc\n"
        );
    }

    #[tokio::test]
    async fn dnf_without_the_plugin_holds_with_exclude() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dnf = Dnf::new(
            recording_dnf(tmp.path(), false).to_str().expect("utf-8"),
            Vec::new(),
        );
        assert_eq!(
            dnf.hold_method().await.expect("probe"),
            &DnfHold::Exclude("/etc/dnf/dnf.conf".into())
        );
        let conf = tmp.path().join("dnf.conf");
        std::fs::write(&conf, "[main]\ngpgcheck=1\n").expect("write conf");
        let dnf = Dnf::new("dnf", Vec::new()).with_hold(DnfHold::Exclude(conf.clone()));
        dnf.hold("svc").await.expect("hold");
        assert_eq!(
            std::fs::read_to_string(&conf).expect("conf"),
            "[main]\nexclude=svc\ngpgcheck=1\n"
        );
        dnf.unhold("svc").await.expect("unhold");
        assert_eq!(
            std::fs::read_to_string(&conf).expect("conf"),
            "[main]\ngpgcheck=1\n"
        );
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_error() {
        let err = Invocation::new("/nonexistent/apt-get")
            .run()
            .await
            .expect_err("no such program");
        assert!(matches!(err, PkgError::Spawn { .. }), "{err:?}");
        assert!(err.to_string().starts_with("cannot run `/nonexistent/apt-get`: "));
    }
}

//! Real systemd for the end-to-end tests: a container booted with `systemd-nspawn -b` on a
//! throw-away copy of this machine's own root, and the signed apt repository the project's own
//! packaging builds.
//!
//! - [`Machine`]: an overlay (writable layer on a tmpfs) over the host's `/`, booted with
//!   `systemd-nspawn --boot --register=no` sharing the host's network (so the container reaches
//!   a cluster on 127.0.0.1). The host's own enabled services and timers are masked in the
//!   layer (a booted copy of the host must not start a second PostgreSQL on the shared
//!   network), so the container runs systemd, journald, dbus and what the test starts. Commands
//!   run inside with `nsenter --all` on the container's PID 1. Dropping it stops the container
//!   and removes the layer, also when the test fails.
//!
//!   Why an overlay of `/` made here: `systemd-nspawn --volatile=overlay -D /` is refused
//!   ("Spawning container on root directory is not supported"), and `--volatile=yes` boots with
//!   an empty `/etc` (systemd-firstboot prompts; no dpkg database, so apt cannot install). An
//!   overlay gives the host's own Debian with its package database, boots in about a second, and
//!   needs no download (a `debootstrap` tree would need the Debian mirror and ~250 MB).
//! - [`stamped_binaries`]: `svc` and `svc-upgrade` built with `SVC_BUILD_VERSION` (what
//!   release builds do), in the stamped target directory `linux_packages` uses too.
//! - [`AptRepo`]: `.deb` packages from `deploy/packaging/build-packages.sh`, laid out as
//!   `deploy/install.sh` expects (`<base>/apt`, `dists/stable/<channel>`, a gpg-signed
//!   `InRelease`, the armored key at `<base>/svc-pubkey.asc`).
#![allow(dead_code, unreachable_pub)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use svc_testkit::require;
use svc_testkit::wait::run_within;

/// How long one command inside the container, a package build or a boot step may take.
pub const STEP: Duration = Duration::from_secs(120);

/// The result of a command: its status and output as text.
#[derive(Debug)]
pub struct Ran {
    /// Whether it exited 0.
    pub ok: bool,
    /// What it printed.
    pub stdout: String,
    /// What it printed on standard error.
    pub stderr: String,
}

impl From<Output> for Ran {
    fn from(o: Output) -> Self {
        Ran {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok={}\n--- stdout\n{}--- stderr\n{}",
            self.ok, self.stdout, self.stderr
        )
    }
}

/// Runs `command` within `limit`; panics when it cannot start.
pub fn run(command: &mut Command, limit: Duration, what: &str) -> Ran {
    run_within(command, limit, what)
        .unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", command.get_program()))
        .into()
}

/// Runs `command`, which must succeed; returns its standard output.
pub fn must(command: &mut Command, what: &str) -> String {
    let ran = run(command, STEP, what);
    assert!(ran.ok, "{what} failed:\n{ran}");
    ran.stdout
}

/// The target directory this test binary was built in (`<target>/debug/deps/<test>`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.ancestors()
        .nth(3)
        .unwrap_or_else(|| panic!("{} is outside a target directory", exe.display()))
        .to_owned()
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Copies `svc` and `svc-upgrade` from `from` into `<dir>/bin/<version>`, without their debug
/// information (a debug build carries ~100 MB of it; packing that would dominate the test), and
/// checks each says `version`.
pub fn keep_binaries(dir: &Path, version: &str, svc: &Path, upgrade: &Path) -> PathBuf {
    let strip = require("strip", "binutils");
    let bin = dir.join("bin").join(version);
    std::fs::create_dir_all(&bin).expect("binary directory");
    for (program, from) in [("svc", svc), ("svc-upgrade", upgrade)] {
        let to = bin.join(program);
        let _ = std::fs::remove_file(&to);
        std::fs::copy(from, &to)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
        must(
            Command::new(&strip).arg("--strip-debug").arg(&to),
            &format!("strip {program}"),
        );
        let said = must(Command::new(&to).arg("version"), &format!("{program} version"));
        assert_eq!(
            said.trim(),
            format!("{program} v{version}"),
            "{} is not the build of {version}",
            to.display()
        );
    }
    bin
}

/// `svc` and `svc-upgrade` built with `SVC_BUILD_VERSION=<version>` ([`svc_testkit::stamped`],
/// shared with `svc-update`'s `linux_packages` tests), kept in `<dir>/bin/<version>`. `.ci/run`
/// builds the same stamp before the tests, so in CI the build is a no-op.
pub fn stamped_binaries(dir: &Path, version: &str) -> PathBuf {
    let debug = svc_testkit::stamped::build(&repo_root(), version);
    keep_binaries(dir, version, &debug.join("svc"), &debug.join("svc-upgrade"))
}

/// A signed apt repository on disk, laid out as `deploy/install.sh` reads it.
pub struct AptRepo {
    /// The base (`SVC_REPO_URL=file://<base>`): `apt/`, `svc-pubkey.asc`.
    pub base: PathBuf,
}

impl AptRepo {
    /// Packages every `(version, bin-dir)` with `deploy/packaging/build-packages.sh` (`.deb`
    /// only) and publishes them all under the channels `v<major>` and `cloud` of suite
    /// `stable`, signed with a fresh key. Everything goes to `dir` (replaced).
    pub fn build(dir: &Path, versions: &[(&str, &Path)]) -> AptRepo {
        for (tool, package) in [
            ("dpkg-deb", "dpkg"),
            ("apt-ftparchive", "apt-utils"),
            ("gpg", "gnupg"),
            ("gpgconf", "gnupg"),
        ] {
            require(tool, package);
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir).expect("removing the old repository");
        }
        let pool = dir.join("pool");
        let base = dir.join("repo");
        let apt = base.join("apt");
        std::fs::create_dir_all(apt.join("pool")).expect("repository directory");
        std::fs::create_dir_all(&pool).expect("pool");
        let gnupg = dir.join("gnupg");
        std::fs::create_dir_all(&gnupg).expect("gnupg home");
        std::fs::set_permissions(&gnupg, std::fs::Permissions::from_mode(0o700)).expect("gnupg home mode");
        let gpg = |args: &[&str], what: &str| {
            must(
                Command::new("gpg")
                    .env("GNUPGHOME", &gnupg)
                    .args(["--batch", "--quiet"])
                    .args(args),
                what,
            )
        };
        gpg(
            &[
                "--passphrase",
                "",
                "--quick-gen-key",
                "svc e2e repository <repo@example.invalid>",
                "ed25519",
                "sign",
                "never",
            ],
            "generating the repository key",
        );
        std::fs::write(
            base.join("svc-pubkey.asc"),
            gpg(&["--armor", "--export"], "exporting the repository key"),
        )
        .expect("writing the key");
        let started = Instant::now();
        for (version, bin) in versions {
            must(
                Command::new("bash")
                    .arg(repo_root().join("deploy/packaging/build-packages.sh"))
                    .args(["build", version])
                    .arg(bin)
                    .arg(&pool)
                    .arg("deb"),
                &format!("build-packages.sh build {version}"),
            );
        }
        eprintln!(
            "packages of {} versions built in {:.1?}",
            versions.len(),
            started.elapsed()
        );
        for entry in std::fs::read_dir(&pool).expect("pool") {
            let path = entry.expect("pool entry").path();
            let name = path.file_name().expect("file name");
            std::fs::copy(&path, apt.join("pool").join(name)).expect("copying a package");
        }
        let arch = must(
            Command::new("dpkg").arg("--print-architecture"),
            "dpkg --print-architecture",
        )
        .trim()
        .to_owned();
        let majors: std::collections::BTreeSet<String> = versions
            .iter()
            .map(|(v, _)| format!("v{}", v.split('.').next().unwrap_or_default()))
            .collect();
        let components: Vec<String> = majors.into_iter().chain(["cloud".to_owned()]).collect();
        let packages = must(
            Command::new("apt-ftparchive")
                .current_dir(&apt)
                .args(["packages", "pool"]),
            "apt-ftparchive packages",
        );
        for component in &components {
            let binary = apt.join(format!("dists/stable/{component}/binary-{arch}"));
            std::fs::create_dir_all(&binary).expect("dists directory");
            std::fs::write(binary.join("Packages"), &packages).expect("Packages");
        }
        let release = must(
            Command::new("apt-ftparchive")
                .current_dir(apt.join("dists/stable"))
                .args(["-o", "APT::FTPArchive::Release::Suite=stable"])
                .args(["-o", "APT::FTPArchive::Release::Codename=stable"])
                .arg("-o")
                .arg(format!(
                    "APT::FTPArchive::Release::Components={}",
                    components.join(" ")
                ))
                .arg("-o")
                .arg(format!("APT::FTPArchive::Release::Architectures={arch}"))
                .args(["release", "."]),
            "apt-ftparchive release",
        );
        std::fs::write(apt.join("dists/stable/Release"), release).expect("Release");
        must(
            Command::new("gpg")
                .env("GNUPGHOME", &gnupg)
                .args(["--batch", "--yes", "--clearsign", "-o"])
                .arg(apt.join("dists/stable/InRelease"))
                .arg(apt.join("dists/stable/Release")),
            "signing InRelease",
        );
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(&gnupg)
            .args(["--kill", "gpg-agent"])
            .output();
        // apt reads file:// repositories as the user _apt.
        for path in [dir, base.as_path()] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("repository mode");
        }
        AptRepo { base }
    }
}

/// A Debian system booted by systemd in `systemd-nspawn`, on a throw-away overlay of the host's
/// root. Stopped (and its layer removed) when dropped.
pub struct Machine {
    /// The container's name (and hostname).
    pub name: String,
    /// The container's root as the host sees it: writes here appear inside.
    pub root: PathBuf,
    /// The tmpfs holding the overlay's writable layer.
    layer: PathBuf,
    /// `systemd-nspawn`'s console output.
    pub log: PathBuf,
    nspawn: Option<Child>,
    /// The container's PID 1 (systemd) as the host numbers it.
    pub leader: u32,
}

impl Machine {
    /// Boots a container named `name` with each `(host path, container path)` of `binds`
    /// bind-mounted read-only, and waits until systemd reports the system running.
    pub fn boot(name: &str, binds: &[(&Path, &str)]) -> Machine {
        let nspawn = require("systemd-nspawn", "systemd-container");
        require("nsenter", "util-linux");
        let layer = std::env::temp_dir().join(format!("svc-e2e-{name}"));
        // A layer left by a run that was killed: unmount and remove it first.
        let _ = Command::new("umount").arg("-R").arg(&layer).output();
        let _ = std::fs::remove_dir_all(&layer);
        std::fs::create_dir_all(&layer).expect("layer directory");
        must(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", "mode=0755", "svc-e2e-layer"])
                .arg(&layer),
            "mounting the layer's tmpfs",
        );
        let (upper, work, root) = (layer.join("upper"), layer.join("work"), layer.join("root"));
        for d in [&upper, &work, &root] {
            std::fs::create_dir_all(d).expect("overlay directory");
        }
        // The host's root is one file system here; its mounts (/proc, /dev, the target
        // directory's own mount if any) are not part of the lower layer, nspawn mounts the
        // API file systems itself and the test binds what it needs.
        let mounted = run(
            Command::new("mount")
                .args(["-t", "overlay", "svc-e2e-root", "-o"])
                .arg(format!(
                    "lowerdir=/,upperdir={},workdir={}",
                    upper.display(),
                    work.display()
                ))
                .arg(&root),
            STEP,
            "mounting the overlay",
        );
        if !mounted.ok {
            let _ = Command::new("umount").arg(&layer).output();
            panic!("cannot mount an overlay of / for the container (overlayfs is needed):\n{mounted}");
        }
        let mut machine = Machine {
            name: name.to_owned(),
            root,
            layer,
            log: std::env::temp_dir().join(format!("svc-e2e-{name}.console")),
            nspawn: None,
            leader: 0,
        };
        machine.quiet_host_units();
        let log = std::fs::File::create(&machine.log).expect("console log");
        let err = log.try_clone().expect("console log");
        let mut command = Command::new(nspawn);
        command
            .arg("--directory")
            .arg(&machine.root)
            .args(["--boot", "--register=no", "--keep-unit", "--console=passive"])
            .arg(format!("--machine={name}"));
        for (host, guest) in binds {
            command.arg(format!("--bind-ro={}:{guest}", host.display()));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .expect("starting systemd-nspawn");
        let pid = child.id();
        machine.nspawn = Some(child);
        // The container's PID 1 is the child of systemd-nspawn in a PID namespace of its own.
        // nspawn's first child is an intermediate process, in the host's namespace, that starts
        // it and exits (its PID, taken for the container's, left nothing to enter on a loaded
        // machine): wait for the one in the new namespace.
        let host_pid_ns = std::fs::read_link("/proc/self/ns/pid").expect("this process's PID namespace");
        let deadline = Instant::now() + STEP;
        loop {
            let children =
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
            let container_init = children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .find(|p| std::fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|ns| ns != host_pid_ns));
            if let Some(leader) = container_init {
                machine.leader = leader;
                break;
            }
            if let Some(status) = machine.nspawn.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!(
                    "systemd-nspawn exited ({status}) before starting the container:\n{}",
                    machine.console()
                );
            }
            assert!(
                Instant::now() < deadline,
                "systemd-nspawn did not start the container's init within {STEP:?}:\n{}",
                machine.console()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // `is-system-running` says `starting` until boot is done; `degraded` means booted with
        // a failed unit, shown below.
        let started = Instant::now();
        loop {
            let state = machine.exec(&["systemctl", "is-system-running"]);
            let last = state.stdout.trim().to_owned();
            if last == "running" {
                break;
            }
            if last == "degraded" {
                let failed = machine.exec(&["systemctl", "--failed", "--no-pager"]);
                panic!("the container booted degraded: {}", failed.stdout);
            }
            assert!(
                started.elapsed() < STEP,
                "the container's systemd did not reach `running` within {STEP:?} (last state: {last:?}; \
                 {}):\n{}",
                state.stderr.trim(),
                machine.console()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        eprintln!(
            "container {name} booted (systemd PID {} on the host) in {:.1?}",
            machine.leader,
            started.elapsed()
        );
        machine
    }

    /// Masks, in the writable layer, every service and timer the host has enabled, and
    /// removes what an earlier svc installation may have left on the host's root.
    fn quiet_host_units(&self) {
        let etc = self.root.join("etc/systemd/system");
        let Ok(dirs) = std::fs::read_dir(&etc) else {
            return;
        };
        for dir in dirs.flatten() {
            let wants = dir.path();
            let is_wants = wants
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".wants"));
            if !is_wants || !wants.is_dir() {
                continue;
            }
            for unit in std::fs::read_dir(&wants).into_iter().flatten().flatten() {
                let name = unit.file_name();
                let text = name.to_string_lossy();
                if text.ends_with(".service") || text.ends_with(".timer") {
                    let mask = etc.join(&name);
                    let _ = std::fs::remove_file(&mask);
                    std::os::unix::fs::symlink("/dev/null", &mask)
                        .unwrap_or_else(|e| panic!("masking {text}: {e}"));
                }
            }
        }
        for leftover in [
            "etc/svc.yaml",
            "etc/svc-upgrade.d",
            "etc/apt/sources.list.d/svc.list",
        ] {
            let path = self.root.join(leftover);
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::remove_file(&path);
        }
    }

    /// What systemd-nspawn printed.
    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `args` run inside the container (all its namespaces), within [`STEP`].
    pub fn exec(&self, args: &[&str]) -> Ran {
        self.exec_within(args, STEP)
    }

    /// `args` run inside the container, within `limit`.
    pub fn exec_within(&self, args: &[&str], limit: Duration) -> Ran {
        let what = format!("`{}` in {}", args.join(" "), self.name);
        run(
            Command::new("nsenter")
                .args(["--target", &self.leader.to_string(), "--all", "--"])
                .args(args)
                .env_clear()
                .env(
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                )
                .env("LANG", "C.UTF-8"),
            limit,
            &what,
        )
    }

    /// `sh -c script` inside the container, which must succeed; returns its output.
    pub fn sh(&self, script: &str) -> String {
        let ran = self.exec(&["sh", "-c", script]);
        assert!(ran.ok, "`{script}` in {} failed:\n{ran}", self.name);
        ran.stdout
    }

    /// `systemctl show UNIT --property=PROPERTY --value`.
    pub fn show(&self, unit: &str, property: &str) -> String {
        self.sh(&format!("systemctl show {unit} --property={property} --value"))
            .trim()
            .to_owned()
    }

    /// The unit's journal (for failure messages).
    pub fn journal(&self, unit: &str) -> String {
        self.exec(&["journalctl", "--no-pager", "-o", "short-precise", "-u", unit])
            .stdout
    }

    /// Writes `text` to `path` inside the container (through the overlay, mode 0644).
    pub fn write(&self, path: &str, text: &str) {
        let host = self.root.join(path.trim_start_matches('/'));
        if let Some(parent) = host.parent() {
            std::fs::create_dir_all(parent).expect("parent directory in the container");
        }
        std::fs::write(&host, text).unwrap_or_else(|e| panic!("writing {path} in the container: {e}"));
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o644))
            .expect("file mode in the container");
    }

    /// The file at `path` inside the container, if it exists.
    pub fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(path.trim_start_matches('/'))).ok()
    }

    /// Waits until `cond` holds, polling every 500 ms; panics naming `what` after `limit`,
    /// with `context()` (journals, files) in the message.
    pub fn wait_for(
        &self,
        limit: Duration,
        what: &str,
        cond: impl FnMut() -> bool,
        context: impl Fn() -> String,
    ) {
        if let Err(e) = self.try_wait_for(limit, what, cond, context) {
            panic!("{e}");
        }
    }

    /// [`wait_for`](Self::wait_for), returning the failure instead of panicking.
    pub fn try_wait_for(
        &self,
        limit: Duration,
        what: &str,
        mut cond: impl FnMut() -> bool,
        context: impl Fn() -> String,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while !cond() {
            if Instant::now() >= deadline {
                return Err(format!("{what} did not happen within {limit:?}\n{}", context()));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.nspawn.take() {
            let pid = child.id().to_string();
            // The first SIGTERM halts the container in order; a second one (nspawn's own
            // rule) kills it at once; SIGKILL after that ends nspawn and with it the container.
            let deadline = Instant::now() + Duration::from_secs(20);
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if child.try_wait().ok().flatten().is_none() {
                let _ = Command::new("kill").args(["-TERM", &pid]).status();
                let deadline = Instant::now() + Duration::from_secs(10);
                while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            if child.try_wait().ok().flatten().is_none() {
                eprintln!("systemd-nspawn did not stop the container within 30 s: killing it");
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        let _ = Command::new("umount").arg(&self.root).output();
        let _ = Command::new("umount").arg(&self.layer).output();
        if Command::new("mountpoint")
            .arg("-q")
            .arg(&self.layer)
            .status()
            .is_ok_and(|s| s.success())
        {
            eprintln!("the container's layer is still busy: detaching it");
            let _ = Command::new("umount").arg("-l").arg(&self.root).output();
            let _ = Command::new("umount").arg("-l").arg(&self.layer).output();
        }
        let _ = std::fs::remove_dir_all(&self.layer);
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for unit in ["svc.service", "svc-upgrade.service"] {
                eprintln!(
                    "--- journal of {unit} in {} ---\n{}",
                    self.name,
                    self.journal(unit)
                );
            }
            eprintln!(
                "--- systemd-nspawn console ({}) ---\n{}--- end ---",
                self.log.display(),
                self.console()
            );
        }
        self.stop();
    }
}

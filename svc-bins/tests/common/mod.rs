//! Runs the real `svc`, `tctl` and `tsh` binaries against a cluster in a temporary directory.
#![allow(dead_code, unreachable_pub)]

pub mod agent;
pub mod resources;
pub mod svc;

/// Deadlines for everything these tests wait on (`svc_testkit::wait`), and how long one step
/// may take here.
pub mod wait {
    pub use svc_testkit::wait::*;

    /// How long one command, start-up or shutdown may take: generous for a debug build on a
    /// loaded two-core machine, short enough that a hang is reported long before CI's limit.
    pub const STEP: std::time::Duration = std::time::Duration::from_secs(90);
}

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

pub const SVC: &str = env!("CARGO_BIN_EXE_svc");
pub const TCTL: &str = env!("CARGO_BIN_EXE_tctl");
pub const TSH: &str = env!("CARGO_BIN_EXE_tsh");

/// The Auth and Proxy sections of the test clusters: free loopback ports, cluster `e2e.test`.
const LOOPBACK_CLUSTER: &str = "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n";

/// [`LOOPBACK_CLUSTER`] with the single-host lab opt-in for directly joined agents: their
/// listeners on 127.0.0.1 are accepted and dialed (`auth_service.direct_dial.allow_loopback`).
const LAB_CLUSTER: &str = "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n  direct_dial:\n    allow_loopback: true\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n";

/// One `svc start` process on free loopback ports, with its data and `SVC_HOME` in `dir`.
pub struct Cluster {
    pub dir: PathBuf,
    tmp: Option<tempfile::TempDir>,
    pub data_dir: PathBuf,
    pub home: PathBuf,
    pub auth_addr: String,
    pub web_addr: String,
    pub stderr_file: PathBuf,
    child: Option<Child>,
}

pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(self) -> Self {
        assert!(
            self.status.success(),
            "command failed: {}\nstdout: {}",
            self.stderr,
            self.stdout
        );
        self
    }
}

impl Run {
    /// Asserts a refusal: a failed command whose stderr carries `text` (`what` names the
    /// attempt; svc's own log is shown when it does not hold).
    pub fn refused(&self, text: &str, what: &str, cluster: &Cluster) {
        assert!(
            !self.status.success(),
            "{what}: expected a refusal, it succeeded: {}",
            self.stdout
        );
        assert!(
            self.stderr.contains(text),
            "{what}: expected {text:?} on stderr, found: {}\nsvc: {}",
            self.stderr,
            cluster.stderr()
        );
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            status: o.status,
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Cluster {
    /// A cluster (log level `info`) where `alice` (role `access`, login `root`) is signed in
    /// with `password`.
    pub fn signed_in(password: &str) -> Cluster {
        let cluster = Cluster::start("info");
        cluster.add_alice(password);
        cluster.login("alice", password).ok();
        cluster
    }

    /// Creates `alice` (role `access`, login `root`) with `password`.
    pub fn add_alice(&self, password: &str) {
        self.add_user("alice", password);
    }

    /// Creates `user` (role `access`, login `root`) with `password`.
    pub fn add_user(&self, user: &str, password: &str) {
        self.tctl_admin(
            &[
                "users",
                "add",
                user,
                "--roles=access",
                "--logins=root",
                "--password-stdin",
            ],
            Some(password),
        )
        .ok();
    }

    /// Starts `svc start --config` in a fresh directory.
    pub fn start(severity: &str) -> Cluster {
        Self::start_in(tempfile::tempdir().expect("tempdir"), severity)
    }

    /// Starts `svc start --config` in a fresh directory with the lab opt-in for directly joined
    /// agents on loopback ([`LAB_CLUSTER`]).
    pub fn start_lab(severity: &str) -> Cluster {
        Self::start_lab_extra(severity, "")
    }

    /// [`start_lab`](Self::start_lab) with `extra` (whole top-level sections) appended.
    pub fn start_lab_extra(severity: &str, extra: &str) -> Cluster {
        Self::start_with(
            tempfile::tempdir().expect("tempdir"),
            severity,
            &format!("{LAB_CLUSTER}{extra}"),
        )
    }

    /// Starts (or restarts) `svc` on the data in `tmp` (removed when the cluster is dropped).
    pub fn start_in(tmp: tempfile::TempDir, severity: &str) -> Cluster {
        Self::start_with(tmp, severity, LOOPBACK_CLUSTER)
    }

    /// Starts `svc start` on loopback with `extra` (whole top-level sections of svc.yaml)
    /// appended.
    pub fn start_extra(severity: &str, extra: &str) -> Cluster {
        Self::start_with(
            tempfile::tempdir().expect("tempdir"),
            severity,
            &format!("{LOOPBACK_CLUSTER}{extra}"),
        )
    }

    /// Starts `svc` with `services` (the svc.yaml sections after `svc:`) on the data in `tmp`.
    pub fn start_with(tmp: tempfile::TempDir, severity: &str, services: &str) -> Cluster {
        Self::start_with_env(tmp, severity, services, &[])
    }

    /// [`start_with`](Self::start_with), with `env` set for the `svc` process.
    pub fn start_with_env(
        tmp: tempfile::TempDir,
        severity: &str,
        services: &str,
        env: &[(&str, &str)],
    ) -> Cluster {
        let dir = tmp.path().to_owned();
        let data_dir = dir.join("data");
        let home = dir.join("home");
        let config = dir.join("svc.yaml");
        std::fs::write(
            &config,
            format!(
                "version: v1\nsvc:\n  data_dir: {}\n  log:\n    severity: {severity}\n{services}",
                data_dir.display()
            ),
        )
        .expect("write config");
        let runs = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        let stderr_file = dir.join(format!("svc-{runs}.stderr"));
        let stderr = std::fs::File::create(&stderr_file).expect("stderr file");
        let mut child = Command::new(SVC)
            .args(["start", "--config"])
            .arg(&config)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn svc");
        // Readiness: svc prints its addresses once every listener is bound (stdout is drained
        // afterwards so svc never blocks on a full pipe).
        let stdout = child.stdout.take().expect("stdout");
        let mut auth_addr = String::new();
        let ready = wait::first_line(stdout, wait::STEP, move |line| {
            if let Some(a) = line.trim().strip_prefix("auth: ") {
                auth_addr = a.to_owned();
            }
            let web = line.trim().strip_prefix("web: https://")?;
            Some((auth_addr.clone(), web.to_owned()))
        });
        let (auth_addr, web_addr) = match ready {
            Ok((auth, web)) if !auth.is_empty() => (auth, web),
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "svc did not start (no `auth:` and `web:` lines: {}): {}",
                    other.err().unwrap_or_else(|| "no auth address".into()),
                    std::fs::read_to_string(&stderr_file).unwrap_or_default()
                );
            }
        };
        Cluster {
            dir,
            tmp: Some(tmp),
            data_dir,
            home,
            auth_addr,
            web_addr,
            stderr_file,
            child: Some(child),
        }
    }

    fn command(&self, bin: &str, args: &[&str], stdin: Option<&str>) -> Run {
        run_client(bin, &self.home, args, stdin)
    }

    /// `tctl ARGS` as the signed-in user (the tsh profile in SVC_HOME).
    pub fn tctl(&self, args: &[&str]) -> Run {
        self.command(TCTL, args, None)
    }

    /// `tctl ARGS` as the signed-in user, with `stdin`.
    pub fn tctl_stdin(&self, args: &[&str], stdin: &str) -> Run {
        self.command(TCTL, args, Some(stdin))
    }

    /// `tctl --data-dir DATA ARGS`: on the Auth host, with the admin identity.
    pub fn tctl_admin(&self, args: &[&str], stdin: Option<&str>) -> Run {
        let data = self.data_dir.to_string_lossy().into_owned();
        let mut all = vec!["--data-dir", data.as_str()];
        all.extend_from_slice(args);
        self.command(TCTL, &all, stdin)
    }

    /// `tsh ARGS` with `stdin`.
    pub fn tsh(&self, args: &[&str], stdin: Option<&str>) -> Run {
        self.command(TSH, args, stdin)
    }

    /// `tsh login --proxy=... --user=USER --insecure` with the password on standard input.
    pub fn login(&self, user: &str, password: &str) -> Run {
        let proxy = format!("--proxy={}", self.web_addr);
        let user = format!("--user={user}");
        self.tsh(
            &["login", &proxy, &user, "--insecure"],
            Some(&format!("{password}\n")),
        )
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, text).expect("write file");
        path
    }

    pub fn admin_identity(&self) -> svc_net::auth::ClientIdentity {
        svc_net::auth::ClientIdentity::load(&self.data_dir.join("admin-identity.json"))
            .expect("admin identity")
    }

    /// SIGKILL, no draining.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill -9 svc");
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait (so logs are flushed).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            wait::wait_exit(&mut child, wait::STEP, "svc after SIGTERM");
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Takes the directory (to restart on it) after stopping the process.
    pub fn take_dir(&mut self) -> tempfile::TempDir {
        self.kill9();
        self.tmp.take().expect("directory already taken")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill9();
        // A failing test shows what svc logged.
        if std::thread::panicking() {
            eprintln!(
                "--- svc log ({}) ---\n{}--- end of svc log ---",
                self.stderr_file.display(),
                self.stderr()
            );
        }
    }
}

/// A client program (`tsh`, `tctl`) with `SVC_HOME=home`, `stdin` written to it, finished within
/// [`wait::STEP`].
pub fn run_client(bin: &str, home: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Run {
    let mut child = Command::new(bin)
        .args(args)
        .env("SVC_HOME", home)
        .env_remove("RUST_LOG")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    let what = format!("`{} {}`", bin.rsplit('/').next().unwrap_or(bin), args.join(" "));
    wait::output_within(child, wait::STEP, &what).into()
}

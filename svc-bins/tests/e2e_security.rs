//! End to end, the insider's view of two trust boundaries, with the real `svc`, `tsh` and `tctl`
//! binaries and a real second OS user:
//!
//! - files: the data directory written by `svc start` (0700, the database holding the CA keys
//!   and password hashes and every key file 0600) and the `tsh` profile cannot be read by another
//!   local user (`runuser -u svc-insider -- cat FILE` is refused); an existing install with
//!   world-readable files is repaired at start, with a log line per file; profile and
//!   kubeconfig files are forced back to 0600 when `tsh` rewrites them;
//! - sign-in abuse: five wrong passwords lock the user (the right one is then refused with the
//!   lock message); the configured limits (`auth_service.authentication`) lock a guessing source
//!   address and end after `lockout_duration`; 20 concurrent bogus sign-ins do not delay an
//!   agent's heartbeat beyond its interval.

mod common;

use svc_testkit::wait::OutputWithin;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{Cluster, TSH};
use svc_core::Secret;
use svc_core::auth::{HEARTBEAT_INTERVAL, Heartbeat};
use svc_core::identity::SystemRole;
use svc_net::auth::{AuthClient, JoinParams};

const PASSWORD: &str = "correct-horse-battery";
/// The second OS user: an insider with a shell on the Auth host but not root.
const INSIDER: &str = "svc-insider";

/// Fails (never skips) when a tool is missing, naming the Debian package.
fn require(path: &str, package: &str) {
    let tool = Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path);
    svc_testkit::require(tool, package);
}

/// Creates the insider account once per test binary (and reuses one left by an earlier run).
fn insider() -> &'static str {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        require("/usr/sbin/useradd", "passwd");
        require("/usr/sbin/runuser", "util-linux");
        let exists = Command::new("id")
            .args(["-u", INSIDER])
            .output()
            .expect("run id")
            .status
            .success();
        if !exists {
            let out = Command::new("/usr/sbin/useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    INSIDER,
                ])
                .output()
                .expect("run useradd");
            assert!(
                out.status.success(),
                "useradd {INSIDER}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    });
    INSIDER
}

/// `runuser -u svc-insider -- ARGS`: (success, stdout, stderr).
fn as_insider(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("/usr/sbin/runuser")
        .args(["-u", insider(), "--"])
        .args(args)
        .output_within(
            common::wait::STEP,
            &format!("runuser -u {INSIDER} -- {}", args.join(" ")),
        )
        .expect("run runuser");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The log without terminal colour codes (the fmt subscriber colours field names).
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// The regular files directly in `dir`.
fn files_in(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("list the directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// The insider is refused `cat FILE` with the kernel's "Permission denied".
fn assert_insider_cannot_read(path: &Path) {
    let (ok, stdout, stderr) = as_insider(&["cat", &path.to_string_lossy()]);
    assert!(!ok, "{INSIDER} read {}: {stdout}", path.display());
    assert!(
        stderr.contains("Permission denied"),
        "{INSIDER} reading {}: {stderr}",
        path.display()
    );
}

/// Makes the test's temporary directory traversable by others, so only the permissions svc
/// chose stand between the insider and the files (tempfile creates it 0700). A world-readable
/// control file there proves the insider can read what is not private.
fn open_up(cluster: &Cluster) {
    chmod(cluster.path(), 0o755);
    let control = cluster.path().join("public.txt");
    std::fs::write(&control, "not a secret\n").expect("control file");
    chmod(&control, 0o644);
    let (ok, stdout, stderr) = as_insider(&["cat", &control.to_string_lossy()]);
    assert!(ok && stdout == "not a secret\n", "control: {stderr}");
}

#[test]
fn another_local_user_cannot_read_the_data_directory_or_key_files() {
    insider();
    let cluster = Cluster::start("info");
    open_up(&cluster);
    cluster
        .tctl_admin(
            &["users", "add", "admin", "--roles=editor", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    cluster.login("admin", PASSWORD).ok();

    let data = &cluster.data_dir;
    assert_eq!(mode(data), 0o700, "{}", data.display());
    let files = files_in(data);
    for name in ["backend.redb", "admin-identity.json", "proxy-key.pem"] {
        assert!(files.iter().any(|f| f.ends_with(name)), "{name} not in {files:?}");
    }
    for file in &files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    assert!(
        !plain(&cluster.stderr()).contains("repaired the permissions"),
        "a fresh install needed no repair"
    );
    // The insider cannot list the directory, nor read the database (CA keys, password hashes),
    // the admin identity or the proxy's TLS key even by full path.
    let (ok, _, stderr) = as_insider(&["ls", &data.to_string_lossy()]);
    assert!(!ok && stderr.contains("Permission denied"), "ls: {stderr}");
    for file in &files {
        assert_insider_cannot_read(file);
    }
    // Nor tctl with the admin identity.
    let (ok, _, stderr) = as_insider(&[common::TCTL, "--data-dir", &data.to_string_lossy(), "status"]);
    assert!(!ok, "the insider ran tctl status as admin");
    assert!(stderr.contains("Permission denied"), "tctl: {stderr}");

    // The tsh profile: the home 0700, the profile and the SSH key 0600.
    let home = &cluster.home;
    assert_eq!(mode(home), 0o700);
    for file in [
        "profile.json",
        "keys/key",
        "keys/key-cert.pub",
        "keys/known_hosts",
    ] {
        assert_eq!(mode(&home.join(file)), 0o600, "{file}");
    }
    chmod(home, 0o755);
    chmod(&home.join("keys"), 0o755);
    assert_insider_cannot_read(&home.join("profile.json"));
    assert_insider_cannot_read(&home.join("keys/key"));

    // Files that exist with looser permissions are forced back to 0600 by the next login.
    for file in ["profile.json", "keys/key", "keys/key-cert.pub"] {
        chmod(&home.join(file), 0o644);
    }
    let (ok, stdout, _) = as_insider(&["cat", &home.join("keys/key").to_string_lossy()]);
    assert!(
        ok && stdout.contains("PRIVATE KEY"),
        "the 0644 key is readable before the fix"
    );
    cluster.login("admin", PASSWORD).ok();
    for file in ["profile.json", "keys/key", "keys/key-cert.pub"] {
        assert_eq!(mode(&home.join(file)), 0o600, "{file} after a new login");
    }
    assert_insider_cannot_read(&home.join("keys/key"));

    // Kubeconfig files carry the user's private key: the default one is 0600 in a 0700
    // directory, and one written over an existing 0644 file (--out) is forced to 0600.
    cluster.tsh(&["kube", "login", "prod"], None).ok();
    assert_eq!(mode(&home.join("kube")), 0o700);
    assert_eq!(mode(&home.join("kube/prod.kubeconfig")), 0o600);
    let out = cluster.path().join("existing.kubeconfig");
    std::fs::write(&out, "old\n").expect("existing kubeconfig");
    chmod(&out, 0o644);
    cluster
        .tsh(&["kube", "login", "prod", "--out", &out.to_string_lossy()], None)
        .ok();
    assert_eq!(mode(&out), 0o600);
    let text = std::fs::read_to_string(&out).expect("kubeconfig");
    assert!(text.contains("client-key-data"), "{text}");
    assert_insider_cannot_read(&out);
}

#[test]
fn an_existing_world_readable_install_is_repaired_at_start_with_a_log_line() {
    insider();
    let mut cluster = Cluster::start("info");
    cluster.stop();
    // What an older release left: a 0755 data directory with 0644 files.
    let data = cluster.data_dir.clone();
    chmod(&data, 0o755);
    let files = files_in(&data);
    for file in &files {
        chmod(file, 0o644);
    }
    open_up(&cluster);
    let (ok, stdout, _) = as_insider(&["cat", &data.join("admin-identity.json").to_string_lossy()]);
    assert!(
        ok && stdout.contains("tls_key_pem"),
        "before the restart the insider can read the admin identity (the issue's attack)"
    );

    let cluster = Cluster::start_in(cluster.take_dir(), "info");
    let log = plain(&cluster.stderr());
    assert_eq!(mode(&data), 0o700);
    assert!(
        log.contains(&format!(
            "repaired the permissions of an existing install: only the owner may read it now path={} from=0755 to=0700",
            data.display()
        )),
        "{log}"
    );
    for file in &files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
        let line = format!(
            "repaired the permissions of an existing install: only the owner may read it now path={} from=0644 to=0600",
            file.display()
        );
        assert!(log.contains(&line), "no line {line:?} in:\n{log}");
        assert_insider_cannot_read(file);
    }
    // The repaired install still works: the admin identity still serves tctl.
    cluster.tctl_admin(&["status"], None).ok();
}

#[test]
fn five_wrong_passwords_lock_the_user_and_the_right_one_is_refused_with_the_lock_message() {
    let cluster = Cluster::start("info");
    for user in ["alice", "bob"] {
        cluster
            .tctl_admin(
                &["users", "add", user, "--roles=editor", "--password-stdin"],
                Some(PASSWORD),
            )
            .ok();
    }
    for i in 1..=5 {
        let wrong = cluster.login("alice", "guessed-password-1");
        assert!(!wrong.status.success(), "guess {i} signed in");
        assert!(
            wrong.stderr.contains("invalid username or password"),
            "guess {i}: {}",
            wrong.stderr
        );
    }
    let right = cluster.login("alice", PASSWORD);
    assert!(!right.status.success(), "a locked user signed in");
    println!("tsh login of a locked user: {}", right.stderr.trim());
    assert!(
        right
            .stderr
            .contains("sign-in refused: user \"alice\" is locked after 5 failed attempts; try again after "),
        "{}",
        right.stderr
    );
    // The lock is alice's: bob signs in from the same address.
    cluster.login("bob", PASSWORD).ok();
    let log = plain(&cluster.stderr());
    assert!(
        log.contains("sign-in locked after too many failures subject=user \"alice\" failures=5"),
        "{log}"
    );
    assert!(
        !log.contains("guessed-password-1") && !log.contains(PASSWORD),
        "a password reached the log"
    );
}

#[test]
fn configured_limits_lock_a_guessing_address_and_locks_end_after_lockout_duration() {
    // Short limits so the lock visibly ends; the defaults are 5, 20 and 30m.
    let config = "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n  authentication:\n    max_login_attempts: 2\n    max_source_attempts: 3\n    lockout_duration: 20s\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n";
    let cluster = Cluster::start_with(tempfile::tempdir().expect("tempdir"), "info", config);
    for user in ["alice", "bob"] {
        cluster
            .tctl_admin(
                &["users", "add", user, "--roles=editor", "--password-stdin"],
                Some(PASSWORD),
            )
            .ok();
    }
    // max_login_attempts: 2.
    for _ in 0..2 {
        assert!(!cluster.login("alice", "guessed-password-1").status.success());
    }
    let right = cluster.login("alice", PASSWORD);
    assert!(
        right
            .stderr
            .contains("sign-in refused: user \"alice\" is locked after 2 failed attempts"),
        "{}",
        right.stderr
    );
    // max_source_attempts: 3 — a third failure from this address (another user name) locks the
    // address, so even bob with the right password is refused now.
    let ghost = cluster.login("nobody-here", "guessed-password-1");
    assert!(
        ghost.stderr.contains("invalid username or password"),
        "{}",
        ghost.stderr
    );
    let bob = cluster.login("bob", PASSWORD);
    assert!(!bob.status.success(), "bob signed in from a locked address");
    assert!(
        bob.stderr
            .contains("sign-in refused: source address 127.0.0.1 is locked after 3 failed attempts"),
        "{}",
        bob.stderr
    );
    // lockout_duration: 20s — both sign in again once it has passed.
    let deadline = Instant::now() + Duration::from_secs(90);
    for user in ["bob", "alice"] {
        loop {
            let r = cluster.login(user, PASSWORD);
            if r.status.success() {
                break;
            }
            assert!(
                r.stderr.contains("is locked after"),
                "{user}: unexpected refusal {}",
                r.stderr
            );
            assert!(
                Instant::now() < deadline,
                "{user} still locked 90 s after a 20 s lockout: {}",
                r.stderr
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_concurrent_bogus_logins_do_not_delay_a_heartbeat_beyond_its_interval() {
    let cluster = Cluster::start("info");
    let out = cluster
        .tctl_admin(&["tokens", "add", "--type=node", "--format", "json"], None)
        .ok();
    let token: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    let params = JoinParams {
        token: Secret::new(token["token"].as_str().expect("token").to_owned()),
        ca_pin: Some(token["ca_pin"].as_str().expect("ca_pin").to_owned()),
        trust_on_first_use: false,
        node_name: "node-1".into(),
        roles: vec![SystemRole::Node],
        additional_names: vec![],
    };
    let identity = svc_net::auth::join(&cluster.auth_addr, params)
        .await
        .expect("join");
    let mut agent = AuthClient::connect_with(&identity).await.expect("agent connects");
    let beat = || Heartbeat {
        hostname: "node-1".into(),
        version: "17.0.0-dev".into(),
        ..Default::default()
    };
    agent
        .heartbeat(&beat())
        .await
        .expect("heartbeat before the storm");

    // 20 real `tsh login` processes with wrong passwords for made-up users, all at once.
    let proxy = format!("--proxy={}", cluster.web_addr);
    let mut storm = Vec::new();
    for i in 0..20 {
        let home = cluster.path().join(format!("storm-{i}"));
        let mut child = Command::new(TSH)
            .args(["login", &proxy, &format!("--user=ghost-{i}"), "--insecure"])
            .env("SVC_HOME", &home)
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tsh");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(b"not-the-password-at-all\n")
            .expect("password");
        storm.push(child);
    }
    // Heartbeats while the storm runs: each must finish well within the interval.
    let mut slowest = Duration::ZERO;
    let mut beats = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let started = Instant::now();
        tokio::time::timeout(HEARTBEAT_INTERVAL, agent.heartbeat(&beat()))
            .await
            .expect("a heartbeat during the storm took longer than the heartbeat interval")
            .expect("heartbeat during the storm");
        slowest = slowest.max(started.elapsed());
        beats += 1;
        let mut running = 0;
        for child in storm.iter_mut() {
            if child.try_wait().expect("try_wait").is_none() {
                running += 1;
            }
        }
        if running == 0 || beats >= 50 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{running} tsh logins still running after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for child in storm {
        let out = child.wait_with_output().expect("tsh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a bogus login succeeded");
        assert!(stderr.contains("invalid username or password"), "{stderr}");
    }
    assert!(slowest < HEARTBEAT_INTERVAL, "slowest heartbeat {slowest:?}");
    println!("heartbeats during 20 concurrent bogus logins: {beats}, slowest {slowest:?}");
}

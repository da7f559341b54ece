//! End to end: the quick start ends with a working `tsh ssh`. The real `svc start` runs Auth,
//! Proxy and an SSH agent (reverse tunnel to its own proxy); a user with `--logins=root` signs
//! in with `tsh login --insecure`, runs a command on the node with `tsh ssh` (output and exit
//! status carried back), and OpenSSH reaches the same node with `tsh proxy ssh` as its
//! `ProxyCommand`.

mod common;

use std::process::Command;

use common::{Cluster, TSH};

const PASSWORD: &str = "correct-horse-battery";

/// The node name `svc start` gives its agent when svc.yaml names none: this host's name.
fn nodename() -> String {
    svc_core::config::Config::all_in_one_default().svc.nodename
}

/// The options OpenSSH's `ssh`, `scp` and `sftp` need to reach the cluster's nodes with the
/// key and certificate `tsh login` wrote: `tsh proxy ssh` as the `ProxyCommand`, the host CA
/// as the only trust.
fn openssh_options(cluster: &Cluster) -> Vec<String> {
    let keys = cluster.home.join("keys");
    let home = cluster.home.to_string_lossy().into_owned();
    [
        "-F".to_owned(),
        "/dev/null".to_owned(),
        "-o".to_owned(),
        "BatchMode=yes".to_owned(),
        "-o".to_owned(),
        "IdentitiesOnly=yes".to_owned(),
        "-i".to_owned(),
        keys.join("key").display().to_string(),
        "-o".to_owned(),
        format!("CertificateFile={}", keys.join("key-cert.pub").display()),
        "-o".to_owned(),
        format!("UserKnownHostsFile={}", keys.join("known_hosts").display()),
        "-o".to_owned(),
        "StrictHostKeyChecking=yes".to_owned(),
        "-o".to_owned(),
        "GlobalKnownHostsFile=/dev/null".to_owned(),
        "-o".to_owned(),
        format!("ProxyCommand=env SVC_HOME={home} {TSH} proxy ssh %r@%h:%p"),
    ]
    .into()
}

#[test]
fn tsh_ssh_runs_a_command_on_the_node_and_returns_its_status() {
    let cluster = Cluster::signed_in(PASSWORD);
    let target = format!("root@{}", nodename());
    let out = cluster.tsh(&["ssh", &target, "echo hello; echo oops >&2; exit 3"], None);
    assert_eq!(
        out.stdout,
        "hello\n",
        "stderr: {}\nsvc: {}",
        out.stderr,
        cluster.stderr()
    );
    assert!(out.stderr.contains("oops"), "{}", out.stderr);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);

    // A login the certificate does not grant is refused (by the proxy, before it dials).
    let denied = cluster.tsh(&["ssh", &format!("nobody@{}", nodename()), "true"], None);
    assert!(!denied.status.success());
    assert!(
        denied.stderr.contains(&format!(
            "access denied to node \"{}\" as login \"nobody\"",
            nodename()
        )),
        "{}",
        denied.stderr
    );

    // The agent heartbeats into the inventory.
    let inventory = cluster.tctl_admin(&["inventory", "ls"], None).ok();
    assert!(inventory.stdout.contains(&nodename()), "{}", inventory.stdout);
}

#[test]
fn tsh_ssh_without_a_command_runs_a_shell_fed_by_standard_input() {
    let cluster = Cluster::signed_in(PASSWORD);
    let target = format!("root@{}", nodename());
    let out = cluster.tsh(&["ssh", &target], Some("echo from-stdin\nexit 5\n"));
    assert_eq!(out.stdout, "from-stdin\n", "stderr: {}", out.stderr);
    assert_eq!(out.status.code(), Some(5), "{}", out.stderr);
}

#[tokio::test]
async fn tsh_ssh_gives_a_terminal_an_interactive_shell_with_a_pty() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = Cluster::signed_in(PASSWORD);
    let (mut pty, pts) = pty_process::open().expect("allocating a PTY");
    pty.resize(pty_process::Size::new(24, 80)).expect("PTY size");
    let mut child = pty_process::Command::new(TSH)
        .args(["ssh", &format!("root@{}", nodename())])
        .env("SVC_HOME", &cluster.home)
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .spawn(pts)
        .expect("spawn tsh");
    // The remote shell sees a terminal (`test -t 0`) of the local size; the arithmetic proves
    // the output came from the shell, not from the echo of what was typed.
    pty.write_all(b"test -t 0 && echo remote-tty-$((40+2)) $(stty size)\r")
        .await
        .expect("type into the PTY");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    // Read until `want` is in; the PTY closes when tsh exits (EIO on Linux).
    async fn read_until(pty: &mut pty_process::Pty, seen: &mut Vec<u8>, buf: &mut [u8], want: &str) {
        while !String::from_utf8_lossy(seen).contains(want) {
            match pty.read(buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    }
    common::wait::within(
        common::wait::STEP,
        "the remote shell's `remote-tty-42 24 80` on the PTY",
        read_until(&mut pty, &mut seen, &mut buf, "remote-tty-42 24 80"),
    )
    .await;
    // The local window grows: tsh gets SIGWINCH and the remote PTY follows. The shell waits
    // (bounded) for the new size to arrive, then reports what it has.
    pty.resize(pty_process::Size::new(40, 100)).expect("PTY resize");
    pty.write_all(
        b"for i in $(seq 200); do [ \"$(stty size)\" = \"40 100\" ] && break; sleep 0.05; done; echo resized-$((1+1)) $(stty size); exit 7\r",
    )
    .await
    .expect("type into the PTY");
    // Everything until tsh exits and the PTY closes.
    common::wait::within(common::wait::STEP, "tsh ssh exiting and closing the PTY", async {
        while let Ok(n @ 1..) = pty.read(&mut buf).await {
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    let status = common::wait::within(common::wait::STEP, "tsh ssh exiting", child.wait())
        .await
        .expect("wait for tsh");
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("remote-tty-42 24 80"),
        "{text}\nsvc: {}",
        cluster.stderr()
    );
    assert!(text.contains("resized-2 40 100"), "{text}");
    assert_eq!(status.code(), Some(7), "{text}");
}

#[test]
fn openssh_reaches_the_node_through_tsh_proxy_ssh() {
    svc_testkit::require("ssh", "openssh-client");
    let cluster = Cluster::signed_in(PASSWORD);
    // `tsh login` wrote the key, its certificate and a known_hosts trusting the host CA.
    let keys = cluster.home.join("keys");
    let key = keys.join("key");
    for file in ["key-cert.pub", "known_hosts"] {
        assert!(keys.join(file).is_file(), "tsh login wrote {file}");
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the private key is private");
    let mut ssh = Command::new(svc_testkit::require("ssh", "openssh-client"));
    ssh.args(openssh_options(&cluster))
        .arg(format!("root@{}", nodename()))
        .arg("echo hello-openssh; exit 4");
    let out = common::wait::run_within(
        &mut ssh,
        common::wait::STEP,
        "OpenSSH's ssh through tsh proxy ssh",
    )
    .expect("run ssh");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello-openssh\n",
        "ssh stderr: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        cluster.stderr()
    );
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn tsh_login_with_cacert_keeps_the_trust_and_ssh_goes_inside_tls() {
    let cluster = Cluster::start("debug");
    cluster.add_user("bob", PASSWORD);
    let ca = cluster.data_dir.join("proxy-ca.pem");
    let proxy = format!("--proxy={}", cluster.web_addr);
    let cacert = format!("--cacert={}", ca.display());
    cluster
        .tsh(
            &["login", &proxy, "--user=bob", &cacert],
            Some(&format!("{PASSWORD}\n")),
        )
        .ok();
    let profile = std::fs::read_to_string(cluster.home.join("profile.json")).unwrap();
    assert!(
        profile.contains("BEGIN CERTIFICATE"),
        "the CA is kept in the profile"
    );
    let out = cluster.tsh(&["ssh", &format!("root@{}", nodename()), "echo tls"], None);
    assert_eq!(out.stdout, "tls\n", "{}", out.stderr);
    // The proxy saw ALPN `svc-proxy-ssh`, not plain SSH on the web port.
    let log = cluster.stderr();
    assert!(
        log.lines()
            .any(|l| l.contains("routing TLS connection") && l.contains("svc-proxy-ssh")),
        "{log}"
    );
}

#[test]
fn tsh_ls_lists_the_nodes_the_roles_allow() {
    let cluster = Cluster::signed_in(PASSWORD);
    let out = cluster.tsh(&["ls", "--format", "json"], None).ok();
    let nodes: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let names: Vec<&str> = nodes
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, [nodename().as_str()], "{}", out.stdout);
    let text = cluster.tsh(&["ls"], None).ok();
    assert!(text.stdout.contains(&nodename()), "{}", text.stdout);

    // A role that allows only nodes labelled env=prod sees none (the node has no labels).
    let role = "kind: role\nversion: v7\nmetadata:\n  name: prod-nodes\nspec:\n  allow:\n    logins: [root]\n    node_labels: {env: prod}\n";
    cluster
        .tctl_admin(
            &[
                "create",
                &cluster.write("prod-nodes.yaml", role).to_string_lossy(),
            ],
            None,
        )
        .ok();
    cluster
        .tctl_admin(
            &["users", "add", "carol", "--roles=prod-nodes", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    cluster.login("carol", PASSWORD).ok();
    let out = cluster.tsh(&["ls", "--format", "json"], None).ok();
    assert_eq!(out.stdout.trim(), "[]", "{}", out.stdout);
}

/// A one-page HTTP server on a free loopback port, on a thread of its own: every request gets
/// `body`. Returns the port.
fn http_server(body: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the HTTP server");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// `ssh -N <forward>` in the background, killed on drop.
struct Forwarding(std::process::Child);

/// A background process, killed on drop.
struct Background(std::process::Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Forwarding {
    fn start(cluster: &Cluster, login: &str, forward: &[&str]) -> Forwarding {
        let child = Command::new(svc_testkit::require("ssh", "openssh-client"))
            .args(openssh_options(cluster))
            .args(["-N", "-o", "ExitOnForwardFailure=yes"])
            .args(forward)
            .arg(format!("{login}@{}", nodename()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn ssh -N");
        Forwarding(child)
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs curl with `args` until it prints `want` (the forwarding may take a moment to listen).
fn curl_until(args: &[&str], want: &str, what: &str, cluster: &Cluster) {
    let curl = svc_testkit::require("curl", "curl");
    let mut last = String::new();
    let deadline = std::time::Instant::now() + common::wait::STEP;
    while std::time::Instant::now() < deadline {
        let out = common::wait::run_within(
            Command::new(&curl).args(["-sS", "--max-time", "20"]).args(args),
            common::wait::STEP,
            what,
        )
        .expect("run curl");
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && last.contains(want) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!(
        "{what}: curl never got {want:?}; last: {last}\nsvc: {}",
        cluster.stderr()
    );
}

fn free_port() -> u16 {
    svc_testkit::free_port("127.0.0.1")
}

#[test]
fn openssh_forwards_ports_local_dynamic_and_remote_through_the_node() {
    let cluster = Cluster::signed_in(PASSWORD);
    let web = http_server("forwarded-hello");

    // ssh -L: a local port carried to the HTTP server from the node.
    let local = free_port();
    let _l = Forwarding::start(
        &cluster,
        "root",
        &["-L", &format!("127.0.0.1:{local}:127.0.0.1:{web}")],
    );
    curl_until(
        &[&format!("http://127.0.0.1:{local}/")],
        "forwarded-hello",
        "ssh -L",
        &cluster,
    );

    // ssh -D: a SOCKS proxy whose connections the node makes (the name resolved there).
    let socks = free_port();
    let _d = Forwarding::start(&cluster, "root", &["-D", &format!("127.0.0.1:{socks}")]);
    curl_until(
        &[
            "--socks5-hostname",
            &format!("127.0.0.1:{socks}"),
            &format!("http://localhost:{web}/"),
        ],
        "forwarded-hello",
        "ssh -D",
        &cluster,
    );

    // ssh -R: the node listens (on its loopback) and carries connections back to us.
    let remote = free_port();
    let _r = Forwarding::start(
        &cluster,
        "root",
        &["-R", &format!("127.0.0.1:{remote}:127.0.0.1:{web}")],
    );
    curl_until(
        &[&format!("http://127.0.0.1:{remote}/")],
        "forwarded-hello",
        "ssh -R",
        &cluster,
    );

    // The same three with tsh ssh -N.
    let (l2, d2, r2) = (free_port(), free_port(), free_port());
    let _tsh = Background(
        Command::new(TSH)
            .env("SVC_HOME", &cluster.home)
            .env_remove("RUST_LOG")
            .args(["ssh", "-N"])
            .args(["-L", &format!("{l2}:127.0.0.1:{web}")])
            .args(["-D", &format!("127.0.0.1:{d2}")])
            .args(["-R", &format!("{r2}:127.0.0.1:{web}")])
            .arg(format!("root@{}", nodename()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn tsh ssh -N"),
    );
    curl_until(
        &[&format!("http://127.0.0.1:{l2}/")],
        "forwarded-hello",
        "tsh ssh -L",
        &cluster,
    );
    curl_until(
        &[
            "--socks5-hostname",
            &format!("127.0.0.1:{d2}"),
            &format!("http://localhost:{web}/"),
        ],
        "forwarded-hello",
        "tsh ssh -D",
        &cluster,
    );
    curl_until(
        &[&format!("http://127.0.0.1:{r2}/")],
        "forwarded-hello",
        "tsh ssh -R",
        &cluster,
    );
}

#[test]
fn port_forwarding_is_refused_for_a_role_with_port_forwarding_false() {
    let cluster = Cluster::start("info");
    let role = "kind: role\nversion: v7\nmetadata:\n  name: no-forwarding\nspec:\n  allow:\n    logins: [root]\n    node_labels:\n      '*': '*'\n  options:\n    port_forwarding: false\n";
    cluster
        .tctl_admin(
            &[
                "create",
                &cluster.write("no-forwarding.yaml", role).to_string_lossy(),
            ],
            None,
        )
        .ok();
    cluster
        .tctl_admin(
            &[
                "users",
                "add",
                "dave",
                "--roles=no-forwarding",
                "--password-stdin",
            ],
            Some(PASSWORD),
        )
        .ok();
    cluster.login("dave", PASSWORD).ok();
    let web = http_server("must-not-arrive");
    let ssh = svc_testkit::require("ssh", "openssh-client");
    let target = format!("root@{}", nodename());

    // Sessions still work.
    let out = common::wait::run_within(
        Command::new(&ssh)
            .args(openssh_options(&cluster))
            .arg(&target)
            .arg("echo session-ok"),
        common::wait::STEP,
        "ssh as dave",
    )
    .expect("run ssh");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "session-ok\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A direct-tcpip channel (ssh -W, as -L and -D open them) is refused.
    let out = common::wait::run_within(
        Command::new(&ssh)
            .args(openssh_options(&cluster))
            .args(["-W", &format!("127.0.0.1:{web}")])
            .arg(&target)
            .stdin(std::process::Stdio::null()),
        common::wait::STEP,
        "ssh -W as dave",
    )
    .expect("run ssh -W");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ssh -W must fail: {err}");
    assert!(err.contains("administratively prohibited"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("must-not-arrive"));

    // A remote forward (ssh -R) is refused.
    let out = common::wait::run_within(
        Command::new(&ssh)
            .args(openssh_options(&cluster))
            .args([
                "-N",
                "-o",
                "ExitOnForwardFailure=yes",
                "-R",
                &format!("127.0.0.1:{}:127.0.0.1:{web}", free_port()),
            ])
            .arg(&target)
            .stdin(std::process::Stdio::null()),
        common::wait::STEP,
        "ssh -R as dave",
    )
    .expect("run ssh -R");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ssh -R must fail: {err}");
    assert!(err.contains("remote port forwarding failed"), "{err}");

    // Each refusal is logged with the user and the role.
    let log = cluster.stderr();
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("port forwarding refused"))
        .collect();
    assert!(refusals.len() >= 2, "{log}");
    assert!(
        refusals
            .iter()
            .all(|l| l.contains("dave") && l.contains("no-forwarding")),
        "{refusals:#?}"
    );
}

/// `sha256sum` of a file.
fn sha256(path: &std::path::Path) -> String {
    let out = common::wait::run_within(
        Command::new(svc_testkit::require("sha256sum", "coreutils")).arg(path),
        common::wait::STEP,
        "sha256sum",
    )
    .expect("run sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A file of `mib` MiB of pseudo-random bytes.
fn random_file(path: &std::path::Path, mib: usize) {
    use rand::RngCore;
    let mut data = vec![0u8; mib << 20];
    rand::rng().fill_bytes(&mut data);
    std::fs::write(path, data).expect("write the test file");
}

#[test]
fn scp_and_sftp_copy_a_50_mib_file_both_ways() {
    let cluster = Cluster::signed_in(PASSWORD);
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("big.bin");
    random_file(&src, 50);
    let want = sha256(&src);
    let node = nodename();
    let remote = dir.path().join("on-node.bin");

    // scp (OpenSSH 9 speaks sftp to the `sftp` subsystem) up, then down again.
    let scp = svc_testkit::require("scp", "openssh-client");
    let back = dir.path().join("back.bin");
    for (from, to, what) in [
        (
            src.display().to_string(),
            format!("root@{node}:{}", remote.display()),
            "scp up",
        ),
        (
            format!("root@{node}:{}", remote.display()),
            back.display().to_string(),
            "scp down",
        ),
    ] {
        let started = std::time::Instant::now();
        let out = common::wait::run_within(
            Command::new(&scp)
                .args(openssh_options(&cluster))
                .arg(&from)
                .arg(&to),
            common::wait::STEP,
            what,
        )
        .expect("run scp");
        assert!(
            out.status.success(),
            "{what}: {}\nsvc: {}",
            String::from_utf8_lossy(&out.stderr),
            cluster.stderr()
        );
        // A figure for the record, not an assertion.
        eprintln!("{what}: 50 MiB in {:?}", started.elapsed());
    }
    assert_eq!(sha256(&remote), want, "scp up");
    assert_eq!(sha256(&back), want, "scp down");

    // Legacy scp (-O): the scp program on the node, through an exec session.
    let legacy = dir.path().join("legacy.bin");
    let out = common::wait::run_within(
        Command::new(&scp)
            .args(openssh_options(&cluster))
            .arg("-O")
            .arg(format!("root@{node}:{}", remote.display()))
            .arg(&legacy),
        common::wait::STEP,
        "scp -O down",
    )
    .expect("run scp -O");
    assert!(
        out.status.success(),
        "scp -O: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha256(&legacy), want, "scp -O down");
    assert!(
        cluster.stderr().contains("sftp session"),
        "scp used the sftp subsystem"
    );

    // tsh scp: up into a directory (the file keeps its name), then down.
    let remote_dir = dir.path().join("remote-dir");
    std::fs::create_dir(&remote_dir).expect("mkdir");
    let started = std::time::Instant::now();
    cluster
        .tsh(
            &[
                "scp",
                &src.to_string_lossy(),
                &format!("root@{node}:{}", remote_dir.display()),
            ],
            None,
        )
        .ok();
    eprintln!("tsh scp up: 50 MiB in {:?}", started.elapsed());
    assert_eq!(sha256(&remote_dir.join("big.bin")), want, "tsh scp up");
    let tsh_back = dir.path().join("tsh-back.bin");
    let started = std::time::Instant::now();
    cluster
        .tsh(
            &[
                "scp",
                &format!("root@{node}:{}", remote_dir.join("big.bin").display()),
                &tsh_back.to_string_lossy(),
            ],
            None,
        )
        .ok();
    eprintln!("tsh scp down: 50 MiB in {:?}", started.elapsed());
    assert_eq!(sha256(&tsh_back), want, "tsh scp down");

    // sftp with a batch: put, get, ls, rm.
    let sftp = svc_testkit::require("sftp", "openssh-client");
    let (put, got) = (dir.path().join("sftp-put.bin"), dir.path().join("sftp-got.bin"));
    let batch = cluster.write(
        "sftp.batch",
        &format!(
            "put {} {}\nget {} {}\nls -l {}\nrm {}\n",
            src.display(),
            put.display(),
            put.display(),
            got.display(),
            put.display(),
            remote.display()
        ),
    );
    let out = common::wait::run_within(
        Command::new(&sftp)
            .args(openssh_options(&cluster))
            .arg("-b")
            .arg(&batch)
            .arg(format!("root@{node}")),
        common::wait::STEP,
        "sftp -b",
    )
    .expect("run sftp");
    assert!(
        out.status.success(),
        "sftp: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        cluster.stderr()
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sftp-put.bin"),
        "ls -l: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(sha256(&got), want, "sftp put then get");
    assert!(!remote.exists(), "sftp rm removed the file");
}

#[test]
fn sftp_reads_only_what_the_login_user_may_read() {
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        rustix::process::getuid().as_raw(),
        0,
        "this test runs as root (the agent switches to the login)"
    );
    let cluster = Cluster::start("info");
    cluster
        .tctl_admin(
            &[
                "users",
                "add",
                "erin",
                "--roles=access",
                "--logins=root,nobody",
                "--password-stdin",
            ],
            Some(PASSWORD),
        )
        .ok();
    cluster.login("erin", PASSWORD).ok();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (secret, public) = (dir.path().join("secret.txt"), dir.path().join("public.txt"));
    std::fs::write(&secret, "root-only\n").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::write(&public, "for-everyone\n").expect("write");
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let sftp = svc_testkit::require("sftp", "openssh-client");
    let get = |login: &str, file: &std::path::Path, to: &std::path::Path| {
        let batch = cluster.write("get.batch", &format!("get {} {}\n", file.display(), to.display()));
        common::wait::run_within(
            Command::new(&sftp)
                .args(openssh_options(&cluster))
                .arg("-b")
                .arg(&batch)
                .arg(format!("{login}@{}", nodename())),
            common::wait::STEP,
            "sftp get",
        )
        .expect("run sftp")
    };
    let out_dir = tempfile::tempdir().expect("tempdir");
    // As nobody: the world-readable file comes, the root-only one is refused.
    let got = out_dir.path().join("public");
    let out = get("nobody", &public, &got);
    assert!(
        out.status.success(),
        "{}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        cluster.stderr()
    );
    assert_eq!(
        std::fs::read_to_string(&got).unwrap_or_default(),
        "for-everyone\n"
    );
    let stolen = out_dir.path().join("stolen");
    let out = get("nobody", &secret, &stolen);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "nobody must not read the root-only file: {err}"
    );
    assert!(err.contains("Permission denied"), "{err}");
    assert!(
        std::fs::read_to_string(&stolen).unwrap_or_default().is_empty(),
        "nothing of the secret arrived"
    );
    // As root the same file comes.
    let out = get("root", &secret, &stolen);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&stolen).unwrap_or_default(),
        "root-only\n"
    );
}

#[test]
fn agent_forwarding_follows_the_role_option_forward_agent() {
    let ssh = svc_testkit::require("ssh", "openssh-client");
    let (agent_bin, add, keygen) = (
        svc_testkit::require("ssh-agent", "openssh-client"),
        svc_testkit::require("ssh-add", "openssh-client"),
        svc_testkit::require("ssh-keygen", "openssh-client"),
    );
    let cluster = Cluster::start("info");
    let role = "kind: role\nversion: v7\nmetadata:\n  name: agent-forwarding\nspec:\n  allow:\n    logins: [root]\n    node_labels:\n      '*': '*'\n  options:\n    forward_agent: true\n";
    cluster
        .tctl_admin(
            &[
                "create",
                &cluster.write("agent-forwarding.yaml", role).to_string_lossy(),
            ],
            None,
        )
        .ok();
    cluster
        .tctl_admin(
            &[
                "users",
                "add",
                "frank",
                "--roles=agent-forwarding",
                "--password-stdin",
            ],
            Some(PASSWORD),
        )
        .ok();
    cluster.add_user("gina", PASSWORD);

    // A local agent holding a key with a recognisable comment.
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("agent.sock");
    let _agent = Background(
        Command::new(&agent_bin)
            .arg("-D")
            .arg("-a")
            .arg(&sock)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn ssh-agent"),
    );
    common::wait::wait_until(common::wait::STEP, "the ssh-agent socket", || sock.exists());
    let key = dir.path().join("forwarded");
    let out = common::wait::run_within(
        Command::new(&keygen)
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "forwarded-key-comment",
                "-f",
            ])
            .arg(&key),
        common::wait::STEP,
        "ssh-keygen",
    )
    .expect("run ssh-keygen");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = common::wait::run_within(
        Command::new(&add).env("SSH_AUTH_SOCK", &sock).arg(&key),
        common::wait::STEP,
        "ssh-add",
    )
    .expect("run ssh-add");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let list_keys_on_node = || {
        common::wait::run_within(
            Command::new(&ssh)
                .env("SSH_AUTH_SOCK", &sock)
                .args(openssh_options(&cluster))
                .arg("-A")
                .arg(format!("root@{}", nodename()))
                .arg("ssh-add -l; echo status=$?"),
            common::wait::STEP,
            "ssh -A",
        )
        .expect("run ssh -A")
    };
    // frank's role sets forward_agent: true: the node's ssh-add sees the local agent's key.
    cluster.login("frank", PASSWORD).ok();
    let out = list_keys_on_node();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("forwarded-key-comment") && text.contains("status=0"),
        "{text}\n{}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        cluster.stderr()
    );
    // gina has only the access role (forward_agent defaults to false): no agent on the node.
    cluster.login("gina", PASSWORD).ok();
    let out = list_keys_on_node();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("forwarded-key-comment") && text.contains("status=2"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = cluster.stderr();
    assert!(
        log.lines()
            .any(|l| l.contains("agent forwarding refused") && l.contains("gina") && l.contains("access")),
        "{log}"
    );
}

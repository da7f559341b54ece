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
    let (key, cert, known_hosts) = (
        keys.join("key"),
        keys.join("key-cert.pub"),
        keys.join("known_hosts"),
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the private key is private");
    let home = cluster.home.to_string_lossy().into_owned();
    let mut ssh = Command::new(svc_testkit::require("ssh", "openssh-client"));
    ssh.args([
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
    ])
    .arg("-i")
    .arg(&key)
    .arg("-o")
    .arg(format!("CertificateFile={}", cert.display()))
    .arg("-o")
    .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
    .args([
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
    ])
    .arg("-o")
    .arg(format!(
        "ProxyCommand=env SVC_HOME={home} {TSH} proxy ssh %r@%h:%p"
    ))
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

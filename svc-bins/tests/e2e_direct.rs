//! End to end: an agent that joins the Auth Service directly (`svc.auth_server`, no
//! `svc.proxy_server`) — the real `svc start` with `auth_service` and `proxy_service`
//! disabled — opens its own SSH, Kubernetes and Windows Desktop listeners (on 127.0.0.1:0,
//! printed in its banner), and the cluster's proxy dials them: no reverse tunnel. The same
//! client commands as through a tunnel: `tsh ssh` runs a command with its exit status, `kubectl`
//! with the kubeconfig from `tsh kube login` reaches nginx standing in for the API server, and
//! `tsh proxy desktop` carries raw TCP to a `socat` echo server. The Application Service
//! refuses this mode with a configuration error.

mod common;

use svc_testkit::wait::OutputWithin;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::agent::{Agent, curl};
use common::resources::{KubeApi, PASSWORD, User, echo_server, require};
use common::{Cluster, SVC};

/// Starts `svc start --config CONFIG` as a directly joined agent (no HTTP proxy).
fn start_agent(config: &Path, stderr: PathBuf) -> Agent {
    let mut command = Command::new(SVC);
    command
        .args(["start", "--config"])
        .arg(config)
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY");
    Agent::start(command, stderr)
}

#[test]
fn a_directly_joined_agent_serves_ssh_kubernetes_and_desktops_on_its_own_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let api_token = "direct-agent-token";
    let api = KubeApi::start(dir.path(), api_token);
    let (api_port, ca_file, token_file) = (api.port, &api.ca_file, &api.token_file);
    let (_echo, echo_port) = echo_server();

    let cluster = Cluster::start_lab("info");
    cluster.add_alice(PASSWORD);
    let join = cluster
        .tctl_admin(
            &[
                "tokens",
                "add",
                "--type=node,kube,windows_desktop",
                "--format",
                "json",
            ],
            None,
        )
        .ok();
    let join: serde_json::Value = serde_json::from_str(&join.stdout).expect("token json");
    let config = cluster.write(
        "direct.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: edge\n  data_dir: {data}\n  auth_server: {auth}\n  auth_token: {token}\n  ca_pin: {pin}\n  diag_addr: 127.0.0.1:0\n\
auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n\
ssh_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n\
kubernetes_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n  kube_cluster_name: edge-k8s\n  api_url: https://127.0.0.1:{api_port}\n  ca_file: {ca}\n  token_file: {tok}\n\
windows_desktop_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n  hosts:\n  - name: win\n    addr: 127.0.0.1:{echo_port}\n",
            data = cluster.path().join("direct-data").display(),
            auth = cluster.auth_addr,
            token = join["token"].as_str().unwrap(),
            pin = join["ca_pin"].as_str().unwrap(),
            ca = ca_file.display(),
            tok = token_file.display(),
        ),
    );
    let agent = start_agent(&config, cluster.path().join("direct.stderr"));
    for section in ["ssh_service", "kubernetes_service", "windows_desktop_service"] {
        assert!(
            agent.listeners.contains_key(section),
            "no {section} listener in the banner: {:?}\n{}",
            agent.listeners,
            agent.log()
        );
    }
    // Ready: listeners bound and a heartbeat accepted; no tunnel at all.
    let diag = agent.diag.clone().expect("the diag address in the banner");
    assert_eq!(curl(&format!("http://{diag}/readyz")).0, "200");

    // `tsh ssh` by node name and by host ID: the proxy dials the node's 3022 listener.
    cluster.login("alice", PASSWORD).ok();
    let out = cluster.tsh(&["ssh", "root@edge", "echo direct; exit 7"], None);
    assert_eq!(
        out.stdout,
        "direct\n",
        "tsh: {}\nagent: {}\nsvc: {}",
        out.stderr,
        agent.log(),
        cluster.stderr()
    );
    assert_eq!(out.status.code(), Some(7), "{}", out.stderr);
    let by_id = cluster.tsh(&["ssh", &format!("root@{}", agent.host_id), "echo by id"], None);
    assert_eq!(by_id.stdout, "by id\n", "{}", by_id.stderr);

    // The Kubernetes route: the proxy dials the agent's 3026 listener (mutual TLS). kubectl
    // with the kubeconfig from `tsh kube login`, as through a tunnel.
    let alice = User::login(&cluster, "alice");
    assert!(alice.tsh(&["kube", "ls"]).contains("edge-k8s"));
    let export = alice.tsh(&["kube", "login", "edge-k8s"]);
    let kubeconfig = export
        .trim()
        .strip_prefix("export KUBECONFIG=")
        .expect("export line")
        .to_owned();
    let out = Command::new(require("kubectl", "kubectl"))
        .args([
            "--kubeconfig",
            &kubeconfig,
            "get",
            "--raw",
            "/api/v1/namespaces/default",
        ])
        .output_within(common::wait::STEP, "kubectl get --raw")
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl: {}\nagent: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        agent.log(),
        cluster.stderr()
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["user"], "alice");
    assert_eq!(json["path"], "/api/v1/namespaces/default");

    // The desktop: raw TCP through `tsh proxy desktop`, the proxy dialing the 3028 listener.
    let (_desk, desk_port, desk_err) = alice.proxy("desktop", "win").expect("tsh proxy desktop");
    let mut s = TcpStream::connect(("127.0.0.1", desk_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"rdp bytes").unwrap();
    let mut buf = [0u8; 9];
    s.read_exact(&mut buf).unwrap_or_else(|e| {
        panic!(
            "{e}\ntsh: {}\nagent: {}\nsvc: {}",
            std::fs::read_to_string(&desk_err).unwrap_or_default(),
            agent.log(),
            cluster.stderr()
        )
    });
    assert_eq!(&buf, b"rdp bytes");
}

#[test]
fn a_direct_listener_refuses_anyone_but_the_clusters_proxy() {
    let (_echo, echo_port) = echo_server();
    let cluster = Cluster::start_lab("info");
    let join = cluster
        .tctl_admin(
            &["tokens", "add", "--type=windows_desktop", "--format", "json"],
            None,
        )
        .ok();
    let join: serde_json::Value = serde_json::from_str(&join.stdout).expect("token json");
    let config = cluster.write(
        "direct.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: desk\n  data_dir: {data}\n  auth_server: {auth}\n  auth_token: {token}\n  ca_pin: {pin}\n\
auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n\
windows_desktop_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n  hosts:\n  - name: win\n    addr: 127.0.0.1:{echo_port}\n",
            data = cluster.path().join("direct-data").display(),
            auth = cluster.auth_addr,
            token = join["token"].as_str().unwrap(),
            pin = join["ca_pin"].as_str().unwrap(),
        ),
    );
    let agent = start_agent(&config, cluster.path().join("direct.stderr"));
    let addr = agent.listeners["windows_desktop_service"].clone();
    // Plain TCP with a dial request: not TLS, so nothing is forwarded.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(b"{\"address\":\"win\",\"server_id\":\"x\",\"conn_type\":\"windows_desktop\",\"client_src_addr\":\"\",\"client_dst_addr\":\"\"}\n");
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(!got.starts_with(b"ok"), "{:?}", String::from_utf8_lossy(&got));
    // TLS with a user's certificate (not a proxy's host certificate): refused too.
    cluster
        .tctl_admin(
            &["users", "add", "alice", "--roles=access", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    let alice = User::login(&cluster, "alice");
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(alice.home.join("profile.json")).unwrap()).unwrap();
    let cert = alice.home.join("user-cert.pem");
    let key = alice.home.join("user-key.pem");
    std::fs::write(&cert, profile["identity"]["tls_cert_pem"].as_str().unwrap()).unwrap();
    std::fs::write(&key, profile["identity"]["tls_key_pem"].as_str().unwrap()).unwrap();
    let out = Command::new(require("openssl", "openssl"))
        .args(["s_client", "-quiet", "-connect", &addr, "-cert"])
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(b"{\"address\":\"win\",\"server_id\":\"x\",\"conn_type\":\"windows_desktop\",\"client_src_addr\":\"\",\"client_dst_addr\":\"\"}\n")?;
            Ok(common::wait::output_within(c, common::wait::STEP, "openssl s_client to the desktop listener"))
        })
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.starts_with("ok"),
        "a user certificate was served: {stdout}"
    );
    assert!(
        agent.log().contains("refused a direct connection"),
        "{}",
        agent.log()
    );
}

/// A TCP listener on 127.0.0.1 that counts the connections it accepts and the bytes it reads.
fn trap() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            // A connection is a failure of the rule even before a byte arrives.
            count.fetch_add(1, Ordering::SeqCst);
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = [0u8; 4096];
            while let Ok(n) = conn.read(&mut buf) {
                if n == 0 {
                    break;
                }
                count.fetch_add(n, Ordering::SeqCst);
            }
        }
    });
    (port, seen)
}

/// The attacker: an agent holding a valid token announces, as its SSH listener, a local
/// service of the Auth/proxy host (here a listener on 127.0.0.1). Without the lab opt-in the
/// Auth Service refuses the announcement (and logs it), the listener never receives a
/// connection, and a user's `tsh ssh` to the node is refused with the node and the reason.
#[test]
fn a_rogue_direct_addr_pointing_at_a_local_listener_gets_no_bytes() {
    use std::sync::atomic::Ordering;
    let (trap_port, seen) = trap();
    let cluster = Cluster::signed_in(PASSWORD);
    let join = cluster
        // The token grants the name, so the agent joins and its announcement is what is
        // judged (a name the token does not grant refuses the join itself).
        .tctl_admin(
            &[
                "tokens",
                "add",
                "--type=node",
                "--extra-names=127.0.0.1",
                "--format",
                "json",
            ],
            None,
        )
        .ok();
    let join: serde_json::Value = serde_json::from_str(&join.stdout).expect("token json");
    let config = cluster.write(
        "rogue.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: rogue\n  data_dir: {data}\n  auth_server: {auth}\n  auth_token: {token}\n  ca_pin: {pin}\n\
auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n\
ssh_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n  public_addr: 127.0.0.1:{trap_port}\n",
            data = cluster.path().join("rogue-data").display(),
            auth = cluster.auth_addr,
            token = join["token"].as_str().unwrap(),
            pin = join["ca_pin"].as_str().unwrap(),
        ),
    );
    let agent = start_agent(&config, cluster.path().join("rogue.stderr"));
    common::wait::wait_until(
        Duration::from_secs(60),
        "the Auth Service logging the refused announcement",
        || cluster.stderr().contains("refused an agent's announced listener"),
    );
    let log = cluster.stderr();
    assert!(
        log.contains(&format!("127.0.0.1:{trap_port}")) && log.contains("loopback"),
        "the log names the address and the reason: {log}"
    );
    let refused = cluster.tsh(&["ssh", "root@rogue", "echo reached"], None);
    refused.refused(
        &format!(
            "the proxy could not reach rogue: node \"rogue\" announced the listener 127.0.0.1:{trap_port} and the Auth Service refused it"
        ),
        "tsh ssh to a node whose announced listener was refused",
        &cluster,
    );
    refused.refused("loopback", "the refusal names the reason", &cluster);
    assert!(!refused.stdout.contains("reached"), "{}", refused.stdout);
    // Give a stray dial time to land before looking.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "the local listener received a connection or bytes\nagent: {}",
        agent.log()
    );
}

#[test]
fn the_application_service_refuses_a_direct_join() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "version: v1\nsvc:\n  nodename: apps\n  data_dir: {}\n  auth_server: 127.0.0.1:9\n\
auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n\
app_service:\n  enabled: true\n  apps:\n  - name: web\n    uri: http://127.0.0.1:9\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    // Expected to fail at start-up: one that started instead would run until killed.
    let out = common::wait::run_within(
        Command::new(SVC).args(["start", "--config"]).arg(&config),
        common::wait::STEP,
        "svc start with a refused configuration exiting",
    )
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is reachable only through a reverse tunnel via the Proxy Service")
            && err.contains("svc.auth_server without svc.proxy_server"),
        "{err}"
    );
}

/// Reads until the server closes `tcp`; returns when that happened.
async fn closed_at(mut tcp: tokio::net::TcpStream) -> tokio::time::Instant {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 512];
    loop {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return tokio::time::Instant::now(),
            Ok(_) => {}
        }
    }
}

/// The directly joined agent's listeners run the shared accept loop: silent peers on its SSH
/// listener (3022) are cut at the SSH deadline (10 s) and on its Windows Desktop listener
/// (3028) at the TLS deadline (15 s), while an honest `tsh ssh` to the node works during the
/// flood.
#[test]
fn silent_peers_on_the_direct_listeners_are_cut_while_tsh_ssh_works() {
    use anyhow::Context;
    /// `Tunables::auth_timeout` and `tunnel::DIRECT_DIAL_TIMEOUT`.
    const SSH_AUTH: Duration = Duration::from_secs(10);
    const TLS: Duration = Duration::from_secs(15);
    /// Slack for a loaded 2-core machine.
    const SLACK: Duration = Duration::from_secs(25);
    let (_echo, echo_port) = echo_server();
    let cluster = Cluster::start_lab("info");
    cluster.add_alice(PASSWORD);
    let join = cluster
        .tctl_admin(
            &["tokens", "add", "--type=node,windows_desktop", "--format", "json"],
            None,
        )
        .ok();
    let join: serde_json::Value = serde_json::from_str(&join.stdout).expect("token json");
    let config = cluster.write(
        "direct.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: edge\n  data_dir: {data}\n  auth_server: {auth}\n  auth_token: {token}\n  ca_pin: {pin}\n\
auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n\
ssh_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n\
windows_desktop_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n  hosts:\n  - name: win\n    addr: 127.0.0.1:{echo_port}\n",
            data = cluster.path().join("direct-data").display(),
            auth = cluster.auth_addr,
            token = join["token"].as_str().unwrap(),
            pin = join["ca_pin"].as_str().unwrap(),
        ),
    );
    let agent = start_agent(&config, cluster.path().join("direct.stderr"));
    let ssh = agent.listeners["ssh_service"].clone();
    let desk = agent.listeners["windows_desktop_service"].clone();
    cluster.login("alice", PASSWORD).ok();
    let warm = cluster.tsh(&["ssh", "root@edge", "echo warm"], None);
    assert_eq!(warm.stdout, "warm\n", "{}\nagent: {}", warm.stderr, agent.log());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (at_ssh, at_desk, connected) = rt
        .block_on(async {
            let (mut at_ssh, mut at_desk) = (Vec::new(), Vec::new());
            for i in 0..300 {
                let tcp = tokio::net::TcpStream::connect(&ssh)
                    .await
                    .with_context(|| format!("SSH flood peer {i} connecting to {ssh}"))?;
                at_ssh.push(tokio::spawn(closed_at(tcp)));
                let tcp = tokio::net::TcpStream::connect(&desk)
                    .await
                    .with_context(|| format!("desktop flood peer {i} connecting to {desk}"))?;
                at_desk.push(tokio::spawn(closed_at(tcp)));
            }
            anyhow::Ok((at_ssh, at_desk, tokio::time::Instant::now()))
        })
        .unwrap();

    // The honest client during the flood, through the proxy to the node's own listener.
    let honest = cluster.tsh(&["ssh", "root@edge", "echo honest"], None);
    assert_eq!(
        honest.stdout,
        "honest\n",
        "tsh ssh during the flood: {}\nagent: {}",
        honest.stderr,
        agent.log()
    );

    rt.block_on(async {
        for (what, peers, deadline) in [
            (
                "silent peers on the direct SSH listener",
                at_ssh,
                connected + SSH_AUTH,
            ),
            (
                "silent peers on the direct desktop listener",
                at_desk,
                connected + TLS,
            ),
        ] {
            let n = peers.len();
            let ends = tokio::time::timeout_at(deadline + SLACK, futures_util::future::join_all(peers))
                .await
                .with_context(|| format!("{what}: not all {n} were closed by their deadline + {SLACK:?}"))?;
            for end in ends {
                let end = end?;
                assert!(
                    end <= deadline + SLACK,
                    "{what}: one was closed {:?} after its deadline",
                    end - deadline
                );
            }
        }
        anyhow::Ok(())
    })
    .unwrap();
    let after = cluster.tsh(&["ssh", "root@edge", "echo after"], None);
    assert_eq!(after.stdout, "after\n", "{}", after.stderr);
}

/// `tctl tokens add --extra-names`: a token may grant exact extra certificate names, never a
/// wildcard or a name of the cluster itself; what it grants is shown with the token.
#[test]
fn tctl_grants_exact_extra_names_only() {
    let cluster = Cluster::start("info");
    for (names, why) in [
        ("*.internal", "wildcard certificate names are not allowed"),
        ("e2e.test", "it is a name of the cluster's Proxy or Auth Service"),
    ] {
        let out = cluster.tctl_admin(
            &["tokens", "add", "--type=node", &format!("--extra-names={names}")],
            None,
        );
        out.refused(why, &format!("tctl tokens add --extra-names={names}"), &cluster);
    }
    let out = cluster
        .tctl_admin(
            &[
                "tokens",
                "add",
                "--type=node",
                "--extra-names=edge-1.internal",
                "--format",
                "json",
            ],
            None,
        )
        .ok();
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    assert_eq!(json["extra_names"], serde_json::json!(["edge-1.internal"]));
    let listed = cluster.tctl_admin(&["get", "token", "--with-secrets"], None).ok();
    assert!(
        listed.stdout.contains("extra_names") && listed.stdout.contains("edge-1.internal"),
        "{}",
        listed.stdout
    );
}

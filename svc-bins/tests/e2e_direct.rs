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

    let cluster = Cluster::start("info");
    cluster
        .tctl_admin(
            &[
                "users",
                "add",
                "alice",
                "--roles=access",
                "--logins=root",
                "--password-stdin",
            ],
            Some(PASSWORD),
        )
        .ok();
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
    let cluster = Cluster::start("info");
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

//! End to end: a standalone agent — the real `svc start` with `auth_service` and
//! `proxy_service` disabled — joins a cluster run by another `svc start` with a token from
//! `tctl tokens add`, and serves `tsh ssh`.
//!
//! The firewall test: the agent runs in a network namespace whose only way out is a tinyproxy
//! with basic auth (given through `HTTPS_PROXY` with credentials); it has no listening port and
//! no route to the proxy, yet it joins, heartbeats and keeps its reverse tunnel through
//! tinyproxy, and `tsh ssh` reaches it — with the tunnel on the single TLS-routed port and on the
//! separate tunnel port. Restarted without its token, it comes back with its saved identity.
//!
//! In Kubernetes (the chart sets `SVC_KUBE_NAMESPACE` and `SVC_KUBE_SHARED_STATE_SECRET`) the
//! agent writes the maintenance schedule to its shared-state Secret, here on the fake API server.

mod common;
#[path = "../../svc-net/tests/support/netns.rs"]
mod netns;
#[path = "../../svc-update/tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;

use common::agent::{Agent, curl};
use common::{Cluster, SVC};
use netns::{Net, Tinyproxy};

const PASSWORD: &str = "correct-horse-battery";

/// A join token and the CA pin from `tctl tokens add --format json`.
fn token(cluster: &Cluster, kind: &str) -> (String, String) {
    let out = cluster
        .tctl_admin(
            &["tokens", "add", &format!("--type={kind}"), "--format", "json"],
            None,
        )
        .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    (
        v["token"].as_str().expect("token").to_owned(),
        v["ca_pin"].as_str().expect("ca_pin").to_owned(),
    )
}

/// The agent's svc.yaml: only the SSH Service, joining through `proxy` (and `auth` directly,
/// when given).
fn agent_yaml(
    data: &Path,
    name: &str,
    proxy: &str,
    auth: Option<&str>,
    token: Option<(&str, &str)>,
) -> String {
    let mut svc = format!(
        "version: v1\nsvc:\n  nodename: {name}\n  data_dir: {}\n  proxy_server: {proxy}\n",
        data.display()
    );
    if let Some(auth) = auth {
        svc.push_str(&format!("  auth_server: {auth}\n"));
    }
    if let Some((token, pin)) = token {
        svc.push_str(&format!("  auth_token: {token}\n  ca_pin: {pin}\n"));
    }
    svc + "auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n"
}

fn signed_in(cluster: &Cluster) {
    cluster.add_alice(PASSWORD);
    cluster.login("alice", PASSWORD).ok();
}

#[test]
fn an_agent_behind_an_http_proxy_only_serves_tsh_ssh() {
    let net = Net::create();
    let tiny = Tinyproxy::start(net.host_ip);
    let ip = net.proxy_ip;
    for separate in [false, true] {
        let services = if separate {
            format!(
                "auth_service:\n  listen_addr: {ip}:0\n  cluster_name: fw.test\n  proxy_listener_mode: separate\nproxy_service:\n  web_listen_addr: {ip}:0\n  tunnel_listen_addr: {ip}:0\n  listen_addr: {ip}:0\n"
            )
        } else {
            format!(
                "auth_service:\n  listen_addr: {ip}:0\n  cluster_name: fw.test\nproxy_service:\n  web_listen_addr: {ip}:0\n"
            )
        };
        let cluster = Cluster::start_with(tempfile::tempdir().unwrap(), "info", &services);
        signed_in(&cluster);
        let name = if separate { "fw-separate" } else { "fw-tls" };
        let (token, pin) = token(&cluster, "node");
        let data = cluster.path().join("agent-data");
        // Without TLS routing the Auth API is not on the web port: the agent joins it directly
        // (through tinyproxy too) and dials the tunnel port the ping names.
        let auth = separate.then_some(cluster.auth_addr.as_str());
        let config = cluster.write(
            "agent.yaml",
            &agent_yaml(&data, name, &cluster.web_addr, auth, Some((&token, &pin))),
        );
        let agent_cmd = |config: &Path| {
            let mut c = net.command(SVC);
            c.args(["start", "--insecure", "--config"])
                .arg(config)
                .env("HTTPS_PROXY", tiny.url(net.host_ip));
            c
        };
        let web_port: u16 = cluster.web_addr.rsplit_once(':').unwrap().1.parse().unwrap();
        assert!(
            !net.can_reach(ip, web_port),
            "the namespace must have no route to the proxy"
        );
        let agent = Agent::start(agent_cmd(&config), cluster.path().join("agent.stderr"));

        let target = format!("root@{name}");
        let out = cluster.tsh(&["ssh", &target, "echo through the firewall; exit 9"], None);
        assert_eq!(
            out.stdout,
            "through the firewall\n",
            "tsh: {}\nagent: {}\nsvc: {}",
            out.stderr,
            agent.log(),
            cluster.stderr()
        );
        assert_eq!(out.status.code(), Some(9), "{}", out.stderr);
        // By host ID too.
        let by_id = cluster.tsh(&["ssh", &format!("root@{}", agent.host_id), "hostname"], None);
        assert!(by_id.status.success(), "{}", by_id.stderr);

        // Everything went through tinyproxy: the join and heartbeats (web port, or the Auth
        // port without TLS routing) and the tunnel (web port, or the tunnel port).
        let log = tiny.log();
        assert!(log.contains(&format!("{ip}:{web_port}")), "tinyproxy log:\n{log}");
        if separate {
            let auth_port = cluster.auth_addr.rsplit_once(':').unwrap().1;
            assert!(
                log.contains(&format!("{ip}:{auth_port}")),
                "tinyproxy log:\n{log}"
            );
        }
        assert_eq!(net.listening(), "", "the agent must have no listening socket");
        // No secret in the agent's log: not the token, not the proxy password.
        let agent_log = agent.log();
        assert!(!agent_log.contains(&token), "the join token leaked:\n{agent_log}");
        assert!(
            !agent_log.contains(netns::PROXY_PASSWORD),
            "the proxy password leaked:\n{agent_log}"
        );
        // The agent is in the inventory under its name.
        let inventory = cluster.tctl_admin(&["inventory", "ls"], None).ok();
        let uuid = agent.host_id.split('.').next().unwrap();
        assert!(
            inventory.stdout.contains(uuid) && inventory.stdout.contains(name),
            "{}",
            inventory.stdout
        );

        // Restarted without the token (spent? kept? it does not matter): the saved identity.
        let host_id = agent.host_id.clone();
        drop(agent);
        let config = cluster.write(
            "agent-again.yaml",
            &agent_yaml(&data, name, &cluster.web_addr, auth, None),
        );
        let again = Agent::start(agent_cmd(&config), cluster.path().join("agent-again.stderr"));
        assert_eq!(again.host_id, host_id, "the same identity after a restart");
        let out = cluster.tsh(&["ssh", &target, "echo back"], None);
        assert_eq!(
            out.stdout,
            "back\n",
            "tsh: {}\nagent: {}",
            out.stderr,
            again.log()
        );
    }
}

#[test]
fn an_agent_without_a_token_or_identity_says_what_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        agent_yaml(&dir.path().join("data"), "lonely", "127.0.0.1:9", None, None),
    )
    .unwrap();
    // Expected to fail at start-up: one that started instead would run until killed.
    let out = common::wait::run_within(
        Command::new(SVC).args(["start", "--config"]).arg(&config),
        common::wait::STEP,
        "svc start of an agent that cannot join exiting",
    )
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("svc.auth_token is required to join the cluster at 127.0.0.1:9"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_in_kubernetes_writes_its_schedule_to_the_shared_state_secret() {
    use support::fake_apiserver::FakeApiServer;
    let api = FakeApiServer::start().await;
    let cluster = Cluster::start("info");
    let maintenance = cluster.write(
        "maintenance.yaml",
        "kind: cluster_maintenance_config\nversion: v1\nmetadata:\n  name: cluster-maintenance-config\nspec:\n  agent_upgrades:\n    utc_start_hour: 4\n    weekdays: [Mon, Tue, Wed, Thu, Fri, Sat, Sun]\n",
    );
    cluster
        .tctl_admin(&["create", &maintenance.to_string_lossy()], None)
        .ok();
    let (token, pin) = token(&cluster, "node");
    let data = cluster.path().join("agent-data");
    let config = cluster.write(
        "agent.yaml",
        &agent_yaml(&data, "kube-agent", &cluster.web_addr, None, Some((&token, &pin)))
            .replace("svc:\n", "svc:\n  diag_addr: 127.0.0.1:0\n"),
    );
    let kubeconfig = cluster.write("kubeconfig", &api.kubeconfig("svc"));
    let mut command = Command::new(SVC);
    command
        .args(["start", "--insecure", "--config"])
        .arg(&config)
        .env("KUBECONFIG", &kubeconfig)
        .env("SVC_KUBE_NAMESPACE", "svc")
        .env("SVC_KUBE_SHARED_STATE_SECRET", "svc-agent-shared-state")
        .env("SVC_UPGRADER", "kube")
        .env("SVC_UPGRADER_VERSION", "17.0.0")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY");
    let agent = Agent::start(command, cluster.path().join("agent.stderr"));
    let client = api.client("svc");
    let mut windows = Vec::new();
    for _ in 0..600 {
        windows = svc_update::kube::schedule::read_schedule(client.clone(), "svc", "svc-agent-shared-state")
            .await
            .expect("read the schedule");
        if !windows.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        !windows.is_empty(),
        "no schedule in the secret; agent log:\n{}",
        agent.log()
    );
    for w in &windows {
        let start = time::OffsetDateTime::from(w.start);
        assert_eq!(start.hour(), 4, "{w:?}");
    }
    // The chart's probes: /healthz, /readyz (a tunnel is up), /metrics.
    let diag = agent.diag.clone().expect("the diag address in the banner");
    let (status, _) = curl(&format!("http://{diag}/healthz"));
    assert_eq!(status, "200");
    let (status, _) = curl(&format!("http://{diag}/readyz"));
    assert_eq!(status, "200");
    let (status, metrics) = curl(&format!("http://{diag}/metrics"));
    assert_eq!(status, "200");
    assert!(metrics.contains("svc_tunnels_connected 1"), "{metrics}");
    assert!(!metrics.contains("svc_heartbeats_total 0"), "{metrics}");
    // The inventory reports the Kubernetes updater.
    let inventory = cluster
        .tctl_admin(&["inventory", "ls", "--upgrader=kube"], None)
        .ok();
    assert!(inventory.stdout.contains("kube-agent"), "{}", inventory.stdout);
}

//! End to end, with the real binaries: `svc` stopped with SIGTERM drains its proxy. A
//! standalone agent (`svc start` with only the SSH Service) holds its tunnel; a `tsh ssh`
//! session is running when SIGTERM arrives; the proxy stops accepting, asks the agent over the
//! tunnel to reconnect elsewhere, leaves the cluster's proxy registry, lets the session finish
//! (bounded by `proxy_service.shutdown_drain_timeout`) and exits 0. Started again on the same
//! ports and data, the agent's tunnel comes back on its own and `tsh ssh` works again.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{Cluster, SVC};

const PASSWORD: &str = "correct-horse-battery";

fn services(auth_port: u16, web_port: u16) -> String {
    format!(
        "auth_service:\n  listen_addr: 127.0.0.1:{auth_port}\n  cluster_name: drain.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:{web_port}\n  shutdown_drain_timeout: 20s\nssh_service:\n  enabled: false\n"
    )
}

#[test]
fn sigterm_drains_the_proxy_and_the_agent_comes_back() {
    let (auth_port, web_port) = (
        svc_testkit::free_port("127.0.0.1"),
        svc_testkit::free_port("127.0.0.1"),
    );
    let mut cluster = Cluster::start_with(
        tempfile::tempdir().unwrap(),
        "info",
        &services(auth_port, web_port),
    );
    cluster.add_alice(PASSWORD);
    cluster.login("alice", PASSWORD).ok();

    let out = cluster
        .tctl_admin(&["tokens", "add", "--type=node", "--format", "json"], None)
        .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    let (token, pin) = (v["token"].as_str().unwrap(), v["ca_pin"].as_str().unwrap());
    let data = cluster.path().join("agent-data");
    let config = cluster.write(
        "agent.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: drained\n  data_dir: {}\n  proxy_server: {}\n  auth_token: {token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            data.display(),
            cluster.web_addr
        ),
    );
    let mut agent_cmd = Command::new(SVC);
    agent_cmd.args(["start", "--insecure", "--config"]).arg(&config);
    let agent = Agent::start(agent_cmd, cluster.path().join("agent.stderr"));
    let ok = cluster.tsh(&["ssh", "root@drained", "echo before"], None);
    assert_eq!(
        ok.stdout,
        "before\n",
        "tsh: {}\nagent: {}",
        ok.stderr,
        agent.log()
    );

    // A session is running when SIGTERM arrives.
    let session = Command::new(common::TSH)
        .args(["ssh", "root@drained", "sleep 3; echo finished"])
        .env("SVC_HOME", cluster.path().join("home"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tsh");
    std::thread::sleep(Duration::from_millis(1500));
    let stopping = Instant::now();
    cluster.stop();
    let drain = stopping.elapsed();
    let out = common::wait::output_within(
        session,
        common::wait::STEP,
        "the session through the draining proxy",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "finished\n",
        "the session finished during the drain; tsh: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        cluster.stderr()
    );
    assert!(
        drain < Duration::from_secs(20),
        "the drain ended with the session, took {drain:?}"
    );
    let log = cluster.stderr();
    for line in [
        "asked the agent to reconnect elsewhere",
        "removed this proxy from the cluster's proxy registry",
    ] {
        assert!(log.contains(line), "svc's log lacks {line:?}:\n{log}");
    }
    let agent_log = agent.log();
    assert!(
        agent_log.contains("the proxy asked the agent to reconnect"),
        "agent: {agent_log}"
    );

    // Back on the same ports and data: the agent reconnects by itself.
    let tmp = cluster.take_dir();
    let cluster = Cluster::start_with(tmp, "info", &services(auth_port, web_port));
    let deadline = Instant::now() + common::wait::STEP;
    loop {
        let out = cluster.tsh(&["ssh", "root@drained", "echo back"], None);
        if out.stdout == "back\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not come back within {:?}: {}\nagent: {}",
            common::wait::STEP,
            out.stderr,
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

//! End to end: an agent without `svc.ca_pin` refuses to join (nothing is sent, the token stays
//! unspent) unless `svc start --insecure` chooses trust on first use explicitly.

mod common;

use svc_testkit::wait::OutputWithin;

use std::process::Command;

use common::agent::Agent;
use common::{Cluster, SVC};

#[test]
fn an_agent_without_a_pin_joins_only_with_explicit_trust_on_first_use() {
    let cluster = Cluster::start("info");
    let out = cluster
        .tctl_admin(&["tokens", "add", "--type=node", "--format", "json"], None)
        .ok();
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    let token = json["token"].as_str().expect("token");
    let data = cluster.path().join("pinless-data");
    let config = cluster.write(
        "pinless.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: pinless\n  data_dir: {}\n  auth_server: {}\n  auth_token: {token}\n\
auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n\
ssh_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n",
            data.display(),
            cluster.auth_addr,
        ),
    );
    let refused = Command::new(SVC)
        .args(["start", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .output_within(common::wait::STEP, "svc start without a CA pin")
        .expect("run svc start");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "joined without a pin: {stderr}");
    assert!(
        stderr.contains(&format!(
            "refusing to join the cluster at {} without a CA pin: expected svc.ca_pin",
            cluster.auth_addr
        )),
        "{stderr}"
    );
    // Nothing was sent: the single-use token still admits the agent, now with explicit trust
    // on first use.
    let mut command = Command::new(SVC);
    command.args(["start", "--insecure", "--config"]).arg(&config);
    let agent = Agent::start(command, cluster.path().join("pinless.stderr"));
    assert!(
        agent.host_id.ends_with(".e2e.test"),
        "host ID {:?}\nagent: {}",
        agent.host_id,
        agent.log()
    );
}

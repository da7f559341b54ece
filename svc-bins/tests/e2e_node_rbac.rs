//! End to end: node RBAC on every SSH entry and node identity. The real `svc start` (Auth,
//! Proxy and its own SSH agent labelled `env: dev`) and a directly joined agent `prod-db`
//! labelled `env: prod` (its own SSH listener). A user whose only role allows `env: dev` nodes
//! is refused `prod-db` through the web port (`tsh ssh`), through `tsh proxy ssh` under the
//! real OpenSSH client, and on the node's own listener with OpenSSH (the node's own check),
//! each time with the refusal text; the same user reaches the `dev` node. Deny beats allow; a
//! login outside the roles' logins is refused. A rogue agent joining with a second token under
//! the name `prod-db` is refused, and sessions keep reaching the real node. A second cluster in
//! separate-ports mode refuses the same user on the proxy's SSH port (3023). A node that cannot
//! reach the Auth Service refuses (fail closed), and a restarted all-in-one cluster serves its
//! own node at once.

mod common;

use svc_testkit::wait::OutputWithin;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::resources::{PASSWORD, User};
use common::{Cluster, Run, SVC, TSH};

/// `dev` allows nodes labelled `env: dev` as `root`; `no-prod` denies `env: prod` nodes.
const ROLES: &str = "kind: role\nversion: v7\nmetadata:\n  name: dev\nspec:\n  allow:\n    logins: [root]\n    node_labels:\n      env: dev\n---\nkind: role\nversion: v7\nmetadata:\n  name: no-prod\nspec:\n  deny:\n    node_labels:\n      env: prod\n";

/// The node name `svc start` gives its own agent: this host's name.
fn nodename() -> String {
    svc_core::config::Config::all_in_one_default().svc.nodename
}

fn add_users(cluster: &Cluster) {
    cluster
        .tctl_admin(
            &["create", &cluster.write("roles.yaml", ROLES).to_string_lossy()],
            None,
        )
        .ok();
    for (user, roles) in [
        ("dana", "--roles=dev"),
        ("erin", "--roles=access,no-prod"),
        ("alice", "--roles=access"),
    ] {
        cluster
            .tctl_admin(
                &["users", "add", user, roles, "--logins=root", "--password-stdin"],
                Some(PASSWORD),
            )
            .ok();
    }
}

/// `tsh ARGS` in `user`'s own `SVC_HOME`, success or not.
fn tsh(user: &User, args: &[&str]) -> Run {
    Command::new(TSH)
        .args(args)
        .env("SVC_HOME", &user.home)
        .env_remove("RUST_LOG")
        .output_within(common::wait::STEP, &format!("tsh {}", args.join(" ")))
        .expect("run tsh")
        .into()
}

fn require_openssh() {
    svc_testkit::require("ssh", "openssh-client");
}

/// The real OpenSSH client with `user`'s key, certificate and the `known_hosts` `tsh login`
/// wrote; `route` adds the options that say how to reach the node.
fn openssh(user: &User, route: &[String], target: &str, command: &str) -> Run {
    let keys = user.home.join("keys");
    Command::new(svc_testkit::require("ssh", "openssh-client"))
        .args([
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .arg("-i")
        .arg(keys.join("key"))
        .arg("-o")
        .arg(format!("CertificateFile={}", keys.join("key-cert.pub").display()))
        .arg("-o")
        .arg(format!(
            "UserKnownHostsFile={}",
            keys.join("known_hosts").display()
        ))
        .args([
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=20",
        ])
        .args(route)
        .arg(target)
        .arg(command)
        .output_within(common::wait::STEP, &format!("ssh {target} {command}"))
        .expect("run ssh")
        .into()
}

/// OpenSSH through the proxy: `tsh proxy ssh` as its `ProxyCommand`.
fn via_tsh_proxy(user: &User) -> Vec<String> {
    vec![
        "-o".into(),
        format!(
            "ProxyCommand=env SVC_HOME={} {TSH} proxy ssh %r@%h:%p",
            user.home.display()
        ),
    ]
}

fn token(cluster: &Cluster) -> (String, String) {
    let out = cluster
        .tctl_admin(&["tokens", "add", "--type=node", "--format", "json"], None)
        .ok();
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    (
        json["token"].as_str().expect("token").to_owned(),
        json["ca_pin"].as_str().expect("ca_pin").to_owned(),
    )
}

/// The svc.yaml of an agent joining the Auth Service directly as `name`, labelled `env`, with
/// its own SSH listener.
fn direct_agent_yaml(cluster: &Cluster, data: &Path, name: &str, env: &str) -> PathBuf {
    let (token, pin) = token(cluster);
    cluster.write(
        &format!("{name}-{}.yaml", data.file_name().unwrap().to_string_lossy()),
        &format!(
            "version: v1\nsvc:\n  nodename: {name}\n  data_dir: {data}\n  auth_server: {auth}\n  auth_token: {token}\n  ca_pin: {pin}\n\
auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\n\
ssh_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n  labels:\n    env: {env}\n",
            data = data.display(),
            auth = cluster.auth_addr,
        ),
    )
}

fn svc_agent(config: &Path) -> Command {
    let mut command = Command::new(SVC);
    command
        .args(["start", "--config"])
        .arg(config)
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY");
    command
}

#[test]
fn node_rbac_refuses_a_dev_user_on_a_prod_node_through_every_entry() {
    require_openssh();
    let cluster = Cluster::start_lab_extra("info", "ssh_service:\n  labels:\n    env: dev\n");
    add_users(&cluster);
    let prod = Agent::start(
        svc_agent(&direct_agent_yaml(
            &cluster,
            &cluster.path().join("prod-data"),
            "prod-db",
            "prod",
        )),
        cluster.path().join("prod.stderr"),
    );
    let prod_ssh = prod
        .listeners
        .get("ssh_service")
        .expect("the prod node's SSH listener in its banner")
        .clone();
    let (dev_node, dana) = (nodename(), User::login(&cluster, "dana"));
    let dana_denied = "access denied to node \"prod-db\": the roles of user dana do not allow its labels";

    // Allowed: the dev node, as the role's login.
    let ok = tsh(&dana, &["ssh", &format!("root@{dev_node}"), "echo dev-ok"]);
    assert_eq!(ok.stdout, "dev-ok\n", "{}\nsvc: {}", ok.stderr, cluster.stderr());

    // The web port (`tsh ssh`): the proxy refuses before it dials.
    let web = tsh(&dana, &["ssh", "root@prod-db", "echo should-not-run"]);
    web.refused(dana_denied, "tsh ssh through the web port", &cluster);
    assert!(!web.stdout.contains("should-not-run"));
    // By host ID too: names do not matter, the node's labels do.
    let by_id = tsh(
        &dana,
        &["ssh", &format!("root@{}", prod.host_id), "echo should-not-run"],
    );
    by_id.refused(
        "the roles of user dana do not allow its labels",
        "tsh ssh by host ID",
        &cluster,
    );

    // `tsh proxy ssh` under the real OpenSSH client.
    let openssh_proxy = openssh(
        &dana,
        &via_tsh_proxy(&dana),
        "root@prod-db",
        "echo should-not-run",
    );
    openssh_proxy.refused(dana_denied, "OpenSSH with tsh proxy ssh", &cluster);
    let openssh_dev = openssh(
        &dana,
        &via_tsh_proxy(&dana),
        &format!("root@{dev_node}"),
        "echo openssh-dev",
    );
    assert_eq!(openssh_dev.stdout, "openssh-dev\n", "{}", openssh_dev.stderr);

    // The node's own listener (what the proxy dials for a directly joined agent), with
    // OpenSSH straight to it: no proxy in the way, the node refuses on its own.
    let (host, port) = prod_ssh.rsplit_once(':').expect("host:port");
    // `known_hosts` trusts the host CA for dana's nodes and host IDs only; the node is
    // checked under its host ID, which its certificate names.
    let known_hosts = std::fs::read_to_string(dana.home.join("keys/known_hosts")).expect("known_hosts");
    assert!(
        known_hosts.starts_with(&format!("@cert-authority {dev_node},*.e2e.test ")),
        "{known_hosts}"
    );
    assert!(!known_hosts.contains("@cert-authority * "), "{known_hosts}");
    let direct_route = vec![
        "-p".to_owned(),
        port.to_owned(),
        "-o".to_owned(),
        format!("HostKeyAlias={}", prod.host_id),
    ];
    let direct = openssh(
        &dana,
        &direct_route,
        &format!("root@{host}"),
        "echo should-not-run",
    );
    direct.refused(
        &format!("svc: {dana_denied}"),
        "OpenSSH to the node's own listener",
        &cluster,
    );
    assert!(
        prod.log().contains("SSH login refused by node RBAC"),
        "the node logs its refusal: {}",
        prod.log()
    );

    // Deny beats allow: `access` allows every node, `no-prod` denies env=prod.
    let erin = User::login(&cluster, "erin");
    let denied = tsh(&erin, &["ssh", "root@prod-db", "echo should-not-run"]);
    denied.refused(
        "access denied to node \"prod-db\": role no-prod of user erin denies its labels",
        "deny beats allow",
        &cluster,
    );
    let direct = openssh(
        &erin,
        &direct_route,
        &format!("root@{host}"),
        "echo should-not-run",
    );
    direct.refused(
        "role no-prod of user erin denies its labels",
        "deny on the node itself",
        &cluster,
    );
    let ok = tsh(&erin, &["ssh", &format!("root@{dev_node}"), "echo erin-dev"]);
    assert_eq!(ok.stdout, "erin-dev\n", "{}", ok.stderr);

    // A login the roles do not grant.
    let login = tsh(
        &dana,
        &["ssh", &format!("nobody@{dev_node}"), "echo should-not-run"],
    );
    login.refused(&format!(
            "access denied to node \"{dev_node}\" as login \"nobody\": the roles of user dana do not allow this login"
        ),
        "a login outside the roles' logins",
        &cluster,);

    // An allowed user reaches the prod node through the proxy's dial of its listener.
    let alice = User::login(&cluster, "alice");
    let ok = tsh(&alice, &["ssh", "root@prod-db", "echo prod-ok"]);
    assert_eq!(ok.stdout, "prod-ok\n", "{}\nsvc: {}", ok.stderr, cluster.stderr());
}

#[test]
fn a_rogue_agent_cannot_take_a_live_node_name() {
    let cluster = Cluster::start_lab("info");
    add_users(&cluster);
    let prod = Agent::start(
        svc_agent(&direct_agent_yaml(
            &cluster,
            &cluster.path().join("prod-data"),
            "prod-db",
            "prod",
        )),
        cluster.path().join("prod.stderr"),
    );
    // A second agent, with a token of its own, claims the live name.
    let rogue_config = direct_agent_yaml(&cluster, &cluster.path().join("rogue-data"), "prod-db", "prod");
    let rogue_stderr = cluster.path().join("rogue.stderr");
    let mut rogue = svc_agent(&rogue_config)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&rogue_stderr).expect("stderr file"))
        .spawn()
        .expect("spawn the rogue agent");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = rogue.try_wait().expect("wait for the rogue agent") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = rogue.kill();
            panic!(
                "the rogue agent was not refused within 60 s: {}",
                std::fs::read_to_string(&rogue_stderr).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(&rogue_stderr).unwrap_or_default();
    assert!(!status.success(), "the rogue agent must not start: {log}");
    assert!(
        log.contains("node name \"prod-db\" is already held by another live agent"),
        "the refusal names the node name and that another agent holds it: {log}"
    );

    // Sessions keep reaching the real node: one prod-db in the inventory, the real one's host
    // ID, and the session runs there.
    let inventory = cluster.tctl_admin(&["inventory", "ls"], None).ok();
    assert_eq!(
        inventory.stdout.matches("prod-db").count(),
        1,
        "{}",
        inventory.stdout
    );
    let uuid = prod.host_id.split('.').next().unwrap_or_default().to_owned();
    assert!(inventory.stdout.contains(&uuid), "{}", inventory.stdout);
    let alice = User::login(&cluster, "alice");
    let ok = tsh(&alice, &["ssh", "root@prod-db", "echo real-node"]);
    assert_eq!(ok.stdout, "real-node\n", "{}", ok.stderr);
    assert!(
        prod.log().contains("SSH login"),
        "the real node served the session: {}",
        prod.log()
    );
}

#[test]
fn node_rbac_refuses_on_the_proxy_ssh_port_in_separate_mode() {
    let services = "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: sep.test\n  proxy_listener_mode: separate\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n  tunnel_listen_addr: 127.0.0.1:0\n  listen_addr: 127.0.0.1:0\nssh_service:\n  labels:\n    env: prod\n";
    let cluster = Cluster::start_with(tempfile::tempdir().expect("tempdir"), "info", services);
    add_users(&cluster);
    let dana = User::login(&cluster, "dana");
    let profile = std::fs::read_to_string(dana.home.join("profile.json")).expect("profile");
    let json: serde_json::Value = serde_json::from_str(&profile).expect("profile json");
    assert!(
        json["ssh_proxy_addr"].as_str().is_some_and(|a| !a.is_empty()),
        "separate mode: the profile names the proxy's SSH port: {profile}"
    );
    let node = nodename();
    let refused = tsh(&dana, &["ssh", &format!("root@{node}"), "echo should-not-run"]);
    refused.refused(
        &format!("access denied to node \"{node}\": the roles of user dana do not allow its labels"),
        "tsh ssh through the proxy's SSH port",
        &cluster,
    );
    let alice = User::login(&cluster, "alice");
    let ok = tsh(&alice, &["ssh", &format!("root@{node}"), "echo sep-ok"]);
    assert_eq!(ok.stdout, "sep-ok\n", "{}\nsvc: {}", ok.stderr, cluster.stderr());
}

#[test]
fn a_restarted_cluster_serves_its_own_node_at_once() {
    let mut cluster = Cluster::start("info");
    add_users(&cluster);
    let alice = User::login(&cluster, "alice");
    let target = format!("root@{}", nodename());
    let ok = tsh(&alice, &["ssh", &target, "echo first-run"]);
    assert_eq!(ok.stdout, "first-run\n", "{}", ok.stderr);
    // The in-process agent comes back with a new host ID under the same node name: it takes
    // the name over from its previous run instead of being refused as a second claimant.
    let dir = cluster.take_dir();
    drop(cluster);
    let cluster = Cluster::start_in(dir, "info");
    let alice = User::login(&cluster, "alice");
    let ok = tsh(&alice, &["ssh", &target, "echo second-run"]);
    assert_eq!(
        ok.stdout,
        "second-run\n",
        "{}\nsvc: {}",
        ok.stderr,
        cluster.stderr()
    );
    assert!(
        !cluster.stderr().contains("already held by another live agent"),
        "{}",
        cluster.stderr()
    );
}

#[test]
fn a_node_that_cannot_ask_the_auth_service_refuses() {
    require_openssh();
    let mut cluster = Cluster::start_lab("info");
    add_users(&cluster);
    let edge = Agent::start(
        svc_agent(&direct_agent_yaml(
            &cluster,
            &cluster.path().join("edge-data"),
            "edge",
            "dev",
        )),
        cluster.path().join("edge.stderr"),
    );
    let edge_ssh = edge
        .listeners
        .get("ssh_service")
        .expect("the node's SSH listener in its banner")
        .clone();
    let (host, port) = edge_ssh.rsplit_once(':').expect("host:port");
    let alice = User::login(&cluster, "alice");
    let route = vec![
        "-p".to_owned(),
        port.to_owned(),
        "-o".to_owned(),
        format!("HostKeyAlias={}", edge.host_id),
    ];
    let ok = openssh(&alice, &route, &format!("root@{host}"), "echo allowed");
    assert_eq!(ok.stdout, "allowed\n", "{}\nnode: {}", ok.stderr, edge.log());
    // The Auth Service goes away: the node cannot decide, so it refuses (fail closed).
    cluster.kill9();
    let refused = openssh(&alice, &route, &format!("root@{host}"), "echo should-not-run");
    refused.refused(
        "cannot be authorized now (refused)",
        "a node without its Auth Service",
        &cluster,
    );
    assert!(!refused.stdout.contains("should-not-run"));
}

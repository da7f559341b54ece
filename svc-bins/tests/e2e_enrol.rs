//! End to end: enrolment in automatic updates without a restart, and the updater's status in
//! the inventory — the real `svc start` agent and the real `tctl`.
//!
//! The agent starts before the Linux updater's directory exists (`SVC_UPGRADE_CONFIG` names
//! one that does not) and creates nothing there; once the test creates the directory, as the
//! updater package does, the running agent writes `schedule`, `endpoint` and `agent`. A
//! `status` file written as svc-upgrade writes it after a rollback shows in `tctl inventory ls`
//! (text and JSON); the filters select the right rows and refuse bad values by name.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::agent::Agent;
use common::wait::wait_until;
use common::{Cluster, SVC};
use svc_core::Secret;
use svc_core::auth::Heartbeat;
use svc_core::identity::SystemRole;
use svc_net::auth::{AuthClient, JoinParams};

/// How long a change may take to show: a heartbeat comes every 30 s, and the directory is
/// looked at after every heartbeat; twice that, plus room for a loaded machine.
const NEXT_BEATS: Duration = Duration::from_secs(120);

fn token(cluster: &Cluster) -> (String, String) {
    let out = cluster
        .tctl_admin(&["tokens", "add", "--type=node", "--format", "json"], None)
        .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    (
        v["token"].as_str().expect("token").to_owned(),
        v["ca_pin"].as_str().expect("ca_pin").to_owned(),
    )
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `tctl inventory ls ARGS` on the Auth host.
fn inventory(cluster: &Cluster, args: &[&str]) -> common::Run {
    let mut all = vec!["inventory", "ls"];
    all.extend_from_slice(args);
    cluster.tctl_admin(&all, None)
}

/// An agent that reports `version` once, joined with the API (as an older release would).
async fn old_agent(cluster: &Cluster, name: &str, version: &str) -> String {
    let (token, pin) = token(cluster);
    let identity = svc_net::auth::join(
        &cluster.auth_addr,
        JoinParams {
            token: Secret::new(token),
            ca_pin: Some(pin),
            trust_on_first_use: false,
            node_name: name.into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
        },
    )
    .await
    .expect("join");
    let mut client = AuthClient::connect_with(&identity).await.expect("connect");
    client
        .heartbeat(&Heartbeat {
            hostname: name.into(),
            version: version.into(),
            ..Default::default()
        })
        .await
        .expect("heartbeat without update status");
    identity.name.split('.').next().expect("uuid").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_enrols_without_a_restart_and_the_inventory_shows_the_rollback() {
    let cluster = Cluster::start("info");
    let maintenance = cluster.write(
        "maintenance.yaml",
        "kind: cluster_maintenance_config\nversion: v1\nmetadata:\n  name: cluster-maintenance-config\nspec:\n  agent_upgrades:\n    utc_start_hour: 4\n    weekdays: [Mon, Tue, Wed, Thu, Fri, Sat, Sun]\n",
    );
    cluster
        .tctl_admin(&["create", &maintenance.to_string_lossy()], None)
        .ok();
    let (token, pin) = token(&cluster);
    let data = cluster.path().join("agent-data");
    let config = cluster.write(
        "agent.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: enrolled\n  data_dir: {}\n  proxy_server: {}\n  diag_addr: 127.0.0.1:0\n  auth_token: {token}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            data.display(),
            cluster.web_addr
        ),
    );
    let upgrade_dir = cluster.path().join("svc-upgrade.d");
    let mut command = Command::new(SVC);
    command
        .args(["start", "--insecure", "--config"])
        .arg(&config)
        .env("SVC_UPGRADE_CONFIG", &upgrade_dir)
        .env_remove("SVC_UPGRADER")
        .env_remove("SVC_UPGRADER_VERSION")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("SVC_KUBE_SHARED_STATE_SECRET")
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY");
    let agent = Agent::start(command, cluster.path().join("agent.stderr"));
    let uuid = agent.host_id.split('.').next().expect("uuid").to_owned();

    // Not enrolled: the agent claims no directory and reports no updater.
    assert!(!upgrade_dir.exists(), "the agent created the updater's directory");
    let before = inventory(&cluster, &["--upgrader", "none"]).ok();
    assert!(before.stdout.contains(&uuid), "{}", before.stdout);

    // The updater is installed: the running agent exports to its new directory.
    std::fs::create_dir(&upgrade_dir).expect("create the updater's directory");
    let (schedule, endpoint, agent_file) = (
        upgrade_dir.join("schedule"),
        upgrade_dir.join("endpoint"),
        upgrade_dir.join("agent"),
    );
    wait_until(
        NEXT_BEATS,
        "schedule, endpoint and agent files in the new directory",
        || read(&schedule).lines().count() > 1 && !read(&endpoint).is_empty() && agent_file.exists(),
    );
    let windows = svc_core::maintenance::parse_schedule_file(&read(&schedule)).expect("schedule");
    assert_eq!(windows.len(), 3, "{}", read(&schedule));
    assert_eq!(
        read(&endpoint).trim(),
        format!("{}/v1/webapi/automaticupgrades/channel/default", cluster.web_addr)
    );
    let written: serde_json::Value = serde_json::from_str(&read(&agent_file)).expect("agent file json");
    let version = written["version"].as_str().expect("version").to_owned();
    assert_eq!(
        version,
        svc_core::version::current().without_v(),
        "written without the v"
    );
    assert_eq!(written["host_id"], agent.host_id.as_str());
    assert!(written["pid"].as_u64().is_some_and(|p| p > 0), "{written}");
    assert!(
        written["heartbeat_at"].as_u64().is_some_and(|t| t + 120 >= now()),
        "{written}"
    );
    assert_eq!(written["diag_addr"].as_str(), agent.diag.as_deref(), "{written}");
    use std::os::unix::fs::PermissionsExt;
    for file in [&schedule, &endpoint, &agent_file] {
        let mode = std::fs::metadata(file).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{}", file.display());
    }

    // svc-upgrade rolled back a bad version: the next heartbeat reports it.
    let status = serde_json::json!({
        "upgrader": "unit", "upgrader_version": "17.0.3", "result": "rolled_back",
        "from": "17.9.0", "to": version, "reason": "no heartbeat with 17.9.0 within 120s",
        "at": now() - 60, "bad_versions": ["17.9.0"],
    });
    std::fs::write(upgrade_dir.join("status"), status.to_string()).expect("write status");
    let expected = format!("rolled back 17.9.0→{version}");
    let mut row = String::new();
    let mut last = String::new();
    let deadline = std::time::Instant::now() + NEXT_BEATS;
    while !row.contains(&expected) {
        assert!(
            std::time::Instant::now() < deadline,
            "no {expected:?} in tctl inventory ls within {NEXT_BEATS:?}:\n{last}"
        );
        std::thread::sleep(Duration::from_millis(500));
        last = inventory(&cluster, &[]).ok().stdout;
        row = last
            .lines()
            .find(|l| l.contains(&uuid))
            .unwrap_or_default()
            .to_owned();
    }
    assert!(row.contains("no heartbeat with 17.9.0 within 120s"), "{row}");
    assert!(row.contains("17.0.3"), "the updater's version: {row}");
    assert!(row.contains(" UTC"), "the next window: {row}");
    let header = inventory(&cluster, &[]).ok().stdout;
    let header = header.lines().next().expect("header");
    for column in [
        "Server ID",
        "Hostname",
        "Services",
        "Agent Version",
        "Upgrader",
        "Upgrader Version",
        "Update",
        "Next Window",
    ] {
        assert!(header.contains(column), "{header}");
    }

    let json = inventory(&cluster, &["--format", "json"]).ok();
    let rows: serde_json::Value = serde_json::from_str(&json.stdout).expect("inventory json");
    let mine = rows
        .as_array()
        .expect("array")
        .iter()
        .find(|r| r["server_id"] == uuid.as_str())
        .expect("the agent's row");
    assert_eq!(mine["upgrader"], "unit");
    assert_eq!(mine["upgrader_version"], "17.0.3");
    assert_eq!(mine["update_status"]["result"], "rolled_back");
    assert_eq!(mine["update_status"]["from"], "17.9.0");
    assert_eq!(mine["update_status"]["to"], version.as_str());
    assert_eq!(
        mine["update_status"]["reason"],
        "no heartbeat with 17.9.0 within 120s"
    );
    let start = mine["next_window"]["start"].as_u64().expect("next window start");
    assert_eq!(mine["next_window"]["end"].as_u64(), Some(start + 3600), "{mine}");
    let first = windows[0]
        .start
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    assert_eq!(start, first, "the first window of the exported schedule");
    let yaml = inventory(&cluster, &["--format", "yaml"]).ok();
    assert!(yaml.stdout.contains("result: rolled_back"), "{}", yaml.stdout);

    // Filters: an older agent (no update status) next to this one.
    let old = old_agent(&cluster, "old-node", "16.2.0").await;
    let ids = |args: &[&str]| {
        let out = inventory(&cluster, args).ok().stdout;
        (out.contains(&uuid), out.contains(&old))
    };
    assert_eq!(ids(&[]), (true, true));
    assert_eq!(ids(&["--older-than", &version]), (false, true));
    assert_eq!(ids(&["--newer-than", "16.2.0"]), (true, false));
    assert_eq!(ids(&["--exact-version", "16.2.0"]), (false, true));
    assert_eq!(ids(&["--exact-version", &version]), (true, false));
    assert_eq!(ids(&["--upgrader", "none"]), (false, true));
    assert_eq!(ids(&["--upgrader=unit"]), (true, false));
    assert_eq!(ids(&["--services", "node"]), (true, true));
    assert_eq!(ids(&["--services", "app,db"]), (false, false));
    let old_row = inventory(&cluster, &["--exact-version", "16.2.0"]).ok().stdout;
    let old_row = old_row
        .lines()
        .find(|l| l.contains(&old))
        .expect("the old agent's row");
    let cells: Vec<&str> = old_row.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            old.as_str(),
            "old-node",
            "node",
            "16.2.0",
            "none",
            "none",
            "none",
            "none"
        ],
        "{old_row}"
    );

    // Bad values are refused by name, with what is allowed.
    let bogus = inventory(&cluster, &["--upgrader", "bogus"]);
    assert!(!bogus.status.success());
    assert!(
        bogus.stderr.contains("--upgrader") && bogus.stderr.contains("kube, unit, none"),
        "{}",
        bogus.stderr
    );
    let bad_version = inventory(&cluster, &["--older-than", "seventeen"]);
    assert!(!bad_version.status.success());
    assert!(
        bad_version.stderr.contains("--older-than") && bad_version.stderr.contains("seventeen"),
        "{}",
        bad_version.stderr
    );
    let bad_service = inventory(&cluster, &["--services", "node,toaster"]);
    assert!(!bad_service.status.success());
    assert!(
        bad_service.stderr.contains("--services")
            && bad_service.stderr.contains("toaster")
            && bad_service
                .stderr
                .contains("auth, proxy, node, app, db, kube or windows_desktop"),
        "{}",
        bad_service.stderr
    );

    // A garbage status is logged and ignored: the agent keeps heartbeating, reporting no
    // decision and no updater.
    std::fs::write(upgrade_dir.join("status"), "{not json").expect("write garbage");
    wait_until(
        NEXT_BEATS,
        "the agent reporting no updater after a garbage status",
        || ids(&["--upgrader", "none"]).0,
    );
    assert!(
        agent.log().contains("ignoring the updater's status"),
        "{}",
        agent.log()
    );
}

//! End to end: the `svc-kube-updater` binary, configured as the chart configures it, against
//! the fake API server (through a kubeconfig) and an in-process version server; and the real
//! `svc` agent as the chart runs it, keeping its host identity in its per-replica Secret across
//! a pod replacement.

mod common;
#[path = "../../svc-update/tests/support/mod.rs"]
mod support;

use std::process::{Command, Stdio};

use common::agent::Agent;
use common::{Cluster, SVC};

use serde_json::json;
use support::{fake_apiserver::FakeApiServer, version_server::VersionServer, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_updates_the_agent_and_holds_the_lease() {
    let api = FakeApiServer::start().await;
    api.insert(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "svc-agent", "namespace": "svc"},
        "spec": {"selector": {"matchLabels": {"app": "svc-agent"}},
                 "template": {"metadata": {"labels": {"app": "svc-agent"}},
                              "spec": {"containers": [{"name": "svc", "image": "registry.example.com/svc:17.0.0"}]}}}
    }));
    let versions = VersionServer::start("stable/cloud", "v17.0.3", true).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig("svc")).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_svc-kube-updater"))
        .args([
            "--agent-name=svc-agent",
            "--agent-namespace=svc",
            "--base-image=registry.example.com/svc",
            &format!("--version-server={}", versions.url()),
            "--health-addr=127.0.0.1:0",
            "--lease-name=svc-agent-updater",
            "--identity=svc-agent-updater-abc12",
            "--rollout-timeout=10m",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let image = || {
        api.get("StatefulSet", "svc", "svc-agent").unwrap()["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    wait_until("the critical update", || {
        image() == "registry.example.com/svc:17.0.3"
    })
    .await;
    let lease = api.get("Lease", "svc", "svc-agent-updater").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "svc-agent-updater-abc12");
    assert!(child.try_wait().unwrap().is_none(), "still running");
    child.kill().await.unwrap();
}

/// The binary with `--rollout-timeout`: the new image's pods never become ready, the previous
/// image comes back and the version is marked bad in the shared-state Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_rolls_back_an_image_whose_pods_never_become_ready() {
    let api = FakeApiServer::start().await;
    api.insert(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "svc-agent", "namespace": "svc"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "svc-agent"}},
                 "template": {"metadata": {"labels": {"app": "svc-agent"}},
                              "spec": {"containers": [{"name": "svc", "image": "registry.example.com/svc:17.0.0"}]}}}
    }));
    let _kubelet = api.kubelet("StatefulSet", "svc", "svc-agent", "svc", |image| {
        !image.ends_with(":17.0.3")
    });
    let versions = VersionServer::start("stable/cloud", "v17.0.3", true).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig("svc")).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_svc-kube-updater"))
        .args([
            "--agent-name=svc-agent",
            "--agent-namespace=svc",
            "--base-image=registry.example.com/svc",
            &format!("--version-server={}", versions.url()),
            "--health-addr=127.0.0.1:0",
            "--rollout-timeout=2s",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = api.client("svc");
    let bad = || async {
        svc_update::kube::status::read_bad_versions(client.clone(), "svc", "svc-agent-shared-state")
            .await
            .unwrap_or_default()
    };
    support::wait_until_async("17.0.3 marked bad", || async { !bad().await.is_empty() }).await;
    assert_eq!(bad().await, vec![svc_core::Version::new(17, 0, 3)]);
    let image = api.get("StatefulSet", "svc", "svc-agent").unwrap()["spec"]["template"]["spec"]["containers"]
        [0]["image"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        image, "registry.example.com/svc:17.0.0",
        "the previous image is back"
    );
    assert!(child.try_wait().unwrap().is_none(), "still running");
    child.kill().await.unwrap();
}

#[test]
fn binary_requires_agent_name_and_namespace() {
    // Refused at argument parsing: a binary that started instead would run until killed.
    let mut updater = std::process::Command::new(env!("CARGO_BIN_EXE_svc-kube-updater"));
    updater
        .args(["--version-server=http://127.0.0.1:1", "--base-image=x"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = updater.spawn().unwrap();
    let pid = child.id().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = rx.recv_timeout(std::time::Duration::from_secs(60)) else {
        let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
        panic!("svc-kube-updater without --agent-name did not exit within 60 s");
    };
    let out = out.unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--agent-name"), "{stderr}");
    assert!(stderr.contains("--agent-namespace"), "{stderr}");
}

/// A Kubernetes agent's svc.yaml (as the chart writes it, with an SSH Service to reach it):
/// joining through the proxy at `proxy`, with `token` when given.
fn kube_agent_yaml(data: &std::path::Path, proxy: &str, token: Option<(&str, &str)>) -> String {
    let mut svc = format!(
        "version: v1\nsvc:\n  nodename: svc-agent-0\n  data_dir: {}\n  proxy_server: {proxy}\n",
        data.display()
    );
    if let Some((token, pin)) = token {
        svc.push_str(&format!("  auth_token: {token}\n  ca_pin: {pin}\n"));
    }
    svc + "auth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n"
}

/// `svc start` as the chart's StatefulSet runs replica 0: the state Secret, the shared-state
/// Secret and the namespace from the environment, the API server from a kubeconfig.
fn kube_agent(
    cluster: &Cluster,
    config: &std::path::Path,
    kubeconfig: &std::path::Path,
    state_secret: &str,
) -> Command {
    let mut command = Command::new(SVC);
    command
        .args(["start", "--insecure", "--config"])
        .arg(config)
        .env("KUBECONFIG", kubeconfig)
        .env("SVC_KUBE_NAMESPACE", "svc")
        .env("SVC_KUBE_STATE_SECRET", state_secret)
        .env("SVC_KUBE_SHARED_STATE_SECRET", "svc-agent-shared-state")
        .env("SVC_UPGRADER", "kube")
        .env("SVC_UPGRADER_VERSION", "17.0.0")
        .env("SVC_HOME", cluster.path().join("agent-home"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY");
    command
}

/// The updater's first image change recreates the agent's pod with an empty filesystem and the
/// same (spent) join token: the agent must come back from its Secret, with the same host ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_agent_pod_rejoins_with_its_identity_from_the_secret() {
    use support::fake_apiserver::FakeApiServer;
    let api = FakeApiServer::start().await;
    let cluster = Cluster::start("info");
    let out = cluster
        .tctl_admin(&["tokens", "add", "--type=node", "--format", "json"], None)
        .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    let (token, pin) = (
        v["token"].as_str().expect("token").to_owned(),
        v["ca_pin"].as_str().expect("ca_pin").to_owned(),
    );
    let kubeconfig = cluster.write("kubeconfig", &api.kubeconfig("svc"));

    // The first pod: an empty data directory (an emptyDir), the token in its configuration.
    let config = cluster.write(
        "agent.yaml",
        &kube_agent_yaml(
            &cluster.path().join("pod-1-data"),
            &cluster.web_addr,
            Some((&token, &pin)),
        ),
    );
    let first = Agent::start(
        kube_agent(&cluster, &config, &kubeconfig, "svc-agent-0-state"),
        cluster.path().join("agent-1.stderr"),
    );
    let host_id = first.host_id.clone();
    let secret = api
        .get("Secret", "svc", "svc-agent-0-state")
        .unwrap_or_else(|| panic!("no identity secret; agent log:\n{}", first.log()));
    assert!(
        secret["data"]["host-identity"].is_string(),
        "the identity is in the secret: {:?}",
        secret["data"].as_object().map(|d| d.keys().collect::<Vec<_>>())
    );
    let log = first.log();
    assert!(log.contains("secret svc/svc-agent-0-state"), "{log}");
    assert!(!log.contains("PRIVATE KEY"), "key material in the log:\n{log}");
    assert!(!log.contains(&token), "the join token leaked:\n{log}");
    let uuid = host_id.split('.').next().unwrap().to_owned();
    let inventory = cluster.tctl_admin(&["inventory", "ls"], None).ok();
    assert!(inventory.stdout.contains(&uuid), "{}", inventory.stdout);

    // The pod is replaced ("the new image"): its filesystem is gone and its configuration has no
    // token. It comes back with the identity from the Secret.
    drop(first);
    let config = cluster.write(
        "agent-again.yaml",
        &kube_agent_yaml(&cluster.path().join("pod-2-data"), &cluster.web_addr, None),
    );
    let again = Agent::start(
        kube_agent(&cluster, &config, &kubeconfig, "svc-agent-0-state"),
        cluster.path().join("agent-2.stderr"),
    );
    assert_eq!(
        again.host_id, host_id,
        "the same host ID after the pod was replaced"
    );
    assert!(
        again.log().contains("using the saved host identity"),
        "{}",
        again.log()
    );
    let inventory = cluster.tctl_admin(&["inventory", "ls"], None).ok();
    assert!(inventory.stdout.contains(&uuid), "{}", inventory.stdout);

    // Without the Secret the spent token would not have been enough: a replica with an empty
    // Secret and the same token cannot join.
    let config = cluster.write(
        "agent-spent.yaml",
        &kube_agent_yaml(
            &cluster.path().join("pod-3-data"),
            &cluster.web_addr,
            Some((&token, &pin)),
        ),
    );
    let out = common::wait::run_within(
        kube_agent(&cluster, &config, &kubeconfig, "svc-agent-1-state")
            .stdin(Stdio::null())
            .env_remove("RUST_LOG"),
        common::wait::STEP,
        "svc start with a spent token exiting",
    )
    .unwrap();
    assert!(!out.status.success(), "a spent token joined again");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("joining the cluster"), "{err}");
    assert!(
        api.get("Secret", "svc", "svc-agent-1-state").is_none(),
        "nothing saved for a failed join"
    );
    drop(again);
}

//! End to end: the `svc-kube-updater` binary, configured as the chart configures it, against
//! the fake API server (through a kubeconfig) and an in-process version server.

#[path = "../../svc-update/tests/support/mod.rs"]
mod support;

use std::process::Stdio;

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

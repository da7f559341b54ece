//! Keeps the fake API server honest: the real `kubectl` (`/usr/bin/kubectl`, `--validate=false`)
//! creates, gets, annotates, patches, deletes and watches through it, execs, attaches,
//! port-forwards (WebSocket and SPDY/3.1) and follows logs, and the updater
//! controller reacts to `kubectl annotate` exactly as the documentation says.

mod support;

use std::{process::Stdio, sync::Arc, time::Duration};

use serde_json::{Value, json};
use support::{fake_apiserver::FakeApiServer, version_server::VersionServer, wait_until, within};
use svc_core::clock::SystemClock;
use svc_update::kube::{
    UpdaterConfig, WorkloadKind,
    controller::{self, Context},
    health::Metrics,
    target::channel_base_url,
};
use tokio::io::{AsyncBufReadExt, BufReader};

const KUBECTL: &str = "/usr/bin/kubectl";

struct Kubectl {
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(api: &FakeApiServer) -> Self {
        assert!(
            std::path::Path::new(KUBECTL).exists(),
            "{KUBECTL} is missing: install the Debian package kubectl (or google-cloud-cli's kubectl)"
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kubeconfig"), api.kubeconfig("svc")).unwrap();
        Self { dir }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(KUBECTL);
        cmd.args(args)
            .env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .env("HOME", self.dir.path())
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Runs kubectl; fails the test with its output when it fails.
    async fn run(&self, args: &[&str]) -> String {
        let out = within(
            Duration::from_secs(60),
            &format!("kubectl {args:?} finishing"),
            self.command(args).output(),
        )
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn file(&self, name: &str, content: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path.to_string_lossy().into_owned()
    }
}

const STS: &str = r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: svc-agent
  namespace: svc
spec:
  serviceName: svc-agent
  replicas: 1
  selector:
    matchLabels: {app: svc-agent}
  template:
    metadata:
      labels: {app: svc-agent}
    spec:
      containers:
        - name: sidecar
          image: busybox:1.36
        - name: svc
          image: public.ecr.aws/svc/svc-ent-distroless:17.0.0
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_get_annotate_patch_delete() {
    let api = FakeApiServer::start().await;
    let k = Kubectl::new(&api);
    let file = k.file("sts.yaml", STS);
    let out = k.run(&["create", "-f", &file, "--validate=false"]).await;
    assert!(out.contains("statefulset.apps/svc-agent created"), "{out}");

    let obj: Value =
        serde_json::from_str(&k.run(&["get", "statefulset", "svc-agent", "-o", "json"]).await).unwrap();
    assert_eq!(obj["metadata"]["name"], "svc-agent");
    assert_eq!(obj["spec"]["template"]["spec"]["containers"][1]["name"], "svc");
    let names = k.run(&["get", "sts", "-o", "name"]).await;
    assert_eq!(names.trim(), "statefulset.apps/svc-agent");

    k.run(&[
        "annotate",
        "statefulset",
        "svc-agent",
        "debug.svc.dev/trigger-event=1",
        "--overwrite",
    ])
    .await;
    let stored = api.get("StatefulSet", "svc", "svc-agent").unwrap();
    assert_eq!(
        stored["metadata"]["annotations"]["debug.svc.dev/trigger-event"],
        "1"
    );

    // Strategic merge (kubectl's default): only the named container changes.
    k.run(&[
        "patch",
        "statefulset",
        "svc-agent",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"svc","image":"public.ecr.aws/svc/svc-ent-distroless:17.1.0"}]}}}}"#,
    ])
    .await;
    let stored = api.get("StatefulSet", "svc", "svc-agent").unwrap();
    let containers = stored["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0]["image"], "busybox:1.36");
    assert_eq!(
        containers[1]["image"],
        "public.ecr.aws/svc/svc-ent-distroless:17.1.0"
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.method == "PATCH" && r.content_type == "application/strategic-merge-patch+json")
    );

    // JSON merge patch: the skip annotation as the documentation writes it.
    k.run(&[
        "patch",
        "statefulset",
        "svc-agent",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"annotations":{"svc.dev/skipreconcile":"true"}}}"#,
    ])
    .await;
    let annotations = k
        .run(&[
            "get",
            "statefulset",
            "svc-agent",
            "-o",
            "jsonpath={.metadata.annotations}",
        ])
        .await;
    let annotations: Value = serde_json::from_str(&annotations).unwrap();
    assert_eq!(annotations["svc.dev/skipreconcile"], "true");
    assert_eq!(annotations["debug.svc.dev/trigger-event"], "1");

    // Secrets, pods by label, leases, delete.
    // (`kubectl create secret generic` speaks protobuf, which the fake does not: YAML it is.)
    let secret = k.file(
        "secret.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: svc-agent-shared-state\ndata:\n  k: dg==\n",
    );
    k.run(&["create", "-f", &secret, "--validate=false"]).await;
    assert_eq!(
        api.get("Secret", "svc", "svc-agent-shared-state").unwrap()["data"]["k"],
        "dg=="
    );
    let pod = k.file(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: svc-agent-0\n  labels: {app: svc-agent}\nspec:\n  containers:\n  - {name: svc, image: x}\n",
    );
    let other = k.file(
        "other.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: other\n  labels: {app: other}\nspec:\n  containers:\n  - {name: o, image: x}\n",
    );
    k.run(&["create", "-f", &pod, "--validate=false"]).await;
    k.run(&["create", "-f", &other, "--validate=false"]).await;
    let selected = k.run(&["get", "pods", "-l", "app=svc-agent", "-o", "name"]).await;
    assert_eq!(selected.trim(), "pod/svc-agent-0");
    let lease = k.file(
        "lease.yaml",
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: svc-agent-updater\nspec:\n  holderIdentity: a\n",
    );
    k.run(&["create", "-f", &lease, "--validate=false"]).await;
    let holder = k
        .run(&[
            "get",
            "lease",
            "svc-agent-updater",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .await;
    assert_eq!(holder, "a");
    let out = k.run(&["delete", "pod", "svc-agent-0", "--wait=false"]).await;
    assert!(out.contains("deleted"), "{out}");
    assert!(api.get("Pod", "svc", "svc-agent-0").is_none());
    // Replace (PUT) of a Deployment, guarded by nothing but the name, then a stale one.
    let deployment = STS
        .replace("kind: StatefulSet", "kind: Deployment")
        .replace("  serviceName: svc-agent\n", "");
    let dfile = k.file("deploy.yaml", &deployment);
    k.run(&["create", "-f", &dfile, "--validate=false"]).await;
    let replaced = deployment.replace("replicas: 1", "replicas: 2");
    let rfile = k.file("deploy2.yaml", &replaced);
    k.run(&["replace", "-f", &rfile, "--validate=false"]).await;
    assert_eq!(
        api.get("Deployment", "svc", "svc-agent").unwrap()["spec"]["replicas"],
        2
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.method == "PUT" && r.path.ends_with("/deployments/svc-agent"))
    );
    let stale = replaced.replace(
        "  name: svc-agent\n",
        "  name: svc-agent\n  resourceVersion: \"1\"\n",
    );
    let sfile = k.file("deploy3.yaml", &stale);
    let conflict = within(
        Duration::from_secs(60),
        "kubectl replace (stale) finishing",
        k.command(&["replace", "-f", &sfile, "--validate=false"]).output(),
    )
    .await
    .unwrap();
    assert!(!conflict.status.success());
    assert!(String::from_utf8_lossy(&conflict.stderr).contains("the object has been modified"));
    // Creating twice conflicts, as a real server says.
    let again = within(
        Duration::from_secs(60),
        "kubectl create (again) finishing",
        k.command(&["create", "-f", &file, "--validate=false"]).output(),
    )
    .await
    .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_sees_changes() {
    let api = FakeApiServer::start().await;
    let k = Kubectl::new(&api);
    let file = k.file("sts.yaml", STS);
    k.run(&["create", "-f", &file, "--validate=false"]).await;
    let mut child = k
        .command(&["get", "statefulset", "svc-agent", "--watch", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(k.dir.path().join("watch.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let log = k.dir.path().join("watch.log");
    // kubectl prints each object as indented JSON ending in a "}" line of its own.
    let mut next = async || {
        let mut text = String::new();
        loop {
            let line = match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
                Ok(line) => line.unwrap().expect("kubectl get --watch ended"),
                Err(_) => panic!(
                    "kubectl get --watch printed nothing more: {}",
                    std::fs::read_to_string(&log).unwrap()
                ),
            };
            text.push_str(&line);
            if line == "}" {
                return serde_json::from_str::<Value>(&text).unwrap();
            }
        }
    };
    // The initial state: no annotation yet.
    assert!(next().await["metadata"]["annotations"]["n"].is_null());
    // kubectl prints the object it got, then opens its watch; change things only once the
    // watch is open, or the first change is folded into the watch's initial state.
    wait_until("kubectl's watch is open", || api.open_watches() >= 1).await;
    for n in ["1", "2"] {
        api.merge(
            "StatefulSet",
            "svc",
            "svc-agent",
            json!({"metadata": {"annotations": {"n": n}}}),
        );
        assert_eq!(next().await["metadata"]["annotations"]["n"], n);
    }
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_watch_gets_410_gone() {
    let api = FakeApiServer::start().await;
    let k = Kubectl::new(&api);
    let file = k.file("sts.yaml", STS);
    k.run(&["create", "-f", &file, "--validate=false"]).await;
    api.merge(
        "StatefulSet",
        "svc",
        "svc-agent",
        json!({"metadata": {"annotations": {"a": "b"}}}),
    );
    api.compact();
    let out = k
        .run(&[
            "get",
            "--raw",
            "/apis/apps/v1/namespaces/svc/statefulsets?watch=true&resourceVersion=1",
        ])
        .await;
    let event: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(event["type"], "ERROR");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(api.gone_watches(), 1);
    // A current resourceVersion still watches.
    let rv = api.resource_version();
    assert!(rv > 1);
}

/// The documented procedure: `kubectl annotate ... debug.svc.dev/trigger-event=1 --overwrite`
/// makes the updater reconcile at once; `kubectl patch` with the skip annotation suspends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_annotations_drive_the_controller() {
    let api = FakeApiServer::start().await;
    let k = Kubectl::new(&api);
    let file = k.file("sts.yaml", STS);
    k.run(&["create", "-f", &file, "--validate=false"]).await;
    let versions = VersionServer::start("stable/cloud", "v17.0.0", false).await;
    let metrics = Arc::new(Metrics::default());
    let mut config = UpdaterConfig::new(
        "svc",
        "svc-agent",
        WorkloadKind::StatefulSet,
        "svc",
        "public.ecr.aws/svc/svc-ent-distroless",
    );
    config.sync_period = Duration::from_secs(3600);
    let ctx = Arc::new(Context {
        client: api.client("svc"),
        config,
        target: Arc::new(support::version_client(channel_base_url(
            &versions.url(),
            "stable/cloud",
        ))),
        clock: Arc::new(SystemClock),
        metrics: metrics.clone(),
    });
    // The new image's pods come up ready, as a kubelet would make them.
    let kubelet = api.kubelet("StatefulSet", "svc", "svc-agent", "svc", |_| true);
    let task = tokio::spawn(controller::run(ctx));
    let load = |a: &prometheus_client::metrics::counter::Counter| a.get();
    wait_until("the first reconcile", || load(&metrics.reconciles_ok) == 1).await;

    k.run(&[
        "patch",
        "statefulset",
        "svc-agent",
        "-p",
        r#"{"metadata":{"annotations":{"svc.dev/skipreconcile":"true"}}}"#,
    ])
    .await;
    versions.set("v17.0.1", true);
    wait_until("the suspended reconcile", || load(&metrics.skipped) == 1).await;
    k.run(&[
        "annotate",
        "statefulset",
        "svc-agent",
        "svc.dev/skipreconcile-",
        "--overwrite",
    ])
    .await;
    wait_until("the update once resumed", || load(&metrics.updates) == 1).await;
    let image = k
        .run(&[
            "get",
            "statefulset",
            "svc-agent",
            "-o",
            "jsonpath={.spec.template.spec.containers[1].image}",
        ])
        .await;
    assert_eq!(image, "public.ecr.aws/svc/svc-ent-distroless:17.0.1");

    let before = load(&metrics.reconciles_ok);
    k.run(&[
        "annotate",
        "statefulset",
        "svc-agent",
        "debug.svc.dev/trigger-event=1",
        "--overwrite",
    ])
    .await;
    wait_until("the triggered reconcile", || {
        load(&metrics.reconciles_ok) > before
    })
    .await;
    task.abort();
    kubelet.abort();
}

/// A value of the shared-state Secret as the documentation reads it:
/// `kubectl get secret … -o jsonpath={.data.<key>}`, base64-decoded.
async fn secret_value(k: &Kubectl, key: &str) -> String {
    use base64::Engine as _;
    let encoded = k
        .run(&[
            "get",
            "secret",
            "svc-agent-shared-state",
            "-o",
            &format!("jsonpath={{.data.{key}}}"),
        ])
        .await;
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .unwrap_or_else(|e| panic!("{key}: {e}: {encoded:?}")),
    )
    .unwrap()
}

/// The documented rollback procedure: the status and the versions marked bad read with
/// `kubectl get secret`, the list cleared with `kubectl annotate … svc.dev/clear-bad-versions=true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_the_rollback_and_clears_the_bad_versions() {
    let api = FakeApiServer::start().await;
    let k = Kubectl::new(&api);
    let file = k.file("sts.yaml", STS);
    k.run(&["create", "-f", &file, "--validate=false"]).await;
    let versions = VersionServer::start("stable/cloud", "v17.1.0", true).await;
    let metrics = Arc::new(Metrics::default());
    let mut config = UpdaterConfig::new(
        "svc",
        "svc-agent",
        WorkloadKind::StatefulSet,
        "svc",
        "public.ecr.aws/svc/svc-ent-distroless",
    );
    config.sync_period = Duration::from_secs(3600);
    config.rollout_timeout = Duration::from_secs(1);
    config.rollout_poll = Duration::from_millis(50);
    let ctx = Arc::new(Context {
        client: api.client("svc"),
        config,
        target: Arc::new(support::version_client(channel_base_url(
            &versions.url(),
            "stable/cloud",
        ))),
        clock: Arc::new(SystemClock),
        metrics: metrics.clone(),
    });
    // 17.1.0 never becomes ready.
    let kubelet = api.kubelet("StatefulSet", "svc", "svc-agent", "svc", |image| {
        !image.ends_with(":17.1.0")
    });
    let task = tokio::spawn(controller::run(ctx));
    let load = |a: &prometheus_client::metrics::counter::Counter| a.get();
    wait_until("the rollback", || load(&metrics.rollbacks) == 1).await;
    let image = k
        .run(&[
            "get",
            "statefulset",
            "svc-agent",
            "-o",
            "jsonpath={.spec.template.spec.containers[1].image}",
        ])
        .await;
    assert_eq!(image, "public.ecr.aws/svc/svc-ent-distroless:17.0.0");
    assert_eq!(secret_value(&k, "agent-bad-versions").await, r#"["17.1.0"]"#);
    let status: Value = serde_json::from_str(&secret_value(&k, "agent-update-status").await).unwrap();
    assert_eq!(status["upgrader"], "kube");
    assert!(
        status["result"] == "rolled_back"
            || status["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("not installing v17.1.0 again"),
        "{status}"
    );

    k.run(&[
        "annotate",
        "statefulset",
        "svc-agent",
        "svc.dev/clear-bad-versions=true",
    ])
    .await;
    wait_until("the retry, rolled back again", || load(&metrics.rollbacks) == 2).await;
    let annotations = k
        .run(&[
            "get",
            "statefulset",
            "svc-agent",
            "-o",
            "jsonpath={.metadata.annotations}",
        ])
        .await;
    assert!(
        !annotations.contains("svc.dev/clear-bad-versions"),
        "the updater removes the annotation: {annotations}"
    );
    task.abort();
    kubelet.abort();
}

/// `kubectl replace` with a stale resourceVersion is refused with a conflict, as the identity
/// store's updates rely on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_replace_of_a_stale_secret_is_a_conflict() {
    let api = FakeApiServer::start().await;
    let k = Kubectl::new(&api);
    let file = k.file(
        "secret.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: svc-agent-0-state\n  namespace: svc\ndata:\n  a: MQ==\n",
    );
    k.run(&["create", "-f", &file, "--validate=false"]).await;
    let stale = k.run(&["get", "secret", "svc-agent-0-state", "-o", "json"]).await;
    k.run(&[
        "patch",
        "secret",
        "svc-agent-0-state",
        "-p",
        r#"{"data":{"a":"Mg=="}}"#,
    ])
    .await;
    let file = k.file("stale.json", &stale);
    let out = within(
        Duration::from_secs(60),
        "kubectl replace finishing",
        k.command(&["replace", "-f", &file, "--validate=false"]).output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a stale replace must fail");
    assert!(stderr.contains("the object has been modified"), "{stderr}");
    let value = k
        .run(&["get", "secret", "svc-agent-0-state", "-o", "jsonpath={.data.a}"])
        .await;
    assert_eq!(value, "Mg==", "the newer value stays");
}

/// The pod subresources: `kubectl exec` over WebSocket (v5) runs the command, stdin included,
/// and `kubectl logs -f` streams each line as it is appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_and_logs_follow() {
    let api = FakeApiServer::start().await;
    let k = Kubectl::new(&api);
    api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "svc"},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["cat"]}]},
        "status": {"phase": "Running"}}));
    assert_eq!(k.run(&["exec", "web", "--", "echo", "hi"]).await, "hi\n");
    // attach: the container's command (cat) with kubectl's stdin.
    let mut attach = k.command(&["attach", "-i", "web"]);
    attach
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = attach.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"attached\n")
        .await
        .unwrap();
    drop(stdin);
    let out = within(
        Duration::from_secs(60),
        "kubectl attach finishing",
        child.wait_with_output(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "attached\n");
    // Over SPDY/3.1 (v4.channel.k8s.io) too, stdin ending with its stream.
    let mut spdy = k.command(&["exec", "-i", "web", "--", "sh", "-c", "cat; echo err >&2"]);
    spdy.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spdy.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"over spdy\n")
        .await
        .unwrap();
    drop(stdin);
    let out = within(
        Duration::from_secs(60),
        "kubectl exec over SPDY finishing",
        child.wait_with_output(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "over spdy\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    let exec_upgrades: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/exec") || r.path.ends_with("/attach"))
        .map(|r| r.upgrade)
        .collect();
    assert_eq!(exec_upgrades, ["websocket", "websocket", "SPDY/3.1"]);

    let mut cat = k.command(&["exec", "-i", "web", "--", "cat"]);
    cat.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cat.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"through stdin\n")
        .await
        .unwrap();
    drop(stdin);
    let out = within(
        Duration::from_secs(60),
        "kubectl exec -i cat finishing",
        child.wait_with_output(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through stdin\n");

    let out = k.command(&["exec", "web", "--", "false"]).output().await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    api.append_log("svc", "web", "first line");
    let mut child = k
        .command(&["logs", "-f", "web"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        within(
            Duration::from_secs(30),
            "kubectl logs -f printing a line",
            lines.next_line(),
        )
        .await
        .unwrap()
        .expect("kubectl logs -f ended")
    };
    assert_eq!(next().await, "first line");
    api.append_log("svc", "web", "second line");
    assert_eq!(next().await, "second line");
    child.kill().await.unwrap();
}

/// `kubectl port-forward` carries an HTTP request to a port of the "pod" (this machine), over
/// SPDY/3.1 tunnelled in WebSocket (kubectl's default) and bare SPDY/3.1
/// (`KUBECTL_PORT_FORWARD_WEBSOCKETS=false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward_carries_a_request() {
    let api = FakeApiServer::start().await;
    let k = Kubectl::new(&api);
    api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "svc"},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
        "status": {"phase": "Running"}}));
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target_port = target.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = target.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nfrom the pod",
                    )
                    .await;
            });
        }
    });
    for websockets in ["true", "false"] {
        let log = k.dir.path().join(format!("port-forward-{websockets}.log"));
        let mut child = k
            .command(&["port-forward", "pod/web", &format!(":{target_port}")])
            .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // "Forwarding from 127.0.0.1:<local> -> <target>"
        let line = within(
            Duration::from_secs(30),
            "kubectl port-forward listening",
            lines.next_line(),
        )
        .await
        .unwrap()
        .expect("kubectl port-forward ended");
        let local: u16 = line
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|r| r.split(' ').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected port-forward line {line:?}"));
        let out = within(
            Duration::from_secs(60),
            "curl through kubectl port-forward",
            tokio::process::Command::new("curl")
                .args(["-sS", "--max-time", "30"])
                .arg(format!("http://127.0.0.1:{local}/"))
                .output(),
        )
        .await
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "from the pod",
            "websockets {websockets}: curl: {}\nkubectl: {}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap()
        );
        child.kill().await.unwrap();
        let upgrades: Vec<String> = api
            .requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/portforward"))
            .map(|r| r.upgrade)
            .collect();
        let expected = if websockets == "true" {
            "websocket"
        } else {
            "SPDY/3.1"
        };
        assert_eq!(
            upgrades.last().map(String::as_str),
            Some(expected),
            "{upgrades:?}"
        );
    }
}

//! End to end: applications, databases and desktops through the real binaries. `svc start`
//! runs Auth, Proxy and an agent with the Application, Database and Windows Desktop services
//! (reverse tunnel to its own proxy). Real resources: PostgreSQL (`initdb`/`pg_ctl`, TLS on
//! with a test CA, non-TLS connections rejected by `pg_hba.conf`), MariaDB and a TLS-only
//! `redis-server` with ACL users (native clients with `tsh db login` certificates),
//! `python3 -m http.server`,
//! and a `socat` echo server standing in for a desktop host. Real clients: `psql` through
//! `tsh proxy db`, `curl` through `tsh proxy app`, raw TCP through `tsh proxy desktop`. A user
//! whose roles do not match the resources' labels is refused for each kind, with a message
//! naming the resource.

mod common;
#[path = "../../svc-update/tests/support/mod.rs"]
mod support;

use svc_testkit::wait::OutputWithin;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Cluster;
use common::resources::{
    KubeApi, PASSWORD, Proc, User, echo_server, free_port, kube_curl, require, test_ca, wait_listening,
};

/// The PostgreSQL server binaries (initdb, pg_ctl), which Debian keeps out of PATH.
fn pg_bin(tool: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.into_iter()
        .rev()
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{tool} is not installed: apt-get install postgresql"))
}

/// A PostgreSQL server with TLS required, run as the `postgres` user; stopped on drop.
struct Postgres {
    data: PathBuf,
    port: u16,
    ctl: PathBuf,
}

fn as_postgres(cmd: &Path) -> Command {
    // Running as root: PostgreSQL refuses root, so run as its own user.
    let mut c = Command::new(require("runuser", "util-linux"));
    c.args(["-u", "postgres", "--"]).arg(cmd);
    c
}

impl Postgres {
    fn start(dir: &Path, cert: &str, key: &str) -> Postgres {
        let data = dir.join("pg");
        std::fs::create_dir_all(&data).unwrap();
        let chown = |p: &Path| {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(p)
                .status()
                .unwrap();
            assert!(ok.success());
        };
        chown(&data);
        let out = as_postgres(&pg_bin("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(data.join("server.crt"), cert).unwrap();
        std::fs::write(data.join("server.key"), key).unwrap();
        let port = free_port();
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        write!(
            conf,
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nssl = on\n",
            data.display()
        )
        .unwrap();
        // Only TLS connections are let in: the agent must have done the TLS handshake.
        std::fs::write(
            data.join("pg_hba.conf"),
            "hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\nlocal all all trust\n",
        )
        .unwrap();
        chown(&data);
        let ok = Command::new("chmod")
            .arg("0600")
            .arg(data.join("server.key"))
            .status()
            .unwrap();
        assert!(ok.success());
        let ctl = pg_bin("pg_ctl");
        let out = as_postgres(&ctl)
            .args(["-w", "-l"])
            .arg(data.join("log"))
            .arg("-D")
            .arg(&data)
            .arg("start")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            std::fs::read_to_string(data.join("log")).unwrap_or_default()
        );
        Postgres { data, port, ctl }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_postgres(&self.ctl)
            .args(["-m", "immediate", "-D"])
            .arg(&self.data)
            .arg("stop")
            .output();
    }
}

/// `python3 -m http.server` on a free port serving `dir`.
fn http_server(dir: &Path) -> (Proc, u16) {
    let port = free_port();
    let child = Command::new(require("python3", "python3"))
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(port.to_string())
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let proc = Proc(child);
    wait_listening(port, "python3 -m http.server");
    (proc, port)
}

fn psql(port: u16, sql: &str) -> std::process::Output {
    let mut psql = Command::new(require("psql", "postgresql-client"));
    psql.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "postgres",
        "-d",
        "postgres",
    ])
    .args(["-X", "-A", "-t", "-c", sql])
    .env("PGCONNECT_TIMEOUT", "30");
    common::wait::run_within(&mut psql, common::wait::STEP, &format!("psql -c {sql:?}")).unwrap()
}

fn curl(port: u16) -> std::process::Output {
    Command::new(require("curl", "curl"))
        .args(["-sS", "--max-time", "30"])
        .arg(format!("http://127.0.0.1:{port}/hello.txt"))
        .output()
        .unwrap()
}

#[test]
fn psql_curl_and_desktop_tcp_through_local_proxies_with_rbac_by_labels() {
    require("psql", "postgresql-client");
    pg_bin("initdb");
    let dir = tempfile::tempdir().unwrap();
    // PostgreSQL runs as `postgres`: it must reach its directory.
    let ok = Command::new("chmod")
        .arg("0755")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(ok.success());
    let (ca, cert, key) = test_ca();
    let ca_file = dir.path().join("db-ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let pg = Postgres::start(dir.path(), &cert, &key);
    let site = dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hello from the app\n").unwrap();
    let (_http, http_port) = http_server(&site);
    let (_echo, echo_port) = echo_server();
    // A desktop host nobody listens on: the agent's reason for refusing the dial reaches tsh.
    let closed_port = svc_testkit::free_port("127.0.0.1");

    let services = format!(
        "app_service:\n  enabled: true\n  apps:\n  - name: web\n    uri: http://127.0.0.1:{http_port}\n    labels: {{env: dev}}\n\
db_service:\n  enabled: true\n  databases:\n  - name: pg\n    protocol: postgres\n    uri: 127.0.0.1:{}\n    labels: {{env: dev}}\n    tls:\n      ca_cert_file: {}\n      server_name: localhost\n\
windows_desktop_service:\n  enabled: true\n  hosts:\n  - name: win\n    addr: 127.0.0.1:{echo_port}\n    labels: {{env: dev}}\n  - name: gone\n    addr: 127.0.0.1:{closed_port}\n    labels: {{env: dev}}\n",
        pg.port,
        ca_file.display()
    );
    let cluster = Cluster::start_extra("info", &services);
    let prod_only = "kind: role\nversion: v7\nmetadata:\n  name: prod-only\nspec:\n  allow:\n    app_labels: {env: prod}\n    db_labels: {env: prod}\n    windows_desktop_labels: {env: prod}\n";
    cluster
        .tctl_admin(
            &[
                "create",
                &cluster.write("prod-only.yaml", prod_only).to_string_lossy(),
            ],
            None,
        )
        .ok();
    for (name, role) in [("alice", "access"), ("bob", "prod-only")] {
        cluster
            .tctl_admin(
                &[
                    "users",
                    "add",
                    name,
                    &format!("--roles={role}"),
                    "--password-stdin",
                ],
                Some(PASSWORD),
            )
            .ok();
    }
    let alice = User::login(&cluster, "alice");
    let bob = User::login(&cluster, "bob");

    // Listings show what the labels allow.
    let apps = alice.tsh(&["apps", "ls"]);
    assert!(apps.contains("web") && apps.contains("env=dev"), "{apps}");
    let dbs = alice.tsh(&["db", "ls", "-f", "json"]);
    let dbs: serde_json::Value = serde_json::from_str(&dbs).unwrap();
    assert_eq!(dbs[0]["name"], "pg");
    assert_eq!(dbs[0]["protocol"], "postgres");
    assert!(!bob.tsh(&["desktops", "ls"]).contains("win"));

    // psql through `tsh proxy db`, unchanged; the server only admits TLS (the agent's).
    let (_db, db_port, db_err) = alice.proxy("db", "pg").expect("tsh proxy db");
    let out = psql(db_port, "select 40 + 2");
    assert!(
        out.status.success(),
        "psql: {}\ntsh: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&db_err).unwrap_or_default(),
        cluster.stderr()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    let out = psql(
        db_port,
        "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "t", "{out:?}");

    // curl through `tsh proxy app`.
    let (_app, app_port, app_err) = alice.proxy("app", "web").expect("tsh proxy app");
    let out = curl(app_port);
    assert!(
        out.status.success(),
        "curl: {}\ntsh: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&app_err).unwrap_or_default()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from the app\n");

    // Raw TCP to the desktop host through `tsh proxy desktop`.
    let (_desk, desk_port, _) = alice.proxy("desktop", "win").expect("tsh proxy desktop");
    let mut s = TcpStream::connect(("127.0.0.1", desk_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"rdp bytes").unwrap();
    let mut buf = [0u8; 9];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"rdp bytes");

    // bob's role allows only env=prod: refused for each kind, the message naming it.
    let err = bob
        .proxy("db", "pg")
        .err()
        .expect("bob must be refused the database");
    assert!(err.contains("access denied to db \"pg\""), "{err}");
    let (_app, app_port, app_err) = bob.proxy("app", "web").expect("tsh proxy app starts");
    let out = curl(app_port);
    assert!(!out.status.success(), "curl must fail for bob: {out:?}");
    let (_desk, desk_port, desk_err) = bob.proxy("desktop", "win").expect("tsh proxy desktop starts");
    let mut s = TcpStream::connect(("127.0.0.1", desk_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(b"x");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "bob's desktop connection carried bytes: {rest:?}"
    );
    drop(s);
    // tsh reports the proxy's refusal per connection on its stderr.
    let wait_for = |file: &Path, text: &str| {
        common::wait::wait_until(
            Duration::from_secs(30),
            &format!("{text:?} in tsh's stderr ({})", file.display()),
            || std::fs::read_to_string(file).unwrap_or_default().contains(text),
        );
    };
    wait_for(&app_err, "access denied to app \"web\"");
    wait_for(&desk_err, "access denied to windows_desktop \"win\"");

    // An unknown resource is named too.
    let (_x, x_port, x_err) = alice.proxy("app", "nope").expect("tsh proxy app starts");
    let _ = curl(x_port);
    wait_for(&x_err, "app \"nope\" not found");

    // A desktop whose host refuses connections: tsh names the agent's reason — the refused
    // connection and the address — not just that the agent could not open it.
    let (_gone, gone_port, gone_err) = alice.proxy("desktop", "gone").expect("tsh proxy desktop starts");
    let mut s = TcpStream::connect(("127.0.0.1", gone_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(b"x");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "a refused desktop carried bytes: {rest:?}");
    drop(s);
    wait_for(
        &gone_err,
        &format!("connecting to windows_desktop \"gone\" at 127.0.0.1:{closed_port}: Connection refused"),
    );
}

#[test]
fn kubernetes_requests_reach_the_api_server_with_the_agents_token_and_the_users_identity() {
    let dir = tempfile::tempdir().unwrap();
    let token = "agent-service-account-token";
    let api = KubeApi::start(dir.path(), token);
    let (api_port, ca_file, token_file) = (api.port, &api.ca_file, &api.token_file);

    let services = format!(
        "kubernetes_service:\n  enabled: true\n  api_url: https://127.0.0.1:{api_port}\n  ca_file: {}\n  token_file: {}\n  labels: {{env: dev}}\n",
        ca_file.display(),
        token_file.display()
    );
    let cluster = Cluster::start_extra("info", &services);
    let prod_only = "kind: role\nversion: v7\nmetadata:\n  name: prod-only\nspec:\n  allow:\n    kubernetes_labels: {env: prod}\n";
    cluster
        .tctl_admin(
            &[
                "create",
                &cluster.write("prod-only.yaml", prod_only).to_string_lossy(),
            ],
            None,
        )
        .ok();
    for (name, role) in [("alice", "access"), ("bob", "prod-only")] {
        cluster
            .tctl_admin(
                &[
                    "users",
                    "add",
                    name,
                    &format!("--roles={role}"),
                    "--password-stdin",
                ],
                Some(PASSWORD),
            )
            .ok();
    }
    let alice = User::login(&cluster, "alice");
    let bob = User::login(&cluster, "bob");

    let (code, body) = kube_curl(&cluster, &alice, "/api/v1/namespaces?limit=1");
    assert_eq!(code, "200", "{body}\nsvc: {}", cluster.stderr());
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["user"], "alice", "{body}");
    assert_eq!(json["group"], "access", "{body}");
    assert_eq!(json["path"], "/api/v1/namespaces?limit=1", "{body}");

    let (code, body) = kube_curl(&cluster, &bob, "/api/v1/namespaces");
    assert_eq!(code, "403", "{body}");
    assert!(
        body.contains("access denied to kube_cluster \\\"e2e.test\\\""),
        "{body}"
    );
}

#[test]
fn kubectl_with_the_kubeconfig_from_tsh_kube_login() {
    let kubectl = require("kubectl", "kubectl");
    let dir = tempfile::tempdir().unwrap();
    let token = "kubectl-agent-token";
    let api = KubeApi::start(dir.path(), token);
    let (api_port, ca_file, token_file) = (api.port, &api.ca_file, &api.token_file);
    let services = format!(
        "kubernetes_service:\n  enabled: true\n  kube_cluster_name: lab\n  api_url: https://127.0.0.1:{api_port}\n  ca_file: {}\n  token_file: {}\n",
        ca_file.display(),
        token_file.display()
    );
    let cluster = Cluster::start_extra("info", &services);
    cluster
        .tctl_admin(
            &["users", "add", "alice", "--roles=access", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    let alice = User::login(&cluster, "alice");
    assert!(alice.tsh(&["kube", "ls"]).contains("lab"));
    let export = alice.tsh(&["kube", "login", "lab"]);
    let kubeconfig = export
        .trim()
        .strip_prefix("export KUBECONFIG=")
        .expect("export line")
        .to_owned();
    let out = Command::new(kubectl)
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
        "kubectl: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        cluster.stderr()
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["user"], "alice");
    assert_eq!(json["path"], "/api/v1/namespaces/default");
}

/// `kubectl` on a stream of its own: each line of its standard output on a channel, its
/// standard error in a file.
struct Streaming {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    stderr: PathBuf,
}

impl Streaming {
    fn start(kubectl: &Path, kubeconfig: &Path, args: &[&str], stderr: PathBuf) -> Streaming {
        Streaming::start_with(kubectl, kubeconfig, args, &[], stderr)
    }

    fn start_with(
        kubectl: &Path,
        kubeconfig: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        stderr: PathBuf,
    ) -> Streaming {
        let mut child = Command::new(kubectl)
            .envs(env.iter().copied())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Streaming { child, lines, stderr }
    }

    /// Reads lines until `expected` (earlier ones are state from before), each within
    /// [`common::wait::STEP`].
    fn until(&self, expected: &str, what: &str) {
        self.first(what, |line| (line == expected).then_some(()));
    }

    /// The first line `pick` takes (each line within [`common::wait::STEP`]).
    fn first<T>(&self, what: &str, pick: impl Fn(&str) -> Option<T>) -> T {
        loop {
            let line = self.lines.recv_timeout(common::wait::STEP).unwrap_or_else(|e| {
                panic!(
                    "{what}: no such line ({e}); kubectl: {}",
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                )
            });
            if let Some(found) = pick(&line) {
                return found;
            }
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The kubectl commands that switch protocols or stream, run against the fake API server
/// directly (keeping the fake honest) and then through svc (`tsh kube login`'s kubeconfig →
/// the proxy's Kubernetes route → tunnel → agent → API server) with the same results: `exec`
/// (WebSocket `v5.channel.k8s.io`, with and without stdin, and a failing command's exit
/// code; SPDY/3.1 `v4.channel.k8s.io` as older clients use), `attach -i`, `cp` both ways (tar through exec), `port-forward` (SPDY/3.1 in WebSocket and bare)
/// carrying curl's requests to a local HTTP server, `logs -f` receiving a line appended while it
/// follows, and `get -w` receiving an event.
#[test]
fn kubectl_exec_cp_logs_follow_and_watch_through_the_kube_route() {
    let kubectl = require("kubectl", "kubectl");
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt.block_on(support::fake_apiserver::FakeApiServer::start());
    let pod = |name: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["cat"]}]},
            "status": {"phase": "Running"}})
    };
    api.insert(pod("web"));
    let services = format!(
        "kubernetes_service:\n  enabled: true\n  kube_cluster_name: lab\n  api_url: {}\n",
        api.url()
    );
    let cluster = Cluster::start_extra("info", &services);
    cluster
        .tctl_admin(
            &["users", "add", "alice", "--roles=access", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    let alice = User::login(&cluster, "alice");
    let export = alice.tsh(&["kube", "login", "lab"]);
    let through_svc = PathBuf::from(
        export
            .trim()
            .strip_prefix("export KUBECONFIG=")
            .expect("export line"),
    );
    let site = dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hello through port-forward\n").unwrap();
    let (_http, http_port) = http_server(&site);
    let direct = dir.path().join("direct.kubeconfig");
    std::fs::write(&direct, api.kubeconfig("default")).unwrap();

    for (how, kubeconfig) in [("direct", &direct), ("svc", &through_svc)] {
        let run = |args: &[&str], stdin: Option<&str>| -> std::process::Output {
            let mut cmd = Command::new(&kubectl);
            cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
            let what = format!("kubectl {args:?} ({how})");
            match stdin {
                None => cmd.output_within(common::wait::STEP, &what).unwrap(),
                Some(text) => {
                    let mut child = cmd
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap();
                    let mut input = child.stdin.take().unwrap();
                    input.write_all(text.as_bytes()).unwrap();
                    drop(input);
                    svc_testkit::wait::output_within(child, common::wait::STEP, &what)
                }
            }
        };
        let ok = |args: &[&str], stdin: Option<&str>| -> String {
            let out = run(args, stdin);
            assert!(
                out.status.success(),
                "kubectl {args:?} ({how}): {}\nsvc: {}",
                String::from_utf8_lossy(&out.stderr),
                cluster.stderr()
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };

        // exec: output, stdin (closed by the v5 close signal), a failing command's exit code.
        assert_eq!(ok(&["exec", "web", "--", "echo", "hi"], None), "hi\n", "{how}");
        assert_eq!(
            ok(&["exec", "-i", "web", "--", "cat"], Some("through stdin\n")),
            "through stdin\n",
            "{how}"
        );
        // attach: to the container's command (cat), kubectl's stdin in, its output back.
        assert_eq!(
            ok(&["attach", "-i", "web"], Some("attached\n")),
            "attached\n",
            "{how}"
        );
        let out = run(&["exec", "web", "--", "sh", "-c", "exit 3"], None);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        // exec over SPDY/3.1 (v4.channel.k8s.io), as older clients do: stdin, stdout, stderr.
        let mut child = Command::new(&kubectl)
            .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["exec", "-i", "web", "--", "sh", "-c", "cat; echo err >&2"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(b"over spdy\n").unwrap();
        drop(input);
        let out = svc_testkit::wait::output_within(child, common::wait::STEP, "kubectl exec over SPDY");
        assert!(
            out.status.success(),
            "{how}: {}\nsvc: {}",
            String::from_utf8_lossy(&out.stderr),
            cluster.stderr()
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "over spdy\n", "{how}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n", "{how}");
        let last_exec = api
            .requests()
            .into_iter()
            .rfind(|r| r.path.ends_with("/exec"))
            .map(|r| r.upgrade);
        assert_eq!(last_exec.as_deref(), Some("SPDY/3.1"), "{how}");

        // cp both ways: kubectl runs tar in the "pod" through exec.
        let local = dir.path().join(format!("local-{how}.txt"));
        std::fs::write(&local, format!("copied {how}\n")).unwrap();
        let in_pod = dir.path().join(format!("pod-{how}"));
        std::fs::create_dir_all(&in_pod).unwrap();
        let in_pod_file = in_pod.join("copy.txt");
        ok(
            &[
                "cp",
                &local.to_string_lossy(),
                &format!("web:{}", in_pod_file.display()),
            ],
            None,
        );
        assert_eq!(
            std::fs::read_to_string(&in_pod_file).unwrap(),
            format!("copied {how}\n")
        );
        let back = dir.path().join(format!("back-{how}.txt"));
        ok(
            &[
                "cp",
                &format!("web:{}", in_pod_file.display()),
                &back.to_string_lossy(),
            ],
            None,
        );
        assert_eq!(std::fs::read_to_string(&back).unwrap(), format!("copied {how}\n"));

        // port-forward, over SPDY/3.1 tunnelled in WebSocket (kubectl's default) and bare
        // SPDY/3.1: curl through kubectl's local port reaches the "pod's" HTTP server.
        for (websockets, upgrade) in [("true", "websocket"), ("false", "SPDY/3.1")] {
            let forward = Streaming::start_with(
                &kubectl,
                kubeconfig,
                &["port-forward", "pod/web", &format!(":{http_port}")],
                &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets)],
                dir.path().join(format!("port-forward-{how}-{websockets}.err")),
            );
            let local: u16 = forward.first("kubectl port-forward listening", |line| {
                line.strip_prefix("Forwarding from 127.0.0.1:")
                    .and_then(|r| r.split(' ').next())
                    .and_then(|p| p.parse().ok())
            });
            for _ in 0..2 {
                let out = Command::new(require("curl", "curl"))
                    .args(["-sS", "--max-time", "30"])
                    .arg(format!("http://127.0.0.1:{local}/hello.txt"))
                    .output_within(common::wait::STEP, "curl through kubectl port-forward")
                    .unwrap();
                assert_eq!(
                    String::from_utf8_lossy(&out.stdout),
                    "hello through port-forward\n",
                    "{how} ({upgrade}): curl: {}\nkubectl: {}\nsvc: {}",
                    String::from_utf8_lossy(&out.stderr),
                    std::fs::read_to_string(&forward.stderr).unwrap_or_default(),
                    cluster.stderr()
                );
            }
            drop(forward);
            let seen: Vec<String> = api
                .requests()
                .into_iter()
                .filter(|r| r.path.ends_with("/portforward"))
                .map(|r| r.upgrade)
                .collect();
            assert_eq!(seen.last().map(String::as_str), Some(upgrade), "{how}: {seen:?}");
        }

        // logs -f: a line appended while kubectl follows arrives while the stream stays open.
        api.append_log("default", "web", &format!("{how} one"));
        let logs = Streaming::start(
            &kubectl,
            kubeconfig,
            &["logs", "-f", "web"],
            dir.path().join(format!("logs-{how}.err")),
        );
        logs.until(&format!("{how} one"), "kubectl logs -f, the first lines");
        api.append_log("default", "web", &format!("{how} two"));
        logs.until(&format!("{how} two"), "kubectl logs -f, the appended line");
        drop(logs);

        // get -w: an event after the watch opened arrives.
        let watches = api.open_watches();
        let watch = Streaming::start(
            &kubectl,
            kubeconfig,
            &["get", "pods", "-w", "-o", "name"],
            dir.path().join(format!("watch-{how}.err")),
        );
        watch.until("pod/web", "kubectl get -w, the initial list");
        common::wait::wait_until(common::wait::STEP, "kubectl's watch is open", || {
            api.open_watches() > watches
        });
        let name = format!("added-{how}");
        api.insert(pod(&name));
        watch.until(&format!("pod/{name}"), "kubectl get -w, the event");
    }
    drop(rt);
}

/// Separate ports (TLS routing off): `ping`'s database members name listeners that really
/// answer (Postgres takes an SSLRequest, MySQL, MongoDB and Redis accept TLS), the local
/// proxies still work through the web port, and `kube_listen_addr` is bound: `tsh kube login`
/// points kubectl at it and kubectl gets through.
#[test]
fn separate_ports_are_what_ping_says_and_local_proxies_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hello from the app\n").unwrap();
    let (_http, http_port) = http_server(&site);
    let api = KubeApi::start(dir.path(), "separate-mode-token");
    let services = format!(
        "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n  proxy_listener_mode: separate\n\
proxy_service:\n  web_listen_addr: 127.0.0.1:0\n  listen_addr: 127.0.0.1:0\n  tunnel_listen_addr: 127.0.0.1:0\n  postgres_listen_addr: 127.0.0.1:0\n  mysql_listen_addr: 127.0.0.1:0\n  mongo_listen_addr: 127.0.0.1:0\n  redis_listen_addr: 127.0.0.1:0\n  kube_listen_addr: 127.0.0.1:0\n\
app_service:\n  enabled: true\n  apps:\n  - name: web\n    uri: http://127.0.0.1:{http_port}\n\
kubernetes_service:\n  enabled: true\n  kube_cluster_name: lab\n  api_url: https://127.0.0.1:{}\n  ca_file: {}\n  token_file: {}\n",
        api.port,
        api.ca_file.display(),
        api.token_file.display()
    );
    let cluster = Cluster::start_with(tempfile::tempdir().unwrap(), "info", &services);
    let out = Command::new(require("curl", "curl"))
        .args(["-sSk", "--max-time", "30"])
        .arg(format!("https://{}/webapi/ping", cluster.web_addr))
        .output()
        .unwrap();
    let ping: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ping json");
    let p = &ping["proxy"];
    assert_eq!(p["tls_routing_enabled"], false, "{ping}");
    let addr = |field: &str| -> String {
        let a = p["db"][field].as_str().unwrap_or_default().to_owned();
        assert!(
            a.starts_with("127.0.0.1:") && !a.ends_with(":0"),
            "{field}: {ping}"
        );
        a
    };
    // Postgres: the SSLRequest is answered `S` (TLS follows).
    let mut pg = TcpStream::connect(addr("postgres_public_addr")).unwrap();
    pg.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    pg.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).unwrap();
    let mut answer = [0u8; 1];
    pg.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"S");
    // MySQL: svc greets as a MySQL server offering TLS (STARTTLS-style, as native clients
    // expect); MongoDB and Redis: TLS listeners. Either way a handshake gets a server
    // certificate back.
    for (field, starttls) in [
        ("mysql_listen_addr", Some("mysql")),
        ("mongo_listen_addr", None),
        ("redis_listen_addr", None),
        ("redis_public_addr", None),
    ] {
        let out = Command::new(require("openssl", "openssl"))
            .args(["s_client", "-connect", &addr(field)])
            .args(starttls.map(|p| ["-starttls", p]).into_iter().flatten())
            .output_within(common::wait::STEP, &format!("openssl s_client to {field}"))
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("BEGIN CERTIFICATE"), "{field}: {text}");
    }

    cluster
        .tctl_admin(
            &["users", "add", "alice", "--roles=access", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    let alice = User::login(&cluster, "alice");
    let (_app, app_port, app_err) = alice.proxy("app", "web").expect("tsh proxy app");
    let out = curl(app_port);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from the app\n",
        "curl: {}\ntsh: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&app_err).unwrap_or_default(),
        cluster.stderr()
    );

    // The Kubernetes listener: advertised with the port bound, and what the kubeconfig uses.
    let kube = p["kube"]["public_addr"].as_str().unwrap_or_default().to_owned();
    assert!(
        p["kube"]["enabled"] == true && kube.starts_with("127.0.0.1:") && !kube.ends_with(":0"),
        "{ping}"
    );
    assert_ne!(kube, cluster.web_addr, "{ping}");
    let export = alice.tsh(&["kube", "login", "lab"]);
    let kubeconfig = export
        .trim()
        .strip_prefix("export KUBECONFIG=")
        .expect("export line")
        .to_owned();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kubeconfig).unwrap()).unwrap();
    assert_eq!(
        config["clusters"][0]["cluster"]["server"],
        format!("https://{kube}"),
        "{config}"
    );
    let out = Command::new(require("kubectl", "kubectl"))
        .args([
            "--kubeconfig",
            &kubeconfig,
            "get",
            "--raw",
            "/api/v1/namespaces/default",
        ])
        .output_within(common::wait::STEP, "kubectl get --raw via kube_listen_addr")
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        cluster.stderr()
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["user"], "alice");
    assert_eq!(json["path"], "/api/v1/namespaces/default");

    // Without the SNI naming the cluster, the listener says what is missing.
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(alice.home.join("profile.json")).unwrap()).unwrap();
    let (cert, key) = (dir.path().join("alice.pem"), dir.path().join("alice-key.pem"));
    std::fs::write(&cert, profile["identity"]["tls_cert_pem"].as_str().unwrap()).unwrap();
    std::fs::write(&key, profile["identity"]["tls_key_pem"].as_str().unwrap()).unwrap();
    let out = Command::new(require("curl", "curl"))
        .args(["-sSk", "--max-time", "30", "-w", "\n%{http_code}", "--cert"])
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .arg(format!("https://{kube}/api"))
        .output_within(common::wait::STEP, "curl to kube_listen_addr without SNI")
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.ends_with("\n400") && text.contains("no Kubernetes cluster named"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The header-echoing app (`tests/apps/echo_headers.py`) on a port it picks; returns its port.
fn echo_headers_app() -> (Proc, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/echo_headers.py");
    let mut child = Command::new(require("python3", "python3"))
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let proc = Proc(child);
    let port = common::wait::first_line(out, common::wait::STEP, |l| l.trim().parse::<u16>().ok())
        .unwrap_or_else(|e| panic!("{} printed no port: {e}", script.display()));
    (proc, port)
}

/// The header values the app saw for `name` (case-insensitive), from its JSON answer.
fn seen(headers: &serde_json::Value, name: &str) -> Vec<String> {
    headers
        .as_array()
        .expect("a list of headers")
        .iter()
        .filter(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .map(|h| h[1].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A user forges svc's identity headers with curl through `tsh proxy app`: the app sees svc's
/// values (the certificate's user and roles, the client address the proxy saw), never the
/// forged ones, and other headers unchanged; an upgrade (`101 Switching Protocols`) still
/// carries bytes both ways.
#[test]
fn app_access_replaces_forged_identity_headers_and_keeps_upgrades() {
    let (_app, app_port) = echo_headers_app();
    let services = format!(
        "app_service:\n  enabled: true\n  apps:\n  - name: echo\n    uri: http://127.0.0.1:{app_port}\n"
    );
    let cluster = Cluster::start_extra("info", &services);
    cluster
        .tctl_admin(
            &["users", "add", "alice", "--roles=access", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    let alice = User::login(&cluster, "alice");
    let (_proxy, port, tsh_err) = alice.proxy("app", "echo").expect("tsh proxy app");
    let url = format!("http://127.0.0.1:{port}/");
    for round in 0..2 {
        // Twice on one connection (keep-alive), then on a new one.
        let out = Command::new(require("curl", "curl"))
            .args(["-sS", "--max-time", "30"])
            .args(["-H", "X-Svc-User: admin", "-H", "X-Svc-Roles: editor"])
            .args([
                "-H",
                "Svc-Jwt-Assertion: forged",
                "-H",
                "X-Forwarded-For: 10.9.9.9",
            ])
            .args([
                "-H",
                "X-Forwarded-Host: evil.example.com",
                "-H",
                "Forwarded: for=10.9.9.9",
            ])
            .args(["-H", "X-Real-IP: 10.9.9.9", "-H", "X-Custom: kept"])
            .arg(&url)
            .args(["--next", "-sS", "--max-time", "30", "-H", "x-svc-user: root"])
            .arg(&url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "curl round {round}: {}\ntsh: {}\nsvc: {}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&tsh_err).unwrap_or_default(),
            cluster.stderr()
        );
        // Two JSON documents back to back.
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&text)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(docs.len(), 2, "{text}");
        for headers in &docs {
            assert_eq!(seen(headers, "x-svc-user"), ["alice"], "{headers}");
            assert_eq!(seen(headers, "x-svc-roles"), ["access"], "{headers}");
            assert_eq!(seen(headers, "x-forwarded-for"), ["127.0.0.1"], "{headers}");
            for forged in ["svc-jwt-assertion", "x-forwarded-host", "forwarded", "x-real-ip"] {
                assert!(
                    seen(headers, forged).is_empty(),
                    "{forged} reached the app: {headers}"
                );
            }
            assert!(
                !text.contains("admin") && !text.contains("10.9.9.9") && !text.contains("forged"),
                "{text}"
            );
        }
        assert_eq!(seen(&docs[0], "x-custom"), ["kept"], "{}", docs[0]);
    }

    // An upgrade through the relay: the request is answered 101, then bytes flow both ways.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: echo\r\nConnection: Upgrade\r\nUpgrade: echo\r\nX-Svc-User: admin\r\n\r\n")
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).unwrap_or_else(|e| {
            panic!(
                "reading the upgrade answer: {e}; so far {:?}\nsvc: {}",
                String::from_utf8_lossy(&head),
                cluster.stderr()
            )
        });
        assert_eq!(n, 1, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"websocket-ish bytes").unwrap();
    let mut buf = [0u8; 19];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"websocket-ish bytes");
}

/// A MariaDB server with TLS (the test CA's certificate for localhost), admitting the user
/// `app_rw` only with the agent's client certificate (`REQUIRE SUBJECT '/CN=svc-agent'`, no
/// password); stopped on drop. Returns it with the agent's certificate and key files.
struct Mariadb {
    _proc: Proc,
    port: u16,
    agent_cert: PathBuf,
    agent_key: PathBuf,
}

fn mariadb_bin(tool: &str) -> PathBuf {
    let path = ["/usr/sbin", "/usr/bin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file());
    path.unwrap_or_else(|| panic!("{tool} is not installed: apt-get install mariadb-server mariadb-client"))
}

impl Mariadb {
    fn start(dir: &Path, ca: &str, cert: &str, key: &str) -> Mariadb {
        let my = dir.join("mariadb");
        std::fs::create_dir_all(&my).unwrap();
        // The agent's client certificate: self-signed, trusted by the server as a CA entry.
        let agent_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "svc-agent");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let agent_cert = params.self_signed(&agent_key).unwrap();
        let files = [
            ("ca.pem", format!("{ca}{}", agent_cert.pem())),
            ("server.pem", cert.to_owned()),
            ("server-key.pem", key.to_owned()),
            ("agent.pem", agent_cert.pem()),
            ("agent-key.pem", agent_key.serialize_pem()),
        ];
        for (name, text) in &files {
            std::fs::write(my.join(name), text).unwrap();
        }
        let data = my.join("data");
        let out = Command::new(mariadb_bin("mariadb-install-db"))
            .arg("--user=root")
            .arg(format!("--datadir={}", data.display()))
            .arg("--auth-root-authentication-method=socket")
            .output_within(Duration::from_secs(120), "mariadb-install-db")
            .unwrap();
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let sock = my.join("sock");
        let child = Command::new(mariadb_bin("mariadbd"))
            .arg("--no-defaults")
            .arg("--user=root")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", sock.display()))
            .arg(format!("--pid-file={}", my.join("pid").display()))
            .arg(format!("--ssl-ca={}", my.join("ca.pem").display()))
            .arg(format!("--ssl-cert={}", my.join("server.pem").display()))
            .arg(format!("--ssl-key={}", my.join("server-key.pem").display()))
            .arg("--skip-log-bin")
            // Client hosts by address: the anonymous ''@localhost of a fresh data directory
            // must not shadow app_rw@'%' for connections from 127.0.0.1.
            .arg("--skip-name-resolve")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(my.join("log")).unwrap())
            .spawn()
            .unwrap();
        let proc = Proc(child);
        wait_listening(port, "mariadbd");
        let sql = "CREATE USER app_rw@'%' REQUIRE SUBJECT '/CN=svc-agent'; \
CREATE DATABASE shop; GRANT ALL ON shop.* TO app_rw@'%';";
        let out = Command::new(mariadb_bin("mariadb"))
            .arg(format!("--socket={}", sock.display()))
            .args(["-e", sql])
            .output_within(common::wait::STEP, "mariadb: creating app_rw")
            .unwrap();
        assert!(
            out.status.success(),
            "creating app_rw: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mariadb {
            _proc: proc,
            port,
            agent_cert: my.join("agent.pem"),
            agent_key: my.join("agent-key.pem"),
        }
    }
}

/// `mariadb ARGS -N -B -e SQL`.
fn mariadb_client(args: &[String], sql: &str) -> std::process::Output {
    let mut c = Command::new(mariadb_bin("mariadb"));
    c.arg("--no-defaults")
        .args(args)
        .args(["--connect-timeout=30", "-N", "-B", "-e", sql]);
    common::wait::run_within(
        &mut c,
        common::wait::STEP,
        &format!("mariadb {args:?} -e {sql:?}"),
    )
    .unwrap()
}

/// `tsh ARGS` as `user`, expected to fail: its standard error.
fn tsh_fails(user: &User, args: &[&str]) -> String {
    let out = common::wait::run_within(
        Command::new(common::TSH)
            .args(args)
            .env("SVC_HOME", &user.home)
            .env_remove("RUST_LOG"),
        common::wait::STEP,
        &format!("tsh {}", args.join(" ")),
    )
    .unwrap();
    assert!(
        !out.status.success(),
        "tsh {args:?} must fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `psql "<conninfo>" -c SQL` with libpq's own settings only (no local proxy).
fn psql_conninfo(conninfo: &str, sql: &str) -> std::process::Output {
    let mut psql = Command::new(require("psql", "postgresql-client"));
    psql.arg(conninfo)
        .args(["-X", "-A", "-t", "-c", sql])
        .env("PGCONNECT_TIMEOUT", "30");
    for var in [
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGDATABASE",
        "PGSSLMODE",
        "PGSSLROOTCERT",
    ] {
        psql.env_remove(var);
    }
    common::wait::run_within(
        &mut psql,
        common::wait::STEP,
        &format!("psql {conninfo:?} -c {sql:?}"),
    )
    .unwrap()
}

#[test]
fn psql_and_mariadb_with_the_tsh_db_login_certificate_straight_to_the_proxy_and_db_users_enforced() {
    require("psql", "postgresql-client");
    pg_bin("initdb");
    mariadb_bin("mariadbd");
    mariadb_bin("mariadb");
    let dir = tempfile::tempdir().unwrap();
    let ok = Command::new("chmod")
        .arg("0755")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(ok.success());
    let (ca, cert, key) = test_ca();
    let ca_file = dir.path().join("db-ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let pg = Postgres::start(dir.path(), &cert, &key);
    let my = Mariadb::start(
        dir.path(),
        &std::fs::read_to_string(&ca_file).unwrap(),
        &cert,
        &key,
    );
    // Separate mode: Postgres clients reach the proxy on its own port and on the web port;
    // MySQL clients on the MySQL port.
    let services = format!(
        "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n  proxy_listener_mode: separate\n\
proxy_service:\n  web_listen_addr: 127.0.0.1:0\n  listen_addr: 127.0.0.1:0\n  tunnel_listen_addr: 127.0.0.1:0\n  postgres_listen_addr: 127.0.0.1:0\n  mysql_listen_addr: 127.0.0.1:0\n\
db_service:\n  enabled: true\n  databases:\n  - name: pg\n    protocol: postgres\n    uri: 127.0.0.1:{}\n    labels: {{env: dev}}\n    tls:\n      ca_cert_file: {}\n      server_name: localhost\n  - name: my\n    protocol: mysql\n    uri: 127.0.0.1:{}\n    labels: {{env: dev}}\n    tls:\n      ca_cert_file: {}\n      server_name: localhost\n      cert_file: {}\n      key_file: {}\n",
        pg.port,
        ca_file.display(),
        my.port,
        ca_file.display(),
        my.agent_cert.display(),
        my.agent_key.display(),
    );
    let cluster = Cluster::start_with(tempfile::tempdir().unwrap(), "info", &services);
    let role = "kind: role\nversion: v7\nmetadata:\n  name: db-reader\nspec:\n  allow:\n    db_labels: {env: dev}\n    db_users: [postgres, 'app_*']\n    db_names: [postgres, shop]\n  deny:\n    db_users: [app_admin]\n";
    cluster
        .tctl_admin(
            &["create", &cluster.write("db-reader.yaml", role).to_string_lossy()],
            None,
        )
        .ok();
    cluster
        .tctl_admin(
            &["users", "add", "carol", "--roles=db-reader", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    let carol = User::login(&cluster, "carol");

    // The Auth Service signs no certificate for a denied database user or name.
    let err = tsh_fails(&carol, &["db", "login", "pg", "--db-user", "app_admin"]);
    assert!(
        err.contains("access denied to db \"pg\" as database user \"app_admin\""),
        "{err}"
    );
    let err = tsh_fails(
        &carol,
        &[
            "db",
            "login",
            "pg",
            "--db-user",
            "postgres",
            "--db-name",
            "template1",
        ],
    );
    assert!(
        err.contains("access denied to db \"pg\" database name \"template1\""),
        "{err}"
    );

    let out = carol.tsh(&[
        "db",
        "login",
        "pg",
        "--db-user",
        "postgres",
        "--db-name",
        "postgres",
    ]);
    assert!(out.contains("as database user \"postgres\""), "{out}");
    let config: serde_json::Value =
        serde_json::from_str(&carol.tsh(&["db", "config", "pg", "-f", "json"])).unwrap();
    let text = carol.tsh(&["db", "config", "pg"]);
    assert!(text.contains("psql ") && text.contains("sslcert="), "{text}");
    let env = carol.tsh(&["db", "env", "pg"]);
    assert!(
        env.contains("export PGSSLCERT=") && env.contains("export PGUSER=postgres"),
        "{env}"
    );
    // psql with nothing but what `tsh db env` exports (the values need no shell unquoting here).
    let mut psql_env = Command::new(require("psql", "postgresql-client"));
    psql_env.args(["-X", "-A", "-t", "-c", "select 40 + 2"]);
    for line in env.lines() {
        let (key, value) = line
            .strip_prefix("export ")
            .and_then(|kv| kv.split_once('='))
            .unwrap_or_else(|| panic!("not an export line: {line:?}"));
        psql_env.env(key, value.trim_matches('\''));
    }
    let out = common::wait::run_within(&mut psql_env, common::wait::STEP, "psql with tsh db env").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "42",
        "psql with tsh db env: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = |k: &str| config[k].as_str().unwrap().to_owned();
    let (host, pg_port) = (file("host"), config["port"].as_u64().unwrap());
    assert_eq!(host, "127.0.0.1", "{config}");
    let web_port = cluster.web_addr.rsplit_once(':').unwrap().1.to_owned();
    assert_ne!(
        pg_port.to_string(),
        web_port,
        "separate mode has its own Postgres port: {config}"
    );
    let conninfo = |port: &str, user: &str| {
        format!(
            "host={host} port={port} sslmode=require sslcert={} sslkey={} user={user} dbname=postgres",
            file("cert"),
            file("key")
        )
    };

    // psql straight to the proxy, on its Postgres port and on the web port; the server only
    // admits TLS (the agent's).
    for port in [pg_port.to_string(), web_port.clone()] {
        let out = psql_conninfo(&conninfo(&port, "postgres"), "select 40 + 2");
        assert!(
            out.status.success(),
            "psql to port {port}: {}\nsvc: {}",
            String::from_utf8_lossy(&out.stderr),
            cluster.stderr()
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
        let out = psql_conninfo(
            &conninfo(&port, "postgres"),
            "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "t", "{out:?}");
    }

    // Another database user than the certificate's is refused by name, in Postgres' own terms.
    let out = psql_conninfo(&conninfo(&pg_port.to_string(), "app_ro"), "select 1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("this certificate is for database user \"postgres\"") && err.contains("\"app_ro\""),
        "{err}"
    );

    // `tsh proxy db` still works, with --db-user; a denied user is refused by name.
    let (_ok, ok_port, ok_err) = carol
        .proxy_with("db", "pg", &["--db-user", "postgres"])
        .expect("tsh proxy db --db-user postgres");
    let out = psql(ok_port, "select 40 + 2");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "42",
        "psql: {}\ntsh: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&ok_err).unwrap_or_default()
    );
    let (_denied, denied_port, _) = carol
        .proxy_with("db", "pg", &["--db-user", "app_admin"])
        .expect("tsh proxy db --db-user app_admin starts");
    let mut psql = Command::new(require("psql", "postgresql-client"));
    psql.args([
        "-h",
        "127.0.0.1",
        "-p",
        &denied_port.to_string(),
        "-U",
        "app_admin",
        "-d",
        "postgres",
    ])
    .args(["-X", "-A", "-t", "-c", "select 1"])
    .env("PGCONNECT_TIMEOUT", "30");
    let out = common::wait::run_within(&mut psql, common::wait::STEP, "psql as app_admin").unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("access denied to db \"pg\" as database user \"app_admin\""),
        "{err}"
    );

    // MariaDB: a denied user gets no certificate; `mariadb` with the certificate straight to
    // the proxy's MySQL port; the agent logs in with its own certificate over verified TLS.
    let err = tsh_fails(&carol, &["db", "login", "my", "--db-user", "app_admin"]);
    assert!(
        err.contains("access denied to db \"my\" as database user \"app_admin\""),
        "{err}"
    );
    carol.tsh(&["db", "login", "my", "--db-user", "app_rw", "--db-name", "shop"]);
    let config: serde_json::Value =
        serde_json::from_str(&carol.tsh(&["db", "config", "my", "-f", "json"])).unwrap();
    let text = carol.tsh(&["db", "config", "my"]);
    assert!(
        text.contains("mariadb ") && text.contains("--ssl-cert="),
        "{text}"
    );
    let file = |k: &str| config[k].as_str().unwrap().to_owned();
    let my_args = |user: &str| {
        vec![
            format!("--host={}", file("host")),
            format!("--port={}", config["port"].as_u64().unwrap()),
            format!("--user={user}"),
            "--ssl".to_owned(),
            format!("--ssl-cert={}", file("cert")),
            format!("--ssl-key={}", file("key")),
            "shop".to_owned(),
        ]
    };
    let out = mariadb_client(&my_args("app_rw"), "select 40 + 2, current_user()");
    assert!(
        out.status.success(),
        "mariadb: {}\nsvc: {}",
        String::from_utf8_lossy(&out.stderr),
        cluster.stderr()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42\tapp_rw@%");
    // The agent's session to the server is TLS.
    let out = mariadb_client(&my_args("app_rw"), "show status like 'Ssl_version'");
    assert!(String::from_utf8_lossy(&out.stdout).contains("TLS"), "{out:?}");
    let out = mariadb_client(&my_args("app_ro"), "select 1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("this certificate is for database user \"app_rw\"") && err.contains("\"app_ro\""),
        "{err}"
    );

    // A user the roles allow but the server does not know: the server's refusal of the
    // agent's login reaches the client as an ERR packet naming the user.
    carol.tsh(&["db", "login", "my", "--db-user", "app_ghost"]);
    let mut ghost = my_args("app_ghost");
    ghost.pop();
    let out = mariadb_client(&ghost, "select 1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("logging in as database user \"app_ghost\"") && err.contains("Access denied"),
        "{err}"
    );

    // `tsh proxy db` carries MySQL too (the proxy greets the client the same way).
    let (_myp, my_port, my_err) = carol
        .proxy_with("db", "my", &["--db-user", "app_rw"])
        .expect("tsh proxy db my --db-user app_rw");
    let local = vec![
        "--host=127.0.0.1".to_owned(),
        format!("--port={my_port}"),
        "--user=app_rw".to_owned(),
        "--skip-ssl".to_owned(),
        "shop".to_owned(),
    ];
    let out = mariadb_client(&local, "select 40 + 2");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "42",
        "mariadb: {}\ntsh: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&my_err).unwrap_or_default()
    );
}

/// A TLS-only `redis-server` (no plain port) with the default user off and two ACL users:
/// `alice` (no password) and `bob` (password `bobpass`).
fn redis_server(dir: &Path, ca: &str, cert: &str, key: &str) -> (Proc, u16) {
    let server = require("redis-server", "redis-server");
    let rd = dir.join("redis");
    std::fs::create_dir_all(&rd).unwrap();
    for (name, text) in [("ca.pem", ca), ("server.pem", cert), ("server-key.pem", key)] {
        std::fs::write(rd.join(name), text).unwrap();
    }
    let port = free_port();
    let conf = format!(
        "port 0\ntls-port {port}\nbind 127.0.0.1\ntls-cert-file {d}/server.pem\ntls-key-file {d}/server-key.pem\n\
tls-ca-cert-file {d}/ca.pem\ntls-auth-clients no\nsave \"\"\nappendonly no\ndir {d}\n\
user default off\nuser alice on nopass ~* &* +@all\nuser bob on >bobpass ~* &* +@all\n",
        d = rd.display()
    );
    std::fs::write(rd.join("redis.conf"), conf).unwrap();
    let child = Command::new(server)
        .arg(rd.join("redis.conf"))
        .stdout(std::fs::File::create(rd.join("log")).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let proc = Proc(child);
    wait_listening(port, "redis-server");
    (proc, port)
}

/// `redis-cli ARGS`: its standard output and error together, trimmed.
fn redis_cli(args: &[String]) -> String {
    let mut c = Command::new(require("redis-cli", "redis-tools"));
    c.args(args);
    let out = common::wait::run_within(&mut c, common::wait::STEP, &format!("redis-cli {args:?}")).unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .trim()
    .to_owned()
}

/// Redis with a `tsh db login` certificate: `redis-cli --tls` straight to the proxy's Redis
/// port (separate mode) runs as the certificate's database user and cannot switch to another
/// (`AUTH` naming someone else is refused by name); a database user the roles do not allow
/// gets no certificate; `tsh proxy db --db-user` carries plain `redis-cli` the same way. The
/// agent's session to the server is TLS verified with the configured CA (the server has no
/// plain port).
#[test]
fn redis_cli_with_the_tsh_db_login_certificate_straight_to_the_proxy_and_through_tsh_proxy_db() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = test_ca();
    let ca_file = dir.path().join("db-ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let (_redis, redis_port) = redis_server(dir.path(), &ca, &cert, &key);
    let services = format!(
        "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n  proxy_listener_mode: separate\n\
proxy_service:\n  web_listen_addr: 127.0.0.1:0\n  listen_addr: 127.0.0.1:0\n  tunnel_listen_addr: 127.0.0.1:0\n  redis_listen_addr: 127.0.0.1:0\n\
db_service:\n  enabled: true\n  databases:\n  - name: cache\n    protocol: redis\n    uri: 127.0.0.1:{redis_port}\n    labels: {{env: dev}}\n    tls:\n      ca_cert_file: {}\n      server_name: localhost\n",
        ca_file.display(),
    );
    let cluster = Cluster::start_with(tempfile::tempdir().unwrap(), "info", &services);
    let role = "kind: role\nversion: v7\nmetadata:\n  name: cache-user\nspec:\n  allow:\n    db_labels: {env: dev}\n    db_users: [alice, bob]\n";
    cluster
        .tctl_admin(
            &[
                "create",
                &cluster.write("cache-user.yaml", role).to_string_lossy(),
            ],
            None,
        )
        .ok();
    cluster
        .tctl_admin(
            &["users", "add", "dave", "--roles=cache-user", "--password-stdin"],
            Some(PASSWORD),
        )
        .ok();
    let dave = User::login(&cluster, "dave");

    // No certificate for a database user the roles do not name.
    let err = tsh_fails(&dave, &["db", "login", "cache", "--db-user", "mallory"]);
    assert!(
        err.contains("access denied to db \"cache\" as database user \"mallory\""),
        "{err}"
    );

    dave.tsh(&["db", "login", "cache", "--db-user", "alice"]);
    let text = dave.tsh(&["db", "config", "cache"]);
    assert!(text.contains("redis-cli ") && text.contains("--tls"), "{text}");
    let config: serde_json::Value =
        serde_json::from_str(&dave.tsh(&["db", "config", "cache", "-f", "json"])).unwrap();
    let file = |k: &str| config[k].as_str().unwrap().to_owned();
    let web_port = cluster.web_addr.rsplit_once(':').unwrap().1.to_owned();
    assert_ne!(
        config["port"].to_string(),
        web_port,
        "separate mode has its own Redis port: {config}"
    );
    let straight = |extra: &[&str]| -> String {
        let mut args = vec![
            "-h".to_owned(),
            file("host"),
            "-p".to_owned(),
            config["port"].to_string(),
            "--tls".to_owned(),
            "--cert".to_owned(),
            file("cert"),
            "--key".to_owned(),
            file("key"),
        ];
        if config["verify"] == true {
            args.extend(["--cacert".to_owned(), file("ca")]);
        } else {
            args.push("--insecure".to_owned());
        }
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        redis_cli(&args)
    };

    // Straight to the proxy: the session runs as the certificate's user.
    assert_eq!(straight(&["ACL", "WHOAMI"]), "alice", "svc: {}", cluster.stderr());
    assert_eq!(straight(&["SET", "k", "v"]), "OK");
    assert_eq!(straight(&["GET", "k"]), "v");
    // Switching to another user, even one the roles allow, is refused by name.
    let out = straight(&[
        "--user",
        "bob",
        "--pass",
        "bobpass",
        "--no-auth-warning",
        "ACL",
        "WHOAMI",
    ]);
    assert!(
        out.contains("\"bob\" is not allowed") && out.contains("\"alice\""),
        "{out}"
    );
    // Without a certificate the proxy's Redis port is closed to the client.
    let mut bare = vec![
        "-h".to_owned(),
        file("host"),
        "-p".to_owned(),
        config["port"].to_string(),
        "--tls".to_owned(),
        "--insecure".to_owned(),
    ];
    bare.extend(["PING".to_owned()]);
    assert_ne!(redis_cli(&bare), "PONG");

    // Through `tsh proxy db --db-user`: plain redis-cli to the local port.
    let (_local, local_port, local_err) = dave
        .proxy_with("db", "cache", &["--db-user", "bob"])
        .expect("tsh proxy db cache --db-user bob");
    let local = |extra: &[&str]| -> String {
        let mut args = vec![
            "-h".to_owned(),
            "127.0.0.1".to_owned(),
            "-p".to_owned(),
            local_port.to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        redis_cli(&args)
    };
    assert_eq!(
        local(&["-a", "bobpass", "--no-auth-warning", "ACL", "WHOAMI"]),
        "bob",
        "tsh: {}",
        std::fs::read_to_string(&local_err).unwrap_or_default()
    );
    assert_eq!(local(&["-a", "bobpass", "--no-auth-warning", "GET", "k"]), "v");
    let out = local(&["--user", "alice", "--pass", "x", "--no-auth-warning", "PING"]);
    assert!(out.contains("\"alice\" is not allowed"), "{out}");
}

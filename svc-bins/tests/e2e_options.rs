//! End to end: the options of `svc.yaml` and the command lines take effect in the real
//! binaries. `svc.log.output` and `svc.log.format` send JSON lines to a file;
//! `auth_service.keep_alive_interval` × `keep_alive_count_max` cuts a reverse tunnel whose agent
//! stopped answering (SIGSTOP); an Auth Service process without a proxy runs its SSH Service
//! on its own listener, with `ssh_service.public_addr` as principals of the host certificate
//! (read with `ssh-keyscan -c`); every binary prints its version; `tsh login` refuses a proxy
//! whose ping wants a newer client and warns about a cluster a major version ahead (a fake
//! proxy in Python); a real proxy's ping says the Kubernetes route is live and advertises no
//! second factor.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::agent::Agent;
use common::resources::{Proc, require, test_ca};
use common::{Cluster, SVC, TCTL, TSH, run_client, wait};

const UPGRADE: &str = env!("CARGO_BIN_EXE_svc-upgrade");
const KUBE_UPDATER: &str = env!("CARGO_BIN_EXE_svc-kube-updater");

fn version() -> String {
    svc_core::version::current().to_string()
}

#[test]
fn every_binary_prints_its_version() {
    let v = version();
    for (bin, name) in [
        (SVC, "svc"),
        (TSH, "tsh"),
        (TCTL, "tctl"),
        (UPGRADE, "svc-upgrade"),
        (KUBE_UPDATER, "svc-kube-updater"),
    ] {
        let out = Command::new(bin)
            .arg("--version")
            .output()
            .expect("run --version");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} --version: {stdout}");
        assert_eq!(stdout.trim(), format!("{name} {v}"), "{name} --version");
    }
    // The `version` subcommands need no cluster (tctl does not connect for it).
    let home = tempfile::tempdir().unwrap();
    for (bin, name) in [
        (SVC, "svc"),
        (TSH, "tsh"),
        (TCTL, "tctl"),
        (UPGRADE, "svc-upgrade"),
    ] {
        let run = run_client(bin, home.path(), &["version"], None).ok();
        assert_eq!(run.stdout.trim(), format!("{name} {v}"), "{name} version");
    }
}

#[test]
fn the_ping_of_a_real_proxy_says_what_it_serves() {
    let cluster = Cluster::start("info");
    let url = format!("https://{}/webapi/ping", cluster.web_addr);
    let mut curl = Command::new(require("curl", "curl"));
    curl.args(["-sS", "--cacert"])
        .arg(cluster.data_dir.join("proxy-ca.pem"))
        .arg(&url);
    let out = wait::run_within(&mut curl, wait::STEP, "curl the ping").unwrap();
    let ping: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ping is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    let web = cluster.web_addr.as_str();
    // TLS routing: the Kubernetes route on the web port is live, and says where it is.
    assert_eq!(ping["proxy"]["tls_routing_enabled"], true, "{ping}");
    assert_eq!(ping["proxy"]["kube"]["enabled"], true, "{ping}");
    assert_eq!(ping["proxy"]["kube"]["listen_addr"], web, "{ping}");
    assert_eq!(ping["proxy"]["kube"]["public_addr"], web, "{ping}");
    assert_eq!(ping["proxy"]["db"]["mysql_listen_addr"], web, "{ping}");
    // Password sign-in only: no second factor is advertised.
    assert_eq!(ping["auth"]["second_factor"], "off", "{ping}");
    assert_eq!(
        ping["min_client_version"],
        svc_core::version::min_client_version().without_v()
    );
}

#[test]
fn svc_log_output_and_format_write_json_lines_to_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("logs").join("svc.log");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    // The fixture writes `    severity: <this>` under `svc.log`; the other two fields follow.
    let severity = format!("info\n    output: {}\n    format: json", log.display());
    let mut cluster = Cluster::start_in(tmp, &severity);
    // At least one line, then every line is a JSON object with the level and the message.
    wait::wait_until(wait::STEP, "a log line in svc.log.output", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() > 0)
    });
    cluster.stop();
    let text = std::fs::read_to_string(&log).unwrap();
    let mut messages = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v["level"].is_string(), "no level: {line}");
        assert!(v["timestamp"].is_string(), "no timestamp: {line}");
        messages.push(v["fields"]["message"].as_str().unwrap_or_default().to_owned());
    }
    assert!(messages.iter().any(|m| !m.is_empty()), "no message in {text}");
    // Nothing went to standard error instead.
    let stderr = cluster.stderr();
    assert!(
        messages
            .iter()
            .filter(|m| !m.is_empty())
            .all(|m| !stderr.contains(m.as_str())),
        "log lines on stderr too: {stderr}"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&log).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "svc.log.output is created private");
}

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

const KEEP_ALIVE: &str = "  keep_alive_interval: 1s\n  keep_alive_count_max: 2\n";

#[test]
fn a_tunnel_whose_agent_stops_answering_is_cut_after_interval_times_count() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = Cluster::start_with(
        tmp,
        "info",
        &format!(
            "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n{KEEP_ALIVE}proxy_service:\n  web_listen_addr: 127.0.0.1:0\nssh_service:\n  enabled: false\n"
        ),
    );
    let (join, pin) = token(&cluster, "node");
    // The agent heartbeats at the same interval (its own file's value).
    let config = cluster.write(
        "agent.yaml",
        &format!(
            "version: v1\nsvc:\n  nodename: sleeper\n  data_dir: {}\n  proxy_server: {}\n  auth_token: {join}\n  ca_pin: {pin}\nauth_service:\n  enabled: false\n{KEEP_ALIVE}proxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n",
            cluster.path().join("agent-data").display(),
            cluster.web_addr
        ),
    );
    // `--insecure`: the proxy's certificate is self-signed (SSH inside is still checked).
    let mut command = Command::new(SVC);
    command.args(["start", "--insecure", "--config"]).arg(&config);
    let agent = Agent::start(command, cluster.path().join("agent.stderr"));
    wait::wait_until(wait::STEP, "the proxy registers the agent's tunnel", || {
        cluster
            .stderr()
            .lines()
            .any(|l| l.contains("agent tunnel registered") && l.contains(&agent.host_id))
    });
    let offline = |log: &str| {
        log.lines()
            .any(|l| l.contains("marked offline") && l.contains(&agent.host_id))
    };
    assert!(!offline(&cluster.stderr()), "offline while heartbeating");

    // The agent stops answering: no heartbeat, no keepalive reply.
    let pid = agent.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let cut = std::panic::catch_unwind(|| {
        // 1 s × 2 here; the defaults (5 min × 3) would keep it for 15 minutes.
        wait::wait_until(Duration::from_secs(60), "the proxy cuts the silent agent", || {
            let log = cluster.stderr();
            offline(&log)
                && log
                    .lines()
                    .any(|l| l.contains("closing a silent agent tunnel") && l.contains(&agent.host_id))
        });
    });
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    if let Err(panic) = cut {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn an_auth_process_without_a_proxy_runs_its_ssh_service_with_public_addr_principals() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("svc.yaml");
    std::fs::write(
        &config,
        format!(
            "version: v1\nsvc:\n  nodename: lonely\n  data_dir: {}\nauth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n  public_addr: [node.example.com, \"10.1.2.3:2222\"]\n",
            tmp.path().join("data").display()
        ),
    )
    .unwrap();
    let mut command = Command::new(SVC);
    command.args(["start", "--config"]).arg(&config);
    let node = Agent::start(command, tmp.path().join("svc.stderr"));
    let addr = node
        .listeners
        .get("ssh_service")
        .unwrap_or_else(|| panic!("no ssh_service listener in the banner: {:?}", node.listeners));
    let port = addr.rsplit_once(':').expect("host:port").1;

    // The host certificate's principals, as OpenSSH checks them: `known_hosts` trusts the
    // cluster's host CA for every name below, so a name passes host verification only when
    // the certificate lists it (the sign-in after it fails: no user key is offered).
    let admin: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("data").join("admin-identity.json")).unwrap(),
    )
    .unwrap();
    let host_ca = admin["trusted"]
        .as_array()
        .and_then(|cas| cas.iter().find(|ca| ca["kind"] == "host"))
        .and_then(|ca| ca["ssh_public_key"].as_str())
        .unwrap_or_else(|| panic!("no host CA in the admin identity: {admin}"))
        .trim()
        .to_owned();
    let known_hosts = tmp.path().join("known_hosts");
    std::fs::write(
        &known_hosts,
        format!("@cert-authority node.example.com,10.1.2.3,lonely,stranger.example.com {host_ca}\n"),
    )
    .unwrap();
    let ssh = require("ssh", "openssh-client");
    let probe = |alias: &str| -> String {
        let mut c = Command::new(&ssh);
        c.args([
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
        ])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args(["-o", "GlobalKnownHostsFile=/dev/null"])
        .arg("-o")
        .arg(format!("HostKeyAlias={alias}"))
        .args(["-o", "HostKeyAlgorithms=ssh-ed25519-cert-v01@openssh.com"])
        .args([
            "-o",
            "PreferredAuthentications=publickey",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .args(["-o", "IdentityFile=/dev/null", "-o", "ConnectTimeout=20"])
        .args(["-p", port, "probe@127.0.0.1", "true"])
        .stdin(Stdio::null());
        let out = wait::run_within(&mut c, wait::STEP, &format!("ssh as {alias}")).unwrap();
        assert!(
            !out.status.success(),
            "ssh without a user key signed in as {alias}"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for alias in ["node.example.com", "10.1.2.3", "lonely"] {
        let err = probe(alias);
        assert!(
            err.contains("Permission denied") && !err.contains("Host key verification failed"),
            "{alias} is not a principal of the host certificate: {err}"
        );
    }
    let err = probe("stranger.example.com");
    assert!(
        err.contains("Host key verification failed"),
        "a name not configured passed: {err}"
    );
}

/// A fake proxy answering `/webapi/ping` with `ping` (and 404 elsewhere) over TLS.
fn fake_proxy(dir: &Path, ping: &serde_json::Value) -> (Proc, u16) {
    let (_, cert, key) = test_ca();
    std::fs::write(dir.join("cert.pem"), cert).unwrap();
    std::fs::write(dir.join("key.pem"), key).unwrap();
    std::fs::write(dir.join("ping.json"), ping.to_string()).unwrap();
    let script = r#"
import http.server, json, ssl, sys
d = sys.argv[1]
body = open(d + "/ping.json", "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def answer(self, code, data):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/webapi/ping":
            self.answer(200, body)
        else:
            self.answer(404, json.dumps({"error": {"message": "not found"}}).encode())
    def do_POST(self):
        self.answer(404, json.dumps({"error": {"message": "no sign-in here"}}).encode())
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(d + "/cert.pem", d + "/key.pem")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;
    let mut child = Command::new(require("python3", "python3"))
        .arg("-c")
        .arg(script)
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("fake proxy port {line:?}: {e}"));
    (Proc(child), port)
}

fn ping(server: &str, min_client: &str) -> serde_json::Value {
    serde_json::json!({
        "auth": {"type": "local", "second_factor": "off", "local": {"name": ""}},
        "proxy": {"tls_routing_enabled": true},
        "server_version": server,
        "min_client_version": min_client,
        "cluster_name": "fake.test",
        "automatic_upgrades": false,
    })
}

#[test]
fn tsh_login_refuses_a_proxy_wanting_a_newer_client_and_warns_about_a_newer_major() {
    let current = svc_core::version::current();
    let next = current.major() + 1;
    let dir = tempfile::tempdir().unwrap();

    let (_proxy, port) = fake_proxy(dir.path(), &ping(&format!("{next}.1.0"), &format!("{next}.0.0")));
    let proxy = format!("--proxy=127.0.0.1:{port}");
    let run = run_client(
        TSH,
        dir.path(),
        &["login", &proxy, "--user=alice", "--insecure"],
        None,
    );
    assert!(
        !run.status.success(),
        "tsh login against a newer cluster: {}",
        run.stdout
    );
    for want in [current.to_string(), format!("v{next}.0.0")] {
        assert!(run.stderr.contains(&want), "{want} not named: {}", run.stderr);
    }
    assert!(
        !run.stderr.contains("password"),
        "refused before the password: {}",
        run.stderr
    );
    drop(_proxy);

    let dir = tempfile::tempdir().unwrap();
    let (_proxy, port) = fake_proxy(dir.path(), &ping(&format!("{next}.0.0"), &current.without_v()));
    let proxy = format!("--proxy=127.0.0.1:{port}");
    let run = run_client(
        TSH,
        dir.path(),
        &["login", &proxy, "--user=alice", "--insecure"],
        Some("secret\n"),
    );
    let warning = run
        .stderr
        .lines()
        .find(|l| l.starts_with("warning:") && l.contains(&format!("v{next}.0.0")))
        .unwrap_or_else(|| panic!("no warning about the newer major: {}", run.stderr));
    assert!(warning.contains(&current.to_string()), "{warning}");
    // The fake proxy has no sign-in: the login goes on past the warning and fails there.
    assert!(run.stderr.contains("no sign-in here"), "{}", run.stderr);
}

/// Whether the server closes `stream` within `within` (end of stream or a reset), rather than
/// keeping it open and silent.
fn closed_by_server(stream: &mut std::net::TcpStream, within: Duration) -> bool {
    use std::io::Read;
    stream.set_read_timeout(Some(within)).expect("read timeout");
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn connection_limits_max_connections_caps_the_proxy_and_auth_listeners() {
    // No SSH Service: nothing of the process's own holds a connection to either listener.
    let services = "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\n  connection_limits:\n    max_connections: 3\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n  connection_limits:\n    max_connections: 3\nssh_service:\n  enabled: false\n";
    let cluster = Cluster::start_with(tempfile::tempdir().unwrap(), "info", services);
    let curl = require("curl", "curl");
    let ping = || {
        let mut c = Command::new(&curl);
        c.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(cluster.data_dir.join("proxy-ca.pem"))
            .arg(format!("https://{}/webapi/ping", cluster.web_addr));
        let out = wait::run_within(&mut c, wait::STEP, "curl the ping").unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(ping(), "200", "the ping before the listener is full");
    for (name, addr) in [("web", &cluster.web_addr), ("auth", &cluster.auth_addr)] {
        // Three silent connections fill the listener (the classification deadline, 15 s, is
        // far away): each is kept.
        let mut held: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr.as_str()).expect("connect"))
            .collect();
        // The fourth is closed at once.
        let mut fourth = std::net::TcpStream::connect(addr.as_str()).expect("connect");
        assert!(
            closed_by_server(&mut fourth, Duration::from_secs(10)),
            "{name}: a fourth connection to a listener capped at 3 was not closed"
        );
        assert!(
            !closed_by_server(&mut held[0], Duration::from_millis(200)),
            "{name}: a connection within the cap was closed"
        );
        // With one of the three gone, the listener serves again.
        held.pop();
        match name {
            "web" => wait::wait_until(wait::STEP, "the ping once a place is free", || ping() == "200"),
            _ => wait::wait_until(wait::STEP, "tctl status once a place is free", || {
                cluster.tctl_admin(&["status"], None).status.success()
            }),
        }
        drop(held);
    }
    // The open-file warning is given only for a cap above the process's limit: 3 is not, the
    // largest allowed value is above any limit Linux gives (`fs.nr_open`, 1,048,576 by default).
    const WARNING: &str =
        "proxy_service.connection_limits.max_connections is above this process's limit of open files";
    assert!(!cluster.stderr().contains(WARNING), "{}", cluster.stderr());
    let big = "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n  connection_limits:\n    max_connections: 16777216\nssh_service:\n  enabled: false\n";
    let warned = Cluster::start_with(tempfile::tempdir().unwrap(), "info", big);
    wait::wait_until(wait::STEP, "the open-file warning in the log", || {
        warned.stderr().contains(WARNING)
    });
}

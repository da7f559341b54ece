//! End to end: the cluster behind a layer-7 load balancer — a real nginx that terminates TLS
//! with its own certificate, speaks HTTP/1.1 to the proxy and passes `Upgrade`/`Connection`
//! (the configuration docs/l7-load-balancers.md gives). ALPN does not cross it, so clients
//! find it with the probe and ride `GET /webapi/connectionupgrade`:
//!
//! - `tsh login` (plain HTTPS) and `tsh ssh` through nginx, in the `alpn` form (found by the
//!   probe) and in the WebSocket form (forced with `SVC_CONN_UPGRADE=websocket`);
//! - an agent joining (Auth API), heartbeating and holding its reverse tunnel through nginx,
//!   and serving `tsh ssh` and a `tcp://` application that `tsh proxy app` (a local proxy)
//!   reaches through nginx;
//! - the endpoint without an upgrade header answered as plain HTTP (`400`, JSON);
//! - a client that gets its `101` and never sends the inner ClientHello is cut off at the
//!   proxy's classification deadline, while `tsh ssh` works meanwhile.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::resources::{Proc, User, echo_server, free_port, require, test_ca, wait_listening};
use common::{Cluster, SVC, TSH, agent::Agent, wait};

const PASSWORD: &str = "correct-horse-battery";
/// The default classification deadline (`ListenOptions::peek_timeout`).
const PEEK: Duration = Duration::from_secs(15);
/// Slack for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(45);

/// nginx terminating TLS on 127.0.0.1:`port` with `cert`/`key`, proxying everything to the
/// proxy's web port `upstream` over HTTPS/1.1 with the upgrade headers passed. One process
/// (`master_process off`): killed on drop, it leaves no worker behind holding the port.
fn start_nginx(dir: &Path, port: u16, upstream: &str, cert: &Path, key: &Path) -> Proc {
    let nginx = require("nginx", "nginx");
    let root = dir.join("nginx");
    std::fs::create_dir_all(root.join("tmp")).expect("nginx dir");
    let r = root.display();
    let conf = root.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "user root;\nmaster_process off;\ndaemon off;\npid {r}/nginx.pid;\nerror_log {r}/error.log info;\nevents {{}}\n\
http {{\n  access_log {r}/access.log;\n  client_body_temp_path {r}/tmp/body;\n  proxy_temp_path {r}/tmp/proxy;\n  fastcgi_temp_path {r}/tmp/fastcgi;\n  uwsgi_temp_path {r}/tmp/uwsgi;\n  scgi_temp_path {r}/tmp/scgi;\n\
  map $http_upgrade $connection_upgrade {{\n    default upgrade;\n    ''      close;\n  }}\n\
  server {{\n    listen 127.0.0.1:{port} ssl;\n    ssl_certificate {};\n    ssl_certificate_key {};\n\
    location / {{\n      proxy_pass https://{upstream};\n      proxy_http_version 1.1;\n      proxy_set_header Host $host;\n      proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection $connection_upgrade;\n      proxy_buffering off;\n      proxy_read_timeout 1h;\n      proxy_send_timeout 1h;\n    }}\n  }}\n}}\n",
            cert.display(),
            key.display()
        ),
    )
    .expect("nginx.conf");
    let check = wait::run_within(
        Command::new(&nginx).arg("-t").arg("-c").arg(&conf),
        wait::STEP,
        "nginx -t",
    )
    .expect("running nginx -t");
    assert!(
        check.status.success(),
        "nginx -t: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let child = Command::new(nginx)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nginx");
    let proc = Proc(child);
    wait_listening(port, "nginx");
    proc
}

/// `program ARGS` with `SVC_HOME=home` and `env`, finished within [`wait::STEP`].
fn run_env(program: &str, home: &Path, env: &[(&str, &str)], args: &[&str]) -> common::Run {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("SVC_HOME", home)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn");
    wait::output_within(child, wait::STEP, &format!("`{} {}`", program, args.join(" "))).into()
}

/// `curl` through nginx: (HTTP status, body).
fn curl(ca: &Path, url: &str, headers: &[&str]) -> (String, String) {
    let mut c = Command::new(require("curl", "curl"));
    c.args([
        "-sS",
        "--http1.1",
        "--max-time",
        "30",
        "-w",
        "\n%{http_code}",
        "--cacert",
    ])
    .arg(ca);
    for h in headers {
        c.args(["-H", h]);
    }
    let out = wait::run_within(c.arg(url), wait::STEP, &format!("curl {url}")).expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_owned(), body.to_owned())
}

struct Setup {
    cluster: Cluster,
    _nginx: Proc,
    /// `127.0.0.1:<nginx port>`.
    lb: String,
    /// nginx's CA.
    lb_ca: PathBuf,
}

/// A cluster (no SSH Service of its own) whose public address is nginx, nginx in front of it,
/// and `alice` signed in through nginx.
fn setup() -> Setup {
    let port = free_port();
    let lb = format!("127.0.0.1:{port}");
    let cluster = Cluster::start_with(
        tempfile::tempdir().expect("tempdir"),
        "debug",
        &format!(
            "auth_service:\n  listen_addr: 127.0.0.1:0\n  cluster_name: e2e.test\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n  public_addr: {lb}\nssh_service:\n  enabled: false\n"
        ),
    );
    let (ca, cert, key) = test_ca();
    let dir = cluster.path().to_owned();
    let lb_ca = dir.join("lb-ca.pem");
    let (cert_file, key_file) = (dir.join("lb.pem"), dir.join("lb-key.pem"));
    std::fs::write(&lb_ca, &ca).expect("lb ca");
    std::fs::write(&cert_file, cert).expect("lb cert");
    std::fs::write(&key_file, key).expect("lb key");
    let proxy_ca = std::fs::read_to_string(cluster.data_dir.join("proxy-ca.pem")).expect("proxy CA");
    // nginx's CA and the proxy's: what `tsh login --cacert` is given.
    let bundle = dir.join("bundle.pem");
    std::fs::write(&bundle, format!("{ca}\n{proxy_ca}")).expect("bundle");
    let nginx = start_nginx(&dir, port, &cluster.web_addr, &cert_file, &key_file);

    cluster.add_alice(PASSWORD);
    let login = cluster.tsh(
        &[
            "login",
            &format!("--proxy={lb}"),
            "--user=alice",
            &format!("--cacert={}", bundle.display()),
        ],
        Some(&format!("{PASSWORD}\n")),
    );
    assert!(
        login.status.success(),
        "tsh login through nginx: {}\nnginx: {}",
        login.stderr,
        std::fs::read_to_string(dir.join("nginx/error.log")).unwrap_or_default()
    );
    Setup {
        cluster,
        _nginx: nginx,
        lb,
        lb_ca,
    }
}

/// Starts an agent (SSH Service only) named `name` that reaches the cluster only at `lb`.
fn start_agent(s: &Setup, name: &str) -> Agent {
    start_agent_with(s, name, "")
}

/// [`start_agent`] with more services in its configuration (`extra`, YAML at the top level;
/// the join token allows the SSH and Application services).
fn start_agent_with(s: &Setup, name: &str, extra: &str) -> Agent {
    let out = s
        .cluster
        .tctl_admin(&["tokens", "add", "--type=node,app", "--format", "json"], None)
        .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("token json");
    let (token, pin) = (
        v["token"].as_str().expect("token"),
        v["ca_pin"].as_str().expect("ca_pin"),
    );
    let data = s.cluster.path().join(format!("{name}-data"));
    let yaml = format!(
        "version: v1\nsvc:\n  nodename: {name}\n  data_dir: {}\n  proxy_server: {}\n  auth_token: {token}\n  ca_pin: {pin}\n  log:\n    severity: debug\nauth_service:\n  enabled: false\nproxy_service:\n  enabled: false\nssh_service:\n  enabled: true\n{extra}",
        data.display(),
        s.lb
    );
    let config = s.cluster.write(&format!("{name}.yaml"), &yaml);
    let mut cmd = Command::new(SVC);
    cmd.args(["start", "--insecure", "--config"])
        .arg(&config)
        .env("SVC_LB_CA_FILE", &s.lb_ca)
        .env_remove("SVC_CONN_UPGRADE");
    Agent::start(cmd, s.cluster.path().join(format!("{name}.stderr")))
}

fn nginx_access(s: &Setup) -> String {
    std::fs::read_to_string(s.cluster.path().join("nginx/access.log")).unwrap_or_default()
}

#[test]
fn tsh_and_an_agent_work_through_nginx_terminating_tls() {
    let s = setup();
    let lb = &s.lb;

    // The web API crosses nginx as plain HTTPS; the upgrade endpoint without an upgrade is
    // answered as plain HTTP.
    let (code, body) = curl(&s.lb_ca, &format!("https://{lb}/webapi/ping"), &[]);
    assert_eq!(code, "200", "{body}");
    let (code, body) = curl(&s.lb_ca, &format!("https://{lb}/webapi/connectionupgrade"), &[]);
    assert_eq!(code, "400", "{body}");
    assert!(body.contains("expected Upgrade: alpn"), "{body}");

    // An agent that only knows nginx joins, heartbeats and holds its tunnel through it; it
    // also serves a `tcp://` application (an echo server).
    let (_echo, echo_port) = echo_server();
    let agent = start_agent_with(
        &s,
        "behind-lb",
        &format!(
            "app_service:\n  enabled: true\n  apps:\n  - name: echo\n    uri: tcp://127.0.0.1:{echo_port}\n"
        ),
    );
    let target = "root@behind-lb";
    let home = s.cluster.home.clone();
    let mut out = None;
    wait::wait_until(
        wait::STEP,
        "tsh ssh through nginx to the agent behind nginx",
        || {
            let run = run_env(TSH, &home, &[], &["ssh", target, "echo through nginx; exit 4"]);
            let done = run.stdout == "through nginx\n";
            out = Some(run);
            done
        },
    );
    let out = out.expect("a tsh run");
    assert_eq!(out.status.code(), Some(4), "{}", out.stderr);
    let agent_log = agent.log();
    assert!(
        agent_log.contains("using the connection upgrade"),
        "the agent found nginx with the probe:\n{agent_log}"
    );

    // A local proxy (`tsh proxy app`) reaches the application through nginx too: multiplexed
    // (`svc-mux` routed below), and with `--no-multiplex` each client connection on a TLS
    // connection of its own (`svc-tcp`).
    let alice = User { home: home.clone() };
    for (flags, text) in [
        (&[][..], "through the local proxy\n"),
        (&["--no-multiplex"][..], "on its own\n"),
    ] {
        let (_local, local_port, local_err) = alice
            .proxy_with("app", "echo", flags)
            .unwrap_or_else(|e| panic!("tsh proxy app {flags:?} echo through nginx: {e}"));
        let mut echo = std::net::TcpStream::connect(("127.0.0.1", local_port)).expect("local proxy");
        echo.set_read_timeout(Some(wait::STEP)).expect("read timeout");
        echo.write_all(text.as_bytes()).expect("write");
        let mut line = String::new();
        BufReader::new(&echo).read_line(&mut line).unwrap_or_else(|e| {
            panic!(
                "no echo through tsh proxy app {flags:?} ({e}): {}",
                std::fs::read_to_string(&local_err).unwrap_or_default()
            )
        });
        assert_eq!(line, text);
    }

    // The WebSocket form, forced.
    let ws = run_env(
        TSH,
        &home,
        &[("SVC_CONN_UPGRADE", "websocket")],
        &["ssh", target, "echo framed"],
    );
    assert_eq!(ws.stdout, "framed\n", "{}", ws.stderr);

    // Everything svc-specific crossed nginx as upgrades, and the proxy routed the inner ALPN.
    let access = nginx_access(&s);
    assert!(
        access.contains("\"GET /webapi/connectionupgrade HTTP/1.1\" 101"),
        "{access}"
    );
    let log = s.cluster.stderr();
    assert!(
        log.contains("upgraded connection handed to the router"),
        "no upgrade (alpn form) logged:\n{log}"
    );
    // `tsh proxy app` carries its connections as streams of one `svc-mux` connection, and with
    // `--no-multiplex` each on a `svc-tcp` connection.
    for alpn in [
        "svc-proxy-ssh",
        "svc-reversetunnel",
        "svc-auth@",
        "svc-mux",
        "svc-tcp",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("routing TLS connection") && l.contains(alpn)),
            "the proxy routed no {alpn} connection:\n{log}"
        );
    }
    assert!(
        log.contains("upgraded connection (WebSocket form) handed to the router"),
        "no WebSocket upgrade logged:\n{log}"
    );
}

#[test]
fn a_client_silent_after_the_upgrade_is_cut_off_without_hurting_others() {
    let s = setup();
    let _agent = start_agent(&s, "busy-lb");
    let home = s.cluster.home.clone();

    // A client that gets its 101 through nginx and then never sends the inner ClientHello.
    let mut silent = Command::new(require("openssl", "openssl"))
        .args(["s_client", "-quiet", "-connect", &s.lb, "-CAfile"])
        .arg(&s.lb_ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn openssl s_client");
    let mut stdin = silent.stdin.take().expect("stdin");
    write!(
        stdin,
        "GET /webapi/connectionupgrade HTTP/1.1\r\nHost: {}\r\nUpgrade: alpn\r\nConnection: Upgrade\r\n\r\n",
        s.lb
    )
    .expect("send the upgrade request");
    stdin.flush().expect("flush");
    let started = Instant::now();
    let mut reader = BufReader::new(silent.stdout.take().expect("stdout"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = String::new();
        let _ = reader.read_line(&mut first);
        let _ = tx.send(first);
        // Drain until the connection closes.
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut reader, &mut sink);
    });
    let status_line = rx
        .recv_timeout(wait::STEP)
        .expect("the 101 answer within the step deadline");
    assert!(status_line.starts_with("HTTP/1.1 101"), "{status_line:?}");

    // Meanwhile a real client works through the same nginx and proxy.
    let mut ok = None;
    wait::wait_until(wait::STEP, "tsh ssh while a silent upgraded client waits", || {
        let run = run_env(TSH, &home, &[], &["ssh", "root@busy-lb", "echo still fine"]);
        let done = run.stdout == "still fine\n";
        ok = Some(run);
        done
    });
    assert!(ok.is_some_and(|r| r.status.success()));

    // The silent one is closed by the proxy's classification deadline (nginx then closes its
    // side and s_client exits); stdin stays open, so only the server can have ended it.
    let status = wait::wait_exit(
        &mut silent,
        PEEK + SLACK,
        "the silent upgraded client being cut off",
    );
    let elapsed = started.elapsed();
    drop(stdin);
    eprintln!("silent upgraded client cut off after {elapsed:?} (status {status})");
    let log = s.cluster.stderr();
    assert!(
        log.contains("TLS connection closed before routing") && log.contains("at the peek deadline"),
        "{log}"
    );
}

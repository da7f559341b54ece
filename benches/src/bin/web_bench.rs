//! Web API throughput: svc's `/webapi/ping` and version endpoint against nginx `return 200`,
//! both over TLS on 127.0.0.1, measured by `wrk` in the same run.
//!
//! Modes: keep-alive (100 connections) and new-connection (`Connection: close`, so every request
//! pays a TCP and TLS handshake). Targets alternate, each is measured several times, medians and
//! the svc/nginx ratio are printed as a Markdown table.
//!
//! Run: `cargo run --release -p svc-benches --bin web_bench -- [--secs 5] [--reps 3]
//! [--connections 100] [--svc-threads 1] [--modes keep-alive,new-connection]`
//! Needs the Debian packages `nginx-light` and `wrk`.

use std::{
    net::{SocketAddr, TcpListener as StdListener},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use svc_net::{
    proxy::{ProxyBuilder, ProxySettings},
    tls::TlsSource,
};

const PING: &str = "/webapi/ping";
const VERSION: &str = "/v1/webapi/automaticupgrades/channel/default/version";

struct Args {
    secs: u64,
    reps: usize,
    connections: usize,
    svc_threads: usize,
    modes: String,
}

fn args() -> Result<Args> {
    let mut a = Args {
        secs: 5,
        reps: 3,
        connections: 100,
        svc_threads: 1,
        modes: "keep-alive,new-connection".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--secs" => a.secs = value.parse()?,
            "--reps" => a.reps = value.parse()?,
            "--connections" => a.connections = value.parse()?,
            "--svc-threads" => a.svc_threads = value.parse()?,
            "--modes" => a.modes = value,
            other => {
                bail!("unknown flag {other}; expected --secs, --reps, --connections, --svc-threads, --modes")
            }
        }
    }
    Ok(a)
}

/// One wrk result.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn parse_latency(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, factor) = if let Some(n) = s.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * factor)
}

fn wrk(url: &str, a: &Args, new_connection: bool) -> Result<Sample> {
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t2",
        &format!("-c{}", a.connections),
        &format!("-d{}s", a.secs),
        "--latency",
    ]);
    if new_connection {
        cmd.args(["-H", "Connection: close"]);
    }
    let out = cmd
        .arg(url)
        .output()
        .context("running wrk: install the Debian package `wrk`")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |prefix: &str| -> Option<&str> {
        text.lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1))
    };
    let rps = field("Requests/sec:").and_then(|v| v.parse().ok());
    let p50 = field("50%").and_then(parse_latency);
    let p99 = field("99%").and_then(parse_latency);
    if let Some(errors) = text.lines().find(|l| l.contains("Socket errors")) {
        eprintln!("{url} (new connection: {new_connection}): {}", errors.trim());
    }
    if text.contains("Non-2xx") {
        bail!("wrk saw non-2xx answers from {url}:\n{text}");
    }
    match (rps, p50, p99) {
        (Some(rps), Some(p50_ms), Some(p99_ms)) => Ok(Sample { rps, p50_ms, p99_ms }),
        _ => bail!("could not read wrk's output for {url}:\n{text}"),
    }
}

fn free_port() -> Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx serving the two pages over TLS, as one process (`master_process off`): killed on drop,
/// it leaves no worker behind holding the port.
fn start_nginx(
    dir: &Path,
    cert: &Path,
    key: &Path,
    ping_body: &str,
    version_body: &str,
) -> Result<(Nginx, SocketAddr)> {
    let port = free_port()?;
    let d = dir.display();
    let conf = format!(
        r#"master_process off;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        # nginx 1.22 leaves TLS 1.3 out of its default; svc negotiates 1.3, so must the baseline.
        ssl_protocols TLSv1.2 TLSv1.3;
        location = {PING} {{ default_type application/json; return 200 '{ping_body}'; }}
        location = {VERSION} {{ default_type text/plain; return 200 '{version_body}'; }}
    }}
}}
"#,
        cert = cert.display(),
        key = key.display(),
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let child = Command::new("nginx")
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting nginx: install the Debian package `nginx-light`")?;
    let guard = Nginx(child);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    for _ in 0..200 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok((guard, addr));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    bail!("nginx did not start listening on {addr}; see {d}/error.log")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let a = args()?;
    let dir = tempfile::tempdir()?;
    // One worker thread by default: the same CPU budget as nginx's single worker process.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.svc_threads)
        .enable_all()
        .build()?;
    let mut settings = ProxySettings::default();
    settings.ping.web_listen_addr = "127.0.0.1:0".parse()?;
    settings.tls = TlsSource::Generated {
        data_dir: dir.path().join("svc"),
    };
    let proxy = rt.block_on(async {
        let builder = ProxyBuilder::new(settings).direct_version_server()?;
        anyhow::Ok(builder.bind().await?)
    })?;
    let svc_addr = proxy.addrs().web;

    // nginx serves the very same bytes with the very same certificate.
    let ping_body = std::process::Command::new("curl")
        .args(["-sk", &format!("https://{svc_addr}{PING}")])
        .output()
        .context("running curl: install the Debian package `curl`")?
        .stdout;
    let ping_body = String::from_utf8(ping_body)?;
    let version_body = svc_core::version::current().to_string();
    let nginx_dir = dir.path().join("nginx");
    std::fs::create_dir_all(&nginx_dir)?;
    let svc_dir = dir.path().join("svc");
    let (_nginx, nginx_addr) = start_nginx(
        &nginx_dir,
        &svc_dir.join("proxy-cert.pem"),
        &svc_dir.join("proxy-key.pem"),
        &ping_body,
        &version_body,
    )?;

    println!(
        "wrk -t2 -c{} -d{}s --latency, {} repetitions alternating, medians; TLS on 127.0.0.1; nginx 1 worker, svc {} worker thread(s)",
        a.connections, a.secs, a.reps, a.svc_threads
    );
    println!();
    println!("| endpoint | mode | nginx rps | svc rps | svc/nginx | nginx p50 / p99 ms | svc p50 / p99 ms |");
    println!("|---|---|---|---|---|---|---|");
    for (name, path) in [("ping", PING), ("version", VERSION)] {
        for (mode, new_conn) in [("keep-alive", false), ("new connection", true)] {
            if !a
                .modes
                .split(',')
                .any(|m| m.replace('-', " ") == mode.replace('-', " "))
            {
                continue;
            }
            let (mut n, mut s) = (Vec::new(), Vec::new());
            for _ in 0..a.reps {
                n.push(wrk(&format!("https://{nginx_addr}{path}"), &a, new_conn)?);
                s.push(wrk(&format!("https://{svc_addr}{path}"), &a, new_conn)?);
            }
            let m = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
            let (nr, sr) = (m(&n, |x| x.rps), m(&s, |x| x.rps));
            println!(
                "| {name} | {mode} | {nr:.0} | {sr:.0} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |",
                sr / nr,
                m(&n, |x| x.p50_ms),
                m(&n, |x| x.p99_ms),
                m(&s, |x| x.p50_ms),
                m(&s, |x| x.p99_ms),
            );
        }
    }
    rt.block_on(proxy.shutdown());
    Ok(())
}

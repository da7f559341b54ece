//! HTTP CONNECT dialer against socat, through the same tinyproxy, in the same run.
//!
//! Two figures, each measured alternately (ours, socat, ours, …) for several repetitions and
//! reported as medians and a ratio:
//! - bulk throughput: 1 GiB through the tunnel into an in-process sink (the clock stops when the
//!   sink has counted every byte);
//! - connection setup rate: sequential CONNECT tunnels opened and closed (socat's figure includes
//!   starting one process per connection, which is how socat is used as a proxy client).
//!
//! Run: `cargo run --release -p svc-benches --bin dial_bench` (needs apt `tinyproxy`, `socat`).
//! Options: `--gib N` (default 1), `--reps N` (default 9), `--conns N` (default 300).

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use svc_core::{Addr, proxy_env::ProxyUrl};
use svc_net::dial::{HttpConnect, ProxyConnector, TcpConnector, Tunneled, proxy_tls_config};
use tokio::{io::AsyncWriteExt, sync::mpsc};
use tower::ServiceExt;

const PROXY_IP: &str = "127.0.0.2";
const CHUNK: usize = 128 * 1024;

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn arg(name: &str, default: u64) -> anyhow::Result<u64> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args.get(i + 1).context("missing value")?.parse()?),
        None => Ok(default),
    }
}

fn need(bin: &str, package: &str) -> anyhow::Result<()> {
    if ["/usr/bin", "/usr/sbin"]
        .iter()
        .any(|d| Path::new(d).join(bin).exists())
    {
        Ok(())
    } else {
        bail!("{bin} not found: install the Debian package `{package}`")
    }
}

/// A sink that counts bytes per connection and reports each finished connection's count.
///
/// Plain threads with blocking sockets, outside the client's runtime: the sink costs the same
/// whichever client (ours or socat) sends, and does not compete with our client for its runtime.
fn sink() -> anyhow::Result<(SocketAddr, mpsc::UnboundedReceiver<(u64, Instant)>)> {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { continue };
            let _ = s.set_nodelay(true);
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 * 1024];
                let mut total = 0u64;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                let _ = tx.send((total, Instant::now()));
            });
        }
    });
    Ok((addr, rx))
}

async fn start_tinyproxy(dir: &Path) -> anyhow::Result<(Guard, u16)> {
    let port = std::net::TcpListener::bind((PROXY_IP, 0))?.local_addr()?.port();
    let conf = dir.join("tinyproxy.conf");
    std::fs::write(
        &conf,
        format!("Port {port}\nListen {PROXY_IP}\nTimeout 600\nLogLevel Error\nMaxClients 1000\n"),
    )?;
    let child = Command::new("tinyproxy")
        .arg("-d")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let guard = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect((PROXY_IP, port)).await.is_err() {
        if Instant::now() > deadline {
            bail!("tinyproxy did not listen on {PROXY_IP}:{port}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((guard, port))
}

type Connect = HttpConnect<ProxyConnector>;

async fn ours_open(connect: &Connect, target: &Addr) -> anyhow::Result<Tunneled<svc_net::dial::ProxyStream>> {
    let tunnel = connect.clone().oneshot(target.clone()).await?;
    let (io, leftover) = tunnel.into_parts();
    Ok(Tunneled::new(io.into_inner(), leftover))
}

async fn ours_bulk(
    connect: &Connect,
    target: &Addr,
    bytes: u64,
    done: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
) -> anyhow::Result<Duration> {
    let chunk = vec![0u8; CHUNK];
    let start = Instant::now();
    let mut stream = ours_open(connect, target).await?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        stream.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    stream.shutdown().await?;
    let (got, at) = done.recv().await.context("sink gone")?;
    if got != bytes {
        bail!("sink got {got} bytes, expected {bytes}");
    }
    Ok(at - start)
}

/// The same transfer over a hand-rolled CONNECT on a bare tokio socket (same socket options):
/// separates the cost of the dialer's layers from the cost of async I/O itself.
async fn raw_bulk(
    proxy_port: u16,
    target: SocketAddr,
    bytes: u64,
    done: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
) -> anyhow::Result<Duration> {
    use tokio::io::AsyncReadExt;
    let chunk = vec![0u8; CHUNK];
    let start = Instant::now();
    let mut s = tokio::net::TcpStream::connect((PROXY_IP, proxy_port)).await?;
    s.set_nodelay(true)?;
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await?;
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.0 200") && !head.starts_with(b"HTTP/1.1 200") {
        bail!("proxy refused: {}", String::from_utf8_lossy(&head));
    }
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        s.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    s.shutdown().await?;
    let (got, at) = done.recv().await.context("sink gone")?;
    if got != bytes {
        bail!("sink got {got} bytes, expected {bytes}");
    }
    Ok(at - start)
}

async fn socat_bulk(
    proxy_port: u16,
    target: SocketAddr,
    bytes: u64,
    done: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let status = tokio::process::Command::new("socat")
        .args([
            "-u",
            "-b",
            &CHUNK.to_string(),
            &format!("OPEN:/dev/zero,readbytes={bytes}"),
            &format!(
                "PROXY:{PROXY_IP}:{}:{},proxyport={proxy_port}",
                target.ip(),
                target.port()
            ),
        ])
        .status()
        .await?;
    if !status.success() {
        bail!("socat failed: {status}");
    }
    let (got, at) = done.recv().await.context("sink gone")?;
    if got != bytes {
        bail!("sink got {got} bytes through socat, expected {bytes}");
    }
    Ok(at - start)
}

async fn ours_setup(
    connect: &Connect,
    target: &Addr,
    n: u64,
    done: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    for _ in 0..n {
        let mut s = ours_open(connect, target).await?;
        s.shutdown().await?;
        done.recv().await.context("sink gone")?;
    }
    Ok(start.elapsed())
}

async fn socat_setup(
    proxy_port: u16,
    target: SocketAddr,
    n: u64,
    done: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    for _ in 0..n {
        let status = tokio::process::Command::new("socat")
            .args([
                "-u",
                "/dev/null",
                &format!(
                    "PROXY:{PROXY_IP}:{}:{},proxyport={proxy_port}",
                    target.ip(),
                    target.port()
                ),
            ])
            .status()
            .await?;
        if !status.success() {
            bail!("socat failed: {status}");
        }
        done.recv().await.context("sink gone")?;
    }
    Ok(start.elapsed())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

// One thread for our client, as socat is one process.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    need("tinyproxy", "tinyproxy")?;
    need("socat", "socat")?;
    let bytes = arg("--gib", 1)? << 30;
    let reps = arg("--reps", 9)?.max(1);
    let conns = arg("--conns", 300)?.max(1);

    let dir = tempfile::tempdir()?;
    let (_proxy, proxy_port) = start_tinyproxy(dir.path()).await?;
    let (sink_addr, mut done) = sink()?;
    let target = Addr::from(sink_addr);
    let proxy = ProxyUrl::parse("bench", &format!("http://{PROXY_IP}:{proxy_port}"))?;
    let connect = HttpConnect::new(
        ProxyConnector::new(TcpConnector::new(), proxy_tls_config(None)?),
        &proxy,
    )?;

    println!("HTTP CONNECT through tinyproxy {PROXY_IP}:{proxy_port} to sink {sink_addr}");
    println!(
        "bulk: {} MiB per run, {reps} repetitions, alternating",
        bytes >> 20
    );
    let (mut ours, mut theirs, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        // Who goes first alternates too, so drift in the machine's load hits both alike.
        let (a, b) = if rep % 2 == 0 {
            let a = ours_bulk(&connect, &target, bytes, &mut done).await?;
            (a, socat_bulk(proxy_port, sink_addr, bytes, &mut done).await?)
        } else {
            let b = socat_bulk(proxy_port, sink_addr, bytes, &mut done).await?;
            (ours_bulk(&connect, &target, bytes, &mut done).await?, b)
        };
        let c = raw_bulk(proxy_port, sink_addr, bytes, &mut done).await?;
        let gbps = |d: Duration| bytes as f64 * 8.0 / d.as_secs_f64() / 1e9;
        println!(
            "  rep {rep}: svc {:.2} Gbit/s, socat {:.2} Gbit/s, bare tokio socket {:.2} Gbit/s",
            gbps(a),
            gbps(b),
            gbps(c)
        );
        ours.push(gbps(a));
        theirs.push(gbps(b));
        raw.push(gbps(c));
    }
    let ratios: Vec<f64> = ours.iter().zip(&theirs).map(|(o, t)| o / t).collect();
    let (o, t, r) = (median(ours), median(theirs), median(raw));
    println!(
        "bulk median: svc {o:.2} Gbit/s, socat {t:.2} Gbit/s, bare tokio socket {r:.2} Gbit/s; \
         ratio svc/socat {:.2} (median of per-rep ratios {:.2}), svc/bare tokio {:.2}",
        o / t,
        median(ratios),
        o / r
    );

    println!("setup: {conns} sequential tunnels per run, {reps} repetitions, alternating");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let (a, b) = if rep % 2 == 0 {
            let a = ours_setup(&connect, &target, conns, &mut done).await?;
            (a, socat_setup(proxy_port, sink_addr, conns, &mut done).await?)
        } else {
            let b = socat_setup(proxy_port, sink_addr, conns, &mut done).await?;
            (ours_setup(&connect, &target, conns, &mut done).await?, b)
        };
        let rate = |d: Duration| conns as f64 / d.as_secs_f64();
        println!(
            "  rep {rep}: svc {:.0} tunnels/s, socat {:.0} tunnels/s",
            rate(a),
            rate(b)
        );
        ours.push(rate(a));
        theirs.push(rate(b));
    }
    let (o, t) = (median(ours), median(theirs));
    println!(
        "setup median: svc {o:.0} tunnels/s, socat {t:.0} tunnels/s, ratio svc/socat {:.2}",
        o / t
    );
    Ok(())
}

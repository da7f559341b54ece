//! Reverse tunnel benchmark: single-stream throughput through the tunnel (the plain-SSH tunnel
//! port and the TLS-routed single port) against direct loopback TCP and against an OpenSSH
//! reverse tunnel (`ssh -R`, `-c aes128-gcm@openssh.com`, to a local `sshd`), all in the same
//! run; then connection set-up through an established tunnel (connections/s, p50/p99) against
//! the same two baselines, one connection at a time and `--concurrency` at a time, with the
//! dial request in the channel-open message (one round trip) and, for comparison, an agent of
//! the previous tunnel version on the 3024 proxy (request and answer on the opened channel),
//! and an agent on the TLS port that has SSH encrypt inside TLS too
//! (`Tunables::encrypt_inside_tls`; the other agent there runs SSH's `none` cipher inside TLS).
//! Alternating repetitions, medians, ratios.
//!
//! ```text
//! cargo run --release -p svc-benches --bin tunnel_bench -- [--mib 512] [--reps 3] [--conns 300]
//!     [--concurrency 8] [--alt-window-kib 8192] [--alt-packet 32768]
//!     [--alt-cipher chacha20-poly1305@openssh.com]
//! ```
//!
//! The "through the tunnel" stream is what the proxy gets from `TunnelDialer` for a client: it
//! crosses the SSH connection to the agent, which dials the target over TCP.

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context;
use base64::Engine;
use rcgen::PublicKeyData;
use ssh_key::{LineEnding, PrivateKey, private::Ed25519Keypair};
use svc_core::auth::ServedKind;
use svc_core::{
    Addr,
    config::ListenerMode,
    identity::{CertAuthority, HostCertRequest, IdentityKind, SystemRole, Verifier},
    proxy_env::ProxyEnv,
};
use svc_net::{
    dial::ProxyDialer,
    io::BoxIo,
    proxy::{ProxyBuilder, ProxySettings, RunningProxy},
    route::alpn,
    tls::{ServerIdentity, TlsSource},
    tunnel::{
        AgentConfig, CIPHERS, DialRequest, RunningAgent, Tunables, TunnelAgent, TunnelDialer, TunnelServer,
        TunnelServerConfig, dial_service_fn,
    },
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const CLUSTER: &str = "bench.test";

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

fn str_arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).cloned().unwrap_or_else(|| default.to_owned()),
        None => default.to_owned(),
    }
}

fn key() -> PrivateKey {
    PrivateKey::from(Ed25519Keypair::from_seed(&rand::random::<[u8; 32]>()))
}

/// A sink that reads `n` bytes per connection then answers one byte; also an echo for 1-byte
/// pings (set-up benchmark).
async fn sink() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut len = [0u8; 8];
                if s.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut left = u64::from_be_bytes(len);
                // Set-up jobs are empty: no 256 KiB buffer (and its zeroing) for them.
                let mut buf = if left > 0 {
                    vec![0u8; 256 * 1024]
                } else {
                    Vec::new()
                };
                while left > 0 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => left -= n as u64,
                    }
                }
                let _ = s.write_all(&[1]).await;
            });
        }
    });
    Ok(addr)
}

/// Sends `bytes` through `s` to the sink and waits for its acknowledgement; Gbit/s.
async fn bulk<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, bytes: u64) -> anyhow::Result<f64> {
    let start = Instant::now();
    s.write_all(&bytes.to_be_bytes()).await?;
    let chunk = vec![0x5au8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    s.flush().await?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).await?;
    Ok(bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9)
}

/// One set-up: open, send a zero-length job, read the ack; seconds.
async fn setup_once<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> anyhow::Result<()> {
    s.write_all(&0u64.to_be_bytes()).await?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).await?;
    Ok(())
}

struct Cluster {
    host_ca: CertAuthority,
    verifier: Arc<Verifier>,
}

fn host(
    c: &Cluster,
    role: SystemRole,
    name: &str,
) -> anyhow::Result<(String, PrivateKey, ssh_key::Certificate)> {
    let uuid = uuid::Uuid::new_v4();
    let k = key();
    let req = HostCertRequest {
        host_uuid: uuid,
        node_name: name.into(),
        roles: vec![role],
        additional_names: vec![],
        ttl: Duration::from_secs(3600),
    };
    let cert = c.host_ca.sign_host_ssh(&req, k.public_key(), SystemTime::now())?;
    Ok((svc_core::identity::host_id(&uuid, CLUSTER), k, cert))
}

fn pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let body: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap_or(""))
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        body.join("\n")
    )
}

async fn start_proxy(
    c: &Cluster,
    dir: &std::path::Path,
    separate: bool,
    tunables: Tunables,
) -> anyhow::Result<(RunningProxy, TunnelServer)> {
    let kp = rcgen::KeyPair::generate()?;
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: "proxy".into(),
        roles: vec![SystemRole::Proxy],
        additional_names: vec!["127.0.0.1".into()],
        ttl: Duration::from_secs(3600),
    };
    let der = c
        .host_ca
        .sign_host_x509(&req, &kp.subject_public_key_info(), SystemTime::now())?;
    let tag = uuid::Uuid::new_v4();
    let (cert, keyf) = (
        dir.join(format!("{tag}-cert.pem")),
        dir.join(format!("{tag}-key.pem")),
    );
    std::fs::write(&cert, pem(der.as_ref()))?;
    std::fs::write(&keyf, kp.serialize_pem())?;
    let tls = TlsSource::Files { cert, key: keyf };
    let identity = ServerIdentity::load(&tls, &[])?;
    let (_, pk, pc) = host(c, SystemRole::Proxy, "proxy")?;
    let version: svc_core::Version = "17.0.0".parse()?;
    let tunnel = TunnelServer::new(
        TunnelServerConfig::new(version.clone(), pk, pc, c.verifier.clone())
            .with_tls(identity.server_config(&[alpn::REVERSE_TUNNEL])?)
            .with_tunables(tunables),
    );
    let mut s = ProxySettings::default();
    s.ping.cluster_name = CLUSTER.into();
    s.ping.listener_mode = if separate {
        ListenerMode::Separate
    } else {
        ListenerMode::Multiplex
    };
    let lo = |_: ()| Addr::parse("127.0.0.1:0");
    s.ping.web_listen_addr = lo(())?;
    s.ping.tunnel_listen_addr = lo(())?;
    s.ping.ssh_listen_addr = lo(())?;
    s.tls = tls;
    let running = ProxyBuilder::new(s)
        .with_version(version)
        .tunnel(tunnel.plain_service())
        .route(alpn::REVERSE_TUNNEL, tunnel.tls_service())
        .bind()
        .await?;
    Ok((running, tunnel))
}

fn start_agent(c: &Cluster, web: SocketAddr, name: &str, tunables: Tunables) -> anyhow::Result<RunningAgent> {
    start_agent_with(c, web, name, tunables, true)
}

/// `open_dial` off: the agent behaves as one of the previous tunnel version (the dial request
/// and its answer on the opened channel, two round trips).
fn start_agent_with(
    c: &Cluster,
    web: SocketAddr,
    name: &str,
    tunables: Tunables,
    open_dial: bool,
) -> anyhow::Result<RunningAgent> {
    let (id, k, cert) = host(c, SystemRole::App, name)?;
    let dialer = ProxyDialer::builder(ProxyEnv::default()).build()?;
    let config = AgentConfig::new(Addr::from(web), id, k, cert, c.verifier.clone(), dialer)
        .with_version("17.0.0".parse()?)
        .with_tunables(tunables)
        .with_open_dial(open_dial);
    // The agent's resource dialer: plain TCP to the requested address.
    let service = dial_service_fn(|req: DialRequest| async move {
        let s = TcpStream::connect(&req.address).await?;
        s.set_nodelay(true)?;
        Ok(Box::new(s) as BoxIo)
    });
    Ok(TunnelAgent::new(config, service)?.spawn())
}

fn req(node: &str, target: SocketAddr) -> DialRequest {
    DialRequest {
        address: target.to_string(),
        server_id: node.into(),
        conn_type: ServedKind::App,
        client_src_addr: "127.0.0.1:1".into(),
        client_dst_addr: "127.0.0.1:2".into(),
        db_route: None,
    }
}

/// An OpenSSH reverse tunnel: `ssh -R <fwd>:<sink>` to a local sshd; returns the forwarded port.
async fn openssh_reverse(dir: &std::path::Path, sink: SocketAddr) -> anyhow::Result<(Vec<Guard>, u16)> {
    for (bin, pkg) in [
        ("/usr/sbin/sshd", "openssh-server"),
        ("/usr/bin/ssh", "openssh-client"),
    ] {
        anyhow::ensure!(
            std::path::Path::new(bin).exists(),
            "{bin} is missing: apt-get install -y {pkg}"
        );
    }
    let free =
        || -> anyhow::Result<u16> { Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
    let (sshd_port, fwd_port) = (free()?, free()?);
    let hostkey = dir.join("hostkey");
    let userkey = dir.join("userkey");
    for k in [&hostkey, &userkey] {
        std::fs::write(k, key().to_openssh(LineEnding::LF)?.as_bytes())?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(k, std::fs::Permissions::from_mode(0o600))?;
    }
    let user_pub = PrivateKey::from_openssh(std::fs::read_to_string(&userkey)?)?
        .public_key()
        .to_openssh()?;
    std::fs::write(dir.join("authorized_keys"), format!("{user_pub}\n"))?;
    let conf = dir.join("sshd_config");
    std::fs::write(
        &conf,
        format!(
            "ListenAddress 127.0.0.1:{sshd_port}\nHostKey {}\nAuthorizedKeysFile {}\nUsePAM no\nStrictModes no\n\
             PermitRootLogin yes\nPasswordAuthentication no\nPidFile none\nAllowTcpForwarding yes\nGatewayPorts no\n",
            hostkey.display(),
            dir.join("authorized_keys").display()
        ),
    )?;
    std::fs::create_dir_all("/run/sshd")?;
    let sshd = Guard(
        Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(&conf)
            .stderr(Stdio::null())
            .spawn()?,
    );
    for _ in 0..200 {
        if TcpStream::connect(("127.0.0.1", sshd_port)).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ssh = Guard(
        Command::new("/usr/bin/ssh")
            .args([
                "-F",
                "/dev/null",
                "-N",
                "-c",
                "aes128-gcm@openssh.com",
                "-o",
                "StrictHostKeyChecking=no",
            ])
            .args([
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "ExitOnForwardFailure=yes",
            ])
            .arg("-i")
            .arg(&userkey)
            .args(["-p", &sshd_port.to_string()])
            .arg("-R")
            .arg(format!("127.0.0.1:{fwd_port}:{sink}"))
            .arg("root@127.0.0.1")
            .stderr(Stdio::null())
            .spawn()?,
    );
    for _ in 0..500 {
        if TcpStream::connect(("127.0.0.1", fwd_port)).await.is_ok() {
            return Ok((vec![ssh, sshd], fwd_port));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("the OpenSSH reverse tunnel never came up")
}

/// Where a set-up benchmark connects.
#[derive(Clone)]
enum Path {
    /// Plain TCP (the sink itself, or OpenSSH's forwarded port).
    Tcp(SocketAddr),
    /// Through an svc tunnel: the dialer, the agent's name and the target.
    Tunnel(TunnelDialer, &'static str, SocketAddr),
}

impl Path {
    async fn once(&self) -> anyhow::Result<()> {
        match self {
            Path::Tcp(addr) => {
                let s = TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                setup_once(s).await
            }
            Path::Tunnel(dialer, node, target) => setup_once(dialer.dial(req(node, *target)).await?).await,
        }
    }
}

/// `total` set-ups, `conc` at a time (each worker runs its share back to back): the seconds
/// the whole run took and every set-up's latency in milliseconds.
async fn setup_run(path: &Path, total: usize, conc: usize) -> anyhow::Result<(f64, Vec<f64>)> {
    let conc = conc.max(1);
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..conc {
        let path = path.clone();
        let share = total / conc + usize::from(w < total % conc);
        workers.spawn(async move {
            let mut lat = Vec::with_capacity(share);
            for _ in 0..share {
                let t0 = Instant::now();
                path.once().await?;
                lat.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            anyhow::Ok(lat)
        });
    }
    let mut lat = Vec::with_capacity(total);
    while let Some(r) = workers.join_next().await {
        lat.extend(r??);
    }
    Ok((start.elapsed().as_secs_f64(), lat))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let bytes = arg("--mib", 512)? * 1024 * 1024;
    let reps = arg("--reps", 3)?;
    let conns = arg("--conns", 300)?;
    let concurrency = arg("--concurrency", 8)? as usize;
    let dir = tempfile::tempdir()?;
    let now = SystemTime::now();
    let host_ca = CertAuthority::generate(IdentityKind::Host, CLUSTER, now, Duration::from_secs(86400))?;
    let verifier = Arc::new(Verifier::new(CLUSTER, [host_ca.trusted()])?);
    let c = Cluster { host_ca, verifier };

    let sink = sink().await?;
    // An alternative configuration, to show what a tunable buys in the same run: by default
    // the previous cipher preference (ChaCha20-Poly1305 first, russh's default), with the
    // default window and packet size unless `--alt-*` say otherwise.
    let mut alt = Tunables::default();
    alt.window_size = arg("--alt-window-kib", u64::from(alt.window_size / 1024))? as u32 * 1024;
    alt.max_packet_size = arg("--alt-packet", u64::from(alt.max_packet_size))? as u32;
    let alt_cipher = str_arg("--alt-cipher", "chacha20-poly1305@openssh.com");
    let first = CIPHERS
        .iter()
        .find(|c| c.as_ref() == alt_cipher)
        .with_context(|| format!("--alt-cipher {alt_cipher:?} is not one of {CIPHERS:?}"))?;
    let mut order = vec![*first];
    order.extend(CIPHERS.iter().filter(|c| *c != first));
    let alt = alt.with_ciphers(order);
    let alt_label = format!(
        "{} KiB window, {} B packets, {alt_cipher}; 3024 path",
        alt.window_size / 1024,
        alt.max_packet_size
    );
    let russh_defaults = alt;
    let (p_sep, t_sep) = start_proxy(&c, dir.path(), true, Tunables::default()).await?;
    let (p_tls, t_tls) = start_proxy(&c, dir.path(), false, Tunables::default()).await?;
    let (p_def, t_def) = start_proxy(&c, dir.path(), true, russh_defaults.clone()).await?;
    let a_sep = start_agent(&c, p_sep.addrs().web, "agent-3024", Tunables::default())?;
    let a_tls = start_agent(&c, p_tls.addrs().web, "agent-tls", Tunables::default())?;
    // The same TLS port, the agent asking SSH to encrypt inside TLS too (as before SSH's `none`
    // cipher inside TLS): the double encryption's cost in the same run.
    let a_tls_enc = start_agent(
        &c,
        p_tls.addrs().web,
        "agent-tls-enc",
        Tunables::default().with_encrypt_inside_tls(true),
    )?;
    let a_def = start_agent(&c, p_def.addrs().web, "agent-def", russh_defaults)?;
    t_sep.registry().wait_for("agent-3024", |a| a.is_some()).await;
    t_tls.registry().wait_for("agent-tls", |a| a.is_some()).await;
    t_tls.registry().wait_for("agent-tls-enc", |a| a.is_some()).await;
    for (name, agent) in [
        ("agent-3024", &a_sep),
        ("agent-tls", &a_tls),
        ("agent-tls-enc", &a_tls_enc),
    ] {
        agent.wait_for(|s| s.established > 0).await;
        let cipher = agent.status().ssh_cipher.unwrap_or_default();
        println!("{name}: SSH cipher {cipher}");
    }
    t_def.registry().wait_for("agent-def", |a| a.is_some()).await;
    // The previous dial path (request and answer on the opened channel), on the 3024 proxy.
    let a_old = start_agent_with(&c, p_sep.addrs().web, "agent-old", Tunables::default(), false)?;
    t_sep.registry().wait_for("agent-old", |a| a.is_some()).await;
    let d_def = t_def.dialer();
    let (d_sep, d_tls): (TunnelDialer, TunnelDialer) = (t_sep.dialer(), t_tls.dialer());
    let (_ossh, fwd) = openssh_reverse(dir.path(), sink).await?;
    let fwd_addr: SocketAddr = ([127, 0, 0, 1], fwd).into();

    println!(
        "single stream, {} MiB per run, {reps} alternating repetitions",
        bytes / 1024 / 1024
    );
    let (mut direct, mut sep, mut tls, mut ossh, mut def) = (vec![], vec![], vec![], vec![], vec![]);
    let mut tls_enc = vec![];
    for _ in 0..reps {
        let s = TcpStream::connect(sink).await?;
        s.set_nodelay(true)?;
        direct.push(bulk(s, bytes).await?);
        sep.push(bulk(d_sep.dial(req("agent-3024", sink)).await?, bytes).await?);
        tls.push(bulk(d_tls.dial(req("agent-tls", sink)).await?, bytes).await?);
        tls_enc.push(bulk(d_tls.dial(req("agent-tls-enc", sink)).await?, bytes).await?);
        def.push(bulk(d_def.dial(req("agent-def", sink)).await?, bytes).await?);
        let s = TcpStream::connect(fwd_addr).await?;
        s.set_nodelay(true)?;
        ossh.push(bulk(s, bytes).await?);
    }
    let (d, s, t, o, f) = (
        median(direct),
        median(sep),
        median(tls),
        median(ossh),
        median(def),
    );
    println!("  direct TCP            {d:7.2} Gbit/s   1.00");
    println!(
        "  svc tunnel (3024 SSH) {s:7.2} Gbit/s   {:.2} x direct   {:.2} x OpenSSH -R",
        s / d,
        s / o
    );
    println!(
        "  svc tunnel (TLS port) {t:7.2} Gbit/s   {:.2} x direct   {:.2} x OpenSSH -R",
        t / d,
        t / o
    );
    let e = median(tls_enc);
    println!(
        "  svc TLS port, SSH enc {e:7.2} Gbit/s   {:.2} x direct   {:.2} x OpenSSH -R  (SSH encrypts inside TLS too)",
        e / d,
        e / o
    );
    println!(
        "  svc, alternative      {f:7.2} Gbit/s   {:.2} x direct   {:.2} x OpenSSH -R  ({alt_label})",
        f / d,
        f / o,
    );
    println!("  OpenSSH -R aes128-gcm {o:7.2} Gbit/s   {:.2} x direct", o / d);

    let paths = [
        ("direct TCP", Path::Tcp(sink)),
        (
            "svc tunnel (3024 SSH)",
            Path::Tunnel(d_sep.clone(), "agent-3024", sink),
        ),
        (
            "svc tunnel (TLS port)",
            Path::Tunnel(d_tls.clone(), "agent-tls", sink),
        ),
        (
            "svc TLS port, SSH enc",
            Path::Tunnel(d_tls.clone(), "agent-tls-enc", sink),
        ),
        (
            "svc 3024, old dial",
            Path::Tunnel(d_sep.clone(), "agent-old", sink),
        ),
        ("svc, alternative", Path::Tunnel(d_def.clone(), "agent-def", sink)),
        // Last: the ratios are against it.
        ("OpenSSH -R", Path::Tcp(fwd_addr)),
    ];
    // The paths take turns in `reps` rounds, so that a burst of load elsewhere on the machine
    // lands on all of them rather than on one.
    let rounds = reps.max(1) as usize;
    for conc in [1, concurrency] {
        println!(
            "connection set-up through an established tunnel: {conns} connections per path in {rounds} \
             alternating rounds, {conc} at a time (connect + 8-byte request + 1-byte answer + close)"
        );
        let mut acc: Vec<(f64, Vec<f64>)> = paths.iter().map(|_| (0.0, Vec::new())).collect();
        for round in 0..rounds {
            let n = conns as usize / rounds + usize::from(round < conns as usize % rounds);
            for ((_, path), (secs, lat)) in paths.iter().zip(acc.iter_mut()) {
                let (s, l) = setup_run(path, n, conc).await?;
                *secs += s;
                lat.extend(l);
            }
        }
        let rows: Vec<_> = paths
            .iter()
            .zip(acc)
            .map(|((name, _), (secs, mut lat))| {
                let rate = lat.len() as f64 / secs;
                (name, rate, pct(&mut lat, 0.5), pct(&mut lat, 0.99))
            })
            .collect();
        let ossh_rate = rows.last().map(|r| r.1).unwrap_or(f64::NAN);
        for (name, rate, p50, p99) in rows {
            println!(
                "  {name:22} {rate:8.0} conn/s   p50 {p50:6.3} ms   p99 {p99:6.3} ms   {:.2} x OpenSSH -R",
                rate / ossh_rate
            );
        }
    }
    a_old.shutdown().await;
    a_def.shutdown().await;
    p_def.shutdown().await;
    a_sep.shutdown().await;
    a_tls.shutdown().await;
    a_tls_enc.shutdown().await;
    p_sep.shutdown().await;
    p_tls.shutdown().await;
    Ok(())
}

//! The agent simulator and the proxy processes of the scale harness (`scale_bench`,
//! `agent_sim`).
//!
//! Every simulated agent is a real [`TunnelAgent`] — the same code the `svc` agent runs: it
//! asks the proxy's `/webapi/ping` where to dial, speaks SSH inside TLS (ALPN
//! `svc-reversetunnel`) on the proxy's web port, authenticates with its own host certificate,
//! sends heartbeats at the configured cadence, honours the discovery channel (with proxy
//! peering, the proxies chosen for it) and reconnects with the reference backoff and jitter.
//! Thousands of them share one process and one tokio runtime; each costs a handful of tasks
//! (the pool manager, one dial loop per tunnel, the SSH session, heartbeat and discovery).
//!
//! Identities: each agent has a distinct host ID, key and certificate, signed by the cluster's
//! host CA that the harness holds (the step the Auth Service performs after it has checked a
//! join token). The token check itself is not repeated 10,000 times: it is the Auth Service's
//! cost per join, not the proxy's per tunnel.
//!
//! A proxy process ([`proxy_main`]) is the Proxy Service's tunnel side as `svc` assembles it
//! (`ProxyBuilder` with the reverse tunnel on the web port by ALPN, the peering server on its
//! own port), plus a loopback-only control port for the harness: `count` answers how many
//! agents are registered, and `dial <host-id>` dials that agent through the proxy's
//! [`TunnelDialer`](svc_net::tunnel::TunnelDialer) — through a peer proxy when the agent holds
//! no tunnel here — the same call the proxy's SSH, app and database handlers make.

use std::{
    io::{BufRead, BufReader as StdBufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::Context;
use rcgen::PublicKeyData;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject};
use ssh_key::{LineEnding, PrivateKey, private::Ed25519Keypair};
use svc_core::{
    Addr,
    auth::ServedKind,
    config::ListenerMode,
    identity::{CertAuthority, HostCertRequest, IdentityKind, SystemRole, Verifier},
    proxy_env::ProxyEnv,
};
use svc_net::{
    dial::ProxyDialer,
    io::BoxIo,
    proxy::{ProxyBuilder, ProxySettings},
    route::alpn,
    tls::{ServerIdentity, TlsSource},
    tunnel::{
        AgentConfig, DialRequest, DiscoveredProxy, Discovery, Peer, PeerDialer, PeerIdentity, RunningAgent,
        TunnelAgent, TunnelServer, TunnelServerConfig, TunnelStrategy, dial_service_fn,
    },
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};

/// The simulated cluster's name.
pub const CLUSTER: &str = "scale.test";

/// How many loopback addresses (127.0.0.1 …) the agents spread their dials over, so that
/// 10,000 tunnels plus their pings never run out of ephemeral ports towards one address.
pub const LOOPBACKS: u8 = 8;

/// The cluster's host CA and the verifier trusting it.
pub struct Cluster {
    /// The host CA (signs agents' and proxies' host certificates).
    pub host_ca: CertAuthority,
    /// Trusts the host CA.
    pub verifier: Arc<Verifier>,
}

impl Cluster {
    /// A new cluster with a fresh host CA.
    pub fn generate() -> anyhow::Result<Self> {
        let host_ca = CertAuthority::generate(
            IdentityKind::Host,
            CLUSTER,
            SystemTime::now(),
            Duration::from_secs(7 * 86400),
        )?;
        Self::from_ca(host_ca)
    }

    fn from_ca(host_ca: CertAuthority) -> anyhow::Result<Self> {
        let verifier = Arc::new(Verifier::new(CLUSTER, [host_ca.trusted()])?);
        Ok(Self { host_ca, verifier })
    }

    /// Stores the CA (with its keys) in `dir/host_ca.json`, for proxy processes and `agent_sim`.
    pub fn store(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join("host_ca.json");
        std::fs::write(&path, self.host_ca.to_stored()?.expose())
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Loads what [`Cluster::store`] wrote.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("host_ca.json");
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Self::from_ca(CertAuthority::from_stored(&bytes)?)
    }

    /// A distinct agent identity: host ID, SSH key, host certificate (role `node`).
    pub fn agent_identity(&self, name: &str) -> anyhow::Result<AgentIdentity> {
        let uuid = uuid::Uuid::new_v4();
        let key = PrivateKey::from(Ed25519Keypair::from_seed(&rand::random::<[u8; 32]>()));
        let req = HostCertRequest {
            host_uuid: uuid,
            node_name: name.into(),
            roles: vec![SystemRole::Node],
            additional_names: vec![],
            ttl: Duration::from_secs(7 * 86400),
        };
        let cert = self
            .host_ca
            .sign_host_ssh(&req, key.public_key(), SystemTime::now())?;
        Ok(AgentIdentity {
            host_id: svc_core::identity::host_id(&uuid, CLUSTER),
            key,
            cert,
        })
    }

    /// Writes a proxy's identity to `dir/proxy-<index>/`: an X.509 certificate (TLS on the
    /// web port and on the peering port; it names every loopback address agents dial) and an
    /// SSH host certificate, both for the same host ID. A restarted proxy process loads the
    /// same files, so it comes back under the same host ID.
    pub fn write_proxy_identity(&self, dir: &Path, index: usize) -> anyhow::Result<String> {
        let pdir = dir.join(format!("proxy-{index}"));
        std::fs::create_dir_all(&pdir)?;
        let uuid = uuid::Uuid::new_v4();
        let kp = rcgen::KeyPair::generate()?;
        let req = HostCertRequest {
            host_uuid: uuid,
            node_name: format!("proxy-{index}"),
            roles: vec![SystemRole::Proxy],
            additional_names: (1..=LOOPBACKS).map(|i| format!("127.0.0.{i}")).collect(),
            ttl: Duration::from_secs(7 * 86400),
        };
        let der = self
            .host_ca
            .sign_host_x509(&req, &kp.subject_public_key_info(), SystemTime::now())?;
        std::fs::write(pdir.join("cert.pem"), pem("CERTIFICATE", der.as_ref()))?;
        std::fs::write(pdir.join("key.pem"), kp.serialize_pem())?;
        let key = PrivateKey::from(Ed25519Keypair::from_seed(&rand::random::<[u8; 32]>()));
        let cert = self
            .host_ca
            .sign_host_ssh(&req, key.public_key(), SystemTime::now())?;
        std::fs::write(pdir.join("ssh_key"), key.to_openssh(LineEnding::LF)?.as_bytes())?;
        std::fs::write(pdir.join("ssh_cert"), cert.to_openssh()?)?;
        let host_id = svc_core::identity::host_id(&uuid, CLUSTER);
        std::fs::write(pdir.join("host_id"), &host_id)?;
        Ok(host_id)
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<String> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// One simulated agent's credentials.
pub struct AgentIdentity {
    /// `<uuid>.<cluster>`.
    pub host_id: String,
    /// Its SSH key.
    pub key: PrivateKey,
    /// Its host certificate.
    pub cert: ssh_key::Certificate,
}

/// What every simulated agent serves on a transport channel: one byte (`!`), then the
/// connection closes. Enough to prove the agent is routable end to end.
fn answer_service() -> svc_net::tunnel::DialService {
    dial_service_fn(|_req: DialRequest| async move {
        let (ours, theirs) = tokio::io::duplex(64);
        tokio::spawn(async move {
            let mut ours = ours;
            let _ = ours.write_all(b"!").await;
            let _ = ours.shutdown().await;
        });
        Ok(Box::new(theirs) as BoxIo)
    })
}

/// Starts one simulated agent whose configured proxy address is `proxy`.
pub fn spawn_agent(cluster: &Cluster, proxy: Addr, id: AgentIdentity) -> anyhow::Result<RunningAgent> {
    let dialer = ProxyDialer::builder(ProxyEnv::default()).build()?;
    let config = AgentConfig::new(
        proxy,
        id.host_id,
        id.key,
        id.cert,
        cluster.verifier.clone(),
        dialer,
    )
    .with_version("17.0.0".parse()?);
    Ok(TunnelAgent::new(config, answer_service())?.spawn())
}

/// The proxy address agent number `i` is configured with: the web port on one of the
/// [`LOOPBACKS`] addresses.
pub fn agent_proxy_addr(i: usize, port: u16) -> Addr {
    let last = 1 + (i % usize::from(LOOPBACKS)) as u8;
    Addr::from(SocketAddr::from(([127, 0, 0, last], port)))
}

/// A running simulator: its agents.
#[derive(Default)]
pub struct Simulator {
    /// Every agent started, with its host ID.
    pub agents: Vec<(String, RunningAgent)>,
}

impl Simulator {
    /// Starts agents until there are `total`, each configured with one of `ports` on the
    /// loopback addresses (spread evenly: agent `i` gets `ports[i % len]` on
    /// [`agent_proxy_addr`]), `per_second` at most (a fleet coming up).
    pub async fn grow_to(
        &mut self,
        cluster: &Cluster,
        ports: &[u16],
        total: usize,
        per_second: u32,
    ) -> anyhow::Result<()> {
        let ports = ports.to_vec();
        anyhow::ensure!(!ports.is_empty(), "no proxy port to configure agents with");
        self.grow_with(cluster, total, per_second, |i| {
            agent_proxy_addr(i, ports[i % ports.len()])
        })
        .await
    }

    /// Starts agents until there are `total`, agent `i` configured with the proxy address
    /// `addr_of(i)`, `per_second` at most.
    pub async fn grow_with(
        &mut self,
        cluster: &Cluster,
        total: usize,
        per_second: u32,
        addr_of: impl Fn(usize) -> Addr,
    ) -> anyhow::Result<()> {
        let pause = Duration::from_secs(1) / per_second.max(1);
        let mut tick = tokio::time::interval(pause);
        while self.agents.len() < total {
            tick.tick().await;
            let i = self.agents.len();
            let id = cluster.agent_identity(&format!("sim-{i}"))?;
            let host_id = id.host_id.clone();
            let agent = spawn_agent(cluster, addr_of(i), id)?;
            self.agents.push((host_id, agent));
        }
        Ok(())
    }

    /// How many agents hold at least one tunnel, and how many tunnels in all.
    pub fn connected(&self) -> (usize, usize) {
        self.agents.iter().fold((0, 0), |(a, t), (_, r)| {
            let n = r.status().connected.len();
            (a + usize::from(n > 0), t + n)
        })
    }

    /// Stops every agent.
    pub async fn shutdown(self) {
        for (_, a) in self.agents {
            a.shutdown().await;
        }
    }
}

/// Raises this process's open-file limit to `want` (hard limit too, when allowed).
pub fn raise_nofile(want: u64) -> anyhow::Result<u64> {
    let (soft, hard) = rlimit::Resource::NOFILE.get()?;
    if soft >= want {
        return Ok(soft);
    }
    if rlimit::Resource::NOFILE.set(want, want.max(hard)).is_err() {
        rlimit::Resource::NOFILE.set(hard, hard)?;
    }
    Ok(rlimit::Resource::NOFILE.get()?.0)
}

/// Resident memory (`VmRSS`) of process `pid`, bytes.
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("no VmRSS in /proc/<pid>/status")?;
    Ok(kib * 1024)
}

/// CPU time (user + system) of process `pid` so far.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/<pid>/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the ')'.
    let ticks: u64 =
        f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?;
    Ok(Duration::from_secs_f64(ticks as f64 / 100.0))
}

/// The load average line (`/proc/loadavg`), to note next to a figure.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// How agents are told to spread over the proxies.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Every agent holds a tunnel to every proxy.
    Mesh,
    /// Proxy peering, each agent holding this many tunnels.
    Peering(usize),
}

impl Mode {
    fn strategy(self) -> TunnelStrategy {
        match self {
            Mode::Mesh => TunnelStrategy::AgentMesh,
            Mode::Peering(n) => TunnelStrategy::ProxyPeering {
                agent_connection_count: n,
            },
        }
    }

    fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "mesh" => Ok(Mode::Mesh),
            other => Ok(Mode::Peering(
                other
                    .strip_prefix("peering:")
                    .context("mode is mesh or peering:<N>")?
                    .parse()?,
            )),
        }
    }

    fn arg(self) -> String {
        match self {
            Mode::Mesh => "mesh".into(),
            Mode::Peering(n) => format!("peering:{n}"),
        }
    }
}

/// A proxy process started by the harness.
pub struct ProxyProcess {
    child: Child,
    /// Its index (`proxy-<index>` in the state directory).
    pub index: usize,
    /// Its host ID.
    pub host_id: String,
    /// The web port (on every loopback address).
    pub web_port: u16,
    /// The peering address.
    pub peer_addr: SocketAddr,
    /// The control address (`count`, `dial <host-id>`).
    pub control: SocketAddr,
}

impl ProxyProcess {
    /// Starts `exe proxy …` for proxy `index` (its identity already written) on `web_port`
    /// (0: any) and waits for its `READY` line.
    pub fn start(exe: &Path, dir: &Path, index: usize, web_port: u16, mode: Mode) -> anyhow::Result<Self> {
        // `SCALE_PROXY_WRAPPER=heaptrack` (any program that runs its arguments) profiles the
        // proxy processes.
        let mut command = match std::env::var_os("SCALE_PROXY_WRAPPER") {
            Some(wrapper) => {
                let mut c = Command::new(wrapper);
                c.arg(exe);
                c
            }
            None => Command::new(exe),
        };
        let mut child = command
            .arg("proxy")
            .arg("--dir")
            .arg(dir)
            .args([
                "--index",
                &index.to_string(),
                "--port",
                &web_port.to_string(),
                "--mode",
                &mode.arg(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} proxy", exe.display()))?;
        let stdout = child.stdout.take().context("the proxy's stdout")?;
        let mut line = String::new();
        let mut out = StdBufReader::new(stdout);
        // A wrapper may print lines of its own first.
        for _ in 0..50 {
            line.clear();
            if out.read_line(&mut line)? == 0 || line.starts_with("READY") {
                break;
            }
        }
        let mut fields = std::collections::HashMap::new();
        for kv in line.split_whitespace().skip(1) {
            if let Some((k, v)) = kv.split_once('=') {
                fields.insert(k.to_owned(), v.to_owned());
            }
        }
        let get = |k: &str| {
            fields
                .get(k)
                .cloned()
                .with_context(|| format!("proxy {index} did not report {k}: {line:?}"))
        };
        anyhow::ensure!(
            line.starts_with("READY"),
            "proxy {index} failed to start: {line:?}"
        );
        Ok(Self {
            index,
            host_id: get("id")?,
            web_port: get("web")?.parse()?,
            peer_addr: get("peer")?.parse()?,
            control: get("control")?.parse()?,
            child,
        })
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it (SIGKILL: a crash, no drain) and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// How many agents are registered on it.
    pub async fn count(&self) -> anyhow::Result<usize> {
        Ok(control(self.control, "count").await?.trim().parse()?)
    }

    /// Dials `host_id` through it; the round trip (connect to the control port, dial through
    /// the tunnel or a peer, the agent's answer byte).
    pub async fn dial(&self, host_id: &str) -> anyhow::Result<Duration> {
        let started = tokio::time::Instant::now();
        let answer = control(self.control, &format!("dial {host_id}")).await?;
        anyhow::ensure!(
            answer == "ok!",
            "dial {host_id} through proxy {}: {answer}",
            self.index
        );
        Ok(started.elapsed())
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn control(addr: SocketAddr, command: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(format!("{command}\n").as_bytes()).await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut out))
        .await
        .context("the proxy's control port did not answer within 30 s")??;
    Ok(out.trim_end().replace('\n', ""))
}

/// The roster the harness writes for proxy processes (`dir/roster`): one line per proxy,
/// `<host-id> <web-port> <peer-addr>`; they read it every second, as real proxies read the
/// backend's proxy heartbeats.
pub fn write_roster(dir: &Path, proxies: &[&ProxyProcess]) -> anyhow::Result<()> {
    let text: String = proxies
        .iter()
        .map(|p| format!("{} {} {}\n", p.host_id, p.web_port, p.peer_addr))
        .collect();
    let tmp = dir.join("roster.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, dir.join("roster"))?;
    Ok(())
}

/// `scale_bench proxy --dir D --index I --port P --mode M`: one proxy process (see the module
/// documentation). Prints `READY id=… web=… peer=… control=…` once it listens.
pub async fn proxy_main(args: &[String]) -> anyhow::Result<()> {
    let get = |name: &str| -> anyhow::Result<String> {
        let i = args
            .iter()
            .position(|a| a == name)
            .with_context(|| format!("{name} is required"))?;
        args.get(i + 1)
            .cloned()
            .with_context(|| format!("{name} needs a value"))
    };
    let dir = PathBuf::from(get("--dir")?);
    let index: usize = get("--index")?.parse()?;
    let port: u16 = get("--port")?.parse()?;
    let mode = Mode::parse(&get("--mode")?)?;
    raise_nofile(200_000)?;
    let proxy = SimProxy::start(&dir, index, port, mode).await?;
    println!(
        "READY id={} web={} peer={} control={}",
        proxy.host_id, proxy.web_port, proxy.peer_addr, proxy.control
    );
    // Runs until killed.
    std::future::pending::<()>().await;
    drop(proxy);
    Ok(())
}

/// A proxy of the simulated cluster, in this process: what [`proxy_main`] runs.
pub struct SimProxy {
    /// The proxy's listeners.
    pub running: svc_net::proxy::RunningProxy,
    /// Its tunnel server.
    pub tunnel: TunnelServer,
    /// Its host ID.
    pub host_id: String,
    /// The web port (on every loopback address).
    pub web_port: u16,
    /// The peering address.
    pub peer_addr: SocketAddr,
    /// The control address (`count`, `dial <host-id>`).
    pub control: SocketAddr,
}

impl SimProxy {
    /// Starts proxy `index` of the cluster stored in `dir` (its identity already written) on
    /// `port` (0: any) of every address.
    pub async fn start(dir: &Path, index: usize, port: u16, mode: Mode) -> anyhow::Result<Self> {
        let cluster = Cluster::load(dir)?;
        let pdir = dir.join(format!("proxy-{index}"));
        let host_id = std::fs::read_to_string(pdir.join("host_id"))?;
        let ssh_key = PrivateKey::from_openssh(std::fs::read_to_string(pdir.join("ssh_key"))?)?;
        let ssh_cert =
            ssh_key::Certificate::from_openssh(std::fs::read_to_string(pdir.join("ssh_cert"))?.trim())?;
        let tls = TlsSource::Files {
            cert: pdir.join("cert.pem"),
            key: pdir.join("key.pem"),
        };
        let identity = ServerIdentity::load(&tls, &[])?;
        let version: svc_core::Version = "17.0.0".parse()?;
        let tunnel = TunnelServer::new(
            TunnelServerConfig::new(version.clone(), ssh_key, ssh_cert, cluster.verifier.clone())
                .with_tls(identity.server_config(&[alpn::REVERSE_TUNNEL])?),
        );
        tunnel.set_strategy(mode.strategy());
        // The peering identity: the same X.509 host certificate (role proxy).
        let key_pem = std::fs::read_to_string(pdir.join("key.pem"))?;
        let key_der = rcgen::KeyPair::from_pem(&key_pem)?.serialize_der();
        let cert_pem = std::fs::read(pdir.join("cert.pem"))?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem).collect::<Result<Vec<_>, _>>()?;
        let peer_identity = PeerIdentity {
            host_id: host_id.clone(),
            verifier: cluster.verifier.clone(),
            chain,
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der)),
        };
        let peers = PeerDialer::new(&peer_identity)?;
        tunnel.set_peer_dialer(peers.clone());

        let mut s = ProxySettings::default();
        s.ping.cluster_name = CLUSTER.into();
        s.ping.listener_mode = ListenerMode::Multiplex;
        s.ping.web_listen_addr = Addr::parse(&format!("0.0.0.0:{port}"))?;
        s.ping.tunnel_listen_addr = Addr::parse("127.0.0.1:0")?;
        s.ping.ssh_listen_addr = Addr::parse("127.0.0.1:0")?;
        s.tls = tls;
        let running = ProxyBuilder::new(s)
            .with_version(version)
            .route(alpn::REVERSE_TUNNEL, tunnel.tls_service())
            .bind()
            .await?;
        let web_port = running.addrs().web.port();

        let peer_listener = TcpListener::bind("127.0.0.1:0").await?;
        let peer_addr = peer_listener.local_addr()?;
        {
            let tunnel = tunnel.clone();
            tokio::spawn(async move {
                let stop = tokio_util::sync::CancellationToken::new();
                if let Err(e) = svc_net::tunnel::serve_peers(
                    peer_listener,
                    tunnel,
                    &peer_identity,
                    svc_net::listen::ListenOptions::default(),
                    stop,
                )
                .await
                {
                    eprintln!("proxy {index}: the peering server stopped: {e}");
                }
            });
        }
        let control_listener = TcpListener::bind("127.0.0.1:0").await?;
        let control = control_listener.local_addr()?;
        tokio::spawn(serve_control(control_listener, tunnel.clone()));
        tokio::spawn(follow_roster(
            dir.to_owned(),
            host_id.clone(),
            tunnel.clone(),
            peers,
        ));
        Ok(Self {
            running,
            tunnel,
            host_id,
            web_port,
            peer_addr,
            control,
        })
    }
}

async fn serve_control(listener: TcpListener, tunnel: TunnelServer) {
    while let Ok((s, _)) = listener.accept().await {
        let tunnel = tunnel.clone();
        tokio::spawn(async move {
            let _ = s.set_nodelay(true);
            let mut s = BufReader::new(s);
            let mut line = String::new();
            if s.read_line(&mut line).await.is_err() {
                return;
            }
            let line = line.trim();
            let answer = if line == "count" {
                tunnel.registry().list().len().to_string()
            } else if let Some(host_id) = line.strip_prefix("dial ") {
                let req = DialRequest {
                    address: "sim:0".into(),
                    server_id: host_id.to_owned(),
                    conn_type: ServedKind::Node,
                    client_src_addr: "127.0.0.1:1".into(),
                    client_dst_addr: "127.0.0.1:2".into(),
                    db_route: None,
                };
                match tunnel.dialer().with_attach_wait(Duration::ZERO).dial(req).await {
                    Ok(mut stream) => {
                        let mut byte = Vec::new();
                        match stream.read_to_end(&mut byte).await {
                            Ok(_) => format!("ok{}", String::from_utf8_lossy(&byte)),
                            Err(e) => format!("reading the agent's answer: {e}"),
                        }
                    }
                    Err(e) => e.to_string(),
                }
            } else {
                format!("unknown command {line:?}")
            };
            let _ = s.get_mut().write_all(format!("{answer}\n").as_bytes()).await;
            let _ = s.get_mut().shutdown().await;
        });
    }
}

/// Every second: the roster (which proxies are live) becomes the discovery list, and each
/// peer's registered agents (what its backend record would say) the peer dialer's table.
async fn follow_roster(dir: PathBuf, me: String, tunnel: TunnelServer, peers: PeerDialer) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = String::new();
    loop {
        tick.tick().await;
        let agents: String = tunnel
            .registry()
            .list()
            .into_iter()
            .map(|a| a.host_id + "\n")
            .collect();
        let tmp = dir.join(format!("agents-{me}.tmp"));
        if std::fs::write(&tmp, agents).is_ok() {
            let _ = std::fs::rename(&tmp, dir.join(format!("agents-{me}")));
        }
        let Ok(roster) = std::fs::read_to_string(dir.join("roster")) else {
            continue;
        };
        let mut listed = Vec::new();
        let mut table = Vec::new();
        for line in roster.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [id, web, peer] = f[..] else { continue };
            listed.push(DiscoveredProxy {
                proxy_id: id.to_owned(),
                tunnel_addr: format!("127.0.0.1:{web}"),
                tls_routing: true,
            });
            let held = std::fs::read_to_string(dir.join(format!("agents-{id}"))).unwrap_or_default();
            table.push(Peer::new(id, peer, held.lines().map(str::to_owned).collect()));
        }
        peers.set_peers(table);
        if roster != last {
            last = roster;
            tunnel.set_proxies(Discovery {
                proxies: listed,
                complete: true,
                hold: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_simulated_agents_register_and_answer_a_dial_through_the_proxy() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cluster = Cluster::generate().expect("a host CA");
        cluster.store(dir.path()).expect("the stored CA");
        cluster
            .write_proxy_identity(dir.path(), 0)
            .expect("the proxy's identity");
        let proxy = SimProxy::start(dir.path(), 0, 0, Mode::Mesh)
            .await
            .expect("the proxy starts");
        let mut fleet = Simulator::default();
        fleet
            .grow_to(&cluster, &[proxy.web_port], 50, 1000)
            .await
            .expect("50 agents start");
        let registered = async {
            while proxy.tunnel.registry().list().len() < 50 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), registered)
            .await
            .expect("50 agents registered on the proxy within 60 s");
        let ids: std::collections::BTreeSet<String> = proxy
            .tunnel
            .registry()
            .list()
            .into_iter()
            .map(|a| a.host_id)
            .collect();
        assert_eq!(ids.len(), 50, "every agent has its own host identity");
        for (host_id, _) in &fleet.agents {
            let answer = tokio::time::timeout(
                Duration::from_secs(30),
                control(proxy.control, &format!("dial {host_id}")),
            )
            .await
            .expect("the dial answers within 30 s")
            .expect("the control port answers");
            assert_eq!(answer, "ok!", "dialing {host_id} through the proxy");
        }
        assert_eq!(control(proxy.control, "count").await.expect("count"), "50");
        fleet.shutdown().await;
        proxy.running.shutdown().await;
    }
}

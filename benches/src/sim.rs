//! The agent simulator and the processes of the scale harness (`scale_bench`, `agent_sim`).
//!
//! The cluster is real from its root: an Auth Service process (the `svc` binary with an
//! Auth-only configuration and the embedded store, [`AuthProcess`]) holds the CAs; the harness
//! holds only the admin identity that Auth Service writes, and uses it to mint join tokens.
//!
//! A proxy process ([`proxy_main`]) joins with a `proxy` token (its saved identity on a
//! restart, so it comes back under the same host ID) and takes the cluster's trust from the
//! join; it is the Proxy Service's tunnel side as `svc` assembles it (`ProxyBuilder` with the
//! reverse tunnel on the web port by ALPN, the Auth API routed by ALPN to the Auth Service as a
//! proxy running apart from it does, the peering server on its own port), plus a loopback-only
//! control port for the harness: `count` answers how many agents are registered, and
//! `dial <host-id>` dials that agent through the proxy's
//! [`TunnelDialer`](svc_net::tunnel::TunnelDialer) — through a peer proxy when the agent holds
//! no tunnel here — the same call the proxy's SSH, app and database handlers make.
//!
//! Every simulated agent joins with its own `node` token through its proxy's web port with the
//! real join client ([`join_via`], fresh keys, the CA pin checked), then runs a real
//! [`TunnelAgent`] — the same code the `svc` agent runs: it asks the proxy's `/webapi/ping`
//! where to dial, speaks SSH inside TLS (ALPN `svc-reversetunnel`) on the web port,
//! authenticates with the host certificate the Auth Service issued, sends tunnel heartbeats,
//! honours the discovery channel (with proxy peering, the proxies chosen for it) and reconnects
//! with the reference backoff and jitter. And, unless turned off, it keeps its Auth API link
//! through the proxy (ALPN `svc-auth@<cluster>`, spliced to the Auth Service) and heartbeats
//! the inventory every [`HEARTBEAT_INTERVAL`], as the agent's heartbeat task does: the
//! [`FailoverClient`] it uses, connected with the reconnect backoff, reset after a transport
//! failure so that the next heartbeat connects again. (The agent's schedule exports and updater
//! report, which ride on the same link, are left out: without an updater they send nothing.)
//! Join tokens are single-use: one per agent. Thousands of agents share one process and one
//! tokio runtime.

use std::{
    io::{BufRead, BufReader as StdBufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use rustls::pki_types::CertificateDer;
use svc_core::{
    Addr, Secret,
    auth::{HEARTBEAT_INTERVAL, Heartbeat, ServedKind, ServedResource},
    config::ListenerMode,
    identity::{IdentityKind, SystemRole},
};
use svc_net::{
    auth::{AuthClient, ClientIdentity, FailoverClient, JoinParams, join_via},
    dial::ProxyDialer,
    io::BoxIo,
    proxy::{ProxyBuilder, ProxySettings},
    route::alpn,
    tls::{ServerIdentity, TlsSource},
    tunnel::{
        AgentConfig, Backoff, DialRequest, DiscoveredProxy, Discovery, Peer, PeerDialer, PeerIdentity,
        RunningAgent, TunnelAgent, TunnelServer, TunnelServerConfig, TunnelStrategy, dial_service_fn,
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

/// Joins in flight at once by default (each is a TLS handshake through the proxy and a
/// signing and a store write at the Auth Service). The Auth Service counts a join in flight
/// against its source address until it ends (`auth_service.authentication.max_source_attempts`,
/// default 20), and through a proxy every agent's source is the proxy's address: more than 20 at
/// once through one proxy are refused.
pub const JOIN_CONCURRENCY: usize = 16;

/// The loopback addresses every proxy certificate names (agents dial them).
fn loopback_names() -> Vec<String> {
    (1..=LOOPBACKS).map(|i| format!("127.0.0.{i}")).collect()
}

/// The Auth Service configuration the harness runs: the Auth Service only, on a loopback port
/// chosen by the system, its embedded store in `data_dir`, warnings and worse logged.
pub fn auth_config_yaml(data_dir: &Path) -> String {
    format!(
        "version: v1\nsvc:\n  nodename: scale-auth\n  data_dir: {}\n  log:\n    severity: warn\n\
         auth_service:\n  enabled: true\n  listen_addr: 127.0.0.1:0\n  cluster_name: {CLUSTER}\n\
         proxy_service:\n  enabled: false\nssh_service:\n  enabled: false\n",
        data_dir.display()
    )
}

/// Where to join and whom to trust: what a proxy process and `agent_sim` need (no secret).
#[derive(Debug, Clone)]
pub struct JoinInfo {
    /// The Auth Service's API address (proxies join there directly).
    pub auth_addr: String,
    /// The host CA pin (`sha256:…`) joins check the Auth Service against.
    pub ca_pin: String,
}

impl JoinInfo {
    /// Writes `dir/cluster` (`<auth-addr> <ca-pin>`), for the proxy processes.
    pub fn store(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join("cluster");
        std::fs::write(&path, format!("{} {}\n", self.auth_addr, self.ca_pin))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Reads what [`JoinInfo::store`] wrote.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("cluster");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let (auth_addr, ca_pin) = text
            .trim()
            .split_once(' ')
            .with_context(|| format!("{}: expected `<auth-addr> <ca-pin>`", path.display()))?;
        Ok(Self {
            auth_addr: auth_addr.to_owned(),
            ca_pin: ca_pin.to_owned(),
        })
    }
}

/// The cluster as the harness holds it: where to join, and the admin identity the Auth Service
/// wrote (it mints join tokens; the harness holds no CA key).
pub struct Cluster {
    /// Where to join and whom to trust.
    pub join: JoinInfo,
    admin: ClientIdentity,
}

impl Cluster {
    /// The cluster whose Auth Service issued `admin` (its address and host CA pin come from it).
    pub fn from_admin(admin: ClientIdentity) -> anyhow::Result<Self> {
        let host = admin
            .trusted_cas()?
            .into_iter()
            .find(|ca| ca.kind() == IdentityKind::Host)
            .context("the admin identity trusts no host CA")?;
        Ok(Self {
            join: JoinInfo {
                auth_addr: admin.auth_addr.clone(),
                ca_pin: host.ca_pin()?,
            },
            admin,
        })
    }

    /// An Auth API client with the admin identity.
    pub async fn admin_client(&self) -> anyhow::Result<AuthClient> {
        AuthClient::connect_with(&self.admin).await.with_context(|| {
            format!(
                "connecting to the Auth Service at {} as admin",
                self.join.auth_addr
            )
        })
    }

    /// `n` single-use join tokens for `role`, minted over a few admin connections at once.
    pub async fn tokens(&self, role: &str, n: usize) -> anyhow::Result<Vec<Secret>> {
        const WORKERS: usize = 8;
        let per = n.div_ceil(WORKERS).max(1);
        let mut workers = tokio::task::JoinSet::new();
        let mut left = n;
        while left > 0 {
            let count = per.min(left);
            left -= count;
            let mut client = self.admin_client().await?;
            let role = role.to_owned();
            workers.spawn(async move {
                let mut out = Vec::with_capacity(count);
                for _ in 0..count {
                    let (token, _) = client
                        .create_token(std::slice::from_ref(&role), None)
                        .await
                        .with_context(|| format!("minting a {role} token"))?;
                    out.push(token);
                }
                anyhow::Ok(out)
            });
        }
        let mut all = Vec::with_capacity(n);
        while let Some(r) = workers.join_next().await {
            all.extend(r??);
        }
        Ok(all)
    }

    /// Mints a `proxy` token allowed the loopback certificate names and writes it to
    /// `dir/proxy-<index>/token` (owner-only), for proxy process `index` to join with.
    pub async fn write_proxy_token(&self, dir: &Path, index: usize) -> anyhow::Result<()> {
        let pdir = dir.join(format!("proxy-{index}"));
        std::fs::create_dir_all(&pdir)?;
        let (token, _) = self
            .admin_client()
            .await?
            .create_token_with_names(&["proxy".into()], None, &loopback_names())
            .await
            .context("minting a proxy token")?;
        write_private(&pdir.join("token"), token.expose().as_bytes())
    }
}

/// Writes `bytes` to `path`, readable by the owner only.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// The Auth Service process: `svc start` with [`auth_config_yaml`] (log: `dir/auth.log`).
pub struct AuthProcess {
    child: Child,
    /// Its log file.
    pub log: PathBuf,
}

impl AuthProcess {
    /// The `svc` binary: `$SVC_BIN`, else `svc` next to this executable (`cargo build --release
    /// -p svc-bins --bin svc` puts it there).
    pub fn svc_binary() -> anyhow::Result<PathBuf> {
        if let Some(p) = std::env::var_os("SVC_BIN") {
            let p = PathBuf::from(p);
            anyhow::ensure!(p.is_file(), "SVC_BIN={} is not a file", p.display());
            return Ok(p);
        }
        let exe = std::env::current_exe()?;
        let sibling = exe.with_file_name("svc");
        anyhow::ensure!(
            sibling.is_file(),
            "no svc binary at {}: build it first (cargo build --release -p svc-bins --bin svc) or set SVC_BIN",
            sibling.display()
        );
        Ok(sibling)
    }

    /// Starts `svc` as the cluster's Auth Service with its data in `dir/auth`, and waits (at
    /// most a minute) until its admin identity is written and its API answers.
    pub async fn start(svc: &Path, dir: &Path) -> anyhow::Result<(Self, Cluster)> {
        let data = dir.join("auth");
        std::fs::create_dir_all(&data)?;
        let config = dir.join("auth.yaml");
        std::fs::write(&config, auth_config_yaml(&data))?;
        let log = dir.join("auth.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(svc)
            .arg("start")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} start", svc.display()))?;
        let mut me = Self { child, log };
        let admin_path = svc_net::auth::node::admin_identity_path(&data);
        let started = tokio::time::Instant::now();
        let deadline = Duration::from_secs(60);
        loop {
            if let Some(status) = me.child.try_wait()? {
                anyhow::bail!(
                    "the Auth Service ({}) exited with {status}: {}",
                    svc.display(),
                    std::fs::read_to_string(&me.log).unwrap_or_default()
                );
            }
            if let Ok(admin) = ClientIdentity::load(&admin_path) {
                let cluster = Cluster::from_admin(admin)?;
                if let Ok(mut client) = cluster.admin_client().await
                    && client.status().await.is_ok()
                {
                    return Ok((me, cluster));
                }
            }
            anyhow::ensure!(
                started.elapsed() < deadline,
                "the Auth Service did not answer within {deadline:?} (log: {})",
                me.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for AuthProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

/// The proxy address agent number `i` is configured with: the web port on one of the
/// [`LOOPBACKS`] addresses.
pub fn agent_proxy_addr(i: usize, port: u16) -> Addr {
    let last = 1 + (i % usize::from(LOOPBACKS)) as u8;
    Addr::from(SocketAddr::from(([127, 0, 0, last], port)))
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Joins agent `name` through the proxy at `proxy` with `token` (role `node`, fresh keys, the
/// Auth Service checked against `ca_pin`). A transport failure is retried a few times with the
/// reconnect backoff; a refusal is final.
pub async fn join_agent(
    proxy: &Addr,
    ca_pin: &str,
    token: Secret,
    name: &str,
    dialer: &ProxyDialer,
) -> anyhow::Result<ClientIdentity> {
    let params = JoinParams {
        token,
        ca_pin: Some(ca_pin.to_owned()),
        trust_on_first_use: false,
        node_name: name.to_owned(),
        roles: vec![SystemRole::Node],
        additional_names: vec![],
    };
    let addr = proxy.to_string();
    let mut backoff = Backoff::default();
    let mut tries = 0;
    loop {
        match join_via(&addr, params.clone(), Some(dialer)).await {
            Ok(identity) => return Ok(identity),
            Err(e) if FailoverClient::is_transport_failure(&e) && tries < 5 => {
                tries += 1;
                tokio::time::sleep(backoff.next_delay(rand::random::<f64>())).await;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("agent {name} joining through {addr}")));
            }
        }
    }
}

/// An agent's Auth API link, as the harness sees it.
#[derive(Debug, Default)]
pub struct AuthLink {
    accepted: AtomicU64,
    failures: AtomicU64,
    last_ok_ms: AtomicU64,
}

impl AuthLink {
    /// Heartbeats accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connection attempts and heartbeats that failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// When the last heartbeat was accepted ([`now_ms`]; 0: never).
    pub fn last_ok_ms(&self) -> u64 {
        self.last_ok_ms.load(Ordering::Relaxed)
    }
}

/// The agent's inventory heartbeat: its node name and version, and the SSH Service it serves.
fn heartbeat_of(node_name: &str) -> Heartbeat {
    let mut node = ServedResource::new(ServedKind::Node, node_name);
    node.protocol = "ssh".into();
    Heartbeat {
        hostname: node_name.to_owned(),
        version: svc_core::version::current().to_string(),
        resources: vec![node],
        ..Heartbeat::default()
    }
}

/// The agent's heartbeat loop over its Auth API link (through the proxy it joined at): connect
/// with the reconnect backoff, heartbeat at once and then every [`HEARTBEAT_INTERVAL`]; after a
/// transport failure the link is reset and the next heartbeat connects again — as the agent's
/// heartbeat task does.
async fn run_auth_link(
    identity: ClientIdentity,
    node_name: String,
    dialer: ProxyDialer,
    state: Arc<AuthLink>,
) {
    let beat = heartbeat_of(&node_name);
    let link = FailoverClient::new(vec![identity.auth_addr.clone()], identity, Some(dialer));
    let mut backoff = Backoff::default();
    while link.client().await.is_err() {
        state.failures.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(backoff.next_delay(rand::random::<f64>())).await;
    }
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    loop {
        tick.tick().await;
        let sent = async { link.client().await?.heartbeat(&beat).await };
        match sent.await {
            Ok(()) => {
                state.accepted.fetch_add(1, Ordering::Relaxed);
                state.last_ok_ms.store(now_ms(), Ordering::Relaxed);
            }
            Err(e) => {
                state.failures.fetch_add(1, Ordering::Relaxed);
                if FailoverClient::is_transport_failure(&e) {
                    link.reset().await;
                }
            }
        }
    }
}

/// An agent that has joined: where it dials and the identity the Auth Service issued.
pub struct Joined {
    /// Its node name.
    pub name: String,
    /// The proxy address it is configured with (and joined through).
    pub proxy: Addr,
    /// Its identity (host ID, keys, certificates, the cluster's CAs).
    pub identity: ClientIdentity,
}

/// One running simulated agent.
pub struct SimAgent {
    /// Its host ID (`<uuid>.<cluster>`).
    pub host_id: String,
    /// Its reverse tunnel(s).
    pub tunnel: RunningAgent,
    /// Its Auth API link (`None`: turned off).
    pub link: Option<Arc<AuthLink>>,
    heartbeats: Option<tokio::task::JoinHandle<()>>,
}

/// Starts a joined agent: its tunnel agent (trusting `proxy_ca_pem` besides the cluster's host
/// CA for the proxy's web certificate, when given) and, when `auth_link`, its heartbeat loop.
pub fn spawn_agent(
    joined: Joined,
    dialer: &ProxyDialer,
    auth_link: bool,
    proxy_ca_pem: Option<&[u8]>,
) -> anyhow::Result<SimAgent> {
    let Joined {
        name,
        proxy,
        identity,
    } = joined;
    let config = AgentConfig::new(
        proxy,
        identity.name.clone(),
        identity.ssh_private_key()?,
        identity.ssh_certificate()?,
        Arc::new(identity.verifier()?),
        dialer.clone(),
    )
    .with_version("17.0.0".parse()?);
    let config = match proxy_ca_pem {
        Some(pem) => config.with_proxy_ca_pem(pem.to_vec()),
        None => config,
    };
    let tunnel = TunnelAgent::new(config, answer_service())?.spawn();
    let host_id = identity.name.clone();
    let (link, heartbeats) = if auth_link {
        let state = Arc::new(AuthLink::default());
        let task = tokio::spawn(run_auth_link(identity, name, dialer.clone(), state.clone()));
        (Some(state), Some(task))
    } else {
        (None, None)
    };
    Ok(SimAgent {
        host_id,
        tunnel,
        link,
        heartbeats,
    })
}

/// What a join phase took.
#[derive(Debug, Clone, Copy)]
pub struct JoinReport {
    /// Agents joined.
    pub joined: usize,
    /// Wall time of the phase.
    pub took: Duration,
}

/// A running simulator: its agents.
pub struct Simulator {
    /// Every agent started.
    pub agents: Vec<SimAgent>,
    /// Whether agents keep an Auth API link and heartbeat the inventory.
    pub auth_link: bool,
    /// Joins in flight at once.
    pub join_concurrency: usize,
    /// The CA (PEM) of the proxy's web certificate when the cluster's host CA did not sign it
    /// (a proxy with its own or a generated certificate).
    pub proxy_ca_pem: Option<Vec<u8>>,
    /// Distinguishes this fleet's node names (`sim-<fleet>-<i>`) from an earlier fleet's, whose
    /// names stay held until their heartbeats expire.
    fleet: String,
    dialer: ProxyDialer,
}

impl Simulator {
    /// An empty simulator.
    pub fn new(auth_link: bool) -> anyhow::Result<Self> {
        Ok(Self {
            agents: Vec::new(),
            auth_link,
            join_concurrency: JOIN_CONCURRENCY,
            proxy_ca_pem: None,
            fleet: format!("{:04x}", rand::random::<u16>()),
            dialer: ProxyDialer::builder(svc_core::proxy_env::ProxyEnv::default()).build()?,
        })
    }

    /// Joins one agent per token (agents `first`, `first + 1`, …, agent `i` through
    /// `addr_of(i)`), [`join_concurrency`](Self::join_concurrency) at a time.
    pub async fn join(
        &self,
        ca_pin: &str,
        tokens: Vec<Secret>,
        first: usize,
        addr_of: &(dyn Fn(usize) -> Addr + Sync),
    ) -> anyhow::Result<(Vec<Joined>, JoinReport)> {
        let started = tokio::time::Instant::now();
        let sem = Arc::new(tokio::sync::Semaphore::new(self.join_concurrency.max(1)));
        let mut set = tokio::task::JoinSet::new();
        for (k, token) in tokens.into_iter().enumerate() {
            let i = first + k;
            let proxy = addr_of(i);
            let name = format!("sim-{}-{i}", self.fleet);
            let ca_pin = ca_pin.to_owned();
            let dialer = self.dialer.clone();
            let sem = sem.clone();
            set.spawn(async move {
                let _place = sem.acquire_owned().await?;
                let identity = join_agent(&proxy, &ca_pin, token, &name, &dialer).await?;
                anyhow::Ok((
                    k,
                    Joined {
                        name,
                        proxy,
                        identity,
                    },
                ))
            });
        }
        let mut joined = Vec::new();
        while let Some(r) = set.join_next().await {
            joined.push(r??);
        }
        joined.sort_by_key(|(k, _)| *k);
        let joined: Vec<Joined> = joined.into_iter().map(|(_, j)| j).collect();
        let report = JoinReport {
            joined: joined.len(),
            took: started.elapsed(),
        };
        Ok((joined, report))
    }

    /// Starts joined agents, `per_second` at most (a fleet coming up).
    pub async fn start(&mut self, joined: Vec<Joined>, per_second: u32) -> anyhow::Result<()> {
        let pause = Duration::from_secs(1) / per_second.max(1);
        let mut tick = tokio::time::interval(pause);
        for j in joined {
            tick.tick().await;
            let agent = spawn_agent(j, &self.dialer, self.auth_link, self.proxy_ca_pem.as_deref())?;
            self.agents.push(agent);
        }
        Ok(())
    }

    /// Grows the fleet to `total` agents: mints their tokens, joins them (agent `i` through
    /// `ports[i % len]` on [`agent_proxy_addr`]), starts them `per_second` at most. Returns the
    /// join phase's report.
    pub async fn grow_to(
        &mut self,
        cluster: &Cluster,
        ports: &[u16],
        total: usize,
        per_second: u32,
    ) -> anyhow::Result<JoinReport> {
        anyhow::ensure!(!ports.is_empty(), "no proxy port to configure agents with");
        let first = self.agents.len();
        let tokens = cluster.tokens("node", total.saturating_sub(first)).await?;
        let ports = ports.to_vec();
        let addr_of = move |i: usize| agent_proxy_addr(i, ports[i % ports.len()]);
        let (joined, report) = self.join(&cluster.join.ca_pin, tokens, first, &addr_of).await?;
        self.start(joined, per_second).await?;
        Ok(report)
    }

    /// How many agents hold at least one tunnel, and how many tunnels in all.
    pub fn connected(&self) -> (usize, usize) {
        self.agents.iter().fold((0, 0), |(a, t), s| {
            let n = s.tunnel.status().connected.len();
            (a + usize::from(n > 0), t + n)
        })
    }

    /// How many agents had a heartbeat accepted at or after `since_ms` ([`now_ms`]).
    pub fn links_since(&self, since_ms: u64) -> usize {
        self.agents
            .iter()
            .filter(|a| a.link.as_ref().is_some_and(|l| l.last_ok_ms() >= since_ms))
            .count()
    }

    /// Heartbeats accepted and link failures, summed over the agents.
    pub fn link_totals(&self) -> (u64, u64) {
        self.agents
            .iter()
            .filter_map(|a| a.link.as_ref())
            .fold((0, 0), |(ok, failed), l| {
                (ok + l.accepted(), failed + l.failures())
            })
    }

    /// Stops every agent.
    pub async fn shutdown(self) {
        for a in self.agents {
            if let Some(task) = a.heartbeats {
                task.abort();
            }
            a.tunnel.shutdown().await;
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

/// Proxy `index`'s identity: the one saved in `pdir/identity.json` (a restart), else a join
/// with the `proxy` token in `pdir/token` at the Auth Service (saved for the next start).
async fn proxy_identity(info: &JoinInfo, pdir: &Path, index: usize) -> anyhow::Result<ClientIdentity> {
    let saved = pdir.join("identity.json");
    if saved.exists() {
        return Ok(ClientIdentity::load(&saved)?);
    }
    let token_path = pdir.join("token");
    let token = std::fs::read_to_string(&token_path)
        .with_context(|| format!("reading the proxy's join token {}", token_path.display()))?;
    let params = JoinParams {
        token: Secret::new(token.trim().to_owned()),
        ca_pin: Some(info.ca_pin.clone()),
        trust_on_first_use: false,
        node_name: format!("proxy-{index}"),
        roles: vec![SystemRole::Proxy],
        additional_names: loopback_names(),
    };
    let identity = join_via(&info.auth_addr, params, None)
        .await
        .with_context(|| format!("proxy {index} joining at {}", info.auth_addr))?;
    identity.save(&saved)?;
    Ok(identity)
}

impl SimProxy {
    /// Starts proxy `index` of the cluster described in `dir` ([`JoinInfo::store`]; its join
    /// token written by [`Cluster::write_proxy_token`], or its identity saved by an earlier
    /// start) on `port` (0: any) of every address.
    pub async fn start(dir: &Path, index: usize, port: u16, mode: Mode) -> anyhow::Result<Self> {
        let info = JoinInfo::load(dir)?;
        let pdir = dir.join(format!("proxy-{index}"));
        std::fs::create_dir_all(&pdir)?;
        let identity = proxy_identity(&info, &pdir, index).await?;
        let host_id = identity.name.clone();
        let verifier = Arc::new(identity.verifier()?);
        // The web port's TLS: the host certificate the Auth Service issued (it names the
        // loopback addresses agents dial).
        let (cert, key) = (pdir.join("cert.pem"), pdir.join("key.pem"));
        std::fs::write(&cert, &identity.tls_cert_pem)?;
        write_private(&key, identity.tls_key_pem.expose().as_bytes())?;
        let tls = TlsSource::Files { cert, key };
        let server_identity = ServerIdentity::load(&tls, &[])?;
        let version: svc_core::Version = "17.0.0".parse()?;
        let tunnel = TunnelServer::new(
            TunnelServerConfig::new(
                version.clone(),
                identity.ssh_private_key()?,
                identity.ssh_certificate()?,
                verifier.clone(),
            )
            .with_tls(server_identity.server_config(&[alpn::REVERSE_TUNNEL])?),
        );
        tunnel.set_strategy(mode.strategy());
        // The peering identity: the same X.509 host certificate (role proxy).
        let (chain, key): (Vec<CertificateDer<'static>>, _) = identity.tls_parts()?;
        let peer_identity = PeerIdentity {
            host_id: host_id.clone(),
            verifier,
            chain,
            key,
        };
        let peers = PeerDialer::new(&peer_identity)?;
        tunnel.set_peer_dialer(peers.clone());

        let mut s = ProxySettings::default();
        s.ping.cluster_name = identity.cluster.clone();
        s.ping.listener_mode = ListenerMode::Multiplex;
        s.ping.web_listen_addr = Addr::parse(&format!("0.0.0.0:{port}"))?;
        s.ping.tunnel_listen_addr = Addr::parse("127.0.0.1:0")?;
        s.ping.ssh_listen_addr = Addr::parse("127.0.0.1:0")?;
        s.tls = tls;
        // `SCALE_PROXY_MAX_CONNECTIONS` raises the web port's connection cap (default
        // 16,384): with its Auth API link every agent holds two connections there.
        if let Some(max) = std::env::var_os("SCALE_PROXY_MAX_CONNECTIONS") {
            let max: usize = max
                .to_str()
                .and_then(|v| v.parse().ok())
                .context("SCALE_PROXY_MAX_CONNECTIONS: a number of connections")?;
            s.listen = s.listen.with_max_connections(max);
        }
        let running = ProxyBuilder::new(s)
            .with_version(version)
            .route(alpn::REVERSE_TUNNEL, tunnel.tls_service())
            // The Auth API (agents' joins and heartbeats) to the Auth Service, as a proxy
            // running apart from it routes it.
            .route_prefix(
                alpn::AUTH_PREFIX,
                svc_net::auth::auth_route_any(vec![info.auth_addr.clone()]),
            )
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

    /// The Auth Service of [`auth_config_yaml`] in this process (the same code `svc start`
    /// runs), and the cluster as the harness holds it.
    async fn auth_in_process(dir: &Path) -> (svc_net::cluster::RunningCluster, Cluster) {
        let yaml = auth_config_yaml(&dir.join("auth"));
        let config = svc_core::config::Config::from_yaml_str_with_hostname(&yaml, "scale-auth")
            .expect("the Auth config");
        let running = svc_net::Cluster::from_config(&config)
            .start()
            .await
            .expect("the Auth Service starts");
        let auth = running.auth.as_ref().expect("the Auth Service runs");
        let admin = ClientIdentity::load(&auth.admin_identity).expect("the admin identity");
        let cluster = Cluster::from_admin(admin).expect("the cluster from the admin identity");
        (running, cluster)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_simulated_agents_join_register_heartbeat_and_answer_a_dial_through_the_proxy() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (auth, cluster) = auth_in_process(dir.path()).await;
        cluster.join.store(dir.path()).expect("the join information");
        cluster
            .write_proxy_token(dir.path(), 0)
            .await
            .expect("the proxy's token");
        let proxy = SimProxy::start(dir.path(), 0, 0, Mode::Mesh)
            .await
            .expect("the proxy joins and starts");
        let mut fleet = Simulator::new(true).expect("a simulator");
        let report = fleet
            .grow_to(&cluster, &[proxy.web_port], 50, 1000)
            .await
            .expect("50 agents join and start");
        assert_eq!(report.joined, 50, "every agent joined with its own token");
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
        // Host IDs come from the Auth Service's joins, in this cluster.
        for a in &fleet.agents {
            assert!(ids.contains(&a.host_id), "{} is registered", a.host_id);
            assert!(
                a.host_id.ends_with(&format!(".{CLUSTER}")),
                "{} is of {CLUSTER}",
                a.host_id
            );
        }
        // Every agent's Auth API link (through the proxy's web port) had a heartbeat accepted.
        let linked = async {
            while fleet.links_since(1) < 50 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), linked)
            .await
            .expect("every agent's first heartbeat accepted through the proxy within 60 s");
        for a in &fleet.agents {
            let answer = tokio::time::timeout(
                Duration::from_secs(30),
                control(proxy.control, &format!("dial {}", a.host_id)),
            )
            .await
            .expect("the dial answers within 30 s")
            .expect("the control port answers");
            assert_eq!(answer, "ok!", "dialing {} through the proxy", a.host_id);
        }
        assert_eq!(control(proxy.control, "count").await.expect("count"), "50");
        // A token is spent by its join: joining again with one is refused.
        let token = cluster.tokens("node", 1).await.expect("a token").remove(0);
        let addr = agent_proxy_addr(0, proxy.web_port);
        let dialer = ProxyDialer::builder(svc_core::proxy_env::ProxyEnv::default())
            .build()
            .expect("a dialer");
        join_agent(&addr, &cluster.join.ca_pin, token.clone(), "once-a", &dialer)
            .await
            .expect("the first join with a token");
        let again = join_agent(&addr, &cluster.join.ca_pin, token, "once-b", &dialer).await;
        assert!(again.is_err(), "a second join with the same token is refused");
        fleet.shutdown().await;
        proxy.running.shutdown().await;
        auth.shutdown().await;
    }
}

//! Scale harness: idle tunnels, a reconnect storm, proxy peering, mesh against peering, channel
//! churn.
//!
//! ```text
//! cargo build --release -p svc-bins --bin svc
//! cargo run --release -p svc-benches --bin scale_bench -- idle    [--agents 10000] [--rate 250]
//!     [--join-concurrency 32] [--no-auth-link]
//! cargo run --release -p svc-benches --bin scale_bench -- peering [--agents 2000] [--dials 400]
//! cargo run --release -p svc-benches --bin scale_bench -- churn   [--agents 10] [--dials 50000]
//! ```
//!
//! Both start the cluster's Auth Service as its own process (`svc start` with an Auth-only
//! configuration and the embedded store: `$SVC_BIN`, else `svc` next to this binary), and
//! proxies and agents that join it with tokens (see `svc_benches::sim`).
//!
//! `idle` starts one proxy process, grows the simulated fleet to 1,000, 5,000 and `--agents`
//! agents — at each step the new agents join through the proxy (`--join-concurrency` at a time:
//! joins per second, the Auth Service's CPU per join and its RSS), then start at `--rate` —
//! and samples the proxy's resident memory (`/proc/<pid>/status`, `VmRSS`) at each step (and
//! with no agent), then the CPU time of the proxy, the Auth Service and the simulator over
//! `--idle-secs` with every agent idle (tunnel heartbeats, and the Auth API heartbeats every
//! 30 s unless `--no-auth-link`), and the proxy's memory again at the end of that period (past
//! the proxy's 30 s SSH keepalive); then the reconnect storm: the proxy is killed (SIGKILL) and
//! started again on the same port under the same host ID, and the harness measures the time
//! until every agent is registered again, until every agent's Auth API link has a heartbeat
//! accepted again, the Auth Service's CPU and peak RSS meanwhile, and whether a sample of
//! `--sample` agents answers a dial through the proxy (0 stranded is the goal).
//!
//! `churn` starts one proxy and `--agents` agents and makes `--dials` short connections through
//! their tunnels (`--concurrency` at a time): the proxy's and the simulator's resident memory
//! after a tenth, half and all of them, per connection — what a closed channel leaves behind.
//!
//! `peering` starts three proxy processes in `agent_mesh` mode, `--agents` agents (their
//! configured addresses spread over the three), counts the tunnels and the proxies' memory;
//! then the same with `proxy_peering` and `agent_connection_count: 1`; then, in that cluster,
//! new connections per second and their p50/p99 from a client on proxy A to agents held by
//! proxy B (through the peering port) against the same client on B, alternating in rounds.
//!
//! The proxies are separate processes (`scale_bench proxy …`, see `svc_benches::sim`), so that
//! their memory and CPU are theirs alone; the simulator runs in this process.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use svc_benches::sim::{self, AuthProcess, Cluster, Mode, ProxyProcess, Simulator};
use tokio::time::Instant;

fn arg(name: &str, default: u64) -> anyhow::Result<u64> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args.get(i + 1).context("missing value")?.parse()?),
        None => Ok(default),
    }
}

fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// A simulator configured from the command line (`--no-auth-link`, `--join-concurrency`).
fn simulator() -> anyhow::Result<Simulator> {
    let mut fleet = Simulator::new(!flag("--no-auth-link"))?;
    fleet.join_concurrency = arg("--join-concurrency", sim::JOIN_CONCURRENCY as u64)? as usize;
    Ok(fleet)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1024.0 / 1024.0
}

/// Waits until `check` is true, polling every 250 ms; the time it took, or an error naming
/// `what` after `deadline`.
async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut check: F) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let started = Instant::now();
    loop {
        if check().await.unwrap_or(false) {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < deadline, "{what}: not within {deadline:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn settle_rss(pid: u32) -> anyhow::Result<u64> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    sim::rss_bytes(pid)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

async fn idle_and_storm(
    exe: &std::path::Path,
    dir: &std::path::Path,
    cluster: &Cluster,
    auth: &AuthProcess,
) -> anyhow::Result<()> {
    let total = arg("--agents", 10_000)? as usize;
    let rate = arg("--rate", 250)? as u32;
    let idle_secs = arg("--idle-secs", 60)?;
    let sample = arg("--sample", 200)? as usize;
    let mut fleet = simulator()?;
    let linked = fleet.auth_link;
    // The proxy holds a socket per tunnel and, per Auth API link, one towards the agent and one
    // towards the Auth Service; it inherits this process's limit.
    let nofile = sim::raise_nofile(200_000)?;
    let need = total as u64 * if linked { 3 } else { 1 } + 1_000;
    anyhow::ensure!(
        nofile >= need,
        "{total} agents{} need about {need} open files in the proxy process; the limit here is {nofile} (raise the hard limit, or run fewer agents{})",
        if linked { " with their Auth API links" } else { "" },
        if linked { " or --no-auth-link" } else { "" }
    );
    cluster.write_proxy_token(dir, 0).await?;
    let proxy = ProxyProcess::start(exe, dir, 0, 0, Mode::Mesh)?;
    let me = std::process::id();
    let base = settle_rss(proxy.pid()).await?;
    println!(
        "idle tunnels, one proxy (TLS routing: SSH inside TLS on the web port), {total} agents at {rate}/s, Auth API link {}",
        if linked {
            "on (a heartbeat every 30 s through the proxy)"
        } else {
            "off (--no-auth-link)"
        }
    );
    println!(
        "  {:>6} agents: proxy RSS {:8.1} MiB; Auth Service RSS {:7.1} MiB                (load {})",
        0,
        mib(base),
        mib(sim::rss_bytes(auth.pid())?),
        sim::load()
    );
    let mut steps: Vec<usize> = [1_000, 5_000, total]
        .into_iter()
        .filter(|&n| n <= total)
        .collect();
    steps.dedup();
    for step in steps {
        let first = fleet.agents.len();
        let minted = Instant::now();
        let tokens = cluster.tokens("node", step - first).await?;
        let minted = minted.elapsed();
        let port = proxy.web_port;
        let addr_of = move |i: usize| sim::agent_proxy_addr(i, port);
        let auth_cpu0 = sim::cpu_time(auth.pid())?;
        let (joined, report) = fleet.join(&cluster.join.ca_pin, tokens, first, &addr_of).await?;
        let join_cpu = sim::cpu_time(auth.pid())? - auth_cpu0;
        println!(
            "  joins {first}..{step}: {} joined through the proxy in {:.1} s, {:.0} joins/s ({} at a time); Auth Service CPU {:.2} ms per join, RSS {:.1} MiB; {} tokens minted first in {:.1} s (load {})",
            report.joined,
            report.took.as_secs_f64(),
            report.joined as f64 / report.took.as_secs_f64(),
            fleet.join_concurrency,
            join_cpu.as_secs_f64() * 1e3 / report.joined.max(1) as f64,
            mib(sim::rss_bytes(auth.pid())?),
            step - first,
            minted.as_secs_f64(),
            sim::load()
        );
        let started = Instant::now();
        fleet.start(joined, rate).await?;
        wait_until(
            &format!("{step} agents registered on the proxy"),
            Duration::from_secs(600),
            || async { Ok(proxy.count().await? >= step) },
        )
        .await?;
        let up = started.elapsed();
        let since = 1;
        if linked {
            wait_until(
                &format!("{step} agents' first heartbeat accepted through the proxy"),
                Duration::from_secs(600),
                || async { Ok(fleet.links_since(since) >= step) },
            )
            .await?;
        }
        let rss = settle_rss(proxy.pid()).await?;
        println!(
            "  {step:>6} agents: proxy RSS {:8.1} MiB, {:6.1} KiB per agent; Auth Service RSS {:7.1} MiB; simulator {:6.1} KiB per agent; step up in {:.1} s (load {})",
            mib(rss),
            (rss.saturating_sub(base)) as f64 / 1024.0 / step as f64,
            mib(sim::rss_bytes(auth.pid())?),
            sim::rss_bytes(me)? as f64 / 1024.0 / step as f64,
            up.as_secs_f64(),
            sim::load()
        );
    }
    let n = fleet.agents.len();
    let (p0, a0, s0) = (
        sim::cpu_time(proxy.pid())?,
        sim::cpu_time(auth.pid())?,
        sim::cpu_time(me)?,
    );
    let (beats0, _) = fleet.link_totals();
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let (p1, a1, s1) = (
        sim::cpu_time(proxy.pid())?,
        sim::cpu_time(auth.pid())?,
        sim::cpu_time(me)?,
    );
    let (beats1, link_failures) = fleet.link_totals();
    let per = |d: Duration| d.as_secs_f64() / idle_secs as f64 / n as f64 * 1e6;
    let share = |d: Duration| d.as_secs_f64() / idle_secs as f64 * 100.0;
    println!(
        "  idle CPU over {idle_secs} s with {n} agents: proxy {:.2} % of a core ({:.2} µs/s per agent), Auth Service {:.2} % ({:.2} µs/s per agent; {} heartbeats accepted meanwhile, {link_failures} link failures so far), simulator {:.2} % ({:.2} µs/s per agent) (load {})",
        share(p1 - p0),
        per(p1 - p0),
        share(a1 - a0),
        per(a1 - a0),
        beats1 - beats0,
        share(s1 - s0),
        per(s1 - s0),
        sim::load()
    );
    // Again after the idle period: every tunnel has been silent past the proxy's SSH keepalive
    // interval (30 s), and a keepalive and its answer have crossed it.
    let rss = settle_rss(proxy.pid()).await?;
    println!(
        "  {n:>6} agents after {idle_secs} s idle: proxy RSS {:8.1} MiB, {:6.1} KiB per agent; simulator {:6.1} KiB per agent (load {})",
        mib(rss),
        (rss.saturating_sub(base)) as f64 / 1024.0 / n as f64,
        sim::rss_bytes(me)? as f64 / 1024.0 / n as f64,
        sim::load()
    );

    if arg("--storm", 1)? == 0 {
        fleet.shutdown().await;
        return Ok(());
    }
    // The reconnect storm: kill the proxy, start it again on the same port and host ID.
    let port = proxy.web_port;
    println!("reconnect storm: the proxy is killed (SIGKILL) and restarted under {n} agents");
    let started = Instant::now();
    let killed_ms = sim::now_ms();
    let sim_cpu0 = sim::cpu_time(me)?;
    let auth_cpu0 = sim::cpu_time(auth.pid())?;
    let auth_rss0 = sim::rss_bytes(auth.pid())?;
    let mut auth_peak = auth_rss0;
    proxy.kill();
    let proxy = ProxyProcess::start(exe, dir, 0, port, Mode::Mesh)?;
    let listening = started.elapsed();
    // Both recoveries are watched in one loop (every 250 ms, the Auth Service's RSS sampled):
    // tunnels (every agent registered again) and Auth API links (every agent's heartbeat
    // accepted after the kill). Auth links come back at each agent's next heartbeat.
    let deadline = Duration::from_secs(120) + 3 * svc_core::auth::HEARTBEAT_INTERVAL;
    let (mut tunnels_back, mut links_back) = (None, if linked { None } else { Some(Duration::ZERO) });
    let mut tunnels_cpu = None;
    while (tunnels_back.is_none() || links_back.is_none()) && started.elapsed() < deadline {
        auth_peak = auth_peak.max(sim::rss_bytes(auth.pid()).unwrap_or(0));
        if tunnels_back.is_none() && proxy.count().await.unwrap_or(0) >= n {
            tunnels_back = Some(started.elapsed());
            tunnels_cpu = Some(sim::cpu_time(auth.pid())? - auth_cpu0);
        }
        if links_back.is_none() && fleet.links_since(killed_ms) >= n {
            links_back = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let watched = started.elapsed();
    let auth_cpu = sim::cpu_time(auth.pid())? - auth_cpu0;
    let count = proxy.count().await.unwrap_or(0);
    let relinked = fleet.links_since(killed_ms);
    let proxy_cpu = sim::cpu_time(proxy.pid())?;
    let sim_cpu = sim::cpu_time(me)? - sim_cpu0;
    // Routable: a sample of agents answers a dial through the proxy.
    let mut failed = 0;
    let step = (n / sample.max(1)).max(1);
    for a in fleet.agents.iter().step_by(step) {
        if let Err(e) = proxy.dial(&a.host_id).await {
            failed += 1;
            eprintln!("  {e:#}");
        }
    }
    let routable = started.elapsed();
    let secs = |d: Option<Duration>| match d {
        Some(d) => format!("{:.1} s", d.as_secs_f64()),
        None => format!("NOT within {:.0} s", watched.as_secs_f64()),
    };
    println!(
        "  listening again after {:.2} s; tunnels: {count}/{n} registered after {}; Auth API links: {} heartbeat accepted again after {}; {} sampled dials through the proxy, {failed} failed, done at {:.1} s",
        listening.as_secs_f64(),
        secs(tunnels_back),
        if linked {
            format!("{relinked}/{n}")
        } else {
            "off,".into()
        },
        secs(links_back),
        n.div_ceil(step),
        routable.as_secs_f64()
    );
    println!(
        "  stranded: {}; CPU meanwhile: new proxy {:.1} s, simulator {:.1} s, Auth Service {:.1} s until the tunnels were back and {:.1} s until the links were ({:.2} ms per agent); Auth Service RSS {:.1} MiB before, {:.1} MiB at most meanwhile (load {})",
        n.saturating_sub(count),
        proxy_cpu.as_secs_f64(),
        sim_cpu.as_secs_f64(),
        tunnels_cpu.unwrap_or(auth_cpu).as_secs_f64(),
        auth_cpu.as_secs_f64(),
        auth_cpu.as_secs_f64() * 1e3 / n.max(1) as f64,
        mib(auth_rss0),
        mib(auth_peak),
        sim::load()
    );
    fleet.shutdown().await;
    drop(proxy);
    Ok(())
}

/// Starts three proxies in `mode`, `n` agents; prints tunnels and memory; returns them.
async fn three_proxies(
    exe: &std::path::Path,
    dir: &std::path::Path,
    cluster: &Cluster,
    mode: Mode,
    n: usize,
    rate: u32,
) -> anyhow::Result<(Vec<ProxyProcess>, Simulator)> {
    let mut proxies = Vec::new();
    for i in 0..3 {
        if !dir.join(format!("proxy-{i}")).join("identity.json").exists() {
            cluster.write_proxy_token(dir, i).await?;
        }
        proxies.push(ProxyProcess::start(exe, dir, i, 0, mode)?);
    }
    sim::write_roster(dir, &proxies.iter().collect::<Vec<_>>())?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let base: u64 = proxies.iter().map(|p| sim::rss_bytes(p.pid()).unwrap_or(0)).sum();
    let ports: Vec<u16> = proxies.iter().map(|p| p.web_port).collect();
    let mut fleet = simulator()?;
    fleet.grow_to(cluster, &ports, n, rate).await?;
    let want = match mode {
        Mode::Mesh => 3 * n,
        Mode::Peering(k) => k * n,
    };
    let took = wait_until(
        &format!("{want} tunnels ({mode:?})"),
        Duration::from_secs(600),
        || async {
            let mut sum = 0;
            for p in &proxies {
                sum += p.count().await?;
            }
            Ok(sum == want && fleet.connected() == (n, want))
        },
    )
    .await;
    // Let drained tunnels (an agent's first proxy that is not its chosen one) close.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut tunnels = 0;
    let mut rss = 0;
    for p in &proxies {
        tunnels += p.count().await?;
        rss += sim::rss_bytes(p.pid())?;
    }
    println!(
        "  {mode:?}: {n} agents, {tunnels} tunnels on 3 proxies{}; proxies' RSS {:.1} MiB in all ({:.1} MiB over their idle {:.1} MiB) (load {})",
        if took.is_err() { " (NOT SETTLED)" } else { "" },
        mib(rss),
        mib(rss.saturating_sub(base)),
        mib(base),
        sim::load()
    );
    Ok((proxies, fleet))
}

async fn peering(exe: &std::path::Path, dir: &std::path::Path, cluster: &Cluster) -> anyhow::Result<()> {
    let n = arg("--agents", 2_000)? as usize;
    let rate = arg("--rate", 250)? as u32;
    let dials = arg("--dials", 400)? as usize;
    let conc = arg("--concurrency", 8)? as usize;
    println!("mesh against peering, 3 proxies");
    let (proxies, fleet) = three_proxies(exe, dir, cluster, Mode::Mesh, n, rate).await?;
    fleet.shutdown().await;
    drop(proxies);
    let (proxies, fleet) = three_proxies(exe, dir, cluster, Mode::Peering(1), n, rate).await?;
    // The peers' tables are refreshed every second from each proxy's registered agents.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (a, b) = (&proxies[0], &proxies[1]);
    let agents_b = std::fs::read_to_string(dir.join(format!("agents-{}", b.host_id)))?;
    let held: Vec<String> = agents_b.lines().map(str::to_owned).collect();
    anyhow::ensure!(!held.is_empty(), "proxy B holds no agent");
    println!(
        "peering: new connections from a client on proxy A to agents held by proxy B ({} of them) vs the same client on B; {dials} dials per path in 4 alternating rounds",
        held.len()
    );
    for conc in [1, conc] {
        let mut lat: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut secs = [0.0f64; 2];
        for round in 0..4 {
            for (k, via) in [a, b].into_iter().enumerate() {
                let share = dials / 4;
                let started = Instant::now();
                let mut workers = tokio::task::JoinSet::new();
                for w in 0..conc {
                    let ids: Vec<String> = (0..share / conc)
                        .map(|j| held[(round * share + w * 7919 + j) % held.len()].clone())
                        .collect();
                    let control = via.control;
                    workers.spawn(async move {
                        let mut out = Vec::new();
                        for id in ids {
                            let t = Instant::now();
                            let answer = svc_benches_control(control, &id).await?;
                            anyhow::ensure!(answer == "ok!", "dial {id}: {answer}");
                            out.push(t.elapsed().as_secs_f64() * 1e3);
                        }
                        anyhow::Ok(out)
                    });
                }
                while let Some(r) = workers.join_next().await {
                    lat[k].extend(r??);
                }
                secs[k] += started.elapsed().as_secs_f64();
            }
        }
        let rate_a = lat[0].len() as f64 / secs[0];
        let rate_b = lat[1].len() as f64 / secs[1];
        let (a50, a99) = (pct(&mut lat[0], 0.5), pct(&mut lat[0], 0.99));
        let (b50, b99) = (pct(&mut lat[1], 0.5), pct(&mut lat[1], 0.99));
        println!(
            "  {conc} at a time: via peer A {rate_a:7.0} conn/s p50 {a50:6.2} ms p99 {a99:6.2} ms | on holder B {rate_b:7.0} conn/s p50 {b50:6.2} ms p99 {b99:6.2} ms | A/B rate {:.2}, p99 {:.2} (load {})",
            rate_a / rate_b,
            a99 / b99,
            sim::load()
        );
    }
    fleet.shutdown().await;
    drop(proxies);
    Ok(())
}

/// Many short client connections through few long-lived tunnels: the proxy's and the agents'
/// memory before and after (what a channel leaves behind once it is closed).
async fn churn(exe: &std::path::Path, dir: &std::path::Path, cluster: &Cluster) -> anyhow::Result<()> {
    let n = arg("--agents", 10)? as usize;
    let dials = arg("--dials", 50_000)? as usize;
    let conc = arg("--concurrency", 4)? as usize;
    let mut fleet = simulator()?;
    cluster.write_proxy_token(dir, 0).await?;
    let proxy = ProxyProcess::start(exe, dir, 0, 0, Mode::Mesh)?;
    let tokens = cluster.tokens("node", n).await?;
    let port = proxy.web_port;
    let addr_of = move |i: usize| sim::agent_proxy_addr(i, port);
    let (joined, _) = fleet.join(&cluster.join.ca_pin, tokens, 0, &addr_of).await?;
    fleet.start(joined, 100).await?;
    wait_until(
        &format!("{n} agents registered on the proxy"),
        Duration::from_secs(120),
        || async { Ok(proxy.count().await? >= n) },
    )
    .await?;
    let ids: Vec<String> = fleet.agents.iter().map(|a| a.host_id.clone()).collect();
    let me = std::process::id();
    println!(
        "channel churn: {dials} new connections through {n} tunnels, {conc} at a time (connect, the agent's one byte, close)"
    );
    let mut done = 0;
    for step in [dials / 10, dials / 2, dials] {
        let (p0, s0) = (settle_rss(proxy.pid()).await?, sim::rss_bytes(me)?);
        let started = Instant::now();
        let count = step - done;
        let mut workers = tokio::task::JoinSet::new();
        for w in 0..conc {
            let ids = ids.clone();
            let control = proxy.control;
            let share = count / conc + usize::from(w < count % conc);
            workers.spawn(async move {
                for j in 0..share {
                    let id = &ids[(w + j * conc) % ids.len()];
                    let answer = svc_benches_control(control, id).await?;
                    anyhow::ensure!(answer == "ok!", "dial {id}: {answer}");
                }
                anyhow::Ok(())
            });
        }
        while let Some(r) = workers.join_next().await {
            r??;
        }
        let secs = started.elapsed().as_secs_f64();
        let (p1, s1) = (settle_rss(proxy.pid()).await?, sim::rss_bytes(me)?);
        done = step;
        println!(
            "  after {step:>7} connections: proxy RSS {:7.1} MiB ({:+.2} KiB per connection over the last {count}), simulator RSS {:7.1} MiB ({:+.2} KiB per connection); {:.0} conn/s (load {})",
            mib(p1),
            (p1 as f64 - p0 as f64) / 1024.0 / count as f64,
            mib(s1),
            (s1 as f64 - s0 as f64) / 1024.0 / count as f64,
            count as f64 / secs,
            sim::load()
        );
    }
    fleet.shutdown().await;
    drop(proxy);
    Ok(())
}

async fn svc_benches_control(control: std::net::SocketAddr, host_id: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(control).await?;
    s.set_nodelay(true)?;
    s.write_all(format!("dial {host_id}\n").as_bytes()).await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut out))
        .await
        .context("no answer within 30 s")??;
    Ok(out.trim_end().to_owned())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if args.get(1).map(String::as_str) == Some("proxy") {
        return rt.block_on(sim::proxy_main(&args[2..]));
    }
    let nofile = sim::raise_nofile(200_000)?;
    let exe = std::env::current_exe()?;
    let what = args.get(1).cloned().unwrap_or_else(|| "idle".into());
    let dir = tempfile::tempdir()?;
    let path: PathBuf = dir.path().to_owned();
    println!(
        "scale_bench {what}: open-file limit {nofile}; {} cores; load {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        sim::load()
    );
    let svc = AuthProcess::svc_binary()?;
    rt.block_on(async {
        let (auth, cluster) = AuthProcess::start(&svc, &path).await?;
        cluster.join.store(&path)?;
        println!(
            "Auth Service: {} start (pid {}, Auth only, embedded store) at {}",
            svc.display(),
            auth.pid(),
            cluster.join.auth_addr
        );
        match what.as_str() {
            "idle" => idle_and_storm(&exe, &path, &cluster, &auth).await,
            "peering" => peering(&exe, &path, &cluster).await,
            "churn" => churn(&exe, &path, &cluster).await,
            other => anyhow::bail!("unknown scenario {other:?}: idle, peering or churn"),
        }
    })
}

//! The agent simulator on its own: many agents with distinct host identities in one process,
//! each joining with its own token through a proxy and then a real reverse-tunnel agent (ping,
//! SSH inside TLS or on the tunnel port, heartbeats, discovery, reconnect backoff with jitter)
//! with its Auth API link through the proxy (inventory heartbeats every 30 s).
//!
//! ```text
//! agent_sim --proxy <host:port> --ca-pin <sha256:…> --tokens <file> [--agents N] [--rate 250]
//!           [--join-concurrency 16] [--proxy-ca <pem>] [--no-auth-link]
//! ```
//!
//! `--tokens` names a file with one `node` join token per line (tokens are single-use: one per
//! agent; `tctl tokens add --type=node` prints one, and the CA pin); `--agents` (default: one
//! per token) may not exceed the tokens. Every agent joins through the proxy's web port (TLS
//! routing carries the Auth API), checking the Auth Service against the pin. `--proxy-ca` names
//! the CA of the proxy's web certificate when the cluster's host CA did not sign it (`svc`'s
//! generated `proxy-ca.pem`, or the CA of `https_keypairs`). Every five
//! seconds the simulator prints how many agents hold a tunnel, how many tunnels they hold, and
//! how many had a heartbeat accepted in the last two heartbeat intervals.

use std::time::Duration;

use anyhow::Context;
use svc_benches::sim::{self, Simulator};
use svc_core::{Addr, Secret};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let get = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let proxy = Addr::parse(get("--proxy").context("--proxy <host:port> is required")?)?;
    let ca_pin = get("--ca-pin")
        .context("--ca-pin <sha256:…> is required (tctl status)")?
        .clone();
    let path = get("--tokens").context("--tokens <file> (one join token per line) is required")?;
    let tokens: Vec<Secret> = std::fs::read_to_string(path)
        .with_context(|| format!("reading the tokens in {path}"))?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| Secret::new(l.to_owned()))
        .collect();
    let agents: usize = get("--agents")
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(tokens.len());
    anyhow::ensure!(
        agents <= tokens.len(),
        "--agents {agents}: {path} holds {} tokens (one per agent)",
        tokens.len()
    );
    let rate: u32 = get("--rate").map(|v| v.parse()).transpose()?.unwrap_or(250);
    let concurrency: usize = get("--join-concurrency")
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(sim::JOIN_CONCURRENCY);
    let auth_link = !args.iter().any(|a| a == "--no-auth-link");
    let proxy_ca = get("--proxy-ca")
        .map(|f| std::fs::read(f).with_context(|| format!("reading --proxy-ca {f}")))
        .transpose()?;
    let nofile = sim::raise_nofile(200_000)?;
    eprintln!("open-file limit {nofile}");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let mut fleet = Simulator::new(auth_link)?;
        fleet.join_concurrency = concurrency;
        fleet.proxy_ca_pem = proxy_ca;
        let tokens: Vec<Secret> = tokens.into_iter().take(agents).collect();
        let (joined, report) = fleet.join(&ca_pin, tokens, 0, &|_| proxy.clone()).await?;
        println!(
            "{} agents joined through {proxy} in {:.1} s ({:.0} joins/s)",
            report.joined,
            report.took.as_secs_f64(),
            report.joined as f64 / report.took.as_secs_f64()
        );
        fleet.start(joined, rate).await?;
        let recent = 2 * svc_core::auth::HEARTBEAT_INTERVAL.as_millis() as u64;
        loop {
            let (up, tunnels) = fleet.connected();
            let linked = fleet.links_since(sim::now_ms().saturating_sub(recent));
            println!(
                "{up}/{agents} agents connected, {tunnels} tunnels, {linked} Auth API links with a recent heartbeat (load {})",
                sim::load()
            );
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        fleet.shutdown().await;
        anyhow::Ok(())
    })
}

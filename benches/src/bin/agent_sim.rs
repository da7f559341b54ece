//! The agent simulator on its own: many agents with distinct host identities in one process,
//! each a real reverse-tunnel agent (ping, SSH inside TLS or on the tunnel port, heartbeats,
//! discovery, reconnect backoff with jitter), against any proxy of a cluster whose host CA is
//! at hand.
//!
//! ```text
//! agent_sim --ca <host_ca.json> --proxy <host:port> [--agents 1000] [--rate 250]
//! ```
//!
//! `host_ca.json` is the stored host CA (`CertAuthority::to_stored`; `scale_bench` writes one
//! into its state directory): every agent's certificate is signed with it. Every five seconds
//! the simulator prints how many agents hold a tunnel, and how many tunnels they hold.

use std::time::Duration;

use anyhow::Context;
use svc_benches::sim::{self, Cluster, Simulator};
use svc_core::Addr;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let get = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let ca = get("--ca").context("--ca <host_ca.json> is required")?;
    let proxy = Addr::parse(get("--proxy").context("--proxy <host:port> is required")?)?;
    let agents: usize = get("--agents").map(|v| v.parse()).transpose()?.unwrap_or(1000);
    let rate: u32 = get("--rate").map(|v| v.parse()).transpose()?.unwrap_or(250);
    let dir = std::path::Path::new(ca)
        .parent()
        .context("--ca names a file")?
        .to_owned();
    anyhow::ensure!(
        std::path::Path::new(ca).file_name() == Some(std::ffi::OsStr::new("host_ca.json")),
        "--ca must name a file called host_ca.json"
    );
    let nofile = sim::raise_nofile(200_000)?;
    eprintln!("open-file limit {nofile}");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let cluster = Cluster::load(&dir)?;
        let mut fleet = Simulator::default();
        let grow = fleet.grow_with(&cluster, agents, rate, |_| proxy.clone());
        grow.await?;
        loop {
            let (up, tunnels) = fleet.connected();
            println!(
                "{up}/{agents} agents connected, {tunnels} tunnels (load {})",
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

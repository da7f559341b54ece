//! An svc agent embedded in another program: join the cluster, serve SSH behind a reverse
//! tunnel to the proxy, heartbeat, and stop cleanly on Ctrl-C or SIGTERM.
//!
//! ```text
//! cargo run -p svc-examples --example agent_node -- agent.yaml [--insecure]
//! ```
//!
//! `--insecure` accepts a proxy's self-signed TLS certificate, as `svc start --insecure` does
//! (the SSH inside the tunnel still checks the proxy's host certificate).
//!
//! `agent.yaml` is an ordinary `svc.yaml` for an agent: `auth_service` and `proxy_service`
//! disabled, `svc.proxy_server`, `svc.auth_token` and `svc.ca_pin` set (`tctl tokens add`
//! prints them).

use anyhow::Context;
use svc_core::config::Config;
use svc_net::AgentNode;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .context("usage: agent_node <agent.yaml> [--insecure]")?;
    let insecure = std::env::args().any(|a| a == "--insecure");
    let config = Config::load(std::path::Path::new(&path))?;
    let node = AgentNode::from_config(&config).insecure(insecure).start().await?;
    println!("serving as {} ({})", node.name, node.host_id);

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    node.shutdown().await;
    println!("stopped");
    Ok(())
}

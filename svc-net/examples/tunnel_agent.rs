//! A minimal agent: keeps a reverse tunnel to a proxy and serves the SSH Service behind it. No
//! listening port; outbound through `HTTPS_PROXY` when the environment says so.
//!
//! ```text
//! tunnel_agent --proxy <proxy web host:port> --dir <credentials dir> [--version <v>]
//! ```
//!
//! The credentials directory holds what the Auth Service's join would have produced:
//! `cluster` (the cluster name), `host_id`, `key` (OpenSSH private key), `key-cert.pub` (its
//! host certificate), and the CAs' public halves `host_ca.pem`, `host_ca.pub`, `user_ca.pem`,
//! `user_ca.pub`. The tunnel tests write such a directory and start this program inside a
//! network namespace whose only way out is an HTTP proxy.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use svc_core::{
    Addr,
    identity::{IdentityKind, TrustedCa, Verifier},
};
use svc_net::{
    dial::ProxyDialer,
    ssh::{SshServer, SshServerConfig},
    tunnel::{AgentConfig, TunnelAgent},
};

fn read(dir: &std::path::Path, name: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(dir.join(name)).with_context(|| format!("reading {}", dir.join(name).display()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let (mut proxy, mut dir, mut version) = (None, None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--proxy" => proxy = args.next(),
            "--dir" => dir = args.next().map(PathBuf::from),
            "--version" => version = args.next(),
            other => anyhow::bail!(
                "unknown argument {other:?}; usage: tunnel_agent --proxy HOST:PORT --dir DIR [--version V]"
            ),
        }
    }
    let proxy = Addr::parse(&proxy.context("--proxy is required")?)?;
    let dir = dir.context("--dir is required")?;
    let cluster = read(&dir, "cluster")?.trim().to_owned();
    let cas = [
        TrustedCa::from_pem(
            IdentityKind::Host,
            &cluster,
            &read(&dir, "host_ca.pem")?,
            read(&dir, "host_ca.pub")?.trim(),
        )?,
        TrustedCa::from_pem(
            IdentityKind::User,
            &cluster,
            &read(&dir, "user_ca.pem")?,
            read(&dir, "user_ca.pub")?.trim(),
        )?,
    ];
    let verifier = Arc::new(Verifier::new(&cluster, cas)?);
    let key = ssh_key::PrivateKey::from_openssh(read(&dir, "key")?)?;
    let cert = ssh_key::Certificate::from_openssh(read(&dir, "key-cert.pub")?.trim())?;
    let host_id = read(&dir, "host_id")?.trim().to_owned();

    let ssh = SshServer::new(SshServerConfig::new(key.clone(), cert.clone(), verifier.clone()));
    let mut config = AgentConfig::new(proxy, host_id, key, cert, verifier, ProxyDialer::from_env()?);
    if let Some(v) = version {
        config = config.with_version(v.parse()?);
    }
    let agent = TunnelAgent::new(config, ssh.dial_service())?.spawn();
    tokio::signal::ctrl_c().await?;
    agent.shutdown().await;
    Ok(())
}

//! OpenSSH `ProxyCommand` through the svc proxy: what `tsh proxy ssh` does. Connects to the
//! proxy with the user's certificate, asks for the node, and copies stdin/stdout to the stream.
//!
//! ```text
//! ssh -o ProxyCommand="proxy_command --proxy <addr> [--tls] --dir <dir> %h:%p" root@node-1
//! ```
//!
//! The directory holds `cluster`, `host_ca.pem`, `host_ca.pub` (to verify the proxy), `key`
//! and `key-cert.pub` (the user's key and certificate), and `login`.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use svc_core::{
    Addr,
    identity::{IdentityKind, TrustedCa, Verifier},
};
use svc_net::{
    client::{ProxyEndpoint, SshIdentity, connect_via_proxy},
    dial::ProxyDialer,
};

fn read(dir: &std::path::Path, name: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(dir.join(name)).with_context(|| format!("reading {}", dir.join(name).display()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let (mut proxy, mut dir, mut tls, mut target) = (None, None, false, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--proxy" => proxy = args.next(),
            "--dir" => dir = args.next().map(PathBuf::from),
            "--tls" => tls = true,
            other if !other.starts_with("--") => target = Some(other.to_owned()),
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let proxy = Addr::parse(&proxy.context("--proxy is required")?)?;
    let dir = dir.context("--dir is required")?;
    let target = target.context("the node (NODE or NODE:PORT) is required")?;
    let (node, port) = match target.rsplit_once(':') {
        Some((n, p)) if p.parse::<u16>().is_ok() => (n.to_owned(), p.parse()?),
        _ => (target.clone(), 0),
    };
    let cluster = read(&dir, "cluster")?.trim().to_owned();
    let host_ca = TrustedCa::from_pem(
        IdentityKind::Host,
        &cluster,
        &read(&dir, "host_ca.pem")?,
        read(&dir, "host_ca.pub")?.trim(),
    )?;
    let endpoint = ProxyEndpoint {
        addr: proxy,
        tls,
        verifier: Arc::new(Verifier::new(&cluster, [host_ca])?),
        extra_ca_pem: None,
        dialer: ProxyDialer::from_env()?,
        timeout: Duration::from_secs(30),
    };
    let identity = SshIdentity {
        key: Arc::new(ssh_key::PrivateKey::from_openssh(read(&dir, "key")?)?),
        cert: ssh_key::Certificate::from_openssh(read(&dir, "key-cert.pub")?.trim())?,
        login: read(&dir, "login")?.trim().to_owned(),
    };
    let stream = connect_via_proxy(&endpoint, &identity, &node, port).await?;
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (mut stdin, mut stdout) = (tokio::io::stdin(), tokio::io::stdout());
    tokio::select! {
        r = tokio::io::copy(&mut stdin, &mut wr) => { r?; }
        r = tokio::io::copy(&mut rd, &mut stdout) => { r?; }
    }
    Ok(())
}

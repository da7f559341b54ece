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
//!
//! Node RBAC: an agent of a cluster asks the Auth Service before every session
//! (`svc_net::ssh::AuthNodeAuthorizer`). This program has no Auth Service address, so it holds
//! a fixed policy instead ([`FixedPolicy`]): the `access` preset for the certificate's own
//! logins, i.e. any login the certificate grants and nothing else.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use svc_core::{
    Addr,
    identity::{IdentityKind, TrustedCa, Verifier},
};
use svc_net::{
    agent::ssh::{SshServer, SshServerConfig},
    dial::ProxyDialer,
    ssh::{NodeAuthorizer, NodeDecisionFuture},
    tunnel::{AgentConfig, TunnelAgent},
};

/// The node's policy when no Auth Service can be asked: the rule of
/// [`RoleSet::check_node`](svc_core::rbac::RoleSet::check_node) with the `access` preset for
/// the logins the (verified) user certificate grants.
struct FixedPolicy {
    verifier: Arc<Verifier>,
    host_id: String,
}

impl NodeAuthorizer for FixedPolicy {
    fn authorize(
        self: Arc<Self>,
        user_cert: ssh_key::Certificate,
        node: String,
        login: String,
    ) -> NodeDecisionFuture {
        Box::pin(async move {
            let user = self
                .verifier
                .verify_user_ssh(&user_cert, std::time::SystemTime::now())
                .map_err(|e| e.to_string())?;
            let roles = svc_core::rbac::RoleSet::new([svc_core::rbac::preset_access(user.logins.clone())]);
            let labels = Default::default();
            roles
                .check_node(&svc_core::rbac::NodeAccess {
                    user: &user.username,
                    granted_logins: &user.logins,
                    node: &node,
                    labels: &labels,
                    login: &login,
                })
                .map_err(|e| e.to_string())?;
            let resource =
                svc_core::auth::ServedResource::new(svc_core::auth::ServedKind::Node, node.clone());
            Ok(svc_core::auth::ResourceRoute {
                server_id: self.host_id.clone(),
                hostname: node,
                resource,
            })
        })
    }
}

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

    let policy = Arc::new(FixedPolicy {
        verifier: verifier.clone(),
        host_id: host_id.clone(),
    });
    let ssh = SshServer::new(SshServerConfig::new(
        key.clone(),
        cert.clone(),
        verifier.clone(),
        host_id.clone(),
        policy,
    ));
    let mut config = AgentConfig::new(proxy, host_id, key, cert, verifier, ProxyDialer::from_env()?);
    if let Some(v) = version {
        config = config.with_version(v.parse()?);
    }
    let agent = TunnelAgent::new(config, ssh.dial_service())?.spawn();
    tokio::signal::ctrl_c().await?;
    agent.shutdown().await;
    Ok(())
}

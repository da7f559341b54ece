//! `svc`: its command line ([`cli`]), the configuration it starts from, and the banner it
//! prints once the services run. The services are `svc_net::Cluster`'s.

pub mod cli;

use std::path::{Path, PathBuf};

use anyhow::Context;
use svc_core::Addr;
use svc_core::config::Config;
use svc_net::cluster::RunningCluster;

/// The configuration file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG: &str = "/etc/svc.yaml";

/// The configuration `svc start` runs: `file`, else [`DEFAULT_CONFIG`] when it exists, else the
/// all-in-one defaults; then the command line's overrides.
pub fn load_config(
    file: Option<&Path>,
    data_dir: Option<PathBuf>,
    web_listen_addr: Option<String>,
    public_addr: Option<String>,
) -> anyhow::Result<Config> {
    let default = Path::new(DEFAULT_CONFIG);
    let mut config = match file {
        Some(f) => Config::load(f)?,
        None if default.exists() => Config::load(default)?,
        None => Config::all_in_one_default(),
    };
    if let Some(dir) = data_dir {
        config.svc.data_dir = dir;
    }
    if let Some(a) = web_listen_addr {
        config.proxy.web_listen_addr =
            Addr::parse_with_default_port(&a, 3080).with_context(|| format!("--web-listen-addr {a}"))?;
    }
    if let Some(a) = public_addr {
        config.proxy.public_addr =
            // The same default port as proxy_service.public_addr in svc.yaml.
            Some(
                Addr::parse_with_default_port(&a, svc_core::config::ports::PROXY_WEB)
                    .with_context(|| format!("--public-addr {a}"))?,
            );
    }
    Ok(config)
}

/// Warns when a service's `connection_limits.max_connections` is above this process's limit of
/// open files: the connections between the two fail to be accepted ("too many open files")
/// instead of being closed by the cap, and every listener shares the one limit.
pub fn warn_about_open_file_limit(config: &Config) {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let Some(limit) = limit.and_then(|l| usize::try_from(l).ok()) else {
        return;
    };
    for (enabled, section, max) in [
        (
            config.auth.enabled,
            "auth_service",
            config.auth.connection_limits.max_connections,
        ),
        (
            config.proxy.enabled,
            "proxy_service",
            config.proxy.connection_limits.max_connections,
        ),
    ] {
        if enabled && max > limit {
            tracing::warn!(
                max_connections = max,
                open_file_limit = limit,
                "{section}.connection_limits.max_connections is above this process's limit of open files: connections beyond the limit are refused by the kernel before the cap applies (raise LimitNOFILE or ulimit -n)"
            );
        }
    }
}

/// Prints what runs and how to start using it.
pub fn banner(config: &Config, running: &RunningCluster) {
    let data_dir = config.svc.data_dir.display();
    match (&running.auth, &running.proxy) {
        (Some(_), _) => println!(
            "svc {}: cluster {:?} is running",
            svc_core::version::current(),
            running.cluster
        ),
        (None, Some(_)) => println!(
            "svc {}: proxy of cluster {:?} is running",
            svc_core::version::current(),
            running.cluster
        ),
        (None, None) => println!(
            "svc {}: agent of cluster {:?} is running",
            svc_core::version::current(),
            running.cluster
        ),
    }
    if let Some(auth) = &running.auth {
        println!("  auth: {}", auth.addr);
        println!("  CA pin: {}", auth.ca_pin());
        println!("  admin identity: {}", auth.admin_identity.display());
    }
    if let Some(node) = &running.node {
        println!("  node: {} ({})", node.name, node.host_id);
        if let Some(agent) = &node.agent {
            for proxy in &agent.status().connected {
                println!("  tunnel: {proxy}");
            }
        }
        for (section, addr) in &node.listeners {
            println!("  {section}: {addr}");
        }
        if let Some(diag) = node.diag_addr {
            println!("  diag: http://{diag}");
        }
    }
    if let Some(proxy) = &running.proxy {
        println!("  web: https://{}", proxy.addrs().web);
        for (field, addr) in &proxy.addrs().others {
            println!("  {field}: {addr}");
        }
        if running.auth.is_none() {
            return;
        }
        println!();
        println!("Create the first user (prints a password), then sign in with it:");
        println!("  tctl --data-dir {data_dir} users add admin --roles=editor,access --logins=root");
        // A generated self-signed certificate: trust exactly it, never `--insecure`.
        let trust = proxy
            .ca_file()
            .map(|ca| format!(" --cacert={}", ca.display()))
            .unwrap_or_default();
        println!("  tsh login --proxy={} --user=admin{trust}", proxy.addrs().web);
        if let Some(node) = &running.node {
            println!("  tsh ssh root@{}", node.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_addr_flag_defaults_to_the_port_of_the_config_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.yaml");
        std::fs::write(
            &file,
            "version: v1\nproxy_service:\n  public_addr: proxy.example.com\n",
        )
        .unwrap();
        let from_file = load_config(Some(&file), None, None, None).unwrap();
        std::fs::write(&file, "version: v1\n").unwrap();
        let from_flag = load_config(Some(&file), None, None, Some("proxy.example.com".into())).unwrap();
        assert_eq!(from_flag.proxy.public_addr, from_file.proxy.public_addr);
        assert_eq!(from_flag.proxy.public_addr.map(|a| a.port()), Some(3080));
    }
}

//! `svc`: runs the cluster's services (Auth and Proxy) from `svc.yaml` or the defaults.
//!
//! Glue only: parse the CLI, load the configuration, start the services
//! ([`svc_bins::cluster::start`]), run until SIGTERM or SIGINT, drain.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use svc_core::Addr;
use svc_core::config::Config;

/// The configuration file read when `--config` is not given, if it exists.
const DEFAULT_CONFIG: &str = "/etc/svc.yaml";

#[derive(Parser)]
#[command(
    name = "svc",
    about = "svc cluster access service",
    disable_version_flag = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the version of this svc build.
    Version,
    /// Print a commented default svc.yaml.
    Configure,
    /// Run the services svc.yaml enables (without one: Auth + Proxy on loopback) until SIGTERM
    /// or SIGINT.
    Start {
        /// The configuration file (default: /etc/svc.yaml when it exists, else the all-in-one
        /// defaults).
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Overrides svc.data_dir.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Overrides proxy_service.web_listen_addr.
        #[arg(long)]
        web_listen_addr: Option<String>,
        /// Overrides proxy_service.public_addr.
        #[arg(long)]
        public_addr: Option<String>,
    },
}

fn load_config(file: Option<&Path>, data_dir: Option<PathBuf>) -> anyhow::Result<Config> {
    let default = Path::new(DEFAULT_CONFIG);
    let mut config = match file {
        Some(f) => Config::load(f)?,
        None if default.exists() => Config::load(default)?,
        None => Config::all_in_one_default(),
    };
    if let Some(dir) = data_dir {
        config.svc.data_dir = dir;
    }
    Ok(config)
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => println!("svc {}", svc_core::version::current()),
        Command::Configure => print!("{}", svc_core::config::render_default_commented()),
        Command::Start {
            config,
            data_dir,
            web_listen_addr,
            public_addr,
        } => {
            let mut config = load_config(config.as_deref(), data_dir)?;
            if let Some(a) = web_listen_addr {
                config.proxy.web_listen_addr = Addr::parse_with_default_port(&a, 3080)
                    .with_context(|| format!("--web-listen-addr {a}"))?;
            }
            if let Some(a) = public_addr {
                config.proxy.public_addr = Some(
                    Addr::parse_with_default_port(&a, 443).with_context(|| format!("--public-addr {a}"))?,
                );
            }
            svc_bins::init_logging(&format!("{:?}", config.svc.log.severity).to_lowercase());
            let tunnel_override = std::env::var("SVC_TUNNEL_PUBLIC_ADDR")
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| {
                    Addr::parse_with_default_port(&v, 3024)
                        .with_context(|| format!("SVC_TUNNEL_PUBLIC_ADDR={v}"))
                })
                .transpose()?;
            tokio::runtime::Runtime::new()?.block_on(run(config, tunnel_override))?;
        }
    }
    Ok(())
}

async fn run(config: Config, tunnel_override: Option<Addr>) -> anyhow::Result<()> {
    let running = svc_bins::cluster::start(&config, tunnel_override).await?;
    let data_dir = config.svc.data_dir.display();
    println!(
        "svc {}: cluster {:?} is running",
        svc_core::version::current(),
        running.cluster
    );
    println!("  auth: {}", running.auth_addr);
    println!("  CA pin: {}", running.ca_pin);
    println!("  admin identity: {}", running.admin_identity.display());
    if let Some(node) = &running.node {
        println!("  node: {} ({})", node.name, node.host_id);
    }
    if let Some(proxy) = &running.proxy {
        println!("  web: https://{}", proxy.addrs().web);
        for (field, addr) in &proxy.addrs().others {
            println!("  {field}: {addr}");
        }
        println!();
        println!("Create the first user (prints a password), then sign in with it:");
        println!("  tctl --data-dir {data_dir} users add admin --roles=editor,access --logins=root");
        let insecure = if proxy.ca_file().is_some() {
            " --insecure"
        } else {
            ""
        };
        println!("  tsh login --proxy={} --user=admin{insecure}", proxy.addrs().web);
        if let Some(node) = &running.node {
            println!("  tsh ssh root@{}", node.name);
        }
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    println!("svc: shutting down, draining connections");
    running.shutdown().await;
    Ok(())
}

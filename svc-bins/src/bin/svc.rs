//! `svc`: runs the cluster's services (Auth and Proxy) from `svc.yaml` or the defaults.
//!
//! Glue only: parse the CLI, load the configuration, start the services
//! ([`svc_net::Cluster`]), run until SIGTERM or SIGINT, drain.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use svc_core::Addr;
use svc_core::config::Config;
use svc_net::cluster::{Cluster, RunningCluster};
use svc_update::kube::schedule::SecretSink;

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
        /// An agent accepts any TLS certificate from the proxy (a self-signed test proxy), and
        /// joins without svc.ca_pin by trusting the first CA seen. The SSH inside the reverse
        /// tunnel still checks the proxy against the cluster's host CA.
        #[arg(long)]
        insecure: bool,
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

fn main() {
    svc_bins::exit_on_error(run_cli(Cli::parse()));
}

fn run_cli(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => println!("svc {}", svc_core::version::current()),
        Command::Configure => print!("{}", svc_core::config::render_default_commented()),
        Command::Start {
            config,
            data_dir,
            web_listen_addr,
            public_addr,
            insecure,
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
            let cluster = Cluster::from_config(&config)
                .tunnel_public_addr_override(tunnel_override)
                .insecure(insecure);
            tokio::runtime::Runtime::new()?.block_on(run(config, cluster))?;
        }
    }
    Ok(())
}

async fn run(config: Config, mut cluster: Cluster) -> anyhow::Result<()> {
    // In Kubernetes (the chart sets the variables), the agent's schedule also goes to its
    // shared-state Secret for the updater controller.
    match SecretSink::from_env(|k| std::env::var(k).ok()).await {
        Ok(Some(sink)) => cluster = cluster.schedule_sink(Arc::new(sink)),
        Ok(None) => {}
        Err(e) => tracing::error!(
            error = %e,
            "the shared-state secret is configured but there is no Kubernetes API client configuration; \
             the maintenance schedule is not exported there"
        ),
    }
    let running = cluster.start().await?;
    banner(&config, &running);
    println!("svc: ready");
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut hup) = (signal(SignalKind::terminate())?, signal(SignalKind::hangup())?);
    let reload = tokio::select! {
        _ = term.recv() => false,
        _ = hup.recv() => true,
        r = tokio::signal::ctrl_c() => { r?; false }
    };
    if reload {
        println!("svc: SIGHUP: draining, then starting again with the configuration and binary on disk");
    } else {
        println!("svc: shutting down, draining connections");
    }
    running.shutdown().await;
    if reload {
        return Err(restart_in_place());
    }
    Ok(())
}

/// Replaces this process with a fresh `svc` run with the same arguments (same PID, so systemd
/// keeps tracking it): the configuration, certificates and — after a package upgrade — the binary
/// are read again. Returns only when the new program could not be started.
fn restart_in_place() -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    // argv[0], not /proc/self/exe: after an upgrade replaced the binary, the running image's
    // path names the deleted file.
    let Some(program) = args.next() else {
        return anyhow::anyhow!("restarting after SIGHUP: no program name in argv");
    };
    let err = std::process::Command::new(&program).args(args).exec();
    anyhow::anyhow!("restarting after SIGHUP ({}): {err}", program.to_string_lossy())
}

fn banner(config: &Config, running: &RunningCluster) {
    let data_dir = config.svc.data_dir.display();
    match &running.auth {
        Some(_) => println!(
            "svc {}: cluster {:?} is running",
            svc_core::version::current(),
            running.cluster
        ),
        None => println!(
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

//! `svc`: runs the cluster's services (auth, proxy, agents) from `svc.yaml` or the defaults.
//!
//! Glue only: parse the CLI, build the Proxy Service from `ProxySettings`, run until SIGTERM or
//! SIGINT, drain.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use svc_core::Addr;
use svc_net::{
    proxy::{DEFAULT_DATA_DIR, ProxyBuilder, ProxySettings},
    tls::TlsSource,
};

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
    /// Run the Proxy Service (loopback defaults) until SIGTERM or SIGINT.
    Start {
        /// Where state (the generated certificate) is kept.
        #[arg(long, default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
        /// The web listen address (in TLS routing mode: every protocol).
        #[arg(long, default_value = "127.0.0.1:3080")]
        web_listen_addr: String,
        /// The public web address clients and agents use.
        #[arg(long)]
        public_addr: Option<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => println!("svc {}", svc_core::version::current()),
        Command::Start {
            data_dir,
            web_listen_addr,
            public_addr,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            let mut settings = ProxySettings::default();
            settings.web_listen_addr = Addr::parse_with_default_port(&web_listen_addr, 3080)
                .with_context(|| format!("--web-listen-addr {web_listen_addr}"))?;
            settings.web_public_addr = public_addr
                .map(|a| Addr::parse_with_default_port(&a, 443).with_context(|| format!("--public-addr {a}")))
                .transpose()?;
            settings.tunnel_public_addr_override = std::env::var("SVC_TUNNEL_PUBLIC_ADDR")
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| {
                    Addr::parse_with_default_port(&v, 3024)
                        .with_context(|| format!("SVC_TUNNEL_PUBLIC_ADDR={v}"))
                })
                .transpose()?;
            settings.tls = TlsSource::Generated { data_dir };
            tokio::runtime::Runtime::new()?.block_on(run(settings))?;
        }
    }
    Ok(())
}

async fn run(settings: ProxySettings) -> anyhow::Result<()> {
    let builder = svc_update::channel::http::install_direct(ProxyBuilder::new(settings))?;
    let proxy = builder.bind().await?;
    println!("svc proxy {} listening", svc_core::version::current());
    println!("  web (TLS routing): https://{}", proxy.addrs().web);
    for (field, addr) in &proxy.addrs().others {
        println!("  {field}: {addr}");
    }
    if let Some(ca) = proxy.ca_file() {
        println!("  self-signed CA: {}", ca.display());
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    println!("svc proxy: shutting down, draining connections");
    proxy.shutdown().await;
    Ok(())
}

//! Glue shared by the `svc`, `tctl`, `tsh` and `svc-kube-updater` binaries: their command lines
//! and how they print ([`output`], one module per binary). The processes `svc start` runs are
//! library types (`svc_net::{AuthServer, ProxyServer, AgentNode, Cluster}`), `tsh`'s client side is `svc_net::client`; this crate parses
//! arguments and prints.
#![deny(missing_docs)]

pub mod output;
pub mod svc;
pub mod tctl;
pub mod tsh;

/// Sends `tracing` output to stderr, filtered by `RUST_LOG` (default `default_level`).
pub fn init_logging(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Runs a binary's fallible main: errors go to stderr as `ERROR: <message>` with exit code 1.
pub fn exit_on_error(result: anyhow::Result<()>) {
    if let Err(e) = result {
        eprintln!("ERROR: {e:#}");
        std::process::exit(1);
    }
}

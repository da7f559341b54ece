//! Glue shared by the `svc`, `tctl` and `tsh` binaries: finding the identity a client acts
//! with ([`profile`]), printing ([`output`]), and `tsh`'s client side. The processes `svc start`
//! runs are library types (`svc_net::{AuthServer, ProxyServer, AgentNode, Cluster}`); this crate parses arguments and prints.
#![deny(missing_docs)]

pub mod kubeconfig;
pub mod local_proxy;
pub mod output;
pub mod profile;
pub mod ssh;

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

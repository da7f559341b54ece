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

/// Sends `svc`'s `tracing` output where `svc.log` says: `output` (standard error, standard
/// output, or a file appended to, created mode 0600 when missing), `format` (text lines, or
/// one JSON object per line), `severity` (overridden by `RUST_LOG` when set).
pub fn init_service_logging(log: &svc_core::config::LogConfig) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    use std::os::unix::fs::OpenOptionsExt;
    use svc_core::config::{LogFormat, LogOutput, LogSeverity};
    use tracing_subscriber::fmt::writer::BoxMakeWriter;

    let level = match log.severity {
        LogSeverity::Debug => "debug",
        LogSeverity::Warn => "warn",
        LogSeverity::Error => "error",
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let (writer, ansi) = match &log.output {
        LogOutput::Stdout => (
            BoxMakeWriter::new(std::io::stdout),
            std::io::stdout().is_terminal(),
        ),
        LogOutput::File(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| anyhow::anyhow!("svc.log.output: opening {}: {e}", path.display()))?;
            (BoxMakeWriter::new(std::sync::Arc::new(file)), false)
        }
        // Standard error, the default.
        _ => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        ),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    let installed = match log.format {
        LogFormat::Json => builder.json().try_init(),
        // Text lines, the default.
        _ => builder.try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}

/// Runs a binary's fallible main: errors go to stderr as `ERROR: <message>` with exit code 1.
pub fn exit_on_error(result: anyhow::Result<()>) {
    if let Err(e) = result {
        eprintln!("ERROR: {e:#}");
        std::process::exit(1);
    }
}

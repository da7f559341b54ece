//! `svc-upgrade`: the Linux agent updater, run by `svc-upgrade.timer` about every 30 minutes.
//!
//! Glue only: parse the command, read `/etc/svc-upgrade.d/` (`SVC_UPGRADE_CONFIG`), build the
//! version-server client and the package manager, and hand them to
//! `svc_update::linux::Runner`. Exit code 0 when the run finished (nothing installed, updated,
//! or rolled back to the previous version), 1 when it stopped on an error (nothing installed
//! unless the message says so). `run` and `force` write `/etc/svc-upgrade.d/status` either way.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use clap::{Parser, Subcommand};
use svc_core::SystemClock;
use svc_update::{
    linux::{Mode, Runner, UpgradeConfig, UpgradeState, package_manager, runner::version_client},
    target::Trust,
};

#[derive(Parser)]
#[command(
    name = "svc-upgrade",
    about = "svc agent updater: installs the version the cluster's Proxy Service advertises, in maintenance windows",
    version = svc_core::version::display()
)]
struct Cli {
    /// A PEM bundle trusted for the version endpoint besides the public roots (a self-signed or
    /// private-CA Proxy Service).
    #[arg(long, env = "SVC_UPGRADE_CA_FILE", global = true)]
    ca_file: Option<PathBuf>,
    /// Accept any certificate from the version endpoint (trials against a self-signed proxy
    /// only: anyone on the path could then choose the version installed).
    #[arg(long, env = "SVC_UPGRADE_INSECURE", global = true, conflicts_with = "ca_file")]
    insecure: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check and, when due (critical, inside a maintenance window, or the agent unhealthy for a
    /// sustained time), install, restart, wait for proof of health, and roll back when it fails.
    Run,
    /// Check and report what `run` would do; change nothing.
    DryRun,
    /// Install the advertised version now, outside windows and below the installed version; clears
    /// the list of versions that were rolled back.
    Force,
    /// Print the version of svc-upgrade.
    Version,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mode = match cli.command {
        Command::Version => {
            println!("svc-upgrade {}", svc_core::version::current());
            return std::process::ExitCode::SUCCESS;
        }
        Command::Run => Mode::Run,
        Command::DryRun => Mode::DryRun,
        Command::Force => Mode::Force,
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            // The forwarding cache's "error is cached" warning is the proxy's concern, not ours:
            // the failure itself is reported once, as the run's error.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,svc_net::proxy::web::version::forward=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(mode, cli.ca_file, cli.insecure) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("svc-upgrade {mode}: error: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, leaving out a cause whose text the message already quotes (the
/// library's errors embed their sources).
fn describe(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

fn run(mode: Mode, ca_file: Option<PathBuf>, insecure: bool) -> anyhow::Result<()> {
    let env = |k: &str| std::env::var(k).ok();
    let config = UpgradeConfig::load(env)?;
    let ca = ca_file
        .map(|path| std::fs::read(&path).with_context(|| format!("reading --ca-file {}", path.display())))
        .transpose()?;
    let trust = if insecure {
        eprintln!("svc-upgrade: warning: --insecure: the version endpoint's certificate is not checked");
        Trust::Insecure
    } else {
        Trust::Roots(ca.as_deref())
    };
    let client = version_client(&config, trust)?;
    let pm = package_manager(config.installer)?;
    let mut runner = Runner::new(config, UpgradeState::path_from_env(env));
    // Another supervisor than systemd (and the package tests) restarts the agent its own way.
    if let Some(program) = env("SVC_UPGRADE_SYSTEMCTL").filter(|p| !p.trim().is_empty()) {
        runner = runner.with_systemctl(PathBuf::from(program.trim()));
    }
    let clock = Arc::new(SystemClock);
    tokio::runtime::Runtime::new()?.block_on(async {
        let mut out = std::io::stdout();
        runner
            .run(mode, &client, pm.as_ref(), clock.as_ref(), &mut out)
            .await
    })?;
    Ok(())
}

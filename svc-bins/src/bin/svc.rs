//! `svc`: runs the cluster's services (auth, proxy, agents) from `svc.yaml` or the defaults.

use clap::{Parser, Subcommand};

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => println!("svc {}", svc_core::version::current()),
    }
    Ok(())
}

//! `svc`: runs the cluster's services (Auth and Proxy) from `svc.yaml` or the defaults.
//!
//! Glue only: parse the CLI, load the configuration, start the services
//! ([`svc_net::Cluster`]), run until SIGTERM or SIGINT, drain.

use anyhow::Context;
use clap::Parser;
use svc_bins::svc::cli::{Cli, Command};
use svc_core::Addr;
use svc_core::config::Config;
use svc_net::cluster::Cluster;
use svc_update::kube::agent::KubeAgent;

fn main() {
    svc_bins::exit_on_error(run_cli(Cli::parse()));
}

fn run_cli(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => println!("svc {}", svc_core::version::current()),
        Command::Configure => print!("{}", svc_core::config::render_default_commented()),
        Command::SftpServer { uid, gid, groups } => {
            // Still one thread: drop to the login's rights before anything else runs.
            if let (Some(uid), Some(gid)) = (uid, gid) {
                svc_net::agent::ssh::sftp::drop_privileges(uid, gid, &groups)
                    .with_context(|| format!("becoming uid {uid} gid {gid}"))?;
            }
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(svc_net::agent::ssh::sftp::serve_stdio());
        }
        Command::Start {
            config,
            data_dir,
            web_listen_addr,
            public_addr,
            insecure,
        } => {
            let config =
                svc_bins::svc::load_config(config.as_deref(), data_dir, web_listen_addr, public_addr)?;
            svc_bins::init_service_logging(&config.svc.log)?;
            svc_bins::svc::warn_about_open_file_limit(&config);
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
            let runtime = tokio::runtime::Runtime::new()?;
            if runtime.block_on(run(config, cluster))? {
                // Exec only once every task is dropped and the runtime's threads are gone: an
                // exec kills the process's other threads wherever they are (a store write in a
                // blocking thread, say), as a `kill -9` of each would.
                runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
                return Err(restart_in_place());
            }
        }
    }
    Ok(())
}

/// How long the runtime's threads get to finish after the services drained, before a reload
/// replaces the process.
const RUNTIME_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs the services until SIGTERM, SIGINT or SIGHUP, then drains them. `Ok(true)`: SIGHUP,
/// start again in place ([`restart_in_place`]).
async fn run(config: Config, cluster: Cluster) -> anyhow::Result<bool> {
    // The handlers are installed before anything is announced: a SIGHUP (`systemctl reload`)
    // or SIGTERM sent as soon as "ready" is seen must drain, not meet the default action,
    // which kills the process.
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut hup) = (signal(SignalKind::terminate())?, signal(SignalKind::hangup())?);
    // In Kubernetes (the chart sets the variables): the schedule and the updater's status go
    // through the shared-state Secret, the host identity lives in the replica's own Secret.
    let kube = KubeAgent::from_env(|k| std::env::var(k).ok()).await?;
    // SIGTERM or Ctrl-C while starting (a store that does not answer, say) stops at once; a
    // SIGHUP meanwhile is kept and reloads once started.
    let running = tokio::select! {
        r = kube.apply(cluster).start() => r?,
        _ = term.recv() => {
            println!("svc: stopped while starting");
            return Ok(false);
        }
        r = tokio::signal::ctrl_c() => {
            r?;
            println!("svc: stopped while starting");
            return Ok(false);
        }
    };
    svc_bins::svc::banner(&config, &running);
    println!("svc: ready");
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
    Ok(reload)
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

//! `svc-kube-updater`: keeps a Kubernetes agent on the version its channel serves.
//!
//! Glue only: parse flags, build the library's updater (`svc_update::kube::updater`), run
//! until a signal.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use svc_update::kube::{UpdaterConfig, WorkloadKind, decision::channel_major, updater::Updater};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Kind {
    Statefulset,
    Deployment,
}

/// Updates an svc agent's StatefulSet or Deployment to the version its channel serves.
#[derive(Debug, Parser)]
#[command(name = "svc-kube-updater", version = svc_core::version::display())]
struct Args {
    /// Name of the agent's StatefulSet or Deployment.
    #[arg(long, env = "SVC_AGENT_NAME")]
    agent_name: String,
    /// Namespace of the agent.
    #[arg(long, env = "SVC_AGENT_NAMESPACE")]
    agent_namespace: String,
    /// Kind of the agent workload.
    #[arg(long, value_enum, default_value = "statefulset")]
    agent_kind: Kind,
    /// Version server: the cluster's proxy web address, e.g. `https://proxy.example.com:443`.
    #[arg(long)]
    version_server: String,
    /// PEM file of an extra CA trusted for the version server (a proxy with a private CA), on
    /// top of the public web roots.
    #[arg(long, env = "SVC_VERSION_SERVER_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
    /// Release channel.
    #[arg(long, default_value = "stable/cloud")]
    version_channel: String,
    /// Major version the channel is pinned to; other majors are refused. Default: taken from a
    /// channel name ending in `v<major>`, else none.
    #[arg(long)]
    channel_major: Option<u64>,
    /// Agent image repository, without tag.
    #[arg(long)]
    base_image: String,
    /// Name of the agent container in the pod template.
    #[arg(long, default_value = "svc")]
    container_name: String,
    /// Shared-state Secret holding the maintenance schedule. Default: `<agent-name>-shared-state`.
    #[arg(long)]
    shared_state_secret: Option<String>,
    /// Period between reconciles when nothing happens.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    sync_period: Duration,
    /// Time a pod must stay not ready before the agent counts as unhealthy.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    unhealthy_after: Duration,
    /// Bound on the wait for the new image's pods to become ready after an update; not ready by
    /// then → the previous image is restored and the version marked bad.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    rollout_timeout: Duration,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080")]
    health_addr: SocketAddr,
    /// Name of the leader-election Lease (in the agent's namespace).
    #[arg(long, default_value = "svc-kube-updater")]
    lease_name: String,
    /// Identity in the election; the pod name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let kind = match args.agent_kind {
        Kind::Statefulset => WorkloadKind::StatefulSet,
        Kind::Deployment => WorkloadKind::Deployment,
    };
    let mut config = UpdaterConfig::new(
        &args.agent_namespace,
        &args.agent_name,
        kind,
        &args.container_name,
        &args.base_image,
    );
    config.sync_period = args.sync_period;
    config.unhealthy_after = args.unhealthy_after;
    config.rollout_timeout = args.rollout_timeout;
    config.channel_major = args
        .channel_major
        .or_else(|| channel_major(&args.version_channel));
    if let Some(secret) = args.shared_state_secret {
        config.secret_name = secret;
    }
    let ca = match &args.ca_file {
        Some(path) => {
            Some(std::fs::read(path).with_context(|| format!("reading --ca-file {}", path.display()))?)
        }
        None => None,
    };
    let updater = Updater::new(config, &args.version_server, &args.version_channel)
        .ca_pem(ca)
        .health_addr(args.health_addr)
        .lease_name(args.lease_name)
        .identity(args.identity);
    tokio::select! {
        // Leadership lost or the controller stopped: exit so the pod restarts as a fresh standby.
        e = updater.run() => Err(e.into()),
        signal = shutdown_signal() => {
            signal?;
            tracing::info!("stopping on signal");
            Ok(())
        }
    }
}

/// SIGTERM (what the kubelet sends) or SIGINT.
async fn shutdown_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => Ok(()),
        result = tokio::signal::ctrl_c() => result.context("waiting for SIGINT"),
    }
}

//! `svc-kube-updater`: keeps a Kubernetes agent on the version its channel serves.
//!
//! Glue only: parse flags, build the library's controller (`svc_update::kube`), serve
//! diagnostics, elect a leader, run until a signal.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use svc_core::clock::SystemClock;
use svc_update::kube::{
    UpdaterConfig, WorkloadKind,
    controller::{self, Context},
    decision::channel_major,
    health::{self, Metrics},
    leader::{LeaderElector, LeaseTiming},
    target::channel_base_url,
};
use svc_update::target::{Trust, VersionClient, tls_config};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Kind {
    Statefulset,
    Deployment,
}

/// Updates an svc agent's StatefulSet or Deployment to the version its channel serves.
#[derive(Debug, Parser)]
#[command(version)]
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
    config.channel_major = args
        .channel_major
        .or_else(|| channel_major(&args.version_channel));
    if let Some(secret) = args.shared_state_secret {
        config.secret_name = secret;
    }

    // The shared updater client: HTTPS_PROXY / NO_PROXY are honoured for the version server,
    // like every outbound connection svc makes.
    let ca = match &args.ca_file {
        Some(path) => {
            Some(std::fs::read(path).with_context(|| format!("reading --ca-file {}", path.display()))?)
        }
        None => None,
    };
    let target = VersionClient::from_env(
        channel_base_url(&args.version_server, &args.version_channel),
        tls_config(Trust::Roots(ca.as_deref()))?,
    )?;
    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client")?;
    let metrics = Arc::new(Metrics::default());
    let listener = tokio::net::TcpListener::bind(args.health_addr)
        .await
        .with_context(|| format!("binding the health address {}", args.health_addr))?;
    tokio::spawn(health::serve(listener, metrics.clone()));

    let identity = args
        .identity
        .unwrap_or_else(|| format!("svc-kube-updater-{}", std::process::id()));
    let elector = LeaderElector::new(
        client.clone(),
        &config.namespace,
        &args.lease_name,
        &identity,
        LeaseTiming::default(),
        metrics.clone(),
    );
    let ctx = Arc::new(Context {
        client,
        config,
        target: Arc::new(target),
        clock: Arc::new(SystemClock),
        metrics: metrics.clone(),
    });
    metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::select! {
        result = elector.run(controller::run(ctx)) => {
            // Leadership lost: exit so the pod restarts as a fresh standby.
            result?;
            anyhow::bail!("the controller stopped");
        }
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

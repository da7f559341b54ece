//! An agent running in Kubernetes: what it plugs into its node, from the environment the chart
//! sets.
//!
//! - the maintenance schedule also goes to the shared-state Secret
//!   ([`SecretSink`]), where the updater controller reads it;
//! - the updater's last decision is read back from that Secret
//!   ([`SecretStatusSource`]) and reported in the heartbeat,
//!   so `tctl inventory ls` shows it;
//! - the host identity lives in a Secret of its own per replica
//!   ([`SecretIdentityStore`]), so a pod recreated by an
//!   update rejoins with the same host ID and no join token.
//!
//! ```no_run
//! # async fn run(config: svc_core::config::Config) -> Result<(), Box<dyn std::error::Error>> {
//! use svc_update::kube::agent::KubeAgent;
//!
//! let kube = KubeAgent::from_env(|k| std::env::var(k).ok()).await?;
//! let running = kube.apply(svc_net::Cluster::from_config(&config)).start().await?;
//! # drop(running);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use svc_core::updater::UpdaterStatus;
use svc_net::{
    Cluster,
    agent::node::{IdentityStore, ScheduleSink, UpdateStatusSource},
};
use tower::BoxError;

use super::{identity::SecretIdentityStore, schedule::SecretSink, status::SecretStatusSource};

/// Why the Kubernetes integration could not be set up: a variable names a Secret but there is
/// no Kubernetes API client configuration to reach it.
#[derive(Debug, thiserror::Error)]
#[error("{what} is configured ({variables}) but there is no Kubernetes API client configuration: {source}")]
pub struct KubeAgentError {
    /// What was asked for.
    pub what: &'static str,
    /// The environment variables that asked for it.
    pub variables: String,
    /// The client's reason.
    #[source]
    pub source: kube::Error,
}

/// What an agent in Kubernetes plugs into its node; everything is `None` outside Kubernetes.
#[derive(Debug, Default)]
pub struct KubeAgent {
    /// The shared-state Secret, as a schedule sink.
    pub schedule_sink: Option<Arc<SecretSink>>,
    /// The shared-state Secret, as the updater's status.
    pub status_source: Option<Arc<SecretStatusSource>>,
    /// The replica's own Secret, for its host identity.
    pub identity_store: Option<Arc<SecretIdentityStore>>,
}

impl KubeAgent {
    /// Reads the chart's variables (`env` looks one up): `SVC_KUBE_NAMESPACE` with
    /// `SVC_KUBE_SHARED_STATE_SECRET` (schedule and status) and `SVC_KUBE_STATE_SECRET`
    /// (identity).
    pub async fn from_env(env: impl Fn(&str) -> Option<String> + Copy) -> Result<Self, KubeAgentError> {
        let shared = || {
            format!(
                "{}, {}",
                super::schedule::NAMESPACE_ENV,
                super::schedule::SECRET_ENV
            )
        };
        let schedule_sink = SecretSink::from_env(env)
            .await
            .map_err(|source| KubeAgentError {
                what: "the shared-state secret",
                variables: shared(),
                source,
            })?
            .map(Arc::new);
        let status_source = SecretStatusSource::from_env(env)
            .await
            .map_err(|source| KubeAgentError {
                what: "the shared-state secret",
                variables: shared(),
                source,
            })?
            .map(Arc::new);
        let identity_store = SecretIdentityStore::from_env(env)
            .await
            .map_err(|source| KubeAgentError {
                what: "the identity secret",
                variables: format!(
                    "{}, {}",
                    super::identity::NAMESPACE_ENV,
                    super::identity::STATE_SECRET_ENV
                ),
                source,
            })?
            .map(Arc::new);
        Ok(KubeAgent {
            schedule_sink,
            status_source,
            identity_store,
        })
    }

    /// `cluster` with what is configured plugged in.
    pub fn apply(self, mut cluster: Cluster) -> Cluster {
        if let Some(sink) = self.schedule_sink {
            cluster = cluster.schedule_sink(sink as Arc<dyn ScheduleSink>);
        }
        if let Some(source) = self.status_source {
            cluster = cluster.update_status_source(source as Arc<dyn UpdateStatusSource>);
        }
        if let Some(store) = self.identity_store {
            cluster = cluster.identity_store(store as Arc<dyn IdentityStore>);
        }
        cluster
    }
}

#[async_trait]
impl UpdateStatusSource for SecretStatusSource {
    async fn status(&self) -> Result<Option<UpdaterStatus>, BoxError> {
        Ok(self.read().await?)
    }

    fn describe(&self) -> String {
        format!("{self:?}")
    }
}

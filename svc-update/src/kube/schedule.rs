//! The agent's half of Kubernetes updates: export the next maintenance windows to the agent's
//! shared-state Secret, where the updater reads them.
//!
//! Data flow: `cluster_maintenance_config` → [`svc_core::maintenance::AgentUpgradeWindow::next_windows`]
//! → [`export_schedule`] (this module) → Secret key `agent-maintenance-schedule` →
//! [`read_schedule`] in the updater's reconcile.

use std::{collections::BTreeMap, time::SystemTime};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use svc_core::maintenance::{
    AgentUpgradeWindow, ScheduleError, Window, parse_kube_schedule, render_kube_schedule,
};

use super::SCHEDULE_SECRET_KEY;

/// How many windows the agent exports at a time.
pub const EXPORTED_WINDOWS: usize = 4;

/// Why the schedule could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleExportError {
    /// The API server refused or failed the request.
    #[error("secret {namespace}/{name}: {source}")]
    Api {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The stored schedule is not valid JSON of the expected shape.
    #[error("secret {namespace}/{name} key {SCHEDULE_SECRET_KEY}: {source}")]
    Schedule {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// What is wrong with the value.
        #[source]
        source: ScheduleError,
    },
}

/// Writes the next [`EXPORTED_WINDOWS`] windows of `schedule` at `now` to the Secret.
pub async fn export_schedule(
    client: Client,
    namespace: &str,
    secret_name: &str,
    schedule: &AgentUpgradeWindow,
    now: SystemTime,
) -> Result<(), ScheduleExportError> {
    write_windows(
        client,
        namespace,
        secret_name,
        &schedule.next_windows(now, EXPORTED_WINDOWS),
    )
    .await
}

/// Writes `windows` as `render_kube_schedule` JSON under `agent-maintenance-schedule` with a
/// JSON merge patch, so the other keys of the shared-state Secret are kept; creates the Secret
/// when it does not exist. An empty slice writes an empty schedule (a reset).
pub async fn write_windows(
    client: Client,
    namespace: &str,
    secret_name: &str,
    windows: &[Window],
) -> Result<(), ScheduleExportError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let value = ByteString(render_kube_schedule(windows).into_bytes());
    let api_error = |source| ScheduleExportError::Api {
        namespace: namespace.to_owned(),
        name: secret_name.to_owned(),
        source,
    };
    let patch = serde_json::json!({ "data": { SCHEDULE_SECRET_KEY: value } });
    match api
        .patch(secret_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(secret_name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([(SCHEDULE_SECRET_KEY.to_owned(), value)])),
                ..Secret::default()
            };
            match api.create(&PostParams::default(), &secret).await {
                Ok(_) => Ok(()),
                // Created by someone else between our patch and create: patch again.
                Err(kube::Error::Api(status)) if status.code == 409 => api
                    .patch(secret_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop)
                    .map_err(api_error),
                Err(e) => Err(api_error(e)),
            }
        }
        Err(e) => Err(api_error(e)),
    }
}

/// Reads the windows from the Secret. A missing Secret or key is no schedule (empty), as right
/// after install; a malformed value is an error.
pub async fn read_schedule(
    client: Client,
    namespace: &str,
    secret_name: &str,
) -> Result<Vec<Window>, ScheduleExportError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let secret = api
        .get_opt(secret_name)
        .await
        .map_err(|source| ScheduleExportError::Api {
            namespace: namespace.to_owned(),
            name: secret_name.to_owned(),
            source,
        })?;
    let Some(value) = secret
        .and_then(|s| s.data)
        .and_then(|mut d| d.remove(SCHEDULE_SECRET_KEY))
    else {
        return Ok(Vec::new());
    };
    parse_kube_schedule(&String::from_utf8_lossy(&value.0)).map_err(|source| ScheduleExportError::Schedule {
        namespace: namespace.to_owned(),
        name: secret_name.to_owned(),
        source,
    })
}

/// The Kubernetes sink of the agent's [`ScheduleExporter`](svc_net::agent::node::export::ScheduleExporter):
/// its shared-state Secret. Spawn it with
/// `ScheduleExporter::spawn_to(source, clock, Arc::new(SecretSink::new(..)), settings)`, so the
/// agent in Kubernetes gets the same cadence, jitter and reset-on-lost-contact as on Linux.
#[derive(Clone)]
pub struct SecretSink {
    client: Client,
    namespace: String,
    secret_name: String,
}

impl std::fmt::Debug for SecretSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSink")
            .field("namespace", &self.namespace)
            .field("secret_name", &self.secret_name)
            .finish_non_exhaustive()
    }
}

/// Set by the chart: the namespace of the agent's shared-state Secret.
pub const NAMESPACE_ENV: &str = "SVC_KUBE_NAMESPACE";
/// Set by the chart: the name of the agent's shared-state Secret.
pub const SECRET_ENV: &str = "SVC_KUBE_SHARED_STATE_SECRET";

impl SecretSink {
    /// The sink the chart asks for through [`NAMESPACE_ENV`] and [`SECRET_ENV`] (`env` looks a
    /// variable up): `Ok(None)` when they are not both set (not running in Kubernetes), an
    /// error when they are but no Kubernetes API client configuration exists.
    pub async fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, kube::Error> {
        let namespace = env(NAMESPACE_ENV).unwrap_or_default();
        let secret = env(SECRET_ENV).unwrap_or_default();
        if namespace.is_empty() || secret.is_empty() {
            return Ok(None);
        }
        let client = Client::try_default().await?;
        Ok(Some(SecretSink::new(client, namespace, secret)))
    }

    /// Exports to Secret `namespace/secret_name` (usually
    /// [`default_shared_state_secret`](super::default_shared_state_secret) of the agent).
    pub fn new(client: Client, namespace: impl Into<String>, secret_name: impl Into<String>) -> Self {
        SecretSink {
            client,
            namespace: namespace.into(),
            secret_name: secret_name.into(),
        }
    }
}

#[async_trait::async_trait]
impl svc_net::agent::node::export::ScheduleSink for SecretSink {
    async fn export(&self, windows: &[Window]) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(write_windows(self.client.clone(), &self.namespace, &self.secret_name, windows).await?)
    }

    async fn reset(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(write_windows(self.client.clone(), &self.namespace, &self.secret_name, &[]).await?)
    }

    fn describe(&self) -> String {
        format!("secret {}/{}", self.namespace, self.secret_name)
    }
}

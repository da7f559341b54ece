//! The updater's last decision and the versions it will not install again, kept in the agent's
//! shared-state Secret next to the maintenance schedule.
//!
//! Data flow: [`super::controller`] decides → [`write_status`] (key `agent-update-status`, the
//! same JSON as the Linux updater's `status` file, [`svc_core::updater`]'s, upgrader `kube`) and
//! [`write_bad_versions`] (key `agent-bad-versions`, a JSON array) → the agent reads the status
//! back with [`read_update_status`] (or a [`SecretStatusSource`]) and reports it in its
//! heartbeat, so `tctl inventory ls` shows it.

use std::collections::BTreeMap;

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use serde::{Deserialize, Serialize};
use svc_core::{Version, updater::UpdaterStatus};

/// Key of the shared-state Secret holding the updater's last decision.
pub const STATUS_SECRET_KEY: &str = "agent-update-status";
/// Key of the shared-state Secret holding the versions marked bad (a JSON array of versions).
pub const BAD_VERSIONS_SECRET_KEY: &str = "agent-bad-versions";
/// Key of the shared-state Secret holding the rollout the updater is waiting for, so an updater
/// restarted during the wait resumes it.
pub const PENDING_ROLLOUT_SECRET_KEY: &str = "agent-update-rollout";
/// An image change whose pods have not yet proven themselves, kept under
/// [`PENDING_ROLLOUT_SECRET_KEY`] while the updater waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRollout {
    /// The version installed, without `v`.
    pub version: String,
    /// The image set.
    pub image: String,
    /// The image it replaced, restored on a rollback.
    pub previous_image: Option<String>,
    /// Until when (Unix seconds) the pods may take to become ready.
    pub deadline: i64,
}

/// Why the shared-state Secret could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
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
    /// A stored value is not the expected JSON.
    #[error("secret {namespace}/{name} key {key}: {reason}")]
    Malformed {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// The version as files and the status write it: without a leading `v`.
pub fn plain_version(version: &Version) -> String {
    version.without_v().to_string()
}

/// Sets (`Some`) or removes (`None`) keys of the Secret's `data` with a JSON merge patch, so the
/// other keys are kept; creates the Secret when it does not exist (and there is something to
/// set).
pub(crate) async fn merge_secret_data(
    client: Client,
    namespace: &str,
    secret_name: &str,
    values: &[(&str, Option<Vec<u8>>)],
) -> Result<(), kube::Error> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let data: serde_json::Map<String, serde_json::Value> = values
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Some(bytes) => serde_json::to_value(ByteString(bytes.clone())).unwrap_or_default(),
                None => serde_json::Value::Null,
            };
            ((*k).to_owned(), value)
        })
        .collect();
    let patch = serde_json::json!({ "data": data });
    match api
        .patch(secret_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let set: BTreeMap<String, ByteString> = values
                .iter()
                .filter_map(|(k, v)| Some(((*k).to_owned(), ByteString(v.clone()?))))
                .collect();
            if set.is_empty() {
                return Ok(());
            }
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(secret_name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..ObjectMeta::default()
                },
                data: Some(set),
                ..Secret::default()
            };
            match api.create(&PostParams::default(), &secret).await {
                Ok(_) => Ok(()),
                // Created by someone else between our patch and create: patch again.
                Err(kube::Error::Api(status)) if status.code == 409 => api
                    .patch(secret_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

fn api_error(namespace: &str, name: &str) -> impl FnOnce(kube::Error) -> StatusError {
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    move |source| StatusError::Api {
        namespace,
        name,
        source,
    }
}

async fn read_key(
    client: Client,
    namespace: &str,
    secret_name: &str,
    key: &str,
) -> Result<Option<Vec<u8>>, StatusError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let secret = api
        .get_opt(secret_name)
        .await
        .map_err(api_error(namespace, secret_name))?;
    Ok(secret
        .and_then(|s| s.data)
        .and_then(|mut d| d.remove(key))
        .map(|v| v.0))
}

/// Reads the JSON value under `key`: `None` when the Secret or the key does not exist; a value
/// that is not a `T` is an error naming the Secret and the key.
async fn read_json<T: serde::de::DeserializeOwned>(
    client: Client,
    namespace: &str,
    secret_name: &str,
    key: &'static str,
) -> Result<Option<T>, StatusError> {
    let Some(bytes) = read_key(client, namespace, secret_name, key).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| malformed(namespace, secret_name, key, e.to_string()))
}

/// Writes `value` as JSON under `key` (`None` removes the key), keeping the Secret's other keys.
async fn write_json<T: Serialize>(
    client: Client,
    namespace: &str,
    secret_name: &str,
    key: &'static str,
    value: Option<&T>,
) -> Result<(), StatusError> {
    let json = value
        .map(serde_json::to_vec)
        .transpose()
        .map_err(|e| malformed(namespace, secret_name, key, e.to_string()))?;
    merge_secret_data(client, namespace, secret_name, &[(key, json)])
        .await
        .map_err(api_error(namespace, secret_name))
}

fn malformed(namespace: &str, secret_name: &str, key: &'static str, reason: String) -> StatusError {
    StatusError::Malformed {
        namespace: namespace.to_owned(),
        name: secret_name.to_owned(),
        key,
        reason,
    }
}

/// Writes `status` under [`STATUS_SECRET_KEY`].
pub async fn write_status(
    client: Client,
    namespace: &str,
    secret_name: &str,
    status: &UpdaterStatus,
) -> Result<(), StatusError> {
    write_json(client, namespace, secret_name, STATUS_SECRET_KEY, Some(status)).await
}

/// Reads the updater's last decision: `None` when the Secret or the key does not exist yet (no
/// reconcile so far); a malformed value is an error.
pub async fn read_update_status(
    client: Client,
    namespace: &str,
    secret_name: &str,
) -> Result<Option<UpdaterStatus>, StatusError> {
    read_json(client, namespace, secret_name, STATUS_SECRET_KEY).await
}

/// Reads the versions marked bad; none when the Secret or key does not exist. A malformed list
/// is an error (the updater then installs nothing it might have marked bad).
pub async fn read_bad_versions(
    client: Client,
    namespace: &str,
    secret_name: &str,
) -> Result<Vec<Version>, StatusError> {
    let list: Vec<String> = read_json(client, namespace, secret_name, BAD_VERSIONS_SECRET_KEY)
        .await?
        .unwrap_or_default();
    list.iter()
        .map(|v| {
            Version::parse(v).map_err(|e| {
                malformed(
                    namespace,
                    secret_name,
                    BAD_VERSIONS_SECRET_KEY,
                    format!("{v:?}: {e}"),
                )
            })
        })
        .collect()
}

/// Writes the versions marked bad (without `v`); an empty list removes the key.
pub async fn write_bad_versions(
    client: Client,
    namespace: &str,
    secret_name: &str,
    versions: &[Version],
) -> Result<(), StatusError> {
    let list: Vec<String> = versions.iter().map(plain_version).collect();
    let value = (!list.is_empty()).then_some(&list);
    write_json(client, namespace, secret_name, BAD_VERSIONS_SECRET_KEY, value).await
}

/// Writes (`Some`) or removes (`None`) the pending rollout.
pub async fn write_pending_rollout(
    client: Client,
    namespace: &str,
    secret_name: &str,
    rollout: Option<&PendingRollout>,
) -> Result<(), StatusError> {
    write_json(
        client,
        namespace,
        secret_name,
        PENDING_ROLLOUT_SECRET_KEY,
        rollout,
    )
    .await
}

/// Reads the pending rollout, if any.
pub async fn read_pending_rollout(
    client: Client,
    namespace: &str,
    secret_name: &str,
) -> Result<Option<PendingRollout>, StatusError> {
    read_json(client, namespace, secret_name, PENDING_ROLLOUT_SECRET_KEY).await
}

/// The agent's view of the updater's status in Kubernetes: its shared-state Secret. The agent
/// node reads it through its update-status hook and reports it in the heartbeat (the Linux
/// agent reads the updater's `status` file the same way).
#[derive(Clone)]
pub struct SecretStatusSource {
    client: Client,
    namespace: String,
    secret_name: String,
}

impl std::fmt::Debug for SecretStatusSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretStatusSource")
            .field("namespace", &self.namespace)
            .field("secret_name", &self.secret_name)
            .finish_non_exhaustive()
    }
}

impl SecretStatusSource {
    /// Reads from Secret `namespace/secret_name` (the agent's shared-state Secret).
    pub fn new(client: Client, namespace: impl Into<String>, secret_name: impl Into<String>) -> Self {
        SecretStatusSource {
            client,
            namespace: namespace.into(),
            secret_name: secret_name.into(),
        }
    }

    /// The source the chart asks for through `SVC_KUBE_NAMESPACE` and
    /// `SVC_KUBE_SHARED_STATE_SECRET` (`env` looks a variable up): `Ok(None)` outside
    /// Kubernetes, an error when they are set but no Kubernetes API client configuration exists.
    pub async fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, kube::Error> {
        let namespace = env(super::schedule::NAMESPACE_ENV).unwrap_or_default();
        let secret = env(super::schedule::SECRET_ENV).unwrap_or_default();
        if namespace.is_empty() || secret.is_empty() {
            return Ok(None);
        }
        let client = Client::try_default().await?;
        Ok(Some(SecretStatusSource::new(client, namespace, secret)))
    }

    /// The updater's last decision; `None` before its first reconcile.
    pub async fn read(&self) -> Result<Option<UpdaterStatus>, StatusError> {
        read_update_status(self.client.clone(), &self.namespace, &self.secret_name).await
    }
}

//! The agent's host identity in Kubernetes: one Secret per replica, so a pod recreated by the
//! updater (or by anything else) comes back with the same host ID and needs no join token.
//!
//! Data flow: `svc start` in a pod → [`SecretIdentityStore::from_env`] (the chart sets
//! [`STATE_SECRET_ENV`] to `<pod name>-state` and [`NAMESPACE_ENV`] from the downward API) →
//! given to the agent node as its identity store → loaded at start; after a join with the token,
//! saved under the keys [`IDENTITY_KEY`] and [`ROLES_KEY`]. The Secret is created when missing;
//! updates carry the `resourceVersion` read, and a conflict is read again and retried.
//!
//! The identity holds private keys: it is never logged and the store's `Debug` names only the
//! Secret.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use svc_net::{
    NodeError,
    agent::node::{IdentityStore, StoredIdentity},
    auth::ClientIdentity,
};

pub use super::schedule::NAMESPACE_ENV;

/// Set by the chart: the name of this replica's identity Secret (`<pod name>-state`).
pub const STATE_SECRET_ENV: &str = "SVC_KUBE_STATE_SECRET";
/// Key of the identity Secret holding the host identity (JSON).
pub const IDENTITY_KEY: &str = "host-identity";
/// Key of the identity Secret holding the roles the identity was issued for.
pub const ROLES_KEY: &str = "host-identity-roles";
/// How many times a save is retried after a `resourceVersion` conflict.
const SAVE_ATTEMPTS: usize = 5;

/// Why the identity Secret could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretIdentityError {
    /// The API server refused or failed the request.
    #[error("{action} secret {namespace}/{name}: {source}")]
    Api {
        /// What the store was doing (`reading`, `creating`, `updating`).
        action: &'static str,
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The stored identity is not valid (its content is never shown).
    #[error("secret {namespace}/{name} key {IDENTITY_KEY}: not a host identity ({reason})")]
    Malformed {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The parser's complaint (position and kind, no content).
        reason: String,
    },
    /// Every save attempt met a concurrent change.
    #[error("secret {namespace}/{name}: still changed by someone else after {SAVE_ATTEMPTS} attempts")]
    Conflict {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
    },
}

/// Keeps the agent's host identity in Secret `namespace/name`.
#[derive(Clone)]
pub struct SecretIdentityStore {
    client: Client,
    namespace: String,
    name: String,
}

impl std::fmt::Debug for SecretIdentityStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretIdentityStore")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl SecretIdentityStore {
    /// The store in Secret `namespace/name`.
    pub fn new(client: Client, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        SecretIdentityStore {
            client,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The store the chart asks for through [`NAMESPACE_ENV`] and [`STATE_SECRET_ENV`] (`env`
    /// looks a variable up): `Ok(None)` when they are not both set (not in Kubernetes, or an
    /// install that keeps the identity on a volume), an error when they are but no Kubernetes
    /// API client configuration exists.
    pub async fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, kube::Error> {
        let namespace = env(NAMESPACE_ENV).unwrap_or_default();
        let name = env(STATE_SECRET_ENV).unwrap_or_default();
        if namespace.is_empty() || name.is_empty() {
            return Ok(None);
        }
        let client = Client::try_default().await?;
        Ok(Some(SecretIdentityStore::new(client, namespace, name)))
    }

    fn api(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn api_error(&self, action: &'static str) -> impl FnOnce(kube::Error) -> SecretIdentityError + '_ {
        move |source| SecretIdentityError::Api {
            action,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// The saved identity, if any.
    pub async fn load_identity(&self) -> Result<Option<StoredIdentity>, SecretIdentityError> {
        let secret = self
            .api()
            .get_opt(&self.name)
            .await
            .map_err(self.api_error("reading"))?;
        let Some(mut data) = secret.and_then(|s| s.data) else {
            return Ok(None);
        };
        let Some(bytes) = data.remove(IDENTITY_KEY) else {
            return Ok(None);
        };
        let identity: ClientIdentity =
            serde_json::from_slice(&bytes.0).map_err(|e| SecretIdentityError::Malformed {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                // serde_json's messages name the position and the kind of error, not the input.
                reason: format!("{:?} at line {} column {}", e.classify(), e.line(), e.column()),
            })?;
        let roles = data
            .remove(ROLES_KEY)
            .map(|r| String::from_utf8_lossy(&r.0).trim().to_owned())
            .unwrap_or_default();
        Ok(Some(StoredIdentity { identity, roles }))
    }

    /// Saves `identity` (issued for `roles`), creating the Secret when missing and keeping its
    /// other keys; a concurrent change is read again and retried.
    pub async fn save_identity(
        &self,
        identity: &ClientIdentity,
        roles: &str,
    ) -> Result<(), SecretIdentityError> {
        let json = serde_json::to_vec(identity).map_err(|e| SecretIdentityError::Malformed {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            reason: format!("{:?}", e.classify()),
        })?;
        let values = [
            (IDENTITY_KEY.to_owned(), ByteString(json)),
            (ROLES_KEY.to_owned(), ByteString(roles.as_bytes().to_vec())),
        ];
        let api = self.api();
        for _ in 0..SAVE_ATTEMPTS {
            let existing = api.get_opt(&self.name).await.map_err(self.api_error("reading"))?;
            let result = match existing {
                None => {
                    let secret = Secret {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            namespace: Some(self.namespace.clone()),
                            labels: Some(BTreeMap::from([(
                                "app.kubernetes.io/component".to_owned(),
                                "agent-state".to_owned(),
                            )])),
                            ..ObjectMeta::default()
                        },
                        data: Some(values.iter().cloned().collect()),
                        ..Secret::default()
                    };
                    api.create(&PostParams::default(), &secret)
                        .await
                        .map(drop)
                        .map_err(|e| ("creating", e))
                }
                Some(mut secret) => {
                    // The resourceVersion read is kept: a concurrent writer makes this a 409.
                    secret
                        .data
                        .get_or_insert_with(BTreeMap::new)
                        .extend(values.iter().cloned());
                    api.replace(&self.name, &PostParams::default(), &secret)
                        .await
                        .map(drop)
                        .map_err(|e| ("updating", e))
                }
            };
            match result {
                Ok(()) => return Ok(()),
                Err((_, kube::Error::Api(status))) if status.code == 409 => {
                    tracing::debug!(namespace = %self.namespace, name = %self.name, "identity secret changed concurrently; reading it again");
                }
                Err((action, source)) => return Err(self.api_error(action)(source)),
            }
        }
        Err(SecretIdentityError::Conflict {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        })
    }
}

fn node_error(store: &SecretIdentityStore, e: SecretIdentityError) -> NodeError {
    NodeError::Setup {
        what: format!("the host identity in {}", store.describe()),
        source: Box::new(e),
    }
}

#[async_trait]
impl IdentityStore for SecretIdentityStore {
    async fn load(&self) -> Result<Option<StoredIdentity>, NodeError> {
        self.load_identity().await.map_err(|e| node_error(self, e))
    }

    async fn save(&self, identity: &ClientIdentity, roles: &str) -> Result<(), NodeError> {
        self.save_identity(identity, roles)
            .await
            .map_err(|e| node_error(self, e))
    }

    fn describe(&self) -> String {
        format!("secret {}/{}", self.namespace, self.name)
    }
}

//! Where an agent keeps its host identity between starts.
//!
//! The agent joins once with `svc.auth_token`; the identity it is issued (certificates, keys,
//! the cluster's CAs) and the system roles it was issued for are saved in an [`IdentityStore`]
//! and loaded at the next start, so the token is needed once. The default store is the data
//! directory ([`DataDirIdentityStore`]: `host-identity.json` and `host-identity.roles`, private
//! files); in Kubernetes, where a recreated pod loses its filesystem, the agent keeps it in a
//! Secret of its own (`svc_update::kube::identity::SecretIdentityStore`), given with
//! [`AgentNode::identity_store`](super::AgentNode::identity_store).
//!
//! A store holds secrets: implementations never log the identity and keep it out of `Debug`.

use std::path::PathBuf;

use async_trait::async_trait;

use super::{HOST_IDENTITY_FILE, HOST_ROLES_FILE};
use crate::auth::{ClientIdentity, NodeError};

/// A saved host identity and the system roles it was issued for.
#[derive(Clone)]
pub struct StoredIdentity {
    /// The identity.
    pub identity: ClientIdentity,
    /// The roles it was issued for, comma-separated (`node,app`); empty when unknown.
    pub roles: String,
}

impl std::fmt::Debug for StoredIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredIdentity")
            .field("identity", &self.identity)
            .field("roles", &self.roles)
            .finish()
    }
}

/// Where the agent keeps its host identity.
#[async_trait]
pub trait IdentityStore: Send + Sync {
    /// The saved identity, `None` when nothing was saved yet. A saved identity that cannot be
    /// read is an error (the agent does not join again over it silently).
    async fn load(&self) -> Result<Option<StoredIdentity>, NodeError>;

    /// Saves `identity`, issued for `roles` (comma-separated), replacing what was saved.
    async fn save(&self, identity: &ClientIdentity, roles: &str) -> Result<(), NodeError>;

    /// Where the identity is kept, for logs and errors (a path, `secret ns/name`).
    fn describe(&self) -> String;
}

/// The default store: `host-identity.json` and `host-identity.roles` in the data directory,
/// written as private files in a private directory.
#[derive(Debug, Clone)]
pub struct DataDirIdentityStore {
    data_dir: PathBuf,
}

impl DataDirIdentityStore {
    /// The store in `data_dir` (`svc.data_dir`).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        DataDirIdentityStore {
            data_dir: data_dir.into(),
        }
    }

    fn identity_path(&self) -> PathBuf {
        self.data_dir.join(HOST_IDENTITY_FILE)
    }
}

#[async_trait]
impl IdentityStore for DataDirIdentityStore {
    async fn load(&self) -> Result<Option<StoredIdentity>, NodeError> {
        svc_core::fs::secure_data_dir(&self.data_dir)?;
        let path = self.identity_path();
        if !path.exists() {
            return Ok(None);
        }
        let identity = ClientIdentity::load(&path)?;
        let roles = std::fs::read_to_string(self.data_dir.join(HOST_ROLES_FILE))
            .unwrap_or_default()
            .trim()
            .to_owned();
        Ok(Some(StoredIdentity { identity, roles }))
    }

    async fn save(&self, identity: &ClientIdentity, roles: &str) -> Result<(), NodeError> {
        svc_core::fs::secure_data_dir(&self.data_dir)?;
        identity.save(&self.identity_path())?;
        svc_core::fs::write_private_file(
            &self.data_dir.join(HOST_ROLES_FILE),
            format!("{roles}\n").as_bytes(),
        )?;
        Ok(())
    }

    fn describe(&self) -> String {
        self.identity_path().display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use svc_core::Secret;

    use super::*;

    fn identity(name: &str) -> ClientIdentity {
        ClientIdentity {
            cluster: "example.test".into(),
            name: name.into(),
            auth_addr: "127.0.0.1:3025".into(),
            tls_cert_pem: String::new(),
            tls_key_pem: Secret::new("tls key material".to_owned()),
            ssh_cert: String::new(),
            ssh_key: Secret::new("ssh key material".to_owned()),
            trusted: Vec::new(),
            not_after_unix: 4_102_444_800,
        }
    }

    #[tokio::test]
    async fn the_data_directory_store_keeps_the_identity_in_private_files() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let store = DataDirIdentityStore::new(&data);
        assert!(store.load().await.unwrap().is_none());
        store
            .save(&identity("host-1.example.test"), "node,app")
            .await
            .unwrap();
        let saved = store.load().await.unwrap().expect("saved");
        assert_eq!(saved.identity.name, "host-1.example.test");
        assert_eq!(saved.identity.ssh_key.expose(), "ssh key material");
        assert_eq!(saved.roles, "node,app");
        for file in [HOST_IDENTITY_FILE, HOST_ROLES_FILE] {
            let mode = std::fs::metadata(data.join(file)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{file} is private: {mode:o}");
        }
        assert_eq!(
            store.describe(),
            data.join(HOST_IDENTITY_FILE).display().to_string()
        );
        let shown = format!("{saved:?} {store:?}");
        assert!(!shown.contains("key material"), "{shown}");
    }
}

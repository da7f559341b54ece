//! Administration on the Auth API that takes more than one call (what `tctl` does): reading a
//! resource reference, locking, inviting an agent, generating a password.

use std::time::{Duration, SystemTime};

use svc_core::Secret;
use svc_core::resource::{CLUSTER_MAINTENANCE_CONFIG_NAME, Kind, Lock, Resource, ResourceError, ResourceRef};

use super::client::{AuthClient, ClientError};

/// Why an administrative operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The Auth API call failed.
    #[error(transparent)]
    Auth(#[from] ClientError),
    /// A resource could not be encoded.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// A lock names neither a user nor a node.
    #[error("expected --user=NAME or --node=NAME")]
    NoLockTarget,
}

/// A join token with what an agent needs to join with it.
#[derive(Debug)]
pub struct Invite {
    /// The token (a secret: admits one agent).
    pub token: Secret,
    /// When it expires (Unix seconds).
    pub expires_unix: i64,
    /// The CA pin the agent checks the cluster with.
    pub ca_pin: String,
    /// Extra certificate names an agent joining with the token may ask for.
    pub extra_names: Vec<String>,
}

impl AuthClient {
    /// The resources `reference` names: `KIND/NAME`, or every resource of `KIND`. The
    /// maintenance configuration is a singleton: `KIND` alone reads it (verb `read`).
    pub async fn get_by_ref(
        &mut self,
        reference: &ResourceRef,
        with_secrets: bool,
    ) -> Result<Vec<Resource>, ClientError> {
        let name = match (&reference.name, reference.kind) {
            (None, Kind::ClusterMaintenanceConfig) => Some(CLUSTER_MAINTENANCE_CONFIG_NAME),
            (name, _) => name.as_deref(),
        };
        self.get_resources(reference.kind, name, with_secrets).await
    }

    /// Locks `user` (or, without one, `node`): new sessions and API calls are refused at once,
    /// open sessions end within a minute. With `ttl` the lock expires; without, it stays until
    /// removed. Returns the lock written (its name unlocks: `lock/<name>`).
    pub async fn lock(
        &mut self,
        user: Option<String>,
        node: Option<String>,
        message: Option<String>,
        ttl: Option<Duration>,
    ) -> Result<Lock, AdminError> {
        let lock = match (user, node) {
            (Some(user), _) => Lock::user(user, message),
            (None, Some(node)) => Lock::node(node, message),
            (None, None) => return Err(AdminError::NoLockTarget),
        };
        let lock = match ttl {
            Some(ttl) => lock.expiring_at(SystemTime::now() + ttl),
            None => lock,
        };
        let yaml = Resource::Lock(lock.clone()).to_yaml()?;
        self.put_resources(&yaml, true).await?;
        Ok(lock)
    }

    /// Creates a join token admitting `roles` (`node`, `app`, ...; default lifetime without
    /// `ttl`), with the cluster's CA pin the agent checks.
    pub async fn invite(
        &mut self,
        roles: &[String],
        ttl: Option<Duration>,
        extra_names: &[String],
    ) -> Result<Invite, ClientError> {
        let (token, expires_unix) = self.create_token_with_names(roles, ttl, extra_names).await?;
        let ca_pin = self.status().await?.ca_pin;
        Ok(Invite {
            token,
            expires_unix,
            ca_pin,
            extra_names: extra_names.to_vec(),
        })
    }
}

/// A random password for a new user: 20 characters from an alphabet without look-alikes.
pub fn generate_password() -> Secret {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::rng();
    Secret::new(
        (0..20)
            .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_passwords_use_the_alphabet() {
        let p = generate_password();
        assert_eq!(p.expose().len(), 20);
        assert!(
            p.expose()
                .chars()
                .all(|c| c.is_ascii_alphanumeric() && !"l1IO0".contains(c))
        );
    }
}

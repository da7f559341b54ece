//! Resources in the backend: `/resources/<kind>/<name>` holding the resource as JSON, the
//! backend revision becoming `metadata.revision` on the way out.

use std::time::{Duration, SystemTime};

use super::AuthError;
use crate::backend::{Backend, Item, Key, KeyRange, Revision};
use crate::resource::{Kind, Resource, parse_resource};

/// What a spent join token is replaced with until it expires: a second join with it is refused
/// as "already used" rather than "invalid".
pub(super) const USED_TOKEN: &[u8] = b"used";

/// How long an expired join token stays stored (see [`encode`]).
const EXPIRED_TOKEN_GRACE: Duration = Duration::from_secs(3600);

pub(super) struct Store<'a> {
    backend: &'a dyn Backend,
}

pub(super) fn key(kind: Kind, name: &str) -> Key {
    Key::from_segments(["resources", kind.as_str(), name])
}

/// Decodes a stored resource and sets its revision from the backend's.
pub(super) fn decode(item: &Item) -> Result<Resource, AuthError> {
    let text = std::str::from_utf8(&item.value).map_err(|e| AuthError::Corrupt {
        what: "resource",
        reason: e.to_string(),
    })?;
    let mut resource = parse_resource(text)?;
    resource.set_revision(Some(item.revision.into()));
    Ok(resource)
}

fn encode(resource: &Resource) -> Result<Item, AuthError> {
    let mut copy = resource.clone();
    // The backend keeps the revision; a stale one inside the value would only mislead.
    copy.set_revision(None);
    let mut item = Item::new(
        key(resource.kind(), resource.name()),
        copy.to_json()?.into_bytes(),
    );
    if let Some(expires) = resource.expires() {
        // A token is kept a while past its expiry so that a late agent hears "expired" rather
        // than "invalid"; readers check the resource's own expiry.
        let grace = if resource.kind() == Kind::Token {
            EXPIRED_TOKEN_GRACE
        } else {
            Duration::ZERO
        };
        item = item.with_expiry(SystemTime::from(expires) + grace);
    }
    Ok(item)
}

impl<'a> Store<'a> {
    pub(super) fn new(backend: &'a dyn Backend) -> Self {
        Self { backend }
    }

    pub(super) async fn get_item(&self, kind: Kind, name: &str) -> Result<Option<Item>, AuthError> {
        if name.is_empty() || name.contains('/') {
            return Ok(None);
        }
        Ok(self.backend.get(&key(kind, name)).await?)
    }

    pub(super) async fn get(&self, kind: Kind, name: &str) -> Result<Option<Resource>, AuthError> {
        match self.get_item(kind, name).await? {
            Some(item) if item.value == USED_TOKEN => Ok(None),
            Some(item) => decode(&item).map(Some),
            None => Ok(None),
        }
    }

    pub(super) async fn list(&self, kind: Kind) -> Result<Vec<Resource>, AuthError> {
        let prefix = Key::from(format!("/resources/{}/", kind.as_str()));
        self.backend
            .range(&KeyRange::prefix(prefix))
            .await?
            .iter()
            .filter(|item| item.value != USED_TOKEN)
            .map(decode)
            .collect()
    }

    pub(super) async fn create(&self, resource: &Resource) -> Result<Revision, AuthError> {
        self.backend.create(encode(resource)?).await.map_err(|e| match e {
            crate::backend::BackendError::AlreadyExists { .. } => {
                AuthError::AlreadyExists(resource.to_string())
            }
            other => other.into(),
        })
    }

    pub(super) async fn swap(&self, expected: Revision, resource: &Resource) -> Result<Revision, AuthError> {
        self.backend
            .compare_and_swap(expected, encode(resource)?)
            .await
            .map_err(|e| match e {
                crate::backend::BackendError::RevisionMismatch { expected, found, .. } => {
                    AuthError::Conflict {
                        what: resource.to_string(),
                        expected: expected.to_string(),
                        found: found.to_string(),
                    }
                }
                other => other.into(),
            })
    }

    pub(super) async fn delete(&self, kind: Kind, name: &str) -> Result<(), AuthError> {
        if name.is_empty() || name.contains('/') {
            return Err(AuthError::NotFound(format!("{kind}/{name}")));
        }
        self.backend.delete(&key(kind, name)).await?;
        Ok(())
    }
}

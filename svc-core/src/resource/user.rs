//! The `user` resource (version `v2`): a local user, its roles and its traits.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Invalid, Kind, KindResource, Metadata, invalid};

/// The trait that lists a user's OS logins.
pub const LOGINS_TRAIT: &str = "logins";

/// A local user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name.
    pub metadata: Metadata,
    /// Roles and traits.
    pub spec: UserSpec,
}

/// `spec` of a user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSpec {
    /// Names of the roles the user holds (`tctl users update --set-roles` replaces them).
    #[serde(default)]
    pub roles: Vec<String>,
    /// Traits: name → values, such as `logins: [root, ubuntu]`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub traits: BTreeMap<String, Vec<String>>,
}

impl User {
    /// A user with the given roles and no traits.
    pub fn new<R: Into<String>>(name: impl Into<String>, roles: impl IntoIterator<Item = R>) -> Self {
        Self {
            metadata: Metadata::new(name.into()),
            spec: UserSpec {
                roles: roles.into_iter().map(Into::into).collect(),
                traits: BTreeMap::new(),
            },
        }
    }

    /// The user's OS logins (the `logins` trait), as fed to the `access` preset role.
    pub fn logins(&self) -> &[String] {
        self.spec
            .traits
            .get(LOGINS_TRAIT)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

impl KindResource for User {
    const KIND: Kind = Kind::User;
    type Name = String;
    type Spec = UserSpec;

    fn from_parts(metadata: Metadata, spec: UserSpec) -> Result<Self, Invalid> {
        if let Some(i) = spec.roles.iter().position(|r| r.trim().is_empty()) {
            return Err(invalid(
                format!("spec.roles[{i}]"),
                "expected a role name, got an empty string",
            ));
        }
        for (name, values) in &spec.traits {
            if name.trim().is_empty() {
                return Err(invalid(
                    "spec.traits",
                    "expected a trait name, got an empty string",
                ));
            }
            if let Some(i) = values.iter().position(|v| v.is_empty()) {
                return Err(invalid(
                    format!("spec.traits.{name}[{i}]"),
                    "expected a value, got an empty string",
                ));
            }
        }
        Ok(Self { metadata, spec })
    }

    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn spec(&self) -> &UserSpec {
        &self.spec
    }
}

//! The `token` resource (version `v2`): a join token an agent presents to join the cluster.
//!
//! As in the original, the token's name *is* its secret value, so the name is held in a
//! [`Secret`] and never printed.

use std::{fmt, time::SystemTime};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Invalid, Kind, KindResource, Metadata, invalid};
use crate::Secret;

/// A join token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// `name` is the secret token value; `expires` its expiry.
    pub metadata: Metadata<Secret>,
    /// What the token lets an agent join as.
    pub spec: TokenSpec,
}

/// `spec` of a join token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    /// The services an agent joining with this token may run.
    pub roles: Vec<JoinRole>,
    /// How the agent proves it holds the token.
    #[serde(default)]
    pub join_method: JoinMethod,
}

/// A service an agent may join as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum JoinRole {
    /// SSH Service.
    Node,
    /// Application Service.
    App,
    /// Database Service.
    Db,
    /// Kubernetes Service.
    Kube,
    /// Windows Desktop Service.
    WindowsDesktop,
    /// Proxy Service.
    Proxy,
}

impl JoinRole {
    /// Every role, in the order error messages list them.
    pub const ALL: [JoinRole; 6] = [
        JoinRole::Node,
        JoinRole::App,
        JoinRole::Db,
        JoinRole::Kube,
        JoinRole::WindowsDesktop,
        JoinRole::Proxy,
    ];

    /// The name written in `spec.roles`.
    pub const fn as_str(self) -> &'static str {
        match self {
            JoinRole::Node => "node",
            JoinRole::App => "app",
            JoinRole::Db => "db",
            JoinRole::Kube => "kube",
            JoinRole::WindowsDesktop => "windows_desktop",
            JoinRole::Proxy => "proxy",
        }
    }
}

impl fmt::Display for JoinRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for JoinRole {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for JoinRole {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        JoinRole::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = JoinRole::ALL.iter().map(|r| r.as_str()).collect();
                serde::de::Error::custom(format!(
                    "unknown join role \"{s}\", expected one of: {}",
                    all.join(", ")
                ))
            })
    }
}

/// How an agent proves it holds the token. Only the shared-secret method exists so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JoinMethod {
    /// The agent presents the token value.
    #[default]
    Token,
}

impl Token {
    /// A token with the given value, roles and expiry.
    pub fn new(
        value: Secret,
        roles: impl IntoIterator<Item = JoinRole>,
        expires: Option<time::OffsetDateTime>,
    ) -> Self {
        let mut metadata = Metadata::new(value);
        metadata.expires = expires;
        Self {
            metadata,
            spec: TokenSpec {
                roles: roles.into_iter().collect(),
                join_method: JoinMethod::Token,
            },
        }
    }

    /// The secret token value.
    pub fn value(&self) -> &Secret {
        &self.metadata.name
    }

    /// Whether the token has expired at `now`; an expired token admits nobody.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.metadata.is_expired(now)
    }

    /// Whether the token lets an agent join as `role`.
    pub fn allows(&self, role: JoinRole) -> bool {
        self.spec.roles.contains(&role)
    }
}

impl KindResource for Token {
    const KIND: Kind = Kind::Token;
    type Name = Secret;
    type Spec = TokenSpec;

    fn from_parts(metadata: Metadata<Secret>, spec: TokenSpec) -> Result<Self, Invalid> {
        if spec.roles.is_empty() {
            let all: Vec<&str> = JoinRole::ALL.iter().map(|r| r.as_str()).collect();
            return Err(invalid(
                "spec.roles",
                format!("expected at least one of: {}", all.join(", ")),
            ));
        }
        Ok(Self { metadata, spec })
    }

    fn metadata(&self) -> &Metadata<Secret> {
        &self.metadata
    }

    fn spec(&self) -> &TokenSpec {
        &self.spec
    }
}

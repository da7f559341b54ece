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
    /// Extra certificate names (`additional_names`) an agent joining with this token may ask
    /// for, exact host names compared case-insensitively; never a wildcard. Empty (the
    /// default): none beyond what the Auth Service's configuration grants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_names: Vec<String>,
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
                extra_names: Vec::new(),
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

    /// The token with `names` as the extra certificate names it grants
    /// ([`TokenSpec::extra_names`]).
    pub fn with_extra_names(mut self, names: Vec<String>) -> Self {
        self.spec.extra_names = names;
        self
    }

    /// Whether the token lets an agent join as `role`.
    pub fn allows(&self, role: JoinRole) -> bool {
        self.spec.roles.contains(&role)
    }
}

/// Why `name` cannot be an extra certificate name a token grants, if it cannot: names are
/// exact host names (letters, digits, `-`, `.`, `_`) or IP addresses, never wildcards.
pub fn extra_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("expected a host name, found an empty string");
    }
    if name.contains('*') {
        return Some("wildcard certificate names are not allowed");
    }
    if name.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    if name.len() > 253
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Some("expected a host name of letters, digits, '-', '.' and '_'");
    }
    None
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
        for name in &spec.extra_names {
            if let Some(why) = extra_name_problem(name) {
                return Err(invalid("spec.extra_names", format!("{name:?}: {why}")));
            }
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

#[cfg(test)]
mod tests {
    use super::super::{Resource, parse_resources};

    #[test]
    fn a_token_resource_grants_exact_extra_names_only() {
        let yaml = |names: &str| {
            format!(
                "kind: token\nversion: v2\nmetadata:\n  name: abc\nspec:\n  roles: [node]\n  extra_names: {names}\n"
            )
        };
        let parsed = parse_resources(&yaml("[edge-1.internal, 10.0.0.7]")).unwrap();
        let [Resource::Token(t)] = &parsed[..] else {
            panic!("one token: {parsed:?}")
        };
        assert_eq!(t.spec.extra_names, ["edge-1.internal", "10.0.0.7"]);
        for (names, why) in [
            ("['*.example.com']", "wildcard certificate names are not allowed"),
            ("['a/b']", "expected a host name"),
            ("['']", "expected a host name"),
        ] {
            let err = parse_resources(&yaml(names)).unwrap_err().to_string();
            assert!(
                err.contains("spec.extra_names") && err.contains(why),
                "{names}: {err}"
            );
        }
        // Without the field: none, and it is not written back.
        let parsed = parse_resources(&yaml("[]").replace("  extra_names: []\n", "")).unwrap();
        let [Resource::Token(t)] = &parsed[..] else {
            panic!("one token")
        };
        assert!(t.spec.extra_names.is_empty());
        assert!(!serde_json::to_string(&t.spec).unwrap().contains("extra_names"));
    }
}

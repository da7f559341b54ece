//! The `lock` resource (version `v2`): refuses a user or a node everywhere, at once.
//!
//! A lock names exactly one target, a user or a node (`tctl lock --user=NAME` /
//! `--node=NAME`). While it exists and has not expired (`metadata.expires`), the Auth Service
//! refuses every call made with the user's certificates and every SSH session of the user, or
//! to the node; proxies and nodes re-check open sessions and close the locked ones.

use serde::{Deserialize, Serialize};

use super::{Invalid, Kind, KindResource, Metadata, invalid};

/// A lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// The lock's name (`tctl lock` uses `user-NAME` or `node-NAME`); `expires` ends it.
    pub metadata: Metadata,
    /// What is locked and why.
    pub spec: LockSpec,
}

/// `spec` of a lock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockSpec {
    /// The one user or node locked.
    pub target: LockTarget,
    /// Shown to the locked user when a session is refused or closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `spec.target`: exactly one of `user` and `node`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockTarget {
    /// A user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// A node: its node name, host ID or UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl Lock {
    /// A lock on the user `name`, named `user-NAME`.
    pub fn user(name: impl Into<String>, message: Option<String>) -> Self {
        let name = name.into();
        Self {
            metadata: Metadata::new(format!("user-{name}")),
            spec: LockSpec {
                target: LockTarget {
                    user: Some(name),
                    node: None,
                },
                message,
            },
        }
    }

    /// A lock on the node `name` (node name, host ID or UUID), named `node-NAME`.
    pub fn node(name: impl Into<String>, message: Option<String>) -> Self {
        let name = name.into();
        Self {
            metadata: Metadata::new(format!("node-{name}")),
            spec: LockSpec {
                target: LockTarget {
                    user: None,
                    node: Some(name),
                },
                message,
            },
        }
    }

    /// The same lock, ending at `at` (`tctl lock --ttl`).
    pub fn expiring_at(mut self, at: std::time::SystemTime) -> Self {
        self.metadata.expires = Some(time::OffsetDateTime::from(at));
        self
    }

    /// Whether the lock targets the user `name`.
    pub fn locks_user(&self, name: &str) -> bool {
        self.spec.target.user.as_deref() == Some(name)
    }

    /// Whether the lock targets a node known by any of `names` (node name, host ID, UUID).
    pub fn locks_node(&self, names: &[&str]) -> bool {
        self.spec
            .target
            .node
            .as_deref()
            .is_some_and(|n| names.iter().any(|name| name.eq_ignore_ascii_case(n)))
    }

    /// `user "bob"` or `node "db-1"`: the target as refusals name it.
    pub fn target_text(&self) -> String {
        match (&self.spec.target.user, &self.spec.target.node) {
            (Some(user), _) => format!("user \"{user}\""),
            (None, Some(node)) => format!("node \"{node}\""),
            (None, None) => "nothing".into(),
        }
    }
}

impl KindResource for Lock {
    const KIND: Kind = Kind::Lock;
    type Name = String;
    type Spec = LockSpec;

    fn from_parts(metadata: Metadata, spec: LockSpec) -> Result<Self, Invalid> {
        let target = &spec.target;
        match (&target.user, &target.node) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "spec.target",
                    "expected exactly one of user and node, got both",
                ));
            }
            (None, None) => {
                return Err(invalid(
                    "spec.target",
                    "expected exactly one of user and node, got neither",
                ));
            }
            (Some(v), None) | (None, Some(v)) if v.trim().is_empty() || v.contains('*') => {
                let field = if target.user.is_some() { "user" } else { "node" };
                return Err(invalid(
                    format!("spec.target.{field}"),
                    format!("expected a name without wildcards, got \"{v}\""),
                ));
            }
            _ => {}
        }
        if let Some(m) = &spec.message
            && m.chars().any(|c| c.is_control() && c != '\n')
        {
            return Err(invalid(
                "spec.message",
                "expected text without control characters",
            ));
        }
        Ok(Self { metadata, spec })
    }

    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn spec(&self) -> &LockSpec {
        &self.spec
    }
}

#[cfg(test)]
mod tests {
    use crate::resource::{Resource, parse_resource, parse_resources};

    #[test]
    fn exactly_one_target() {
        let ok = "kind: lock\nversion: v2\nmetadata: {name: user-bob}\nspec:\n  target: {user: bob}\n  message: incident 42\n";
        let Resource::Lock(lock) = parse_resource(ok).unwrap() else {
            panic!("not a lock")
        };
        assert!(lock.locks_user("bob"));
        assert!(!lock.locks_node(&["bob"]));
        assert_eq!(lock.target_text(), "user \"bob\"");
        let both = ok.replace("{user: bob}", "{user: bob, node: n1}");
        assert_eq!(
            parse_resources(&both).unwrap_err().to_string(),
            "spec.target: expected exactly one of user and node, got both"
        );
        let none = ok.replace("{user: bob}", "{}");
        assert_eq!(
            parse_resources(&none).unwrap_err().to_string(),
            "spec.target: expected exactly one of user and node, got neither"
        );
        let wild = ok.replace("{user: bob}", "{node: \"*\"}");
        assert_eq!(
            parse_resources(&wild).unwrap_err().to_string(),
            "spec.target.node: expected a name without wildcards, got \"*\""
        );
    }

    #[test]
    fn round_trips() {
        let r = Resource::Lock(super::Lock::node("db-1", Some("maintenance".into())));
        assert_eq!(parse_resource(&r.to_yaml().unwrap()).unwrap(), r);
        assert_eq!(r.name(), "node-db-1");
    }
}

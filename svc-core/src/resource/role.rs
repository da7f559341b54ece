//! The `role` resource (version `v7`): what a user may do, evaluated by [`crate::rbac`].

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Invalid, Kind, KindResource, Metadata, invalid};
use crate::rbac::{RULE_RESOURCES, Verb};

/// A role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// Name and labels.
    pub metadata: Metadata,
    /// What the role allows and denies.
    pub spec: RoleSpec,
}

/// `spec` of a role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSpec {
    /// What the role grants.
    #[serde(default)]
    pub allow: RoleConditions,
    /// What the role takes away; deny beats allow across all of a user's roles.
    #[serde(default)]
    pub deny: RoleConditions,
    /// Session options (SSH port and agent forwarding).
    #[serde(default, skip_serializing_if = "RoleOptions::is_unset")]
    pub options: RoleOptions,
}

/// `spec.options` of a role: what an SSH session may do besides running programs. An option a
/// role leaves out takes its default; across a user's roles, a `false` wins for
/// `port_forwarding` and a `true` is needed (and no `false`) for `forward_agent`
/// ([`RoleSet::ssh_permits`](crate::rbac::RoleSet::ssh_permits)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleOptions {
    /// TCP port forwarding over SSH (`ssh -L`, `-R`, `-D`); default: allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_forwarding: Option<bool>,
    /// SSH agent forwarding (`ssh -A`); default: not allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_agent: Option<bool>,
}

impl RoleOptions {
    /// Whether no option is set.
    pub fn is_unset(&self) -> bool {
        self.port_forwarding.is_none() && self.forward_agent.is_none()
    }
}

/// `spec.allow` or `spec.deny`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConditions {
    /// Access to resources through the API (`tctl`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// OS logins on SSH nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logins: Vec<String>,
    /// Which SSH nodes, by label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: LabelSelector,
    /// Which applications, by label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub app_labels: LabelSelector,
    /// Which databases, by label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub db_labels: LabelSelector,
    /// Which database users (`*` matches any run of characters; `*` alone, every user).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub db_users: Vec<String>,
    /// Which database names (`*` wildcards as in `db_users`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub db_names: Vec<String>,
    /// Which Kubernetes clusters, by label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kubernetes_labels: LabelSelector,
    /// Which Windows desktops, by label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub windows_desktop_labels: LabelSelector,
}

/// One API access rule: these verbs on these resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Resource names ([`RULE_RESOURCES`]) or `*`.
    pub resources: Vec<String>,
    /// Verbs, or `*`.
    pub verbs: Vec<Verb>,
}

impl Rule {
    /// A rule granting `verbs` on `resources`.
    pub fn new<R: Into<String>>(
        resources: impl IntoIterator<Item = R>,
        verbs: impl IntoIterator<Item = Verb>,
    ) -> Self {
        Self {
            resources: resources.into_iter().map(Into::into).collect(),
            verbs: verbs.into_iter().collect(),
        }
    }
}

/// A label selector: label key (or `*`) → accepted values (or `*`).
pub type LabelSelector = BTreeMap<String, LabelValues>;

/// The accepted values of one label, written as a single string or a list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelValues(pub Vec<String>);

impl LabelValues {
    /// The wildcard, `*`.
    pub fn any() -> Self {
        Self(vec!["*".to_owned()])
    }
}

impl<S: Into<String>> FromIterator<S> for LabelValues {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        Self(iter.into_iter().map(Into::into).collect())
    }
}

impl Serialize for LabelValues {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => serializer.serialize_str(one),
            many => many.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for LabelValues {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "a label value or a list of label values")]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(deserializer)? {
            OneOrMany::One(v) => LabelValues(vec![v]),
            OneOrMany::Many(v) => LabelValues(v),
        })
    }
}

impl Role {
    /// A role with an empty spec.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            metadata: Metadata::new(name.into()),
            spec: RoleSpec::default(),
        }
    }

    fn validate(&self) -> Result<(), Invalid> {
        for (side, cond) in [("allow", &self.spec.allow), ("deny", &self.spec.deny)] {
            for (i, rule) in cond.rules.iter().enumerate() {
                let path = format!("spec.{side}.rules[{i}]");
                if rule.resources.is_empty() {
                    return Err(invalid(
                        format!("{path}.resources"),
                        "expected at least one resource",
                    ));
                }
                for (j, r) in rule.resources.iter().enumerate() {
                    if r != "*" && !RULE_RESOURCES.contains(&r.as_str()) {
                        return Err(invalid(
                            format!("{path}.resources[{j}]"),
                            format!(
                                "unknown resource \"{r}\", expected \"*\" or one of: {}",
                                RULE_RESOURCES.join(", ")
                            ),
                        ));
                    }
                }
                if rule.verbs.is_empty() {
                    return Err(invalid(format!("{path}.verbs"), "expected at least one verb"));
                }
            }
            if let Some(i) = cond.logins.iter().position(|l| l.trim().is_empty()) {
                return Err(invalid(
                    format!("spec.{side}.logins[{i}]"),
                    "expected a login, got an empty string",
                ));
            }
            for (field, names) in [("db_users", &cond.db_users), ("db_names", &cond.db_names)] {
                if let Some(i) = names.iter().position(|n| n.trim().is_empty()) {
                    return Err(invalid(
                        format!("spec.{side}.{field}[{i}]"),
                        "expected a name or a wildcard pattern, got an empty string",
                    ));
                }
            }
            for (field, selector) in [
                ("node_labels", &cond.node_labels),
                ("app_labels", &cond.app_labels),
                ("db_labels", &cond.db_labels),
                ("kubernetes_labels", &cond.kubernetes_labels),
                ("windows_desktop_labels", &cond.windows_desktop_labels),
            ] {
                for (key, values) in selector {
                    if values.0.is_empty() {
                        return Err(invalid(
                            format!("spec.{side}.{field}.{key}"),
                            "expected a label value or a non-empty list of values",
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

impl KindResource for Role {
    const KIND: Kind = Kind::Role;
    type Name = String;
    type Spec = RoleSpec;

    fn from_parts(metadata: Metadata, spec: RoleSpec) -> Result<Self, Invalid> {
        let role = Role { metadata, spec };
        role.validate()?;
        Ok(role)
    }

    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn spec(&self) -> &RoleSpec {
        &self.spec
    }
}

//! Role-based access control: what a signed-in user may do, decided from their roles.
//!
//! Data flow: the Auth Service loads the roles named in a user's certificate into a [`RoleSet`],
//! then asks [`RoleSet::check`] before every API call on a resource (`tctl create`, `get`, …),
//! [`RoleSet::logins`] when issuing SSH certificates, and [`RoleSet::labels_allowed`] before
//! showing or dialing a node, app, database, Kubernetes cluster or desktop. Deny always beats
//! allow, across all roles.
//!
//! The preset roles ([`preset_editor`], [`preset_access`], [`preset_auditor`]) deliberately do not
//! grant anything on `cluster_maintenance_config`: the specification (§2.4) requires an
//! administrator to create a role for it.

use std::{collections::BTreeMap, collections::BTreeSet, fmt};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::resource::{LabelSelector, LabelValues, Role, RoleConditions, Rule};

/// The resource names a rule may list, besides `*`: every resource kind plus the read-only
/// views and the resources agents serve.
pub const RULE_RESOURCES: &[&str] = &[
    "role",
    "cluster_maintenance_config",
    "user",
    "github",
    "saml",
    "oidc",
    "token",
    "lock",
    "inventory",
    "cluster_status",
    "node",
    "app",
    "db",
    "kube_cluster",
    "windows_desktop",
];

/// Name of the preset `editor` role.
pub const EDITOR_ROLE: &str = "editor";
/// Name of the preset `access` role.
pub const ACCESS_ROLE: &str = "access";
/// Name of the preset `auditor` role.
pub const AUDITOR_ROLE: &str = "auditor";

/// An action on a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Verb {
    /// `create`
    Create,
    /// `read`
    Read,
    /// `list`
    List,
    /// `update`
    Update,
    /// `delete`
    Delete,
    /// `*`: every verb.
    All,
}

impl Verb {
    /// Every verb, in the order error messages list them.
    pub const ALL: [Verb; 6] = [
        Verb::Create,
        Verb::Read,
        Verb::List,
        Verb::Update,
        Verb::Delete,
        Verb::All,
    ];

    /// The name written in rules.
    pub const fn as_str(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Read => "read",
            Verb::List => "list",
            Verb::Update => "update",
            Verb::Delete => "delete",
            Verb::All => "*",
        }
    }

    /// Whether a rule listing `self` covers a request for `requested`.
    fn covers(self, requested: Verb) -> bool {
        self == Verb::All || self == requested
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Verb {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Verb::ALL.into_iter().find(|v| v.as_str() == s).ok_or_else(|| {
            let all: Vec<&str> = Verb::ALL.iter().map(|v| v.as_str()).collect();
            format!("unknown verb \"{s}\", expected one of: {}", all.join(", "))
        })
    }
}

impl Serialize for Verb {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Verb {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A refused action. The message names the verb and the resource, never the caller's secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("access denied to perform action \"{verb}\" on \"{resource}\"")]
pub struct AccessDenied {
    /// The verb asked for.
    pub verb: Verb,
    /// The resource kind asked about.
    pub resource: String,
}

/// Which label selector of a role applies to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LabelKind {
    /// SSH nodes: `node_labels`.
    Node,
    /// Applications: `app_labels`.
    App,
    /// Databases: `db_labels`.
    Db,
    /// Kubernetes clusters: `kubernetes_labels`.
    Kubernetes,
    /// Windows desktops: `windows_desktop_labels`.
    WindowsDesktop,
}

impl LabelKind {
    /// The selector of `conditions` that applies to this kind.
    pub fn selector(self, conditions: &RoleConditions) -> &LabelSelector {
        match self {
            LabelKind::Node => &conditions.node_labels,
            LabelKind::App => &conditions.app_labels,
            LabelKind::Db => &conditions.db_labels,
            LabelKind::Kubernetes => &conditions.kubernetes_labels,
            LabelKind::WindowsDesktop => &conditions.windows_desktop_labels,
        }
    }
}

/// Whether `labels` satisfy `selector`.
///
/// Every key of the selector must match (AND); a key matches when the resource has that label
/// with one of the listed values, or the list holds `*` (any value, label present). The selector
/// `{"*": "*"}` matches every resource, labelled or not. An empty selector matches nothing, so a
/// role that says nothing about a kind grants nothing on it.
pub(crate) fn matches_labels(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    if selector.is_empty() {
        return false;
    }
    selector.iter().all(|(key, LabelValues(values))| {
        let any = values.iter().any(|v| v == "*");
        if key == "*" {
            return any;
        }
        match labels.get(key) {
            Some(actual) => any || values.iter().any(|v| v == actual),
            None => false,
        }
    })
}

/// The roles of one user, evaluated together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleSet {
    roles: Vec<Role>,
}

fn rule_matches(rule: &Rule, verb: Verb, resource: &str) -> bool {
    rule.resources.iter().any(|r| r == "*" || r == resource) && rule.verbs.iter().any(|v| v.covers(verb))
}

impl RoleSet {
    /// Evaluates these roles together.
    pub fn new(roles: impl IntoIterator<Item = Role>) -> Self {
        Self {
            roles: roles.into_iter().collect(),
        }
    }

    /// The roles, in the order given.
    pub fn roles(&self) -> &[Role] {
        &self.roles
    }

    /// The role names, in the order given.
    pub fn names(&self) -> Vec<&str> {
        self.roles.iter().map(|r| r.metadata.name.as_str()).collect()
    }

    /// Whether `verb` on `resource` (a kind name such as `cluster_maintenance_config`) is allowed:
    /// some role's allow rule covers it and no role's deny rule does.
    ///
    /// `resource` is a [`Kind`](crate::resource::Kind) or any name of [`RULE_RESOURCES`].
    pub fn check(&self, verb: Verb, resource: impl AsRef<str>) -> Result<(), AccessDenied> {
        let resource = resource.as_ref();
        let denied = self
            .roles
            .iter()
            .flat_map(|r| &r.spec.deny.rules)
            .any(|rule| rule_matches(rule, verb, resource));
        let allowed = self
            .roles
            .iter()
            .flat_map(|r| &r.spec.allow.rules)
            .any(|rule| rule_matches(rule, verb, resource));
        if allowed && !denied {
            Ok(())
        } else {
            Err(AccessDenied {
                verb,
                resource: resource.to_owned(),
            })
        }
    }

    /// [`check`](Self::check) as a boolean.
    pub fn allows(&self, verb: Verb, resource: impl AsRef<str>) -> bool {
        self.check(verb, resource).is_ok()
    }

    /// The OS logins granted: the union of all allowed logins minus every denied one (a denied
    /// `*` removes them all).
    pub fn logins(&self) -> BTreeSet<String> {
        let denied: BTreeSet<&str> = self
            .roles
            .iter()
            .flat_map(|r| &r.spec.deny.logins)
            .map(String::as_str)
            .collect();
        if denied.contains("*") {
            return BTreeSet::new();
        }
        self.roles
            .iter()
            .flat_map(|r| &r.spec.allow.logins)
            .filter(|l| !denied.contains(l.as_str()))
            .cloned()
            .collect()
    }

    /// Whether a resource of `kind` carrying `labels` is accessible: some role's allow selector
    /// matches and no role's deny selector does.
    pub fn labels_allowed(&self, kind: LabelKind, labels: &BTreeMap<String, String>) -> bool {
        let denied = self
            .roles
            .iter()
            .any(|r| matches_labels(kind.selector(&r.spec.deny), labels));
        !denied
            && self
                .roles
                .iter()
                .any(|r| matches_labels(kind.selector(&r.spec.allow), labels))
    }
}

/// Why a user may not open an SSH session on a node. The message names the node, the login
/// and the reason; it never carries the user's certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeAccessDenied {
    /// A deny `node_labels` selector of one of the user's roles matches the node's labels
    /// (deny beats allow).
    #[error("access denied to node \"{node}\": role {role} of user {user} denies its labels")]
    LabelsDenied {
        /// The node asked for.
        node: String,
        /// The user.
        user: String,
        /// The role whose deny selector matched.
        role: String,
    },
    /// No role of the user has an allow `node_labels` selector matching the node's labels.
    #[error("access denied to node \"{node}\": the roles of user {user} do not allow its labels")]
    LabelsNotAllowed {
        /// The node asked for.
        node: String,
        /// The user.
        user: String,
    },
    /// The login is not one the user's certificate grants, or a role denies it.
    #[error(
        "access denied to node \"{node}\" as login \"{login}\": the roles of user {user} do not allow this login"
    )]
    LoginNotAllowed {
        /// The node asked for.
        node: String,
        /// The OS login asked for.
        login: String,
        /// The user.
        user: String,
    },
}

/// One SSH session request, as RBAC sees it: who, with which granted logins, to which node
/// (with the labels it announced or is configured with), as which login.
#[derive(Debug, Clone, Copy)]
pub struct NodeAccess<'a> {
    /// The user name.
    pub user: &'a str,
    /// The logins the user's certificate grants (its SSH principals).
    pub granted_logins: &'a [String],
    /// The node's name, for the refusal message.
    pub node: &'a str,
    /// The node's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// The OS login asked for.
    pub login: &'a str,
}

impl RoleSet {
    /// Whether `login` is denied by a role (`deny.logins` naming it, or `*`).
    /// What SSH sessions may do besides running programs, from the roles' options: port
    /// forwarding unless some role sets `port_forwarding: false` (the default is allowed, as
    /// in Teleport); agent forwarding only when some role sets `forward_agent: true` and none
    /// sets it `false`.
    pub fn ssh_permits(&self) -> crate::identity::SshPermits {
        let options = || self.roles.iter().map(|r| &r.spec.options);
        crate::identity::SshPermits {
            port_forwarding: !options().any(|o| o.port_forwarding == Some(false)),
            agent_forwarding: options().any(|o| o.forward_agent == Some(true))
                && !options().any(|o| o.forward_agent == Some(false)),
        }
    }

    pub(crate) fn login_denied(&self, login: &str) -> bool {
        self.roles
            .iter()
            .flat_map(|r| &r.spec.deny.logins)
            .any(|l| l == "*" || l == login)
    }

    /// The one rule for SSH access to a node, shared by the proxy (before it dials) and the
    /// node (before it starts anything): the node's labels must match an allow `node_labels`
    /// selector of some role and no deny selector of any role (deny beats allow), and the login
    /// must be granted by the certificate and denied by no role.
    pub fn check_node(&self, req: &NodeAccess<'_>) -> Result<(), NodeAccessDenied> {
        if let Some(role) = self
            .roles
            .iter()
            .find(|r| matches_labels(LabelKind::Node.selector(&r.spec.deny), req.labels))
        {
            return Err(NodeAccessDenied::LabelsDenied {
                node: req.node.to_owned(),
                user: req.user.to_owned(),
                role: role.metadata.name.clone(),
            });
        }
        if !self
            .roles
            .iter()
            .any(|r| matches_labels(LabelKind::Node.selector(&r.spec.allow), req.labels))
        {
            return Err(NodeAccessDenied::LabelsNotAllowed {
                node: req.node.to_owned(),
                user: req.user.to_owned(),
            });
        }
        if !req.granted_logins.iter().any(|l| l == req.login) || self.login_denied(req.login) {
            return Err(NodeAccessDenied::LoginNotAllowed {
                node: req.node.to_owned(),
                login: req.login.to_owned(),
                user: req.user.to_owned(),
            });
        }
        Ok(())
    }
}

/// Why a user may not reach a database as a database user or name. The message names the
/// database, the database user or name, and the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DbAccessDenied {
    /// No role allows this database user, or a role denies it.
    #[error(
        "access denied to db \"{db}\" as database user \"{db_user}\": the roles of user {user} do not allow it"
    )]
    User {
        /// The database.
        db: String,
        /// The database user asked for.
        db_user: String,
        /// The user.
        user: String,
    },
    /// No role allows this database name, or a role denies it.
    #[error(
        "access denied to db \"{db}\" database name \"{db_name}\": the roles of user {user} do not allow it"
    )]
    Name {
        /// The database.
        db: String,
        /// The database name asked for.
        db_name: String,
        /// The user.
        user: String,
    },
}

/// Whether `value` matches `pattern`, where `*` matches any run of characters (none included).
pub fn wildcard_match(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*` at all: the whole value must be the pattern.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl RoleSet {
    /// Whether `value` is allowed by the `field` lists (`db_users` or `db_names`) of these
    /// roles: some allow pattern matches and no deny pattern does.
    fn db_value_allowed(&self, field: fn(&RoleConditions) -> &Vec<String>, value: &str) -> bool {
        let matches = |c: &RoleConditions| field(c).iter().any(|p| wildcard_match(p, value));
        !self.roles.iter().any(|r| matches(&r.spec.deny)) && self.roles.iter().any(|r| matches(&r.spec.allow))
    }

    /// The rule for a database session, shared by the Auth Service (before it signs a database
    /// certificate) and the proxy (before it dials): `db_user` must be allowed by some role's
    /// `db_users` and denied by none (deny beats allow); likewise `db_name` with `db_names`
    /// when the protocol has database names (`None`: not checked).
    pub fn check_db(
        &self,
        user: &str,
        db: &str,
        db_user: &str,
        db_name: Option<&str>,
    ) -> Result<(), DbAccessDenied> {
        if !self.db_value_allowed(|c| &c.db_users, db_user) {
            return Err(DbAccessDenied::User {
                db: db.to_owned(),
                db_user: db_user.to_owned(),
                user: user.to_owned(),
            });
        }
        if let Some(name) = db_name
            && !self.db_value_allowed(|c| &c.db_names, name)
        {
            return Err(DbAccessDenied::Name {
                db: db.to_owned(),
                db_name: name.to_owned(),
                user: user.to_owned(),
            });
        }
        Ok(())
    }
}

/// The `editor` preset: manages users, roles, connectors, join tokens and locks, and reads the agent
/// inventory and cluster status. Nothing on `cluster_maintenance_config` (specification §2.4).
pub fn preset_editor() -> Role {
    let mut role = Role::new(EDITOR_ROLE);
    role.metadata.description = Some("Edit cluster configuration".into());
    role.spec.allow.rules = vec![
        Rule::new(
            ["user", "role", "github", "saml", "oidc", "token", "lock"],
            [Verb::All],
        ),
        Rule::new(["inventory", "cluster_status"], [Verb::Read, Verb::List]),
    ];
    role
}

/// The `access` preset: the given OS logins and every node, app, database, Kubernetes cluster and
/// desktop. Pass the user's `logins` trait ([`crate::resource::User::logins`]).
pub fn preset_access<S: Into<String>>(logins: impl IntoIterator<Item = S>) -> Role {
    let mut role = Role::new(ACCESS_ROLE);
    role.metadata.description = Some("Access cluster resources".into());
    let everything = || LabelSelector::from([("*".to_owned(), LabelValues::any())]);
    let allow = &mut role.spec.allow;
    allow.logins = logins.into_iter().map(Into::into).collect();
    allow.node_labels = everything();
    allow.app_labels = everything();
    allow.db_labels = everything();
    allow.db_users = vec!["*".to_owned()];
    allow.db_names = vec!["*".to_owned()];
    allow.kubernetes_labels = everything();
    allow.windows_desktop_labels = everything();
    role
}

/// The `auditor` preset: reads and lists users, roles, connectors, locks (secrets are never shown by
/// reading), the inventory and the cluster status. No tokens: their names are secrets.
pub fn preset_auditor() -> Role {
    let mut role = Role::new(AUDITOR_ROLE);
    role.metadata.description = Some("Review cluster configuration".into());
    role.spec.allow.rules = vec![Rule::new(
        [
            "user",
            "role",
            "github",
            "saml",
            "oidc",
            "lock",
            "inventory",
            "cluster_status",
        ],
        [Verb::Read, Verb::List],
    )];
    role
}

/// All preset roles, the `access` one with `access_logins`.
pub fn preset_roles<S: Into<String>>(access_logins: impl IntoIterator<Item = S>) -> Vec<Role> {
    vec![preset_editor(), preset_access(access_logins), preset_auditor()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{Resource, parse_resource};

    const SPEC_ROLE: &str = "\
kind: role
version: v7
metadata:
  name: maintenance-admin
spec:
  allow:
    rules:
    - resources: [cluster_maintenance_config]
      verbs: [create, read, update, delete]
";

    fn spec_role() -> Role {
        match parse_resource(SPEC_ROLE).unwrap() {
            Resource::Role(r) => r,
            other => panic!("expected a role, got {other:?}"),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn wildcards_match_runs_of_characters() {
        for (p, v, ok) in [
            ("*", "", true),
            ("*", "alice", true),
            ("alice", "alice", true),
            ("alice", "alice2", false),
            ("app_*", "app_ro", true),
            ("app_*", "ap", false),
            ("*_ro", "shop_ro", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
        ] {
            assert_eq!(wildcard_match(p, v), ok, "{p:?} vs {v:?}");
        }
    }

    #[test]
    fn db_users_and_names_deny_beats_allow_and_no_list_grants_nothing() {
        let mut reader = Role::new("reader");
        reader.spec.allow.db_users = vec!["app_*".into(), "reporting".into()];
        reader.spec.allow.db_names = vec!["*".into()];
        reader.spec.deny.db_names = vec!["secrets".into()];
        let mut no_admin = Role::new("no-admin");
        no_admin.spec.deny.db_users = vec!["app_admin".into()];
        let set = RoleSet::new([reader, no_admin]);
        assert_eq!(set.check_db("alice", "pg", "app_ro", Some("shop")), Ok(()));
        assert_eq!(set.check_db("alice", "pg", "reporting", None), Ok(()));
        let err = set
            .check_db("alice", "pg", "app_admin", Some("shop"))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "access denied to db \"pg\" as database user \"app_admin\": the roles of user alice do not allow it"
        );
        let err = set.check_db("alice", "pg", "postgres", None).unwrap_err();
        assert!(matches!(err, DbAccessDenied::User { .. }), "{err}");
        let err = set
            .check_db("alice", "pg", "app_ro", Some("secrets"))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "access denied to db \"pg\" database name \"secrets\": the roles of user alice do not allow it"
        );
        assert!(
            RoleSet::new([Role::new("empty")])
                .check_db("a", "pg", "x", None)
                .is_err()
        );
        assert_eq!(
            RoleSet::new([preset_access(["root"])]).check_db("a", "pg", "anyone", Some("any")),
            Ok(())
        );
    }

    #[test]
    fn no_preset_role_grants_anything_on_cluster_maintenance_config() {
        let presets = preset_roles(["root"]);
        assert_eq!(presets.len(), 3);
        for role in &presets {
            let set = RoleSet::new([role.clone()]);
            for verb in Verb::ALL {
                assert!(
                    !set.allows(verb, "cluster_maintenance_config"),
                    "preset {} grants {verb} on cluster_maintenance_config",
                    role.metadata.name
                );
            }
        }
        let all = RoleSet::new(presets);
        for verb in Verb::ALL {
            assert!(!all.allows(verb, "cluster_maintenance_config"));
        }
        assert_eq!(
            all.check(Verb::Create, "cluster_maintenance_config")
                .unwrap_err()
                .to_string(),
            "access denied to perform action \"create\" on \"cluster_maintenance_config\""
        );
    }

    #[test]
    fn spec_role_grants_exactly_its_verbs() {
        let set = RoleSet::new(preset_roles(["root"]).into_iter().chain([spec_role()]));
        for verb in [Verb::Create, Verb::Read, Verb::Update, Verb::Delete] {
            set.check(verb, "cluster_maintenance_config").unwrap();
        }
        assert!(!set.allows(Verb::List, "cluster_maintenance_config"));
        assert!(!set.allows(Verb::All, "cluster_maintenance_config"));
        assert!(!RoleSet::new([spec_role()]).allows(Verb::Create, "role"));
    }

    #[test]
    fn presets_grant_what_they_say() {
        let editor = RoleSet::new([preset_editor()]);
        for kind in ["user", "role", "github", "saml", "oidc", "token"] {
            for verb in Verb::ALL {
                editor.check(verb, kind).unwrap();
            }
        }
        editor.check(Verb::Read, "inventory").unwrap();
        editor.check(Verb::List, "inventory").unwrap();
        assert!(!editor.allows(Verb::Delete, "inventory"));
        let auditor = RoleSet::new([preset_auditor()]);
        auditor.check(Verb::List, "role").unwrap();
        assert!(!auditor.allows(Verb::Update, "role"));
        assert!(!auditor.allows(Verb::Read, "token"));
        let access = RoleSet::new([preset_access(["root", "ubuntu"])]);
        assert_eq!(
            access.logins(),
            BTreeSet::from(["root".to_owned(), "ubuntu".to_owned()])
        );
        assert!(access.labels_allowed(LabelKind::Node, &labels(&[])));
        assert!(access.labels_allowed(LabelKind::Db, &labels(&[("env", "prod")])));
        assert!(!access.allows(Verb::Read, "user"));
        // Presets are valid roles: they survive a round trip through the parser.
        for role in preset_roles(["root"]) {
            let text = Resource::Role(role.clone()).to_yaml().unwrap();
            assert_eq!(parse_resource(&text).unwrap(), Resource::Role(role));
        }
    }

    #[test]
    fn deny_beats_allow() {
        let mut deny = Role::new("no-tokens");
        deny.spec.deny.rules = vec![Rule::new(["token"], [Verb::Delete])];
        deny.spec.deny.logins = vec!["root".into()];
        let set = RoleSet::new([preset_editor(), preset_access(["root", "alice"]), deny.clone()]);
        assert!(set.allows(Verb::Create, "token"));
        assert_eq!(
            set.check(Verb::Delete, "token").unwrap_err(),
            AccessDenied {
                verb: Verb::Delete,
                resource: "token".into()
            }
        );
        assert_eq!(set.logins(), BTreeSet::from(["alice".to_owned()]));
        deny.spec.deny.rules = vec![Rule::new(["*"], [Verb::All])];
        deny.spec.deny.logins = vec!["*".into()];
        let set = RoleSet::new([preset_editor(), preset_access(["root"]), deny]);
        assert!(!set.allows(Verb::Read, "user"));
        assert!(set.logins().is_empty());
    }

    #[test]
    fn wildcards_in_rules() {
        let mut admin = Role::new("admin");
        admin.spec.allow.rules = vec![Rule::new(["*"], [Verb::All])];
        let set = RoleSet::new([admin]);
        set.check(Verb::Update, crate::resource::Kind::ClusterMaintenanceConfig)
            .unwrap();
        set.check(Verb::All, "token").unwrap();
        assert!(!RoleSet::default().allows(Verb::Read, "role"));
    }

    #[test]
    fn label_matching() {
        let sel = |pairs: &[(&str, &[&str])]| -> LabelSelector {
            pairs
                .iter()
                .map(|(k, vs)| ((*k).to_owned(), vs.iter().copied().collect()))
                .collect()
        };
        let prod = labels(&[("env", "prod"), ("team", "db")]);
        assert!(!matches_labels(&LabelSelector::new(), &prod));
        assert!(matches_labels(&sel(&[("*", &["*"])]), &prod));
        assert!(matches_labels(&sel(&[("*", &["*"])]), &labels(&[])));
        assert!(!matches_labels(&sel(&[("*", &["prod"])]), &prod));
        assert!(matches_labels(&sel(&[("env", &["staging", "prod"])]), &prod));
        assert!(matches_labels(&sel(&[("env", &["*"])]), &prod));
        assert!(!matches_labels(&sel(&[("region", &["*"])]), &prod));
        assert!(matches_labels(
            &sel(&[("env", &["prod"]), ("team", &["db"])]),
            &prod
        ));
        assert!(!matches_labels(
            &sel(&[("env", &["prod"]), ("team", &["web"])]),
            &prod
        ));

        let mut no_prod = Role::new("no-prod");
        no_prod.spec.deny.node_labels = sel(&[("env", &["prod"])]);
        let set = RoleSet::new([preset_access(["root"]), no_prod]);
        assert!(!set.labels_allowed(LabelKind::Node, &prod));
        assert!(set.labels_allowed(LabelKind::Node, &labels(&[("env", "dev")])));
        assert!(set.labels_allowed(LabelKind::App, &prod));
    }

    #[test]
    fn node_access_follows_labels_deny_and_logins() {
        let sel = |k: &str, v: &str| -> LabelSelector {
            LabelSelector::from([(k.to_owned(), [v].into_iter().collect::<LabelValues>())])
        };
        let mut dev = Role::new("dev");
        dev.spec.allow.node_labels = sel("env", "dev");
        dev.spec.allow.logins = vec!["ubuntu".into()];
        let granted = vec!["ubuntu".to_owned(), "root".to_owned()];
        let (prod, devl) = (labels(&[("env", "prod")]), labels(&[("env", "dev")]));
        let set = RoleSet::new([dev.clone()]);
        let ask = |set: &RoleSet, node: &str, labels: &BTreeMap<String, String>, login: &str| {
            set.check_node(&NodeAccess {
                user: "alice",
                granted_logins: &granted,
                node,
                labels,
                login,
            })
        };
        ask(&set, "dev-1", &devl, "ubuntu").unwrap();
        assert_eq!(
            ask(&set, "prod-db", &prod, "ubuntu").unwrap_err().to_string(),
            "access denied to node \"prod-db\": the roles of user alice do not allow its labels"
        );
        // A login outside the certificate's principals.
        assert_eq!(
            ask(&set, "dev-1", &devl, "postgres").unwrap_err().to_string(),
            "access denied to node \"dev-1\" as login \"postgres\": the roles of user alice do not allow this login"
        );
        // Deny beats allow, for labels and for logins.
        let mut no_prod = Role::new("no-prod");
        no_prod.spec.deny.node_labels = sel("env", "prod");
        no_prod.spec.deny.logins = vec!["root".into()];
        let set = RoleSet::new([preset_access(["root", "ubuntu"]), no_prod]);
        assert_eq!(
            ask(&set, "prod-db", &prod, "ubuntu").unwrap_err().to_string(),
            "access denied to node \"prod-db\": role no-prod of user alice denies its labels"
        );
        ask(&set, "dev-1", &devl, "ubuntu").unwrap();
        assert!(matches!(
            ask(&set, "dev-1", &devl, "root"),
            Err(NodeAccessDenied::LoginNotAllowed { .. })
        ));
        // No roles: nothing.
        assert!(ask(&RoleSet::default(), "dev-1", &devl, "ubuntu").is_err());
    }

    #[test]
    fn verb_names() {
        for verb in Verb::ALL {
            assert_eq!(verb.as_str().parse::<Verb>().unwrap(), verb);
        }
        assert_eq!(
            "write".parse::<Verb>().unwrap_err(),
            "unknown verb \"write\", expected one of: create, read, list, update, delete, *"
        );
    }

    fn role_with_options(name: &str, options: &str) -> Role {
        let text =
            format!("kind: role\nversion: v7\nmetadata:\n  name: {name}\nspec:\n  options:\n{options}");
        match parse_resource(&text).unwrap() {
            Resource::Role(r) => r,
            other => panic!("expected a role, got {other:?}"),
        }
    }

    #[test]
    fn ssh_permits_follow_the_role_options() {
        let plain = role_with_options("plain", "    {}\n");
        assert_eq!(
            RoleSet::new([plain.clone()]).ssh_permits(),
            crate::identity::SshPermits {
                port_forwarding: true,
                agent_forwarding: false
            },
            "the defaults: port forwarding allowed, agent forwarding not"
        );
        let no_fwd = role_with_options("no-fwd", "    port_forwarding: false\n");
        let agent = role_with_options("agent", "    forward_agent: true\n");
        let no_agent = role_with_options("no-agent", "    forward_agent: false\n");
        let set = RoleSet::new([plain.clone(), no_fwd, agent.clone()]).ssh_permits();
        assert!(!set.port_forwarding, "one role's false wins");
        assert!(set.agent_forwarding, "one role's true grants agent forwarding");
        let set = RoleSet::new([agent, no_agent]).ssh_permits();
        assert!(!set.agent_forwarding, "a false beats a true for agent forwarding");
        let err = parse_resource(
            "kind: role\nversion: v7\nmetadata:\n  name: x\nspec:\n  options:\n    port_fowarding: false\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("port_fowarding"),
            "a misspelt option is refused: {err}"
        );
    }
}

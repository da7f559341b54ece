//! Resources agents serve (applications, databases, Kubernetes clusters, Windows desktops):
//! announced in heartbeats, found and authorized here for the proxy.
//!
//! Data flow: an agent's heartbeat carries the [`ServedResource`]s its services serve; they are
//! stored under `/served/<host id>` with the inventory row's expiry, and only the kinds the
//! agent's certificate has a role for are accepted. When a user connects to a resource, the
//! proxy calls [`AuthService::resolve_resource`] with the user's certificate; RBAC by labels
//! ([`RoleSet::labels_allowed`](crate::rbac::RoleSet::labels_allowed)) decides here, in the domain, and the answer is the
//! [`ResourceRoute`] the proxy dials (through the agent's reverse tunnel, or its direct
//! listener) or a denial naming the resource.

use std::collections::BTreeMap;
use std::fmt;
use std::time::UNIX_EPOCH;

use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};

use super::{AuthError, AuthService, Caller, HEARTBEAT_TTL};
use crate::backend::{Item, Key};
use crate::identity::{HostIdentity, SystemRole};
use crate::rbac::{AccessDenied, DbAccessDenied, LabelKind, NodeAccessDenied, Verb};

/// What kind of resource an agent serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ServedKind {
    /// An application (`app_service.apps[]`).
    App,
    /// A database (`db_service.databases[]`).
    Db,
    /// A Kubernetes cluster (`kubernetes_service`).
    Kube,
    /// A Windows desktop (`windows_desktop_service.hosts[]`).
    WindowsDesktop,
    /// An SSH node (`ssh_service`), announced only by a directly joined agent so the proxy can
    /// find its listener (`direct_addr`); tunnelled nodes are found through their tunnels.
    Node,
}

impl ServedKind {
    /// Every kind.
    pub const ALL: [ServedKind; 5] = [
        ServedKind::App,
        ServedKind::Db,
        ServedKind::Kube,
        ServedKind::WindowsDesktop,
        ServedKind::Node,
    ];

    /// The name used on the wire, in RBAC rules and in messages: `app`, `db`, `kube_cluster`,
    /// `windows_desktop`, `node`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ServedKind::App => "app",
            ServedKind::Db => "db",
            ServedKind::Kube => "kube_cluster",
            ServedKind::WindowsDesktop => "windows_desktop",
            ServedKind::Node => "node",
        }
    }

    /// The role selector that applies.
    pub(crate) const fn label_kind(self) -> LabelKind {
        match self {
            ServedKind::App => LabelKind::App,
            ServedKind::Db => LabelKind::Db,
            ServedKind::Kube => LabelKind::Kubernetes,
            ServedKind::WindowsDesktop => LabelKind::WindowsDesktop,
            ServedKind::Node => LabelKind::Node,
        }
    }

    /// The system role an agent's certificate needs to serve this kind.
    pub(crate) const fn system_role(self) -> SystemRole {
        match self {
            ServedKind::App => SystemRole::App,
            ServedKind::Db => SystemRole::Db,
            ServedKind::Kube => SystemRole::Kube,
            ServedKind::WindowsDesktop => SystemRole::WindowsDesktop,
            ServedKind::Node => SystemRole::Node,
        }
    }
}

impl fmt::Display for ServedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ServedKind {
    type Err = AuthError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // `kube` is accepted too: it is the dial request's connection type.
        if s == "kube" {
            return Ok(ServedKind::Kube);
        }
        ServedKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                AuthError::Invalid(format!(
                    "unknown resource kind {s:?}, expected one of: app, db, kube_cluster, windows_desktop, node"
                ))
            })
    }
}

/// One resource an agent serves, as announced in its heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedResource {
    /// The kind.
    pub kind: Option<ServedKind>,
    /// The name, unique per kind within the agent (the configuration checks it).
    pub name: String,
    /// Labels RBAC matches against.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Where the agent forwards to: the app's URI, the database's `host:port`, the Kubernetes
    /// API URL, the desktop's `host:port`. Informational (listings); the agent decides from its
    /// own configuration, never from this.
    #[serde(default)]
    pub target: String,
    /// The wire protocol: `http`/`https`/`tcp` for apps, `postgres`/`mysql`/`mongodb`/`redis`
    /// for databases, `https` for Kubernetes, `rdp` for desktops.
    #[serde(default)]
    pub protocol: String,
    /// The application's public address, if configured.
    #[serde(default)]
    pub public_addr: String,
    /// The agent's own listener for this kind (`host:port`) when it joined the Auth Service
    /// directly; empty when it is reached through its reverse tunnel.
    #[serde(default)]
    pub direct_addr: String,
}

impl ServedResource {
    /// A resource of `kind` named `name`, the other fields empty.
    pub fn new(kind: ServedKind, name: impl Into<String>) -> Self {
        Self {
            kind: Some(kind),
            name: name.into(),
            ..Self::default()
        }
    }
}

/// Where the proxy sends a user's connection to a resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRoute {
    /// The agent's host ID (`<uuid>.<cluster>`): the dial request's `server_id`.
    pub server_id: String,
    /// The agent's node name.
    pub hostname: String,
    /// The resource as the agent announced it.
    pub resource: ServedResource,
}

/// A refused or impossible route; the message names the resource and its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The user's roles do not grant this resource (by its labels).
    #[error("access denied to {kind} \"{name}\": the roles of user {user} do not allow its labels")]
    Denied {
        /// The kind.
        kind: ServedKind,
        /// The resource name.
        name: String,
        /// The user.
        user: String,
    },
    /// The user's roles do not allow this node or this login on it.
    #[error(transparent)]
    Node(#[from] NodeAccessDenied),
    /// The user's roles do not allow this database user or database name.
    #[error(transparent)]
    Db(#[from] DbAccessDenied),
    /// A database certificate (`tsh db login`) was presented for anything but its own route.
    #[error("{0}")]
    CertScope(String),
    /// The user's certificates are revoked (user deleted or locked), or the node is locked;
    /// the text names who and why.
    #[error("access refused: {0}")]
    Revoked(String),
    /// The agent announced a listener the Auth Service refused (see
    /// [`check_direct_addr`](super::check_direct_addr)); the text names the node, the address
    /// and why, and the proxy does not dial it.
    #[error("{0}")]
    Unreachable(String),
    /// No live agent serves it.
    #[error("{kind} \"{name}\" not found: no connected agent serves it")]
    NotServed {
        /// The kind.
        kind: ServedKind,
        /// The resource name.
        name: String,
    },
}

/// Whether the proxy may dial `ip` for an agent's announced listener: never an unspecified,
/// link-local (the cloud metadata service lives at `169.254.169.254`), multicast or broadcast
/// address. Checked on the announced address at heartbeat and on every address a name
/// resolves to at dial time.
pub fn direct_ip_allowed(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_link_local() || v4.is_multicast() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified() || v6.is_multicast() || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// An announcement the Auth Service refused, remembered (in memory, for a heartbeat's TTL)
/// so that a user's session to the node is refused with the reason rather than "not found".
#[derive(Debug, Clone)]
pub(super) struct RefusedDirect {
    host_id: String,
    hostname: String,
    kind: ServedKind,
    addr: String,
    reason: String,
    until: std::time::SystemTime,
}

pub(super) fn served_key(host_id: &str) -> Key {
    Key::from_segments(["served", host_id])
}

use super::rules::ServedEntry;

impl AuthService {
    /// Stores what a heartbeat announced, with the inventory row's expiry. Refuses a resource
    /// whose kind the host's certificate has no role for (an SSH node cannot claim to serve a
    /// database).
    pub(super) async fn store_served(
        &self,
        host: &HostIdentity,
        hostname: &str,
        source: Option<std::net::IpAddr>,
        resources: Vec<ServedResource>,
    ) -> Result<(), AuthError> {
        for r in &resources {
            let Some(kind) = r.kind else {
                return Err(AuthError::Invalid(format!(
                    "served resource \"{}\": no kind",
                    r.name
                )));
            };
            if r.name.is_empty() {
                return Err(AuthError::Invalid(format!("a served {kind} has no name")));
            }
            // Routing by name must only ever reach an agent whose certificate carries the name.
            if kind == ServedKind::Node && r.name != host.node_name {
                return Err(AuthError::Invalid(format!(
                    "served node \"{}\": the agent's certificate names node \"{}\"",
                    r.name, host.node_name
                )));
            }
            if !r.direct_addr.is_empty() {
                self.check_direct_addr(host, source, kind, &r.name, &r.direct_addr)?;
            }
            if !host.has_role(kind.system_role()) {
                return Err(AccessDenied {
                    verb: Verb::Update,
                    resource: kind.as_str().to_owned(),
                }
                .into());
            }
        }
        let now = self.now();
        self.refused_direct
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|r| r.host_id != host.host_id && r.until > now);
        let key = served_key(&host.host_id);
        if resources.is_empty() {
            return match self.backend.delete(&key).await {
                Ok(_) | Err(crate::backend::BackendError::NotFound { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        let entry = ServedEntry {
            host_id: host.host_id.clone(),
            hostname: hostname.to_owned(),
            last_seen: now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            resources,
        };
        let value = serde_json::to_vec(&entry).map_err(|e| AuthError::Corrupt {
            what: "served resources",
            reason: e.to_string(),
        })?;
        self.backend
            .put(Item::new(key, value).with_expiry(now + HEARTBEAT_TTL))
            .await?;
        Ok(())
    }

    /// An announced listener the proxy will dial for users, checked by
    /// [`check_direct_addr`](super::check_direct_addr): the agent's observed address or a name
    /// its certificate carries; never a loopback (without the lab opt-in), unspecified,
    /// link-local, multicast or broadcast address, never the cluster's Proxy or Auth Service.
    /// A refusal is logged and remembered for [`direct_refusal`](Self::direct_refusal).
    fn check_direct_addr(
        &self,
        host: &HostIdentity,
        source: Option<std::net::IpAddr>,
        kind: ServedKind,
        name: &str,
        addr: &str,
    ) -> Result<(), AuthError> {
        let announcer = super::Announcer {
            identity: host,
            observed: source,
        };
        let policy = self.direct_dial_policy();
        let Err(why) = super::check_direct_addr(addr, announcer, &self.names.reserved, &policy) else {
            return Ok(());
        };
        tracing::warn!(
            host_id = %host.host_id,
            node = %host.node_name,
            %kind,
            resource = %name,
            direct_addr = %addr,
            source = ?source,
            reason = %why,
            "refused an agent's announced listener: the proxy will not dial it"
        );
        let now = self.now();
        let mut refused = self
            .refused_direct
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        refused.retain(|r| r.until > now && !(r.host_id == host.host_id && r.kind == kind));
        // Bounded: one entry per agent and kind, expiring with a heartbeat.
        if refused.len() < 65_536 {
            refused.push(RefusedDirect {
                host_id: host.host_id.clone(),
                hostname: host.node_name.clone(),
                kind,
                addr: addr.to_owned(),
                reason: why.to_string(),
                until: now + HEARTBEAT_TTL,
            });
        }
        Err(AuthError::Invalid(format!(
            "served {kind} \"{name}\": direct_addr \"{addr}\": {why}"
        )))
    }

    /// Why the listener `server` (host ID, UUID or node name) announced for `kind` was refused
    /// at its last heartbeat, if it was: the text names the node, the address and the reason.
    /// Only a proxy asks, when it has no route to dial.
    pub fn direct_refusal(&self, caller: &Caller, server: &str, kind: ServedKind) -> Option<String> {
        if !caller.is_host_with(SystemRole::Proxy) {
            return None;
        }
        let now = self.now();
        self.refused_direct
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|r| {
                r.until > now
                    && r.kind == kind
                    && (r.host_id == server
                        || r.hostname == server
                        || r.host_id.split_once('.').is_some_and(|(uuid, _)| uuid == server))
            })
            .map(|r| {
                format!(
                    "node \"{}\" announced the listener {} and the Auth Service refused it: {}",
                    r.hostname, r.addr, r.reason
                )
            })
    }

    /// The rules over this Auth Service's backend (what a separate proxy runs over its cache).
    pub fn rules(&self) -> &super::AccessRules {
        &self.rules
    }

    /// Finds the agent serving `kind`/`name` and checks that the user may reach it: the route
    /// the proxy dials, or a [`RouteError`] naming the resource. The user is the caller itself
    /// when it is a user (`user_cert` `None`); a proxy (host role `proxy`) acting for a user
    /// passes the user certificate its client presented, verified here. Anyone else is refused.
    pub async fn resolve_resource(
        &self,
        caller: &Caller,
        user_cert: Option<&[CertificateDer<'_>]>,
        kind: ServedKind,
        name: &str,
    ) -> Result<Result<ResourceRoute, RouteError>, AuthError> {
        self.rules.resolve_resource(caller, user_cert, kind, name).await
    }

    /// Where a database connection as `db_user` (and `db_name`) goes: see
    /// [`AccessRules::resolve_db`](super::AccessRules::resolve_db). The proxy asks before it
    /// dials, with the route it then puts in the dial request.
    pub async fn resolve_db(
        &self,
        caller: &Caller,
        user_cert: Option<&[CertificateDer<'_>]>,
        name: &str,
        db_user: &str,
        db_name: Option<&str>,
    ) -> Result<Result<ResourceRoute, RouteError>, AuthError> {
        self.rules
            .resolve_db(caller, user_cert, name, db_user, db_name)
            .await
    }

    /// Authorizes an SSH session of the user holding `user_cert` (their OpenSSH certificate) to
    /// `node` as `login` ([`RoleSet::check_node`](crate::rbac::RoleSet::check_node): the node's
    /// announced labels against `node_labels`, deny beating allow, and the login against the
    /// certificate's logins and the roles' denied logins); the answer is the route to the one
    /// live agent holding that node name (or host ID, or UUID), whose host ID the proxy then
    /// dials, or a [`RouteError`] naming the node and the reason.
    ///
    /// A deleted or locked user, and a locked node, are refused ([`RouteError::Revoked`]);
    /// proxies and nodes ask again periodically during a session, so a lock or a deletion also
    /// ends open sessions.
    ///
    /// Asked by a proxy (host role `proxy`) before it dials, and by a node (host role `node`)
    /// about itself (`node` is its own host ID) before it starts a session: the node's check is
    /// the second line of defence, against its own announced labels. Anyone else is refused.
    /// The rules are [`AccessRules::authorize_node`](super::AccessRules::authorize_node); an
    /// agent whose announced listener this Auth Service refused is named as such.
    pub async fn authorize_node(
        &self,
        caller: &Caller,
        user_cert: &ssh_key::Certificate,
        node: &str,
        login: &str,
    ) -> Result<Result<ResourceRoute, RouteError>, AuthError> {
        let answer = self.rules.authorize_node(caller, user_cert, node, login).await?;
        if let Err(RouteError::NotServed { .. }) = &answer
            && let Some(refusal) = self.direct_refusal(caller, node, ServedKind::Node)
        {
            return Ok(Err(RouteError::Unreachable(refusal)));
        }
        Ok(answer)
    }

    /// The route to the listener a directly joined agent announced for `kind`: `server` is
    /// its host ID, UUID or node name (what a dial request names); the route's
    /// `resource.direct_addr` is the address and its `server_id` the host ID the agent's
    /// certificate must carry. `None` when no live agent by that name announced one (a
    /// tunnelled agent, or none at all). Only a proxy (host role `proxy`) asks: it dials the
    /// address when its tunnel registry has no agent by that name.
    pub async fn direct_route(
        &self,
        caller: &Caller,
        server: &str,
        kind: ServedKind,
    ) -> Result<Option<ResourceRoute>, AuthError> {
        self.rules.direct_route(caller, server, kind).await
    }

    /// `tsh apps ls` and friends: the resources of `kind` the user may reach, sorted by name
    /// (one entry per name, from the freshest agent). `caller` and `user_cert` as for
    /// [`resolve_resource`](Self::resolve_resource).
    pub async fn list_served(
        &self,
        caller: &Caller,
        user_cert: Option<&[CertificateDer<'_>]>,
        kind: ServedKind,
    ) -> Result<Vec<ResourceRoute>, AuthError> {
        self.rules.list_served(caller, user_cert, kind).await
    }
}

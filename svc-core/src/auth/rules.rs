//! The read side of the Auth Service's rules: who a user is now (roles, deletion, locks) and
//! where a connection to a node or a served resource goes, decided over any [`Backend`].
//!
//! [`AccessRules`] is the one place these decisions are made. The Auth Service answers its
//! `AuthorizeNode`, `ResolveResource` and `ListServed` calls with it over its own backend; a
//! Proxy Service running apart from the Auth Service runs the very same rules over its local,
//! watched copy of the keys they read (roles, users, locks, served resources), so its
//! per-connection decisions need no round trip and survive a short Auth Service outage.
//!
//! Keys read: `/resources/role/*`, `/resources/user/*`, `/resources/lock/*`, `/served/*`
//! ([`WATCHED_PREFIXES`]). Nothing here writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};

use super::served::{ResourceRoute, RouteError, ServedKind, ServedResource};
use super::{AuthError, Caller, lock_refusal, store};
use crate::backend::{Backend, Key, KeyRange};
use crate::clock::Clock;
use crate::identity::{DbCertRoute, Identity, SystemRole, UserIdentity, Verifier};
use crate::rbac::{AccessDenied, NodeAccess, RoleSet, Verb};
use crate::resource::{Kind, Lock, Resource};

/// The key prefixes [`AccessRules`] reads: what a proxy's cache must hold to decide locally.
/// Secrets (passwords, join tokens, the CAs' private keys) live elsewhere and are never among
/// them.
pub const WATCHED_PREFIXES: [&str; 4] = [
    "/resources/role/",
    "/resources/user/",
    "/resources/lock/",
    "/served/",
];

/// What `/served/<host id>` holds: the resources one agent announced in its last heartbeat.
#[derive(Serialize, Deserialize)]
pub(super) struct ServedEntry {
    pub(super) host_id: String,
    pub(super) hostname: String,
    pub(super) last_seen: u64,
    pub(super) resources: Vec<ServedResource>,
}

/// The Auth Service's access decisions over a backend: users' current roles and revocations,
/// node authorization, resource routes. Cheap to clone.
#[derive(Clone)]
pub struct AccessRules {
    backend: Arc<dyn Backend>,
    verifier: Verifier,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for AccessRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessRules").finish_non_exhaustive()
    }
}

impl AccessRules {
    /// The rules over `backend` (the Auth Service's, or a proxy's watched copy), checking user
    /// certificates with `verifier` (the cluster's CAs) at `clock`'s time.
    pub fn new(backend: Arc<dyn Backend>, verifier: Verifier, clock: Arc<dyn Clock>) -> Self {
        Self {
            backend,
            verifier,
            clock,
        }
    }

    fn now(&self) -> SystemTime {
        self.clock.now()
    }

    fn store(&self) -> store::Store<'_> {
        store::Store::new(self.backend.as_ref())
    }

    /// The verifier for user certificates.
    pub fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    /// A verified user as a [`Caller`] with the roles the certificate names, as stored now (a
    /// role that no longer exists grants nothing). A deleted or locked user is refused
    /// ([`AuthError::Revoked`]).
    pub async fn user_caller(&self, user: UserIdentity) -> Result<Caller, AuthError> {
        if let Some(refusal) = self.user_revoked(&user.username).await? {
            return Err(AuthError::Revoked(refusal));
        }
        let mut roles = Vec::new();
        for name in &user.roles {
            if let Some(Resource::Role(role)) = self.store().get(Kind::Role, name).await? {
                roles.push(role);
            }
        }
        Ok(Caller::User {
            identity: user,
            roles: RoleSet::new(roles),
        })
    }

    /// Why the certificates of `username` no longer work, if they do not: the user was
    /// deleted, or a live lock targets them.
    pub async fn user_revoked(&self, username: &str) -> Result<Option<String>, AuthError> {
        if self.store().get(Kind::User, username).await?.is_none() {
            return Ok(Some(format!(
                "user \"{username}\" no longer exists: their certificates are revoked"
            )));
        }
        Ok(self
            .live_locks()
            .await?
            .into_iter()
            .find(|l| l.locks_user(username))
            .map(|l| lock_refusal(&l)))
    }

    /// Why sessions to the node known by `names` (node name, host ID, UUID) are refused, if a
    /// live lock targets it.
    pub async fn node_locked(&self, names: &[&str]) -> Result<Option<String>, AuthError> {
        Ok(self
            .live_locks()
            .await?
            .into_iter()
            .find(|l| l.locks_node(names))
            .map(|l| lock_refusal(&l)))
    }

    async fn live_locks(&self) -> Result<Vec<Lock>, AuthError> {
        let now = self.now();
        Ok(self
            .store()
            .list(Kind::Lock)
            .await?
            .into_iter()
            .filter_map(|r| match r {
                Resource::Lock(l) if !l.metadata.is_expired(now) => Some(l),
                _ => None,
            })
            .collect())
    }

    pub(super) async fn served_entries(&self) -> Result<Vec<ServedEntry>, AuthError> {
        let now = self.now();
        let mut out = Vec::new();
        for item in self
            .backend
            .range(&KeyRange::prefix(Key::from("/served/")))
            .await?
        {
            if item.is_expired(now) {
                continue;
            }
            let entry: ServedEntry = serde_json::from_slice(&item.value).map_err(|e| AuthError::Corrupt {
                what: "served resources",
                reason: e.to_string(),
            })?;
            out.push(entry);
        }
        // The freshest agent first: it is the one a dial picks when several serve a name.
        out.sort_by_key(|e| std::cmp::Reverse(e.last_seen));
        Ok(out)
    }

    /// The user a resource request is for, with their roles: the caller itself when it is a
    /// user; for a proxy (host with the `proxy` role) acting for a user, the user certificate
    /// it received from the client (`user_cert`, verified here against the user CA).
    async fn acting_user(
        &self,
        caller: &Caller,
        user_cert: Option<&[CertificateDer<'_>]>,
    ) -> Result<(String, RoleSet, Option<DbCertRoute>), AuthError> {
        match (caller, user_cert) {
            (Caller::User { identity, roles }, None) => Ok((
                identity.username.clone(),
                roles.clone(),
                identity.db_route.clone(),
            )),
            (caller, Some(chain)) if caller.is_host_with(SystemRole::Proxy) => {
                let user = self.verifier.verify_user_x509(chain, self.now())?;
                match self.user_caller(user).await? {
                    Caller::User { identity, roles } => Ok((identity.username, roles, identity.db_route)),
                    _ => Err(AuthError::Invalid("expected a user certificate".into())),
                }
            }
            _ => Err(AccessDenied {
                verb: Verb::Read,
                resource: "resource route".into(),
            }
            .into()),
        }
    }

    /// See [`AuthService::resolve_resource`](super::AuthService::resolve_resource).
    pub async fn resolve_resource(
        &self,
        caller: &Caller,
        user_cert: Option<&[CertificateDer<'_>]>,
        kind: ServedKind,
        name: &str,
    ) -> Result<Result<ResourceRoute, RouteError>, AuthError> {
        let (user, roles, db_route) = self.acting_user(caller, user_cert).await?;
        if let Some(route) = db_route
            && (kind != ServedKind::Db || route.service != name)
        {
            return Ok(Err(RouteError::CertScope(format!(
                "the certificate of user {user} is for db \"{}\" only (tsh db login): not for {kind} \"{name}\"",
                route.service
            ))));
        }
        self.route_for(user, &roles, kind, name).await
    }

    /// Where a database connection goes, as `db_user` (and `db_name`, for protocols that have
    /// database names): [`resolve_resource`](Self::resolve_resource) for the database, then the
    /// roles' `db_users`/`db_names` ([`RoleSet::check_db`]).
    pub async fn resolve_db(
        &self,
        caller: &Caller,
        user_cert: Option<&[CertificateDer<'_>]>,
        name: &str,
        db_user: &str,
        db_name: Option<&str>,
    ) -> Result<Result<ResourceRoute, RouteError>, AuthError> {
        let (user, roles, db_route) = self.acting_user(caller, user_cert).await?;
        // A database certificate reaches its own database as its own user (and name) only.
        if let Some(r) = db_route
            && (r.service != name
                || r.user != db_user
                || r.database.as_deref().is_some_and(|d| Some(d) != db_name))
        {
            return Ok(Err(RouteError::CertScope(format!(
                "the certificate of user {user} is for db \"{}\" as database user \"{}\"{}: not for db \"{name}\" as \"{db_user}\"{}",
                r.service,
                r.user,
                r.database
                    .as_deref()
                    .map(|d| format!(", database \"{d}\""))
                    .unwrap_or_default(),
                db_name.map(|d| format!(", database \"{d}\"")).unwrap_or_default(),
            ))));
        }
        let route = match self.route_for(user.clone(), &roles, ServedKind::Db, name).await? {
            Ok(route) => route,
            Err(e) => return Ok(Err(e)),
        };
        Ok(match roles.check_db(&user, name, db_user, db_name) {
            Ok(()) => Ok(route),
            Err(e) => Err(e.into()),
        })
    }

    async fn route_for(
        &self,
        user: String,
        roles: &RoleSet,
        kind: ServedKind,
        name: &str,
    ) -> Result<Result<ResourceRoute, RouteError>, AuthError> {
        let found = self.served_entries().await?.into_iter().find_map(|e| {
            let resource = e
                .resources
                .into_iter()
                .find(|r| r.kind == Some(kind) && r.name == name)?;
            Some(ResourceRoute {
                server_id: e.host_id,
                hostname: e.hostname,
                resource,
            })
        });
        let Some(route) = found else {
            return Ok(Err(RouteError::NotServed {
                kind,
                name: name.to_owned(),
            }));
        };
        if !roles.labels_allowed(kind.label_kind(), &route.resource.labels) {
            return Ok(Err(RouteError::Denied {
                kind,
                name: name.to_owned(),
                user,
            }));
        }
        Ok(Ok(route))
    }

    /// See [`AuthService::authorize_node`](super::AuthService::authorize_node). When no live
    /// agent holds the node, the answer is [`RouteError::NotServed`]; the Auth Service adds
    /// what it remembers of refused announcements.
    pub async fn authorize_node(
        &self,
        caller: &Caller,
        user_cert: &ssh_key::Certificate,
        node: &str,
        login: &str,
    ) -> Result<Result<ResourceRoute, RouteError>, AuthError> {
        let refused = || -> AuthError {
            AccessDenied {
                verb: Verb::Read,
                resource: "node authorization".into(),
            }
            .into()
        };
        let itself = match caller {
            Caller::Host(host) if host.has_role(SystemRole::Proxy) => None,
            Caller::Host(host) if host.has_role(SystemRole::Node) && host.host_id == node => {
                Some(host.host_id.clone())
            }
            _ => return Err(refused()),
        };
        let user = self.verifier.verify_user_ssh(user_cert, self.now())?;
        if let Some(refusal) = self.user_revoked(&user.username).await? {
            return Ok(Err(RouteError::Revoked(refusal)));
        }
        let granted = user.logins.clone();
        let Caller::User { identity, roles } = self.user_caller(user).await? else {
            return Err(AuthError::Invalid("expected a user certificate".into()));
        };
        let named = |e: &ServedEntry| match &itself {
            Some(host_id) => &e.host_id == host_id,
            None => {
                e.host_id == node
                    || e.host_id.split_once('.').is_some_and(|(uuid, _)| uuid == node)
                    || e.resources
                        .iter()
                        .any(|r| r.kind == Some(ServedKind::Node) && r.name == node)
            }
        };
        let found = self
            .served_entries()
            .await?
            .into_iter()
            .filter(named)
            .find_map(|e| {
                let resource = e
                    .resources
                    .into_iter()
                    .find(|r| r.kind == Some(ServedKind::Node))?;
                Some(ResourceRoute {
                    server_id: e.host_id,
                    hostname: e.hostname,
                    resource,
                })
            });
        let Some(route) = found else {
            return Ok(Err(RouteError::NotServed {
                kind: ServedKind::Node,
                name: node.to_owned(),
            }));
        };
        let uuid = route.server_id.split_once('.').map(|(uuid, _)| uuid);
        let names: Vec<&str> = [
            Some(route.server_id.as_str()),
            uuid,
            Some(route.resource.name.as_str()),
            Some(route.hostname.as_str()),
        ]
        .into_iter()
        .flatten()
        .collect();
        if let Some(refusal) = self.node_locked(&names).await? {
            return Ok(Err(RouteError::Revoked(refusal)));
        }
        let shown = if itself.is_some() {
            route.resource.name.as_str()
        } else {
            node
        };
        let check = roles.check_node(&NodeAccess {
            user: &identity.username,
            granted_logins: &granted,
            node: shown,
            labels: &route.resource.labels,
            login,
        });
        Ok(match check {
            Ok(()) => Ok(route),
            Err(denied) => Err(denied.into()),
        })
    }

    /// See [`AuthService::direct_route`](super::AuthService::direct_route).
    pub async fn direct_route(
        &self,
        caller: &Caller,
        server: &str,
        kind: ServedKind,
    ) -> Result<Option<ResourceRoute>, AuthError> {
        if !caller.is_host_with(SystemRole::Proxy) {
            return Err(AccessDenied {
                verb: Verb::Read,
                resource: "direct address".into(),
            }
            .into());
        }
        let named = |e: &ServedEntry| {
            e.host_id == server
                || e.hostname == server
                || e.host_id.split_once('.').is_some_and(|(uuid, _)| uuid == server)
        };
        Ok(self
            .served_entries()
            .await?
            .into_iter()
            .filter(named)
            .find_map(|e| {
                let resource = e
                    .resources
                    .into_iter()
                    .find(|r| r.kind == Some(kind) && !r.direct_addr.is_empty())?;
                Some(ResourceRoute {
                    server_id: e.host_id,
                    hostname: e.hostname,
                    resource,
                })
            }))
    }

    /// See [`AuthService::list_served`](super::AuthService::list_served).
    pub async fn list_served(
        &self,
        caller: &Caller,
        user_cert: Option<&[CertificateDer<'_>]>,
        kind: ServedKind,
    ) -> Result<Vec<ResourceRoute>, AuthError> {
        let (_, roles, _) = self.acting_user(caller, user_cert).await?;
        let mut out: BTreeMap<String, ResourceRoute> = BTreeMap::new();
        for e in self.served_entries().await? {
            for r in e.resources {
                if r.kind != Some(kind)
                    || out.contains_key(&r.name)
                    || !roles.labels_allowed(kind.label_kind(), &r.labels)
                {
                    continue;
                }
                out.insert(
                    r.name.clone(),
                    ResourceRoute {
                        server_id: e.host_id.clone(),
                        hostname: e.hostname.clone(),
                        resource: r,
                    },
                );
            }
        }
        Ok(out.into_values().collect())
    }

    /// A caller from a verified identity: hosts as they are (the `auth` role is the admin),
    /// users through [`user_caller`](Self::user_caller).
    pub async fn caller(&self, identity: Identity) -> Result<Caller, AuthError> {
        match identity {
            Identity::Host(host) if host.has_role(SystemRole::Auth) => Ok(Caller::Admin(host)),
            Identity::Host(host) => Ok(Caller::Host(host)),
            Identity::User(user) => self.user_caller(user).await,
        }
    }
}

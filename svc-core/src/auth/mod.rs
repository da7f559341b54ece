//! The Auth Service's domain logic: who may do what, and what is stored where.
//!
//! Data flow: the gRPC server (`svc_net::auth`) verifies a client certificate, turns the identity
//! into a [`Caller`] ([`AuthService::caller`]: the roles named in a user certificate are loaded
//! into a [`RoleSet`]), then calls one method here per API call. Every method checks RBAC first
//! ([`AccessDenied`] names the verb and the kind), then reads or writes the [`Backend`] — with
//! compare-and-swap on revisions wherever a value is read before it is written — and signs
//! certificates with the cluster's two [`CertAuthority`]s.
//!
//! Storage layout (keys):
//!
//! | key | value |
//! |---|---|
//! | `/authorities/<host\|user>/<cluster>` | the CAs ([`CertAuthority::save`]) |
//! | `/authorities/jwt/<cluster>` | the JWT signing key of web apps ([`JwtKey::save`](crate::identity::jwt::JwtKey::save)) |
//! | `/resources/<kind>/<name>` | a resource as JSON (roles, users, connectors, tokens, …) |
//! | `/passwords/<user>` | the user's argon2 PHC hash string |
//! | `/inventory/<host id>` | the last heartbeat of an agent (JSON), expiring after [`HEARTBEAT_TTL`] |
//! | `/served/<host id>` | the resources the agent serves ([`ServedResource`]), same expiry |
//! | `/nodenames/<node name>` | the host ID holding a node name, same expiry (one live agent per name) |
//! | `/proxies/<host id>` | a proxy's record ([`ProxyRecord`]), expiring after [`PROXY_TTL`] unless renewed |
//!
//! Rights: a host certificate with the `auth` system role (the admin identity the Auth Service
//! writes for `tctl` on its own host) may do everything; other hosts may only heartbeat (and a
//! proxy may sign users in); users get exactly what their roles allow.

pub mod direct;
mod inventory;
pub mod limit;
mod password;
mod proxies;
mod rules;
mod served;
mod store;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use ssh_key::{Certificate, PublicKey};

use crate::backend::{Backend, BackendError, Item, Key, KeyRange};
use crate::clock::Clock;
use crate::identity::{
    CertAuthority, DbCertRoute, HostCertRequest, HostIdentity, Identity, IdentityError, IdentityKind,
    SystemRole, TrustedCa, UserCertRequest, UserIdentity, Verifier, VerifyError,
};
use crate::rbac::{AccessDenied, RoleSet, Verb, preset_roles};
use crate::resource::{JoinRole, Kind, Lock, Resource, ResourceError, Token, User};
use crate::{Secret, Version};

pub use direct::{Announcer, DirectAddrRefused, DirectDialPolicy, check_direct_addr};
pub use inventory::{MAX_REASON_LEN, NextWindow, UnknownUpdateResult, UpdateResult, UpdateStatus};
pub use limit::{LoginLimiter, LoginLimits, Refusal, Subject};
use password::PasswordPool;
pub use proxies::{PROXY_ANNOUNCE_INTERVAL, PROXY_TTL, ProxyRecord};
pub use rules::{AccessRules, WATCHED_PREFIXES};
pub use served::{ResourceRoute, RouteError, ServedKind, ServedResource, direct_ip_allowed};

/// The SSH principal of a user without logins (a leading `-` is never a Unix user name).
pub(crate) const NO_LOGIN_PRINCIPAL: &str = "-svc-no-login";
/// How long the CAs are valid when the Auth Service creates them.
pub(crate) const CA_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long host certificates issued at join are valid.
pub const HOST_CERT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// The longest an app JWT ([`AuthService::sign_app_jwt`]) is valid.
pub const APP_JWT_TTL: Duration = Duration::from_secs(10 * 60);
/// The default (and longest) lifetime of user certificates: short-lived by design.
pub const USER_CERT_TTL: Duration = Duration::from_secs(12 * 3600);
/// The default lifetime of a join token.
pub(crate) const TOKEN_TTL: Duration = Duration::from_secs(30 * 60);
/// How often agents heartbeat ([`AuthService::heartbeat`]).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// An inventory row disappears when no heartbeat arrived for this long: three missed
/// heartbeats.
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(3 * HEARTBEAT_INTERVAL.as_secs());

/// Why an Auth Service call failed. Messages never contain secrets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// RBAC refused the call.
    #[error(transparent)]
    AccessDenied(#[from] AccessDenied),
    /// The resource, user or row does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The resource exists and the caller did not ask to overwrite it.
    #[error("{0} already exists (use -f to overwrite)")]
    AlreadyExists(String),
    /// Another writer changed the value since the caller read it.
    #[error("{what} was changed concurrently: expected revision {expected}, found {found}; read it again")]
    Conflict {
        /// The resource.
        what: String,
        /// The revision the caller read.
        expected: String,
        /// The revision stored now.
        found: String,
    },
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Sign-in failed. Deliberately the same message for an unknown user and a wrong password.
    #[error("invalid username or password")]
    BadCredentials,
    /// A join token was refused; nothing was issued.
    #[error("join refused: {0}")]
    JoinRefused(&'static str),
    /// Too many failed sign-ins or joins: the user or the source address is locked (or has too
    /// many attempts in progress). Nothing was checked.
    #[error("{what} refused: {refusal}")]
    Limited {
        /// `sign-in` or `join`.
        what: &'static str,
        /// Who is limited, and until when.
        refusal: Refusal,
    },
    /// The Auth Service has too much work queued (password checks); try again later.
    #[error("the Auth Service is busy: {0}")]
    Busy(String),
    /// A joining or heartbeating agent claims a node name that another live agent holds.
    #[error(
        "node name \"{name}\" is already held by another live agent (host {holder}); give this agent another nodename, or stop the other one and wait for its heartbeat to expire"
    )]
    NodeNameTaken {
        /// The node name claimed.
        name: String,
        /// The host ID holding it.
        holder: String,
    },
    /// A joining agent asked for a node name or an extra certificate name it may not have.
    #[error("join refused: certificate name \"{name}\": {reason}")]
    NameRefused {
        /// The name asked for.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The caller's certificate is not acceptable for this call.
    #[error("certificate refused: {0}")]
    Unauthenticated(#[from] VerifyError),
    /// The certificate is valid but revoked: its user was deleted or is locked (a `lock`
    /// resource), or a node it concerns is locked. The text names the user or node and why.
    #[error("access refused: {0}")]
    Revoked(String),
    /// Resource text did not parse or serialize.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// A certificate could not be signed or a CA loaded.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Storage failed.
    #[error(transparent)]
    Backend(BackendError),
    /// Stored data did not decode.
    #[error("stored {what} is malformed: {reason}")]
    Corrupt {
        /// What was read.
        what: &'static str,
        /// The decoder's message.
        reason: String,
    },
}

impl From<BackendError> for AuthError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::NotFound { key } => AuthError::NotFound(key.to_string()),
            BackendError::AlreadyExists { key } => AuthError::AlreadyExists(key.to_string()),
            BackendError::RevisionMismatch { key, expected, found } => AuthError::Conflict {
                what: key.to_string(),
                expected: expected.to_string(),
                found: found.to_string(),
            },
            other => AuthError::Backend(other),
        }
    }
}

/// Who is calling, after certificate verification.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Caller {
    /// A host with the `auth` system role: the Auth Service itself and `tctl` on its host.
    Admin(HostIdentity),
    /// Another cluster member (agent or proxy).
    Host(HostIdentity),
    /// A signed-in user with the roles named in the certificate (as stored now).
    User {
        /// The verified certificate identity.
        identity: UserIdentity,
        /// The roles the certificate names.
        roles: RoleSet,
    },
}

impl Caller {
    /// Checks that the caller may do `verb` on `kind`.
    pub fn check(&self, verb: Verb, kind: &str) -> Result<(), AccessDenied> {
        match self {
            Caller::Admin(_) => Ok(()),
            Caller::User { roles, .. } => roles.check(verb, kind),
            // Agents read the maintenance window to export it to their updaters; nothing else,
            // and never a write.
            Caller::Host(_) if verb == Verb::Read && kind == Kind::ClusterMaintenanceConfig.as_str() => {
                Ok(())
            }
            Caller::Host(_) => Err(AccessDenied {
                verb,
                resource: kind.to_owned(),
            }),
        }
    }

    /// Whether the caller is a cluster member with `role` (the admin identity has every role).
    pub fn is_host_with(&self, role: SystemRole) -> bool {
        match self {
            Caller::Admin(_) => true,
            Caller::Host(host) => host.has_role(role),
            Caller::User { .. } => false,
        }
    }
}

/// What `tctl status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The cluster name.
    pub cluster_name: String,
    /// The Auth Service version.
    pub version: String,
    /// `sha256:<hex>` of the host CA's SubjectPublicKeyInfo (what agents pin).
    pub ca_pin: String,
    /// The user CA's pin.
    pub user_ca_pin: String,
}

/// The result of creating or overwriting one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The kind written.
    pub kind: Kind,
    /// `kind/name` (token names redacted).
    pub display: String,
    /// Whether it existed before (so it was updated, not created).
    pub updated: bool,
}

/// Certificates for a cluster member or user, with the CAs to trust.
#[derive(Debug, Clone)]
pub struct IssuedCerts {
    /// The host ID (`<uuid>.<cluster>`) or the user name.
    pub name: String,
    /// The X.509 certificate (DER).
    pub tls_cert: CertificateDer<'static>,
    /// The OpenSSH certificate.
    pub ssh_cert: Certificate,
    /// The CAs' public halves (host and user CA).
    pub trusted: Vec<TrustedCa>,
    /// When the certificates end.
    pub not_after: SystemTime,
}

/// What `tsh db login` asks for: a client certificate for one database, as one database user.
#[derive(Debug, Clone)]
pub struct DbCertRequest {
    /// The database's name.
    pub name: String,
    /// The database user.
    pub db_user: String,
    /// The database name, if chosen.
    pub db_name: Option<String>,
    /// The client's TLS public key, DER SubjectPublicKeyInfo.
    pub tls_public_key: Vec<u8>,
    /// Requested lifetime; never past the end of the caller's own certificate.
    pub ttl: Option<Duration>,
}

/// A database client certificate ([`AuthService::issue_db_cert`]).
#[derive(Debug, Clone)]
pub struct DbCert {
    /// The user name.
    pub name: String,
    /// The X.509 certificate (DER) carrying the route.
    pub tls_cert: CertificateDer<'static>,
    /// The CAs' public halves (host and user CA).
    pub trusted: Vec<TrustedCa>,
    /// When it ends.
    pub not_after: SystemTime,
    /// The route it carries.
    pub route: DbCertRoute,
}

/// What a joining agent sends.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    /// The join token (secret).
    pub token: Secret,
    /// The agent's node name.
    pub node_name: String,
    /// The services the agent wants to run; the token must allow each.
    pub roles: Vec<SystemRole>,
    /// Public addresses to name in the certificates.
    pub additional_names: Vec<String>,
    /// The agent's TLS public key, DER SubjectPublicKeyInfo.
    pub tls_public_key: Vec<u8>,
    /// The agent's SSH public key.
    pub ssh_public_key: PublicKey,
    /// The address the request came from (the TCP peer of the Auth API), for the per-address
    /// limit on failed joins; `None` when unknown.
    pub source: Option<IpAddr>,
}

/// What a signing-in user sends (through the proxy).
#[derive(Debug, Clone)]
pub struct LoginRequest {
    /// The user name.
    pub username: String,
    /// The password (secret).
    pub password: Secret,
    /// The user's TLS public key, DER SubjectPublicKeyInfo.
    pub tls_public_key: Vec<u8>,
    /// The user's SSH public key.
    pub ssh_public_key: PublicKey,
    /// Requested lifetime, capped at [`USER_CERT_TTL`].
    pub ttl: Option<Duration>,
    /// The user's address, for the per-address limit on failed sign-ins: what the proxy saw
    /// (trusted from proxies only, see `svc_net::auth`); `None` when unknown.
    pub source: Option<IpAddr>,
}

/// One agent's last heartbeat: a row of `tctl inventory ls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryRow {
    /// The host UUID (from the certificate, never from the request).
    pub server_id: String,
    /// The host name the agent reports.
    pub hostname: String,
    /// The services it runs (from the certificate's system roles).
    pub services: Vec<String>,
    /// The agent's version.
    pub version: String,
    /// `unit`, `kube` or empty when the agent is not enrolled in automatic updates.
    pub upgrader: String,
    /// The updater's version, if any.
    pub upgrader_version: String,
    /// When the heartbeat arrived (seconds since the Unix epoch).
    pub last_seen: u64,
    /// The updater's last decision, when the agent reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_status: Option<UpdateStatus>,
    /// The next maintenance window the agent exported for its updater, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<NextWindow>,
}

/// What an agent reports in a heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heartbeat {
    /// The host name.
    pub hostname: String,
    /// The agent's version.
    pub version: String,
    /// `unit`, `kube`, or empty (`none`).
    pub upgrader: String,
    /// The updater's version.
    pub upgrader_version: String,
    /// The applications, databases, Kubernetes clusters and desktops the agent serves; each
    /// kind needs the matching role in the agent's certificate.
    pub resources: Vec<ServedResource>,
    /// The TCP peer address the heartbeat came from, as the Auth API saw it (`None` when
    /// unknown): an announced `direct_addr` that is an IP address must be this one.
    pub source: Option<std::net::IpAddr>,
    /// The updater's last decision (`None` from agents that do not report it, or with no
    /// updater).
    pub update_status: Option<UpdateStatus>,
    /// The next maintenance window the agent exported, if any.
    pub next_window: Option<NextWindow>,
}

/// The Auth Service over a backend: CAs, users, roles, tokens, inventory.
pub struct AuthService {
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    host_ca: CertAuthority,
    user_ca: CertAuthority,
    jwt: crate::identity::jwt::JwtKey,
    verifier: Verifier,
    version: Version,
    limiter: Arc<LoginLimiter>,
    passwords: PasswordPool,
    names: HostNamePolicy,
    direct: std::sync::RwLock<DirectDialPolicy>,
    tunnel_strategy: std::sync::RwLock<crate::config::TunnelStrategy>,
    refused_direct: std::sync::Mutex<Vec<served::RefusedDirect>>,
    rules: AccessRules,
}

/// Which names a joining agent may put in its certificate besides its host ID and node name
/// (`additional_names`): never a wildcard, never a name of the cluster's Proxy or Auth Service
/// (`reserved`), and only names the Auth Service's configuration grants (`allowed`). The node
/// name itself may not contain a wildcard or be a reserved name either.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostNamePolicy {
    /// The Proxy's and Auth Service's names (public addresses, host names): no agent gets them.
    pub reserved: Vec<String>,
    /// The extra names agents may ask for (exact, case-insensitive). Empty (the default, and
    /// what `svc start` uses): none.
    pub allowed: Vec<String>,
}

impl HostNamePolicy {
    pub(crate) fn is_reserved(&self, name: &str) -> bool {
        self.reserved.iter().any(|r| r.eq_ignore_ascii_case(name))
    }

    /// Checks a join request's node name and extra names.
    pub fn check(&self, node_name: &str, additional: &[String]) -> Result<(), AuthError> {
        self.check_with(node_name, additional, &[])
    }

    /// [`check`](Self::check), with `granted` (the join token's `extra_names`) allowed besides
    /// the configuration's `allowed`; a reserved name or a wildcard stays refused either way.
    pub fn check_with(
        &self,
        node_name: &str,
        additional: &[String],
        granted: &[String],
    ) -> Result<(), AuthError> {
        let refuse = |name: &str, reason| AuthError::NameRefused {
            name: name.to_owned(),
            reason,
        };
        if node_name.is_empty() {
            return Err(refuse(node_name, "a node name is required"));
        }
        if node_name.contains('*') {
            return Err(refuse(node_name, "wildcards are not allowed in a node name"));
        }
        if node_name.contains('/') {
            return Err(refuse(node_name, "a node name cannot contain '/'"));
        }
        if self.is_reserved(node_name) {
            return Err(refuse(
                node_name,
                "it is a name of the cluster's Proxy or Auth Service",
            ));
        }
        for name in additional {
            if name.contains('*') {
                return Err(refuse(name, "wildcard certificate names are not allowed"));
            }
            if self.is_reserved(name) {
                return Err(refuse(
                    name,
                    "it is a name of the cluster's Proxy or Auth Service",
                ));
            }
            if !self
                .allowed
                .iter()
                .chain(granted)
                .any(|a| a.eq_ignore_ascii_case(name))
            {
                return Err(refuse(
                    name,
                    "not an extra name the join token or the Auth Service grants to agents",
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for AuthService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthService")
            .field("cluster", &self.cluster())
            .field("ca_pin", &self.host_ca.ca_pin())
            .finish_non_exhaustive()
    }
}

impl AuthService {
    /// Opens the Auth Service of `cluster` on `backend`: loads the CAs, or creates them on
    /// first start, and stores the preset roles that are missing.
    pub async fn open(
        backend: Arc<dyn Backend>,
        cluster: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthError> {
        let host_ca = load_or_create_ca(backend.as_ref(), IdentityKind::Host, cluster, clock.now()).await?;
        let user_ca = load_or_create_ca(backend.as_ref(), IdentityKind::User, cluster, clock.now()).await?;
        let jwt = load_or_create_jwt_key(backend.as_ref(), cluster).await?;
        let verifier = Verifier::new(cluster, [host_ca.trusted(), user_ca.trusted()])?;
        let auth = Self {
            limiter: Arc::new(LoginLimiter::new(LoginLimits::default(), clock.clone())),
            passwords: PasswordPool::for_this_machine(),
            rules: AccessRules::new(backend.clone(), verifier.clone(), clock.clone()),
            backend,
            clock,
            host_ca,
            user_ca,
            jwt,
            verifier,
            version: crate::version::current().clone(),
            names: HostNamePolicy::default(),
            direct: std::sync::RwLock::new(DirectDialPolicy::default()),
            tunnel_strategy: std::sync::RwLock::new(crate::config::TunnelStrategy::default()),
            refused_direct: std::sync::Mutex::new(Vec::new()),
        };
        for role in preset_roles(Vec::<String>::new()) {
            let resource = Resource::Role(role);
            match auth.store().create(&resource).await {
                Ok(_) | Err(AuthError::AlreadyExists(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(auth)
    }

    /// Replaces the sign-in and join limits (`auth_service.authentication`); failures counted
    /// so far are forgotten.
    pub fn with_login_limits(mut self, limits: LoginLimits) -> Self {
        self.limiter = Arc::new(LoginLimiter::new(limits, self.clock.clone()));
        self
    }

    /// The sign-in and join limiter (to inspect locks).
    pub fn limiter(&self) -> &LoginLimiter {
        &self.limiter
    }

    /// Password checks running now and callers waiting for one: argon2 runs on a bounded
    /// blocking pool, never on the async workers.
    pub fn password_load(&self) -> (usize, usize) {
        self.passwords.load()
    }

    fn store(&self) -> store::Store<'_> {
        store::Store::new(self.backend.as_ref())
    }

    fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// Sets which names joining agents may (not) put in their certificates.
    pub fn set_host_name_policy(&mut self, policy: HostNamePolicy) {
        self.names = policy;
    }

    /// Sets how agents spread their tunnels over the proxies (`auth_service.tunnel_strategy`).
    pub fn set_tunnel_strategy(&self, strategy: crate::config::TunnelStrategy) {
        *self
            .tunnel_strategy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = strategy;
    }

    /// The cluster's tunnel strategy (`auth_service.tunnel_strategy`), as proxies are told it
    /// with the list of proxies.
    pub fn tunnel_strategy(&self) -> crate::config::TunnelStrategy {
        *self
            .tunnel_strategy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets which listeners directly joined agents may announce (`auth_service.direct_dial`,
    /// and the addresses the cluster's services listen on).
    pub fn set_direct_dial_policy(&self, policy: DirectDialPolicy) {
        *self
            .direct
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
    }

    /// Adds addresses the cluster's own services listen on (the proxy's, once bound): agents
    /// may never announce them.
    pub fn add_service_addrs(&self, addrs: impl IntoIterator<Item = std::net::SocketAddr>) {
        let mut policy = self
            .direct
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for addr in addrs {
            if !policy.service_addrs.contains(&addr) {
                policy.service_addrs.push(addr);
            }
        }
    }

    /// The policy for announced listeners now in force.
    pub fn direct_dial_policy(&self) -> DirectDialPolicy {
        self.direct
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The cluster name.
    pub fn cluster(&self) -> &str {
        self.host_ca.cluster()
    }

    /// The verifier for client certificates (host and user CA of this cluster).
    pub fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    /// The host CA's pin.
    pub fn ca_pin(&self) -> String {
        self.host_ca.ca_pin()
    }

    /// The public keys of the cluster's JWT key, as served at `/.well-known/jwks.json`.
    pub fn jwks(&self) -> crate::identity::jwt::Jwks {
        self.jwt.jwks()
    }

    /// A JWT for web app `app`, for the user holding `user_cert`, signed with the cluster's JWT
    /// key: claims `sub`/`username` and `roles` from the certificate, `iss` the cluster, `aud`
    /// the app's URI, valid for [`APP_JWT_TTL`] and never past the certificate. Only a proxy
    /// may ask (it presents the user's certificate); the user's roles must allow the app (the
    /// inner `Err` says why not), and a locked or deleted user is refused.
    pub async fn sign_app_jwt(
        &self,
        caller: &Caller,
        user_cert: &[CertificateDer<'_>],
        app: &str,
    ) -> Result<Result<(String, SystemTime), RouteError>, AuthError> {
        if !caller.is_host_with(SystemRole::Proxy) {
            return Err(AccessDenied {
                verb: Verb::Create,
                resource: "app_jwt".into(),
            }
            .into());
        }
        let route = match self
            .rules
            .resolve_resource(caller, Some(user_cert), ServedKind::App, app)
            .await?
        {
            Ok(route) => route,
            Err(e) => return Ok(Err(e)),
        };
        let now = self.now();
        let user = self.verifier.verify_user_x509(user_cert, now)?;
        let left = user
            .validity
            .not_after
            .duration_since(now)
            .unwrap_or(Duration::ZERO);
        let ttl = APP_JWT_TTL.min(left);
        let claims = self
            .jwt
            .claims(&user.username, &user.roles, &route.resource.target, now, ttl);
        let jwt = self.jwt.sign(&claims)?;
        Ok(Ok((jwt, now + ttl)))
    }

    /// The public halves of both CAs.
    pub fn trusted(&self) -> Vec<TrustedCa> {
        vec![self.host_ca.trusted(), self.user_ca.trusted()]
    }

    /// The backend (shared with the rest of the process).
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Signs host certificates directly, without a token: for the Auth Service's own server
    /// identity, the admin identity and an in-process proxy. Not reachable over the API.
    pub fn issue_host_certs(
        &self,
        req: &HostCertRequest,
        tls_public_key: &[u8],
        ssh_public_key: &PublicKey,
    ) -> Result<IssuedCerts, AuthError> {
        let now = self.now();
        let tls_cert = self.host_ca.sign_host_x509(req, tls_public_key, now)?;
        let ssh_cert = self.host_ca.sign_host_ssh(req, ssh_public_key, now)?;
        Ok(IssuedCerts {
            name: crate::identity::host_id(&req.host_uuid, self.cluster()),
            not_after: (now + req.ttl).min(self.host_ca.not_after()),
            tls_cert,
            ssh_cert,
            trusted: self.trusted(),
        })
    }

    /// Renews a cluster member's host certificates (the caller's own, verified): the same host
    /// ID, node name, roles and names for fresh keys, valid for `ttl` (at most, and by default,
    /// [`HOST_CERT_TTL`]). Users and the admin identity cannot renew this way.
    pub fn renew_host_certs(
        &self,
        caller: &Caller,
        tls_public_key: &[u8],
        ssh_public_key: &PublicKey,
        ttl: Option<Duration>,
    ) -> Result<IssuedCerts, AuthError> {
        let Caller::Host(host) = caller else {
            return Err(AccessDenied {
                verb: Verb::Update,
                resource: "host certificate".into(),
            }
            .into());
        };
        let uuid = host
            .host_id
            .split_once('.')
            .map_or(host.host_id.as_str(), |(uuid, _)| uuid);
        let host_uuid = uuid::Uuid::parse_str(uuid)
            .map_err(|e| AuthError::Invalid(format!("host ID {:?}: {e}", host.host_id)))?;
        let req = HostCertRequest {
            host_uuid,
            node_name: host.node_name.clone(),
            roles: host.roles.clone(),
            additional_names: host.additional_names.clone(),
            ttl: ttl.unwrap_or(HOST_CERT_TTL).min(HOST_CERT_TTL),
        };
        self.issue_host_certs(&req, tls_public_key, ssh_public_key)
    }

    /// Turns a verified certificate identity into a [`Caller`], loading the user's roles as
    /// stored now (a role named in the certificate that no longer exists grants nothing). The
    /// certificate of a user who no longer exists, or who is locked, is refused
    /// ([`AuthError::Revoked`]).
    pub async fn caller(&self, identity: Identity) -> Result<Caller, AuthError> {
        self.rules.caller(identity).await
    }

    /// Why the certificates of `username` no longer work, if they do not: the user was
    /// deleted, or a live lock targets them.
    pub(crate) async fn user_revoked(&self, username: &str) -> Result<Option<String>, AuthError> {
        self.rules.user_revoked(username).await
    }

    /// Verifies an X.509 chain presented by a client and returns the caller.
    pub async fn authenticate(&self, chain: &[CertificateDer<'_>]) -> Result<Caller, AuthError> {
        let identity = self.verifier.verify_any_x509(chain, self.now())?;
        self.caller(identity).await
    }

    /// `tctl status`: cluster name, version, CA pin. Any authenticated caller may ask.
    pub fn status(&self, _caller: &Caller) -> ClusterStatus {
        ClusterStatus {
            cluster_name: self.cluster().to_owned(),
            version: self.version.to_string(),
            ca_pin: self.host_ca.ca_pin(),
            user_ca_pin: self.user_ca.ca_pin(),
        }
    }

    /// `tctl create [-f]`: creates each resource (verb `create`), or with `overwrite` replaces an
    /// existing one (verb `update`). Stops at the first failure; earlier documents stay written.
    pub async fn put_resources(
        &self,
        caller: &Caller,
        resources: Vec<Resource>,
        overwrite: bool,
    ) -> Result<Vec<Written>, AuthError> {
        let mut out = Vec::with_capacity(resources.len());
        for resource in resources {
            let kind = resource.kind();
            let existing = self.store().get_item(kind, resource.name()).await?;
            let updated = existing.is_some();
            match existing {
                None => {
                    caller.check(Verb::Create, kind.as_str())?;
                    self.store().create(&resource).await?;
                }
                Some(_) if !overwrite => {
                    caller.check(Verb::Create, kind.as_str())?;
                    return Err(AuthError::AlreadyExists(resource.to_string()));
                }
                Some(item) => {
                    caller.check(Verb::Update, kind.as_str())?;
                    // A revision in the document pins the write to what the editor read.
                    let expected = match resource.revision() {
                        Some(rev) => rev.as_str().parse().map(crate::backend::Revision).map_err(|_| {
                            AuthError::Invalid(format!(
                                "metadata.revision: expected a number, found {:?}",
                                rev.as_str()
                            ))
                        })?,
                        None => item.revision,
                    };
                    self.store().swap(expected, &resource).await?;
                }
            }
            out.push(Written {
                kind,
                display: resource.to_string(),
                updated,
            });
        }
        Ok(out)
    }

    /// `tctl get KIND/NAME`: one resource (verb `read`), without secrets unless asked (and
    /// asking for secrets needs `read` too: the same verb Teleport uses).
    pub async fn get_resource(
        &self,
        caller: &Caller,
        kind: Kind,
        name: &str,
        with_secrets: bool,
    ) -> Result<Resource, AuthError> {
        caller.check(Verb::Read, kind.as_str())?;
        let resource = self
            .store()
            .get(kind, name)
            .await?
            .filter(|r| !r.is_expired(self.now()))
            .ok_or_else(|| AuthError::NotFound(redacted_ref(kind, name)))?;
        Ok(if with_secrets {
            resource
        } else {
            resource.without_secrets()
        })
    }

    /// `tctl get KIND`: every resource of a kind (verb `list`; with secrets also `read`).
    pub async fn list_resources(
        &self,
        caller: &Caller,
        kind: Kind,
        with_secrets: bool,
    ) -> Result<Vec<Resource>, AuthError> {
        caller.check(Verb::List, kind.as_str())?;
        if with_secrets {
            caller.check(Verb::Read, kind.as_str())?;
        }
        let now = self.now();
        Ok(self
            .store()
            .list(kind)
            .await?
            .into_iter()
            .filter(|r| !r.is_expired(now))
            .map(|r| if with_secrets { r } else { r.without_secrets() })
            .collect())
    }

    /// `tctl rm KIND/NAME` (verb `delete`). Removing a user removes its password too.
    pub async fn delete_resource(&self, caller: &Caller, kind: Kind, name: &str) -> Result<(), AuthError> {
        caller.check(Verb::Delete, kind.as_str())?;
        self.store().delete(kind, name).await.map_err(|e| match e {
            AuthError::NotFound(_) => AuthError::NotFound(redacted_ref(kind, name)),
            other => other,
        })?;
        if kind == Kind::User {
            match self.backend.delete(&password_key(name)).await {
                Ok(_) | Err(BackendError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// `tctl users add`: creates a local user with a password (verb `create` on `user`).
    pub async fn create_user(&self, caller: &Caller, user: User, password: &Secret) -> Result<(), AuthError> {
        caller.check(Verb::Create, Kind::User.as_str())?;
        check_password_strength(password)?;
        let name = user.metadata.name.clone();
        let hash = self.passwords.hash(password).await?;
        self.store().create(&Resource::User(user)).await?;
        // The user exists from here on; the password follows (a crash in between leaves a user
        // who cannot sign in until `tctl users add` is repeated after `tctl users rm`).
        self.backend
            .put(Item::new(password_key(&name), hash.into_inner().into_bytes()))
            .await?;
        Ok(())
    }

    /// `tctl users update NAME --set-roles`: replaces the user's roles (verb `update` on `user`),
    /// compare-and-swap on the revision read. Returns the user as stored.
    pub async fn set_user_roles(
        &self,
        caller: &Caller,
        name: &str,
        roles: Vec<String>,
    ) -> Result<User, AuthError> {
        caller.check(Verb::Update, Kind::User.as_str())?;
        let item = self
            .store()
            .get_item(Kind::User, name)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("user {name}")))?;
        let Resource::User(mut user) = store::decode(&item)? else {
            return Err(AuthError::Corrupt {
                what: "user",
                reason: "not a user resource".into(),
            });
        };
        user.spec.roles = roles;
        user.metadata.revision = None;
        self.store()
            .swap(item.revision, &Resource::User(user.clone()))
            .await?;
        Ok(user)
    }

    /// `tctl tokens add`: a new random join token for `roles`, valid for `ttl` (verb `create` on
    /// `token`). The returned token holds the secret value: show it to the operator once.
    pub async fn create_token(
        &self,
        caller: &Caller,
        roles: Vec<JoinRole>,
        ttl: Option<Duration>,
    ) -> Result<Token, AuthError> {
        self.create_token_with_names(caller, roles, ttl, Vec::new()).await
    }

    /// [`create_token`](Self::create_token) granting `extra_names`: the extra certificate names
    /// an agent joining with it may ask for (`tctl tokens add --extra-names`). Wildcards and the
    /// names of the cluster's Proxy and Auth Service are refused here, before any token exists.
    pub async fn create_token_with_names(
        &self,
        caller: &Caller,
        roles: Vec<JoinRole>,
        ttl: Option<Duration>,
        extra_names: Vec<String>,
    ) -> Result<Token, AuthError> {
        caller.check(Verb::Create, Kind::Token.as_str())?;
        for name in &extra_names {
            if let Some(why) = crate::resource::extra_name_problem(name) {
                return Err(AuthError::Invalid(format!("extra name {name:?}: {why}")));
            }
            if self.names.is_reserved(name) {
                return Err(AuthError::Invalid(format!(
                    "extra name {name:?}: it is a name of the cluster's Proxy or Auth Service"
                )));
            }
        }
        if roles.is_empty() {
            return Err(AuthError::Invalid("a token needs at least one role".into()));
        }
        let value = Secret::new(hex::encode(password::random_bytes::<16>()?));
        let expires = self.now() + ttl.unwrap_or(TOKEN_TTL);
        let token =
            Token::new(value, roles, Some(time::OffsetDateTime::from(expires))).with_extra_names(extra_names);
        self.store().create(&Resource::Token(token.clone())).await?;
        Ok(token)
    }

    /// Join: an agent presents a token (once, before it expires) and gets a host ID and host
    /// certificates for the roles it asks for, each of which the token must allow. On any
    /// refusal nothing is issued and the token is left as it was.
    ///
    /// Failed joins count against the source address ([`LoginLimits::max_source_failures`]); a
    /// locked address is refused before the token is looked at.
    pub async fn join(&self, req: &JoinRequest) -> Result<IssuedCerts, AuthError> {
        let attempt = self
            .limiter
            .begin(None, req.source)
            .map_err(|refusal| AuthError::Limited {
                what: "join",
                refusal,
            })?;
        let result = self.join_unlimited(req).await;
        match &result {
            Ok(_) => attempt.succeeded(),
            Err(AuthError::JoinRefused(_)) => attempt.failed(),
            // Storage or signing trouble says nothing about the caller.
            Err(_) => attempt.cancelled(),
        }
        result
    }

    async fn join_unlimited(&self, req: &JoinRequest) -> Result<IssuedCerts, AuthError> {
        const INVALID: &str = "the join token is invalid";
        let name = req.token.expose();
        if name.is_empty() || name.contains('/') {
            return Err(AuthError::JoinRefused(INVALID));
        }
        let item = self
            .store()
            .get_item(Kind::Token, name)
            .await?
            .ok_or(AuthError::JoinRefused(INVALID))?;
        if item.value == store::USED_TOKEN {
            return Err(AuthError::JoinRefused("the join token was already used"));
        }
        let Resource::Token(token) = store::decode(&item)? else {
            return Err(AuthError::JoinRefused(INVALID));
        };
        if token.is_expired(self.now()) {
            return Err(AuthError::JoinRefused("the join token has expired"));
        }
        if req.roles.is_empty() {
            return Err(AuthError::JoinRefused("the agent asked for no role"));
        }
        for role in &req.roles {
            let allowed = JoinRole::ALL
                .iter()
                .find(|j| j.as_str() == role.as_str())
                .is_some_and(|j| token.allows(*j));
            if !allowed {
                return Err(AuthError::JoinRefused(
                    "the join token does not allow a requested role",
                ));
            }
        }
        self.names
            .check_with(&req.node_name, &req.additional_names, &token.spec.extra_names)?;
        if let Some(holder) = self.node_name_holder(&req.node_name).await? {
            return Err(AuthError::NodeNameTaken {
                name: req.node_name.clone(),
                holder,
            });
        }
        let host_req = HostCertRequest {
            host_uuid: uuid::Uuid::new_v4(),
            node_name: req.node_name.clone(),
            roles: req.roles.clone(),
            additional_names: req.additional_names.clone(),
            ttl: HOST_CERT_TTL,
        };
        // Sign first (a bad key refuses the join and keeps the token), then spend the token:
        // the compare-and-swap lets exactly one of two concurrent joiners through.
        let certs = self.issue_host_certs(&host_req, &req.tls_public_key, &req.ssh_public_key)?;
        let mut used = Item::new(item.key.clone(), store::USED_TOKEN.to_vec());
        used.expires = item.expires;
        match self.backend.compare_and_swap(item.revision, used).await {
            Ok(_) => Ok(certs),
            Err(BackendError::RevisionMismatch { .. } | BackendError::NotFound { .. }) => {
                Err(AuthError::JoinRefused("the join token was already used"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Sign-in with a password, called by a proxy (host with the `proxy` role) on behalf of a
    /// user. Returns short-lived user certificates carrying the user's current roles.
    ///
    /// Failed sign-ins count against the user and the source address ([`LoginLimits`]); a locked
    /// user or address is refused before the password is checked, the right password too. The
    /// password is checked on the bounded blocking pool ([`password_load`](Self::password_load)).
    pub async fn login(&self, caller: &Caller, req: &LoginRequest) -> Result<IssuedCerts, AuthError> {
        if !caller.is_host_with(SystemRole::Proxy) {
            return Err(AccessDenied {
                verb: Verb::Create,
                resource: "user_session".into(),
            }
            .into());
        }
        let attempt = self
            .limiter
            .begin(Some(&req.username), req.source)
            .map_err(|refusal| AuthError::Limited {
                what: "sign-in",
                refusal,
            })?;
        let user = match self.check_password(req).await {
            Ok(user) => {
                attempt.succeeded();
                user
            }
            Err(e @ AuthError::BadCredentials) => {
                attempt.failed();
                return Err(e);
            }
            Err(e) => {
                attempt.cancelled();
                return Err(e);
            }
        };
        if let Some(refusal) = self.user_revoked(&user.metadata.name).await? {
            return Err(AuthError::Revoked(refusal));
        }
        self.issue_user_certs(user, req).await
    }

    /// A database client certificate for the calling user (`tsh db login`): the same user and
    /// roles as the caller's certificate, plus the route (database, protocol, database user and
    /// name). The roles must allow the database by its labels and the user and name by
    /// `db_users`/`db_names` ([`AccessRules::resolve_db`]); the inner `Err` names the database
    /// and why not. The certificate ends with the caller's own at the latest, and carries no
    /// SSH half.
    pub async fn issue_db_cert(
        &self,
        caller: &Caller,
        req: &DbCertRequest,
    ) -> Result<Result<DbCert, RouteError>, AuthError> {
        // A database certificate cannot mint others: only a session certificate may ask.
        let Caller::User { identity, .. } = caller.clone() else {
            return Err(AccessDenied {
                verb: Verb::Create,
                resource: "db_certificate".into(),
            }
            .into());
        };
        if identity.db_route.is_some() {
            return Err(AccessDenied {
                verb: Verb::Create,
                resource: "db_certificate".into(),
            }
            .into());
        }
        let route = match self
            .rules
            .resolve_db(caller, None, &req.name, &req.db_user, req.db_name.as_deref())
            .await?
        {
            Ok(route) => route,
            Err(e) => return Ok(Err(e)),
        };
        let now = self.now();
        let left = identity
            .validity
            .not_after
            .duration_since(now)
            .unwrap_or(Duration::ZERO);
        let ttl = req.ttl.unwrap_or(left).min(left).min(USER_CERT_TTL);
        let db_route = DbCertRoute {
            service: req.name.clone(),
            protocol: route.resource.protocol.clone(),
            user: req.db_user.clone(),
            database: req.db_name.clone(),
        };
        let user_req = UserCertRequest {
            username: identity.username.clone(),
            roles: identity.roles.clone(),
            logins: identity.logins.clone(),
            ttl,
            db_route: Some(db_route.clone()),
            // No SSH half: a database certificate permits nothing over SSH.
            ssh_permits: crate::identity::SshPermits {
                port_forwarding: false,
                agent_forwarding: false,
            },
        };
        let tls_cert = self.user_ca.sign_user_x509(&user_req, &req.tls_public_key, now)?;
        Ok(Ok(DbCert {
            name: user_req.username,
            tls_cert,
            trusted: self.trusted(),
            not_after: (now + ttl).min(self.user_ca.not_after()),
            route: db_route,
        }))
    }

    /// The user if `req.password` is theirs; [`AuthError::BadCredentials`] for an unknown user
    /// or a wrong password, after the same argon2 effort either way.
    async fn check_password(&self, req: &LoginRequest) -> Result<User, AuthError> {
        let hash = self.backend.get(&password_key(&req.username)).await?;
        let user = self.store().get(Kind::User, &req.username).await?;
        let (Some(hash), Some(Resource::User(user))) = (hash, user) else {
            // Spend the same effort as a real check, so timing does not reveal who exists.
            let _ = self
                .passwords
                .verify(&req.password, password::DUMMY_HASH.to_owned())
                .await?;
            return Err(AuthError::BadCredentials);
        };
        let stored = String::from_utf8(hash.value).map_err(|e| AuthError::Corrupt {
            what: "password hash",
            reason: e.to_string(),
        })?;
        if !self.passwords.verify(&req.password, stored).await? {
            return Err(AuthError::BadCredentials);
        }
        Ok(user)
    }

    async fn issue_user_certs(&self, user: User, req: &LoginRequest) -> Result<IssuedCerts, AuthError> {
        let mut roles = Vec::new();
        for name in &user.spec.roles {
            if let Some(Resource::Role(role)) = self.store().get(Kind::Role, name).await? {
                roles.push(role);
            }
        }
        let roles = RoleSet::new(roles);
        let mut logins: Vec<String> = roles.logins().into_iter().collect();
        for login in user.logins() {
            // A role's `deny.logins` removes a login the user's traits grant, too.
            if !logins.contains(login) && !roles.login_denied(login) {
                logins.push(login.clone());
            }
        }
        if logins.is_empty() {
            // An OpenSSH certificate needs a principal; this one can never be a Unix login.
            logins.push(NO_LOGIN_PRINCIPAL.to_owned());
        }
        let ttl = req.ttl.unwrap_or(USER_CERT_TTL).min(USER_CERT_TTL);
        let user_req = UserCertRequest {
            username: user.metadata.name.clone(),
            roles: user.spec.roles.clone(),
            logins,
            ttl,
            db_route: None,
            ssh_permits: roles.ssh_permits(),
        };
        let now = self.now();
        let tls_cert = self.user_ca.sign_user_x509(&user_req, &req.tls_public_key, now)?;
        let ssh_cert = self.user_ca.sign_user_ssh(&user_req, &req.ssh_public_key, now)?;
        Ok(IssuedCerts {
            name: user_req.username,
            tls_cert,
            ssh_cert,
            trusted: self.trusted(),
            not_after: (now + ttl).min(self.user_ca.not_after()),
        })
    }

    /// An agent's heartbeat: stores its inventory row, keyed by the host ID in its certificate,
    /// expiring after [`HEARTBEAT_TTL`]. Users cannot heartbeat.
    pub async fn heartbeat(&self, caller: &Caller, beat: Heartbeat) -> Result<(), AuthError> {
        let (Caller::Host(host) | Caller::Admin(host)) = caller else {
            return Err(AccessDenied {
                verb: Verb::Update,
                resource: "inventory".into(),
            }
            .into());
        };
        let now = self.now();
        let server_id = host
            .host_id
            .strip_suffix(&format!(".{}", host.cluster))
            .unwrap_or(&host.host_id)
            .to_owned();
        self.claim_node_name(host).await?;
        self.store_served(host, &beat.hostname, beat.source, beat.resources)
            .await?;
        let row = InventoryRow {
            server_id,
            hostname: beat.hostname,
            services: host.roles.iter().map(|r| r.as_str().to_owned()).collect(),
            version: beat.version,
            upgrader: beat.upgrader,
            upgrader_version: beat.upgrader_version,
            last_seen: now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            update_status: beat.update_status.map(UpdateStatus::bounded),
            next_window: beat.next_window,
        };
        let value = serde_json::to_vec(&row).map_err(|e| AuthError::Corrupt {
            what: "inventory row",
            reason: e.to_string(),
        })?;
        self.backend
            .put(Item::new(inventory_key(&host.host_id), value).with_expiry(now + HEARTBEAT_TTL))
            .await?;
        Ok(())
    }

    /// The host ID of the live agent holding `node_name`, if any.
    async fn node_name_holder(&self, node_name: &str) -> Result<Option<String>, AuthError> {
        Ok(self
            .backend
            .get(&node_name_key(node_name))
            .await?
            .filter(|item| !item.is_expired(self.now()))
            .map(|item| String::from_utf8_lossy(&item.value).into_owned()))
    }

    /// Frees `node_name` whoever holds it. For the agent that runs inside the Auth Service's
    /// own process (`svc start` all in one): it gets a new host ID on every start, and takes its
    /// name over from its previous run at once instead of waiting for that lease to expire.
    /// The previous holder's announcements go with the name: until the new agent's first
    /// heartbeat, a dial by name would otherwise pick the previous run's host ID, whose tunnel
    /// never comes back. Not reachable over the API.
    pub async fn release_node_name(&self, node_name: &str) -> Result<(), AuthError> {
        if let Some(previous) = self.node_name_holder(node_name).await? {
            match self.backend.delete(&served::served_key(&previous)).await {
                Ok(_) | Err(BackendError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        match self.backend.delete(&node_name_key(node_name)).await {
            Ok(_) | Err(BackendError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Holds (or renews) the node name in `host`'s certificate for it until its heartbeat
    /// expires; refuses when another live agent holds the name. Compare-and-swap: of two
    /// agents racing for a free name, one wins.
    async fn claim_node_name(&self, host: &HostIdentity) -> Result<(), AuthError> {
        let key = node_name_key(&host.node_name);
        let now = self.now();
        let taken = |holder: &[u8]| AuthError::NodeNameTaken {
            name: host.node_name.clone(),
            holder: String::from_utf8_lossy(holder).into_owned(),
        };
        let lease = Item::new(key.clone(), host.host_id.as_bytes().to_vec()).with_expiry(now + HEARTBEAT_TTL);
        let written = match self.backend.get(&key).await? {
            Some(item) if !item.is_expired(now) && item.value != host.host_id.as_bytes() => {
                return Err(taken(&item.value));
            }
            Some(item) => self.backend.compare_and_swap(item.revision, lease).await,
            None => self.backend.create(lease).await,
        };
        match written {
            Ok(_) => Ok(()),
            Err(BackendError::RevisionMismatch { .. } | BackendError::AlreadyExists { .. }) => {
                match self.node_name_holder(&host.node_name).await? {
                    Some(holder) if holder != host.host_id => Err(taken(holder.as_bytes())),
                    _ => Ok(()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `tctl inventory ls`: the live agents (verb `list` on `inventory`), sorted by host name.
    pub async fn inventory(&self, caller: &Caller) -> Result<Vec<InventoryRow>, AuthError> {
        caller.check(Verb::List, "inventory")?;
        let now = self.now();
        let mut rows = Vec::new();
        for item in self
            .backend
            .range(&KeyRange::prefix(Key::from("/inventory/")))
            .await?
        {
            if item.is_expired(now) {
                continue;
            }
            let row: InventoryRow = serde_json::from_slice(&item.value).map_err(|e| AuthError::Corrupt {
                what: "inventory row",
                reason: e.to_string(),
            })?;
            rows.push(row);
        }
        rows.sort_by(|a, b| (&a.hostname, &a.server_id).cmp(&(&b.hostname, &b.server_id)));
        Ok(rows)
    }
}

/// `user "bob" is locked: MESSAGE` (the message sanitised: one line, no control characters).
fn lock_refusal(lock: &Lock) -> String {
    match lock.spec.message.as_deref().map(str::trim) {
        Some(m) if !m.is_empty() => {
            let m: String = m.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
            format!("{} is locked: {m}", lock.target_text())
        }
        _ => format!("{} is locked", lock.target_text()),
    }
}

/// The CA pin (`sha256:<hex of the SubjectPublicKeyInfo>`) of a DER certificate: what a joining
/// agent compares with the `--ca-pin` it was given before trusting the Auth Service.
pub fn ca_pin_of_cert(der: &[u8]) -> Result<String, AuthError> {
    use sha2::{Digest, Sha256};
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| AuthError::Invalid(format!("certificate: {e}")))?;
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(cert.public_key().raw))
    ))
}

fn redacted_ref(kind: Kind, name: &str) -> String {
    if kind == Kind::Token {
        "token/***".to_owned()
    } else {
        format!("{kind}/{name}")
    }
}

fn password_key(user: &str) -> Key {
    Key::from_segments(["passwords", user])
}

fn node_name_key(node_name: &str) -> Key {
    Key::from_segments(["nodenames", node_name])
}

fn inventory_key(host_id: &str) -> Key {
    Key::from_segments(["inventory", host_id])
}

fn check_password_strength(password: &Secret) -> Result<(), AuthError> {
    if password.expose().chars().count() < 8 {
        return Err(AuthError::Invalid(
            "a password needs at least 8 characters".into(),
        ));
    }
    Ok(())
}

async fn load_or_create_jwt_key(
    backend: &dyn Backend,
    cluster: &str,
) -> Result<crate::identity::jwt::JwtKey, AuthError> {
    use crate::identity::jwt::JwtKey;
    if let Some(key) = JwtKey::load(backend, cluster).await? {
        return Ok(key);
    }
    let key = JwtKey::generate(cluster)?;
    match key.save(backend).await {
        Ok(_) => Ok(key),
        // Another Auth Service on the same backend won the race: use its key.
        Err(IdentityError::Backend(BackendError::AlreadyExists { .. })) => JwtKey::load(backend, cluster)
            .await?
            .ok_or_else(|| AuthError::NotFound("JWT key".into())),
        Err(e) => Err(e.into()),
    }
}

async fn load_or_create_ca(
    backend: &dyn Backend,
    kind: IdentityKind,
    cluster: &str,
    now: SystemTime,
) -> Result<CertAuthority, AuthError> {
    if let Some(ca) = CertAuthority::load(backend, kind, cluster).await? {
        return Ok(ca);
    }
    let ca = CertAuthority::generate(kind, cluster, now, CA_TTL)?;
    match ca.save(backend).await {
        Ok(_) => Ok(ca),
        // Another Auth Service on the same backend won the race: use its CA.
        Err(IdentityError::Backend(BackendError::AlreadyExists { .. })) => {
            CertAuthority::load(backend, kind, cluster)
                .await?
                .ok_or_else(|| AuthError::NotFound(format!("{kind} CA")))
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;

//! Identity: the cluster's certificate authorities and the certificates they sign.
//!
//! Every cluster has two authorities ([`CertAuthority`]): the **host CA** signs the identities
//! of cluster members (Auth, Proxy and every agent), the **user CA** signs short-lived user
//! certificates. Each CA signs two formats from one request:
//!
//! - **X.509** (rcgen) for TLS: the Auth gRPC API on 3025, TLS routing, proxy peering, database
//!   and Kubernetes access.
//! - **OpenSSH certificates** (ssh-key) for SSH: the reverse tunnel (the SSH user is the host
//!   ID) and SSH access to nodes.
//!
//! Where it sits: the Auth Service creates the CAs on first start and stores them in the
//! [`Backend`](crate::backend::Backend) ([`CertAuthority::save`]); its API signs certificates
//! for joining agents and signing-in users; every server verifies what peers present with a
//! [`Verifier`] built from the CAs' public halves ([`TrustedCa`]), which the
//! `tctl status` CA pin ([`CertAuthority::ca_pin`]) lets a joining agent check.
//!
//! # What a certificate says
//!
//! The signer writes the identity once, as [claims](Claims), and the verifier reads back
//! exactly those claims:
//!
//! - X.509: a non-critical extension with OID [`IDENTITY_EXTENSION_OID`] whose value is the DER
//!   `SEQUENCE { version INTEGER (1), kind UTF8String, name UTF8String, cluster UTF8String,
//!   nodeName UTF8String, roles SEQUENCE OF UTF8String, logins SEQUENCE OF UTF8String,
//!   names SEQUENCE OF UTF8String, dbRoute [0] EXPLICIT SEQUENCE { service, protocol, user,
//!   database UTF8String (empty: none) } OPTIONAL }` (the database route only in database
//!   client certificates). For tools that only read names, the subject also carries
//!   `CN=<name>, O=<cluster>`, and host certificates list the host ID, node name and extra
//!   names as subject alternative names (so TLS server-name checks work).
//! - OpenSSH: key ID = name; principals = the host ID, node name and extra names (hosts) or
//!   the allowed logins (users); the extension [`SSH_IDENTITY_EXTENSION`] holds the same
//!   claims as JSON. User certificates also get the usual `permit-*` extensions.
//!
//! Host identities name the host `<uuid>.<cluster>` ([`host_id`]), carry the node name and the
//! [`SystemRole`]s of the agent. User identities carry the user name, role names and logins.

mod ca;
mod claims;
pub mod jwt;
mod ssh;
mod verify;
mod x509;

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::backend::BackendError;

pub use ca::{CertAuthority, TrustedCa};
pub use claims::Claims;
pub use verify::{Verifier, VerifyError, auth_server_identity};
pub use x509::IDENTITY_EXTENSION_OID;

/// The OpenSSH certificate extension holding the identity claims (JSON).
pub const SSH_IDENTITY_EXTENSION: &str = "svc-identity@svc.dev";

/// Certificates are valid from this long before they are signed, so a peer whose clock runs
/// a little behind accepts a certificate issued a moment ago.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Which kind of identity a certificate (or a CA) is about.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum IdentityKind {
    /// A cluster member: Auth, Proxy or an agent. Signed by the host CA.
    Host,
    /// A person or a bot. Signed by the user CA.
    User,
}

impl IdentityKind {
    /// `host` or `user`.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityKind::Host => "host",
            IdentityKind::User => "user",
        }
    }
}

impl fmt::Display for IdentityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IdentityKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "host" => Ok(IdentityKind::Host),
            "user" => Ok(IdentityKind::User),
            other => Err(UnknownName {
                what: "identity kind",
                expected: "host or user",
                found: other.to_owned(),
            }),
        }
    }
}

/// What a cluster member does; a host certificate lists every role of its agent.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
#[non_exhaustive]
pub enum SystemRole {
    /// The Auth Service.
    Auth,
    /// The Proxy Service.
    Proxy,
    /// The SSH service.
    Node,
    /// The Application service.
    App,
    /// The Database service.
    Db,
    /// The Kubernetes service.
    Kube,
    /// The Windows Desktop service.
    WindowsDesktop,
}

impl SystemRole {
    /// Every role, in declaration order.
    pub const ALL: [SystemRole; 7] = [
        SystemRole::Auth,
        SystemRole::Proxy,
        SystemRole::Node,
        SystemRole::App,
        SystemRole::Db,
        SystemRole::Kube,
        SystemRole::WindowsDesktop,
    ];

    /// The name written in certificates: `auth`, `proxy`, `node`, `app`, `db`, `kube`,
    /// `windows_desktop`.
    pub fn as_str(self) -> &'static str {
        match self {
            SystemRole::Auth => "auth",
            SystemRole::Proxy => "proxy",
            SystemRole::Node => "node",
            SystemRole::App => "app",
            SystemRole::Db => "db",
            SystemRole::Kube => "kube",
            SystemRole::WindowsDesktop => "windows_desktop",
        }
    }
}

impl fmt::Display for SystemRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SystemRole {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SystemRole::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "system role",
                expected: "auth, proxy, node, app, db, kube or windows_desktop",
                found: s.to_owned(),
            })
    }
}

/// A name that is not one of the known values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {found:?}, expected {expected}")]
pub struct UnknownName {
    what: &'static str,
    expected: &'static str,
    found: String,
}

/// The host ID of a cluster member: `<uuid>.<cluster>`. It is the SSH user of the agent's
/// reverse tunnel and the `server_id` of dial requests.
pub fn host_id(uuid: &uuid::Uuid, cluster: &str) -> String {
    format!("{uuid}.{cluster}")
}

/// When a certificate is valid: `not_before <= now < not_after` (X.509 counts `not_after`
/// itself as valid; the one-second difference is below any TTL we issue).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Validity {
    /// First valid instant.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

/// What the host CA signs for a cluster member.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HostCertRequest {
    /// The host's UUID; the host ID becomes `<uuid>.<cluster>`.
    pub host_uuid: uuid::Uuid,
    /// The node name (`hostname` unless configured).
    pub node_name: String,
    /// The agent's roles.
    pub roles: Vec<SystemRole>,
    /// More names the host answers to (public addresses: DNS names or IP addresses), added as
    /// subject alternative names and SSH principals.
    pub additional_names: Vec<String>,
    /// How long the certificate is valid.
    pub ttl: Duration,
}

/// What the user CA signs for a user.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct UserCertRequest {
    /// The user name.
    pub username: String,
    /// The user's role names (RBAC roles, not system roles).
    pub roles: Vec<String>,
    /// The OS logins the user may use over SSH (the SSH principals).
    pub logins: Vec<String>,
    /// How long the certificate is valid: user certificates are short-lived.
    pub ttl: Duration,
    /// The database route of a database client certificate (`tsh db login`), else `None`.
    pub db_route: Option<DbCertRoute>,
    /// What the user's SSH sessions may do besides running programs (the certificate's
    /// `permit-*` extensions).
    pub ssh_permits: SshPermits,
}

/// What a user's SSH sessions may do besides running programs, from the user's role options;
/// signed into the SSH certificate as OpenSSH's `permit-port-forwarding` and
/// `permit-agent-forwarding` extensions, which the SSH Service checks at each request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SshPermits {
    /// TCP port forwarding (`direct-tcpip` channels, `tcpip-forward` requests).
    pub port_forwarding: bool,
    /// SSH agent forwarding (`auth-agent-req@openssh.com`).
    pub agent_forwarding: bool,
}

impl Default for SshPermits {
    /// The role options' defaults: port forwarding allowed, agent forwarding not.
    fn default() -> Self {
        Self {
            port_forwarding: true,
            agent_forwarding: false,
        }
    }
}

impl SshPermits {
    /// The OpenSSH extension that permits port forwarding.
    pub const PORT_FORWARDING: &'static str = "permit-port-forwarding";
    /// The OpenSSH extension that permits agent forwarding.
    pub const AGENT_FORWARDING: &'static str = "permit-agent-forwarding";

    /// The permits a certificate's extensions state.
    pub fn of(cert: &ssh_key::Certificate) -> Self {
        Self {
            port_forwarding: cert.extensions().contains_key(Self::PORT_FORWARDING),
            agent_forwarding: cert.extensions().contains_key(Self::AGENT_FORWARDING),
        }
    }
}

/// The database route a database client certificate carries: which database, over which
/// protocol, as which database user (and database name). Native clients present it to the
/// proxy, which reads the route from it instead of a request line.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct DbCertRoute {
    /// The database's name (`db_service.databases[].name`).
    pub service: String,
    /// Its protocol (`postgres`, `mysql`, ...).
    pub protocol: String,
    /// The database user.
    pub user: String,
    /// The database name, if one was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
}

/// A verified cluster member.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HostIdentity {
    /// `<uuid>.<cluster>`.
    pub host_id: String,
    /// The cluster that signed it.
    pub cluster: String,
    /// The node name.
    pub node_name: String,
    /// The agent's roles.
    pub roles: Vec<SystemRole>,
    /// The additional names from the request.
    pub additional_names: Vec<String>,
    /// When the certificate is valid.
    pub validity: Validity,
}

impl HostIdentity {
    /// Whether the host has `role`.
    pub fn has_role(&self, role: SystemRole) -> bool {
        self.roles.contains(&role)
    }

    /// Whether the certificate names `host`: its host ID, the UUID part of it, its node name or
    /// one of its additional names (case-insensitive, as host names are).
    pub fn names(&self, host: &str) -> bool {
        self.host_id == host
            || self.host_id.split_once('.').is_some_and(|(uuid, _)| uuid == host)
            || self.node_name == host
            || self.additional_names.iter().any(|n| n.eq_ignore_ascii_case(host))
    }
}

/// A verified user.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct UserIdentity {
    /// The user name.
    pub username: String,
    /// The cluster that signed it.
    pub cluster: String,
    /// The user's role names.
    pub roles: Vec<String>,
    /// The OS logins allowed over SSH.
    pub logins: Vec<String>,
    /// The database route of a database client certificate (`tsh db login`).
    pub db_route: Option<DbCertRoute>,
    /// When the certificate is valid.
    pub validity: Validity,
}

/// A verified identity of either kind.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Identity {
    /// A cluster member.
    Host(HostIdentity),
    /// A user.
    User(UserIdentity),
}

impl Identity {
    /// Host or user.
    pub fn kind(&self) -> IdentityKind {
        match self {
            Identity::Host(_) => IdentityKind::Host,
            Identity::User(_) => IdentityKind::User,
        }
    }
}

/// Why a CA could not be created, loaded, stored or could not sign.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The request has a value no certificate may carry.
    #[error("invalid certificate request: {field}: {reason}")]
    InvalidRequest {
        /// The request field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A CA was asked to sign the other kind of identity.
    #[error("the {found} CA cannot sign a {expected} certificate")]
    WrongAuthority {
        /// The kind of certificate requested.
        expected: IdentityKind,
        /// The kind of the CA asked.
        found: IdentityKind,
    },
    /// Generating a key failed (no randomness).
    #[error("key generation failed: {0}")]
    KeyGeneration(String),
    /// rcgen could not build or sign an X.509 certificate.
    #[error("x509 signing failed: {0}")]
    X509(#[from] rcgen::Error),
    /// ssh-key could not build or sign an OpenSSH certificate.
    #[error("openssh signing failed: {0}")]
    Ssh(#[from] ssh_key::Error),
    /// Stored CA bytes are not what [`CertAuthority::to_stored`] writes.
    #[error("stored certificate authority is malformed: {0}")]
    MalformedStored(String),
    /// Reading or writing the CA in the backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_round_trip() {
        for role in SystemRole::ALL {
            assert_eq!(role.as_str().parse::<SystemRole>(), Ok(role));
        }
        let err = "root".parse::<SystemRole>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown system role \"root\", expected auth, proxy, node, app, db, kube or windows_desktop"
        );
        assert_eq!("user".parse::<IdentityKind>(), Ok(IdentityKind::User));
    }

    #[test]
    fn host_id_is_uuid_dot_cluster() {
        let uuid = uuid::Uuid::nil();
        assert_eq!(
            host_id(&uuid, "example.com"),
            "00000000-0000-0000-0000-000000000000.example.com"
        );
    }
}

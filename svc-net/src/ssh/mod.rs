//! SSH: what every SSH end of svc shares.
//!
//! The shared part: the transport settings ([`Tunables`], the cipher preference [`CIPHERS`]) and
//! the russh client and server configurations built from them, the deadline on a server's
//! handshake and authentication, node RBAC ([`authz`], asked twice: by the proxy's SSH entry
//! before it dials and by the node's SSH Service before it starts anything), and [`SshError`].
//! The ends themselves live with whoever runs them: the reverse tunnel
//! ([`tunnel`](crate::tunnel)), the proxy's SSH entry
//! ([`ProxySsh`](crate::proxy::ssh::ProxySsh)), the agent's SSH Service
//! ([`SshServer`](crate::agent::ssh::SshServer)), and the client hop
//! (`client::connect_via_proxy`, feature `client`): a client (`tsh ssh`, or OpenSSH with `tsh proxy ssh` as its
//! `ProxyCommand`) reaches the proxy on 3023 or the web port (ALPN `svc-proxy-ssh`), which
//! dials the agent through the tunnel; the client then runs its own SSH session over that pipe
//! to the agent's SSH Service.

pub mod authz;
mod config;
mod deadline;

pub use authz::{AuthNodeAuthorizer, NodeAuthorizer, NodeDecision, NodeDecisionFuture};
pub use config::{
    CIPHERS, DEFAULT_SERVER_KEEPALIVE, DEFAULT_SSH_AUTH_TIMEOUT, SERVER_KEEPALIVE_MAX, Tunables,
    client_config, client_config_inside_tls,
};
pub(crate) use config::{server_config, server_config_inside_tls};

pub(crate) use deadline::{StartError, authenticate_before};

/// Why an SSH operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SshError {
    /// The SSH layer failed.
    #[error("ssh: {0}")]
    Ssh(#[from] russh::Error),
    /// Dialing failed.
    #[error("dialing {addr}: {reason}")]
    Dial {
        /// The address.
        addr: String,
        /// The cause.
        reason: String,
    },
    /// The proxy refused the user's certificate.
    #[error("the proxy at {0} refused the user certificate")]
    AuthRefused(String),
    /// The proxy could not reach the node.
    #[error("the proxy could not reach {node}: {reason}")]
    NodeUnreachable {
        /// The node asked for.
        node: String,
        /// The proxy's answer.
        reason: String,
    },
    /// A deadline passed.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What was being done.
        what: &'static str,
        /// The deadline.
        after: std::time::Duration,
    },
    /// Bad input.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

impl From<StartError> for SshError {
    fn from(e: StartError) -> Self {
        match e {
            StartError::Deadline { after } => SshError::Timeout {
                what: "the SSH handshake and authentication",
                after,
            },
            StartError::Session(e) => SshError::Ssh(e),
        }
    }
}

impl From<SshError> for std::io::Error {
    fn from(e: SshError) -> Self {
        std::io::Error::other(e)
    }
}

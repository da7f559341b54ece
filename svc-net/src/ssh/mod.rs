//! SSH: the agent's SSH Service, the proxy's SSH entry for clients, and the client-side hop
//! through the proxy.
//!
//! Where it sits in the data flow: a client (`tsh ssh`, or OpenSSH with `tsh proxy ssh` as its
//! `ProxyCommand`) reaches the proxy on 3023 (plain SSH) or the web port (ALPN
//! `svc-proxy-ssh`, SSH inside TLS) — [`ProxySsh`](crate::proxy::ssh::ProxySsh) authenticates the user certificate
//! and serves the `proxy:<host>:<port>` subsystem (or `direct-tcpip`) by dialing the agent
//! through the [`TunnelDialer`](crate::tunnel::TunnelDialer) and piping bytes. The client then
//! runs its own SSH session over that pipe to the agent's [`SshServer`](crate::agent::ssh::SshServer), which
//! authenticates the user certificate again (the requested login must be one of the
//! certificate's principals), presents the agent's host certificate and runs shells and
//! commands. Node RBAC ([`authz`]) is asked twice: by the proxy before it dials, and by the
//! node before it starts anything. [`client::connect_via_proxy`] is the client half of the first hop.

pub mod authz;
pub mod client;
mod config;
mod deadline;

pub use authz::{AuthNodeAuthorizer, NodeAuthorizer, NodeDecision, NodeDecisionFuture};
pub use client::{ClientIdentity, ProxiedStream, ProxyEndpoint, connect_via_proxy};
pub(crate) use config::server_config;
pub use config::{CIPHERS, DEFAULT_SSH_AUTH_TIMEOUT, SERVER_KEEPALIVE_MAX, Tunables, client_config};

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

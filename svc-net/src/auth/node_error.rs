//! Why a node could not start.

use std::{io, path::PathBuf};

use tower::BoxError;

use crate::{
    auth::{ClientError, IdentityFileError, ServeError},
    tls::TlsError,
};

/// Why an [`AuthServer`](crate::AuthServer), [`ProxyServer`](crate::ProxyServer),
/// [`AgentNode`](crate::AgentNode) or [`Cluster`](crate::Cluster) could not start. Each variant
/// names the configuration field, file or peer involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The configuration asks for something this node cannot run.
    #[error("{0}")]
    Config(String),
    /// A listener could not be bound.
    #[error("{field} {addr}: {source}")]
    Bind {
        /// The configuration field naming the address (`proxy_service.web_listen_addr`).
        field: String,
        /// The address.
        addr: String,
        /// The bind error.
        #[source]
        source: io::Error,
    },
    /// A file or directory could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    File {
        /// What the file is for (`creating the data directory`).
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A private file or directory (the data directory, keys) could not be created, written or
    /// repaired.
    #[error("{0}")]
    Private(#[from] svc_core::fs::PrivateFsError),
    /// The backend (the cluster's storage) could not be opened.
    #[error("opening the backend in {}: {source}", path.display())]
    Backend {
        /// The data directory.
        path: PathBuf,
        /// The backend's error.
        #[source]
        source: svc_core::backend::BackendError,
    },
    /// The etcd backend (`auth_service.storage`) could not be opened: a file it names could
    /// not be read, etcd did not answer or refused the credentials, or this binary was built
    /// without etcd support (`peers` names the members).
    #[error("auth_service.storage (etcd at {peers}): {reason}")]
    Storage {
        /// The etcd members, comma-separated.
        peers: String,
        /// What failed.
        #[source]
        reason: BoxError,
    },
    /// The Auth Service refused or failed (opening the CAs, issuing certificates).
    #[error("the Auth Service: {0}")]
    Auth(#[from] svc_core::auth::AuthError),
    /// A host identity (keys and certificates) could not be made, read or saved.
    #[error("host identity: {0}")]
    Identity(#[from] IdentityFileError),
    /// The Auth API could not be reached.
    #[error("the Auth API at {addr}: {source}")]
    AuthApi {
        /// The address dialed.
        addr: String,
        /// The client's error.
        #[source]
        source: ClientError,
    },
    /// Joining the cluster failed.
    #[error("joining the cluster at {target}: {source}")]
    Join {
        /// The address joined through.
        target: String,
        /// The client's error.
        #[source]
        source: ClientError,
    },
    /// The Auth API server could not be set up.
    #[error("the Auth API: {0}")]
    AuthServe(#[from] ServeError),
    /// TLS material could not be loaded or generated.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// A component of the node could not be set up (`app_service`, the tunnel agent, the
    /// proxy's listeners).
    #[error("{what}: {source}")]
    Setup {
        /// The component.
        what: String,
        /// Its error.
        #[source]
        source: BoxError,
    },
}

impl NodeError {
    /// A [`NodeError::Setup`] for `what`.
    pub(crate) fn setup(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        NodeError::Setup {
            what: what.into(),
            source: source.into(),
        }
    }

    /// A [`NodeError::Bind`].
    pub(crate) fn bind(field: impl Into<String>, addr: impl ToString, source: io::Error) -> Self {
        NodeError::Bind {
            field: field.into(),
            addr: addr.to_string(),
            source,
        }
    }

    /// A [`NodeError::File`].
    pub(crate) fn file(what: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        NodeError::File {
            what,
            path: path.into(),
            source,
        }
    }
}

/// Binds a node's listener on `addr`; a failure names the configuration `field`.
pub(crate) async fn bind(
    field: &str,
    addr: &svc_core::Addr,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr), NodeError> {
    let listener = tokio::net::TcpListener::bind(addr.to_string())
        .await
        .map_err(|e| NodeError::bind(field, addr, e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| NodeError::bind(field, addr, e))?;
    Ok((listener, bound))
}

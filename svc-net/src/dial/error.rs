//! The dialer's error type: one enum for every way a dial can fail, each variant documented.

use std::{io, time::Duration};

use svc_core::proxy_env::ProxyEnvError;
use tower::BoxError;

/// Why a dial (direct or through an HTTP CONNECT proxy) failed.
///
/// Messages name the proxy by `host:port` and the target; they never carry credentials.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The proxy answered 407 (or 401): the credentials in the proxy URL are missing or wrong.
    #[error(
        "proxy {proxy} rejected the credentials for CONNECT {target} (status {status}): set \
         user:password in HTTPS_PROXY/HTTP_PROXY, percent-encoding special characters"
    )]
    ProxyAuthRequired {
        /// The proxy, `host:port`.
        proxy: String,
        /// The tunnel target, `host:port`.
        target: String,
        /// 407 or 401.
        status: u16,
    },
    /// The proxy answered CONNECT with another non-2xx status (403 for a port it does not allow).
    #[error("proxy {proxy} refused CONNECT {target}: status {status} {reason}")]
    ProxyRefused {
        /// The proxy, `host:port`.
        proxy: String,
        /// The tunnel target, `host:port`.
        target: String,
        /// The status code.
        status: u16,
        /// The reason phrase the proxy sent.
        reason: String,
    },
    /// The proxy's reply is not an HTTP/1.x response head.
    #[error("proxy {proxy} sent a malformed reply to CONNECT {target}: {reason}")]
    MalformedReply {
        /// The proxy, `host:port`.
        proxy: String,
        /// The tunnel target, `host:port`.
        target: String,
        /// What was wrong.
        reason: String,
    },
    /// The proxy's reply head did not end within the size limit.
    #[error(
        "proxy {proxy} sent a reply head to CONNECT {target} longer than {limit} bytes without \
         ending it"
    )]
    ReplyTooLarge {
        /// The proxy, `host:port`.
        proxy: String,
        /// The tunnel target, `host:port`.
        target: String,
        /// The limit in bytes.
        limit: usize,
    },
    /// A step did not finish within its deadline.
    #[error("timed out after {after:?} {during}")]
    Timeout {
        /// What was going on (`connecting to proxy.corp:3128`, `waiting for the reply of proxy …`).
        during: String,
        /// The deadline that ran out.
        after: Duration,
    },
    /// An I/O error.
    #[error("{during}: {source}")]
    Io {
        /// What was going on.
        during: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The TLS handshake with an `https://` proxy failed (certificate not trusted, wrong name, …).
    #[error("TLS to proxy {proxy}: {source}")]
    ProxyTls {
        /// The proxy, `host:port`.
        proxy: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The wrapped connector failed to reach the proxy.
    #[error("connecting to proxy {proxy}: {source}")]
    ConnectProxy {
        /// The proxy, `host:port`.
        proxy: String,
        /// The connector's error.
        #[source]
        source: BoxError,
    },
    /// The target cannot be dialed (no host, a host that is neither a name nor an IP, no port).
    #[error("invalid dial target \"{target}\": {reason}")]
    InvalidTarget {
        /// The target as given.
        target: String,
        /// What was wrong.
        reason: String,
    },
    /// The proxy environment is invalid.
    #[error(transparent)]
    Env(#[from] ProxyEnvError),
    /// The extra CA bundle for `https://` proxies is unusable.
    #[error("proxy CA bundle: {reason}")]
    InvalidCa {
        /// What was wrong.
        reason: String,
    },
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::Timeout { .. } => io::ErrorKind::TimedOut,
            Error::Io { source, .. } | Error::ProxyTls { source, .. } => source.kind(),
            Error::ProxyAuthRequired { .. } => io::ErrorKind::PermissionDenied,
            Error::ProxyRefused { .. } => io::ErrorKind::ConnectionRefused,
            Error::MalformedReply { .. } | Error::ReplyTooLarge { .. } => io::ErrorKind::InvalidData,
            Error::InvalidTarget { .. } | Error::Env(_) | Error::InvalidCa { .. } => {
                io::ErrorKind::InvalidInput
            }
            Error::ConnectProxy { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

//! The Proxy Service's web API as clients and the proxy both see it: the paths, and the
//! sign-in exchange of `POST /webapi/login`. No socket code: the proxy's handlers
//! (`svc_net::proxy::web`) and the clients (`svc_net::client`, the tunnel agent) share these.

use serde::{Deserialize, Serialize};

use crate::Secret;

/// Where the proxy answers the ping document.
pub const PING_PATH: &str = "/webapi/ping";

/// Where the proxy answers the find document (the ping without `auth`).
pub const FIND_PATH: &str = "/webapi/find";

/// Where the proxy signs users in with a password.
pub const LOGIN_PATH: &str = "/webapi/login";

/// The request body.
#[derive(Debug, Serialize, Deserialize)]
pub struct LoginBody {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: Secret,
    /// The TLS public key: DER SubjectPublicKeyInfo, standard base64.
    pub tls_public_key: String,
    /// The SSH public key (`authorized_keys` line).
    pub ssh_public_key: String,
    /// Requested certificate lifetime in seconds (0: the default).
    #[serde(default)]
    pub ttl_seconds: u64,
}

/// The answer: the signed certificates and where the Auth API is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoginAnswer {
    /// The user name.
    pub name: String,
    /// The cluster.
    pub cluster_name: String,
    /// The X.509 certificate (PEM).
    pub tls_cert_pem: String,
    /// The OpenSSH certificate.
    pub ssh_cert: String,
    /// The host and user CA certificates (PEM).
    pub tls_ca_pems: Vec<String>,
    /// The host and user OpenSSH CA keys.
    pub ssh_ca_keys: Vec<String>,
    /// When the certificates end (Unix seconds).
    pub not_after_unix: i64,
    /// The Auth API address clients such as `tctl` use with these certificates; absent: the
    /// proxy itself (TLS routing carries the Auth API on its web port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_addr: Option<String>,
}

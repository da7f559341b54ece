//! Access to resources through the proxy: the protocol the client and the proxy speak before
//! the bytes flow, shared by the client side (`client`, feature `client`), the proxy's entries
//! (`proxy::resources`, `proxy::kube`) and the agent's services (`agent::services`).
//!
//! Per connection to the proxy (TLS with the user's certificate, an ALPN per protocol): one JSON
//! [`ResourceRequest`] line, the proxy's answer line ([`RESOURCE_OK`] or the reason), then the
//! client's bytes. The proxy dials the agent with a
//! [`DialRequest`](crate::tunnel::DialRequest) whose `conn_type` is the request's
//! [`ServedKind`] — the one resource-kind type, from `svc_core::auth`.

pub(crate) mod kube;
pub mod mux;
pub mod mysql;
pub(crate) mod postgres;

use serde::{Deserialize, Serialize};
pub use svc_core::auth::ServedKind;

/// What the client names in its first line to the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRequest {
    /// The kind (`app`, `db`, `kube_cluster`, `windows_desktop`).
    pub kind: ServedKind,
    /// The resource name.
    pub name: String,
    /// Databases: the database user to connect as (`tsh proxy db --db-user`); the client's own
    /// protocol-level user must then be the same. Postgres clients may leave it out (their
    /// startup message names the user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_user: Option<String>,
    /// Databases: the database name (`--db-name`), likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_name: Option<String>,
}

/// The proxy's answer line when the resource is connected.
pub const RESOURCE_OK: &str = "ok";
/// The longest request or answer line.
pub(crate) const MAX_LINE: usize = 4096;

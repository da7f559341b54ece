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

use serde::{Deserialize, Serialize};
pub use svc_core::auth::ServedKind;

/// What the client names in its first line to the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRequest {
    /// The kind (`app`, `db`, `kube_cluster`, `windows_desktop`).
    pub kind: ServedKind,
    /// The resource name.
    pub name: String,
}

/// The proxy's answer line when the resource is connected.
pub const RESOURCE_OK: &str = "ok";
/// The longest request or answer line.
pub(crate) const MAX_LINE: usize = 4096;

//! Many resource connections over one TLS connection: how local proxies (`tsh proxy app|db`)
//! keep their way to the proxy warm, so that a new client connection costs neither a TCP
//! connection nor a TLS handshake (not even a resumed one, whose key exchange was the largest
//! cost left of a new connection).
//!
//! The local proxy connects to the proxy's web port with ALPN [`alpn::MUX`](crate::route::alpn::MUX)
//! and the user's certificate, exactly as for one resource connection, and then speaks HTTP/2
//! (RFC 9113) inside that TLS. Each client connection is one `CONNECT` stream:
//!
//! - `:authority` is [`AUTHORITY`]; header [`ALPN_HEADER`] names the resource protocol the
//!   stream carries (`svc-tcp`, `svc-postgres`, `svc-mysql`, `svc-mongodb`, `svc-redis`: what a
//!   connection of its own would have offered as its ALPN), and header [`REQUEST_HEADER`]
//!   carries the [`ResourceRequest`](super::ResourceRequest) as JSON (at most 4,096 bytes)
//!   instead of the request line;
//! - the proxy answers `200` at once and then the stream is what a connection of its own is
//!   after its request line: the answer line ([`RESOURCE_OK`](super::RESOURCE_OK) or the
//!   reason), then the bytes both ways. The route is decided, and the agent dialled, for each
//!   stream as for each connection: roles, locks and the user's existence are checked every
//!   time;
//! - any other status refuses the stream, its body saying why (`403`: the certificate is no
//!   longer valid; `400`: a malformed stream).
//!
//! The certificate presented when the TLS connection was made is checked again on every new
//! stream, and the proxy stops taking streams on the connection when it expires (those open
//! go on, like connections of their own). At most [`MAX_STREAMS`] streams are open at once per
//! connection; both ends send HTTP/2 pings every [`KEEPALIVE`] and close a connection whose
//! peer does not answer within [`KEEPALIVE_TIMEOUT`]. A proxy that does not know the ALPN
//! (an older one) closes the connection during its handshake; the local proxy then connects
//! each client connection on its own, and tries again later.

use std::time::Duration;

/// The `:authority` of every stream (the resource is named in [`REQUEST_HEADER`]).
pub const AUTHORITY: &str = "svc-mux:443";
/// The header naming the resource protocol (an ALPN name) the stream carries.
pub const ALPN_HEADER: &str = "svc-alpn";
/// The header carrying the [`ResourceRequest`](super::ResourceRequest) as JSON.
pub const REQUEST_HEADER: &str = "svc-resource";
/// The most streams open at once on one connection; a local proxy opens further client
/// connections on connections of their own.
pub const MAX_STREAMS: u32 = 1000;
/// How often each end pings the other.
pub const KEEPALIVE: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Each stream's HTTP/2 flow-control window: as much as one stream may have in flight (the
/// default 64 KiB caps a stream at one window per round trip).
pub const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// The connection's flow-control window, shared by its streams.
pub const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// The largest DATA frame either end accepts.
pub const MAX_FRAME: u32 = 64 * 1024;
/// The largest header block either end accepts.
pub const MAX_HEADER_LIST: u32 = 16 * 1024;

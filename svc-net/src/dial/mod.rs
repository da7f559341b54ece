//! Outbound dialing, the last step of the data flow: a connection leaves svc here.
//!
//! - [`ProxyDialer`]: picks direct or proxied per target from the proxy environment
//!   (`svc_core::proxy_env`) and dials; what agents, updaters and the proxy's outbound fetches use.
//! - [`HttpConnect`]: a connector that wraps a connector and speaks HTTP CONNECT; usable on its
//!   own as a hyper-util connector.
//! - [`TcpConnector`]: plain TCP with `TCP_NODELAY`, keepalive and a connect deadline.
//! - [`Tunneled`]: the stream after the proxy's `200`, yielding bytes read past the reply head
//!   first.
//!
//! Credentials reach the wire only in the CONNECT request's `Proxy-Authorization` header; they
//! are held in `svc_core::Secret` everywhere else, so logs, errors and `Debug` never show them.

mod connect;
mod dialer;
mod error;
mod future;
pub mod reply;
mod tcp;
mod tunneled;

pub use connect::{DEFAULT_HANDSHAKE_TIMEOUT, HttpConnect, HttpConnectLayer, target_from_uri};
pub use dialer::{
    DialedStream, ProxyConnector, ProxyDialer, ProxyDialerBuilder, ProxyStream, proxy_tls_config,
};
pub use error::Error;
pub use future::HttpConnectFuture;
pub use reply::MAX_REPLY_HEAD;
pub use tcp::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE, TcpConnector};
pub use tunneled::Tunneled;

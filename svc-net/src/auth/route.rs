//! The Auth API through the proxy's web port: TLS routing sends connections whose ALPN starts
//! with `svc-auth@` here, and the raw TLS stream (ClientHello replayed) is spliced to the Auth
//! Service. TLS, and so the client-certificate check, stays end to end between the client and
//! the Auth Service; the proxy sees only ciphertext.

use std::net::SocketAddr;
use std::sync::Arc;
use tower::BoxError;

use crate::io::{ConnFuture, Connection};
use crate::io::{ConnService, conn_service};

/// The ALPN protocol clients offer (first) to reach the Auth API of `cluster` through a proxy.
pub fn alpn(cluster: &str) -> String {
    format!("{}{cluster}", crate::route::alpn::AUTH_PREFIX)
}

/// A connection service splicing routed connections to the Auth API at `auth_addr`.
pub fn auth_route(auth_addr: SocketAddr) -> ConnService {
    let addr = Arc::new(auth_addr);
    conn_service(tower::service_fn(move |conn: Connection| {
        let addr = addr.clone();
        ConnFuture::new(async move {
            let peer = conn.peer_addr;
            let (mut io, _deadline, shutdown, slot) = conn.into_parts();
            drop(slot);
            let mut upstream = tokio::net::TcpStream::connect(*addr).await?;
            upstream.set_nodelay(true)?;
            tokio::select! {
                r = tokio::io::copy_bidirectional(&mut io, &mut upstream) => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "auth route: connection ended");
                    }
                }
                () = shutdown.cancelled() => {}
            }
            Ok::<(), BoxError>(())
        })
    }))
}

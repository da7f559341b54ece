//! The Auth API through the proxy's web port: TLS routing sends connections whose ALPN starts
//! with `svc-auth@` here, and the raw TLS stream (ClientHello replayed) is spliced to the Auth
//! Service. TLS, and so the client-certificate check, stays end to end between the client and
//! the Auth Service; the proxy sees only ciphertext. Agents keep these links open for days and
//! mostly idle, so the splice holds no copy buffer between heartbeats ([`splice`]).
//!
//! [`splice`]: crate::io::splice::splice

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
                r = crate::io::splice::splice(&mut io, &mut upstream) => {
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

/// Like [`auth_route`], to the first of several Auth Service addresses (`host:port`) that
/// accepts the TCP connection, each within
/// [`FAILOVER_CONNECT_TIMEOUT`](super::FAILOVER_CONNECT_TIMEOUT): what a Proxy Service running
/// apart from the Auth Service mounts.
pub fn auth_route_any(addrs: Vec<String>) -> ConnService {
    let addrs = Arc::new(addrs);
    conn_service(tower::service_fn(move |conn: Connection| {
        let addrs = addrs.clone();
        ConnFuture::new(async move {
            let peer = conn.peer_addr;
            let (mut io, _deadline, shutdown, slot) = conn.into_parts();
            drop(slot);
            let mut tried = Vec::new();
            let mut upstream = None;
            for addr in addrs.iter() {
                match tokio::time::timeout(
                    super::FAILOVER_CONNECT_TIMEOUT,
                    tokio::net::TcpStream::connect(addr.as_str()),
                )
                .await
                {
                    Ok(Ok(s)) => {
                        upstream = Some(s);
                        break;
                    }
                    Ok(Err(e)) => tried.push(format!("{addr}: {e}")),
                    Err(_) => tried.push(format!(
                        "{addr}: no answer within {:?}",
                        super::FAILOVER_CONNECT_TIMEOUT
                    )),
                }
            }
            let Some(mut upstream) = upstream else {
                return Err(format!("cannot reach the Auth Service at any of: {}", tried.join("; ")).into());
            };
            upstream.set_nodelay(true)?;
            tokio::select! {
                r = crate::io::splice::splice(&mut io, &mut upstream) => {
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

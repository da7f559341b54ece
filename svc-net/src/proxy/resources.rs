//! The proxy's entry for apps, databases and desktops: the handler of ALPN `svc-tcp`,
//! `svc-postgres`, `svc-mysql`, `svc-mongodb` and `svc-redis` on the web port (and of Postgres
//! clients detected by their SSLRequest).
//!
//! Per connection: TLS with a user certificate required (the cluster's user CA) → the user's
//! identity from the certificate → one JSON [`ResourceRequest`] line → the Auth Service
//! resolves the route for that user (RBAC by labels, in the domain) → the agent is dialled
//! through its reverse tunnel (`conn_type` = the kind, `address` = the resource name) → one
//! answer line, [`RESOURCE_OK`] or the reason, then the bytes flow both ways.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use svc_core::auth::ServedKind;
use svc_core::identity::{IdentityKind, Verifier};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;

use crate::io::{ConnFuture, Connection};
use crate::proxy::cache::RouteResolver;
use crate::route::detect::POSTGRES_SSL_REQUEST as SSL_REQUEST;
use crate::services::{MAX_LINE, RESOURCE_OK, ResourceRequest};
use crate::tls::{ServerIdentity, TlsError};
use crate::tunnel::{DialRequest, TunnelDialer, read_line};
use crate::{
    io::{ConnService, conn_service},
    route::alpn,
};

/// The ALPN names this entry serves.
pub const ALPNS: [&str; 5] = [alpn::TCP, alpn::POSTGRES, alpn::MYSQL, alpn::MONGODB, alpn::REDIS];

/// What the entry needs.
#[non_exhaustive]
pub struct ResourceProxyConfig {
    /// TLS requiring user certificates ([`ResourceProxyConfig::tls_for`]).
    pub tls: Arc<rustls::ServerConfig>,
    /// Reads the user's identity from the certificate.
    pub verifier: Arc<Verifier>,
    /// Where routes are decided: locally from the proxy's cache, or the Auth API as the proxy
    /// (host role `proxy`).
    pub auth: RouteResolver,
    /// Reaches agents.
    pub dialer: TunnelDialer,
    /// Deadline for the TLS handshake and the request line.
    pub handshake_timeout: Duration,
}

impl ResourceProxyConfig {
    /// A configuration with a 30 s handshake deadline.
    pub fn new(
        tls: Arc<rustls::ServerConfig>,
        verifier: Arc<Verifier>,
        auth: impl Into<RouteResolver>,
        dialer: TunnelDialer,
    ) -> Self {
        Self {
            tls,
            verifier,
            auth: auth.into(),
            dialer,
            handshake_timeout: Duration::from_secs(30),
        }
    }

    /// The server TLS configuration: the proxy's certificate, [`ALPNS`], user certificates
    /// required (the user CA of `verifier`).
    pub fn tls_for(
        identity: &ServerIdentity,
        verifier: &Verifier,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(verifier.root_store(Some(IdentityKind::User))),
            crate::tls::provider(),
        )
        .build()
        .map_err(|e| TlsError::Rustls(rustls::Error::General(format!("client verifier: {e}"))))?;
        identity.server_config_with_client_auth(&ALPNS, clients)
    }
}

/// The entry. Cheap to clone.
#[derive(Clone)]
pub struct ResourceProxy {
    inner: Arc<ResourceProxyConfig>,
}

impl std::fmt::Debug for ResourceProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResourceProxy")
    }
}

/// Why a resource connection was refused; the text is sent to the client.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("{0}")]
    Text(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl ResourceProxy {
    /// Builds the entry.
    pub fn new(config: ResourceProxyConfig) -> Self {
        Self {
            inner: Arc::new(config),
        }
    }

    /// The handler for the ALPN routes ([`ALPNS`]).
    pub fn service(&self) -> ConnService {
        entry(self.clone(), false)
    }

    /// The handler for Postgres clients that start with an SSLRequest (the multiplexer's
    /// Postgres detection, `ProxyBuilder::postgres`): answered `S`, then the same as
    /// [`service`](Self::service) with the database's protocol fixed to Postgres.
    pub fn postgres_service(&self) -> ConnService {
        entry(self.clone(), true)
    }

    async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        io: S,
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
        postgres: bool,
    ) -> Result<(), Refusal> {
        let after = self.inner.handshake_timeout;
        let acceptor = TlsAcceptor::from(self.inner.tls.clone());
        let mut tls = crate::tls::accept_before(&acceptor, io, tokio::time::Instant::now() + after)
            .await
            .map_err(|e| Refusal::Text(e.to_string()))?;
        let (_, session) = tls.get_ref();
        let protocol = match session.alpn_protocol() {
            Some(p) => String::from_utf8_lossy(p).into_owned(),
            // A client that started with an SSLRequest is a Postgres client.
            None if postgres => alpn::POSTGRES.to_owned(),
            None => String::new(),
        };
        let chain: Vec<_> = session
            .peer_certificates()
            .unwrap_or_default()
            .iter()
            .map(|c| c.clone().into_owned())
            .collect();
        let user = match self.inner.verifier.verify_user_x509(&chain, SystemTime::now()) {
            Ok(user) => user,
            Err(e) => {
                return reply(&mut tls, &format!("a user certificate is required: {e}")).await;
            }
        };
        let line = tokio::time::timeout(after, read_line(&mut tls, MAX_LINE))
            .await
            .map_err(|_| Refusal::Text("no resource request before the deadline".into()))??
            .unwrap_or_default();
        let req: ResourceRequest = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => return reply(&mut tls, &format!("malformed resource request: {e}")).await,
        };
        let expected_db = match protocol.as_str() {
            alpn::POSTGRES => Some("postgres"),
            alpn::MYSQL => Some("mysql"),
            alpn::MONGODB => Some("mongodb"),
            alpn::REDIS => Some("redis"),
            _ => None,
        };
        let ok_kind = match expected_db {
            Some(_) => req.kind == ServedKind::Db,
            None => matches!(req.kind, ServedKind::App | ServedKind::WindowsDesktop),
        };
        if !ok_kind {
            let msg = format!("ALPN {protocol:?} does not carry {} connections", req.kind);
            return reply(&mut tls, &msg).await;
        }
        let leaf = chain.first().map(|c| c.to_vec()).unwrap_or_default();
        let auth = &self.inner.auth;
        let route = match auth.resolve_resource(req.kind, &req.name, &leaf).await {
            Ok(Ok(route)) => route,
            Ok(Err(denied)) => {
                tracing::info!(%peer, user = %user.username, kind = %req.kind, name = %req.name, reason = %denied, "resource access refused");
                return reply(&mut tls, &denied).await;
            }
            Err(e) => return reply(&mut tls, &format!("asking the Auth Service: {e}")).await,
        };
        if let Some(want) = expected_db
            && route.resource.protocol != want
        {
            let msg = format!(
                "db \"{}\" speaks {}, not {want} (ALPN {protocol})",
                req.name, route.resource.protocol
            );
            return reply(&mut tls, &msg).await;
        }
        let dial = DialRequest {
            address: req.name.clone(),
            server_id: route.server_id.clone(),
            conn_type: req.kind,
            client_src_addr: peer.to_string(),
            client_dst_addr: local.to_string(),
            db_route: None,
        };
        let mut upstream = match self.inner.dialer.dial(dial.clone()).await {
            Ok(s) => s,
            Err(e) => return reply(&mut tls, &format!("{} \"{}\": {e}", req.kind, req.name)).await,
        };
        tls.write_all(format!("{RESOURCE_OK}\n").as_bytes()).await?;
        tls.flush().await?;
        tracing::info!(%peer, user = %user.username, kind = %req.kind, name = %req.name, agent = %route.server_id, "resource connection");
        if req.kind == ServedKind::App && matches!(route.resource.protocol.as_str(), "http" | "https") {
            // HTTP apps: svc's identity headers replace whatever the client sent.
            let dialer = self.inner.dialer.clone();
            let redial: super::app_http::Redial = Arc::new(move || {
                let (dialer, dial) = (dialer.clone(), dial.clone());
                Box::pin(async move {
                    let io: crate::io::BoxIo = Box::new(dialer.dial(dial).await.map_err(|e| e.to_string())?);
                    Ok(io)
                })
            });
            let app_user = super::app_http::AppUser {
                username: user.username.clone(),
                roles: user.roles.clone(),
                client: peer.ip(),
            };
            super::app_http::relay(tls, Box::new(upstream), redial, app_user, req.name.clone()).await;
            return Ok(());
        }
        let _ = tokio::io::copy_bidirectional_with_sizes(&mut tls, &mut upstream, 64 * 1024, 64 * 1024).await;
        Ok(())
    }
}

/// Sends the refusal line and closes.
async fn reply<S: AsyncWrite + Unpin>(io: &mut S, text: &str) -> Result<(), Refusal> {
    let one_line = text.replace('\n', " ");
    io.write_all(format!("{one_line}\n").as_bytes()).await?;
    io.shutdown().await?;
    Err(Refusal::Text(one_line))
}

/// The connection handler of the resource entry; a Postgres client's SSLRequest is answered
/// first.
fn entry(proxy: ResourceProxy, postgres: bool) -> ConnService {
    conn_service(tower::service_fn(move |mut conn: Connection| {
        let proxy = proxy.clone();
        ConnFuture::new(async move {
            conn.classified();
            let (peer, local) = (conn.peer_addr, conn.local_addr);
            let deadline = conn.peek_deadline;
            let mut io = conn.io;
            if postgres {
                let mut first = [0u8; 8];
                // Detection peeked these bytes under the same deadline; a client that stalls
                // here is dropped rather than held.
                let read = tokio::time::timeout_at(deadline, io.read_exact(&mut first)).await;
                if !matches!(read, Ok(Ok(_))) {
                    tracing::info!(%peer, "a Postgres client sent no complete SSLRequest in time: closing");
                    return Ok(());
                }
                if first != SSL_REQUEST {
                    tracing::info!(%peer, "a Postgres client without TLS: closing (use tsh proxy db)");
                    return Ok(());
                }
                io.write_all(b"S").await?;
            }
            if let Err(e) = proxy.serve(io, peer, local, postgres).await {
                tracing::info!(%peer, reason = %e, "resource connection refused");
            }
            Ok(())
        })
    }))
}

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
use svc_core::identity::{IdentityKind, UserIdentity, Verifier};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;

use crate::io::{ConnFuture, Connection};
use crate::proxy::cache::RouteResolver;
use crate::route::detect::POSTGRES_SSL_REQUEST as SSL_REQUEST;
use crate::services::{MAX_LINE, RESOURCE_OK, ResourceRequest, mysql, postgres};
use crate::tls::{ServerIdentity, TlsError};
use crate::tunnel::{DbRoute, DialRequest, TunnelDialer, TunnelStream, read_line};
use crate::{
    io::{ConnService, conn_service},
    route::alpn,
};

mod mux;

/// The ALPN names this entry serves (`postgresql`: Postgres 17+ clients with
/// `sslnegotiation=direct`, and those clients' TLS after an SSLRequest; `svc-mux`: many
/// connections over one, [`services::mux`](crate::services::mux)).
pub const ALPNS: [&str; 7] = [
    alpn::TCP,
    alpn::MUX,
    alpn::POSTGRES,
    alpn::POSTGRES_NATIVE,
    alpn::MYSQL,
    alpn::MONGODB,
    alpn::REDIS,
];

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

    /// The handler for native MySQL/MariaDB clients (the `mysql_listen_addr` listener): svc
    /// greets them as a server advertising TLS, takes their SSLRequest, runs TLS with their
    /// `tsh db login` certificate, reads their user and database from the HandshakeResponse,
    /// checks them against the certificate's route and the roles, and has the agent log in to
    /// the real server; refusals are ERR packets naming the database and the user.
    pub fn mysql_service(&self) -> ConnService {
        let proxy = self.clone();
        conn_service(tower::service_fn(move |mut conn: Connection| {
            let proxy = proxy.clone();
            ConnFuture::new(async move {
                conn.classified();
                let (peer, local) = (conn.peer_addr, conn.local_addr);
                if let Err(e) = proxy.serve_mysql(conn.io, peer, local).await {
                    tracing::info!(%peer, reason = %e, "MySQL connection refused");
                }
                Ok(())
            })
        }))
    }

    async fn serve_mysql<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        mut io: S,
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
    ) -> Result<(), Refusal> {
        let deadline = tokio::time::Instant::now() + self.inner.handshake_timeout;
        let late = || Refusal::Text("the MySQL handshake did not finish before the deadline".into());
        tokio::time::timeout_at(deadline, mysql::greet_client(&mut io))
            .await
            .map_err(|_| late())?
            .map_err(|e| Refusal::Text(e.to_string()))?;
        let acceptor = TlsAcceptor::from(self.inner.tls.clone());
        let mut tls = crate::tls::accept_before(&acceptor, io, deadline)
            .await
            .map_err(|e| Refusal::Text(e.to_string()))?;
        let chain: Vec<_> = tls
            .get_ref()
            .1
            .peer_certificates()
            .unwrap_or_default()
            .iter()
            .map(|c| c.clone().into_owned())
            .collect();
        let (seq, payload) = tokio::time::timeout_at(deadline, mysql::read_packet(&mut tls))
            .await
            .map_err(|_| late())??;
        let seq = seq.wrapping_add(1);
        let user = match self.inner.verifier.verify_user_x509(&chain, SystemTime::now()) {
            Ok(user) => user,
            Err(e) => {
                let msg = format!("a user certificate is required: {e}");
                mysql::refuse(&mut tls, seq, mysql::ACCESS_DENIED, &msg).await;
                return Err(Refusal::Text(msg));
            }
        };
        let Some(route) = user.db_route.clone().filter(|r| r.protocol == "mysql") else {
            let msg = "a MySQL database certificate is required: run tsh db login NAME --db-user USER";
            mysql::refuse(&mut tls, seq, mysql::ACCESS_DENIED, msg).await;
            return Err(Refusal::Text(msg.into()));
        };
        let leaf = chain.first().map(|c| c.to_vec()).unwrap_or_default();
        let expected = MysqlExpected {
            name: route.service.clone(),
            user: Some(route.user.clone()),
            database: route.database.clone(),
            what: "this certificate",
        };
        self.mysql_login(
            tls,
            seq,
            &payload,
            expected,
            &leaf,
            &user.username,
            peer,
            local,
            deadline,
        )
        .await
    }

    /// The rest of a MySQL connection phase once the client's HandshakeResponse (`payload`,
    /// answered as packet `seq`) is read: its user and database against `expected` and the
    /// roles, the agent's login to the server, then the command phase both ways.
    #[allow(clippy::too_many_arguments)]
    async fn mysql_login<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        mut tls: S,
        seq: u8,
        payload: &[u8],
        expected: MysqlExpected,
        leaf: &[u8],
        username: &str,
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
        deadline: tokio::time::Instant,
    ) -> Result<(), Refusal> {
        let name = expected.name.clone();
        let (code, msg) = 'refused: {
            let login = match mysql::parse_login(payload) {
                Ok(l) => l,
                Err(e) => break 'refused (mysql::ACCESS_DENIED, e.to_string()),
            };
            if let Some(want) = &expected.user
                && *want != login.user
            {
                break 'refused (
                    mysql::ACCESS_DENIED,
                    format!(
                        "{} is for database user \"{want}\" of db \"{name}\", not \"{}\"",
                        expected.what, login.user
                    ),
                );
            }
            let database = match (&expected.database, login.database) {
                (Some(want), Some(got)) if *want != got => {
                    break 'refused (
                        mysql::ACCESS_DENIED,
                        format!(
                            "{} is for database name \"{want}\" of db \"{name}\", not \"{got}\"",
                            expected.what
                        ),
                    );
                }
                (Some(want), _) => Some(want.clone()),
                (None, got) => got,
            };
            let route = DbRoute {
                user: login.user.clone(),
                database: database.clone(),
            };
            let (mut upstream, agent) = match self.dial_db(&name, "mysql", route, leaf, peer, local).await {
                Ok(dialed) => dialed,
                Err(DbDialError::Denied(msg)) => break 'refused (mysql::ACCESS_DENIED, msg),
                Err(DbDialError::Unreachable(msg)) => break 'refused (mysql::UNREACHABLE, msg),
            };
            let mut line = serde_json::to_vec(&login.hello).map_err(|e| Refusal::Text(e.to_string()))?;
            line.push(b'\n');
            upstream.write_all(&line).await?;
            upstream.flush().await?;
            let answer = match tokio::time::timeout_at(deadline, read_line(&mut upstream, MAX_LINE)).await {
                Ok(Ok(Some(a))) => a,
                Ok(Ok(None)) => "the agent closed the connection".to_owned(),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "the agent did not log in to the database before the deadline".to_owned(),
            };
            if answer != mysql::HELLO_OK {
                break 'refused (mysql::UNREACHABLE, format!("db \"{name}\": {answer}"));
            }
            mysql::write_packet(&mut tls, seq, &mysql::ok_payload()).await?;
            tracing::info!(%peer, user = %username, name = %name, db_user = %login.user, %agent, "database connection");
            let _ = upstream.relay(&mut tls).await;
            return Ok(());
        };
        tracing::info!(%peer, user = %username, name = %name, reason = %msg, "database connection refused");
        mysql::refuse(&mut tls, seq, code, &msg).await;
        Err(Refusal::Text(msg))
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
        shutdown: tokio_util::sync::CancellationToken,
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
        if protocol == alpn::MUX {
            if user.db_route.is_some() {
                return Err(Refusal::Text(
                    "a database certificate (tsh db login) cannot carry multiplexed connections".into(),
                ));
            }
            return self.serve_mux(tls, chain, user, peer, local, shutdown).await;
        }
        let leaf = chain.first().map(|c| c.to_vec()).unwrap_or_default();
        // A database certificate (`tsh db login`): the route is in the certificate and the
        // client speaks its own protocol from the first byte, no request line.
        if let Some(route) = user.db_route.clone() {
            // Redis and MongoDB clients (redis-cli --tls, mongosh --tls) send no ALPN: they
            // reach this entry on their own listener (`redis_listen_addr`, `mongo_listen_addr`)
            // or with the protocol's ALPN. The protocol-level user is the agent's to hold to
            // the route (Redis AUTH/HELLO); the proxy checks the roles and dials with it.
            let native_other = matches!(
                (route.protocol.as_str(), protocol.as_str()),
                ("redis", "" | alpn::REDIS) | ("mongodb", "" | alpn::MONGODB)
            );
            if native_other {
                return self
                    .native_session(tls, &route, &leaf, &user.username, peer, local)
                    .await;
            }
            let native_pg = matches!(protocol.as_str(), alpn::POSTGRES | alpn::POSTGRES_NATIVE);
            if !native_pg || route.protocol != "postgres" {
                let msg = format!(
                    "the database certificate for db \"{}\" ({}) does not fit this connection (ALPN {protocol:?})",
                    route.service, route.protocol
                );
                return reply(&mut tls, &msg).await;
            }
            let after_deadline = tokio::time::Instant::now() + after;
            let startup =
                match tokio::time::timeout_at(after_deadline, postgres::read_startup(&mut tls)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        postgres::refuse(&mut tls, postgres::REFUSED, &e.to_string()).await;
                        return Err(Refusal::Text(e.to_string()));
                    }
                    Err(_) => {
                        return Err(Refusal::Text(
                            "no Postgres startup message before the deadline".into(),
                        ));
                    }
                };
            let mismatch = if startup.user != route.user {
                Some(format!(
                    "this certificate is for database user \"{}\" of db \"{}\", not \"{}\" (tsh db login {} --db-user {})",
                    route.user, route.service, startup.user, route.service, startup.user
                ))
            } else {
                route
                    .database
                    .as_ref()
                    .filter(|d| **d != startup.database)
                    .map(|d| {
                        format!(
                            "this certificate is for database name \"{d}\" of db \"{}\", not \"{}\"",
                            route.service, startup.database
                        )
                    })
            };
            if let Some(msg) = mismatch {
                tracing::info!(%peer, user = %user.username, db = %route.service, reason = %msg, "database connection refused");
                postgres::refuse(&mut tls, postgres::REFUSED, &msg).await;
                return Err(Refusal::Text(msg));
            }
            return self
                .postgres_session(tls, startup, &route.service, &leaf, &user.username, peer, local)
                .await;
        }
        if postgres {
            let msg = "a database certificate is required: run `tsh db login NAME --db-user USER` and connect with its files (tsh db config NAME)";
            postgres::refuse(&mut tls, postgres::REFUSED, msg).await;
            return Err(Refusal::Text(msg.into()));
        }
        let line = tokio::time::timeout(after, read_line(&mut tls, MAX_LINE))
            .await
            .map_err(|_| Refusal::Text("no resource request before the deadline".into()))??
            .unwrap_or_default();
        let req: ResourceRequest = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => return reply(&mut tls, &format!("malformed resource request: {e}")).await,
        };
        self.serve_request(tls, &protocol, req, &user, &leaf, peer, local)
            .await
    }

    /// One resource request (`req`, read from its line, or from a multiplexed stream's
    /// header) by `user` (certificate `leaf`) over `tls` with the resource ALPN `protocol`: the
    /// route for that user, the dial, the answer line, then the bytes both ways.
    #[allow(clippy::too_many_arguments)]
    async fn serve_request<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        mut tls: S,
        protocol: &str,
        req: ResourceRequest,
        user: &UserIdentity,
        leaf: &[u8],
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
    ) -> Result<(), Refusal> {
        let after = self.inner.handshake_timeout;
        let expected_db = match protocol {
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
        let auth = &self.inner.auth;
        let route = match auth.resolve_resource(req.kind, &req.name, leaf).await {
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
        let mut db_route = None;
        if req.kind == ServedKind::Db {
            if route.resource.protocol == "postgres" {
                // The startup message names the user and database: checked once it is read.
                tls.write_all(format!("{RESOURCE_OK}\n").as_bytes()).await?;
                tls.flush().await?;
                let startup = match tokio::time::timeout(after, postgres::read_startup(&mut tls)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        postgres::refuse(&mut tls, postgres::REFUSED, &e.to_string()).await;
                        return Err(Refusal::Text(e.to_string()));
                    }
                    Err(_) => {
                        return Err(Refusal::Text(
                            "no Postgres startup message before the deadline".into(),
                        ));
                    }
                };
                let mismatch = match (&req.db_user, &req.db_name) {
                    (Some(u), _) if *u != startup.user => Some(format!(
                        "tsh proxy db was started for database user \"{u}\", the client asked for \"{}\"",
                        startup.user
                    )),
                    (_, Some(d)) if *d != startup.database => Some(format!(
                        "tsh proxy db was started for database name \"{d}\", the client asked for \"{}\"",
                        startup.database
                    )),
                    _ => None,
                };
                if let Some(msg) = mismatch {
                    postgres::refuse(&mut tls, postgres::REFUSED, &msg).await;
                    return Err(Refusal::Text(msg));
                }
                return self
                    .postgres_session(tls, startup, &req.name, leaf, &user.username, peer, local)
                    .await;
            }
            if route.resource.protocol == "mysql" {
                // `tsh proxy db`: the hop is TLS already; svc greets the client as a server.
                tls.write_all(format!("{RESOURCE_OK}\n").as_bytes()).await?;
                tls.flush().await?;
                let deadline = tokio::time::Instant::now() + after;
                let late = || Refusal::Text("the MySQL handshake did not finish before the deadline".into());
                tokio::time::timeout_at(deadline, mysql::send_greeting(&mut tls, false))
                    .await
                    .map_err(|_| late())?
                    .map_err(|e| Refusal::Text(e.to_string()))?;
                let (seq, payload) = tokio::time::timeout_at(deadline, mysql::read_packet(&mut tls))
                    .await
                    .map_err(|_| late())??;
                let expected = MysqlExpected {
                    name: req.name.clone(),
                    user: req.db_user.clone(),
                    database: req.db_name.clone(),
                    what: "tsh proxy db",
                };
                return self
                    .mysql_login(
                        tls,
                        seq.wrapping_add(1),
                        &payload,
                        expected,
                        leaf,
                        &user.username,
                        peer,
                        local,
                        deadline,
                    )
                    .await;
            }
            let Some(db_user) = req.db_user.clone() else {
                let msg = format!(
                    "db \"{}\" ({}): a database user is required (tsh proxy db {} --db-user USER)",
                    req.name, route.resource.protocol, req.name
                );
                return reply(&mut tls, &msg).await;
            };
            match auth
                .resolve_db(&req.name, &db_user, req.db_name.as_deref(), leaf)
                .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(denied)) => {
                    tracing::info!(%peer, user = %user.username, name = %req.name, reason = %denied, "database access refused");
                    return reply(&mut tls, &denied).await;
                }
                Err(e) => return reply(&mut tls, &format!("asking the Auth Service: {e}")).await,
            }
            db_route = Some(DbRoute {
                user: db_user,
                database: req.db_name.clone(),
            });
        }
        let dial = DialRequest {
            address: req.name.clone(),
            server_id: route.server_id.clone(),
            conn_type: req.kind,
            client_src_addr: peer.to_string(),
            client_dst_addr: local.to_string(),
            db_route,
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
        let _ = upstream.relay(&mut tls).await;
        Ok(())
    }
}

/// Why [`ResourceProxy::dial_db`] did not reach the database; each caller answers in its
/// client's protocol (a refusal code or an "unreachable" one).
enum DbDialError {
    /// The roles refuse the route, or the database speaks another protocol.
    Denied(String),
    /// The Auth Service or the agent could not be reached.
    Unreachable(String),
}

impl ResourceProxy {
    /// The roles' `db_users`/`db_names` for `route` on db `name`, which must speak `protocol`,
    /// then the dial to its agent carrying the route. Returns the stream and the agent's
    /// host ID.
    async fn dial_db(
        &self,
        name: &str,
        protocol: &str,
        route: DbRoute,
        leaf: &[u8],
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
    ) -> Result<(TunnelStream, String), DbDialError> {
        let resolved = match self
            .inner
            .auth
            .resolve_db(name, &route.user, route.database.as_deref(), leaf)
            .await
        {
            Ok(Ok(resolved)) => resolved,
            Ok(Err(denied)) => return Err(DbDialError::Denied(denied)),
            Err(e) => return Err(DbDialError::Unreachable(format!("asking the Auth Service: {e}"))),
        };
        if resolved.resource.protocol != protocol {
            return Err(DbDialError::Denied(format!(
                "db \"{name}\" speaks {}, not {protocol}",
                resolved.resource.protocol
            )));
        }
        let dial = DialRequest {
            address: name.to_owned(),
            server_id: resolved.server_id.clone(),
            conn_type: ServedKind::Db,
            client_src_addr: peer.to_string(),
            client_dst_addr: local.to_string(),
            db_route: Some(route),
        };
        match self.inner.dialer.dial(dial).await {
            Ok(upstream) => Ok((upstream, resolved.server_id)),
            Err(e) => Err(DbDialError::Unreachable(format!("db \"{name}\": {e}"))),
        }
    }

    /// A native client with a database certificate for a protocol whose user the agent
    /// enforces (Redis, MongoDB): the roles' `db_users`/`db_names` for the certificate's route,
    /// the dial with that route, then the bytes both ways. A refusal is logged and the
    /// connection closed (these protocols have no error message before their first command).
    async fn native_session<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        mut tls: S,
        cert_route: &svc_core::identity::DbCertRoute,
        leaf: &[u8],
        username: &str,
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
    ) -> Result<(), Refusal> {
        let name = &cert_route.service;
        let refused = |msg: String| {
            tracing::info!(%peer, user = %username, name = %name, db_user = %cert_route.user, reason = %msg, "database connection refused");
            Err(Refusal::Text(msg))
        };
        let route = DbRoute {
            user: cert_route.user.clone(),
            database: cert_route.database.clone(),
        };
        let (mut upstream, agent) = match self
            .dial_db(name, &cert_route.protocol, route, leaf, peer, local)
            .await
        {
            Ok(dialed) => dialed,
            Err(DbDialError::Denied(msg) | DbDialError::Unreachable(msg)) => return refused(msg),
        };
        tracing::info!(%peer, user = %username, name = %name, db_user = %cert_route.user, %agent, "database connection");
        let _ = upstream.relay(&mut tls).await;
        Ok(())
    }

    /// A Postgres session whose startup message was read: the roles' `db_users`/`db_names`
    /// for its user and database, the dial with that route, the startup message forwarded,
    /// then the bytes both ways. Refusals reach the client as a Postgres `ErrorResponse`.
    #[allow(clippy::too_many_arguments)]
    async fn postgres_session<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        mut tls: S,
        startup: postgres::Startup,
        name: &str,
        leaf: &[u8],
        username: &str,
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
    ) -> Result<(), Refusal> {
        let (code, msg) = 'refused: {
            let route = DbRoute {
                user: startup.user.clone(),
                database: Some(startup.database.clone()),
            };
            let (mut upstream, agent) = match self.dial_db(name, "postgres", route, leaf, peer, local).await {
                Ok(dialed) => dialed,
                Err(DbDialError::Denied(msg)) => break 'refused (postgres::REFUSED, msg),
                Err(DbDialError::Unreachable(msg)) => break 'refused (postgres::UNREACHABLE, msg),
            };
            upstream.write_all(&startup.raw).await?;
            tracing::info!(%peer, user = %username, name = %name, db_user = %startup.user, database = %startup.database, %agent, "database connection");
            let _ = upstream.relay(&mut tls).await;
            return Ok(());
        };
        tracing::info!(%peer, user = %username, name = %name, db_user = %startup.user, reason = %msg, "database connection refused");
        postgres::refuse(&mut tls, code, &msg).await;
        Err(Refusal::Text(msg))
    }
}

/// What a MySQL client's HandshakeResponse must say: from its certificate's route (native
/// clients) or from `tsh proxy db --db-user/--db-name` (`None`: the client's own).
struct MysqlExpected {
    name: String,
    user: Option<String>,
    database: Option<String>,
    /// Who set them, for the refusal: `this certificate` or `tsh proxy db`.
    what: &'static str,
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
            if let Err(e) = proxy.serve(io, peer, local, postgres, conn.shutdown).await {
                tracing::info!(%peer, reason = %e, "resource connection refused");
            }
            Ok(())
        })
    }))
}

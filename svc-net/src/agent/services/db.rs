//! The Database Service on the agent: a dial request names a database; the stream reaches it.
//!
//! Postgres with `tls` configured: the agent sends the SSLRequest to the server, expects `S`,
//! and runs TLS verified with `tls.ca_cert_file` (else the public web roots) for
//! `tls.server_name` (else the host of `uri`). The client's own connection to its local `tsh`
//! proxy is plain (tsh answered its SSLRequest with `N`), so what arrives through the tunnel
//! is the client's startup message, relayed inside this TLS session. Without `tls`, and for
//! MySQL, the stream is plain TCP to `uri`; with `tls`, MySQL gets the agent's own TLS login
//! (below). Redis (`db_redis`: TLS, the session runs as `db_route.user`) and MongoDB
//! (`db_mongo`: TLS) have their own modules.
//!
//! Every dial must carry the route the proxy authorised (`DialRequest::db_route`); without one
//! it is refused. Postgres: the client's startup message must name exactly the route's user
//! and database, else the client gets a Postgres `ErrorResponse` naming both and nothing
//! reaches the server.

use std::path::Path;
use std::sync::Arc;

use svc_core::config::{Database, DbProtocol, DbTls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::BoxError;

use super::{ServiceError, connect, tls_to};
use crate::io::BoxIo;
use crate::services::{mysql, postgres};
use crate::tunnel::{DbRoute, DialRequest, DialService, dial_service_fn};

use crate::route::detect::POSTGRES_SSL_REQUEST as SSL_REQUEST;

struct DbTarget {
    name: String,
    protocol: DbProtocol,
    host: String,
    port: u16,
    /// TLS to the server (Postgres, Redis, MongoDB): the client configuration and the name to
    /// verify.
    tls: Option<(Arc<rustls::ClientConfig>, String)>,
}

fn tls_config(db: &Database, tls: &DbTls) -> Result<Arc<rustls::ClientConfig>, ServiceError> {
    let read = |field: &str, f: &Path| {
        std::fs::read(f).map_err(|e| ServiceError::Config {
            what: format!("database \"{}\": tls.{field} {}", db.name, f.display()),
            reason: e.to_string(),
        })
    };
    let pem = tls
        .ca_cert_file
        .as_deref()
        .map(|f| read("ca_cert_file", f))
        .transpose()?;
    let bad = |reason: String| ServiceError::Config {
        what: format!("database \"{}\": tls", db.name),
        reason,
    };
    let (Some(cert_file), Some(key_file)) = (&tls.cert_file, &tls.key_file) else {
        return crate::tls::client_config(pem.as_deref()).map_err(|e| bad(e.to_string()));
    };
    // The agent's own certificate for servers that require one (Redis `tls-auth-clients`).
    use rustls::pki_types::pem::PemObject;
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(&read("cert_file", cert_file)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("cert_file {}: {e}", cert_file.display())))?;
    if chain.is_empty() {
        return Err(bad(format!(
            "cert_file {}: no PEM CERTIFICATE",
            cert_file.display()
        )));
    }
    // The key's parse error is not shown: it could quote bytes of the key.
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_slice(&read("key_file", key_file)?).map_err(|_| {
            bad(format!(
                "key_file {}: no readable PEM PRIVATE KEY",
                key_file.display()
            ))
        })?;
    let roots = crate::tls::client_roots(pem.as_deref()).map_err(|e| bad(e.to_string()))?;
    let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_root_certificates(roots).with_client_auth_cert(chain, key))
        .map_err(|e| {
            bad(format!(
                "cert_file {} and key_file {}: {e}",
                cert_file.display(),
                key_file.display()
            ))
        })?;
    Ok(Arc::new(config))
}

/// Builds the service for `databases`; CA, certificate and key files are read now, so a bad
/// path fails at start.
pub fn db_service(databases: &[Database]) -> Result<DialService, ServiceError> {
    let mut targets = Vec::with_capacity(databases.len());
    for db in databases {
        let host = db
            .uri
            .host_str()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tls = match (&db.tls, db.protocol) {
            (Some(t), DbProtocol::Postgres | DbProtocol::Mysql | DbProtocol::Redis | DbProtocol::Mongodb) => {
                Some((
                    tls_config(db, t)?,
                    t.server_name.clone().unwrap_or_else(|| host.clone()),
                ))
            }
            _ => None,
        };
        targets.push(DbTarget {
            name: db.name.clone(),
            protocol: db.protocol,
            host,
            port: db.uri.port(),
            tls,
        });
    }
    let targets = Arc::new(targets);
    Ok(dial_service_fn(move |req: DialRequest| {
        let targets = targets.clone();
        async move {
            let name = req.address;
            let Some(route) = req.db_route else {
                return Err(ServiceError::Handshake {
                    kind: "db",
                    name,
                    reason: "the dial request carries no database route (the proxy authorises the database user first)".into(),
                }
                .into());
            };
            let t = targets
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| ServiceError::NotServed {
                    kind: "db",
                    name: name.clone(),
                })?;
            match t.protocol {
                DbProtocol::Redis => {
                    let route = Some(&route);
                    return Ok(super::db_redis::open(
                        &name,
                        &t.host,
                        t.port,
                        t.tls.as_ref(),
                        route,
                        &req.client_src_addr,
                    )
                    .await?);
                }
                DbProtocol::Mongodb => {
                    return Ok(super::db_mongo::open(
                        &name,
                        &t.host,
                        t.port,
                        t.tls.as_ref(),
                        &req.client_src_addr,
                    )
                    .await?);
                }
                _ => {}
            }
            let mut tcp = connect("db", &name, &t.host, t.port).await?;
            if t.protocol == DbProtocol::Mysql {
                let Some((config, server_name)) = t.tls.clone() else {
                    return Err(ServiceError::Handshake {
                        kind: "db",
                        name,
                        reason: "MySQL needs tls (ca_cert_file, cert_file, key_file) in its db_service entry: the agent logs in with its certificate".into(),
                    }
                    .into());
                };
                tracing::info!(db = %name, protocol = "mysql", db_user = %route.user, client = %req.client_src_addr, "database connection");
                return Ok::<BoxIo, BoxError>(mysql_session(tcp, config, server_name, name, route));
            }
            let io: BoxIo = match &t.tls {
                Some((config, server_name)) => {
                    let handshake = |reason: String| ServiceError::Handshake {
                        kind: "db",
                        name: name.clone(),
                        reason,
                    };
                    tcp.write_all(&SSL_REQUEST)
                        .await
                        .map_err(|e| handshake(format!("sending the SSLRequest: {e}")))?;
                    let mut answer = [0u8; 1];
                    tcp.read_exact(&mut answer)
                        .await
                        .map_err(|e| handshake(format!("reading the SSLRequest answer: {e}")))?;
                    if answer[0] != b'S' {
                        return Err(handshake(format!(
                            "the server refused TLS (answered {:?} to the SSLRequest, expected 'S')",
                            char::from(answer[0])
                        ))
                        .into());
                    }
                    Box::new(tls_to("db", &name, config.clone(), server_name, tcp).await?)
                }
                None => Box::new(tcp),
            };
            tracing::info!(db = %name, protocol = t.protocol.as_str(), db_user = %route.user, client = %req.client_src_addr, "database connection");
            let io = match t.protocol {
                DbProtocol::Postgres => postgres_checked(io, name, route),
                _ => io,
            };
            Ok::<BoxIo, BoxError>(io)
        }
    }))
}

/// The proxy's end of a MySQL session: a task reads the [`MysqlHello`](mysql::MysqlHello)
/// line, logs in to the server as the route's user (and database) with TLS and the agent's
/// certificate, answers [`mysql::HELLO_OK`] or the server's refusal, then relays the command
/// phase. The client's own user and database were checked against the route by the proxy;
/// here the session can only ever be the route's.
fn mysql_session(
    tcp: tokio::net::TcpStream,
    config: Arc<rustls::ClientConfig>,
    server_name: String,
    name: String,
    route: DbRoute,
) -> BoxIo {
    let (client_end, mut ours) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let hello = match crate::tunnel::read_line(&mut ours, crate::services::MAX_LINE).await {
            Ok(Some(line)) => serde_json::from_str::<mysql::MysqlHello>(&line),
            _ => return,
        };
        let hello = match hello {
            Ok(h) => h,
            Err(e) => {
                let _ = ours
                    .write_all(format!("a malformed MySQL hello: {e}\n").as_bytes())
                    .await;
                return;
            }
        };
        let server = mysql::connect_server(
            tcp,
            config,
            &server_name,
            &route.user,
            route.database.as_deref(),
            hello,
        )
        .await;
        let mut server = match server {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("logging in as database user \"{}\": {e}", route.user).replace('\n', " ");
                tracing::info!(db = %name, reason = %msg, "database connection refused");
                let _ = ours.write_all(format!("{msg}\n").as_bytes()).await;
                return;
            }
        };
        if ours
            .write_all(format!("{}\n", mysql::HELLO_OK).as_bytes())
            .await
            .is_err()
        {
            return;
        }
        let _ = tokio::io::copy_bidirectional_with_sizes(&mut ours, &mut server, 64 * 1024, 64 * 1024).await;
    });
    Box::new(client_end)
}

/// The client's end of a Postgres session whose startup message must match `route`: a task
/// reads the startup message from the client, compares its user and database with the route,
/// and forwards it and everything after to `server`; a mismatch is answered with an
/// `ErrorResponse` naming both, and the server sees nothing.
fn postgres_checked(server: BoxIo, name: String, route: DbRoute) -> BoxIo {
    let (client_end, mut ours) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut server = server;
        let startup = match postgres::read_startup(&mut ours).await {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(db = %name, reason = %e, "database connection refused");
                postgres::refuse(&mut ours, postgres::REFUSED, &e.to_string()).await;
                return;
            }
        };
        let want_db = route.database.as_deref().unwrap_or(&route.user);
        if startup.user != route.user || startup.database != want_db {
            let msg = format!(
                "db \"{name}\": the connection was authorised for database user \"{}\" and database \"{want_db}\", the client asked for user \"{}\" and database \"{}\"",
                route.user, startup.user, startup.database
            );
            tracing::info!(db = %name, reason = %msg, "database connection refused");
            postgres::refuse(&mut ours, postgres::REFUSED, &msg).await;
            return;
        }
        if server.write_all(&startup.raw).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional_with_sizes(&mut ours, &mut server, 64 * 1024, 64 * 1024).await;
    });
    Box::new(client_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_core::auth::ServedKind;
    use tower::ServiceExt;

    fn startup(user: &str, database: &str) -> Vec<u8> {
        let mut body = 196_608u32.to_be_bytes().to_vec();
        for (k, v) in [("user", user), ("database", database)] {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        m.extend_from_slice(&body);
        m
    }

    fn route(user: &str, database: &str) -> Option<DbRoute> {
        Some(DbRoute {
            user: user.into(),
            database: Some(database.into()),
        })
    }

    /// A server that answers the SSLRequest with `answer`, then (on `S`) runs TLS with a
    /// certificate for `localhost` and echoes the startup message of alice/shop.
    async fn fake_postgres(answer: u8) -> (u16, Vec<u8>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut req = [0u8; 8];
            tcp.read_exact(&mut req).await.unwrap();
            assert_eq!(req, SSL_REQUEST);
            tcp.write_all(&[answer]).await.unwrap();
            if answer == b'S' {
                let mut tls = tokio_rustls::TlsAcceptor::from(Arc::new(config))
                    .accept(tcp)
                    .await
                    .unwrap();
                let mut buf = vec![0u8; startup("alice", "shop").len()];
                tls.read_exact(&mut buf).await.unwrap();
                tls.write_all(&buf).await.unwrap();
                tls.flush().await.unwrap();
            }
        });
        (port, ca.pem().into_bytes())
    }

    async fn dial(port: u16, ca: &[u8], db_route: Option<DbRoute>) -> Result<BoxIo, BoxError> {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca).unwrap();
        let yaml = format!(
            "version: v1\ndb_service:\n  enabled: true\n  databases:\n  - name: pg\n    protocol: postgres\n    uri: 127.0.0.1:{port}\n    tls:\n      ca_cert_file: {}\n      server_name: localhost\n",
            ca_file.display()
        );
        let config = svc_core::config::Config::from_yaml_str_with_hostname(&yaml, "h").unwrap();
        let svc = db_service(&config.db.databases).unwrap();
        let req = |name: &str, db_route: Option<DbRoute>| DialRequest {
            address: name.into(),
            server_id: "h.test".into(),
            conn_type: ServedKind::Db,
            client_src_addr: "127.0.0.1:1".into(),
            client_dst_addr: "127.0.0.1:2".into(),
            db_route,
        };
        let unknown = svc
            .clone()
            .oneshot(req("mysql-1", route("alice", "shop")))
            .await
            .err()
            .unwrap();
        assert_eq!(unknown.to_string(), "this agent serves no db named \"mysql-1\"");
        let no_route = svc.clone().oneshot(req("pg", None)).await.err().unwrap();
        assert!(
            no_route.to_string().contains("carries no database route"),
            "{no_route}"
        );
        svc.oneshot(req("pg", db_route)).await
    }

    #[tokio::test]
    async fn postgres_gets_tls_to_the_server_verified_with_the_configured_ca() {
        let (port, ca) = fake_postgres(b'S').await;
        let mut io = dial(port, &ca, route("alice", "shop")).await.unwrap();
        let sent = startup("alice", "shop");
        io.write_all(&sent).await.unwrap();
        let mut buf = vec![0u8; sent.len()];
        tokio::time::timeout(std::time::Duration::from_secs(30), io.read_exact(&mut buf))
            .await
            .expect("the fake server's echo did not come back within 30 s")
            .unwrap();
        assert_eq!(buf, sent);
    }

    #[tokio::test]
    async fn a_startup_for_another_user_gets_a_postgres_error_naming_both() {
        let (port, ca) = fake_postgres(b'S').await;
        let mut io = dial(port, &ca, route("alice", "shop")).await.unwrap();
        io.write_all(&startup("postgres", "shop")).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(30), io.read_to_end(&mut answer))
            .await
            .expect("the agent's refusal did not come within 30 s")
            .unwrap();
        assert_eq!(answer.first(), Some(&b'E'), "{answer:?}");
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.contains("C28000")
                && text.contains("database user \"alice\"")
                && text.contains("user \"postgres\""),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_server_refusing_tls_is_an_error_naming_the_database() {
        let (port, ca) = fake_postgres(b'N').await;
        let err = dial(port, &ca, route("alice", "shop"))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("db \"pg\": the server refused TLS"), "{err}");
    }
}

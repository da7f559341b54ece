//! The Database Service on the agent: a dial request names a database; the stream reaches it.
//!
//! Postgres with `tls` configured: the agent sends the SSLRequest to the server, expects `S`,
//! and runs TLS verified with `tls.ca_cert_file` (else the public web roots) for
//! `tls.server_name` (else the host of `uri`). The client's own connection to its local `tsh`
//! proxy is plain (tsh answered its SSLRequest with `N`), so what arrives through the tunnel
//! is the client's startup message, relayed inside this TLS session. Without `tls`, and for
//! MySQL, the stream is plain TCP to `uri`. Redis (`db_redis`: TLS, the session runs as
//! `db_route.user`) and MongoDB (`db_mongo`: TLS) have their own modules.

use std::path::Path;
use std::sync::Arc;

use svc_core::config::{Database, DbProtocol, DbTls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::BoxError;

use super::{ServiceError, connect, tls_to};
use crate::io::BoxIo;
use crate::tunnel::{DialRequest, DialService, dial_service_fn};

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
            (Some(t), DbProtocol::Postgres | DbProtocol::Redis | DbProtocol::Mongodb) => Some((
                tls_config(db, t)?,
                t.server_name.clone().unwrap_or_else(|| host.clone()),
            )),
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
            let t = targets
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| ServiceError::NotServed {
                    kind: "db",
                    name: name.clone(),
                })?;
            match t.protocol {
                DbProtocol::Redis => {
                    let route = req.db_route.as_ref();
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
            tracing::info!(db = %name, protocol = t.protocol.as_str(), client = %req.client_src_addr, "database connection");
            Ok::<BoxIo, BoxError>(io)
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_core::auth::ServedKind;
    use tower::ServiceExt;

    /// A server that answers the SSLRequest with `answer`, then (on `S`) runs TLS with a
    /// certificate for `localhost` and echoes one message.
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
                let mut buf = [0u8; 7];
                tls.read_exact(&mut buf).await.unwrap();
                tls.write_all(&buf).await.unwrap();
                tls.flush().await.unwrap();
            }
        });
        (port, ca.pem().into_bytes())
    }

    async fn dial(port: u16, ca: &[u8]) -> Result<BoxIo, BoxError> {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca).unwrap();
        let yaml = format!(
            "version: v1\ndb_service:\n  enabled: true\n  databases:\n  - name: pg\n    protocol: postgres\n    uri: 127.0.0.1:{port}\n    tls:\n      ca_cert_file: {}\n      server_name: localhost\n",
            ca_file.display()
        );
        let config = svc_core::config::Config::from_yaml_str_with_hostname(&yaml, "h").unwrap();
        let svc = db_service(&config.db.databases).unwrap();
        let req = |name: &str| DialRequest {
            address: name.into(),
            server_id: "h.test".into(),
            conn_type: ServedKind::Db,
            client_src_addr: "127.0.0.1:1".into(),
            client_dst_addr: "127.0.0.1:2".into(),
            db_route: None,
        };
        let unknown = svc.clone().oneshot(req("mysql-1")).await.err().unwrap();
        assert_eq!(unknown.to_string(), "this agent serves no db named \"mysql-1\"");
        svc.oneshot(req("pg")).await
    }

    #[tokio::test]
    async fn postgres_gets_tls_to_the_server_verified_with_the_configured_ca() {
        let (port, ca) = fake_postgres(b'S').await;
        let mut io = dial(port, &ca).await.unwrap();
        io.write_all(b"startup").await.unwrap();
        let mut buf = [0u8; 7];
        tokio::time::timeout(std::time::Duration::from_secs(30), io.read_exact(&mut buf))
            .await
            .expect("the fake server's echo did not come back within 30 s")
            .unwrap();
        assert_eq!(&buf, b"startup");
    }

    #[tokio::test]
    async fn a_server_refusing_tls_is_an_error_naming_the_database() {
        let (port, ca) = fake_postgres(b'N').await;
        let err = dial(port, &ca).await.err().unwrap().to_string();
        assert!(err.starts_with("db \"pg\": the server refused TLS"), "{err}");
    }
}

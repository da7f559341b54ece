//! The Database Service on the agent: a dial request names a database; the stream reaches it.
//!
//! Postgres with `tls` configured: the agent sends the SSLRequest to the server, expects `S`,
//! and runs TLS verified with `tls.ca_cert_file` (else the public web roots) for
//! `tls.server_name` (else the host of `uri`). The client's own connection to its local `tsh`
//! proxy is plain (tsh answered its SSLRequest with `N`), so what arrives through the tunnel
//! is the client's startup message, relayed inside this TLS session. Without `tls`, and for
//! MySQL, MongoDB and Redis, the stream is plain TCP to `uri`.

use std::path::Path;
use std::sync::Arc;

use svc_core::config::{Database, DbProtocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{ServiceError, connect, tls_to};
use crate::listen::{BoxError, BoxIo};
use crate::tunnel::{DialRequest, DialService, dial_service_fn};

/// Postgres `SSLRequest`: length 8, code 80877103.
pub(crate) const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

struct DbTarget {
    name: String,
    protocol: DbProtocol,
    host: String,
    port: u16,
    /// TLS to the server (Postgres only): the client configuration and the name to verify.
    tls: Option<(Arc<rustls::ClientConfig>, String)>,
}

fn tls_config(db: &Database, ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, ServiceError> {
    let pem = ca_file
        .map(|f| {
            std::fs::read(f).map_err(|e| ServiceError::Config {
                what: format!("database \"{}\": tls.ca_cert_file {}", db.name, f.display()),
                reason: e.to_string(),
            })
        })
        .transpose()?;
    crate::tls::client_config(pem.as_deref()).map_err(|e| ServiceError::Config {
        what: format!("database \"{}\": tls", db.name),
        reason: e.to_string(),
    })
}

/// Builds the service for `databases`; CA files are read now, so a bad path fails at start.
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
            (Some(t), DbProtocol::Postgres) => Some((
                tls_config(db, t.ca_cert_file.as_deref())?,
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

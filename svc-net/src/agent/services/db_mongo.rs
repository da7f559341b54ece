//! MongoDB on the agent: TLS to the server when the database has `tls` set.
//!
//! MongoDB speaks TLS from the first byte (no in-protocol upgrade), so the agent's TLS
//! session starts right after the TCP connection: verified with `tls.ca_cert_file` (else the
//! public web roots) for `tls.server_name` (else the host of `uri`). The client's messages
//! are relayed unchanged inside it, so the server's own authentication applies. A server that
//! does not answer with TLS (`net.tls.mode` `disabled`) fails the dial with an error naming
//! the database. Without `tls` the stream is plain TCP to `uri`.

use std::sync::Arc;

use tokio_rustls::TlsConnector;

use super::{ServiceError, connect};
use crate::io::BoxIo;

/// Connects to MongoDB database `name` at `host:port`, with TLS when `tls` is given.
pub(super) async fn open(
    name: &str,
    host: &str,
    port: u16,
    tls: Option<&(Arc<rustls::ClientConfig>, String)>,
    client: &str,
) -> Result<BoxIo, ServiceError> {
    let tcp = connect("db", name, host, port).await?;
    let io: BoxIo = match tls {
        Some((config, server_name)) => {
            let handshake = |reason: String| ServiceError::Handshake {
                kind: "db",
                name: name.to_owned(),
                reason,
            };
            let sni = rustls::pki_types::ServerName::try_from(server_name.clone())
                .map_err(|e| handshake(format!("server name \"{server_name}\": {e}")))?;
            let stream = TlsConnector::from(config.clone())
                .connect(sni, tcp)
                .await
                .map_err(|e| {
                    let rustls_error = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
                    handshake(match rustls_error {
                        Some(rustls::Error::InvalidCertificate(c)) => {
                            format!("TLS to the server: its certificate was not accepted for \"{server_name}\": {c}")
                        }
                        Some(rustls::Error::AlertReceived(alert)) => {
                            format!("TLS to the server: the server ended the handshake with alert {alert:?}")
                        }
                        _ => format!(
                            "the server refused TLS ({e}); svc connects to MongoDB with TLS when the database has `tls` set, so the server must accept it (net.tls.mode requireTLS, preferTLS or allowTLS)"
                        ),
                    })
                })?;
            Box::new(stream)
        }
        None => Box::new(tcp),
    };
    tracing::info!(db = %name, protocol = "mongodb", tls = tls.is_some(), client = %client, "database connection");
    Ok(io)
}

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    use super::super::db_redis::tests::{dial_request, localhost_pki, service};

    /// A TLS server (certificate for `localhost`) echoing one 5-byte message; its CA PEM.
    async fn tls_echo() -> (u16, String) {
        let pki = localhost_pki();
        let cert = rustls::pki_types::CertificateDer::from(pem_der(&pki.cert));
        let key = rustls::pki_types::PrivateKeyDer::try_from(pem_der(&pki.key)).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = [0u8; 5];
                    if tls.read_exact(&mut buf).await.is_ok() {
                        let _ = tls.write_all(&buf).await;
                        let _ = tls.flush().await;
                    }
                });
            }
        });
        (port, pki.ca)
    }

    fn pem_der(pem: &str) -> Vec<u8> {
        use base64::Engine;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD.decode(body).unwrap()
    }

    #[tokio::test]
    async fn mongodb_gets_verified_tls_to_the_server() {
        let (port, ca) = tls_echo().await;
        let dir = tempfile::tempdir().unwrap();
        let svc = service(dir.path(), "docs", "mongodb", port, &ca, "localhost", None);
        let mut io = svc.oneshot(dial_request("docs", Some("app"))).await.unwrap();
        io.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(30), io.read_exact(&mut buf))
            .await
            .expect("the TLS server's echo did not come back within 30 s")
            .unwrap();
        assert_eq!(&buf, b"hello");

        // Verification: another name, another CA.
        let svc = service(
            dir.path(),
            "docs",
            "mongodb",
            port,
            &ca,
            "mongo.example.com",
            None,
        );
        let err = svc
            .oneshot(dial_request("docs", Some("app")))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with(
                "db \"docs\": TLS to the server: its certificate was not accepted for \"mongo.example.com\""
            ),
            "{err}"
        );
        let other = localhost_pki();
        let svc = service(dir.path(), "docs", "mongodb", port, &other.ca, "localhost", None);
        let err = svc
            .oneshot(dial_request("docs", Some("app")))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("db \"docs\": TLS to the server: its certificate was not accepted"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_server_without_tls_is_an_error_naming_the_database() {
        // A plain MongoDB-like server: answers anything with non-TLS bytes and closes.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let mut buf = [0u8; 512];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp
                    .write_all(&[0x10, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x07, 0, 0])
                    .await;
                let _ = tcp.shutdown().await;
            }
        });
        let ca = localhost_pki().ca;
        let dir = tempfile::tempdir().unwrap();
        let svc = service(dir.path(), "docs", "mongodb", port, &ca, "localhost", None);
        let err = svc
            .oneshot(dial_request("docs", Some("app")))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("db \"docs\": the server refused TLS"), "{err}");
        assert!(err.contains("net.tls.mode"), "{err}");
    }
}

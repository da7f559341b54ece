//! The client end of resource access, for local proxies (`tsh proxy app|db`): TLS to the
//! proxy's web port with the user's certificate and the resource's ALPN name, the
//! [`ResourceRequest`] line, the proxy's answer; then the stream carries the client's bytes.
//! Also the local half of Postgres' TLS negotiation, so `psql` connects to the local listener
//! unchanged.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use svc_core::Addr;
use svc_core::auth::ServedKind;
use svc_core::config::DbProtocol;
use svc_core::identity::IdentityKind;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::{MAX_LINE, RESOURCE_OK, ResourceRequest};
use crate::auth::ClientIdentity;
use crate::dial::ProxyDialer;
use crate::listen::BoxIo;
use crate::route::alpn;
use crate::tunnel::read_line;

/// Why a resource could not be reached through the proxy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The proxy could not be reached or its TLS handshake failed.
    #[error("connecting to the proxy at {addr}: {reason}")]
    Proxy {
        /// The proxy address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The proxy refused: its text names the resource (access denied, not found, agent down).
    #[error("{0}")]
    Refused(String),
    /// The local identity is unusable.
    #[error("identity: {0}")]
    Identity(String),
}

/// Where the proxy is and who the user is.
#[derive(Clone, Debug)]
pub struct ResourceClient {
    /// The proxy's web address.
    pub proxy: Addr,
    /// The user's identity (the `tsh` profile's).
    pub identity: ClientIdentity,
    /// Skip checking the proxy's certificate (`tsh login --insecure`, self-signed test
    /// clusters). The user is still authenticated by the certificate.
    pub insecure: bool,
    /// Extra CAs (PEM) for the proxy's certificate.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// How the proxy is reached (direct or HTTP CONNECT).
    pub dialer: ProxyDialer,
}

/// The ALPN name for a resource kind (and database protocol).
pub fn alpn_for(kind: ServedKind, protocol: Option<DbProtocol>) -> &'static str {
    match (kind, protocol) {
        (ServedKind::Db, Some(DbProtocol::Mysql)) => alpn::MYSQL,
        (ServedKind::Db, Some(DbProtocol::Mongodb)) => alpn::MONGODB,
        (ServedKind::Db, Some(DbProtocol::Redis)) => alpn::REDIS,
        (ServedKind::Db, _) => alpn::POSTGRES,
        _ => alpn::TCP,
    }
}

impl ResourceClient {
    fn tls(&self, protocol: &str) -> Result<Arc<rustls::ClientConfig>, ConnectError> {
        let id = |e: String| ConnectError::Identity(e);
        let (chain, key) = self.identity.tls_parts().map_err(|e| id(e.to_string()))?;
        let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| id(e.to_string()))?;
        let builder = if self.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(crate::tls::insecure_verifier())
        } else {
            let verifier = self.identity.verifier().map_err(|e| id(e.to_string()))?;
            let mut roots = crate::tls::client_roots(self.extra_ca_pem.as_deref())
                .map_err(|e| id(format!("proxy CA bundle: {e}")))?;
            roots.extend(verifier.root_store(Some(IdentityKind::Host)).roots);
            builder.with_root_certificates(roots)
        };
        let mut config = builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| id(e.to_string()))?;
        config.alpn_protocols = vec![protocol.as_bytes().to_vec()];
        Ok(Arc::new(config))
    }

    /// Opens a stream to `kind`/`name` with the ALPN `protocol` ([`alpn_for`]); the proxy's
    /// refusal comes back as [`ConnectError::Refused`] with its text.
    pub async fn connect(&self, kind: ServedKind, name: &str, protocol: &str) -> Result<BoxIo, ConnectError> {
        let addr = self.proxy.to_string();
        let proxy_err = |reason: String| ConnectError::Proxy {
            addr: addr.clone(),
            reason,
        };
        let config = self.tls(protocol)?;
        let tcp = self
            .dialer
            .dial(&self.proxy)
            .await
            .map_err(|e| proxy_err(e.to_string()))?;
        let host = self
            .proxy
            .host_str()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let sni = ServerName::try_from(host).map_err(|e| proxy_err(e.to_string()))?;
        let mut tls = TlsConnector::from(config)
            .connect(sni, tcp)
            .await
            .map_err(|e| proxy_err(format!("TLS: {e}")))?;
        let mut line = serde_json::to_vec(&ResourceRequest {
            kind,
            name: name.to_owned(),
        })
        .map_err(|e| proxy_err(e.to_string()))?;
        line.push(b'\n');
        tls.write_all(&line).await.map_err(|e| proxy_err(e.to_string()))?;
        tls.flush().await.map_err(|e| proxy_err(e.to_string()))?;
        let answer = read_line(&mut tls, MAX_LINE)
            .await
            .map_err(|e| proxy_err(format!("reading the answer: {e}")))?
            .unwrap_or_else(|| "the proxy closed the connection without an answer".into());
        if answer != RESOURCE_OK {
            return Err(ConnectError::Refused(answer));
        }
        Ok(Box::new(tls))
    }
}

/// Postgres request codes that ask for encryption first (SSLRequest, GSSENCRequest).
const SSL_CODE: u32 = 80_877_103;
const GSSENC_CODE: u32 = 80_877_104;

/// The local side of a Postgres client's negotiation: answers `N` to its SSLRequest and
/// GSSENCRequest (the hop to the proxy is TLS already, and the agent does TLS to the server)
/// and returns the startup message, which the caller forwards first.
pub async fn postgres_startup<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S) -> std::io::Result<Vec<u8>> {
    loop {
        let mut len = [0u8; 4];
        io.read_exact(&mut len).await?;
        let n = u32::from_be_bytes(len) as usize;
        if !(8..=10_000).contains(&n) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a Postgres startup message of {n} bytes: expected 8 to 10000"),
            ));
        }
        let mut body = vec![0u8; n - 4];
        io.read_exact(&mut body).await?;
        let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        if n == 8 && (code == SSL_CODE || code == GSSENC_CODE) {
            io.write_all(b"N").await?;
            continue;
        }
        let mut msg = len.to_vec();
        msg.extend_from_slice(&body);
        return Ok(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn postgres_negotiation_refuses_encryption_and_returns_the_startup() {
        let (mut client, mut local) = tokio::io::duplex(1024);
        let startup: Vec<u8> = {
            let params = b"\0\x03\0\0user\0alice\0\0";
            let mut m = ((params.len() + 4) as u32).to_be_bytes().to_vec();
            m.extend_from_slice(params);
            m
        };
        let sent = startup.clone();
        let client_side = tokio::spawn(async move {
            client
                .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30])
                .await
                .unwrap();
            let mut b = [0u8; 1];
            client.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"N");
            client
                .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
                .await
                .unwrap();
            client.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"N");
            client.write_all(&sent).await.unwrap();
            client
        });
        assert_eq!(postgres_startup(&mut local).await.unwrap(), startup);
        client_side.await.unwrap();
    }

    #[test]
    fn alpn_names() {
        assert_eq!(alpn_for(ServedKind::App, None), "svc-tcp");
        assert_eq!(
            alpn_for(ServedKind::Db, Some(DbProtocol::Postgres)),
            "svc-postgres"
        );
        assert_eq!(alpn_for(ServedKind::Db, Some(DbProtocol::Redis)), "svc-redis");
        assert_eq!(alpn_for(ServedKind::WindowsDesktop, None), "svc-tcp");
    }
}

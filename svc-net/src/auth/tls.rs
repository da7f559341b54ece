//! TLS for the Auth API: the server's mutual-TLS configuration and the clients' checks of the
//! server (by the cluster's host CA, or by the CA pin before an agent has joined).

use std::sync::Arc;
use std::time::SystemTime;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use svc_core::identity::{SystemRole, Verifier};

/// The ALPN protocol of the Auth API.
pub(super) const ALPN_H2: &[u8] = b"h2";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    crate::tls::provider()
}

/// The server side: present the Auth host certificate; verify any client certificate against
/// the cluster's host and user CAs. A client without a certificate is let through the
/// handshake only so it can call `Join`; every other call refuses it.
pub(super) fn server_config(
    verifier: &Verifier,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let clients =
        WebPkiClientVerifier::builder_with_provider(Arc::new(verifier.root_store(None)), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| rustls::Error::General(format!("client verifier: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain, key)?;
    // The connection-upgrade probe is answered too, so that a client reaching the Auth
    // Service directly knows no load balancer is in the way (`conn_upgrade`).
    config.alpn_protocols = vec![ALPN_H2.to_vec(), crate::route::alpn::PING.as_bytes().to_vec()];
    Ok(Arc::new(config))
}

/// How a client decides the server is the cluster's Auth Service.
#[derive(Debug)]
pub(super) enum ServerCheck {
    /// The server's certificate is a host certificate with the `auth` role from this cluster.
    Cluster(Verifier),
    /// Before joining: the server's chain ends in a CA whose pin is this one (or, with `None`,
    /// any CA: trust on first use, which the caller must have chosen explicitly).
    Pin(Option<String>),
}

impl crate::tls::ServerIdentityCheck for ServerCheck {
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        now: UnixTime,
    ) -> Result<(), rustls::Error> {
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(now.as_secs());
        // Names are not checked: the Auth Service is identified by its certificate's identity
        // (cluster + `auth` role), which works whatever address the client dialled.
        match self {
            ServerCheck::Cluster(verifier) => {
                let chain = [end_entity.clone()];
                verifier
                    .verify_host_x509(&chain, now, Some(SystemRole::Auth))
                    .map_err(|e| rustls::Error::General(format!("the Auth Service's certificate: {e}")))?;
            }
            ServerCheck::Pin(pin) => {
                let ca = intermediates.last().ok_or_else(|| {
                    rustls::Error::General("the Auth Service sent no CA certificate".into())
                })?;
                let found = svc_core::auth::ca_pin_of_cert(ca)
                    .map_err(|e| rustls::Error::General(format!("the Auth Service's CA: {e}")))?;
                if let Some(pin) = pin
                    && *pin != found
                {
                    return Err(rustls::Error::General(format!(
                        "the Auth Service's CA pin is {found}, expected {pin}"
                    )));
                }
                let anchor = webpki::anchor_from_trusted_cert(ca)
                    .map_err(|e| rustls::Error::General(format!("the Auth Service's CA: {e}")))?;
                let leaf = webpki::EndEntityCert::try_from(end_entity)
                    .map_err(|e| rustls::Error::General(format!("the Auth Service's certificate: {e}")))?;
                leaf.verify_for_usage(
                    webpki::ALL_VERIFICATION_ALGS,
                    &[anchor],
                    &[],
                    UnixTime::since_unix_epoch(
                        now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default(),
                    ),
                    webpki::KeyUsage::server_auth(),
                    None,
                    None,
                )
                .map_err(|e| rustls::Error::General(format!("the Auth Service's certificate: {e}")))?;
                // Any host of the cluster chains to the pinned CA; only the Auth Service may
                // receive a join token.
                svc_core::identity::auth_server_identity(end_entity, ca).map_err(|e| {
                    rustls::Error::General(format!(
                        "the server answering the join is not the Auth Service: {e}"
                    ))
                })?;
            }
        }
        Ok(())
    }
}

/// A client configuration: check the server with `check`; present `client` if given.
pub(super) fn client_config(
    cluster: Option<&str>,
    check: ServerCheck,
    client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(crate::tls::ServerIdentityVerifier::new(check));
    let mut config = match client {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    // The routing ALPN first (a proxy routes on it), then h2 (what the Auth Service picks).
    config.alpn_protocols = cluster
        .map(|c| super::route::alpn(c).into_bytes())
        .into_iter()
        .chain([ALPN_H2.to_vec()])
        .collect();
    Ok(Arc::new(config))
}

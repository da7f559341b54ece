//! The client half of the hop through the proxy: [`connect_via_proxy`] dials the proxy (its
//! SSH port, or SSH inside TLS with ALPN `svc-proxy-ssh` on the web port), authenticates with
//! the user's certificate, verifies the proxy's host certificate, and asks for the
//! `proxy:<node>:<port>` subsystem. The returned stream reaches the node's SSH Service: the
//! caller runs its SSH session over it (`tsh ssh` with russh) or copies it to stdio (`tsh proxy
//! ssh` as OpenSSH's `ProxyCommand`).

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use russh::{
    ChannelMsg,
    client::Msg,
    keys::{Certificate, PrivateKey, PublicKeyOrCertificate},
};
use rustls::pki_types::ServerName;
use svc_core::{
    Addr,
    identity::{IdentityKind, SystemRole, Verifier},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::ssh::{SshError, Tunables, client_config};
use crate::{dial::ProxyDialer, io::BoxIo, route::alpn};

/// A user's SSH credentials.
#[derive(Clone)]
pub struct SshIdentity {
    /// The private key.
    pub key: Arc<PrivateKey>,
    /// The user-CA-signed certificate for it.
    pub cert: Certificate,
    /// The SSH user name sent to the proxy (any of the certificate's logins).
    pub login: String,
}

impl std::fmt::Debug for SshIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshIdentity")
            .field("login", &self.login)
            .field("key", &"***")
            .finish()
    }
}

/// Where the proxy is and how to trust it.
#[derive(Clone, Debug)]
pub struct ProxyEndpoint {
    /// The proxy's SSH address (3023), or its web address when `tls` is set.
    pub addr: Addr,
    /// SSH inside TLS with ALPN `svc-proxy-ssh` (TLS routing).
    pub tls: bool,
    /// Trusts the cluster's host CA: verifies the proxy's SSH host certificate, and (its X.509
    /// half) the proxy's TLS certificate.
    pub verifier: Arc<Verifier>,
    /// Extra CA certificates (PEM) for the proxy's TLS certificate.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// How to reach the proxy (direct, or through an HTTP CONNECT proxy).
    pub dialer: ProxyDialer,
    /// Deadline for the whole connection set-up.
    pub timeout: Duration,
}

struct ClientHandler {
    verifier: Arc<Verifier>,
}

impl russh::client::Handler for ClientHandler {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::Certificate(cert) = key else {
            return Ok(false);
        };
        Ok(self
            .verifier
            .verify_host_ssh(cert, SystemTime::now(), Some(SystemRole::Proxy))
            .is_ok())
    }
}

/// A stream to a node through the proxy. Holds the proxy connection open while it lives.
pub struct ProxiedStream {
    inner: russh::ChannelStream<Msg>,
    _session: russh::client::Handle<ClientHandler>,
}

impl std::fmt::Debug for ProxiedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProxiedStream")
    }
}

impl AsyncRead for ProxiedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ProxiedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn tls_config(endpoint: &ProxyEndpoint) -> Result<Arc<rustls::ClientConfig>, SshError> {
    let invalid = |reason: String| SshError::Invalid {
        what: "proxy CA bundle",
        reason,
    };
    let mut roots =
        crate::tls::client_roots(endpoint.extra_ca_pem.as_deref()).map_err(|e| invalid(e.to_string()))?;
    roots.extend(endpoint.verifier.root_store(Some(IdentityKind::Host)).roots);
    let mut config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn::PROXY_SSH.as_bytes().to_vec()];
    Ok(Arc::new(config))
}

/// Opens a stream to `node`'s SSH Service (`port` 0 means the default, 3022) through the proxy.
/// `node` is a node name, host ID or host UUID.
pub async fn connect_via_proxy(
    endpoint: &ProxyEndpoint,
    identity: &SshIdentity,
    node: &str,
    port: u16,
) -> Result<ProxiedStream, SshError> {
    let addr = endpoint.addr.to_string();
    let setup = async {
        let dial = || async {
            endpoint
                .dialer
                .dial(&endpoint.addr)
                .await
                .map(|tcp| Box::new(tcp) as BoxIo)
                .map_err(|e| SshError::Dial {
                    addr: addr.clone(),
                    reason: e.to_string(),
                })
        };
        let io: BoxIo = if endpoint.tls {
            let host = endpoint.addr.host_str();
            let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let name = ServerName::try_from(host).map_err(|e| SshError::Invalid {
                what: "proxy address",
                reason: e.to_string(),
            })?;
            // Through the connection upgrade when a load balancer terminates TLS in front of
            // the proxy (`conn_upgrade`).
            let outer = crate::conn_upgrade::OuterTrust {
                extra_ca_pem: endpoint.extra_ca_pem.clone(),
                insecure: false,
            };
            let tls = crate::conn_upgrade::connect_tls(dial, tls_config(endpoint)?, &outer, name, &addr)
                .await
                .map_err(|e| SshError::Dial {
                    addr: addr.clone(),
                    reason: e.to_string(),
                })?;
            Box::new(tls)
        } else {
            dial().await?
        };
        let config = client_config(&Tunables::default());
        let handler = ClientHandler {
            verifier: endpoint.verifier.clone(),
        };
        let mut session = russh::client::connect_stream(Arc::new(config), io, handler).await?;
        let auth = session
            .authenticate_openssh_cert(
                identity.login.clone(),
                identity.key.clone(),
                identity.cert.clone(),
            )
            .await?;
        if !auth.success() {
            return Err(SshError::AuthRefused(addr.clone()));
        }
        let mut channel = session.channel_open_session().await?;
        let subsystem = if port == 0 {
            format!("proxy:{node}")
        } else {
            format!("proxy:{node}:{port}")
        };
        channel.request_subsystem(true, subsystem).await?;
        // The answer to the subsystem request decides; the proxy's reason for a failure arrives
        // on stderr.
        let mut reason = String::new();
        loop {
            match channel.wait().await {
                Some(ChannelMsg::Success) => break,
                Some(ChannelMsg::Failure) | Some(ChannelMsg::Close) | None => {
                    while let Ok(Some(msg)) =
                        tokio::time::timeout(Duration::from_millis(200), channel.wait()).await
                    {
                        if let ChannelMsg::ExtendedData { data, .. } = msg {
                            reason.push_str(&String::from_utf8_lossy(&data));
                        }
                    }
                    return Err(SshError::NodeUnreachable {
                        node: node.to_owned(),
                        reason: if reason.is_empty() {
                            "the proxy refused the request".into()
                        } else {
                            reason.trim().trim_start_matches("svc: ").to_owned()
                        },
                    });
                }
                Some(ChannelMsg::ExtendedData { data, .. }) => {
                    reason.push_str(&String::from_utf8_lossy(&data))
                }
                Some(_) => {}
            }
        }
        Ok(ProxiedStream {
            inner: channel.into_stream(),
            _session: session,
        })
    };
    tokio::time::timeout(endpoint.timeout, setup)
        .await
        .map_err(|_| SshError::Timeout {
            what: "connecting through the proxy",
            after: endpoint.timeout,
        })?
}

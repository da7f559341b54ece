//! Direct join: an agent that joined the Auth Service directly (no `svc.proxy_server`) is
//! reached on its own listeners instead of a reverse tunnel.
//!
//! Address rule: the Auth Service accepts an announced address only when it is the agent's
//! observed source address or a name its certificate carries, and never an unspecified,
//! link-local, multicast, loopback (without the lab opt-in) or cluster service address
//! ([`svc_core::auth::check_direct_addr`]); the proxy dials only resolved addresses that are
//! not unspecified, link-local, multicast or (without the opt-in) loopback, and then sends
//! nothing before the agent has proven, with its host certificate, to be the host the Auth
//! Service named.
//!
//! Data flow: the agent binds its listeners and announces their addresses in its heartbeats
//! (`ServedResource::direct_addr`). When the proxy's [`TunnelDialer`](super::TunnelDialer) has
//! no tunnel for a dial request's server, it asks a [`DirectLookup`] (the Auth Service) for the
//! agent's announced listener and dials it with the [`DirectDialer`]:
//! every kind — SSH (`ServedKind::Node`, port 3022), Kubernetes (3026) and Windows Desktop
//! (3028) — over mutual TLS. The agent presents its host certificate (the proxy checks it is the host ID the Auth Service named) and requires the
//! proxy's host certificate (role `proxy`); then the same dial request line a tunnel carries
//! is answered `ok` or with the error, and bytes follow ([`serve_direct`]). The SSH listener
//! tells the proxy's TLS from users' plain SSH (`ssh -p 3022`) by the first bytes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use svc_core::auth::ServedKind;
use svc_core::identity::{IdentityKind, SystemRole, Verifier};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

use super::agent::serve_dial_stream;
use super::{DIAL_OK, DialRequest, DialService, MAX_DIAL_REQUEST, TunnelError, read_line};
use crate::auth::ClientIdentity;
use crate::io::{BoxIo, Connection};
use crate::listen::ListenOptions;
use tower::BoxError;

/// How long a direct dial (TCP, TLS and the dial request's answer) may take.
pub const DIRECT_DIAL_TIMEOUT: Duration = Duration::from_secs(15);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    crate::tls::provider()
}

fn tls_error(what: &'static str, e: impl std::fmt::Display) -> TunnelError {
    TunnelError::Malformed {
        what,
        reason: e.to_string(),
    }
}

/// Where a directly joined agent listens: the host ID its certificate must carry and the
/// `host:port` it announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectTarget {
    /// The agent's host ID (`<uuid>.<cluster>`).
    pub host_id: String,
    /// The announced listener (`host:port`).
    pub addr: String,
}

/// Finds the listener a directly joined agent announced (the proxy asks the Auth Service).
pub trait DirectLookup: Send + Sync + 'static {
    /// The listener of `server` (host ID, UUID or node name) for `conn_type`, or `None` when no
    /// live agent by that name announced one; `Err` with the reason when the agent announced
    /// one that was refused (the text names the node).
    fn lookup(
        &self,
        server: String,
        conn_type: ServedKind,
    ) -> BoxFuture<'static, Result<Option<DirectTarget>, String>>;
}

/// The agent's TLS configuration for its Kubernetes and Windows Desktop listeners: present the
/// host certificate; require a client certificate from the cluster's host CA (checked to carry
/// the `proxy` role after the handshake, in [`serve_direct`]).
pub fn agent_tls(identity: &ClientIdentity) -> Result<Arc<rustls::ServerConfig>, TunnelError> {
    let verifier = identity
        .verifier()
        .map_err(|e| tls_error("the host identity", e))?;
    let (chain, key) = identity
        .tls_parts()
        .map_err(|e| tls_error("the host identity", e))?;
    let clients = WebPkiClientVerifier::builder_with_provider(
        Arc::new(verifier.root_store(Some(IdentityKind::Host))),
        provider(),
    )
    .build()
    .map_err(|e| tls_error("the client verifier", e))?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("the TLS configuration", e))?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain, key)
        .map_err(|e| tls_error("the TLS configuration", e))?;
    Ok(Arc::new(config))
}

/// Serves a directly joined agent's Kubernetes or Windows Desktop listener until `shutdown`:
/// mutual TLS (`tls` from [`agent_tls`]), the peer must be a proxy of this cluster, then one
/// dial request answered by `service`, as on a tunnel's transport channel. Runs the shared
/// accept loop ([`listen::serve`](crate::listen::serve)) with its default limits: see
/// [`serve_direct_with`].
pub async fn serve_direct(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    verifier: Arc<Verifier>,
    service: DialService,
    shutdown: CancellationToken,
) {
    let options = ListenOptions::default().with_peek_timeout(DIRECT_DIAL_TIMEOUT);
    serve_direct_with(listener, tls, verifier, service, options, shutdown).await;
}

/// [`serve_direct`] under the accept loop's `options`, like every other listener: at most
/// `max_connections` open connections and `max_peeking` still in their TLS handshake (the
/// excess is closed at once), the TLS handshake and the proxy's certificate check within
/// `peek_timeout` of the accept, and a pause that doubles up to one second when `accept`
/// fails (out of file descriptors).
pub async fn serve_direct_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    verifier: Arc<Verifier>,
    service: DialService,
    options: ListenOptions,
    shutdown: CancellationToken,
) {
    crate::listen::serve(
        listener,
        direct_handler(tls, verifier, service),
        options,
        shutdown,
    )
    .await;
}

/// The handler of one connection from the proxy to a directly joined agent: mutual TLS (the
/// proxy's host certificate required) within the connection's peek deadline, then the dial
/// request a tunnel would carry, answered by `service`. The agent's SSH listener hands it the
/// connections that start with a TLS handshake; the Kubernetes and Windows Desktop listeners
/// all of theirs.
pub(crate) fn direct_handler(
    tls: Arc<rustls::ServerConfig>,
    verifier: Arc<Verifier>,
    service: DialService,
) -> crate::io::ConnService {
    let acceptor = TlsAcceptor::from(tls);
    crate::io::conn_service(tower::service_fn(move |conn: Connection| {
        let (acceptor, verifier, service) = (acceptor.clone(), verifier.clone(), service.clone());
        async move {
            let peer = conn.peer_addr;
            if let Err(e) = serve_one(conn, acceptor, &verifier, service).await {
                tracing::info!(%peer, error = %e, "refused a direct connection");
            }
            Ok::<(), BoxError>(())
        }
    }))
}

async fn serve_one(
    conn: Connection,
    acceptor: TlsAcceptor,
    verifier: &Verifier,
    service: DialService,
) -> Result<(), String> {
    let (io, deadline, shutdown, slot) = conn.into_parts();
    let mut tls = crate::tls::accept_before(&acceptor, io, deadline)
        .await
        .map_err(|e| e.to_string())?;
    let chain: Vec<CertificateDer<'static>> = tls
        .get_ref()
        .1
        .peer_certificates()
        .map(<[_]>::to_vec)
        .unwrap_or_default();
    // The handshake checked the chain ends at the host CA; only a proxy may dial.
    if let Err(e) = verifier.verify_host_x509(&chain, SystemTime::now(), Some(SystemRole::Proxy)) {
        let _ = tls
            .write_all(format!("expected a proxy's host certificate: {e}\n").as_bytes())
            .await;
        let _ = tls.shutdown().await;
        return Err(format!("expected a proxy's host certificate: {e}"));
    }
    // Past the handshake: no longer counted among the connections being classified.
    drop(slot);
    tokio::select! {
        () = serve_dial_stream(tls, service, false) => {}
        () = shutdown.cancelled() => {}
    }
    Ok(())
}

/// The proxy's side: dials a directly joined agent's listener with mutual TLS (the proxy's
/// host certificate; the agent's checked for the host ID the lookup named). Cheap to clone.
#[derive(Clone)]
pub struct DirectDialer {
    lookup: Arc<dyn DirectLookup>,
    /// Shared by the clones; replaced when the proxy's host certificates are renewed
    /// ([`DirectDialer::set_identity`]).
    tls: Arc<std::sync::RwLock<TlsConnector>>,
    timeout: Duration,
    allow_loopback: bool,
}

impl std::fmt::Debug for DirectDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectDialer")
            .field("timeout", &self.timeout)
            .field("allow_loopback", &self.allow_loopback)
            .finish()
    }
}

/// The TLS client side presenting `identity` (role `proxy`) and checking that the agent's
/// certificate names the host ID the Auth Service named.
fn connector(identity: &ClientIdentity) -> Result<TlsConnector, TunnelError> {
    let verifier = identity
        .verifier()
        .map_err(|e| tls_error("the host identity", e))?;
    let (chain, key) = identity
        .tls_parts()
        .map_err(|e| tls_error("the host identity", e))?;
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("the TLS configuration", e))?
        .dangerous()
        .with_custom_certificate_verifier(crate::tls::ServerIdentityVerifier::new(AgentVerifier {
            verifier,
        }))
        .with_client_auth_cert(chain, key)
        .map_err(|e| tls_error("the TLS configuration", e))?;
    Ok(TlsConnector::from(Arc::new(config)))
}

impl DirectDialer {
    /// A dialer presenting `identity` (the proxy's host identity, role `proxy`) and finding
    /// listeners with `lookup`.
    pub fn new(identity: &ClientIdentity, lookup: Arc<dyn DirectLookup>) -> Result<Self, TunnelError> {
        Ok(Self {
            lookup,
            tls: Arc::new(std::sync::RwLock::new(connector(identity)?)),
            timeout: DIRECT_DIAL_TIMEOUT,
            allow_loopback: false,
        })
    }

    /// Presents `identity` from now on (the proxy's renewed host certificates), in every clone
    /// of this dialer.
    pub fn set_identity(&self, identity: &ClientIdentity) -> Result<(), TunnelError> {
        let fresh = connector(identity)?;
        *self
            .tls
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// Whether loopback addresses may be dialed (default `false`: a name that resolves to
    /// loopback, or a loopback address, is refused). On for single-host labs
    /// (`auth_service.direct_dial.allow_loopback`), in step with the Auth Service's rule.
    pub fn with_allow_loopback(mut self, allow: bool) -> Self {
        self.allow_loopback = allow;
        self
    }

    /// Dials `req` on the listener its server announced; `Ok(None)` when it announced none.
    pub async fn dial(&self, req: DialRequest) -> Result<Option<BoxIo>, TunnelError> {
        let target = match self.lookup.lookup(req.server_id.clone(), req.conn_type).await {
            Ok(Some(target)) => target,
            Ok(None) => return Ok(None),
            Err(reason) => {
                return Err(TunnelError::DialRefused {
                    server: req.server_id,
                    address: req.address,
                    reason,
                });
            }
        };
        let dial = self.dial_target(req, target);
        tokio::time::timeout(self.timeout, dial)
            .await
            .map_err(|_| TunnelError::Timeout {
                what: "dialing the agent's listener",
                after: self.timeout,
            })?
            .map(Some)
    }

    async fn dial_target(&self, mut req: DialRequest, target: DirectTarget) -> Result<BoxIo, TunnelError> {
        let tcp = connect_announced(&target, &req.address, self.allow_loopback).await?;
        let _ = tcp.set_nodelay(true);
        // The name the agent's certificate must carry: the host ID the Auth Service named.
        let name =
            ServerName::try_from(target.host_id.clone()).map_err(|e| tls_error("the agent's host ID", e))?;
        let tls = self
            .tls
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut tls = tls.connect(name, tcp).await.map_err(|source| TunnelError::Io {
            what: "the TLS handshake with the agent's listener",
            source,
        })?;
        req.server_id = target.host_id.clone();
        let mut line = serde_json::to_vec(&req).map_err(|e| tls_error("dial request", e))?;
        line.push(b'\n');
        let io = |what| move |source| TunnelError::Io { what, source };
        tls.write_all(&line)
            .await
            .map_err(io("sending the dial request"))?;
        tls.flush().await.map_err(io("sending the dial request"))?;
        let answer = read_line(&mut tls, MAX_DIAL_REQUEST)
            .await
            .map_err(io("reading the agent's answer"))?
            .unwrap_or_else(|| "the agent closed the connection".into());
        if answer == DIAL_OK {
            Ok(Box::new(tls))
        } else {
            Err(TunnelError::DialRefused {
                server: target.host_id,
                address: req.address,
                reason: answer,
            })
        }
    }
}

/// Connects to an agent's announced listener, only at addresses the proxy may dial for users
/// ([`direct_ip_allowed`](svc_core::auth::direct_ip_allowed), and not loopback unless
/// `allow_loopback`): a name that resolves to the cloud metadata service, another link-local,
/// unspecified or multicast address, or the proxy's own host is refused here even though the
/// Auth Service accepted the name.
async fn connect_announced(
    target: &DirectTarget,
    address: &str,
    allow_loopback: bool,
) -> Result<TcpStream, TunnelError> {
    let resolved: Vec<std::net::SocketAddr> = tokio::net::lookup_host(&target.addr)
        .await
        .map_err(|source| TunnelError::Io {
            what: "resolving the agent's listener",
            source,
        })?
        .collect();
    let allowed: Vec<std::net::SocketAddr> = resolved
        .iter()
        .copied()
        .filter(|a| {
            let ip = match a.ip() {
                std::net::IpAddr::V6(v6) => v6
                    .to_ipv4_mapped()
                    .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
                v4 => v4,
            };
            svc_core::auth::direct_ip_allowed(ip) && (allow_loopback || !ip.is_loopback())
        })
        .collect();
    if allowed.is_empty() {
        tracing::warn!(host_id = %target.host_id, addr = %target.addr, ?resolved, "refusing to dial an agent's announced listener");
        return Err(TunnelError::DialRefused {
            server: target.host_id.clone(),
            address: address.to_owned(),
            reason: format!(
                "the agent's announced listener {} resolves to no address the proxy dials (loopback, link-local, unspecified or multicast)",
                target.addr
            ),
        });
    }
    TcpStream::connect(&allowed[..])
        .await
        .map_err(|source| TunnelError::Io {
            what: "connecting to the agent's listener",
            source,
        })
}

/// Checks a directly joined agent's certificate: a host certificate of this cluster whose
/// host ID is the one the Auth Service named (the TLS server name). Addresses are not checked:
/// the agent is identified by its certificate, whatever address it announced.
#[derive(Debug)]
struct AgentVerifier {
    verifier: Verifier,
}

impl crate::tls::ServerIdentityCheck for AgentVerifier {
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        now: UnixTime,
    ) -> Result<(), rustls::Error> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now.as_secs());
        let host = self
            .verifier
            .verify_host_x509(&[end_entity.clone().into_owned()], now, None)
            .map_err(|e| rustls::Error::General(format!("the agent's certificate: {e}")))?;
        let expected = server_name.to_str();
        if host.host_id != expected.as_ref() {
            return Err(rustls::Error::General(format!(
                "the agent's certificate is for host {}, expected {expected}",
                host.host_id
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metadata_and_link_local_listeners_are_never_dialed() {
        for addr in [
            "169.254.169.254:80",
            "[fe80::1]:22",
            "0.0.0.0:3022",
            "[::ffff:169.254.169.254]:80",
        ] {
            let target = DirectTarget {
                host_id: "rogue.example.com".into(),
                addr: addr.into(),
            };
            let err = connect_announced(&target, "node-1:3022", true).await.unwrap_err();
            assert!(
                matches!(&err, TunnelError::DialRefused { reason, .. } if reason.contains("resolves to no address the proxy dials")),
                "{addr}: {err}"
            );
        }
        // A loopback listener is dialed only with the lab opt-in; without it, neither the
        // address nor a name that resolves to it is (and the listener never sees a connection).
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        for addr in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::ffff:127.0.0.1]:{port}"),
        ] {
            let target = DirectTarget {
                host_id: "edge.example.com".into(),
                addr: addr.clone(),
            };
            let err = connect_announced(&target, "edge:3022", false).await.unwrap_err();
            assert!(
                matches!(&err, TunnelError::DialRefused { reason, .. } if reason.contains("loopback")),
                "{addr}: {err}"
            );
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(200), listener.accept())
                .await
                .is_err(),
            "a refused loopback listener was connected to"
        );
        let target = DirectTarget {
            host_id: "edge.example.com".into(),
            addr: listener.local_addr().unwrap().to_string(),
        };
        connect_announced(&target, "edge:3022", true).await.unwrap();
    }
}

//! The proxy's Kubernetes entry ([`KubeProxy`], the SNI route
//! `kube-svc-proxy-alpn.<kube cluster>`): terminates TLS with the user's certificate required,
//! asks the Auth Service for the route to the Kubernetes cluster named by the SNI suffix (RBAC
//! by `kubernetes_labels`), dials the agent through its tunnel (`conn_type` `kube`, `address`
//! the cluster name) and relays HTTP/1.1 requests over that stream, replacing whatever identity
//! the client sent (`Authorization`, `Impersonate-*`) with `Impersonate-User: <user>` and one
//! `Impersonate-Group` per role. A refusal is answered per request with a Kubernetes `Status`
//! (403) naming the cluster. The agent's end is `agent::services::KubeAgent`.
//!
//! Connection upgrades (`kubectl exec`, `attach`, `cp` over WebSocket `v5.channel.k8s.io` and
//! its predecessors, `port-forward` and older clients over `SPDY/3.1`) are relayed: the agent's
//! `101 Switching Protocols` goes back to the client, then bytes flow both ways until either
//! side closes. Responses are streamed as they arrive (`watch`, `logs -f`), never collected.
//!
//! Limits: HTTP/1.1 only (kubectl's default for an upgrade or a watch).

use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use svc_core::auth::ServedKind;
use svc_core::identity::{IdentityKind, UserIdentity, Verifier};
use tokio_rustls::TlsAcceptor;
use tower::BoxError;

use crate::io::{ConnFuture, ConnService, Connection, conn_service};
use crate::proxy::cache::RouteResolver;
use crate::route::alpn;
use crate::services::kube::{Body, client_upgrade, relay_upgrade, status};
use crate::tls::{ServerIdentity, TlsError};
use crate::tunnel::{DialRequest, TunnelDialer};

/// The HTTP/1.1 connection to the agent over one tunnel stream, shared by the requests of one
/// client connection (one at a time).
type AgentSender = tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>;

/// The proxy's Kubernetes entry (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct KubeProxy {
    tls: TlsAcceptor,
    verifier: Arc<Verifier>,
    auth: RouteResolver,
    dialer: TunnelDialer,
}

impl std::fmt::Debug for KubeProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeProxy")
    }
}

impl KubeProxy {
    /// The entry with the proxy's certificate, user certificates required (the user CA of
    /// `verifier`), the Auth API as the proxy, and the tunnel dialer.
    pub fn new(
        identity: &ServerIdentity,
        verifier: Arc<Verifier>,
        auth: impl Into<RouteResolver>,
        dialer: TunnelDialer,
    ) -> Result<Self, TlsError> {
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(verifier.root_store(Some(IdentityKind::User))),
            crate::tls::provider(),
        )
        .build()
        .map_err(|e| TlsError::Rustls(rustls::Error::General(format!("client verifier: {e}"))))?;
        let config = identity.server_config_with_client_auth(&[alpn::HTTP1], clients)?;
        Ok(Self {
            tls: TlsAcceptor::from(config),
            verifier,
            auth: auth.into(),
            dialer,
        })
    }

    /// The handler for `ProxyBuilder::kube`.
    pub fn service(&self) -> ConnService {
        let this = self.clone();
        conn_service(tower::service_fn(move |mut conn: Connection| {
            let this = this.clone();
            ConnFuture::new(async move {
                conn.classified();
                let peer = conn.peer_addr;
                let local = conn.local_addr;
                if let Err(e) = this.serve(conn.io, peer, local).await {
                    tracing::info!(%peer, error = %e, "kubernetes client connection ended");
                }
                Ok::<(), BoxError>(())
            })
        }))
    }

    async fn serve<S>(
        &self,
        io: S,
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
    ) -> Result<(), BoxError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + crate::tls::DEFAULT_HANDSHAKE_TIMEOUT;
        let tls = crate::tls::accept_before(&self.tls, io, deadline).await?;
        let (_, session) = tls.get_ref();
        let cluster = session
            .server_name()
            .and_then(|n| n.strip_prefix(alpn::KUBE_SNI_PREFIX))
            .unwrap_or_default()
            .to_owned();
        let chain: Vec<_> = session
            .peer_certificates()
            .unwrap_or_default()
            .iter()
            .map(|c| c.clone().into_owned())
            .collect();
        let user = self.verifier.verify_user_x509(&chain, SystemTime::now())?;
        let leaf = chain.first().map(|c| c.to_vec()).unwrap_or_default();
        let upstream = if cluster.is_empty() {
            // `kube_listen_addr` reached without the SNI that names the cluster.
            Err((
                StatusCode::BAD_REQUEST,
                format!(
                    "no Kubernetes cluster named: connect with the TLS server name {}<kube cluster> (tsh kube login writes it as tls-server-name)",
                    alpn::KUBE_SNI_PREFIX
                ),
            ))
        } else {
            self.upstream(&cluster, &leaf, &user, peer, local).await
        };
        let user = Arc::new(user);
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (upstream, user) = (upstream.clone(), user.clone());
            async move {
                let resp = match upstream {
                    Ok(sender) => relay(&sender, &user, req).await,
                    Err((code, message)) => {
                        let reason = match code {
                            StatusCode::FORBIDDEN => "Forbidden",
                            StatusCode::BAD_REQUEST => "BadRequest",
                            _ => "ServiceUnavailable",
                        };
                        status(code, reason, &message)
                    }
                };
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tls), svc)
            .with_upgrades()
            .await?;
        Ok(())
    }

    /// The agent's end for `cluster`: the route the Auth Service grants `user` (RBAC by
    /// `kubernetes_labels`), dialled through the tunnel; or the status to answer with.
    async fn upstream(
        &self,
        cluster: &str,
        leaf: &[u8],
        user: &UserIdentity,
        peer: std::net::SocketAddr,
        local: std::net::SocketAddr,
    ) -> Result<Arc<AgentSender>, (StatusCode, String)> {
        match self.auth.resolve_resource(ServedKind::Kube, cluster, leaf).await {
            Ok(Ok(route)) => {
                let dial = DialRequest {
                    address: cluster.to_owned(),
                    server_id: route.server_id,
                    conn_type: ServedKind::Kube,
                    client_src_addr: peer.to_string(),
                    client_dst_addr: local.to_string(),
                    db_route: None,
                };
                let unreachable = |e: String| {
                    (
                        StatusCode::BAD_GATEWAY,
                        format!("kube_cluster \"{cluster}\": {e}"),
                    )
                };
                let stream = self
                    .dialer
                    .dial(dial)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                tokio::spawn(async move {
                    if let Err(e) = conn.with_upgrades().await {
                        tracing::debug!(error = %e, "kubernetes tunnel stream ended");
                    }
                });
                Ok(Arc::new(tokio::sync::Mutex::new(sender)))
            }
            Ok(Err(denied)) => {
                tracing::info!(%peer, user = %user.username, %cluster, reason = %denied, "kubernetes access refused");
                Err((StatusCode::FORBIDDEN, denied))
            }
            Err(e) => Err((StatusCode::BAD_GATEWAY, format!("asking the Auth Service: {e}"))),
        }
    }
}

/// Sends one client request to the agent with the user's identity as impersonation headers; an
/// upgrade the agent accepts is relayed both ways.
async fn relay(sender: &AgentSender, user: &UserIdentity, mut req: Request<Incoming>) -> Response<Body> {
    let headers = req.headers_mut();
    headers.remove(header::AUTHORIZATION);
    let impersonation: Vec<_> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("impersonate-"))
        .cloned()
        .collect();
    for k in impersonation {
        headers.remove(k);
    }
    let values = std::iter::once(("impersonate-user", &user.username))
        .chain(user.roles.iter().map(|r| ("impersonate-group", r)));
    for (name, value) in values {
        match HeaderValue::from_str(value) {
            Ok(v) => {
                headers.append(name, v);
            }
            Err(_) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("user or role name {value:?} is not a header value"),
                );
            }
        }
    }
    let mut sender = sender.lock().await;
    if let Err(e) = sender.ready().await {
        return status(
            StatusCode::BAD_GATEWAY,
            "ServiceUnavailable",
            &format!("the agent's stream: {e}"),
        );
    }
    let upgrade = client_upgrade(&mut req);
    match sender.send_request(req).await {
        Ok(mut resp) => {
            relay_upgrade(upgrade, &mut resp, "proxy");
            resp.map(BodyExt::boxed_unsync)
        }
        Err(e) => status(
            StatusCode::BAD_GATEWAY,
            "ServiceUnavailable",
            &format!("the agent: {e}"),
        ),
    }
}

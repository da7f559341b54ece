//! The Kubernetes Service on the agent, and the proxy's Kubernetes entry.
//!
//! Proxy ([`KubeProxy`], the SNI route `kube-svc-proxy-alpn.<kube cluster>`): terminates TLS
//! with the user's certificate required, asks the Auth Service for the route to the Kubernetes
//! cluster named by the SNI suffix (RBAC by `kubernetes_labels`), dials the agent through its
//! tunnel (`conn_type` `kube`, `address` the cluster name) and relays HTTP/1.1 requests over
//! that stream, replacing whatever identity the client sent (`Authorization`,
//! `Impersonate-*`) with `Impersonate-User: <user>` and one `Impersonate-Group` per role. A
//! refusal is answered per request with a Kubernetes `Status` (403) naming the cluster.
//!
//! Agent ([`kube_service`]): each dial gets an in-memory stream served by an HTTP/1.1 server
//! that forwards every request to `kubernetes_service.api_url` with the agent's own bearer
//! token (`token_file`, read per request so rotated tokens are picked up) over TLS verified
//! with `ca_file`, keeping the proxy's `Impersonate-*` headers.
//!
//! Limits: HTTP/1.1 only; connection upgrades (`kubectl exec`, `port-forward`) are not relayed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use svc_core::auth::ServedKind;
use svc_core::config::KubeConfig;
use svc_core::identity::{IdentityKind, UserIdentity, Verifier};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tower::BoxError;

use super::{AppTarget, ServiceError, tls_to};
use crate::auth::AuthClient;
use crate::io::{BoxIo, ConnFuture, Connection};
use crate::tls::{ServerIdentity, TlsError};
use crate::tunnel::{ConnType, DialRequest, DialService, TunnelDialer, dial_service_fn};
use crate::{
    io::{ConnService, conn_service},
    route::alpn,
};

type Body = UnsyncBoxBody<Bytes, hyper::Error>;

fn text_body(text: String) -> Body {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A Kubernetes `Status` failure, the shape kubectl prints.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    let mut resp = Response::new(text_body(body.to_string()));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// The in-cluster API server and service-account files, used when `api_url` is not set.
const IN_CLUSTER_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// What the agent forwards to.
struct Upstream {
    cluster: String,
    target: AppTarget,
    token_file: Option<PathBuf>,
    tls: Arc<rustls::ClientConfig>,
}

/// The Kubernetes Service of an agent (see the module docs).
#[derive(Clone)]
pub struct KubeAgent {
    upstream: Arc<Upstream>,
}

impl std::fmt::Debug for KubeAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAgent")
            .field("cluster", &self.upstream.cluster)
            .finish_non_exhaustive()
    }
}

impl KubeAgent {
    /// From `kubernetes_service`: `api_url` (else the in-cluster `KUBERNETES_SERVICE_HOST`),
    /// `ca_file` and `token_file` (else the in-cluster service account's).
    pub fn new(config: &KubeConfig) -> Result<Self, ServiceError> {
        let bad = |what: &str, reason: String| ServiceError::Config {
            what: format!("kubernetes_service.{what}"),
            reason,
        };
        let (url, in_cluster) = match &config.api_url {
            Some(url) => (url.clone(), false),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
                    bad(
                        "api_url",
                        "not set, and KUBERNETES_SERVICE_HOST is not in the environment (not running in a cluster)".into(),
                    )
                })?;
                let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                (format!("https://{host}:{port}"), true)
            }
        };
        let target = AppTarget::parse(&url)?;
        let ca_file = config
            .ca_file
            .clone()
            .or_else(|| in_cluster.then(|| PathBuf::from(IN_CLUSTER_CA)));
        let token_file = config
            .token_file
            .clone()
            .or_else(|| in_cluster.then(|| PathBuf::from(IN_CLUSTER_TOKEN)));
        let pem = ca_file
            .map(|f| std::fs::read(&f).map_err(|e| bad("ca_file", format!("{}: {e}", f.display()))))
            .transpose()?;
        if let Some(f) = &token_file {
            std::fs::metadata(f).map_err(|e| bad("token_file", format!("{}: {e}", f.display())))?;
        }
        let tls = crate::tls::client_config(pem.as_deref()).map_err(|e| bad("ca_file", e.to_string()))?;
        Ok(Self {
            upstream: Arc::new(Upstream {
                cluster: config.kube_cluster_name.clone(),
                target,
                token_file,
                tls,
            }),
        })
    }

    /// Serves one request: the agent's credentials replace any the request carries.
    async fn forward(&self, mut req: Request<Incoming>) -> Response<Body> {
        let up = &self.upstream;
        let fail = |e: String| {
            tracing::info!(cluster = %up.cluster, error = %e, "kubernetes request failed");
            status(
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                &format!("kubernetes cluster \"{}\": {e}", up.cluster),
            )
        };
        let headers = req.headers_mut();
        headers.remove(header::AUTHORIZATION);
        if let Some(file) = &up.token_file {
            match std::fs::read_to_string(file) {
                Ok(token) => match HeaderValue::from_str(&format!("Bearer {}", token.trim())) {
                    Ok(mut v) => {
                        v.set_sensitive(true);
                        headers.insert(header::AUTHORIZATION, v);
                    }
                    Err(_) => return fail(format!("the token in {} is not a header value", file.display())),
                },
                Err(e) => return fail(format!("reading {}: {e}", file.display())),
            }
        }
        let authority = if up.target.host.contains(':') {
            format!("[{}]:{}", up.target.host, up.target.port)
        } else {
            format!("{}:{}", up.target.host, up.target.port)
        };
        match HeaderValue::from_str(&authority) {
            Ok(v) => {
                req.headers_mut().insert(header::HOST, v);
            }
            Err(e) => return fail(e.to_string()),
        }
        let tcp = match TcpStream::connect((up.target.host.as_str(), up.target.port)).await {
            Ok(t) => t,
            Err(e) => return fail(format!("connecting to {authority}: {e}")),
        };
        let io: BoxIo = if up.target.scheme == "https" {
            match tls_to("kube_cluster", &up.cluster, up.tls.clone(), &up.target.host, tcp).await {
                Ok(t) => Box::new(t),
                Err(e) => return fail(e.to_string()),
            }
        } else {
            Box::new(tcp)
        };
        let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(io)).await {
            Ok(x) => x,
            Err(e) => return fail(e.to_string()),
        };
        tokio::spawn(conn);
        match sender.send_request(req).await {
            Ok(resp) => resp.map(BodyExt::boxed_unsync),
            Err(e) => fail(e.to_string()),
        }
    }

    /// The dial service: a dial request naming this cluster gets a stream served as above.
    pub fn dial_service(&self) -> DialService {
        let agent = self.clone();
        dial_service_fn(move |req: DialRequest| {
            let agent = agent.clone();
            async move {
                if req.address != agent.upstream.cluster {
                    return Err(Box::new(ServiceError::NotServed {
                        kind: "kube_cluster",
                        name: req.address,
                    }) as BoxError);
                }
                let (near, far) = tokio::io::duplex(64 * 1024);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |r| {
                        let agent = agent.clone();
                        async move { Ok::<_, std::convert::Infallible>(agent.forward(r).await) }
                    });
                    if let Err(e) = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(near), svc)
                        .await
                    {
                        tracing::debug!(error = %e, "kubernetes tunnel stream ended");
                    }
                });
                Ok::<BoxIo, BoxError>(Box::new(far))
            }
        })
    }
}

/// The Kubernetes Service as a dial service (see [`KubeAgent`]).
pub fn kube_service(config: &KubeConfig) -> Result<DialService, ServiceError> {
    Ok(KubeAgent::new(config)?.dial_service())
}

/// The proxy's Kubernetes entry (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct KubeProxy {
    tls: TlsAcceptor,
    verifier: Arc<Verifier>,
    auth: AuthClient,
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
        auth: AuthClient,
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
            auth,
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
        let mut auth = self.auth.clone();
        let route = auth
            .resolve_resource(ServedKind::Kube, &cluster, Some(&leaf))
            .await;
        let upstream = match route {
            Ok(Ok(route)) => {
                let dial = DialRequest {
                    address: cluster.clone(),
                    server_id: route.server_id,
                    conn_type: ConnType::Kube,
                    client_src_addr: peer.to_string(),
                    client_dst_addr: local.to_string(),
                };
                match self.dialer.dial(dial).await {
                    Ok(stream) => {
                        let (sender, conn) =
                            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                        tokio::spawn(conn);
                        Ok(Arc::new(tokio::sync::Mutex::new(sender)))
                    }
                    Err(e) => Err((
                        StatusCode::BAD_GATEWAY,
                        format!("kube_cluster \"{cluster}\": {e}"),
                    )),
                }
            }
            Ok(Err(denied)) => {
                tracing::info!(%peer, user = %user.username, %cluster, reason = %denied, "kubernetes access refused");
                Err((StatusCode::FORBIDDEN, denied))
            }
            Err(e) => Err((StatusCode::BAD_GATEWAY, format!("asking the Auth Service: {e}"))),
        };
        let user = Arc::new(user);
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (upstream, user) = (upstream.clone(), user.clone());
            async move {
                let resp = match upstream {
                    Ok(sender) => relay(&sender, &user, req).await,
                    Err((code, message)) => {
                        let reason = if code == StatusCode::FORBIDDEN {
                            "Forbidden"
                        } else {
                            "ServiceUnavailable"
                        };
                        status(code, reason, &message)
                    }
                };
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tls), svc)
            .await?;
        Ok(())
    }
}

/// Sends one client request to the agent with the user's identity as impersonation headers.
async fn relay(
    sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    user: &UserIdentity,
    mut req: Request<Incoming>,
) -> Response<Body> {
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
    match sender.send_request(req).await {
        Ok(resp) => resp.map(BodyExt::boxed_unsync),
        Err(e) => status(
            StatusCode::BAD_GATEWAY,
            "ServiceUnavailable",
            &format!("the agent: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_kubernetes_status_objects() {
        let resp = status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "access denied to kube_cluster \"c\"",
        );
        assert_eq!(resp.status(), 403);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn a_cluster_without_api_url_outside_kubernetes_is_a_config_error() {
        let yaml = "version: v1\nkubernetes_service:\n  enabled: true\n";
        let config = svc_core::config::Config::from_yaml_str_with_hostname(yaml, "h").unwrap();
        let err = KubeAgent::new(&config.kube).unwrap_err().to_string();
        assert!(err.starts_with("kubernetes_service.api_url: not set"), "{err}");
    }
}

//! The Kubernetes Service on the agent; the proxy's end is `proxy::kube::KubeProxy`.
//!
//! [`kube_service`]: each dial gets an in-memory stream served by an HTTP/1.1 server
//! that forwards every request to `kubernetes_service.api_url` with the agent's own bearer
//! token (`token_file`, read per request so rotated tokens are picked up) over TLS verified
//! with `ca_file`, keeping the proxy's `Impersonate-*` headers.
//!
//! Connection upgrades (WebSocket for `kubectl exec`, `attach` and `cp`; `SPDY/3.1` for
//! `port-forward` and older clients) go to the API server like any request, and once it
//! answers `101 Switching Protocols` the tunnel stream and the API server's connection are
//! relayed both ways. Responses (`watch`, `logs -f`) are streamed as they arrive.
//!
//! Limits: HTTP/1.1 only.

use std::path::PathBuf;
use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use svc_core::config::KubeConfig;
use tokio::net::TcpStream;
use tower::BoxError;

use super::{AppTarget, ServiceError, tls_to};
use crate::io::BoxIo;
use crate::services::kube::{Body, client_upgrade, relay_upgrade, status};
use crate::tunnel::{DialRequest, DialService, dial_service_fn};

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

    /// Serves one request: the agent's credentials replace any the request carries; an upgrade
    /// the API server accepts is relayed both ways.
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
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "kubernetes API server connection ended");
            }
        });
        let upgrade = client_upgrade(&mut req);
        match sender.send_request(req).await {
            Ok(mut resp) => {
                relay_upgrade(upgrade, &mut resp, "agent");
                resp.map(BodyExt::boxed_unsync)
            }
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
                        .with_upgrades()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_without_api_url_outside_kubernetes_is_a_config_error() {
        let yaml = "version: v1\nkubernetes_service:\n  enabled: true\n";
        let config = svc_core::config::Config::from_yaml_str_with_hostname(yaml, "h").unwrap();
        let err = KubeAgent::new(&config.kube).unwrap_err().to_string();
        assert!(err.starts_with("kubernetes_service.api_url: not set"), "{err}");
    }
}

//! The agent services behind the reverse tunnel — Application, Database, Kubernetes and Windows
//! Desktop.
//!
//! Data flow: a client reaches the proxy's entry for the resource (`proxy::resources`,
//! `proxy::kube`) with the protocol of [`crate::services`]; the proxy dials this agent through
//! its tunnel with a [`DialRequest`] whose `conn_type` is the resource's kind and whose
//! `address` is the resource *name*. Here, [`router`] hands the dial request to the service of
//! that kind ([`app_service`], [`db_service`], [`kube_service`], [`desktop_service`]; `node` to
//! the SSH Service), which looks the name up in its own configuration — never trusting an
//! address from the wire — and returns a stream to the resource.
//!
//! Protocol limits, stated plainly: apps are forwarded as bytes (the agent adds TLS to
//! `https://` apps, nothing is rewritten, so the app sees the client's `Host` header);
//! Postgres gets TLS to the real server done by the agent (the client's startup message is
//! relayed unchanged, so the server's own authentication applies); MongoDB gets TLS to the
//! server; Redis gets TLS to the server and a session held to the authorised database user
//! (`db_redis`); MySQL is plain TCP forwarding to the configured address (its in-protocol TLS
//! upgrade is not performed by the agent); desktops are TCP forwarding to the host's desktop port.

mod db;
mod db_mongo;
mod db_redis;
mod kube;

use std::sync::Arc;

use svc_core::auth::ServedKind;
use svc_core::config::{App, DesktopHost};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tower::BoxError;

use crate::io::BoxIo;
use crate::tunnel::{DialRequest, DialService, dial_service_fn};

pub use db::db_service;
pub use kube::{KubeAgent, kube_service};

/// Why an agent service could not reach a resource. Messages name the resource.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The agent does not serve this name (for this kind).
    #[error("this agent serves no {kind} named \"{name}\"")]
    NotServed {
        /// The kind.
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// The dial request's connection type has no service on this agent.
    #[error("this agent runs no service for {0:?} connections")]
    NoService(ServedKind),
    /// The resource's configuration cannot be used.
    #[error("{what}: {reason}")]
    Config {
        /// The field or resource.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// Connecting to the resource failed.
    #[error("connecting to {kind} \"{name}\" at {addr}: {source}")]
    Connect {
        /// The kind.
        kind: &'static str,
        /// The resource.
        name: String,
        /// Where.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The resource's protocol handshake (TLS, Postgres SSLRequest) failed.
    #[error("{kind} \"{name}\": {reason}")]
    Handshake {
        /// The kind.
        kind: &'static str,
        /// The resource.
        name: String,
        /// What happened.
        reason: String,
    },
}

/// The scheme, host and port of an app's `uri` (`http://h[:p]/…`, `https://…`, `tcp://h:p`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AppTarget {
    /// `http`, `https` or `tcp`.
    pub scheme: String,
    /// The host (brackets removed from IPv6).
    pub host: String,
    /// The port (default 80 / 443).
    pub port: u16,
}

impl AppTarget {
    /// Parses an app URI (validated by the configuration already; still checked here).
    pub(crate) fn parse(uri: &str) -> Result<Self, ServiceError> {
        let bad = |reason: &str| ServiceError::Config {
            what: format!("app uri \"{uri}\""),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://host"))?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
        let default = match scheme {
            "http" => Some(80),
            "https" => Some(443),
            "tcp" => None,
            _ => return Err(bad("expected http, https or tcp")),
        };
        let addr = svc_core::Addr::parse_with_default_port(authority, default.unwrap_or(0))
            .map_err(|e| bad(&e.to_string()))?;
        if addr.port() == 0 {
            return Err(bad("a tcp:// app needs a port"));
        }
        Ok(Self {
            scheme: scheme.to_owned(),
            host: addr
                .host_str()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: addr.port(),
        })
    }
}

async fn connect(kind: &'static str, name: &str, host: &str, port: u16) -> Result<TcpStream, ServiceError> {
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|source| ServiceError::Connect {
            kind,
            name: name.to_owned(),
            addr: format!("{host}:{port}"),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// TLS to a resource named `server_name`, trusting `config`'s roots.
async fn tls_to(
    kind: &'static str,
    name: &str,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ServiceError> {
    let handshake = |reason: String| ServiceError::Handshake {
        kind,
        name: name.to_owned(),
        reason,
    };
    let sni = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| handshake(format!("server name \"{server_name}\": {e}")))?;
    TlsConnector::from(config)
        .connect(sni, tcp)
        .await
        .map_err(|e| handshake(format!("TLS to the server: {e}")))
}

/// The Application Service: a dial request names an app of `apps`; the stream reaches its
/// `uri`'s host and port, with TLS (public web roots) for `https://` apps.
pub fn app_service(apps: &[App]) -> Result<DialService, ServiceError> {
    let mut targets = Vec::with_capacity(apps.len());
    for app in apps {
        targets.push((app.name.clone(), AppTarget::parse(&app.uri)?));
    }
    let targets = Arc::new(targets);
    let tls = crate::tls::client_config(None).map_err(|e| ServiceError::Config {
        what: "TLS client configuration".into(),
        reason: e.to_string(),
    })?;
    Ok(dial_service_fn(move |req: DialRequest| {
        let (targets, tls) = (targets.clone(), tls.clone());
        async move {
            let name = req.address;
            let target = targets
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t.clone())
                .ok_or_else(|| ServiceError::NotServed {
                    kind: "app",
                    name: name.clone(),
                })?;
            let tcp = connect("app", &name, &target.host, target.port).await?;
            let io: BoxIo = if target.scheme == "https" {
                Box::new(tls_to("app", &name, tls, &target.host, tcp).await?)
            } else {
                Box::new(tcp)
            };
            tracing::info!(app = %name, client = %req.client_src_addr, "application connection");
            Ok::<BoxIo, BoxError>(io)
        }
    }))
}

/// The Windows Desktop Service: a dial request names a host of `hosts`; the stream reaches its
/// desktop-protocol address.
pub fn desktop_service(hosts: &[DesktopHost]) -> DialService {
    let hosts: Arc<Vec<(String, String, u16)>> = Arc::new(
        hosts
            .iter()
            .map(|h| {
                let host = h
                    .addr
                    .host_str()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned();
                (h.name.clone(), host, h.addr.port())
            })
            .collect(),
    );
    dial_service_fn(move |req: DialRequest| {
        let hosts = hosts.clone();
        async move {
            let name = req.address;
            let (host, port) = hosts
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|(_, h, p)| (h.clone(), *p))
                .ok_or_else(|| ServiceError::NotServed {
                    kind: "windows_desktop",
                    name: name.clone(),
                })?;
            let tcp = connect("windows_desktop", &name, &host, port).await?;
            tracing::info!(desktop = %name, client = %req.client_src_addr, "desktop connection");
            Ok::<BoxIo, BoxError>(Box::new(tcp))
        }
    })
}

/// The agent's services by connection type; [`router`] dispatches to them.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct AgentServices {
    /// `node`: the SSH Service ([`crate::agent::ssh::SshServer::dial_service`]).
    pub node: Option<DialService>,
    /// `app`.
    pub app: Option<DialService>,
    /// `db`.
    pub db: Option<DialService>,
    /// `kube`.
    pub kube: Option<DialService>,
    /// `windows_desktop`.
    pub windows_desktop: Option<DialService>,
}

impl std::fmt::Debug for AgentServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentServices")
            .field("node", &self.node.is_some())
            .field("app", &self.app.is_some())
            .field("db", &self.db.is_some())
            .field("kube", &self.kube.is_some())
            .field("windows_desktop", &self.windows_desktop.is_some())
            .finish()
    }
}

/// One [`DialService`] for the tunnel agent: each dial request goes to the service of its
/// connection type; a type without a service is refused with a message naming it.
pub fn router(services: AgentServices) -> DialService {
    let services = Arc::new(services);
    dial_service_fn(move |req: DialRequest| {
        let services = services.clone();
        async move {
            use tower::ServiceExt;
            let svc = match req.conn_type {
                ServedKind::Node => services.node.clone(),
                ServedKind::App => services.app.clone(),
                ServedKind::Db => services.db.clone(),
                ServedKind::Kube => services.kube.clone(),
                ServedKind::WindowsDesktop => services.windows_desktop.clone(),
                // A kind this build does not know has no service here.
                _ => None,
            };
            match svc {
                Some(svc) => svc.oneshot(req).await,
                None => Err(Box::new(ServiceError::NoService(req.conn_type)) as BoxError),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    fn req(conn_type: ServedKind, name: &str) -> DialRequest {
        DialRequest {
            address: name.into(),
            server_id: "h.test".into(),
            conn_type,
            client_src_addr: "127.0.0.1:1".into(),
            client_dst_addr: "127.0.0.1:2".into(),
            db_route: None,
        }
    }

    #[test]
    fn app_uris() {
        let t = AppTarget::parse("http://127.0.0.1:8080/x").unwrap();
        assert_eq!(
            (t.scheme.as_str(), t.host.as_str(), t.port),
            ("http", "127.0.0.1", 8080)
        );
        assert_eq!(AppTarget::parse("https://grafana.example.com").unwrap().port, 443);
        assert_eq!(AppTarget::parse("http://[::1]/").unwrap().host, "::1");
        assert!(AppTarget::parse("tcp://db.example.com").is_err());
        assert!(AppTarget::parse("ftp://x").is_err());
    }

    #[tokio::test]
    async fn the_router_dispatches_by_type_and_services_refuse_unknown_names() {
        let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = echo.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let yaml = format!(
            "version: v1\nsvc:\n  proxy_server: 127.0.0.1:3080\nproxy_service:\n  enabled: false\napp_service:\n  enabled: true\n  apps:\n  - name: web\n    uri: http://127.0.0.1:{port}\nwindows_desktop_service:\n  enabled: true\n  hosts:\n  - name: win\n    addr: 127.0.0.1:{port}\n"
        );
        let config = svc_core::config::Config::from_yaml_str_with_hostname(&yaml, "h").unwrap();
        let router = router(AgentServices {
            app: Some(app_service(&config.app.apps).unwrap()),
            windows_desktop: Some(desktop_service(&config.windows_desktop.hosts)),
            ..AgentServices::default()
        });
        for (ty, name) in [(ServedKind::App, "web"), (ServedKind::WindowsDesktop, "win")] {
            let mut io = router.clone().oneshot(req(ty, name)).await.unwrap();
            io.write_all(b"ping").await.unwrap();
            let mut buf = [0u8; 4];
            tokio::time::timeout(std::time::Duration::from_secs(30), io.read_exact(&mut buf))
                .await
                .expect("the echo through the service did not come back within 30 s")
                .unwrap();
            assert_eq!(&buf, b"ping");
        }
        let err = router
            .clone()
            .oneshot(req(ServedKind::App, "win"))
            .await
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "this agent serves no app named \"win\"");
        let err = router
            .clone()
            .oneshot(req(ServedKind::Db, "pg"))
            .await
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "this agent runs no service for Db connections");
    }
}

//! The gRPC server: TLS accept loop, certificate → [`Caller`], one handler per call.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use std::time::{Duration, UNIX_EPOCH};

use rustls::pki_types::CertificateDer;
use svc_core::Secret;
use svc_core::auth::{AuthError, AuthService, Caller, Heartbeat, IssuedCerts, JoinRequest, LoginRequest};
use svc_core::identity::{HostCertRequest, SystemRole};
use svc_core::resource::{JoinRole, Kind, User, parse_resources};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tower::BoxError;

use crate::listen::ListenOptions;
use crate::tls::{HandshakeDeadline, TlsConnection, TlsTerminate};

use super::identity::{ClientIdentity, IdentityFileError, KeyMaterial, trusted_pem};
use super::proto::{self, auth_server::AuthServer};

/// How long a client may take to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the Auth API pings an HTTP/2 connection, and how long the peer has to answer: a
/// dead or silent client is closed after at most twice this long.
pub const GRPC_KEEPALIVE: Duration = Duration::from_secs(30);

/// Why the Auth API could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The TLS configuration could not be built.
    #[error("auth TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The server identity could not be issued.
    #[error("auth server identity: {0}")]
    Identity(#[from] IdentityFileError),
    /// The Auth Service refused to issue it.
    #[error("auth server identity: {0}")]
    Auth(#[from] AuthError),
    /// tonic failed.
    #[error("auth gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The client certificate chain of a connection (empty: no certificate) and its TCP peer.
#[derive(Clone, Debug, Default)]
struct PeerCerts {
    certs: Arc<Vec<CertificateDer<'static>>>,
    addr: Option<SocketAddr>,
}

impl PeerCerts {
    fn of(conn: &TlsConnection) -> Self {
        let tls = conn.io.get_ref().1;
        PeerCerts {
            certs: Arc::new(
                tls.peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default(),
            ),
            addr: Some(conn.peer_addr),
        }
    }
}

/// Issues the Auth Service's own host identity (`auth` role; names: `localhost`, the loopback
/// addresses and `extra_names`) with fresh keys.
pub fn server_identity(
    auth: &AuthService,
    node_name: &str,
    extra_names: &[String],
) -> Result<ClientIdentity, ServeError> {
    let keys = KeyMaterial::generate()?;
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for n in extra_names {
        if !names.contains(n) && n != "0.0.0.0" && n != "::" && !n.is_empty() {
            names.push(n.clone());
        }
    }
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: node_name.to_owned(),
        roles: vec![SystemRole::Auth],
        additional_names: names,
        ttl: svc_core::auth::HOST_CERT_TTL,
    };
    let certs = auth.issue_host_certs(&req, &keys.tls_public_key(), keys.ssh_public_key())?;
    Ok(keys.into_identity(&certs, auth.cluster())?)
}

/// Serves the Auth API on `listener` until `shutdown` is cancelled. `identity` is the server's
/// certificate (see [`server_identity`]); the CA certificate is sent after it so agents can
/// check the CA pin.
pub async fn serve(
    listener: TcpListener,
    auth: Arc<AuthService>,
    identity: ClientIdentity,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    serve_with(listener, auth, identity, ListenOptions::default(), shutdown).await
}

/// Like [`serve`], with the accept loop's limits: at most `options.max_connections` connections
/// at once (the excess is closed at once), accept errors backed off, and the TLS handshake
/// limited to [`HANDSHAKE_TIMEOUT`]. HTTP/2 keepalive ([`GRPC_KEEPALIVE`]) closes dead clients;
/// a connection with no call in flight for
/// [`DEFAULT_GRPC_IDLE_TIMEOUT`](crate::idle::DEFAULT_GRPC_IDLE_TIMEOUT) is closed (GOAWAY).
pub async fn serve_with(
    listener: TcpListener,
    auth: Arc<AuthService>,
    identity: ClientIdentity,
    options: ListenOptions,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    serve_with_idle(
        listener,
        auth,
        identity,
        options,
        crate::idle::DEFAULT_GRPC_IDLE_TIMEOUT,
        shutdown,
    )
    .await
}

/// Like [`serve_with`], closing a connection gracefully (HTTP/2 GOAWAY) once no call has been
/// in flight on it for `idle_timeout` (`auth_service.grpc_idle_timeout`). Clients reconnect on
/// their next call.
pub async fn serve_with_idle(
    listener: TcpListener,
    auth: Arc<AuthService>,
    identity: ClientIdentity,
    options: ListenOptions,
    idle_timeout: Duration,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let (mut chain, key) = identity.tls_parts()?;
    for ca in auth
        .trusted()
        .iter()
        .filter(|ca| ca.kind() == svc_core::identity::IdentityKind::Host)
    {
        chain.push(ca.tls_cert_der().clone());
    }
    let config = super::tls::server_config(auth.verifier(), chain, key)?;
    let grpc = AuthServer::new(AuthGrpc {
        auth,
        shutdown: shutdown.clone(),
    });
    // The one accept loop (caps, backoff), TLS terminated under the handshake deadline; each
    // connection is then served as HTTP/2 with keepalive pings and the idle timeout, every
    // request carrying the connection's certificates and address.
    let per_conn = tower::service_fn(move |conn: TlsConnection| {
        let grpc = grpc.clone();
        async move {
            let peer = PeerCerts::of(&conn);
            let addr = conn.peer_addr;
            let tracker = crate::idle::IdleTracker::new();
            let svc = tower::ServiceBuilder::new()
                .map_request(move |mut req: http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(peer.clone());
                    req
                })
                .service(grpc);
            let c = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(Some(GRPC_KEEPALIVE))
                .keep_alive_timeout(GRPC_KEEPALIVE)
                .serve_connection(hyper_util::rt::TokioIo::new(conn.io), tracker.service(svc));
            tokio::pin!(c);
            if let Err(e) = crate::idle::drive(c, &tracker, idle_timeout, &conn.shutdown, addr).await {
                tracing::debug!(peer = %addr, error = %e, "auth API connection ended");
            }
            Ok::<(), BoxError>(())
        }
    });
    let service = TlsTerminate::new(config, HandshakeDeadline::Timeout(HANDSHAKE_TIMEOUT), per_conn);
    crate::listen::serve(listener, service, options, shutdown).await;
    Ok(())
}

/// The gRPC service over an [`AuthService`].
#[derive(Clone, Debug)]
pub struct AuthGrpc {
    auth: Arc<AuthService>,
    /// Ends open `Watch` streams when the server stops.
    shutdown: CancellationToken,
}

impl AuthGrpc {
    /// Wraps the domain service.
    pub fn new(auth: Arc<AuthService>) -> Self {
        Self {
            auth,
            shutdown: CancellationToken::new(),
        }
    }

    async fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        let peer = req.extensions().get::<PeerCerts>().cloned().unwrap_or_default();
        if peer.certs.is_empty() {
            return Err(Status::unauthenticated(
                "a client certificate signed by the cluster's CA is required",
            ));
        }
        self.auth.authenticate(&peer.certs).await.map_err(status)
    }
}

/// The TCP peer's address of a request (unknown for in-process calls).
fn tcp_peer<T>(req: &Request<T>) -> Option<IpAddr> {
    req.extensions()
        .get::<PeerCerts>()
        .and_then(|p| p.addr)
        .map(|a| a.ip())
}

/// The address a sign-in counts against: the `client_addr` a proxy reports for its user (a
/// proxy's own TCP address is shared by every user behind it), else the TCP peer. Anyone but a
/// proxy gets the TCP peer, whatever it claims: the field must not let a caller spread its
/// failures over made-up addresses or pin them on someone else's.
fn login_source(caller: &Caller, client_addr: &str, tcp: Option<IpAddr>) -> Result<Option<IpAddr>, Status> {
    if client_addr.is_empty() || !caller.is_host_with(SystemRole::Proxy) {
        return Ok(tcp);
    }
    client_addr
        .parse::<IpAddr>()
        .or_else(|_| client_addr.parse::<SocketAddr>().map(|a| a.ip()))
        .map(Some)
        .map_err(|_| {
            Status::invalid_argument(format!(
                "client_addr: expected an IP address or IP:port, found {client_addr:?}"
            ))
        })
}

/// Maps a domain error onto a gRPC status; the message is the error's (never a secret).
fn status(e: AuthError) -> Status {
    let msg = e.to_string();
    match e {
        AuthError::AccessDenied(_) => Status::permission_denied(msg),
        AuthError::NotFound(_) => Status::not_found(msg),
        AuthError::AlreadyExists(_) => Status::already_exists(msg),
        AuthError::Conflict { .. } => Status::aborted(msg),
        AuthError::Invalid(_) | AuthError::Resource(_) => Status::invalid_argument(msg),
        AuthError::BadCredentials | AuthError::Unauthenticated(_) => Status::unauthenticated(msg),
        AuthError::JoinRefused(_)
        | AuthError::Limited { .. }
        | AuthError::NodeNameTaken { .. }
        | AuthError::NameRefused { .. }
        | AuthError::Revoked(_) => Status::permission_denied(msg),
        AuthError::Busy(_) => Status::resource_exhausted(msg),
        _ => {
            tracing::error!(error = %msg, "auth: internal error");
            Status::internal(msg)
        }
    }
}

/// The CAs' TLS PEMs and SSH keys, host CA first.
fn ca_pems(trusted: &[svc_core::identity::TrustedCa]) -> Result<(Vec<String>, Vec<String>), Status> {
    let mut tls_ca_pems = Vec::new();
    let mut ssh_ca_keys = Vec::new();
    for kind in [
        svc_core::identity::IdentityKind::Host,
        svc_core::identity::IdentityKind::User,
    ] {
        for ca in trusted.iter().filter(|ca| ca.kind() == kind) {
            let pem = trusted_pem(ca).map_err(|e| Status::internal(e.to_string()))?;
            tls_ca_pems.push(pem.tls_cert_pem);
            ssh_ca_keys.push(pem.ssh_public_key);
        }
    }
    Ok((tls_ca_pems, ssh_ca_keys))
}

fn unix_secs(t: std::time::SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn certs_to_proto(certs: IssuedCerts, cluster: &str) -> Result<proto::Certs, Status> {
    let internal = |e: String| Status::internal(e);
    let (tls_ca_pems, ssh_ca_keys) = ca_pems(&certs.trusted)?;
    Ok(proto::Certs {
        name: certs.name,
        tls_cert_pem: pem::encode(&pem::Pem::new("CERTIFICATE", certs.tls_cert.to_vec())),
        ssh_cert: certs.ssh_cert.to_openssh().map_err(|e| internal(e.to_string()))?,
        tls_ca_pems,
        ssh_ca_keys,
        cluster_name: cluster.to_owned(),
        not_after_unix: unix_secs(certs.not_after),
    })
}

fn ssh_key(line: &str) -> Result<ssh_key::PublicKey, Status> {
    ssh_key::PublicKey::from_openssh(line)
        .map_err(|e| Status::invalid_argument(format!("ssh_public_key: {e}")))
}

fn kind(name: &str) -> Result<Kind, Status> {
    name.parse::<Kind>()
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The stream of a `Watch` call.
pub(crate) type WatchStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl proto::auth_server::Auth for AuthGrpc {
    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<proto::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let caller = self.caller(&req).await?;
        if !caller.is_host_with(SystemRole::Proxy) {
            return Err(Status::permission_denied(
                "only a Proxy Service may watch the Auth Service's state",
            ));
        }
        let rx = super::watch::start(self.auth.backend().clone(), self.shutdown.clone())
            .await
            .map_err(|e| status(e.into()))?;
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|event| (event, rx)) },
            );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn renew_host_certs(
        &self,
        req: Request<proto::RenewHostCertsRequest>,
    ) -> Result<Response<proto::Certs>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let ttl = (r.ttl_seconds > 0).then(|| Duration::from_secs(r.ttl_seconds));
        let certs = self
            .auth
            .renew_host_certs(&caller, &r.tls_public_key, &ssh_key(&r.ssh_public_key)?, ttl)
            .map_err(status)?;
        tracing::info!(host_id = %certs.name, "auth: host certificates renewed");
        Ok(Response::new(certs_to_proto(certs, self.auth.cluster())?))
    }

    async fn status(&self, req: Request<proto::Empty>) -> Result<Response<proto::StatusResponse>, Status> {
        let caller = self.caller(&req).await?;
        let s = self.auth.status(&caller);
        Ok(Response::new(proto::StatusResponse {
            cluster_name: s.cluster_name,
            version: s.version,
            ca_pin: s.ca_pin,
            user_ca_pin: s.user_ca_pin,
        }))
    }

    async fn join(&self, req: Request<proto::JoinRequest>) -> Result<Response<proto::Certs>, Status> {
        let source = tcp_peer(&req);
        let r = req.into_inner();
        let roles = r
            .roles
            .iter()
            .map(|s| {
                s.parse::<SystemRole>()
                    .map_err(|e| Status::invalid_argument(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let join = JoinRequest {
            token: Secret::new(r.token),
            node_name: r.node_name,
            roles,
            additional_names: r.additional_names,
            tls_public_key: r.tls_public_key,
            ssh_public_key: ssh_key(&r.ssh_public_key)?,
            source,
        };
        let certs = self.auth.join(&join).await.map_err(|e| {
            tracing::info!(node = %join.node_name, source = ?join.source, error = %e, "auth: join refused");
            status(e)
        })?;
        tracing::info!(host_id = %certs.name, node = %join.node_name, "auth: agent joined");
        Ok(Response::new(certs_to_proto(certs, self.auth.cluster())?))
    }

    async fn heartbeat(
        &self,
        req: Request<proto::HeartbeatRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let caller = self.caller(&req).await?;
        let source = tcp_peer(&req);
        let r = req.into_inner();
        let beat = Heartbeat {
            hostname: r.hostname,
            version: r.version,
            upgrader: r.upgrader,
            upgrader_version: r.upgrader_version,
            resources: r
                .resources
                .into_iter()
                .map(super::resources::from_proto)
                .collect::<Result<_, _>>()
                .map_err(status)?,
            source,
            update_status: r.update_status.and_then(super::inventory::status_from_proto),
            next_window: r.next_window.map(super::inventory::window_from_proto),
        };
        self.auth.heartbeat(&caller, beat).await.map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn list_inventory(
        &self,
        req: Request<proto::Empty>,
    ) -> Result<Response<proto::InventoryList>, Status> {
        let caller = self.caller(&req).await?;
        let rows = self.auth.inventory(&caller).await.map_err(status)?;
        Ok(Response::new(proto::InventoryList {
            rows: rows
                .into_iter()
                .map(|r| proto::InventoryRow {
                    server_id: r.server_id,
                    hostname: r.hostname,
                    services: r.services,
                    version: r.version,
                    upgrader: r.upgrader,
                    upgrader_version: r.upgrader_version,
                    last_seen_unix: i64::try_from(r.last_seen).unwrap_or(i64::MAX),
                    update_status: r.update_status.as_ref().map(super::inventory::status_to_proto),
                    next_window: r.next_window.as_ref().map(super::inventory::window_to_proto),
                })
                .collect(),
        }))
    }

    async fn put_resources(
        &self,
        req: Request<proto::PutResourcesRequest>,
    ) -> Result<Response<proto::PutResourcesResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let resources = parse_resources(&r.text).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let written = self
            .auth
            .put_resources(&caller, resources, r.overwrite)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::PutResourcesResponse {
            written: written
                .into_iter()
                .map(|w| proto::Written {
                    kind: w.kind.as_str().to_owned(),
                    display: w.display,
                    updated: w.updated,
                })
                .collect(),
        }))
    }

    async fn get_resources(
        &self,
        req: Request<proto::GetResourcesRequest>,
    ) -> Result<Response<proto::ResourceList>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let kind = kind(&r.kind)?;
        let resources = if r.name.is_empty() {
            self.auth.list_resources(&caller, kind, r.with_secrets).await
        } else {
            self.auth
                .get_resource(&caller, kind, &r.name, r.with_secrets)
                .await
                .map(|r| vec![r])
        }
        .map_err(status)?;
        let resources = resources
            .iter()
            .map(|r| r.to_json().map_err(|e| Status::internal(e.to_string())))
            .collect::<Result<_, _>>()?;
        Ok(Response::new(proto::ResourceList { resources }))
    }

    async fn delete_resource(
        &self,
        req: Request<proto::ResourceRef>,
    ) -> Result<Response<proto::Empty>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        self.auth
            .delete_resource(&caller, kind(&r.kind)?, &r.name)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn create_user(
        &self,
        req: Request<proto::CreateUserRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let mut user = User::new(r.name, r.roles);
        if !r.logins.is_empty() {
            user.spec
                .traits
                .insert(svc_core::resource::LOGINS_TRAIT.to_owned(), r.logins);
        }
        // Validate the name and fields exactly as `tctl create` would.
        let text = svc_core::Resource::User(user.clone())
            .to_json()
            .map_err(|e| Status::internal(e.to_string()))?;
        parse_resources(&text).map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.auth
            .create_user(&caller, user, &Secret::new(r.password))
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn set_user_roles(
        &self,
        req: Request<proto::SetUserRolesRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        self.auth
            .set_user_roles(&caller, &r.name, r.roles)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn create_token(
        &self,
        req: Request<proto::CreateTokenRequest>,
    ) -> Result<Response<proto::CreateTokenResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let roles = r
            .roles
            .iter()
            .map(|s| {
                JoinRole::ALL
                    .into_iter()
                    .find(|j| j.as_str() == s)
                    .ok_or_else(|| {
                        let all: Vec<&str> = JoinRole::ALL.iter().map(|r| r.as_str()).collect();
                        Status::invalid_argument(format!(
                            "unknown token type {s:?}, expected one of: {}",
                            all.join(", ")
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ttl = (r.ttl_seconds > 0).then(|| Duration::from_secs(r.ttl_seconds));
        let token = self
            .auth
            .create_token_with_names(&caller, roles, ttl, r.extra_names)
            .await
            .map_err(status)?;
        let expires = token.metadata.expires.map(|e| e.unix_timestamp()).unwrap_or(0);
        Ok(Response::new(proto::CreateTokenResponse {
            token: token.value().expose().clone(),
            expires_unix: expires,
        }))
    }

    async fn login(&self, req: Request<proto::LoginRequest>) -> Result<Response<proto::Certs>, Status> {
        let caller = self.caller(&req).await?;
        let tcp = tcp_peer(&req);
        let r = req.into_inner();
        let login = LoginRequest {
            source: login_source(&caller, &r.client_addr, tcp)?,
            username: r.username,
            password: Secret::new(r.password),
            tls_public_key: r.tls_public_key,
            ssh_public_key: ssh_key(&r.ssh_public_key)?,
            ttl: (r.ttl_seconds > 0).then(|| Duration::from_secs(r.ttl_seconds)),
        };
        match self.auth.login(&caller, &login).await {
            Ok(certs) => {
                tracing::info!(user = %login.username, "auth: user signed in");
                Ok(Response::new(certs_to_proto(certs, self.auth.cluster())?))
            }
            Err(e) => {
                tracing::info!(user = %login.username, source = ?login.source, error = %e, "auth: sign-in refused");
                Err(status(e))
            }
        }
    }

    async fn resolve_resource(
        &self,
        req: Request<proto::ResolveResourceRequest>,
    ) -> Result<Response<proto::ResolveResourceResponse>, Status> {
        let caller = self.caller(&req).await?;
        let answer = super::resources::resolve(&self.auth, &caller, req.into_inner(), status).await?;
        Ok(Response::new(answer))
    }

    async fn issue_db_cert(
        &self,
        req: Request<proto::DbCertRequest>,
    ) -> Result<Response<proto::DbCertResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let db_req = svc_core::auth::DbCertRequest {
            name: r.name,
            db_user: r.db_user,
            db_name: (!r.db_name.is_empty()).then_some(r.db_name),
            tls_public_key: r.tls_public_key,
            ttl: (r.ttl_seconds > 0).then(|| Duration::from_secs(r.ttl_seconds)),
        };
        let answer = match self.auth.issue_db_cert(&caller, &db_req).await.map_err(status)? {
            Ok(cert) => {
                tracing::info!(user = %cert.name, db = %db_req.name, db_user = %db_req.db_user, "auth: database certificate issued");
                let (tls_ca_pems, ssh_ca_keys) = ca_pems(&cert.trusted)?;
                proto::DbCertResponse {
                    certs: Some(proto::Certs {
                        name: cert.name,
                        tls_cert_pem: pem::encode(&pem::Pem::new("CERTIFICATE", cert.tls_cert.to_vec())),
                        ssh_cert: String::new(),
                        tls_ca_pems,
                        ssh_ca_keys,
                        cluster_name: self.auth.cluster().to_owned(),
                        not_after_unix: unix_secs(cert.not_after),
                    }),
                    denied: String::new(),
                    protocol: cert.route.protocol,
                }
            }
            Err(e) => proto::DbCertResponse {
                certs: None,
                denied: e.to_string(),
                protocol: String::new(),
            },
        };
        Ok(Response::new(answer))
    }

    async fn list_served(
        &self,
        req: Request<proto::ListServedRequest>,
    ) -> Result<Response<proto::ServedList>, Status> {
        let caller = self.caller(&req).await?;
        let list = super::resources::list(&self.auth, &caller, req.into_inner(), status).await?;
        Ok(Response::new(list))
    }

    async fn authorize_node(
        &self,
        req: Request<proto::AuthorizeNodeRequest>,
    ) -> Result<Response<proto::ResolveResourceResponse>, Status> {
        let caller = self.caller(&req).await?;
        let answer = super::resources::authorize_node(&self.auth, &caller, req.into_inner(), status).await?;
        Ok(Response::new(answer))
    }

    async fn upsert_proxy(
        &self,
        req: Request<proto::UpsertProxyRequest>,
    ) -> Result<Response<proto::ProxyInfo>, Status> {
        let caller = self.caller(&req).await?;
        let stored = super::proxies::upsert(&self.auth, &caller, req.into_inner(), status).await?;
        Ok(Response::new(stored))
    }

    async fn delete_proxy(&self, req: Request<proto::Empty>) -> Result<Response<proto::Empty>, Status> {
        let caller = self.caller(&req).await?;
        self.auth.delete_proxy(&caller).await.map_err(status)?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn list_proxies(&self, req: Request<proto::Empty>) -> Result<Response<proto::ProxyList>, Status> {
        let caller = self.caller(&req).await?;
        Ok(Response::new(
            super::proxies::list(&self.auth, &caller, status).await?,
        ))
    }

    async fn sign_app_jwt(
        &self,
        req: Request<proto::SignAppJwtRequest>,
    ) -> Result<Response<proto::SignAppJwtResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let chain = [rustls::pki_types::CertificateDer::from(r.user_cert)];
        let answer = match self
            .auth
            .sign_app_jwt(&caller, &chain, &r.app)
            .await
            .map_err(status)?
        {
            Ok((jwt, expires)) => proto::SignAppJwtResponse {
                jwt,
                expires_unix: u64::try_from(unix_secs(expires)).unwrap_or(0),
                denied: String::new(),
            },
            Err(e) => proto::SignAppJwtResponse {
                jwt: String::new(),
                expires_unix: 0,
                denied: e.to_string(),
            },
        };
        Ok(Response::new(answer))
    }

    async fn get_jwks(&self, req: Request<proto::Empty>) -> Result<Response<proto::JwksResponse>, Status> {
        self.caller(&req).await?;
        let jwks_json =
            serde_json::to_string(&self.auth.jwks()).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(proto::JwksResponse { jwks_json }))
    }
}

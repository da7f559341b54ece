//! The Auth API client: what `tctl`, `tsh` (through the proxy), the proxy and agents call.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use svc_core::auth::{Heartbeat, InventoryRow};
use svc_core::identity::SystemRole;
use svc_core::proxy_env::ProxyEnv;
use svc_core::resource::{Kind, Resource, parse_resource};
use svc_core::{Addr, Secret};
use tonic::transport::{Channel, Endpoint};

use crate::dial::ProxyDialer;

use super::identity::{ClientIdentity, IdentityFileError, KeyMaterial};
use super::proto;
use super::tls::{ServerCheck, client_config};

/// How long connecting (TCP + TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long connecting to one of several Auth Service addresses may take before the next is
/// tried ([`AuthClient::connect_any`], [`join_any`]).
pub const FAILOVER_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `e` says the address could not be reached (so the next address is worth trying),
/// rather than an answer from an Auth Service (a refusal is the same at every address).
/// The HTTP/2 connection under a call ended (a GOAWAY from an Auth Service shutting down, a
/// reset): tonic reports it as `Internal` with an `h2 protocol error` message, not as a
/// refusal the Auth Service made.
fn is_connection_lost(e: &ClientError) -> bool {
    matches!(e, ClientError::Status { code: tonic::Code::Internal, message } if message.starts_with("h2 protocol error"))
}

fn is_unreachable(e: &ClientError) -> bool {
    matches!(e, ClientError::Connect { .. } | ClientError::Unreachable { .. })
        || e.code() == Some(tonic::Code::Unavailable)
}

/// Runs `attempt` on each of `addrs` in turn, each within `deadline`, until one answers: its
/// result (an answer, or a refusal) is returned. When none can be reached, the error names
/// every address tried and why. A single address is simply attempted.
pub(crate) async fn first_reachable<T, F, Fut>(
    addrs: &[String],
    deadline: Duration,
    mut attempt: F,
) -> Result<T, ClientError>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    if let [only] = addrs {
        // One address: nothing to fail over to; its own error, its own deadlines.
        return attempt(only.clone()).await;
    }
    let mut tried = Vec::new();
    for addr in addrs {
        match tokio::time::timeout(deadline, attempt(addr.clone())).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if is_unreachable(&e) => {
                let reason = match e {
                    ClientError::Connect { reason, .. } => reason,
                    other => other.to_string(),
                };
                tracing::warn!(%addr, %reason, "the Auth Service cannot be reached here; trying the next address");
                tried.push((addr.clone(), reason));
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                let reason = format!("no answer within {deadline:?}");
                tracing::warn!(%addr, %reason, "the Auth Service cannot be reached here; trying the next address");
                tried.push((addr.clone(), reason));
            }
        }
    }
    if tried.is_empty() {
        return Err(ClientError::Invalid("no Auth Service address given".into()));
    }
    Err(ClientError::Unreachable { tried })
}

/// Why an Auth API call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The Auth Service could not be reached or its TLS handshake failed.
    #[error("cannot reach the Auth Service at {addr}: {reason}")]
    Connect {
        /// The address dialled.
        addr: String,
        /// Why, with the causes.
        reason: String,
    },
    /// The Auth Service refused or failed the call; the message is the server's.
    #[error("{message}")]
    Status {
        /// The gRPC status code.
        code: tonic::Code,
        /// The server's message.
        message: String,
    },
    /// The local identity is unusable.
    #[error(transparent)]
    Identity(#[from] IdentityFileError),
    /// The server answered something this client cannot use.
    #[error("unexpected answer from the Auth Service: {0}")]
    Invalid(String),
    /// None of several Auth Service addresses could be reached; each is named with its reason,
    /// in the order tried.
    #[error("cannot reach the Auth Service at any of {}: {}", .tried.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>().join(", "), .tried.iter().map(|(a, r)| format!("{a}: {r}")).collect::<Vec<_>>().join("; "))]
    Unreachable {
        /// `(address, why)` per address tried.
        tried: Vec<(String, String)>,
    },
    /// A join without a CA pin and without explicit trust on first use: nothing was sent.
    #[error(
        "refusing to join the cluster at {addr} without a CA pin: expected svc.ca_pin (the CA pin `tctl status` prints), or explicit trust on first use (svc start --insecure)"
    )]
    NoCaPin {
        /// The address the join would have gone to.
        addr: String,
    },
}

impl ClientError {
    /// The gRPC code, when the server answered.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the server answered that the thing asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        let mut message = s.message().to_owned();
        if message.is_empty() {
            message = format!("{:?}", s.code());
        }
        // A transport failure (refused handshake, closed connection) has its cause inside.
        if s.code() == tonic::Code::Unknown || s.code() == tonic::Code::Unavailable {
            let mut source = std::error::Error::source(&s);
            while let Some(e) = source {
                message = format!("{message}: {e}");
                source = e.source();
            }
        }
        ClientError::Status {
            code: s.code(),
            message,
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        // Some errors already print their cause; say each cause once.
        let text = s.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        source = s.source();
    }
    out
}

async fn channel(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    dialer: Option<&ProxyDialer>,
) -> Result<Channel, ClientError> {
    let connect_err = |reason: String| ClientError::Connect {
        addr: addr.to_owned(),
        reason,
    };
    let target = Addr::parse(addr).map_err(|e| connect_err(e.to_string()))?;
    let dialer = match dialer {
        Some(d) => d.clone(),
        // No proxy settings: every dial is direct.
        None => ProxyDialer::builder(ProxyEnv::default())
            .build()
            .map_err(|e| connect_err(e.to_string()))?,
    };
    let connector = tower::service_fn(move |_uri: http::Uri| {
        let target = target.clone();
        let config = config.clone();
        let dialer = dialer.clone();
        async move {
            let dial = || async {
                dialer
                    .dial(&target)
                    .await
                    .map(|s| Box::new(s) as crate::io::BoxIo)
            };
            // The name is not checked (see the verifier); it only fills the SNI field.
            let name = ServerName::try_from("auth.svc")
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            // Through a proxy behind a load balancer that terminates TLS: the connection
            // upgrade (`conn_upgrade`); the load balancer's certificate is checked against the
            // public web roots and `SVC_LB_CA_FILE`.
            let outer = crate::conn_upgrade::OuterTrust::default();
            let tls = crate::conn_upgrade::connect_tls(dial, config, &outer, name, &target.to_string())
                .await
                .map_err(std::io::Error::other)?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    Endpoint::from_static("http://auth.svc")
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector(connector)
        .await
        .map_err(|e| connect_err(chain(&e)))
}

/// A connected Auth API client with an identity.
#[derive(Clone, Debug)]
pub struct AuthClient {
    inner: proto::auth_client::AuthClient<Channel>,
}

impl AuthClient {
    /// Connects to the Auth API at `addr` (`host:port`: the Auth Service itself, or a proxy's
    /// web port in TLS routing mode) presenting `identity`, and checks that
    /// the server holds a host certificate with the `auth` role from the identity's cluster.
    pub async fn connect(addr: &str, identity: &ClientIdentity) -> Result<Self, ClientError> {
        Self::connect_via(addr, identity, None).await
    }

    /// Like [`AuthClient::connect`], dialing through `dialer` (direct or HTTP CONNECT, per its
    /// `HTTPS_PROXY`/`NO_PROXY` settings) when given: what an agent behind a corporate proxy
    /// uses.
    pub async fn connect_via(
        addr: &str,
        identity: &ClientIdentity,
        dialer: Option<&ProxyDialer>,
    ) -> Result<Self, ClientError> {
        let config = client_config(
            Some(&identity.cluster),
            ServerCheck::Cluster(identity.verifier()?),
            Some(identity.tls_parts()?),
        )
        .map_err(|e| ClientError::Connect {
            addr: addr.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            inner: proto::auth_client::AuthClient::new(channel(addr, config, dialer).await?),
        })
    }

    /// Connects to the first of `addrs` that answers, each within
    /// [`FAILOVER_CONNECT_TIMEOUT`] (dialed through `dialer` when given), checks the connection
    /// with a `Status` call, and returns the client with the address it reached. When none
    /// answers, [`ClientError::Unreachable`] names every address tried.
    pub async fn connect_any(
        addrs: &[String],
        identity: &ClientIdentity,
        dialer: Option<&ProxyDialer>,
    ) -> Result<(Self, String), ClientError> {
        first_reachable(addrs, FAILOVER_CONNECT_TIMEOUT, |addr| async move {
            let mut client = Self::connect_via(&addr, identity, dialer).await?;
            client.status().await?;
            Ok((client, addr))
        })
        .await
    }

    /// Watches the keys the Auth Service's access rules read (proxies only): a snapshot, then
    /// every change. See [`crate::proxy::cache`].
    pub async fn watch(&mut self) -> Result<tonic::Streaming<proto::WatchEvent>, ClientError> {
        Ok(self.inner.watch(proto::WatchRequest {}).await?.into_inner())
    }

    /// Renews this host's certificates with fresh keys (valid for `ttl`, or the join
    /// lifetime): the identity returned has the same host ID, cluster and Auth address as
    /// `current`.
    pub async fn renew_host_certs(
        &mut self,
        current: &ClientIdentity,
        ttl: Option<Duration>,
    ) -> Result<ClientIdentity, ClientError> {
        let keys = KeyMaterial::generate()?;
        let certs = self
            .inner
            .renew_host_certs(proto::RenewHostCertsRequest {
                tls_public_key: keys.tls_public_key(),
                ssh_public_key: keys.ssh_public_key_line()?,
                ttl_seconds: ttl.map(|t| t.as_secs()).unwrap_or(0),
            })
            .await?
            .into_inner();
        let mut identity = keys.into_identity_from_proto(certs)?;
        if identity.name != current.name {
            return Err(ClientError::Invalid(format!(
                "renewed certificates name host {}, expected {}",
                identity.name, current.name
            )));
        }
        identity.auth_addr = current.auth_addr.clone();
        Ok(identity)
    }

    /// Connects to the address stored in the identity.
    pub async fn connect_with(identity: &ClientIdentity) -> Result<Self, ClientError> {
        Self::connect(&identity.auth_addr, identity).await
    }

    /// The generated client, for calls without a wrapper here.
    pub fn raw(&mut self) -> &mut proto::auth_client::AuthClient<Channel> {
        &mut self.inner
    }

    /// `tctl status`.
    pub async fn status(&mut self) -> Result<proto::StatusResponse, ClientError> {
        Ok(self.inner.status(proto::Empty {}).await?.into_inner())
    }

    /// A JWT for web app `app` for the user holding `user_cert` (DER), signed by the cluster's
    /// JWT key, with its expiry; or the Auth Service's denial (proxies only).
    pub async fn sign_app_jwt(
        &mut self,
        user_cert: &[u8],
        app: &str,
    ) -> Result<Result<(String, std::time::SystemTime), String>, ClientError> {
        let r = self
            .inner
            .sign_app_jwt(proto::SignAppJwtRequest {
                user_cert: user_cert.to_vec(),
                app: app.to_owned(),
            })
            .await?
            .into_inner();
        if r.jwt.is_empty() {
            if r.denied.is_empty() {
                return Err(ClientError::Invalid("neither a JWT nor a denial".into()));
            }
            return Ok(Err(r.denied));
        }
        let expires = std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.expires_unix);
        Ok(Ok((r.jwt, expires)))
    }

    /// The cluster's JWT public keys (JSON Web Key Set).
    pub async fn jwks(&mut self) -> Result<svc_core::identity::jwt::Jwks, ClientError> {
        let r = self.inner.get_jwks(proto::Empty {}).await?.into_inner();
        serde_json::from_str(&r.jwks_json).map_err(|e| ClientError::Invalid(format!("jwks_json: {e}")))
    }

    /// Reports this agent (identified by its host certificate) to the inventory.
    pub async fn heartbeat(&mut self, beat: &Heartbeat) -> Result<(), ClientError> {
        self.inner
            .heartbeat(proto::HeartbeatRequest {
                hostname: beat.hostname.clone(),
                version: beat.version.clone(),
                upgrader: beat.upgrader.clone(),
                upgrader_version: beat.upgrader_version.clone(),
                resources: super::resources::list_to_proto(&beat.resources),
                update_status: beat.update_status.as_ref().map(super::inventory::status_to_proto),
                next_window: beat.next_window.as_ref().map(super::inventory::window_to_proto),
            })
            .await?;
        Ok(())
    }

    /// The live agents.
    pub async fn inventory(&mut self) -> Result<Vec<InventoryRow>, ClientError> {
        let list = self.inner.list_inventory(proto::Empty {}).await?.into_inner();
        Ok(list
            .rows
            .into_iter()
            .map(|r| InventoryRow {
                server_id: r.server_id,
                hostname: r.hostname,
                services: r.services,
                version: r.version,
                upgrader: r.upgrader,
                upgrader_version: r.upgrader_version,
                last_seen: u64::try_from(r.last_seen_unix).unwrap_or(0),
                update_status: r.update_status.and_then(super::inventory::status_from_proto),
                next_window: r.next_window.map(super::inventory::window_from_proto),
            })
            .collect())
    }

    /// Creates (or with `overwrite`, replaces) the resources in `text` (YAML or JSON, several
    /// documents allowed). The server parses and validates them.
    pub async fn put_resources(
        &mut self,
        text: &str,
        overwrite: bool,
    ) -> Result<Vec<proto::Written>, ClientError> {
        Ok(self
            .inner
            .put_resources(proto::PutResourcesRequest {
                text: text.to_owned(),
                overwrite,
            })
            .await?
            .into_inner()
            .written)
    }

    /// One resource (`name`) or all of a kind (`None`).
    pub async fn get_resources(
        &mut self,
        kind: Kind,
        name: Option<&str>,
        with_secrets: bool,
    ) -> Result<Vec<Resource>, ClientError> {
        let list = self
            .inner
            .get_resources(proto::GetResourcesRequest {
                kind: kind.as_str().to_owned(),
                name: name.unwrap_or_default().to_owned(),
                with_secrets,
            })
            .await?
            .into_inner();
        list.resources
            .iter()
            .map(|text| parse_resource(text).map_err(|e| ClientError::Invalid(e.to_string())))
            .collect()
    }

    /// Deletes `kind/name`.
    pub async fn delete_resource(&mut self, kind: Kind, name: &str) -> Result<(), ClientError> {
        self.inner
            .delete_resource(proto::ResourceRef {
                kind: kind.as_str().to_owned(),
                name: name.to_owned(),
            })
            .await?;
        Ok(())
    }

    /// Creates a local user with a password.
    pub async fn create_user(
        &mut self,
        name: &str,
        roles: &[String],
        logins: &[String],
        password: &Secret,
    ) -> Result<(), ClientError> {
        self.inner
            .create_user(proto::CreateUserRequest {
                name: name.to_owned(),
                roles: roles.to_vec(),
                logins: logins.to_vec(),
                password: password.expose().clone(),
            })
            .await?;
        Ok(())
    }

    /// Replaces a user's roles.
    pub async fn set_user_roles(&mut self, name: &str, roles: &[String]) -> Result<(), ClientError> {
        self.inner
            .set_user_roles(proto::SetUserRolesRequest {
                name: name.to_owned(),
                roles: roles.to_vec(),
            })
            .await?;
        Ok(())
    }

    /// Creates a join token for `roles` (`node`, `app`, `db`, `kube`, `windows_desktop`,
    /// `proxy`); returns its value and expiry (Unix seconds).
    pub async fn create_token(
        &mut self,
        roles: &[String],
        ttl: Option<Duration>,
    ) -> Result<(Secret, i64), ClientError> {
        self.create_token_with_names(roles, ttl, &[]).await
    }

    /// [`create_token`](Self::create_token) granting `extra_names`: the extra certificate names
    /// an agent joining with the token may ask for (exact names, no wildcards, never a name of
    /// the cluster's Proxy or Auth Service).
    pub async fn create_token_with_names(
        &mut self,
        roles: &[String],
        ttl: Option<Duration>,
        extra_names: &[String],
    ) -> Result<(Secret, i64), ClientError> {
        let r = self
            .inner
            .create_token(proto::CreateTokenRequest {
                roles: roles.to_vec(),
                ttl_seconds: ttl.map(|t| t.as_secs()).unwrap_or(0),
                extra_names: extra_names.to_vec(),
            })
            .await?
            .into_inner();
        Ok((Secret::new(r.token), r.expires_unix))
    }

    /// Signs a user in (proxies only): returns the user's identity with `keys`.
    pub async fn login(
        &mut self,
        username: &str,
        password: &Secret,
        keys: KeyMaterial,
        ttl: Option<Duration>,
    ) -> Result<ClientIdentity, ClientError> {
        let certs = self
            .inner
            .login(proto::LoginRequest {
                username: username.to_owned(),
                password: password.expose().clone(),
                tls_public_key: keys.tls_public_key(),
                ssh_public_key: keys.ssh_public_key_line()?,
                ttl_seconds: ttl.map(|t| t.as_secs()).unwrap_or(0),
                // The proxy's own address counts (this client is the proxy itself).
                client_addr: String::new(),
            })
            .await?
            .into_inner();
        Ok(keys.into_identity_from_proto(certs)?)
    }
}

/// An Auth API client over several Auth Service addresses, reconnecting on demand: the first
/// call connects to the first address that answers ([`AuthClient::connect_any`]); after a
/// transport failure ([`reset`](Self::reset)) the next call tries the addresses again. A
/// renewed identity ([`set_identity`](Self::set_identity)) is used from the next connection on.
pub struct FailoverClient {
    addrs: Vec<String>,
    dialer: Option<ProxyDialer>,
    /// `None`: a client connected elsewhere that is kept as it is (it reconnects on its own).
    identity: std::sync::RwLock<Option<ClientIdentity>>,
    current: tokio::sync::Mutex<Option<AuthClient>>,
}

impl std::fmt::Debug for FailoverClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailoverClient")
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl FailoverClient {
    /// A client for the Auth Service at any of `addrs`, presenting `identity`, dialing through
    /// `dialer` when given. Nothing is connected yet.
    pub fn new(addrs: Vec<String>, identity: ClientIdentity, dialer: Option<ProxyDialer>) -> Self {
        Self {
            addrs,
            dialer,
            identity: std::sync::RwLock::new(Some(identity)),
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// Always uses `client`, an already connected client (to `addr`, as named in errors),
    /// which reconnects to that address on its own.
    pub fn with_client(client: AuthClient, addr: String) -> Self {
        Self {
            addrs: vec![addr],
            dialer: None,
            identity: std::sync::RwLock::new(None),
            current: tokio::sync::Mutex::new(Some(client)),
        }
    }

    /// The addresses, in the order tried.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The identity presented on new connections (`None` for [`with_client`](Self::with_client)).
    pub fn identity(&self) -> Option<ClientIdentity> {
        self.identity
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A connected client: the current one, or a new connection to the first address that
    /// answers.
    pub async fn client(&self) -> Result<AuthClient, ClientError> {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_ref() {
            return Ok(c.clone());
        }
        let identity = self
            .identity()
            .ok_or_else(|| ClientError::Invalid("no identity to connect to the Auth Service with".into()))?;
        let (client, addr) = AuthClient::connect_any(&self.addrs, &identity, self.dialer.as_ref()).await?;
        tracing::debug!(%addr, "connected to the Auth Service");
        Ok(current.insert(client).clone())
    }

    /// Forgets the current connection: the next call connects again (after a transport
    /// failure, so another address gets its chance).
    pub async fn reset(&self) {
        if self.identity().is_some() {
            *self.current.lock().await = None;
        }
    }

    /// Uses `identity` (renewed certificates) from the next connection on, and drops the
    /// current one so that the next call presents it.
    pub async fn set_identity(&self, identity: ClientIdentity) {
        *self
            .identity
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(identity);
        self.reset().await;
    }

    /// Whether `e` is a transport failure after which [`reset`](Self::reset) is due.
    pub fn is_transport_failure(e: &ClientError) -> bool {
        is_unreachable(e) || e.code() == Some(tonic::Code::Unknown) || is_connection_lost(e)
    }
}

/// What an agent needs to join.
#[derive(Debug, Clone)]
pub struct JoinParams {
    /// The join token from `tctl tokens add`.
    pub token: Secret,
    /// The CA pin from `tctl status` (`sha256:…`). `None` is refused unless
    /// `trust_on_first_use` says otherwise.
    pub ca_pin: Option<String>,
    /// Without a pin, trust whatever CA the server presents (`svc start --insecure`): a network
    /// attacker could then receive the token and issue the agent's identity. Ignored when
    /// `ca_pin` is set.
    pub trust_on_first_use: bool,
    /// The agent's node name.
    pub node_name: String,
    /// The services the agent runs.
    pub roles: Vec<SystemRole>,
    /// Public addresses to add to the certificates.
    pub additional_names: Vec<String>,
}

/// Joins the cluster at `addr` (the Auth Service, or a proxy's web port in TLS routing mode:
/// the agent does not know the cluster name yet, so it offers the bare `svc-auth@` ALPN): checks the Auth Service's CA against the pin, presents the
/// token, and returns the agent's identity (host ID, certificates, fresh keys, trusted CAs),
/// with `auth_addr` set to `addr`. Save it with [`ClientIdentity::save`].
pub async fn join(addr: &str, params: JoinParams) -> Result<ClientIdentity, ClientError> {
    join_via(addr, params, None).await
}

/// Like [`join_via`] at the first of `addrs` that can be reached (each within
/// [`FAILOVER_CONNECT_TIMEOUT`]); a refusal from a reachable Auth Service is final. When none
/// can be reached, [`ClientError::Unreachable`] names every address tried.
pub async fn join_any(
    addrs: &[String],
    params: JoinParams,
    dialer: Option<&ProxyDialer>,
) -> Result<ClientIdentity, ClientError> {
    first_reachable(addrs, FAILOVER_CONNECT_TIMEOUT, |addr| {
        let params = params.clone();
        async move { join_via(&addr, params, dialer).await }
    })
    .await
}

/// Like [`join`], dialing through `dialer` (direct or HTTP CONNECT) when given.
pub async fn join_via(
    addr: &str,
    params: JoinParams,
    dialer: Option<&ProxyDialer>,
) -> Result<ClientIdentity, ClientError> {
    if params.ca_pin.is_none() && !params.trust_on_first_use {
        return Err(ClientError::NoCaPin {
            addr: addr.to_owned(),
        });
    }
    let config = client_config(Some(""), ServerCheck::Pin(params.ca_pin.clone()), None).map_err(|e| {
        ClientError::Connect {
            addr: addr.to_owned(),
            reason: e.to_string(),
        }
    })?;
    let mut client = proto::auth_client::AuthClient::new(channel(addr, config, dialer).await?);
    let keys = KeyMaterial::generate()?;
    let certs = client
        .join(proto::JoinRequest {
            token: params.token.expose().clone(),
            node_name: params.node_name,
            roles: params.roles.iter().map(|r| r.as_str().to_owned()).collect(),
            additional_names: params.additional_names,
            tls_public_key: keys.tls_public_key(),
            ssh_public_key: keys.ssh_public_key_line()?,
        })
        .await?
        .into_inner();
    let mut identity = keys.into_identity_from_proto(certs)?;
    // The CAs received must be the one the handshake was pinned to.
    if let Some(pin) = &params.ca_pin {
        let host = identity
            .trusted_cas()?
            .into_iter()
            .find(|ca| ca.kind() == svc_core::identity::IdentityKind::Host)
            .ok_or_else(|| ClientError::Invalid("no host CA in the join answer".into()))?;
        let found = host.ca_pin().map_err(|e| ClientError::Invalid(e.to_string()))?;
        if &found != pin {
            return Err(ClientError::Invalid(format!(
                "the host CA pin is {found}, expected {pin}"
            )));
        }
    }
    identity.auth_addr = addr.to_owned();
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_is_a_transport_failure_and_a_refusal_is_not() {
        let lost = ClientError::Status {
            code: tonic::Code::Internal,
            message: "h2 protocol error: http2 error".into(),
        };
        assert!(FailoverClient::is_transport_failure(&lost));
        let refused = ClientError::Status {
            code: tonic::Code::Internal,
            message: "the backend failed".into(),
        };
        assert!(!FailoverClient::is_transport_failure(&refused));
        let denied = ClientError::Status {
            code: tonic::Code::PermissionDenied,
            message: "access denied".into(),
        };
        assert!(!FailoverClient::is_transport_failure(&denied));
    }
}

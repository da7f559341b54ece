//! The Proxy Service node: the listeners of [`crate::proxy`] with everything mounted on them.
//!
//! Order at [`ProxyServer::start`]: a `proxy` host identity issued by the Auth Service → an
//! Auth API client → `/webapi/login` (which calls the Auth API with that identity) → with TLS
//! routing, the Auth API itself under ALPN `svc-auth@<cluster>` → the version server (fetching
//! `forward_url` upstreams through the environment-aware dialer) → the reverse-tunnel server,
//! the SSH entry for clients (`svc-reversetunnel` / `svc-proxy-ssh` on the web port, plain SSH
//! on 3023 and 3024) and the entries for resource clients (`svc-tcp` and the database ALPNs,
//! Postgres by SSLRequest, the Kubernetes SNI route) → bind.
//!
//! In this release the proxy runs in the Auth Service's process ([`RunningAuth`]): it
//! asks that Auth Service where directly joined agents listen.

use std::sync::Arc;

use svc_core::auth::{AuthService, Caller, ServedKind};
use svc_core::config::Config;
use svc_core::identity::SystemRole;
use svc_core::{Addr, SystemClock};

use crate::auth::{AuthClient, ClientIdentity};
use crate::auth::{NodeError, node::RunningAuth};
use crate::proxy::kube::KubeProxy;
use crate::proxy::resources::{ALPNS, ResourceProxy, ResourceProxyConfig};
use crate::proxy::ssh::{ProxySsh, ProxySshConfig};
use crate::proxy::{ProxyBuilder, ProxySettings, RunningProxy};
use crate::route::alpn;
use crate::ssh::AuthNodeAuthorizer;
use crate::tls::{ServerIdentity, TlsSource};
use crate::tunnel::{
    DirectDialer, DirectLookup, DirectTarget, TunnelDialer, TunnelServer, TunnelServerConfig,
};

/// Maps the configuration onto the Proxy Service's listener settings.
/// `tunnel_override` is the tunnel address the ping advertises instead of the configured one
/// (`SVC_TUNNEL_PUBLIC_ADDR`).
pub(crate) fn proxy_settings(config: &Config, tunnel_override: Option<Addr>) -> ProxySettings {
    let p = &config.proxy;
    let mut s = ProxySettings::default();
    s.ping.cluster_name = config.cluster_name().to_owned();
    s.ping.listener_mode = config.listener_mode();
    s.ping.web_listen_addr = p.web_listen_addr.clone();
    s.ping.web_public_addr = p.public_addr.clone();
    s.ping.ssh_listen_addr = p.ssh_listen_addr.clone();
    s.ping.ssh_public_addr = p.ssh_public_addr.clone();
    s.ping.tunnel_listen_addr = p.tunnel_listen_addr.clone();
    s.ping.tunnel_public_addr = p.tunnel_public_addr.clone();
    s.ping.tunnel_public_addr_override = tunnel_override;
    s.peer_listen_addr = Some(p.peer_listen_addr.clone());
    s.ping.kube_enabled = p.kube_listen_addr.is_some() || p.kube_public_addr.is_some();
    s.ping.kube_listen_addr = p.kube_listen_addr.clone();
    s.ping.kube_public_addr = p.kube_public_addr.clone();
    s.ping.db = p.db.clone();
    s.tls = match p.https_keypairs.first() {
        Some(kp) => TlsSource::Files {
            cert: kp.cert_file.clone(),
            key: kp.key_file.clone(),
        },
        None => TlsSource::Generated {
            data_dir: config.svc.data_dir.clone(),
        },
    };
    s.trusted_proxy_networks = p.trusted_proxy_networks().to_vec();
    s.channels = p.channels().clone();
    s.ping.automatic_upgrades = !s.channels.is_empty();
    s.web_idle_timeout = p.web_idle_timeout;
    s.listen = s.listen.clone().with_drain_timeout(p.shutdown_drain_timeout);
    s
}

/// A Proxy Service, configured and not yet started.
#[derive(Debug)]
pub struct ProxyServer {
    settings: ProxySettings,
    node_name: String,
}

impl ProxyServer {
    /// The Proxy Service `config` describes (`proxy_service`, the cluster's listener mode).
    pub fn from_config(config: &Config) -> Self {
        ProxyServer {
            settings: proxy_settings(config, None),
            node_name: config.svc.nodename.clone(),
        }
    }

    /// A Proxy Service with these listener settings.
    pub fn new(settings: ProxySettings, node_name: impl Into<String>) -> Self {
        ProxyServer {
            settings,
            node_name: node_name.into(),
        }
    }

    /// Advertises `addr` as the tunnel address in the ping instead of the configured one.
    pub fn tunnel_public_addr_override(mut self, addr: Option<Addr>) -> Self {
        self.settings.ping.tunnel_public_addr_override = addr;
        self
    }

    /// The listener settings.
    pub fn settings(&self) -> &ProxySettings {
        &self.settings
    }

    /// Starts the proxy against the Auth Service of this process; returns once it listens.
    pub async fn start(self, auth: &RunningAuth) -> Result<RunningProxy, NodeError> {
        let identity = auth.host_identity(&self.node_name, vec![SystemRole::Proxy])?;
        let client = AuthClient::connect(&identity.auth_addr, &identity)
            .await
            .map_err(|source| NodeError::AuthApi {
                addr: identity.auth_addr.clone(),
                source,
            })?;
        // With TLS routing, signed-in clients reach the Auth API through the proxy's web port
        // (ALPN `svc-auth@<cluster>`); otherwise at its public (or local) address.
        let routed = self.settings.ping.listener_mode.tls_routing();
        let public_auth = (!routed).then(|| auth.public_addr());
        let mut builder = ProxyBuilder::new(self.settings).web_mount(
            crate::proxy::web::login::LOGIN_PATH,
            crate::proxy::web::login::login_service(client.clone(), public_auth),
        );
        if routed {
            builder = builder.route_prefix(alpn::AUTH_PREFIX, crate::auth::auth_route(auth.dialable_addr()));
        }
        let builder = install_version_server(builder)?;
        let lookup = AuthDirectLookup {
            caller: auth.service.authenticate(&identity.tls_parts()?.0).await?,
            auth: auth.service.clone(),
        };
        let allow_loopback = auth.service.direct_dial_policy().allow_loopback;
        let (builder, tunnel) = install_ssh(
            builder,
            &identity,
            client.clone(),
            Arc::new(lookup),
            allow_loopback,
        )?;
        let running = builder
            .bind()
            .await
            .map_err(|e| NodeError::setup("the proxy's listeners", e))?;
        let running = crate::proxy::registry::register(running, client, tunnel, &identity, &self.node_name);
        // Agents may never announce the proxy's own listeners for it to dial.
        let addrs = running.addrs();
        auth.service
            .add_service_addrs(std::iter::once(addrs.web).chain(addrs.others.iter().map(|(_, a)| *a)));
        Ok(running)
    }
}

/// Mounts the version server; `forward_url` upstreams are fetched through the
/// environment-aware dialer (HTTPS_PROXY / NO_PROXY).
fn install_version_server(builder: ProxyBuilder) -> Result<ProxyBuilder, NodeError> {
    use crate::proxy::web::version::{Fetcher, VersionResolver, http::VersionHandler};
    let dialer =
        crate::dial::ProxyDialer::from_env().map_err(|e| NodeError::setup("HTTPS_PROXY/NO_PROXY", e))?;
    let tls = crate::tls::client_config(None)?;
    let fetcher = Fetcher::new(dialer, tls, Arc::new(SystemClock));
    let resolver = VersionResolver::new(
        builder.settings().channels.clone(),
        builder.version().clone(),
        fetcher,
    );
    Ok(builder.version_server(VersionHandler::new(resolver)))
}

/// Registers the reverse-tunnel server and the proxy's SSH entry, both presenting the proxy's
/// host certificate (role `proxy`); on the web port they answer ALPN `svc-reversetunnel` and
/// `svc-proxy-ssh` with the same TLS certificate the proxy will load at bind.
fn install_ssh(
    builder: ProxyBuilder,
    identity: &ClientIdentity,
    auth: AuthClient,
    direct: Arc<dyn DirectLookup>,
    allow_loopback: bool,
) -> Result<(ProxyBuilder, TunnelServer), NodeError> {
    let settings = builder.settings();
    let tls = ServerIdentity::load(&settings.tls, &settings.certificate_names())?;
    let key = identity.ssh_private_key()?;
    let cert = identity.ssh_certificate()?;
    let verifier = Arc::new(identity.verifier()?);
    let tunnel = TunnelServer::new(
        TunnelServerConfig::new(
            svc_core::version::current().clone(),
            key.clone(),
            cert.clone(),
            verifier.clone(),
        )
        .with_tls(tls.server_config(&[alpn::REVERSE_TUNNEL])?)
        .with_drain_timeout(settings.listen.drain_timeout),
    );
    // Agents behind a reverse tunnel first; agents that joined the Auth Service directly on
    // the listeners they announced.
    let direct = DirectDialer::new(identity, direct)
        .map_err(|e| NodeError::setup("the direct dialer", e))?
        .with_allow_loopback(allow_loopback);
    let dialer = tunnel.dialer().with_direct(direct);
    let ssh = ProxySsh::new(
        ProxySshConfig::new(
            key,
            cert,
            verifier,
            dialer.clone(),
            // The proxy asks the Auth Service whether the user may reach the node before it dials.
            AuthNodeAuthorizer::with_client(identity.clone(), auth.clone()),
        )
        .with_tls(tls.server_config(&[alpn::PROXY_SSH])?),
    );
    let builder = install_resource_routes(builder, identity, auth, dialer)?;
    let builder = builder
        .tunnel(tunnel.plain_service())
        .route(alpn::REVERSE_TUNNEL, tunnel.tls_service())
        .ssh(ssh.plain_service())
        .route(alpn::PROXY_SSH, ssh.tls_service());
    Ok((builder, tunnel))
}

/// Registers the proxy's entries for resource clients: Kubernetes (SNI `kube-svc-proxy-alpn.`
/// on the web port, `kube_listen_addr` in separate mode), ALPN `svc-tcp` and the database
/// ALPNs on the web port, and Postgres clients detected by their SSLRequest (the multiplexed web port,
/// or `postgres_listen_addr` in separate mode), and the MySQL and MongoDB listeners of separate
/// mode (TLS with the user's certificate, as on the web port). `identity` is the proxy's host identity (its
/// user CA verifies clients); `auth` asks the Auth Service for routes as the proxy.
pub(crate) fn install_resource_routes(
    builder: ProxyBuilder,
    identity: &ClientIdentity,
    auth: AuthClient,
    dialer: TunnelDialer,
) -> Result<ProxyBuilder, NodeError> {
    let settings = builder.settings();
    let tls = ServerIdentity::load(&settings.tls, &settings.certificate_names())?;
    let verifier = Arc::new(identity.verifier()?);
    let kube = KubeProxy::new(&tls, verifier.clone(), auth.clone(), dialer.clone())
        .map_err(|e| NodeError::setup("the Kubernetes route", e))?;
    let config = ResourceProxyConfig::new(
        ResourceProxyConfig::tls_for(&tls, &verifier)
            .map_err(|e| NodeError::setup("the resource routes' TLS", e))?,
        verifier,
        auth,
        dialer,
    );
    let proxy = ResourceProxy::new(config);
    let mut builder = builder
        .postgres(proxy.postgres_service())
        .mysql(proxy.service())
        .mongo(proxy.service())
        .kube(kube.service());
    for alpn in ALPNS {
        builder = builder.route(alpn, proxy.service());
    }
    Ok(builder)
}

/// The proxy's view of directly joined agents: the Auth Service in this process, asked as the
/// proxy (host role `proxy`), names the listener an agent announced in its heartbeats.
struct AuthDirectLookup {
    auth: Arc<AuthService>,
    caller: Caller,
}

impl DirectLookup for AuthDirectLookup {
    fn lookup(
        &self,
        server: String,
        conn_type: ServedKind,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<DirectTarget>, String>> + Send>>
    {
        let (auth, caller) = (self.auth.clone(), self.caller.clone());
        Box::pin(async move {
            let kind = match conn_type {
                ServedKind::Node => ServedKind::Node,
                ServedKind::Kube => ServedKind::Kube,
                ServedKind::WindowsDesktop => ServedKind::WindowsDesktop,
                // Apps and databases are served only through tunnels.
                _ => return Ok(None),
            };
            match auth.direct_route(&caller, &server, kind).await {
                Ok(Some(r)) => Ok(Some(DirectTarget {
                    host_id: r.server_id,
                    addr: r.resource.direct_addr,
                })),
                // An announcement the Auth Service refused: the user learns why.
                Ok(None) => auth.direct_refusal(&caller, &server, kind).map_or(Ok(None), Err),
                Err(e) => {
                    tracing::warn!(%server, error = %e, "looking up a directly joined agent failed");
                    Ok(None)
                }
            }
        })
    }
}

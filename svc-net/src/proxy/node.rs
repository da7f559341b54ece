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
//! Two ways to run: in the Auth Service's process ([`ProxyServer::start`] with the
//! [`RunningAuth`]), deciding with that Auth Service's rules over its backend; or apart from it
//! ([`ProxyServer::start_joined`]): the proxy joins with a `proxy` token (checking the CA pin),
//! keeps its host identity in its data directory and renews it before it expires, reaches the
//! Auth Service at any of `svc.auth_server` (failing over between them), and decides every
//! connection from its watched cache ([`crate::proxy::cache`]) with the same rules. Either way
//! no Auth round trip is made per connection; sign-ins always need the Auth Service.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use svc_core::config::Config;
use svc_core::identity::SystemRole;
use svc_core::{Addr, SystemClock};
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthClient, ClientIdentity, FailoverClient, JoinParams};
use crate::auth::{NodeError, node::RunningAuth};
use crate::proxy::cache::{ProxyCache, ProxyDecisions, RouteResolver};
use crate::proxy::kube::KubeProxy;
use crate::proxy::resources::{ALPNS, ResourceProxy, ResourceProxyConfig};
use crate::proxy::ssh::{ProxySsh, ProxySshConfig};
use crate::proxy::web::app_access::{self, AppAccess, AppAccessConfig};
use crate::proxy::web::session::WebSessions;
use crate::proxy::web::terminal::TerminalService;
use crate::proxy::web::version::VersionResolver;
use crate::proxy::{ProxyBuilder, ProxySettings, RunningProxy};
use crate::route::alpn;
use crate::ssh::Tunables;
use crate::tls::{ServerIdentity, TlsSource};
use crate::tunnel::{DirectDialer, DirectLookup, TunnelDialer, TunnelServer, TunnelServerConfig};

/// The proxy's host identity in its data directory (a proxy running apart from the Auth
/// Service).
pub const PROXY_IDENTITY_FILE: &str = "proxy-identity.json";
/// How long [`ProxyServer::start_joined`] waits for the first snapshot of the Auth Service's
/// state before it gives up.
pub const FIRST_SNAPSHOT_WAIT: Duration = Duration::from_secs(30);
/// How long a sign-in may wait for the Auth Service before the user is told it is unavailable.
pub const SIGN_IN_DEADLINE: Duration = Duration::from_secs(10);

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
    // The Kubernetes route is mounted on the web port in both modes (install_resource_routes).
    s.ping.kube_enabled = true;
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
    s.keep_alive = (config.auth.keep_alive_interval, config.auth.keep_alive_count_max);
    s.listen = s
        .listen
        .clone()
        .with_drain_timeout(p.shutdown_drain_timeout)
        .with_max_connections(p.connection_limits.max_connections);
    s
}

/// A Proxy Service, configured and not yet started.
#[derive(Debug)]
pub struct ProxyServer {
    settings: ProxySettings,
    node_name: String,
    join: Option<JoinSettings>,
    cert_ttl: Option<Duration>,
    insecure: bool,
}

/// What a proxy running apart from the Auth Service joins with (from `svc`).
#[derive(Debug, Clone)]
struct JoinSettings {
    auth_servers: Vec<String>,
    token: Option<svc_core::Secret>,
    ca_pin: Option<String>,
    data_dir: PathBuf,
    allow_loopback: bool,
}

impl ProxyServer {
    /// The Proxy Service `config` describes (`proxy_service`, the cluster's listener mode).
    pub fn from_config(config: &Config) -> Self {
        ProxyServer {
            settings: proxy_settings(config, None),
            node_name: config.svc.nodename.clone(),
            join: Some(JoinSettings {
                auth_servers: config.svc.auth_servers.iter().map(ToString::to_string).collect(),
                token: config.svc.auth_token.clone(),
                ca_pin: config.svc.ca_pins.first().cloned(),
                data_dir: config.svc.data_dir.clone(),
                allow_loopback: config.auth.direct_dial.allow_loopback,
            }),
            cert_ttl: None,
            insecure: false,
        }
    }

    /// Asks for host certificates valid for `ttl` when renewing (default: the Auth Service's
    /// join lifetime); renewal happens when a third of the lifetime is left.
    pub fn host_cert_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.cert_ttl = ttl;
        self
    }

    /// Joins without a CA pin by trusting the first CA seen (`svc start --insecure`).
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.insecure = insecure;
        self
    }

    /// A Proxy Service with these listener settings.
    pub fn new(settings: ProxySettings, node_name: impl Into<String>) -> Self {
        ProxyServer {
            settings,
            node_name: node_name.into(),
            join: None,
            cert_ttl: None,
            insecure: false,
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
        let link = Arc::new(FailoverClient::with_client(
            client.clone(),
            identity.auth_addr.clone(),
        ));
        let mut builder = ProxyBuilder::new(self.settings).web_mount(
            crate::proxy::web::login::LOGIN_PATH,
            crate::proxy::web::login::login_service(client.clone(), public_auth.clone()),
        );
        builder = mount_sso(builder, &link, public_auth);
        if routed {
            builder = builder.route_prefix(alpn::AUTH_PREFIX, crate::auth::auth_route(auth.dialable_addr()));
        }
        let (builder, resolver) = install_version_server(builder)?;
        let caller = auth.service.authenticate(&identity.tls_parts()?.0).await?;
        // Decided in the process with the Auth Service's own rules: no round trip.
        let decisions = ProxyDecisions::in_process(auth.service.clone(), caller);
        // Web sessions sign in like `/webapi/login` and act as the user at this Auth Service.
        let sessions = WebSessions::new(
            link.clone(),
            vec![identity.auth_addr.clone()],
            decisions.clone(),
            None,
        );
        let (builder, terminal) = install_web(builder, &sessions, resolver);
        let allow_loopback = auth.service.direct_dial_policy().allow_loopback;
        // The in-process Auth Service issues this identity at every start: nothing to renew.
        let (builder, tunnel, _keys, apps) = install_ssh(
            builder,
            &identity,
            decisions,
            allow_loopback,
            link.clone(),
            &sessions,
        )?;
        let running = builder
            .bind()
            .await
            .map_err(|e| NodeError::setup("the proxy's listeners", e))?;
        set_app_port(&apps, &running);
        terminal.set_ssh_addr(own_ssh_addr(&running));
        let (running, _) =
            crate::proxy::registry::register(running, link, tunnel, &identity, &self.node_name);
        // Agents may never announce the proxy's own listeners for it to dial.
        let addrs = running.addrs();
        auth.service
            .add_service_addrs(std::iter::once(addrs.web).chain(addrs.others.iter().map(|(_, a)| *a)));
        Ok(running)
    }
}

/// Single sign-on on the web API (console, callbacks) and the connectors in the ping.
fn mount_sso(
    mut builder: ProxyBuilder,
    link: &Arc<FailoverClient>,
    public_auth: Option<String>,
) -> ProxyBuilder {
    use crate::proxy::web::sso;
    // A callback calls the provider several times (discovery, code, keys, userinfo).
    let service = sso::sso_service(link.clone(), public_auth, std::time::Duration::from_secs(40));
    for prefix in sso::sso_mount_prefixes() {
        builder = builder.web_mount(&prefix, service.clone());
    }
    builder.ping_connectors(Arc::new(sso::ConnectorCache::new(
        link.clone(),
        std::time::Duration::from_secs(2),
    )))
}

impl ProxyServer {
    /// Starts the proxy apart from the Auth Service (configured with [`from_config`](Self::from_config)):
    /// its saved host identity or a join with the `proxy` token at the first reachable
    /// `svc.auth_server` (checking `svc.ca_pin`), the watched cache filled (at most
    /// [`FIRST_SNAPSHOT_WAIT`]), renewal of the host identity before it expires; then the
    /// listeners. Every connection is decided from the cache.
    pub async fn start_joined(self) -> Result<RunningProxy, NodeError> {
        let join = self.join.clone().ok_or_else(|| {
            NodeError::Config("a proxy built from listener settings alone cannot join a cluster".into())
        })?;
        if join.auth_servers.is_empty() {
            return Err(NodeError::Config(
                "proxy_service without auth_service needs svc.auth_server: the Auth Service's address(es) to join and reach".into(),
            ));
        }
        let identity = proxy_identity(&join, &self.node_name, self.insecure).await?;
        let mut settings = self.settings;
        // The cluster is the one that signed the identity, whatever this file says.
        settings.ping.cluster_name = identity.cluster.clone();
        let link = Arc::new(FailoverClient::new(
            join.auth_servers.clone(),
            identity.clone(),
            None,
        ));
        let background = CancellationToken::new();
        let cache = ProxyCache::spawn(link.clone(), background.clone());
        if let Err(why) = cache.wait_synced(FIRST_SNAPSHOT_WAIT).await {
            background.cancel();
            return Err(NodeError::Config(format!(
                "the Proxy Service cannot start without the Auth Service's state (at {}): {why}",
                join.auth_servers.join(", ")
            )));
        }
        let decisions = ProxyDecisions::over_cache(&cache, &identity)
            .await
            .map_err(|e| NodeError::setup("the proxy's decisions", e))?;
        let routed = settings.ping.listener_mode.tls_routing();
        let public_auth = (!routed).then(|| join.auth_servers[0].clone());
        let mut builder = ProxyBuilder::new(settings).web_mount(
            crate::proxy::web::login::LOGIN_PATH,
            crate::proxy::web::login::login_service_with(
                link.clone(),
                public_auth.clone(),
                Some(SIGN_IN_DEADLINE),
            ),
        );
        builder = mount_sso(builder, &link, public_auth);
        if routed {
            builder = builder.route_prefix(
                alpn::AUTH_PREFIX,
                crate::auth::auth_route_any(join.auth_servers.clone()),
            );
        }
        let (builder, resolver) = install_version_server(builder)?;
        // Web sessions sign in through whichever Auth Service answers and act as the user
        // there; deletions and locks are seen in the watched cache.
        let sessions = WebSessions::new(
            link.clone(),
            join.auth_servers.clone(),
            decisions.clone(),
            Some(SIGN_IN_DEADLINE),
        );
        let (builder, terminal) = install_web(builder, &sessions, resolver);
        let (builder, tunnel, mut keys, apps) = install_ssh(
            builder,
            &identity,
            decisions,
            join.allow_loopback,
            link.clone(),
            &sessions,
        )?;
        let running = match builder.bind().await {
            Ok(r) => r,
            Err(e) => {
                background.cancel();
                return Err(NodeError::setup("the proxy's listeners", e));
            }
        };
        set_app_port(&apps, &running);
        terminal.set_ssh_addr(own_ssh_addr(&running));
        // Announced in the cluster's proxy registry (through whichever Auth Service answers),
        // so agents keep a tunnel to this proxy too.
        let (mut running, peer) =
            crate::proxy::registry::register(running, link.clone(), tunnel, &identity, &self.node_name);
        keys.peer = peer;
        tokio::spawn(renew(
            link,
            join.data_dir.join(PROXY_IDENTITY_FILE),
            self.cert_ttl,
            background.clone(),
            keys,
        ));
        running.cancel_on_shutdown(background);
        tracing::info!(host_id = %identity.name, auth_servers = %join.auth_servers.join(", "), "the Proxy Service runs apart from the Auth Service");
        Ok(running)
    }
}

/// The proxy's host identity: the one saved in the data directory while it is valid and has
/// the `proxy` role, else a join with the `proxy` token (`svc.auth_token`) at the first
/// reachable Auth Service address, checking the CA pin; saved for the next start.
async fn proxy_identity(
    join: &JoinSettings,
    node_name: &str,
    insecure: bool,
) -> Result<ClientIdentity, NodeError> {
    svc_core::fs::secure_data_dir(&join.data_dir)?;
    let path = join.data_dir.join(PROXY_IDENTITY_FILE);
    if path.exists() {
        let saved = ClientIdentity::load(&path)?;
        if !saved.is_expired(SystemTime::now()) && has_proxy_role(&saved) {
            tracing::info!(host_id = %saved.name, identity = %path.display(), "using the saved proxy identity");
            return Ok(saved);
        }
        tracing::info!(identity = %path.display(), "the saved proxy identity has expired or is not a proxy's; joining again");
    }
    let token = join.token.clone().ok_or_else(|| {
        NodeError::Config(format!(
            "svc.auth_token (a join token with the proxy role) is required to join the cluster at {} (no usable identity in {})",
            join.auth_servers.join(", "),
            path.display()
        ))
    })?;
    let params = JoinParams {
        token,
        ca_pin: join.ca_pin.clone(),
        trust_on_first_use: insecure,
        node_name: node_name.to_owned(),
        roles: vec![SystemRole::Proxy],
        additional_names: Vec::new(),
    };
    let identity = crate::auth::join_any(&join.auth_servers, params, None)
        .await
        .map_err(|source| NodeError::Join {
            target: join.auth_servers.join(", "),
            source,
        })?;
    identity.save(&path)?;
    tracing::info!(host_id = %identity.name, cluster = %identity.cluster, "the proxy joined the cluster");
    Ok(identity)
}

fn has_proxy_role(identity: &ClientIdentity) -> bool {
    let Ok(verifier) = identity.verifier() else {
        return false;
    };
    let Ok((chain, _)) = identity.tls_parts() else {
        return false;
    };
    matches!(
        verifier.verify_any_x509(&chain, SystemTime::now()),
        Ok(svc_core::identity::Identity::Host(h)) if h.has_role(SystemRole::Proxy)
    )
}

/// When the identity's certificates start and end.
fn validity(identity: &ClientIdentity) -> Option<(SystemTime, SystemTime)> {
    let verifier = identity.verifier().ok()?;
    let (chain, _) = identity.tls_parts().ok()?;
    match verifier.verify_any_x509(&chain, SystemTime::now()).ok()? {
        svc_core::identity::Identity::Host(h) => Some((h.validity.not_before, h.validity.not_after)),
        _ => None,
    }
}

/// When to renew: once a third of the certificates' lifetime is left, or at once when they
/// are valid for longer than `ttl` asks.
fn renew_at(identity: &ClientIdentity, ttl: Option<Duration>) -> SystemTime {
    let now = SystemTime::now();
    let Some((from, until)) = validity(identity) else {
        return now;
    };
    // Certificates start CLOCK_SKEW before they were issued.
    let issued = from + svc_core::identity::CLOCK_SKEW;
    let life = until.duration_since(issued).unwrap_or_default();
    if ttl.is_some_and(|ttl| life > ttl + Duration::from_secs(60)) {
        return now;
    }
    until.checked_sub(life / 3).unwrap_or(now)
}

/// Renews the proxy's host identity before it expires, saves it to `path`, hands it to `link`
/// for every new Auth connection and to `keys` for every new agent, client and direct dial. A
/// failed renewal is retried every few seconds (and logged) until the certificates end.
async fn renew(
    link: Arc<FailoverClient>,
    path: PathBuf,
    ttl: Option<Duration>,
    stop: CancellationToken,
    keys: HostKeys,
) {
    let Some(mut identity) = link.identity() else {
        return;
    };
    loop {
        let at = renew_at(&identity, ttl);
        let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
        let renewed = async {
            let mut client = link.client().await?;
            client.renew_host_certs(&identity, ttl).await
        }
        .await;
        match renewed {
            Ok(fresh) => {
                if let Err(e) = fresh.save(&path) {
                    tracing::error!(identity = %path.display(), error = %e, "saving the renewed proxy identity failed");
                }
                tracing::info!(host_id = %fresh.name, not_after = fresh.not_after_unix, "renewed the proxy's host certificates");
                link.set_identity(fresh.clone()).await;
                if let Err(e) = keys.renewed(&fresh) {
                    tracing::error!(error = %e, "presenting the renewed host certificates failed; the previous ones stay in use until they expire");
                }
                identity = fresh;
            }
            Err(e) => {
                tracing::warn!(error = %e, auth_servers = %link.addrs().join(", "), "renewing the proxy's host certificates failed; retrying");
                link.reset().await;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(2)) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

/// Mounts the Web UI's API: the web sessions ([`crate::proxy::web::session`]), the read and
/// write APIs ([`crate::proxy::web::api`]; the channels from `resolver`) and the web terminal
/// ([`crate::proxy::web::terminal`], whose SSH entry is set once the listeners are bound).
fn install_web(
    builder: ProxyBuilder,
    sessions: &WebSessions,
    resolver: VersionResolver,
) -> (ProxyBuilder, TerminalService) {
    use crate::proxy::web::{
        api,
        session::{SESSIONS_PATH, SSO_WEB_PREFIX},
        terminal::TERMINAL_PATH,
    };
    let settings = builder.settings();
    let channel_names = settings.channels.keys().cloned().collect();
    let public_hosts = settings
        .ping
        .web_public_addr
        .iter()
        .map(ToString::to_string)
        .collect();
    let apis = api::ApiService::new(sessions.clone(), Some(resolver), channel_names).service();
    let terminal = TerminalService::new(sessions.clone(), public_hosts);
    let builder = api::PATHS
        .iter()
        .fold(
            builder
                .web_mount(SESSIONS_PATH, sessions.service())
                .web_mount(SSO_WEB_PREFIX, sessions.service()),
            |b, path| b.web_mount(path, apis.clone()),
        )
        .web_mount(TERMINAL_PATH, terminal.service());
    (builder, terminal)
}

/// Where this proxy accepts plain SSH from clients, dialable from this host: the web port
/// (multiplexed) with TLS routing, else the SSH port; an unspecified listen address is
/// reached on loopback.
fn own_ssh_addr(running: &RunningProxy) -> Addr {
    let addrs = running.addrs();
    let mut addr = if running.settings().ping.listener_mode.tls_routing() {
        addrs.web
    } else {
        addrs.get("ssh_listen_addr").unwrap_or(addrs.web)
    };
    if addr.ip().is_unspecified() {
        let loopback: std::net::IpAddr = if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        };
        addr.set_ip(loopback);
    }
    Addr::from(addr)
}

/// Mounts the version server; `forward_url` upstreams are fetched through the
/// environment-aware dialer (HTTPS_PROXY / NO_PROXY).
fn install_version_server(builder: ProxyBuilder) -> Result<(ProxyBuilder, VersionResolver), NodeError> {
    use crate::proxy::web::version::{Fetcher, http::VersionHandler};
    let dialer =
        crate::dial::ProxyDialer::from_env().map_err(|e| NodeError::setup("HTTPS_PROXY/NO_PROXY", e))?;
    let tls = crate::tls::client_config(None)?;
    let fetcher = Fetcher::new(dialer, tls, Arc::new(SystemClock));
    let resolver = VersionResolver::new(
        builder.settings().channels.clone(),
        builder.version().clone(),
        fetcher,
    );
    Ok((
        builder.version_server(VersionHandler::new(resolver.clone())),
        resolver,
    ))
}

/// Registers the reverse-tunnel server and the proxy's SSH entry, both presenting the proxy's
/// host certificate (role `proxy`); on the web port they answer ALPN `svc-reversetunnel` and
/// `svc-proxy-ssh` with the same TLS certificate the proxy will load at bind.
fn install_ssh(
    builder: ProxyBuilder,
    identity: &ClientIdentity,
    decisions: Arc<ProxyDecisions>,
    allow_loopback: bool,
    link: Arc<FailoverClient>,
    sessions: &WebSessions,
) -> Result<(ProxyBuilder, TunnelServer, HostKeys, AppAccess), NodeError> {
    let direct: Arc<dyn DirectLookup> = decisions.clone();
    let settings = builder.settings();
    let tls = ServerIdentity::load(&settings.tls, &settings.certificate_names())?;
    let key = identity.ssh_private_key()?;
    let cert = identity.ssh_certificate()?;
    let verifier = Arc::new(identity.verifier()?);
    let (interval, count) = settings.keep_alive;
    let tunnel = TunnelServer::new(
        TunnelServerConfig::new(
            svc_core::version::current().clone(),
            key.clone(),
            cert.clone(),
            verifier.clone(),
        )
        .with_tls(tls.server_config(&[alpn::REVERSE_TUNNEL])?)
        .with_drain_timeout(settings.listen.drain_timeout)
        .with_tunables(Tunables::default().with_keep_alive_config(interval, count, false)),
    );
    // Agents behind a reverse tunnel first; agents that joined the Auth Service directly on
    // the listeners they announced.
    let direct = DirectDialer::new(identity, direct)
        .map_err(|e| NodeError::setup("the direct dialer", e))?
        .with_allow_loopback(allow_loopback);
    let dialer = tunnel.dialer().with_direct(direct.clone());
    let ssh = ProxySsh::new(
        ProxySshConfig::new(
            key,
            cert,
            verifier,
            dialer.clone(),
            // The proxy decides whether the user may reach the node before it dials, locally
            // with the Auth Service's rules.
            decisions.clone(),
        )
        .with_tls(tls.server_config(&[alpn::PROXY_SSH])?)
        .with_tunables(Tunables::default().with_keep_alive_config(interval, count, true)),
    );
    let builder = install_resource_routes(
        builder,
        identity,
        RouteResolver::Local(decisions.clone()),
        dialer.clone(),
    )?;
    // Browser app access: `<app>.<public host>` on the web port, and the JWT keys.
    let public_host = builder.settings().app_public_host();
    let public_port = builder
        .settings()
        .ping
        .web_public_addr
        .as_ref()
        .map_or(0, |a| a.port());
    let apps = AppAccess::new(AppAccessConfig::new(
        public_host.clone(),
        public_port,
        link,
        RouteResolver::Local(decisions),
        dialer,
    ));
    let builder = builder
        .app_hosts(&public_host, apps.app_service())
        .web_mount(app_access::JWKS_PATH, apps.jwks_service())
        .web_mount(
            app_access::SESSIONS_PATH,
            apps.sessions_service(app_access::signed_in_with(sessions.clone())),
        )
        .tunnel(tunnel.plain_service())
        .route(alpn::REVERSE_TUNNEL, tunnel.tls_service())
        .ssh(ssh.plain_service())
        .route(alpn::PROXY_SSH, ssh.tls_service());
    let keys = HostKeys {
        tunnel: tunnel.clone(),
        ssh,
        direct,
        peer: None,
    };
    Ok((builder, tunnel, keys, apps))
}

/// The web port browsers reach apps on: the public address's, else the bound one.
fn set_app_port(apps: &AppAccess, running: &RunningProxy) {
    if running.settings().ping.web_public_addr.is_none() {
        apps.set_public_port(running.addrs().web.port());
    }
}

/// Where the proxy presents its host certificates, so renewed ones take effect without a
/// restart: to agents (the tunnel server), to SSH clients (the SSH entry), to directly
/// joined agents' listeners (the direct dialer's client certificate) and to peer proxies (the
/// peering server's and dialer's certificate, with `peer_listen_addr`).
struct HostKeys {
    tunnel: TunnelServer,
    ssh: ProxySsh,
    direct: DirectDialer,
    peer: Option<crate::tunnel::PeerKeys>,
}

impl HostKeys {
    /// Presents `identity` from now on (connections already up keep theirs).
    fn renewed(&self, identity: &ClientIdentity) -> Result<(), NodeError> {
        let (key, cert) = (identity.ssh_private_key()?, identity.ssh_certificate()?);
        self.tunnel.set_host_key(key.clone(), cert.clone());
        self.ssh.set_host_key(key, cert);
        let direct = self
            .direct
            .set_identity(identity)
            .map_err(|e| NodeError::setup("the direct dialer", e));
        // Peering is renewed even when the direct dialer refused the identity.
        if let Some(peer) = &self.peer {
            let (chain, key) = identity.tls_parts()?;
            peer.renew(chain, key)
                .map_err(|e| NodeError::setup("proxy peering", e))?;
            tracing::info!(host_id = %identity.name, "proxy peering presents the renewed host certificate");
        }
        direct
    }
}

/// Registers the proxy's entries for resource clients: Kubernetes (SNI `kube-svc-proxy-alpn.`
/// on the web port, `kube_listen_addr` in separate mode), ALPN `svc-tcp` and the database
/// ALPNs on the web port, and Postgres clients detected by their SSLRequest (the multiplexed web port,
/// or `postgres_listen_addr` in separate mode), and the MySQL, MongoDB and Redis listeners of
/// separate mode (TLS with the user's certificate, as on the web port). `identity` is the proxy's host identity (its
/// user CA verifies clients); `auth` decides routes.
pub(crate) fn install_resource_routes(
    builder: ProxyBuilder,
    identity: &ClientIdentity,
    auth: RouteResolver,
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
        .mysql(proxy.mysql_service())
        .mongo(proxy.service())
        .redis(proxy.service())
        .kube(kube.service());
    for alpn in ALPNS {
        builder = builder.route(alpn, proxy.service());
    }
    Ok(builder)
}

//! The Proxy Service assembled: listeners, multiplexer, router and web API per listener mode.
//!
//! Sits on top of the data flow (`listen → route → web/handlers`). [`ProxySettings`] is the
//! runtime form of the `proxy_service` configuration (the config file model maps onto it);
//! [`ProxyBuilder`] takes the handlers later work registers (reverse tunnel, SSH proxy,
//! databases) and binds the listeners; [`RunningProxy`] reports the bound addresses and drains
//! on shutdown.
//!
//! Listener modes:
//! - TLS routing (`multiplex`, the default): one web port. The multiplexer detects TLS, SSH,
//!   PROXY headers, plain HTTP and Postgres; TLS goes to the ALPN router, whose `http/1.1` and
//!   `h2` routes are the web API and whose other routes are whatever was registered. Unknown
//!   ALPN → closed with a log line.
//! - `separate`: web (3080), SSH (3023) and tunnel (3024) listeners, plus the database listeners
//!   that are configured. The web port still routes TLS by ALPN (web API and the registered
//!   routes, so `tsh proxy app|db` works the same), but detects no SSH or Postgres. A listener whose handler has not been registered accepts and closes
//!   each connection with a log line naming the missing handler (docs/ports.md says so).

#[cfg(feature = "services")]
pub mod app_http;
#[cfg(feature = "tunnel")]
pub mod cache;
#[cfg(feature = "services")]
pub mod kube;
#[cfg(feature = "node")]
pub mod node;
#[cfg(feature = "node")]
pub mod registry;
#[cfg(feature = "services")]
pub mod resources;
#[cfg(feature = "tunnel")]
pub mod ssh;
pub mod web;

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc};

use ipnet::IpNet;
use svc_core::{Addr, Version, channel::ChannelSpec};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    io::{ConnFuture, ConnService, Connection, conn_service},
    listen::{self, ListenOptions},
    proxy::web::{WebApi, WebHandler, WebService, ping::PingSettings},
    route::{RouterBuilder, alpn, detect::Multiplexer},
    tls::{ServerIdentity, TlsError, TlsSource},
};

/// The Proxy Service's runtime settings. [`Default`] is a loopback-only proxy in multiplex mode
/// with a generated certificate under `/var/lib/svc`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProxySettings {
    /// What the ping says about this proxy: its cluster, listener mode and addresses, and the
    /// sign-in settings. Every listener address the proxy binds is here.
    pub ping: PingSettings,
    /// Proxy peering listener (3021); served by the peering work, reported here only.
    pub peer_listen_addr: Option<Addr>,
    /// The certificate: configured files or generated in the data directory.
    pub tls: TlsSource,
    /// Networks whose PROXY protocol headers are honoured.
    pub trusted_proxy_networks: Vec<IpNet>,
    /// `automatic_upgrades_channels`, validated.
    pub channels: BTreeMap<String, ChannelSpec>,
    /// Accept loop limits (peek deadline, cap on connections being classified, drain time).
    pub listen: ListenOptions,
    /// How long a web connection (HTTP/1.1 or HTTP/2) may stay open with no request in flight
    /// before it is closed gracefully (`proxy_service.web_idle_timeout`).
    pub web_idle_timeout: std::time::Duration,
    /// `auth_service.keep_alive_interval` and `keep_alive_count_max`: the reverse tunnel server
    /// marks an agent offline and closes its tunnel after `count` silent intervals; SSH
    /// sessions of the proxy's SSH entry get keepalives too
    /// ([`crate::ssh::Tunables::with_keep_alive_config`]).
    pub keep_alive: (std::time::Duration, u32),
}

/// The default data directory.
pub(crate) const DEFAULT_DATA_DIR: &str = "/var/lib/svc";

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            ping: PingSettings::default(),
            peer_listen_addr: None,
            tls: TlsSource::Generated {
                data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            },
            trusted_proxy_networks: Vec::new(),
            channels: BTreeMap::new(),
            listen: ListenOptions::default(),
            web_idle_timeout: crate::idle::DEFAULT_WEB_IDLE_TIMEOUT,
            keep_alive: (
                svc_core::config::DEFAULT_KEEP_ALIVE_INTERVAL,
                svc_core::config::DEFAULT_KEEP_ALIVE_COUNT_MAX,
            ),
        }
    }
}

impl ProxySettings {
    /// Host names and addresses the generated certificate must name (an embedder loading the
    /// same [`ServerIdentity`] before [`ProxyBuilder::bind`] passes these).
    pub fn certificate_names(&self) -> Vec<String> {
        let mut names: Vec<String> = [
            &self.ping.web_public_addr,
            &self.ping.ssh_public_addr,
            &self.ping.tunnel_public_addr,
            &self.ping.kube_public_addr,
        ]
        .into_iter()
        .flatten()
        .chain([&self.ping.web_listen_addr])
        .map(Addr::host_str)
        .collect();
        // Browser apps live at `<app>.<public host>`: the wildcard covers them.
        if let Some(public) = &self.ping.web_public_addr
            && public.host_str().parse::<std::net::IpAddr>().is_err()
            && !public.host_str().starts_with('[')
        {
            names.push(format!("*.{}", public.host_str()));
        }
        names
    }

    /// The host browser apps live under (`<app>.<this>`): the web public address's host, else
    /// the web listen address's (`localhost` when that is unspecified).
    pub fn app_public_host(&self) -> String {
        let host = self
            .ping
            .web_public_addr
            .as_ref()
            .unwrap_or(&self.ping.web_listen_addr)
            .host_str();
        match host.as_str() {
            "0.0.0.0" | "[::]" | "::" => "localhost".to_owned(),
            _ => host.to_ascii_lowercase(),
        }
    }
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The TLS identity.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A listener could not be bound.
    #[error("binding {field} on {addr}: {source}")]
    Bind {
        /// The settings field (`web_listen_addr`, …).
        field: &'static str,
        /// The address.
        addr: Addr,
        /// The cause.
        source: std::io::Error,
    },
}

/// Assembles the proxy: handlers registered by other modules, then [`bind`](ProxyBuilder::bind).
pub struct ProxyBuilder {
    settings: ProxySettings,
    version: Version,
    routes: RouterBuilder,
    web_mounts: Vec<(String, WebService)>,
    #[cfg(feature = "login")]
    ping_connectors: Option<Arc<web::sso::ConnectorCache>>,
    app_hosts: Option<(String, WebService)>,
    ssh: Option<ConnService>,
    tunnel: Option<ConnService>,
    postgres: Option<ConnService>,
    mysql: Option<ConnService>,
    mongo: Option<ConnService>,
    redis: Option<ConnService>,
    kube: Option<ConnService>,
}

impl ProxyBuilder {
    /// Starts from settings; the proxy reports `svc_core::version::current()`.
    pub fn new(settings: ProxySettings) -> Self {
        Self {
            settings,
            version: svc_core::version::current().clone(),
            routes: RouterBuilder::default(),
            web_mounts: Vec::new(),
            #[cfg(feature = "login")]
            ping_connectors: None,
            app_hosts: None,
            ssh: None,
            tunnel: None,
            postgres: None,
            mysql: None,
            mongo: None,
            redis: None,
            kube: None,
        }
    }

    /// The settings (handlers read e.g. `channels` from here).
    pub fn settings(&self) -> &ProxySettings {
        &self.settings
    }

    /// The version the proxy reports.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// Sets the version the proxy reports (tests pin one).
    pub fn with_version(mut self, version: Version) -> Self {
        self.version = version;
        self
    }

    /// Routes a TLS ALPN protocol (`svc-reversetunnel`, `svc-proxy-ssh`, …) on the web port in
    /// TLS routing mode. The service receives the raw TLS stream, ClientHello replayed.
    pub fn route(mut self, protocol: &str, svc: ConnService) -> Self {
        self.routes = self.routes.route(protocol, svc);
        self
    }

    /// Routes ALPN names starting with `prefix` (`svc-auth@`).
    pub fn route_prefix(mut self, prefix: &str, svc: ConnService) -> Self {
        self.routes = self.routes.route_prefix(prefix, svc);
        self
    }

    /// The Kubernetes proxy: SNI `kube-svc-proxy-alpn.*` with TLS routing, and the
    /// `kube_listen_addr` listener in separate mode.
    pub fn kube(mut self, svc: ConnService) -> Self {
        self.routes = self.routes.kube(svc.clone());
        self.kube = Some(svc);
        self
    }

    /// Mounts the version server `handler` on the web API under both of its prefixes
    /// (`/v1/webapi/automaticupgrades/channel/` and the same without `/v1`).
    pub fn version_server(self, handler: web::version::http::VersionHandler) -> Self {
        web::version::http::PREFIXES.iter().fold(self, |b, prefix| {
            b.web_mount(prefix, web::web_service(handler.clone()))
        })
    }

    /// Mounts a version server for [`ProxySettings::channels`] that reaches `forward_url`
    /// upstreams directly, trusting the public web roots, for a proxy at [`Self::version`].
    /// Use [`Self::version_server`] to choose the connector (for example the
    /// environment-aware proxy dialer) or the trusted roots.
    pub fn direct_version_server(self) -> Result<Self, TlsError> {
        use web::version::{Fetcher, VersionResolver, http::VersionHandler};
        let tls = crate::tls::client_config(None)?;
        let resolver = VersionResolver::new(
            self.settings.channels.clone(),
            self.version.clone(),
            Fetcher::direct(tls),
        );
        Ok(self.version_server(VersionHandler::new(resolver)))
    }

    /// Makes the ping's `auth` section name the cluster's sign-in connectors (asked of the Auth
    /// Service through `cache`) and serves `/webapi/ping/<connector>`.
    #[cfg(feature = "login")]
    pub fn ping_connectors(mut self, cache: Arc<web::sso::ConnectorCache>) -> Self {
        self.ping_connectors = Some(cache);
        self
    }

    /// Serves every path starting with `prefix` with `svc` on the web API.
    pub fn web_mount(mut self, prefix: &str, svc: WebService) -> Self {
        self.web_mounts.push((prefix.to_owned(), svc));
        self
    }

    /// Serves every web request whose host is `<label>.<public_host>` with `svc` (browser app
    /// access), whatever its path.
    pub fn app_hosts(mut self, public_host: &str, svc: WebService) -> Self {
        self.app_hosts = Some((public_host.to_owned(), svc));
        self
    }

    /// The SSH handler: plain SSH detected on the multiplexed port, and the SSH listener in
    /// separate mode.
    pub fn ssh(mut self, svc: ConnService) -> Self {
        self.ssh = Some(svc);
        self
    }

    /// The plain-SSH reverse tunnel handler for the tunnel listener (separate mode).
    pub fn tunnel(mut self, svc: ConnService) -> Self {
        self.tunnel = Some(svc);
        self
    }

    /// The Postgres handler: SSLRequest detected on the web port, and the Postgres listener.
    pub fn postgres(mut self, svc: ConnService) -> Self {
        self.postgres = Some(svc);
        self
    }

    /// The MySQL handler for the MySQL listener (separate mode).
    pub fn mysql(mut self, svc: ConnService) -> Self {
        self.mysql = Some(svc);
        self
    }

    /// The MongoDB handler for the MongoDB listener (separate mode).
    pub fn mongo(mut self, svc: ConnService) -> Self {
        self.mongo = Some(svc);
        self
    }

    /// The Redis handler for the Redis listener (separate mode).
    pub fn redis(mut self, svc: ConnService) -> Self {
        self.redis = Some(svc);
        self
    }

    /// Loads the certificate, binds every listener of the mode and starts serving.
    pub async fn bind(self) -> Result<RunningProxy, ProxyError> {
        let identity = ServerIdentity::load(&self.settings.tls, &self.settings.certificate_names())?;
        let mut settings = self.settings;
        let separate = !settings.ping.listener_mode.tls_routing();

        // Bind first, so the ping reports the addresses actually bound (port 0 in tests).
        let web = bind("web_listen_addr", &mut settings.ping.web_listen_addr).await?;
        let mut extra: Vec<(&'static str, TcpListener, Option<ConnService>)> = Vec::new();
        if separate {
            extra.push((
                "ssh_listen_addr",
                bind("ssh_listen_addr", &mut settings.ping.ssh_listen_addr).await?,
                self.ssh.clone(),
            ));
            extra.push((
                "tunnel_listen_addr",
                bind("tunnel_listen_addr", &mut settings.ping.tunnel_listen_addr).await?,
                self.tunnel.clone(),
            ));
            for (field, addr, handler) in [
                (
                    "postgres_listen_addr",
                    &mut settings.ping.db.postgres_listen_addr,
                    self.postgres.clone(),
                ),
                (
                    "mysql_listen_addr",
                    &mut settings.ping.db.mysql_listen_addr,
                    self.mysql.clone(),
                ),
                (
                    "mongo_listen_addr",
                    &mut settings.ping.db.mongo_listen_addr,
                    self.mongo.clone(),
                ),
                (
                    "redis_listen_addr",
                    &mut settings.ping.db.redis_listen_addr,
                    self.redis.clone(),
                ),
                (
                    "kube_listen_addr",
                    &mut settings.ping.kube_listen_addr,
                    self.kube.clone(),
                ),
            ] {
                if let Some(addr) = addr {
                    extra.push((field, bind(field, addr).await?, handler));
                }
            }
        }

        let static_ping = web::ping::PingService::new(&settings.ping, &self.version);
        #[cfg(feature = "login")]
        let ping = match self.ping_connectors.clone() {
            Some(cache) => web::sso::ping_with_connectors(static_ping, cache),
            None => web::web_service(static_ping),
        };
        #[cfg(not(feature = "login"))]
        let ping = web::web_service(static_ping);
        // Upgraded connections (`/webapi/connectionupgrade`, for clients behind load balancers
        // that terminate TLS) go to the router, which holds the web API as a route: the cell is
        // filled once the router is built.
        let shutdown = CancellationToken::new();
        let router_cell = web::upgrade::RouterCell::default();
        let web_local = web.local_addr().map_err(|source| ProxyError::Bind {
            field: "web_listen_addr",
            addr: settings.ping.web_listen_addr.clone(),
            source,
        })?;
        let upgrade = web::web_service(web::upgrade::UpgradeService::new(
            router_cell.clone(),
            web_local,
            settings.listen.peek_timeout,
            shutdown.clone(),
        ));
        let mut api = WebApi::new()
            .mount(crate::conn_upgrade::PATH, upgrade)
            .mount(web::ping::PING_PATH, ping.clone())
            .mount(web::ping::FIND_PATH, ping);
        for (prefix, svc) in self.web_mounts {
            api = api.mount(prefix, svc);
        }
        if let Some((public_host, svc)) = self.app_hosts {
            api = api.app_hosts(public_host, svc);
        }
        let web_handler = conn_service(WebHandler::with_idle_timeout(
            api,
            identity.server_config(&web::WEB_ALPN)?,
            settings.web_idle_timeout,
        ));
        let routes = self
            .routes
            .route(alpn::HTTP1, web_handler.clone())
            .route(alpn::H2, web_handler.clone())
            .route(alpn::PING, web_handler.clone());
        // The web port routes TLS by ALPN in both modes: in separate mode the dedicated ports
        // carry SSH, tunnels and native database clients, and the web port still serves the
        // local proxies (`svc-tcp`, the database ALPNs), which `tsh` reaches there either way.
        let router = conn_service(routes.build());
        let _ = router_cell.set(router.clone());
        let mut mux = Multiplexer::builder()
            .tls(router)
            .trusted_proxies(settings.trusted_proxy_networks.clone());
        if let Some(ssh) = self.ssh.filter(|_| !separate) {
            mux = mux.ssh(ssh);
        }
        if let Some(pg) = self.postgres {
            mux = mux.postgres(pg);
        }

        let mut addrs = BoundAddrs {
            web: web_local,
            others: Vec::new(),
        };
        let opts = settings.listen.clone();
        let mut tasks = vec![tokio::spawn(listen::serve(
            web,
            mux.build(),
            opts.clone(),
            shutdown.clone(),
        ))];
        for (field, listener, handler) in extra {
            if let Ok(a) = listener.local_addr() {
                addrs.others.push((field, a));
            }
            let svc = handler.unwrap_or_else(|| missing_handler(field));
            tasks.push(tokio::spawn(listen::serve(
                listener,
                svc,
                opts.clone(),
                shutdown.clone(),
            )));
        }
        tracing::info!(mode = %settings.ping.listener_mode, web = %addrs.web, others = ?addrs.others, "proxy listening");
        Ok(RunningProxy {
            addrs,
            ca_file: identity.ca_file.clone(),
            settings: Arc::new(settings),
            shutdown,
            tasks,
            #[cfg(feature = "node")]
            registration: None,
        })
    }
}

/// The listen backlog of the proxy's listeners: room for the connections of a reconnect storm
/// that arrive faster than the accept loop takes them (the kernel caps it at
/// `net.core.somaxconn`, 4,096 by default). tokio's default (1,024) overflowed when 10,000 agents
/// came back within a few seconds: the kernel dropped the excess handshakes and the agents
/// waited out TCP's exponential retransmissions (1 s, 3 s, 7 s, 15 s) on top of their backoff.
pub const LISTEN_BACKLOG: u32 = 65_535;

async fn bind(field: &'static str, addr: &mut Addr) -> Result<TcpListener, ProxyError> {
    let err = |source| ProxyError::Bind {
        field,
        addr: addr.clone(),
        source,
    };
    let host = addr
        .host_str()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut last = None;
    let mut bound = None;
    for candidate in tokio::net::lookup_host((host.as_str(), addr.port()))
        .await
        .map_err(err)?
    {
        match listen_on(candidate) {
            Ok(listener) => {
                bound = Some(listener);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let listener = match (bound, last) {
        (Some(listener), _) => listener,
        (None, Some(e)) => return Err(err(e)),
        (None, None) => {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AddrNotAvailable,
                "the host name resolved to no address",
            )));
        }
    };
    if addr.port() == 0
        && let Ok(local) = listener.local_addr()
    {
        *addr = addr.with_port(local.port());
    }
    Ok(listener)
}

/// Binds `addr` and listens with [`LISTEN_BACKLOG`] (address reuse as `TcpListener::bind`).
fn listen_on(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The addresses a running proxy bound.
#[derive(Debug, Clone)]
pub struct BoundAddrs {
    /// The web (in multiplex mode: the only) listener.
    pub web: SocketAddr,
    /// Other listeners (separate mode), by settings field.
    pub others: Vec<(&'static str, SocketAddr)>,
}

impl BoundAddrs {
    /// The bound address of the listener configured by `field` (`ssh_listen_addr`, …).
    pub fn get(&self, field: &str) -> Option<SocketAddr> {
        self.others.iter().find(|(f, _)| *f == field).map(|(_, a)| *a)
    }
}

/// A serving proxy.
pub struct RunningProxy {
    addrs: BoundAddrs,
    ca_file: Option<PathBuf>,
    settings: Arc<ProxySettings>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    #[cfg(feature = "node")]
    registration: Option<registry::Registration>,
}

impl RunningProxy {
    /// Takes part in the cluster's proxy registry; [`RunningProxy::shutdown`] leaves it.
    #[cfg(feature = "node")]
    pub fn with_registration(mut self, registration: registry::Registration) -> Self {
        self.registration = Some(registration);
        self
    }

    /// The bound addresses.
    pub fn addrs(&self) -> &BoundAddrs {
        &self.addrs
    }

    /// The generated CA's PEM file, when the certificate was generated.
    pub fn ca_file(&self) -> Option<&PathBuf> {
        self.ca_file.as_ref()
    }

    /// The settings, with listen addresses as bound.
    pub fn settings(&self) -> &ProxySettings {
        &self.settings
    }

    /// Cancels `token` (the proxy's background work: its cache's watch, renewals) when the
    /// proxy shuts down.
    #[cfg(feature = "node")]
    pub(crate) fn cancel_on_shutdown(&mut self, token: tokio_util::sync::CancellationToken) {
        let own = self.shutdown.clone();
        self.tasks.push(tokio::spawn(async move {
            own.cancelled().await;
            token.cancel();
        }));
    }

    /// Stops accepting and waits for in-flight connections to drain (bounded by
    /// `settings.listen.drain_timeout`).
    pub async fn shutdown(self) {
        // Stop accepting first (agents asked to reconnect must land elsewhere), then leave the
        // registry while the connections drain.
        self.shutdown.cancel();
        #[cfg(feature = "node")]
        if let Some(registration) = self.registration {
            registration.leave().await;
        }
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// The handler of a listener whose protocol is served by work not registered in this build:
/// each connection is closed with a log line naming the listener.
fn missing_handler(field: &'static str) -> ConnService {
    conn_service(tower::service_fn(move |conn: Connection| {
        ConnFuture::new(async move {
            tracing::warn!(peer = %conn.peer_addr, listener = field, "no handler registered for this listener; closing the connection");
            Ok(())
        })
    }))
}

//! `svc start`: the Auth Service and the Proxy Service of one process, from a [`Config`].
//!
//! Order: open the backend → open the Auth Service (CAs created on first start) → serve its
//! gRPC API → write the admin identity for `tctl` on this host → give the in-process proxy a
//! host identity and mount `/webapi/login` (which calls the Auth API with it) and the version
//! server (fetching `forward_url`s through the environment-aware dialer), the reverse-tunnel
//! server, the SSH entry for clients (`svc-reversetunnel` / `svc-proxy-ssh` on the web port,
//! plain SSH on 3023 and 3024) and the entries for resource clients
//! ([`crate::services::install_resource_routes`]: `svc-tcp` and the database ALPNs, Postgres by
//! SSLRequest, the Kubernetes SNI route) → bind the proxy → when any agent service is enabled
//! (`ssh_service` by default; apps, databases, Kubernetes, desktops), run an agent in the same
//! process: a host identity with those roles issued in-process, the services behind a reverse
//! tunnel to the local proxy's web address (through `HTTPS_PROXY`/`NO_PROXY` like any agent),
//! heartbeats announcing what it serves, and — only when `/etc/svc-upgrade.d` exists — the
//! maintenance-schedule export for `svc-upgrade` ([`crate::agent`], the runtime every agent
//! shares). With `auth_service` and `proxy_service` disabled, the process is a standalone agent
//! instead ([`crate::agent::start_standalone`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use svc_core::auth::{AuthService, Caller, ServedKind};
use svc_core::backend::{Backend, EmbeddedBackend};
use svc_core::config::Config;
use svc_core::identity::{HostCertRequest, SystemRole};
use svc_core::{Addr, SystemClock};
use svc_net::auth::{AuthClient, ClientIdentity, KeyMaterial};
use svc_net::proxy::{ProxyBuilder, ProxySettings, RunningProxy};
use svc_net::route::alpn;
use svc_net::ssh::{AuthNodeAuthorizer, ProxySsh, ProxySshConfig};
use svc_net::tls::{ServerIdentity, TlsSource};
use svc_net::tunnel::{ConnType, DirectDialer, DirectLookup, DirectTarget, TunnelServer, TunnelServerConfig};

pub use crate::agent::Node;
use tokio_util::sync::CancellationToken;

/// The admin identity file in the data directory: `tctl` on the Auth host uses it.
pub const ADMIN_IDENTITY_FILE: &str = "admin-identity.json";
/// The embedded backend's file in the data directory.
pub const BACKEND_FILE: &str = "backend.redb";

/// The admin identity path for a data directory.
pub fn admin_identity_path(data_dir: &Path) -> PathBuf {
    data_dir.join(ADMIN_IDENTITY_FILE)
}

/// Maps the configuration onto the Proxy Service's settings.
pub fn proxy_settings(config: &Config, tunnel_override: Option<Addr>) -> ProxySettings {
    let p = &config.proxy;
    let mut s = ProxySettings::default();
    s.cluster_name = config.cluster_name().to_owned();
    s.listener_mode = config.listener_mode();
    s.web_listen_addr = p.web_listen_addr.clone();
    s.web_public_addr = p.public_addr.clone();
    s.ssh_listen_addr = p.ssh_listen_addr.clone();
    s.ssh_public_addr = p.ssh_public_addr.clone();
    s.tunnel_listen_addr = p.tunnel_listen_addr.clone();
    s.tunnel_public_addr = p.tunnel_public_addr.clone();
    s.tunnel_public_addr_override = tunnel_override;
    s.peer_listen_addr = Some(p.peer_listen_addr.clone());
    s.kube_enabled = p.kube_listen_addr.is_some() || p.kube_public_addr.is_some();
    s.kube_listen_addr = p.kube_listen_addr.clone();
    s.kube_public_addr = p.kube_public_addr.clone();
    s.postgres_listen_addr = p.db.postgres_listen_addr.clone();
    s.postgres_public_addr = p.db.postgres_public_addr.clone();
    s.mysql_listen_addr = p.db.mysql_listen_addr.clone();
    s.mysql_public_addr = p.db.mysql_public_addr.clone();
    s.mongo_listen_addr = p.db.mongo_listen_addr.clone();
    s.mongo_public_addr = p.db.mongo_public_addr.clone();
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
    s.automatic_upgrades = !s.channels.is_empty();
    s
}

/// How `svc start` was asked to run, beyond the configuration file.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct StartOptions {
    /// `SVC_TUNNEL_PUBLIC_ADDR`: the tunnel address the ping advertises.
    pub tunnel_override: Option<Addr>,
    /// `--insecure`: a standalone agent accepts any TLS certificate from the proxy.
    pub insecure: bool,
}

/// A running `svc` process: the cluster's services, an agent, or both.
pub struct Running {
    /// The Auth API address, when the Auth Service runs here.
    pub auth_addr: Option<SocketAddr>,
    /// The running proxy, if enabled.
    pub proxy: Option<RunningProxy>,
    /// The admin identity file written for `tctl`, when the Auth Service runs here.
    pub admin_identity: Option<PathBuf>,
    /// The cluster name.
    pub cluster: String,
    /// The host CA pin, when the Auth Service runs here.
    pub ca_pin: Option<String>,
    /// The agent: the local SSH agent of an all-in-one process, or a standalone agent.
    pub node: Option<Node>,
    shutdown: CancellationToken,
    auth_task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops the proxy (draining) and the Auth API.
    pub async fn shutdown(self) {
        if let Some(node) = self.node {
            node.shutdown().await;
        }
        if let Some(proxy) = self.proxy {
            proxy.shutdown().await;
        }
        self.shutdown.cancel();
        if let Some(task) = self.auth_task {
            let _ = task.await;
        }
    }
}

/// Where clients on this host reach a listener bound to `bound`.
fn dialable(bound: SocketAddr) -> SocketAddr {
    if bound.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), bound.port())
    } else {
        bound
    }
}

fn host_identity(
    auth: &AuthService,
    node: &str,
    roles: Vec<SystemRole>,
    auth_addr: SocketAddr,
) -> anyhow::Result<ClientIdentity> {
    let keys = KeyMaterial::generate()?;
    let req = HostCertRequest {
        host_uuid: uuid::Uuid::new_v4(),
        node_name: node.to_owned(),
        roles,
        additional_names: Vec::new(),
        ttl: svc_core::auth::HOST_CERT_TTL,
    };
    let certs = auth.issue_host_certs(&req, &keys.tls_public_key(), keys.ssh_public_key())?;
    let mut identity = keys.into_identity(&certs, auth.cluster())?;
    identity.auth_addr = dialable(auth_addr).to_string();
    Ok(identity)
}

/// Starts what `config` enables and returns once it listens: Auth and Proxy (with the local
/// SSH agent), or — with both disabled — a standalone agent joining the cluster at
/// `svc.proxy_server`.
pub async fn start(config: &Config, opts: &StartOptions) -> anyhow::Result<Running> {
    if !config.auth.enabled {
        if config.proxy.enabled {
            bail!(
                "proxy_service.enabled is true but auth_service.enabled is false: in this release the \
                 Proxy Service runs in the Auth Service's process; disable proxy_service to run an agent"
            );
        }
        let node = crate::agent::start_standalone(config, opts.insecure).await?;
        let cluster = node
            .host_id
            .split_once('.')
            .map(|(_, c)| c.to_owned())
            .unwrap_or_default();
        return Ok(Running {
            auth_addr: None,
            proxy: None,
            admin_identity: None,
            cluster,
            ca_pin: None,
            node: Some(node),
            shutdown: CancellationToken::new(),
            auth_task: None,
        });
    }
    let tunnel_override = opts.tunnel_override.clone();
    let data_dir = &config.svc.data_dir;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let backend: Arc<dyn Backend> = Arc::new(
        EmbeddedBackend::open(data_dir.join(BACKEND_FILE))
            .with_context(|| format!("opening the backend in {}", data_dir.display()))?,
    );
    let mut auth = AuthService::open(backend, config.cluster_name(), Arc::new(SystemClock)).await?;
    auth.set_host_name_policy(host_name_policy(config));
    let auth = Arc::new(auth);

    let listen = config.auth.listen_addr.to_string();
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("auth_service.listen_addr {listen}"))?;
    let auth_addr = listener.local_addr()?;
    let mut names: Vec<String> = config.auth.public_addrs.iter().map(|a| a.host_str()).collect();
    names.push(config.auth.listen_addr.host_str());
    let server_identity = svc_net::auth::server_identity(&auth, &config.svc.nodename, &names)?;
    let shutdown = CancellationToken::new();
    let serve_auth = auth.clone();
    let serve_shutdown = shutdown.clone();
    let auth_task = tokio::spawn(async move {
        if let Err(e) = svc_net::auth::serve(listener, serve_auth, server_identity, serve_shutdown).await {
            tracing::error!(error = %e, "auth API stopped");
        }
    });

    let admin = host_identity(&auth, &config.svc.nodename, vec![SystemRole::Auth], auth_addr)?;
    let admin_identity = admin_identity_path(data_dir);
    admin.save(&admin_identity)?;

    let proxy = if config.proxy.enabled {
        let identity = host_identity(&auth, &config.svc.nodename, vec![SystemRole::Proxy], auth_addr)?;
        let client = AuthClient::connect(&identity.auth_addr, &identity).await?;
        let settings = proxy_settings(config, tunnel_override);
        // With TLS routing, signed-in clients reach the Auth API through the proxy's web port
        // (ALPN `svc-auth@<cluster>`); otherwise at its public (or local) address.
        let routed = settings.listener_mode.tls_routing();
        let public_auth = (!routed).then(|| {
            config
                .auth
                .public_addrs
                .first()
                .map(|a| a.to_string())
                .unwrap_or_else(|| dialable(auth_addr).to_string())
        });
        let mut builder = ProxyBuilder::new(settings).web_mount(
            svc_net::web::login::LOGIN_PATH,
            svc_net::web::login::login_service(client.clone(), public_auth),
        );
        if routed {
            builder = builder.route_prefix(
                svc_net::route::alpn::AUTH_PREFIX,
                svc_net::auth::auth_route(dialable(auth_addr)),
            );
        }
        let builder = install_version_server(builder)?;
        let lookup = AuthDirectLookup {
            caller: auth.authenticate(&identity.tls_parts()?.0).await?,
            auth: auth.clone(),
        };
        let builder = install_ssh(builder, &identity, client, Arc::new(lookup))?;
        Some(builder.bind().await?)
    } else {
        None
    };
    let node = match &proxy {
        Some(proxy) if !crate::services::agent_roles(config).is_empty() => {
            Some(start_local_node(config, &auth, auth_addr, proxy).await?)
        }
        _ => None,
    };
    Ok(Running {
        auth_addr: Some(auth_addr),
        proxy,
        admin_identity: Some(admin_identity),
        cluster: auth.cluster().to_owned(),
        ca_pin: Some(auth.ca_pin()),
        node,
        shutdown,
        auth_task: Some(auth_task),
    })
}

/// What joining agents may not name in their certificates: every name of this process's
/// Proxy and Auth Service (public addresses, the cluster name); no extra names are granted.
fn host_name_policy(config: &Config) -> svc_core::auth::HostNamePolicy {
    let p = &config.proxy;
    let mut reserved: Vec<String> = p
        .public_addr
        .iter()
        .chain(p.ssh_public_addr.iter())
        .chain(p.tunnel_public_addr.iter())
        .chain(p.kube_public_addr.iter())
        .chain(config.auth.public_addrs.iter())
        .map(|a| a.host_str())
        .collect();
    reserved.push(config.cluster_name().to_owned());
    reserved.retain(|n| !n.is_empty());
    svc_core::auth::HostNamePolicy {
        reserved,
        allowed: Vec::new(),
    }
}

/// Registers the reverse-tunnel server and the proxy's SSH entry, both presenting the proxy's
/// host certificate (role `proxy`); on the web port they answer ALPN `svc-reversetunnel` and
/// `svc-proxy-ssh` with the same TLS certificate the proxy will load at bind.
fn install_ssh(
    builder: ProxyBuilder,
    identity: &ClientIdentity,
    auth: AuthClient,
    direct: Arc<dyn DirectLookup>,
) -> anyhow::Result<ProxyBuilder> {
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
        .with_tls(tls.server_config(&[alpn::REVERSE_TUNNEL])?),
    );
    // Agents behind a reverse tunnel first; agents that joined the Auth Service directly on
    // the listeners they announced.
    let dialer = tunnel.dialer().with_direct(DirectDialer::new(identity, direct)?);
    let ssh = ProxySsh::new(
        ProxySshConfig::new(
            key,
            cert,
            verifier,
            dialer.clone(),
            AuthNodeAuthorizer::with_client(identity.clone(), auth.clone()),
        )
        .with_tls(tls.server_config(&[alpn::PROXY_SSH])?),
    );
    let builder = crate::services::install_resource_routes(builder, identity, auth, dialer)?;
    Ok(builder
        .tunnel(tunnel.plain_service())
        .route(alpn::REVERSE_TUNNEL, tunnel.tls_service())
        .ssh(ssh.plain_service())
        .route(alpn::PROXY_SSH, ssh.tls_service()))
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
        conn_type: ConnType,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<DirectTarget>> + Send>> {
        let (auth, caller) = (self.auth.clone(), self.caller.clone());
        Box::pin(async move {
            let kind = match conn_type {
                ConnType::Node => ServedKind::Node,
                ConnType::Kube => ServedKind::Kube,
                ConnType::WindowsDesktop => ServedKind::WindowsDesktop,
                // Apps and databases are served only through tunnels.
                _ => return None,
            };
            match auth.direct_route(&caller, &server, kind).await {
                Ok(route) => route.map(|r| DirectTarget {
                    host_id: r.server_id,
                    addr: r.resource.direct_addr,
                }),
                Err(e) => {
                    tracing::warn!(%server, error = %e, "looking up a directly joined agent failed");
                    None
                }
            }
        })
    }
}

/// Starts this process's SSH agent against the local proxy: a `node` host identity issued
/// in-process, the shared agent runtime ([`crate::agent::start_node`]).
async fn start_local_node(
    config: &Config,
    auth: &AuthService,
    auth_addr: SocketAddr,
    proxy: &RunningProxy,
) -> anyhow::Result<Node> {
    let name = config.svc.nodename.clone();
    // A new host ID every start: take the name over from the previous run at once.
    auth.release_node_name(&name).await?;
    let identity = host_identity(auth, &name, crate::services::agent_roles(config), auth_addr)?;
    let proxy_ca_pem = match proxy.ca_file() {
        Some(ca) => Some(std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?),
        None => None,
    };
    crate::agent::start_node(
        crate::agent::NodeOptions {
            name,
            identity,
            proxy_addr: Addr::from(dialable(proxy.addrs().web)),
            proxy_ca_pem,
            insecure: false,
            dialer: svc_net::dial::ProxyDialer::from_env()?,
            upgrade_dir: crate::agent::upgrade_dir(),
            // The updater asks this cluster's own proxy, never a global server (REFERENCE.md,
            // "Schedule export").
            endpoint: crate::agent::version_endpoint(config.proxy.web_public_addr()),
            diag_addr: config.svc.diag_addr.clone(),
        },
        config,
    )
    .await
}

/// Mounts the version server; `forward_url` upstreams are fetched through the
/// environment-aware dialer (HTTPS_PROXY / NO_PROXY).
fn install_version_server(builder: ProxyBuilder) -> anyhow::Result<ProxyBuilder> {
    use svc_update::channel::{Fetcher, VersionResolver, http::VersionHandler};
    let dialer = svc_net::dial::ProxyDialer::from_env()?;
    let tls = svc_net::tls::client_config(None)?;
    let fetcher = Fetcher::new(dialer, tls, Arc::new(SystemClock));
    let resolver = VersionResolver::new(
        builder.settings().channels.clone(),
        builder.version().clone(),
        fetcher,
    );
    Ok(VersionHandler::new(resolver).install(builder))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_maps_onto_the_proxy_settings() {
        let yaml = "version: v1\nsvc:\n  data_dir: /srv/svc\nauth_service:\n  cluster_name: example.com\n  proxy_listener_mode: separate\nproxy_service:\n  public_addr: proxy.example.com:443\n  web_listen_addr: 0.0.0.0:3080\n  tunnel_listen_addr: 0.0.0.0:3024\n  tunnel_public_addr: tunnel.example.com:3024\n  listen_addr: 0.0.0.0:3023\n  ssh_public_addr: ssh.example.com:3023\n  kube_listen_addr: 0.0.0.0:3026\n  postgres_listen_addr: 0.0.0.0:5432\n  mysql_listen_addr: 0.0.0.0:3036\n  automatic_upgrades_channels:\n    stable/cloud:\n      static_version: v17.0.1\n";
        let config = Config::from_yaml_str_with_hostname(yaml, "h").unwrap();
        let s = proxy_settings(
            &config,
            Some(Addr::parse_with_default_port("override:443", 3024).unwrap()),
        );
        assert_eq!(s.cluster_name, "example.com");
        assert!(!s.listener_mode.tls_routing());
        assert_eq!(s.web_listen_addr.to_string(), "0.0.0.0:3080");
        assert_eq!(
            s.web_public_addr.as_ref().map(ToString::to_string).as_deref(),
            Some("proxy.example.com:443")
        );
        assert_eq!(
            s.ssh_public_addr.as_ref().map(ToString::to_string).as_deref(),
            Some("ssh.example.com:3023")
        );
        assert_eq!(
            s.tunnel_public_addr.as_ref().map(ToString::to_string).as_deref(),
            Some("tunnel.example.com:3024")
        );
        assert_eq!(
            s.tunnel_public_addr_override
                .as_ref()
                .map(ToString::to_string)
                .as_deref(),
            Some("override:443")
        );
        assert!(s.kube_enabled);
        assert!(s.postgres_listen_addr.is_some() && s.mysql_listen_addr.is_some());
        assert!(s.channels.contains_key("stable/cloud"));
        assert!(s.automatic_upgrades);
        assert_eq!(
            s.tls,
            TlsSource::Generated {
                data_dir: PathBuf::from("/srv/svc")
            }
        );
    }

    #[test]
    fn svc_configure_prints_the_all_in_one_default() {
        let text = svc_core::config::render_default_commented();
        let parsed = Config::from_yaml_str_with_hostname(&text, "h").unwrap();
        assert_eq!(parsed, Config::all_in_one_default_with_hostname("h"));
    }
}

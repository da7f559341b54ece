//! The validated runtime configuration: every default applied, every value typed.
//!
//! Nothing here is optional that has a default; an `Option` means "not configured, feature
//! off" (a separate-port database listener, a Kubernetes public address).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use ipnet::IpNet;

use super::ListenerMode;
use crate::{Addr, Host, Secret, channel::ChannelSpec};

/// Default ports, one per use (specification §4.5).
pub mod ports {
    /// Proxy Service web listener (HTTPS, and every protocol with TLS routing).
    pub const PROXY_WEB: u16 = 3080;
    /// Proxy Service reverse-tunnel listener.
    pub const PROXY_TUNNEL: u16 = 3024;
    /// Proxy Service SSH listener.
    pub const PROXY_SSH: u16 = 3023;
    /// Proxy peering.
    pub const PROXY_PEER: u16 = 3021;
    /// Auth Service API.
    pub const AUTH: u16 = 3025;
    /// SSH Service listener.
    pub const SSH: u16 = 3022;
    /// Kubernetes listener (Proxy Service and Kubernetes Service).
    pub const KUBE: u16 = 3026;
    /// Windows Desktop Service listener.
    pub const WINDOWS_DESKTOP: u16 = 3028;
    /// A Windows host's desktop protocol port.
    pub const RDP: u16 = 3389;
    /// Postgres.
    pub const POSTGRES: u16 = 5432;
    /// MySQL.
    pub const MYSQL: u16 = 3036;
    /// MongoDB.
    pub const MONGO: u16 = 27017;
    /// Redis.
    pub const REDIS: u16 = 6379;
    /// Diagnostics (metrics and health) listener.
    pub const DIAG: u16 = 3000;
    /// The port assumed in an application's `public_addr` (served by the proxy's web port).
    pub const HTTPS: u16 = 443;
}

/// A validated `svc.yaml`. Build it with [`Config::from_yaml_str`](super::Config::from_yaml_str),
/// [`Config::load`](super::Config::load) or
/// [`Config::all_in_one_default`](super::Config::all_in_one_default).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `svc`: settings shared by every role of this process.
    pub svc: SvcConfig,
    /// `auth_service`.
    pub auth: AuthConfig,
    /// `proxy_service`.
    pub proxy: ProxyConfig,
    /// `ssh_service`.
    pub ssh: SshConfig,
    /// `app_service`.
    pub app: AppConfig,
    /// `db_service`.
    pub db: DbConfig,
    /// `kubernetes_service`.
    pub kube: KubeConfig,
    /// `windows_desktop_service`.
    pub windows_desktop: WindowsDesktopConfig,
}

/// `svc`: identity, storage, joining and logging of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SvcConfig {
    /// This node's name (default: the host name).
    pub nodename: String,
    /// Where state is kept (default `/var/lib/svc`).
    pub data_dir: PathBuf,
    /// The join token, when this process joins a cluster run elsewhere.
    pub auth_token: Option<Secret>,
    /// The Proxy Service agents dial (reverse tunnels). When neither `proxy_server` nor
    /// `auth_server` is set: this process's own web listener (an unspecified host dialled as
    /// loopback), so `127.0.0.1:3080` by default. `None` when only `auth_server` is set (the
    /// agent joins the Auth Service directly, specification §1 rule 2).
    pub proxy_server: Option<Addr>,
    /// Auth Service addresses to join directly; may be empty.
    pub auth_servers: Vec<Addr>,
    /// Logging.
    pub log: LogConfig,
    /// The metrics and health listener, off when `None`.
    pub diag_addr: Option<Addr>,
    /// Pins of the cluster's CA (`sha256:<64 hex digits>`, lower case), checked when joining.
    pub ca_pins: Vec<String>,
}

/// `svc.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogConfig {
    /// Where log lines go.
    pub output: LogOutput,
    /// The lowest severity written.
    pub severity: LogSeverity,
    /// Line format.
    pub format: LogFormat,
}

/// `svc.log.output`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogOutput {
    /// Standard error (the default).
    #[default]
    Stderr,
    /// Standard output.
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

/// `svc.log.severity`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum LogSeverity {
    /// Everything.
    Debug,
    /// Normal operation (the default).
    #[default]
    Info,
    /// Problems that do not stop the service.
    Warn,
    /// Failures only.
    Error,
}

/// `svc.log.format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `auth_service`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuthConfig {
    /// Whether this process runs the Auth Service (default `true`).
    pub enabled: bool,
    /// Where the Auth Service API listens (default `127.0.0.1:3025`).
    pub listen_addr: Addr,
    /// Addresses the Auth Service is reachable at (extra certificate principals); may be empty.
    pub public_addrs: Vec<Addr>,
    /// The cluster name (default `svc.local`).
    pub cluster_name: String,
    /// How the Proxy Service lays out its listeners (default multiplex).
    pub proxy_listener_mode: ListenerMode,
    /// Reverse tunnel keep-alive interval (default 5 minutes).
    pub keep_alive_interval: Duration,
    /// Missed keep-alives after which an agent is marked offline (default 3).
    pub keep_alive_count_max: u32,
    /// How long an Auth API (gRPC) connection may stay open with no call in flight before it is
    /// closed gracefully (default 10 minutes).
    pub grpc_idle_timeout: Duration,
    /// Sign-in and join abuse limits (`auth_service.authentication`).
    pub authentication: AuthenticationConfig,
    /// What directly joined agents may announce (`auth_service.direct_dial`).
    pub direct_dial: DirectDialConfig,
    /// Where the cluster's state lives (`auth_service.storage`; default the embedded store).
    pub storage: StorageConfig,
    /// How agents spread their reverse tunnels over the proxies (`auth_service.tunnel_strategy`;
    /// default every agent to every proxy).
    pub tunnel_strategy: TunnelStrategy,
    /// Limits of the Auth API listener (`auth_service.connection_limits`).
    pub connection_limits: ConnectionLimits,
}

/// `auth_service.connection_limits` / `proxy_service.connection_limits`: how many connections
/// each of the service's listeners serves at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionLimits {
    /// `max_connections`: open connections per listener, classified or not (default 16,384); a
    /// connection accepted beyond it is closed at once, the established ones unaffected.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// The default of [`ConnectionLimits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

/// `auth_service.tunnel_strategy`: how many proxies each agent keeps a reverse tunnel to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TunnelStrategy {
    /// `type: agent_mesh` (the default): every agent keeps a tunnel to every proxy.
    #[default]
    AgentMesh,
    /// `type: proxy_peering`: every agent keeps tunnels to `agent_connection_count` proxies
    /// chosen by the proxies; a proxy reaches an agent it holds no tunnel to through a peer
    /// proxy that does (`proxy_service.peer_listen_addr`).
    ProxyPeering {
        /// Tunnels per agent (at least 1; default 1).
        agent_connection_count: usize,
    },
}

impl TunnelStrategy {
    /// How many proxies an agent keeps a tunnel to: `None` for all of them (agent mesh).
    pub fn agent_connection_count(&self) -> Option<usize> {
        match self {
            TunnelStrategy::AgentMesh => None,
            TunnelStrategy::ProxyPeering {
                agent_connection_count,
            } => Some(*agent_connection_count),
        }
    }
}

/// `auth_service.storage`: where the Auth Service keeps the cluster's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StorageConfig {
    /// `type: embedded` (the default): one database file in the data directory.
    #[default]
    Embedded,
    /// `type: etcd`: an etcd cluster, shared by every Auth Service of the cluster.
    Etcd(EtcdStorageConfig),
}

/// `auth_service.storage` with `type: etcd`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdStorageConfig {
    /// The members' client URLs (`peers`), all `http://` or all `https://`.
    pub peers: Vec<String>,
    /// The key prefix of this cluster (`prefix`, default `/svc/<cluster name>`).
    pub prefix: String,
    /// The CA of the members' certificates (`tls_ca_file`; required with `https://` peers).
    pub tls_ca_file: Option<PathBuf>,
    /// The client certificate for etcd's `--client-cert-auth` (`tls_cert_file`).
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's key (`tls_key_file`).
    pub tls_key_file: Option<PathBuf>,
    /// The etcd user (`username`), with `password_file`.
    pub username: Option<String>,
    /// A file holding the etcd user's password (`password_file`; a trailing newline is ignored).
    pub password_file: Option<PathBuf>,
}

/// A file named in `auth_service.storage` could not be read.
#[derive(Debug, thiserror::Error)]
#[error("auth_service.storage.{field}: cannot read {}: {source}", path.display())]
pub struct StorageFileError {
    /// The field naming the file.
    pub field: &'static str,
    /// The file.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

#[cfg(feature = "etcd")]
impl EtcdStorageConfig {
    /// The options for [`EtcdBackend::connect`](crate::backend::EtcdBackend::connect): the
    /// files named here are read now (the password never leaves the returned options).
    pub fn options(&self) -> Result<crate::backend::EtcdOptions, StorageFileError> {
        let read = |field: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|source| StorageFileError {
                field,
                path: path.clone(),
                source,
            })
        };
        let mut options = crate::backend::EtcdOptions::new(self.peers.clone(), self.prefix.clone());
        if let Some(ca) = &self.tls_ca_file {
            let client = match (&self.tls_cert_file, &self.tls_key_file) {
                (Some(cert), Some(key)) => Some((read("tls_cert_file", cert)?, read("tls_key_file", key)?)),
                _ => None,
            };
            options = options.tls(crate::backend::EtcdTls {
                ca_pem: read("tls_ca_file", ca)?,
                client,
            });
        }
        if let (Some(user), Some(file)) = (&self.username, &self.password_file) {
            let password = read("password_file", file)?;
            let password = String::from_utf8_lossy(&password);
            options = options.user(user.clone(), password.trim_end_matches(['\r', '\n']));
        }
        Ok(options)
    }
}

/// `auth_service.direct_dial`: the listeners directly joined agents may announce for the
/// proxy to dial.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DirectDialConfig {
    /// Accept loopback listeners of agents on the Auth Service's own host, and let the proxy
    /// dial loopback addresses (default `false`; for single-host labs).
    pub allow_loopback: bool,
}

/// `auth_service.authentication`: limits on failed sign-ins and joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuthenticationConfig {
    /// Failed sign-ins that lock a user (default 5).
    pub max_login_attempts: u32,
    /// Failed sign-ins and joins that lock a source address (default 20).
    pub max_source_attempts: u32,
    /// How long a lock lasts and a failure is remembered (default 30 minutes).
    pub lockout_duration: Duration,
}

impl Default for AuthenticationConfig {
    fn default() -> Self {
        let d = crate::login_limit::LoginLimits::default();
        Self {
            max_login_attempts: d.max_user_failures,
            max_source_attempts: d.max_source_failures,
            lockout_duration: d.lockout,
        }
    }
}

impl AuthenticationConfig {
    /// The limits for [`AuthService::with_login_limits`](crate::auth::AuthService::with_login_limits).
    #[cfg(feature = "auth")]
    pub fn limits(&self) -> crate::auth::LoginLimits {
        crate::auth::LoginLimits::new(
            self.max_login_attempts,
            self.max_source_attempts,
            self.lockout_duration,
        )
    }
}

/// `proxy_service`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyConfig {
    /// Whether this process runs the Proxy Service (default `true`).
    pub enabled: bool,
    /// How long a web port connection (HTTP/1.1 or HTTP/2) may stay open with no request in
    /// flight before it is closed gracefully (default 90 seconds).
    pub web_idle_timeout: Duration,
    /// How long a stopping proxy (SIGTERM) lets its connections and its agents' sessions finish
    /// before it exits anyway (default 30 seconds).
    pub shutdown_drain_timeout: Duration,
    /// Copied from `auth_service.proxy_listener_mode`, so the proxy finds it here.
    pub listener_mode: ListenerMode,
    /// The one public web address (specification §2.1), default port 3080.
    pub public_addr: Option<Addr>,
    /// Web listener (default `127.0.0.1:3080`); with TLS routing every protocol comes here.
    pub web_listen_addr: Addr,
    /// Reverse tunnel listener in separate mode (default `127.0.0.1:3024`).
    pub tunnel_listen_addr: Addr,
    /// SSH proxy listener in separate mode (`listen_addr`, default `127.0.0.1:3023`).
    pub ssh_listen_addr: Addr,
    /// Proxy peering listener (default `127.0.0.1:3021`).
    pub peer_listen_addr: Addr,
    /// Kubernetes listener in separate mode; off when `None`.
    pub kube_listen_addr: Option<Addr>,
    /// Public Kubernetes address (default port 3026).
    pub kube_public_addr: Option<Addr>,
    /// Public SSH address (default port 3023).
    pub ssh_public_addr: Option<Addr>,
    /// Public reverse-tunnel address (default port 3024).
    pub tunnel_public_addr: Option<Addr>,
    /// Separate-port database listeners and their public addresses.
    pub db: ProxyDbAddrs,
    /// Certificate and key files served on the web listener; empty means self-signed.
    pub https_keypairs: Vec<KeyPair>,
    /// Whether PROXY protocol headers are honoured (default off).
    pub proxy_protocol: ProxyProtocol,
    /// Sources whose PROXY headers are trusted; required non-empty when `proxy_protocol` is on.
    pub proxy_protocol_trusted_networks: Vec<IpNet>,
    /// Configured version channels by name (`default` and `stable/cloud` only when configured;
    /// the version server adds the implicit ones).
    pub automatic_upgrades_channels: BTreeMap<String, ChannelSpec>,
    /// Limits of each of the proxy's listeners (`proxy_service.connection_limits`).
    pub connection_limits: ConnectionLimits,
}

/// The Proxy Service's separate-port database listeners (each off when `None`) and public
/// addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyDbAddrs {
    /// `postgres_listen_addr` (default port 5432).
    pub postgres_listen_addr: Option<Addr>,
    /// `postgres_public_addr` (default port 5432).
    pub postgres_public_addr: Option<Addr>,
    /// `mysql_listen_addr` (default port 3036).
    pub mysql_listen_addr: Option<Addr>,
    /// `mysql_public_addr` (default port 3036).
    pub mysql_public_addr: Option<Addr>,
    /// `mongo_listen_addr` (default port 27017).
    pub mongo_listen_addr: Option<Addr>,
    /// `mongo_public_addr` (default port 27017).
    pub mongo_public_addr: Option<Addr>,
    /// `redis_listen_addr` (default port 6379).
    pub redis_listen_addr: Option<Addr>,
    /// `redis_public_addr` (default port 6379).
    pub redis_public_addr: Option<Addr>,
}

/// A certificate chain file and its private key file (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyPair {
    /// The certificate chain.
    pub cert_file: PathBuf,
    /// The private key.
    pub key_file: PathBuf,
}

/// `proxy_service.proxy_protocol`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProxyProtocol {
    /// PROXY headers are honoured from `proxy_protocol_trusted_networks` only.
    On,
    /// PROXY headers are never honoured (the default).
    #[default]
    Off,
}

/// `ssh_service`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SshConfig {
    /// Whether this process runs the SSH Service (default `true`).
    pub enabled: bool,
    /// Listener, opened only when the agent joins the Auth Service directly (default
    /// `127.0.0.1:3022`).
    pub listen_addr: Addr,
    /// Public addresses (extra certificate principals); may be empty.
    pub public_addrs: Vec<Addr>,
    /// Labels of this node.
    pub labels: BTreeMap<String, String>,
}

/// `app_service`. No listener: reachable only through reverse tunnels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AppConfig {
    /// Whether this process runs the Application Service (default `false`).
    pub enabled: bool,
    /// Enrolled applications, names unique.
    pub apps: Vec<App>,
}

/// `app_service.apps[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct App {
    /// Unique name.
    pub name: String,
    /// Where the application is (`http://`, `https://` or `tcp://` URL).
    pub uri: String,
    /// The DNS name the Proxy Service serves the application under.
    pub public_addr: Option<Host>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// `db_service`. No listener: reachable only through reverse tunnels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DbConfig {
    /// Whether this process runs the Database Service (default `false`).
    pub enabled: bool,
    /// Enrolled databases, names unique.
    pub databases: Vec<Database>,
}

/// `db_service.databases[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Database {
    /// Unique name.
    pub name: String,
    /// Wire protocol.
    pub protocol: DbProtocol,
    /// Where the database is; the port defaults to the protocol's.
    pub uri: Addr,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// How to verify the database's TLS certificate.
    pub tls: Option<DbTls>,
}

/// `db_service.databases[].protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DbProtocol {
    /// PostgreSQL.
    Postgres,
    /// MySQL.
    Mysql,
    /// MongoDB.
    Mongodb,
    /// Redis.
    Redis,
}

impl DbProtocol {
    /// The protocol's usual port.
    pub fn default_port(self) -> u16 {
        match self {
            DbProtocol::Postgres => ports::POSTGRES,
            DbProtocol::Mysql => ports::MYSQL,
            DbProtocol::Mongodb => ports::MONGO,
            DbProtocol::Redis => ports::REDIS,
        }
    }

    /// The name used in the configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            DbProtocol::Postgres => "postgres",
            DbProtocol::Mysql => "mysql",
            DbProtocol::Mongodb => "mongodb",
            DbProtocol::Redis => "redis",
        }
    }
}

/// `db_service.databases[].tls`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DbTls {
    /// CA bundle that signs the database's certificate (default: system roots).
    pub ca_cert_file: Option<PathBuf>,
    /// Name expected in the database's certificate (default: the host of `uri`).
    pub server_name: Option<String>,
    /// Client certificate (PEM chain) the agent presents to the database, with
    /// [`key_file`](Self::key_file); both or neither. MySQL admits the agent by it
    /// (`REQUIRE X509`/`REQUIRE SUBJECT`); Redis with `tls-auth-clients yes` requires it.
    pub cert_file: Option<PathBuf>,
    /// The private key of [`cert_file`](Self::cert_file) (PEM).
    pub key_file: Option<PathBuf>,
}

/// `kubernetes_service`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KubeConfig {
    /// Whether this process runs the Kubernetes Service (default `false`).
    pub enabled: bool,
    /// Listener, opened only when the agent joins the Auth Service directly (default
    /// `127.0.0.1:3026`).
    pub listen_addr: Addr,
    /// Public addresses; may be empty.
    pub public_addrs: Vec<Addr>,
    /// The name the cluster is enrolled under (default: the cluster name).
    pub kube_cluster_name: String,
    /// The Kubernetes API server (`https://…`); `None` means in-cluster configuration.
    pub api_url: Option<String>,
    /// CA bundle of the API server.
    pub ca_file: Option<PathBuf>,
    /// Service account token file.
    pub token_file: Option<PathBuf>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// `windows_desktop_service`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowsDesktopConfig {
    /// Whether this process runs the Windows Desktop Service (default `false`).
    pub enabled: bool,
    /// Listener, opened only when the agent joins the Auth Service directly (default
    /// `127.0.0.1:3028`).
    pub listen_addr: Addr,
    /// Enrolled hosts, names unique.
    pub hosts: Vec<DesktopHost>,
}

/// `windows_desktop_service.hosts[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DesktopHost {
    /// Unique name.
    pub name: String,
    /// The host's desktop protocol address (default port 3389).
    pub addr: Addr,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

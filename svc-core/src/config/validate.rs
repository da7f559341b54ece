//! Raw file → runtime [`Config`]: applies every default and checks every rule.
//!
//! A pure function of the parsed file and the host name (passed in, so tests and the default
//! config never read the machine). The first problem found is returned, in file order.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::Duration,
};

use ipnet::IpNet;

use super::{
    ConfigError, ListenerMode,
    raw::{
        OneOrMany, RawApp, RawAuth, RawAuthentication, RawConfig, RawConnectionLimits, RawDb, RawKube,
        RawLog, RawProxy, RawSsh, RawStorage, RawSvc, RawTunnelStrategy, RawWindows,
    },
    types::*,
};
use crate::{
    Addr, Host,
    channel::{RawChannel, validate_channel_name},
};

/// The only file format version.
pub(crate) const FILE_VERSION: &str = "v1";
/// `auth_service.cluster_name` when not set.
pub(crate) const DEFAULT_CLUSTER_NAME: &str = "svc.local";
/// `svc.data_dir` when not set.
pub(crate) const DEFAULT_DATA_DIR: &str = "/var/lib/svc";
/// `auth_service.keep_alive_interval` when not set.
pub const DEFAULT_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// `auth_service.keep_alive_count_max` when not set.
pub const DEFAULT_KEEP_ALIVE_COUNT_MAX: u32 = 3;
/// `auth_service.grpc_idle_timeout` when not set.
pub(crate) const DEFAULT_GRPC_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// `proxy_service.web_idle_timeout` when not set.
pub(crate) const DEFAULT_WEB_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// `proxy_service.shutdown_drain_timeout` when not set.
pub(crate) const DEFAULT_SHUTDOWN_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

const LOOPBACK: Host = Host::V4(Ipv4Addr::LOCALHOST);

fn loopback(port: u16) -> Addr {
    Addr::new(LOOPBACK, port)
}

/// Validates a parsed file. `hostname` is the default `svc.nodename`.
pub(crate) fn validate(raw: RawConfig, hostname: &str) -> Result<Config, ConfigError> {
    one_of("version", &raw.version, &[FILE_VERSION], &[FILE_VERSION])?;
    let mut svc = svc(raw.svc, hostname)?;
    let auth = auth(raw.auth_service)?;
    let proxy = proxy(raw.proxy_service, auth.proxy_listener_mode)?;
    if svc.proxy_server.is_none() && svc.auth_servers.is_empty() {
        // Joining nothing explicit means the all-in-one cluster: agents dial this process's own
        // proxy, through loopback when it listens on every interface. With the Auth Service
        // here and no proxy, the local agent joins that Auth Service directly (no proxy
        // address); a lone agent dials a proxy on this host.
        svc.proxy_server = if proxy.enabled {
            Some(local_dial_addr(&proxy.web_listen_addr))
        } else if auth.enabled {
            None
        } else {
            Some(loopback(ports::PROXY_WEB))
        };
    }
    let ssh = ssh(raw.ssh_service)?;
    let app = app(raw.app_service)?;
    let db = db(raw.db_service)?;
    let kube = kube(raw.kubernetes_service, &auth.cluster_name)?;
    let windows_desktop = windows(raw.windows_desktop_service)?;
    if svc.proxy_server.is_none() {
        // Specification §1 rule 3: these two services are reachable only through reverse
        // tunnels via the Proxy Service, so an agent joined directly to the Auth Service
        // cannot run them.
        for (enabled, path, service) in [
            (app.enabled, "app_service.enabled", "Application Service"),
            (db.enabled, "db_service.enabled", "Database Service"),
        ] {
            if enabled {
                let why = if auth.enabled && svc.auth_servers.is_empty() {
                    "this process runs the Auth Service without the Proxy Service, so its agent joins that Auth Service directly; set svc.proxy_server (a Proxy Service run elsewhere), enable proxy_service or disable the service"
                } else {
                    "this agent joins the Auth Service directly (svc.auth_server without svc.proxy_server); set svc.proxy_server or disable the service"
                };
                return Err(ConfigError::Invalid {
                    path: path.to_owned(),
                    reason: format!(
                        "the {service} is reachable only through a reverse tunnel via the Proxy Service, but {why}"
                    ),
                });
            }
        }
    }
    Ok(Config {
        svc,
        auth,
        proxy,
        ssh,
        app,
        db,
        kube,
        windows_desktop,
    })
}

/// The address to dial a local listener at: an unspecified host (`0.0.0.0`, `::`) becomes the
/// loopback address of the same family.
fn local_dial_addr(listen: &Addr) -> Addr {
    match listen.host().ip() {
        Some(IpAddr::V4(ip)) if ip.is_unspecified() => Addr::new(LOOPBACK, listen.port()),
        Some(IpAddr::V6(ip)) if ip.is_unspecified() => {
            Addr::new(Host::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen.clone(),
    }
}

/// Maps `found` to the value at the same index in `values`, or an error listing `allowed`.
fn one_of<T: Copy>(
    path: &str,
    found: &str,
    allowed: &'static [&'static str],
    values: &[T],
) -> Result<T, ConfigError> {
    allowed
        .iter()
        .position(|a| *a == found)
        .and_then(|i| values.get(i).copied())
        .ok_or_else(|| ConfigError::UnknownValue {
            path: path.to_owned(),
            found: found.to_owned(),
            allowed,
        })
}

fn addr(path: &str, value: &str, default_port: u16) -> Result<Addr, ConfigError> {
    Addr::parse_with_default_port(value, default_port).map_err(|source| ConfigError::Addr {
        path: path.to_owned(),
        source,
    })
}

fn opt_addr(path: &str, value: Option<&str>, default_port: u16) -> Result<Option<Addr>, ConfigError> {
    value.map(|v| addr(path, v, default_port)).transpose()
}

fn listen_addr(path: &str, value: Option<&str>, default_port: u16) -> Result<Addr, ConfigError> {
    Ok(opt_addr(path, value, default_port)?.unwrap_or_else(|| loopback(default_port)))
}

/// Parses a one-or-list field; list elements get `[i]` in their path.
fn addr_list(path: &str, value: Option<&OneOrMany>, default_port: u16) -> Result<Vec<Addr>, ConfigError> {
    let Some(OneOrMany(values)) = value else {
        return Ok(Vec::new());
    };
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let p = if values.len() == 1 {
                path.to_owned()
            } else {
                format!("{path}[{i}]")
            };
            addr(&p, v, default_port)
        })
        .collect()
}

fn duration(path: &str, value: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    let Some(v) = value else { return Ok(default) };
    let d = humantime::parse_duration(v).map_err(|e| ConfigError::Duration {
        path: path.to_owned(),
        found: v.to_owned(),
        reason: e.to_string(),
    })?;
    if d.is_zero() {
        return Err(ConfigError::Duration {
            path: path.to_owned(),
            found: v.to_owned(),
            reason: "must be greater than zero".to_owned(),
        });
    }
    Ok(d)
}

fn non_empty(path: &str, value: &str, what: &str) -> Result<(), ConfigError> {
    if value.trim().is_empty() {
        return Err(ConfigError::Invalid {
            path: path.to_owned(),
            reason: format!("expected {what}, found an empty string"),
        });
    }
    Ok(())
}

fn labels(path: &str, labels: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, ConfigError> {
    for key in labels.keys() {
        let ok = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
        if !ok {
            return Err(ConfigError::Invalid {
                path: format!("{path}.{key}"),
                reason: format!(
                    "invalid label name \"{key}\": expected letters, digits, '-', '_', '.' and '/'"
                ),
            });
        }
    }
    Ok(labels)
}

/// Rejects a second entry with the same name; `names` yields (name path, name).
fn unique<'a>(kind: &'static str, names: impl Iterator<Item = (String, &'a str)>) -> Result<(), ConfigError> {
    let mut seen: HashMap<&str, String> = HashMap::new();
    for (path, name) in names {
        if let Some(first) = seen.get(name) {
            return Err(ConfigError::Duplicate {
                path,
                kind,
                name: name.to_owned(),
                first: first.clone(),
            });
        }
        seen.insert(name, path);
    }
    Ok(())
}

fn svc(raw: RawSvc, hostname: &str) -> Result<SvcConfig, ConfigError> {
    let nodename = match raw.nodename {
        Some(n) => {
            non_empty("svc.nodename", &n, "a node name")?;
            n
        }
        None if hostname.trim().is_empty() => "localhost".to_owned(),
        None => hostname.trim().to_owned(),
    };
    let auth_servers = addr_list("svc.auth_server", raw.auth_server.as_ref(), ports::AUTH)?;
    let proxy_server = opt_addr("svc.proxy_server", raw.proxy_server.as_deref(), ports::PROXY_WEB)?;
    let ca_pins = raw
        .ca_pin
        .map(|OneOrMany(pins)| {
            let many = pins.len() > 1;
            pins.into_iter()
                .enumerate()
                .map(|(i, pin)| {
                    let path = if many {
                        format!("svc.ca_pin[{i}]")
                    } else {
                        "svc.ca_pin".to_owned()
                    };
                    ca_pin(&path, &pin)
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    Ok(SvcConfig {
        nodename,
        data_dir: raw.data_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
        auth_token: raw.auth_token,
        proxy_server,
        auth_servers,
        log: log(raw.log)?,
        diag_addr: opt_addr("svc.diag_addr", raw.diag_addr.as_deref(), ports::DIAG)?,
        ca_pins,
    })
}

fn ca_pin(path: &str, pin: &str) -> Result<String, ConfigError> {
    let ok = pin
        .strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(pin.to_ascii_lowercase())
    } else {
        Err(ConfigError::Invalid {
            path: path.to_owned(),
            reason: format!("expected sha256:<64 hex digits>, found \"{pin}\""),
        })
    }
}

fn log(raw: RawLog) -> Result<LogConfig, ConfigError> {
    let output = match raw.output.as_deref() {
        None | Some("stderr") => LogOutput::Stderr,
        Some("stdout") => LogOutput::Stdout,
        Some("") => {
            return Err(ConfigError::Invalid {
                path: "svc.log.output".to_owned(),
                reason: "expected stderr, stdout or a file path, found an empty string".to_owned(),
            });
        }
        Some(file) => LogOutput::File(PathBuf::from(file)),
    };
    let severity = match raw.severity.as_deref() {
        None => LogSeverity::default(),
        Some(s) => one_of(
            "svc.log.severity",
            s,
            &["debug", "info", "warn", "error"],
            &[
                LogSeverity::Debug,
                LogSeverity::Info,
                LogSeverity::Warn,
                LogSeverity::Error,
            ],
        )?,
    };
    let format = match raw.format.as_deref() {
        None => LogFormat::default(),
        Some(f) => one_of(
            "svc.log.format",
            f,
            &["text", "json"],
            &[LogFormat::Text, LogFormat::Json],
        )?,
    };
    Ok(LogConfig {
        output,
        severity,
        format,
    })
}

fn auth(raw: RawAuth) -> Result<AuthConfig, ConfigError> {
    let cluster_name = match raw.cluster_name {
        Some(n) => {
            let ok = !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !ok {
                return Err(ConfigError::Invalid {
                    path: "auth_service.cluster_name".to_owned(),
                    reason: format!(
                        "invalid cluster name \"{n}\": expected letters, digits, '-', '_' and '.'"
                    ),
                });
            }
            n
        }
        None => DEFAULT_CLUSTER_NAME.to_owned(),
    };
    let proxy_listener_mode = match raw.proxy_listener_mode.as_deref() {
        None => ListenerMode::default(),
        Some(m) => one_of(
            "auth_service.proxy_listener_mode",
            m,
            &["multiplex", "separate"],
            &[ListenerMode::Multiplex, ListenerMode::Separate],
        )?,
    };
    let keep_alive_count_max = raw.keep_alive_count_max.unwrap_or(DEFAULT_KEEP_ALIVE_COUNT_MAX);
    if keep_alive_count_max == 0 {
        return Err(ConfigError::Invalid {
            path: "auth_service.keep_alive_count_max".to_owned(),
            reason: "expected a count of at least 1, found 0".to_owned(),
        });
    }
    let storage = storage(raw.storage, &cluster_name)?;
    Ok(AuthConfig {
        enabled: raw.enabled.unwrap_or(true),
        listen_addr: listen_addr(
            "auth_service.listen_addr",
            raw.listen_addr.as_deref(),
            ports::AUTH,
        )?,
        public_addrs: addr_list("auth_service.public_addr", raw.public_addr.as_ref(), ports::AUTH)?,
        cluster_name,
        proxy_listener_mode,
        keep_alive_interval: duration(
            "auth_service.keep_alive_interval",
            raw.keep_alive_interval.as_deref(),
            DEFAULT_KEEP_ALIVE_INTERVAL,
        )?,
        keep_alive_count_max,
        grpc_idle_timeout: duration(
            "auth_service.grpc_idle_timeout",
            raw.grpc_idle_timeout.as_deref(),
            DEFAULT_GRPC_IDLE_TIMEOUT,
        )?,
        authentication: authentication(raw.authentication)?,
        direct_dial: DirectDialConfig {
            allow_loopback: raw.direct_dial.allow_loopback.unwrap_or(false),
        },
        storage,
        tunnel_strategy: tunnel_strategy(raw.tunnel_strategy)?,
        connection_limits: connection_limits("auth_service", raw.connection_limits)?,
    })
}

/// The most `connection_limits.max_connections` may say: more than any process could hold
/// (each connection is a file descriptor), so a larger number is a typo.
const MAX_MAX_CONNECTIONS: u64 = 16_777_216;

fn connection_limits(section: &str, raw: RawConnectionLimits) -> Result<ConnectionLimits, ConfigError> {
    let max_connections = match raw.max_connections {
        None => DEFAULT_MAX_CONNECTIONS,
        Some(n) if (1..=MAX_MAX_CONNECTIONS).contains(&n) => usize::try_from(n).unwrap_or(usize::MAX),
        Some(n) => {
            return Err(ConfigError::Invalid {
                path: format!("{section}.connection_limits.max_connections"),
                reason: format!(
                    "expected a number of connections from 1 to {MAX_MAX_CONNECTIONS}, found {n}"
                ),
            });
        }
    };
    Ok(ConnectionLimits { max_connections })
}

fn tunnel_strategy(raw: Option<RawTunnelStrategy>) -> Result<TunnelStrategy, ConfigError> {
    const P: &str = "auth_service.tunnel_strategy";
    let Some(raw) = raw else {
        return Ok(TunnelStrategy::AgentMesh);
    };
    let kind = match raw.kind.as_deref() {
        None => "agent_mesh",
        Some(k) => one_of(
            &format!("{P}.type"),
            k,
            &["agent_mesh", "proxy_peering"],
            &["agent_mesh", "proxy_peering"],
        )?,
    };
    match (kind, raw.agent_connection_count) {
        ("agent_mesh", Some(_)) => Err(ConfigError::Invalid {
            path: format!("{P}.agent_connection_count"),
            reason: "only valid with type: proxy_peering".to_owned(),
        }),
        ("agent_mesh", None) => Ok(TunnelStrategy::AgentMesh),
        (_, Some(0)) => Err(ConfigError::Invalid {
            path: format!("{P}.agent_connection_count"),
            reason: "expected a count of at least 1, found 0".to_owned(),
        }),
        (_, count) => Ok(TunnelStrategy::ProxyPeering {
            agent_connection_count: usize::try_from(count.unwrap_or(1)).unwrap_or(usize::MAX),
        }),
    }
}

fn storage(raw: RawStorage, cluster_name: &str) -> Result<StorageConfig, ConfigError> {
    const P: &str = "auth_service.storage";
    let invalid = |field: &str, reason: String| ConfigError::Invalid {
        path: format!("{P}.{field}"),
        reason,
    };
    let kind = match raw.kind.as_deref() {
        None => "embedded",
        Some(k) => one_of(
            &format!("{P}.type"),
            k,
            &["embedded", "etcd"],
            &["embedded", "etcd"],
        )?,
    };
    if kind == "embedded" {
        let etcd_only = [
            ("peers", raw.peers.is_some()),
            ("prefix", raw.prefix.is_some()),
            ("tls_ca_file", raw.tls_ca_file.is_some()),
            ("tls_cert_file", raw.tls_cert_file.is_some()),
            ("tls_key_file", raw.tls_key_file.is_some()),
            ("username", raw.username.is_some()),
            ("password_file", raw.password_file.is_some()),
        ];
        if let Some((field, _)) = etcd_only.iter().find(|(_, set)| *set) {
            return Err(invalid(
                field,
                "only for `type: etcd` (the embedded store is the data directory's database file)".to_owned(),
            ));
        }
        return Ok(StorageConfig::Embedded);
    }
    let peers = raw.peers.unwrap_or_default();
    if peers.is_empty() {
        return Err(invalid(
            "peers",
            "`type: etcd` needs at least one member URL, such as https://etcd1.example.com:2379".to_owned(),
        ));
    }
    let mut https = None;
    for (i, peer) in peers.iter().enumerate() {
        let (scheme, rest) = peer.split_once("://").unwrap_or(("", peer));
        let secure = match scheme {
            "https" => true,
            "http" => false,
            _ => {
                return Err(invalid(
                    &format!("peers[{i}]"),
                    format!("\"{peer}\" is not a URL: expected https://host:port or http://host:port"),
                ));
            }
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty()
            || authority.contains('/')
            || Addr::parse_with_default_port(authority, 2379).is_err()
        {
            return Err(invalid(
                &format!("peers[{i}]"),
                format!("\"{peer}\": expected {scheme}://host:port with no path"),
            ));
        }
        if https.is_some_and(|h| h != secure) {
            return Err(invalid(
                "peers",
                "mixes http:// and https:// members; use one scheme for all".to_owned(),
            ));
        }
        https = Some(secure);
    }
    let https = https.unwrap_or(false);
    if https && raw.tls_ca_file.is_none() {
        return Err(invalid(
            "tls_ca_file",
            "https:// peers need the CA that signed their certificates".to_owned(),
        ));
    }
    if !https {
        for (field, set) in [
            ("tls_ca_file", raw.tls_ca_file.is_some()),
            ("tls_cert_file", raw.tls_cert_file.is_some()),
            ("tls_key_file", raw.tls_key_file.is_some()),
        ] {
            if set {
                return Err(invalid(field, "TLS settings need https:// peers".to_owned()));
            }
        }
    }
    match (&raw.tls_cert_file, &raw.tls_key_file) {
        (Some(_), None) => {
            return Err(invalid(
                "tls_key_file",
                "tls_cert_file needs its key file".to_owned(),
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "tls_cert_file",
                "tls_key_file needs its certificate file".to_owned(),
            ));
        }
        _ => {}
    }
    match (&raw.username, &raw.password_file) {
        (Some(u), None) if !u.is_empty() => {
            return Err(invalid(
                "password_file",
                "username needs a password_file".to_owned(),
            ));
        }
        (Some(u), _) if u.is_empty() => return Err(invalid("username", "empty user name".to_owned())),
        (None, Some(_)) => return Err(invalid("username", "password_file needs a username".to_owned())),
        _ => {}
    }
    let prefix = raw.prefix.unwrap_or_else(|| format!("/svc/{cluster_name}"));
    if !prefix.starts_with('/') || prefix.ends_with('/') || prefix.len() < 2 {
        return Err(invalid(
            "prefix",
            format!(
                "\"{prefix}\": expected a key path such as /svc/{cluster_name}: starting with '/', not ending with '/'"
            ),
        ));
    }
    Ok(StorageConfig::Etcd(EtcdStorageConfig {
        peers,
        prefix,
        tls_ca_file: raw.tls_ca_file,
        tls_cert_file: raw.tls_cert_file,
        tls_key_file: raw.tls_key_file,
        username: raw.username,
        password_file: raw.password_file,
    }))
}

fn authentication(raw: RawAuthentication) -> Result<AuthenticationConfig, ConfigError> {
    const P: &str = "auth_service.authentication";
    let d = AuthenticationConfig::default();
    let count = |field: &str, value: Option<u32>, default: u32| match value {
        Some(0) => Err(ConfigError::Invalid {
            path: format!("{P}.{field}"),
            reason: "expected a count of at least 1, found 0".to_owned(),
        }),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    Ok(AuthenticationConfig {
        max_login_attempts: count("max_login_attempts", raw.max_login_attempts, d.max_login_attempts)?,
        max_source_attempts: count(
            "max_source_attempts",
            raw.max_source_attempts,
            d.max_source_attempts,
        )?,
        lockout_duration: duration(
            &format!("{P}.lockout_duration"),
            raw.lockout_duration.as_deref(),
            d.lockout_duration,
        )?,
    })
}

fn proxy(raw: RawProxy, listener_mode: ListenerMode) -> Result<ProxyConfig, ConfigError> {
    const P: &str = "proxy_service";
    let public_addrs = addr_list(
        "proxy_service.public_addr",
        raw.public_addr.as_ref(),
        ports::PROXY_WEB,
    )?;
    if public_addrs.len() > 1 {
        return Err(ConfigError::ProxyPublicAddr {
            path: "proxy_service.public_addr".to_owned(),
            found: public_addrs.iter().map(ToString::to_string).collect(),
        });
    }
    let opt = |field: &str, value: &Option<String>, port: u16| {
        opt_addr(&format!("{P}.{field}"), value.as_deref(), port)
    };
    let db = ProxyDbAddrs {
        postgres_listen_addr: opt("postgres_listen_addr", &raw.postgres_listen_addr, ports::POSTGRES)?,
        postgres_public_addr: opt("postgres_public_addr", &raw.postgres_public_addr, ports::POSTGRES)?,
        mysql_listen_addr: opt("mysql_listen_addr", &raw.mysql_listen_addr, ports::MYSQL)?,
        mysql_public_addr: opt("mysql_public_addr", &raw.mysql_public_addr, ports::MYSQL)?,
        mongo_listen_addr: opt("mongo_listen_addr", &raw.mongo_listen_addr, ports::MONGO)?,
        mongo_public_addr: opt("mongo_public_addr", &raw.mongo_public_addr, ports::MONGO)?,
        redis_listen_addr: opt("redis_listen_addr", &raw.redis_listen_addr, ports::REDIS)?,
        redis_public_addr: opt("redis_public_addr", &raw.redis_public_addr, ports::REDIS)?,
    };
    let proxy_protocol = match raw.proxy_protocol.as_deref() {
        None => ProxyProtocol::default(),
        Some(v) => one_of(
            "proxy_service.proxy_protocol",
            v,
            &["on", "off"],
            &[ProxyProtocol::On, ProxyProtocol::Off],
        )?,
    };
    let trusted = raw
        .proxy_protocol_trusted_networks
        .iter()
        .enumerate()
        .map(|(i, n)| network(&format!("{P}.proxy_protocol_trusted_networks[{i}]"), n))
        .collect::<Result<Vec<_>, _>>()?;
    if proxy_protocol == ProxyProtocol::On && trusted.is_empty() {
        return Err(ConfigError::Invalid {
            path: "proxy_service.proxy_protocol_trusted_networks".to_owned(),
            reason: "proxy_protocol is on but no trusted networks are listed: PROXY headers are honoured only from trusted sources, so list the load balancers' networks (for example 10.0.0.0/8)".to_owned(),
        });
    }
    Ok(ProxyConfig {
        connection_limits: connection_limits(P, raw.connection_limits)?,
        enabled: raw.enabled.unwrap_or(true),
        web_idle_timeout: duration(
            "proxy_service.web_idle_timeout",
            raw.web_idle_timeout.as_deref(),
            DEFAULT_WEB_IDLE_TIMEOUT,
        )?,
        shutdown_drain_timeout: duration(
            "proxy_service.shutdown_drain_timeout",
            raw.shutdown_drain_timeout.as_deref(),
            DEFAULT_SHUTDOWN_DRAIN_TIMEOUT,
        )?,
        listener_mode,
        public_addr: public_addrs.into_iter().next(),
        web_listen_addr: listen_addr(
            "proxy_service.web_listen_addr",
            raw.web_listen_addr.as_deref(),
            ports::PROXY_WEB,
        )?,
        tunnel_listen_addr: listen_addr(
            "proxy_service.tunnel_listen_addr",
            raw.tunnel_listen_addr.as_deref(),
            ports::PROXY_TUNNEL,
        )?,
        ssh_listen_addr: listen_addr(
            "proxy_service.listen_addr",
            raw.listen_addr.as_deref(),
            ports::PROXY_SSH,
        )?,
        peer_listen_addr: listen_addr(
            "proxy_service.peer_listen_addr",
            raw.peer_listen_addr.as_deref(),
            ports::PROXY_PEER,
        )?,
        kube_listen_addr: opt("kube_listen_addr", &raw.kube_listen_addr, ports::KUBE)?,
        kube_public_addr: opt("kube_public_addr", &raw.kube_public_addr, ports::KUBE)?,
        ssh_public_addr: opt("ssh_public_addr", &raw.ssh_public_addr, ports::PROXY_SSH)?,
        tunnel_public_addr: opt("tunnel_public_addr", &raw.tunnel_public_addr, ports::PROXY_TUNNEL)?,
        db,
        https_keypairs: raw
            .https_keypairs
            .into_iter()
            .map(|kp| KeyPair {
                cert_file: kp.cert_file,
                key_file: kp.key_file,
            })
            .collect(),
        proxy_protocol,
        proxy_protocol_trusted_networks: trusted,
        automatic_upgrades_channels: channels(&raw.automatic_upgrades_channels)?,
    })
}

fn network(path: &str, value: &str) -> Result<IpNet, ConfigError> {
    value
        .parse::<IpNet>()
        .or_else(|_| value.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| ConfigError::Cidr {
            path: path.to_owned(),
            found: value.to_owned(),
        })
}

fn channels(
    raw: &BTreeMap<String, RawChannel>,
) -> Result<BTreeMap<String, crate::channel::ChannelSpec>, ConfigError> {
    raw.iter()
        .map(|(name, ch)| {
            let path = format!("proxy_service.automatic_upgrades_channels.{name}");
            let err = |source| ConfigError::Channel {
                path: path.clone(),
                source,
            };
            validate_channel_name(name).map_err(err)?;
            Ok((name.clone(), ch.validate().map_err(err)?))
        })
        .collect()
}

fn ssh(raw: RawSsh) -> Result<SshConfig, ConfigError> {
    Ok(SshConfig {
        enabled: raw.enabled.unwrap_or(true),
        listen_addr: listen_addr("ssh_service.listen_addr", raw.listen_addr.as_deref(), ports::SSH)?,
        public_addrs: addr_list("ssh_service.public_addr", raw.public_addr.as_ref(), ports::SSH)?,
        labels: labels("ssh_service.labels", raw.labels)?,
    })
}

fn app(raw: RawApp) -> Result<AppConfig, ConfigError> {
    if raw.listen_addr.is_some() {
        return Err(ConfigError::NoListener {
            path: "app_service.listen_addr".to_owned(),
            service: "Application Service",
        });
    }
    unique(
        "app",
        raw.apps
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("app_service.apps[{i}].name"), a.name.as_str())),
    )?;
    let apps = raw
        .apps
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let p = format!("app_service.apps[{i}]");
            resource_name(&format!("{p}.name"), &a.name)?;
            app_uri(&format!("{p}.uri"), &a.uri)?;
            let public_addr = a
                .public_addr
                .as_deref()
                .map(|h| {
                    Host::parse(h).map_err(|source| ConfigError::Addr {
                        path: format!("{p}.public_addr"),
                        source,
                    })
                })
                .transpose()?;
            Ok(App {
                name: a.name,
                uri: a.uri,
                public_addr,
                labels: labels(&format!("{p}.labels"), a.labels)?,
            })
        })
        .collect::<Result<_, ConfigError>>()?;
    Ok(AppConfig {
        enabled: raw.enabled.unwrap_or(false),
        apps,
    })
}

/// Names of apps, databases and desktops end up in DNS names and command lines.
fn resource_name(path: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            path: path.to_owned(),
            reason: format!(
                "invalid name \"{name}\": expected 1 to 63 lower-case letters, digits and '-', not starting or ending with '-'"
            ),
        })
    }
}

fn app_uri(path: &str, uri: &str) -> Result<(), ConfigError> {
    let rest = ["http://", "https://", "tcp://"]
        .iter()
        .find_map(|scheme| uri.strip_prefix(scheme));
    let ok = rest.is_some_and(|r| {
        let authority = r.split('/').next().unwrap_or_default();
        !authority.is_empty() && !r.chars().any(char::is_whitespace)
    });
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            path: path.to_owned(),
            reason: format!("expected an http://, https:// or tcp:// URL with a host, found \"{uri}\""),
        })
    }
}

fn db(raw: RawDb) -> Result<DbConfig, ConfigError> {
    if raw.listen_addr.is_some() {
        return Err(ConfigError::NoListener {
            path: "db_service.listen_addr".to_owned(),
            service: "Database Service",
        });
    }
    unique(
        "database",
        raw.databases
            .iter()
            .enumerate()
            .map(|(i, d)| (format!("db_service.databases[{i}].name"), d.name.as_str())),
    )?;
    let databases = raw
        .databases
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let p = format!("db_service.databases[{i}]");
            resource_name(&format!("{p}.name"), &d.name)?;
            let protocol = one_of(
                &format!("{p}.protocol"),
                &d.protocol,
                &["postgres", "mysql", "mongodb", "redis"],
                &[
                    DbProtocol::Postgres,
                    DbProtocol::Mysql,
                    DbProtocol::Mongodb,
                    DbProtocol::Redis,
                ],
            )?;
            Ok(Database {
                name: d.name,
                protocol,
                uri: addr(&format!("{p}.uri"), &d.uri, protocol.default_port())?,
                labels: labels(&format!("{p}.labels"), d.labels)?,
                tls: d
                    .tls
                    .map(|t| {
                        if t.cert_file.is_some() != t.key_file.is_some() {
                            return Err(ConfigError::Invalid {
                                path: format!("{p}.tls"),
                                reason: "cert_file and key_file go together: set both or neither".to_owned(),
                            });
                        }
                        Ok(DbTls {
                            ca_cert_file: t.ca_cert_file,
                            server_name: t.server_name,
                            cert_file: t.cert_file,
                            key_file: t.key_file,
                        })
                    })
                    .transpose()?,
            })
        })
        .collect::<Result<_, ConfigError>>()?;
    Ok(DbConfig {
        enabled: raw.enabled.unwrap_or(false),
        databases,
    })
}

fn kube(raw: RawKube, cluster_name: &str) -> Result<KubeConfig, ConfigError> {
    if let Some(url) = &raw.api_url {
        let ok = ["http://", "https://"]
            .iter()
            .find_map(|s| url.strip_prefix(s))
            .is_some_and(|r| !r.is_empty() && !r.chars().any(char::is_whitespace));
        if !ok {
            return Err(ConfigError::Invalid {
                path: "kubernetes_service.api_url".to_owned(),
                reason: format!("expected an https:// or http:// URL, found \"{url}\""),
            });
        }
    }
    let kube_cluster_name = match raw.kube_cluster_name {
        Some(n) => {
            non_empty("kubernetes_service.kube_cluster_name", &n, "a cluster name")?;
            n
        }
        None => cluster_name.to_owned(),
    };
    Ok(KubeConfig {
        enabled: raw.enabled.unwrap_or(false),
        listen_addr: listen_addr(
            "kubernetes_service.listen_addr",
            raw.listen_addr.as_deref(),
            ports::KUBE,
        )?,
        public_addrs: addr_list(
            "kubernetes_service.public_addr",
            raw.public_addr.as_ref(),
            ports::KUBE,
        )?,
        kube_cluster_name,
        api_url: raw.api_url,
        ca_file: raw.ca_file,
        token_file: raw.token_file,
        labels: labels("kubernetes_service.labels", raw.labels)?,
    })
}

fn windows(raw: RawWindows) -> Result<WindowsDesktopConfig, ConfigError> {
    let listen_addr = listen_addr(
        "windows_desktop_service.listen_addr",
        raw.listen_addr.as_deref(),
        ports::WINDOWS_DESKTOP,
    )?;
    unique(
        "desktop host",
        raw.hosts.iter().enumerate().map(|(i, h)| {
            (
                format!("windows_desktop_service.hosts[{i}].name"),
                h.name.as_str(),
            )
        }),
    )?;
    let hosts = raw
        .hosts
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            let p = format!("windows_desktop_service.hosts[{i}]");
            resource_name(&format!("{p}.name"), &h.name)?;
            Ok(DesktopHost {
                addr: addr(&format!("{p}.addr"), &h.addr, ports::RDP)?,
                name: h.name,
                labels: labels(&format!("{p}.labels"), h.labels)?,
            })
        })
        .collect::<Result<_, ConfigError>>()?;
    Ok(WindowsDesktopConfig {
        enabled: raw.enabled.unwrap_or(false),
        listen_addr,
        hosts,
    })
}

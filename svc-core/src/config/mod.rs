//! The configuration file model (`svc.yaml`).
//!
//! Data flow: text → `raw` (strict serde structs, `deny_unknown_fields`, parse errors carry the
//! field path via `serde_path_to_error`) → `validate` (defaults applied, rules checked,
//! [`ConfigError`] names the field path) → [`Config`], which `svc start`, the Proxy Service and
//! the agents read. Only [`Config::load`] and [`system_hostname`] touch the machine; everything
//! else is a pure function of the text (and a host name passed in).
//!
//! The reference for users is `docs/configuration.md`; a test checks it mentions every field.

use std::{collections::BTreeMap, fmt, path::Path, str::FromStr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::{Addr, channel::ChannelSpec};

mod error;
mod raw;
mod types;
mod validate;

pub use error::ConfigError;
pub use types::{
    App, AppConfig, AuthConfig, AuthenticationConfig, Config, ConnectionLimits, DEFAULT_MAX_CONNECTIONS,
    Database, DbConfig, DbProtocol, DbTls, DesktopHost, DirectDialConfig, EtcdStorageConfig, KeyPair,
    KubeConfig, LogConfig, LogFormat, LogOutput, LogSeverity, ProxyConfig, ProxyDbAddrs, ProxyProtocol,
    SshConfig, StorageConfig, StorageFileError, SvcConfig, TunnelStrategy, WindowsDesktopConfig, ports,
};
pub use validate::{DEFAULT_KEEP_ALIVE_COUNT_MAX, DEFAULT_KEEP_ALIVE_INTERVAL};

/// The commented default configuration written by `svc configure`; it parses to
/// [`Config::all_in_one_default`].
const DEFAULT_YAML: &str = include_str!("default.yaml");

/// The commented default `svc.yaml` (for `svc configure`). Every active value is the default and
/// optional settings are shown commented out, so loading it gives [`Config::all_in_one_default`].
pub fn render_default_commented() -> String {
    DEFAULT_YAML.to_owned()
}

/// This machine's host name: `/etc/hostname`, else the `HOSTNAME` environment variable, else
/// `localhost`. The default `svc.nodename`.
pub fn system_hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

/// serde_yaml_ng prefixes its messages with the path of the mapping it was in (for an unknown
/// field, the parent's path); the error carries the full field path itself, so the prefix goes.
fn strip_parent_path(path: &str, message: String) -> String {
    let mut candidate = path;
    loop {
        if let Some(rest) = message.strip_prefix(candidate).and_then(|m| m.strip_prefix(": ")) {
            return rest.to_owned();
        }
        match candidate.rfind(['.', '[']) {
            Some(i) if i > 0 => candidate = &candidate[..i],
            _ => return message,
        }
    }
}

impl Config {
    /// Parses and validates `svc.yaml` text; the default node name is [`system_hostname`].
    pub fn from_yaml_str(text: &str) -> Result<Config, ConfigError> {
        Self::from_yaml_str_with_hostname(text, &system_hostname())
    }

    /// Parses and validates `svc.yaml` text with `hostname` as the default `svc.nodename`. Pure.
    pub fn from_yaml_str_with_hostname(text: &str, hostname: &str) -> Result<Config, ConfigError> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let raw: raw::RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let message = strip_parent_path(&path, e.into_inner().to_string());
            ConfigError::Parse { path, message }
        })?;
        validate::validate(raw, hostname)
    }

    /// Reads, parses and validates a file. Errors name the file.
    pub fn load(file: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let file = file.as_ref();
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.to_owned(),
            source,
        })?;
        Self::from_yaml_str(&text).map_err(|e| ConfigError::InFile {
            file: file.to_owned(),
            source: Box::new(e),
        })
    }

    /// The configuration of a config-less `svc start`: an all-in-one cluster (Auth, Proxy and SSH
    /// Services) on loopback, node name from [`system_hostname`].
    pub fn all_in_one_default() -> Config {
        Self::all_in_one_default_with_hostname(&system_hostname())
    }

    /// [`Config::all_in_one_default`] with `hostname` as the node name. Pure.
    pub fn all_in_one_default_with_hostname(hostname: &str) -> Config {
        let raw = raw::RawConfig {
            version: validate::FILE_VERSION.to_owned(),
            ..Default::default()
        };
        match validate::validate(raw, hostname) {
            Ok(config) => config,
            // Every default is a constant that the unit tests validate; an empty host name falls
            // back to `localhost`, so no input reaches a fallible check here.
            Err(e) => unreachable!("the built-in default configuration is invalid: {e}"),
        }
    }

    /// The cluster name (`auth_service.cluster_name`).
    pub fn cluster_name(&self) -> &str {
        &self.auth.cluster_name
    }

    /// The Proxy Service's listener layout (`auth_service.proxy_listener_mode`).
    pub fn listener_mode(&self) -> ListenerMode {
        self.auth.proxy_listener_mode
    }
}

impl ProxyConfig {
    /// The address clients and agents use for the web port: `public_addr`, else
    /// `web_listen_addr`.
    pub fn web_public_addr(&self) -> &Addr {
        self.public_addr.as_ref().unwrap_or(&self.web_listen_addr)
    }

    /// Where agents dial their reverse tunnel (without the `SVC_TUNNEL_PUBLIC_ADDR` override,
    /// which the caller applies): with TLS routing the public web address; otherwise
    /// `tunnel_public_addr`, else `ssh_public_addr` with port 3024, else `tunnel_listen_addr`.
    pub fn tunnel_addr(&self) -> Addr {
        if self.listener_mode.tls_routing() {
            return self.web_public_addr().clone();
        }
        if let Some(a) = &self.tunnel_public_addr {
            return a.clone();
        }
        if let Some(a) = &self.ssh_public_addr {
            return a.with_port(ports::PROXY_TUNNEL);
        }
        self.tunnel_listen_addr.clone()
    }

    /// The configured version channels.
    pub fn channels(&self) -> &BTreeMap<String, ChannelSpec> {
        &self.automatic_upgrades_channels
    }

    /// Sources whose PROXY protocol headers are honoured; empty when `proxy_protocol` is off.
    pub fn trusted_proxy_networks(&self) -> &[IpNet] {
        match self.proxy_protocol {
            ProxyProtocol::On => &self.proxy_protocol_trusted_networks,
            ProxyProtocol::Off => &[],
        }
    }

    /// Certificate and key file pairs for the web listener.
    pub fn https_keypairs(&self) -> &[KeyPair] {
        &self.https_keypairs
    }
}

/// How the Proxy Service lays out its listeners (`auth_service.proxy_listener_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerMode {
    /// TLS routing: one web port carries every protocol, routed by ALPN/SNI (the default).
    #[default]
    Multiplex,
    /// Separate ports per service: SSH 3023, tunnels 3024, web 3080, database ports.
    Separate,
}

impl ListenerMode {
    /// Whether TLS routing is on (`proxy.tls_routing_enabled` in `/webapi/ping`).
    pub fn tls_routing(self) -> bool {
        self == ListenerMode::Multiplex
    }
}

impl fmt::Display for ListenerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ListenerMode::Multiplex => "multiplex",
            ListenerMode::Separate => "separate",
        })
    }
}

impl FromStr for ListenerMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "multiplex" => Ok(ListenerMode::Multiplex),
            "separate" => Ok(ListenerMode::Separate),
            other => Err(format!(
                "proxy_listener_mode: unknown value \"{other}\", expected one of: multiplex, separate"
            )),
        }
    }
}

#[cfg(test)]
mod tests;

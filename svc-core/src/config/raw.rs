//! The `svc.yaml` file as written: strict serde structs, before validation.
//!
//! Every struct denies unknown fields so a typo is an error, not a silently ignored setting.
//! Values whose checking needs a good message (addresses with per-field default ports,
//! durations, networks, enumerations) are kept as strings here and converted in
//! `validate`, which names the field path and lists allowed values.

use std::{collections::BTreeMap, fmt, path::PathBuf};

use serde::{
    Deserialize, Deserializer,
    de::{IgnoredAny, SeqAccess, Visitor},
};

use crate::{Secret, channel::RawChannel};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(crate) struct RawConfig {
    pub(crate) version: String,
    #[serde(default)]
    pub(crate) svc: RawSvc,
    #[serde(default)]
    pub(crate) auth_service: RawAuth,
    #[serde(default)]
    pub(crate) proxy_service: RawProxy,
    #[serde(default)]
    pub(crate) ssh_service: RawSsh,
    #[serde(default)]
    pub(crate) app_service: RawApp,
    #[serde(default)]
    pub(crate) db_service: RawDb,
    #[serde(default)]
    pub(crate) kubernetes_service: RawKube,
    #[serde(default)]
    pub(crate) windows_desktop_service: RawWindows,
}

/// `svc`: settings of this process shared by every role.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawSvc {
    pub(crate) nodename: Option<String>,
    pub(crate) data_dir: Option<PathBuf>,
    #[serde(deserialize_with = "secret_scalar")]
    pub(crate) auth_token: Option<Secret>,
    pub(crate) proxy_server: Option<String>,
    pub(crate) auth_server: Option<OneOrMany>,
    pub(crate) log: RawLog,
    pub(crate) diag_addr: Option<String>,
    pub(crate) ca_pin: Option<OneOrMany>,
}

/// `svc.log`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawLog {
    pub(crate) output: Option<String>,
    pub(crate) severity: Option<String>,
    pub(crate) format: Option<String>,
}

/// `auth_service`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawAuth {
    pub(crate) enabled: Option<bool>,
    pub(crate) listen_addr: Option<String>,
    pub(crate) public_addr: Option<OneOrMany>,
    pub(crate) cluster_name: Option<String>,
    pub(crate) proxy_listener_mode: Option<String>,
    pub(crate) keep_alive_interval: Option<String>,
    pub(crate) keep_alive_count_max: Option<u32>,
    pub(crate) grpc_idle_timeout: Option<String>,
    pub(crate) authentication: RawAuthentication,
    pub(crate) direct_dial: RawDirectDial,
    pub(crate) storage: RawStorage,
    pub(crate) tunnel_strategy: Option<RawTunnelStrategy>,
    pub(crate) connection_limits: RawConnectionLimits,
}

/// `auth_service.connection_limits` and `proxy_service.connection_limits`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawConnectionLimits {
    pub(crate) max_connections: Option<u64>,
}

/// `auth_service.tunnel_strategy`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawTunnelStrategy {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) agent_connection_count: Option<u64>,
}

/// `auth_service.storage`: where the Auth Service keeps the cluster's state.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawStorage {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) peers: Option<Vec<String>>,
    pub(crate) prefix: Option<String>,
    pub(crate) tls_ca_file: Option<PathBuf>,
    pub(crate) tls_cert_file: Option<PathBuf>,
    pub(crate) tls_key_file: Option<PathBuf>,
    pub(crate) username: Option<String>,
    pub(crate) password_file: Option<PathBuf>,
}

/// `auth_service.direct_dial`: what directly joined agents may announce.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawDirectDial {
    pub(crate) allow_loopback: Option<bool>,
}

/// `auth_service.authentication`: sign-in and join abuse limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawAuthentication {
    pub(crate) max_login_attempts: Option<u32>,
    pub(crate) max_source_attempts: Option<u32>,
    pub(crate) lockout_duration: Option<String>,
}

/// `proxy_service`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawProxy {
    pub(crate) enabled: Option<bool>,
    pub(crate) public_addr: Option<OneOrMany>,
    pub(crate) web_listen_addr: Option<String>,
    pub(crate) web_idle_timeout: Option<String>,
    pub(crate) shutdown_drain_timeout: Option<String>,
    pub(crate) tunnel_listen_addr: Option<String>,
    pub(crate) listen_addr: Option<String>,
    pub(crate) peer_listen_addr: Option<String>,
    pub(crate) kube_listen_addr: Option<String>,
    pub(crate) kube_public_addr: Option<String>,
    pub(crate) ssh_public_addr: Option<String>,
    pub(crate) tunnel_public_addr: Option<String>,
    pub(crate) postgres_listen_addr: Option<String>,
    pub(crate) postgres_public_addr: Option<String>,
    pub(crate) mysql_listen_addr: Option<String>,
    pub(crate) mysql_public_addr: Option<String>,
    pub(crate) mongo_listen_addr: Option<String>,
    pub(crate) mongo_public_addr: Option<String>,
    pub(crate) redis_listen_addr: Option<String>,
    pub(crate) redis_public_addr: Option<String>,
    pub(crate) https_keypairs: Vec<RawKeyPair>,
    pub(crate) proxy_protocol: Option<String>,
    pub(crate) proxy_protocol_trusted_networks: Vec<String>,
    pub(crate) automatic_upgrades_channels: BTreeMap<String, RawChannel>,
    pub(crate) connection_limits: RawConnectionLimits,
}

/// `proxy_service.https_keypairs[]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(crate) struct RawKeyPair {
    pub(crate) cert_file: PathBuf,
    pub(crate) key_file: PathBuf,
}

/// `ssh_service`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawSsh {
    pub(crate) enabled: Option<bool>,
    pub(crate) listen_addr: Option<String>,
    pub(crate) public_addr: Option<OneOrMany>,
    pub(crate) labels: BTreeMap<String, String>,
}

/// `app_service`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawApp {
    pub(crate) enabled: Option<bool>,
    pub(crate) apps: Vec<RawAppEntry>,
    /// Accepted by the parser only so that validation can explain why it is not allowed.
    pub(crate) listen_addr: Option<IgnoredAny>,
}

/// `app_service.apps[]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(crate) struct RawAppEntry {
    pub(crate) name: String,
    pub(crate) uri: String,
    #[serde(default)]
    pub(crate) public_addr: Option<String>,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
}

/// `db_service`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawDb {
    pub(crate) enabled: Option<bool>,
    pub(crate) databases: Vec<RawDatabase>,
    /// Accepted by the parser only so that validation can explain why it is not allowed.
    pub(crate) listen_addr: Option<IgnoredAny>,
}

/// `db_service.databases[]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(crate) struct RawDatabase {
    pub(crate) name: String,
    pub(crate) protocol: String,
    pub(crate) uri: String,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) tls: Option<RawDbTls>,
}

/// `db_service.databases[].tls`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawDbTls {
    pub(crate) ca_cert_file: Option<PathBuf>,
    pub(crate) server_name: Option<String>,
    pub(crate) cert_file: Option<PathBuf>,
    pub(crate) key_file: Option<PathBuf>,
}

/// `kubernetes_service`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawKube {
    pub(crate) enabled: Option<bool>,
    pub(crate) listen_addr: Option<String>,
    pub(crate) public_addr: Option<OneOrMany>,
    pub(crate) kube_cluster_name: Option<String>,
    pub(crate) api_url: Option<String>,
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) labels: BTreeMap<String, String>,
}

/// `windows_desktop_service`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default, expecting = "a mapping")]
pub(crate) struct RawWindows {
    pub(crate) enabled: Option<bool>,
    pub(crate) listen_addr: Option<String>,
    pub(crate) hosts: Vec<RawDesktopHost>,
}

/// `windows_desktop_service.hosts[]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(crate) struct RawDesktopHost {
    pub(crate) name: String,
    pub(crate) addr: String,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
}

/// A field that takes one string or a list of strings (`public_addr: a` or `public_addr: [a, b]`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct OneOrMany(pub(crate) Vec<String>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OneOrMany;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_owned()]))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(OneOrMany(out))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Reads a secret written as a YAML string or number. A number is kept as written rather than
/// rejected, because the rejection message would quote the secret.
fn secret_scalar<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Secret>, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Option<Secret>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Secret::new(v.to_owned())))
        }

        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(Secret::new(v.to_string())))
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(Secret::new(v.to_string())))
        }

        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(E::custom(
                "invalid type: number, expected a string (quote the token)",
            ))
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    deserializer.deserialize_any(V)
}

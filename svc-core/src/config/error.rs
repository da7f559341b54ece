//! Why a configuration file was rejected.
//!
//! Every variant that is about one field carries its path (`proxy_service.public_addr`,
//! `app_service.apps[1].name`), written the way `serde_path_to_error` writes parse-error paths,
//! so the message always starts with the place to fix.

use std::{io, path::PathBuf};

use crate::{AddrError, channel::ChannelError};

/// A configuration file could not be read, parsed or validated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file was read but its content is invalid; `source` says why.
    #[error("{}: {source}", file.display())]
    InFile {
        /// The file.
        file: PathBuf,
        /// The parse or validation error.
        #[source]
        source: Box<ConfigError>,
    },
    /// The YAML is malformed or does not fit the schema (unknown field, wrong type, missing
    /// required field).
    #[error("{}{message}", prefix(path))]
    Parse {
        /// The field path, `.` for the top level.
        path: String,
        /// The parser's message, with the line and column.
        message: String,
    },
    /// A value outside a small fixed set.
    #[error("{path}: unknown value \"{found}\", expected one of: {}", allowed.join(", "))]
    UnknownValue {
        /// The field path.
        path: String,
        /// The value found.
        found: String,
        /// Every allowed value.
        allowed: &'static [&'static str],
    },
    /// An address that is not `host` or `host:port`.
    #[error("{path}: {source}")]
    Addr {
        /// The field path.
        path: String,
        /// What is wrong with the address.
        #[source]
        source: AddrError,
    },
    /// More than one `proxy_service.public_addr` (specification §2.1: clients would be redirected
    /// to the first one, which may be unreachable for them).
    #[error(
        "{path}: proxy_service allows exactly one address, got {}: {}",
        found.len(),
        found.join(", ")
    )]
    ProxyPublicAddr {
        /// The field path.
        path: String,
        /// Every address given.
        found: Vec<String>,
    },
    /// An invalid version channel definition or name.
    #[error("{path}: {source}")]
    Channel {
        /// The field path, `proxy_service.automatic_upgrades_channels.<name>`.
        path: String,
        /// What is wrong with the channel.
        #[source]
        source: ChannelError,
    },
    /// A duration that is not a human duration string such as `30s` or `5m`.
    #[error("{path}: invalid duration \"{found}\": {reason}")]
    Duration {
        /// The field path.
        path: String,
        /// The value found.
        found: String,
        /// What the duration parser objected to.
        reason: String,
    },
    /// A network that is not in CIDR form.
    #[error(
        "{path}: invalid network \"{found}\": expected an IP network in CIDR form such as 10.0.0.0/8 or fd00::/8, or a single IP address"
    )]
    Cidr {
        /// The field path.
        path: String,
        /// The value found.
        found: String,
    },
    /// A listener on a service that may have none (specification §1 rule 3).
    #[error(
        "{path}: the {service} cannot have a listener of its own: it is reachable only through reverse tunnels via the Proxy Service; remove listen_addr"
    )]
    NoListener {
        /// The field path.
        path: String,
        /// The service, as people call it (`Application Service`).
        service: &'static str,
    },
    /// Two entries of a list share a name.
    #[error("{path}: duplicate {kind} name \"{name}\", already used by {first}")]
    Duplicate {
        /// The field path of the second entry's name.
        path: String,
        /// What the entries are (`app`, `database`, `desktop host`).
        kind: &'static str,
        /// The shared name.
        name: String,
        /// The field path of the first entry with that name.
        first: String,
    },
    /// Any other invalid value; `reason` says what was expected and what was found.
    #[error("{path}: {reason}")]
    Invalid {
        /// The field path.
        path: String,
        /// What was expected and found.
        reason: String,
    },
}

fn prefix(path: &str) -> String {
    if path.is_empty() || path == "." {
        String::new()
    } else {
        format!("{path}: ")
    }
}

impl ConfigError {
    /// The field path the error is about, when it is about one field.
    pub fn path(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::InFile { source, .. } => source.path(),
            ConfigError::Parse { path, .. } => Some(path),
            ConfigError::UnknownValue { path, .. }
            | ConfigError::Addr { path, .. }
            | ConfigError::ProxyPublicAddr { path, .. }
            | ConfigError::Channel { path, .. }
            | ConfigError::Duration { path, .. }
            | ConfigError::Cidr { path, .. }
            | ConfigError::NoListener { path, .. }
            | ConfigError::Duplicate { path, .. }
            | ConfigError::Invalid { path, .. } => Some(path),
        }
    }
}

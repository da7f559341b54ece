//! The configuration file model (`svc.yaml`).
//!
//! Parsing is strict (`deny_unknown_fields`) and validation turns the file into runtime types
//! with errors that name the field path.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

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

//! The `/webapi/ping` and `/webapi/find` documents, computed once from the proxy's settings.
//!
//! Pure: the addresses are derived here (public address first, listen address otherwise; the
//! tunnel address rule of REFERENCE.md, "Ping") and the JSON is serialized once at start-up, so
//! the thousands of clients and agents that poll it are served from memory.

use serde::Serialize;
use svc_core::{Addr, Version};

use crate::proxy::ProxySettings;

/// Where the proxy answers the ping document.
pub const PING_PATH: &str = "/webapi/ping";

/// The tunnel port agents dial without TLS routing.
pub const TUNNEL_PORT: u16 = 3024;

/// The ping response (`GET /webapi/ping`).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Ping {
    /// The authentication preference clients sign in with.
    pub auth: AuthSettings,
    /// The proxy's addresses.
    pub proxy: ProxyPing,
    /// The proxy's version, without the leading `v`.
    pub server_version: String,
    /// The oldest client version the cluster supports, without the leading `v`.
    pub min_client_version: String,
    /// The cluster name.
    pub cluster_name: String,
    /// Whether the cluster runs automatic agent updates.
    pub automatic_upgrades: bool,
}

/// The find response (`GET /webapi/find`): the ping without the authentication preference.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Find {
    /// The proxy's addresses.
    pub proxy: ProxyPing,
    /// The proxy's version, without the leading `v`.
    pub server_version: String,
    /// The oldest client version the cluster supports, without the leading `v`.
    pub min_client_version: String,
    /// The cluster name.
    pub cluster_name: String,
    /// Whether the cluster runs automatic agent updates.
    pub automatic_upgrades: bool,
}

/// `auth` in the ping.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct AuthSettings {
    /// `local`, `github`, `saml` or `oidc`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `off`, `otp`, `webauthn`, `on`, `optional`.
    pub second_factor: String,
    /// The local connector.
    pub local: LocalAuth,
}

/// `auth.local` in the ping.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct LocalAuth {
    /// The connector name (empty for the built-in one).
    pub name: String,
}

/// `proxy` in the ping (specification §4.1).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ProxyPing {
    /// Kubernetes access.
    pub kube: KubePing,
    /// SSH and tunnel addresses.
    pub ssh: SshPing,
    /// Database addresses.
    pub db: DbPing,
    /// Whether TLS routing is on.
    pub tls_routing_enabled: bool,
}

/// `proxy.kube`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct KubePing {
    /// Whether Kubernetes access is served.
    pub enabled: bool,
    /// Where clients reach it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_addr: Option<String>,
    /// Where the proxy listens for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen_addr: Option<String>,
}

/// `proxy.ssh`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SshPing {
    /// Where the proxy listens for SSH clients.
    pub listen_addr: String,
    /// Where the proxy listens for agents' reverse tunnels.
    pub tunnel_listen_addr: String,
    /// Where the proxy listens for HTTPS.
    pub web_listen_addr: String,
    /// The proxy's public web address.
    pub public_addr: String,
    /// Where SSH clients connect.
    pub ssh_public_addr: String,
    /// Where agents dial their tunnel.
    pub ssh_tunnel_public_addr: String,
    /// How long the proxy waits when dialing a resource, in nanoseconds (Go's duration).
    pub dial_timeout: u64,
}

/// `proxy.db`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DbPing {
    /// Where Postgres clients connect.
    pub postgres_public_addr: String,
    /// Where the proxy listens for MySQL (separate mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mysql_listen_addr: Option<String>,
    /// Where MySQL clients connect.
    pub mysql_public_addr: String,
    /// Where the proxy listens for MongoDB (separate mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mongo_listen_addr: Option<String>,
    /// Where MongoDB clients connect.
    pub mongo_public_addr: String,
}

/// Where agents dial their tunnel (REFERENCE.md, "Ping"): `override_addr` (the
/// `SVC_TUNNEL_PUBLIC_ADDR` environment variable, read by the caller) wins; with TLS routing the
/// public web address; otherwise the tunnel public address, else the SSH public address with
/// port 3024, else the tunnel listen address.
pub fn tunnel_public_addr(settings: &ProxySettings, override_addr: Option<&Addr>) -> Addr {
    if let Some(addr) = override_addr {
        return addr.clone();
    }
    if settings.listener_mode.tls_routing() {
        return settings
            .web_public_addr
            .clone()
            .unwrap_or_else(|| settings.web_listen_addr.clone());
    }
    settings
        .tunnel_public_addr
        .clone()
        .or_else(|| {
            settings
                .ssh_public_addr
                .as_ref()
                .map(|a| a.with_port(TUNNEL_PORT))
        })
        .unwrap_or_else(|| settings.tunnel_listen_addr.clone())
}

/// Derives the `proxy` member from the settings (listen addresses as bound).
pub fn proxy_ping(settings: &ProxySettings) -> ProxyPing {
    let s = settings;
    let web_listen = s.web_listen_addr.to_string();
    let web_public = s
        .web_public_addr
        .as_ref()
        .unwrap_or(&s.web_listen_addr)
        .to_string();
    let public_or = |public: &Option<Addr>, listen: &Option<Addr>| -> Option<String> {
        public.as_ref().or(listen.as_ref()).map(ToString::to_string)
    };
    let tunnel = tunnel_public_addr(s, s.tunnel_public_addr_override.as_ref()).to_string();
    let dial_timeout = u64::try_from(s.dial_timeout.as_nanos()).unwrap_or(u64::MAX);
    if s.listener_mode.tls_routing() {
        // One port for everything: every protocol is reached through the web address.
        ProxyPing {
            kube: KubePing {
                enabled: s.kube_enabled,
                public_addr: s.kube_enabled.then(|| {
                    s.kube_public_addr
                        .as_ref()
                        .map_or_else(|| web_public.clone(), ToString::to_string)
                }),
                listen_addr: s.kube_enabled.then(|| web_listen.clone()),
            },
            ssh: SshPing {
                listen_addr: web_listen.clone(),
                tunnel_listen_addr: web_listen.clone(),
                web_listen_addr: web_listen.clone(),
                public_addr: web_public.clone(),
                ssh_public_addr: web_public.clone(),
                ssh_tunnel_public_addr: tunnel,
                dial_timeout,
            },
            db: DbPing {
                postgres_public_addr: web_public.clone(),
                mysql_listen_addr: None,
                mysql_public_addr: web_public.clone(),
                mongo_listen_addr: None,
                mongo_public_addr: web_public,
            },
            tls_routing_enabled: true,
        }
    } else {
        let kube_listen = s.kube_listen_addr.as_ref().map(ToString::to_string);
        ProxyPing {
            kube: KubePing {
                enabled: s.kube_enabled && s.kube_listen_addr.is_some(),
                public_addr: public_or(&s.kube_public_addr, &s.kube_listen_addr),
                listen_addr: kube_listen,
            },
            ssh: SshPing {
                listen_addr: s.ssh_listen_addr.to_string(),
                tunnel_listen_addr: s.tunnel_listen_addr.to_string(),
                web_listen_addr: web_listen,
                public_addr: web_public.clone(),
                ssh_public_addr: s
                    .ssh_public_addr
                    .as_ref()
                    .unwrap_or(&s.ssh_listen_addr)
                    .to_string(),
                ssh_tunnel_public_addr: tunnel,
                dial_timeout,
            },
            db: DbPing {
                // Postgres is multiplexed on the web port unless it has its own listener.
                postgres_public_addr: public_or(&s.postgres_public_addr, &s.postgres_listen_addr)
                    .unwrap_or_else(|| web_public.clone()),
                mysql_listen_addr: s.mysql_listen_addr.as_ref().map(ToString::to_string),
                mysql_public_addr: public_or(&s.mysql_public_addr, &s.mysql_listen_addr)
                    .unwrap_or_else(|| web_public.clone()),
                mongo_listen_addr: s.mongo_listen_addr.as_ref().map(ToString::to_string),
                mongo_public_addr: public_or(&s.mongo_public_addr, &s.mongo_listen_addr)
                    .unwrap_or(web_public),
            },
            tls_routing_enabled: false,
        }
    }
}

/// The whole ping document.
pub fn ping(settings: &ProxySettings, version: &Version) -> Ping {
    let min_client = svc_core::version::min_client_version();
    Ping {
        auth: AuthSettings {
            kind: settings.auth_type.clone(),
            second_factor: settings.second_factor.clone(),
            local: LocalAuth {
                name: settings.local_auth_connector.clone(),
            },
        },
        proxy: proxy_ping(settings),
        server_version: version.without_v(),
        min_client_version: min_client.without_v(),
        cluster_name: settings.cluster_name.clone(),
        automatic_upgrades: settings.automatic_upgrades,
    }
}

/// The find document: the ping without `auth`.
pub fn find(settings: &ProxySettings, version: &Version) -> Find {
    let p = ping(settings, version);
    Find {
        proxy: p.proxy,
        server_version: p.server_version,
        min_client_version: p.min_client_version,
        cluster_name: p.cluster_name,
        automatic_upgrades: p.automatic_upgrades,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_core::config::ListenerMode;

    fn addr(s: &str) -> Addr {
        s.parse().unwrap()
    }

    #[test]
    fn tunnel_address_rule() {
        let mut s = ProxySettings::default();
        assert_eq!(tunnel_public_addr(&s, None), s.web_listen_addr);
        s.web_public_addr = Some(addr("proxy.example.com:443"));
        assert_eq!(tunnel_public_addr(&s, None), addr("proxy.example.com:443"));
        assert_eq!(
            tunnel_public_addr(&s, Some(&addr("t.example.com:9"))),
            addr("t.example.com:9")
        );

        s.listener_mode = ListenerMode::Separate;
        assert_eq!(tunnel_public_addr(&s, None), s.tunnel_listen_addr);
        s.ssh_public_addr = Some(addr("ssh.example.com:3023"));
        assert_eq!(tunnel_public_addr(&s, None), addr("ssh.example.com:3024"));
        s.tunnel_public_addr = Some(addr("tun.example.com:3024"));
        assert_eq!(tunnel_public_addr(&s, None), addr("tun.example.com:3024"));
        assert_eq!(
            tunnel_public_addr(&s, Some(&addr("o.example.com:1"))),
            addr("o.example.com:1")
        );
    }

    #[test]
    fn ping_members_in_both_modes() {
        let mut s = ProxySettings {
            web_public_addr: Some(addr("proxy.example.com:443")),
            ..Default::default()
        };
        let v = serde_json::to_value(ping(&s, &Version::new(17, 1, 0))).unwrap();
        assert_eq!(v["server_version"], "17.1.0");
        assert_eq!(v["min_client_version"], "17.0.0-dev");
        assert_eq!(v["proxy"]["tls_routing_enabled"], true);
        assert_eq!(v["proxy"]["ssh"]["public_addr"], "proxy.example.com:443");
        assert_eq!(
            v["proxy"]["ssh"]["ssh_tunnel_public_addr"],
            "proxy.example.com:443"
        );
        assert_eq!(v["proxy"]["db"]["postgres_public_addr"], "proxy.example.com:443");
        assert_eq!(v["proxy"]["ssh"]["dial_timeout"], 30_000_000_000u64);
        assert_eq!(v["auth"]["type"], "local");

        s.listener_mode = ListenerMode::Separate;
        s.mysql_listen_addr = Some(addr("0.0.0.0:3036"));
        let v = serde_json::to_value(ping(&s, &Version::new(17, 1, 0))).unwrap();
        assert_eq!(v["proxy"]["tls_routing_enabled"], false);
        assert_eq!(v["proxy"]["ssh"]["listen_addr"], "127.0.0.1:3023");
        assert_eq!(v["proxy"]["ssh"]["tunnel_listen_addr"], "127.0.0.1:3024");
        assert_eq!(v["proxy"]["ssh"]["ssh_tunnel_public_addr"], "127.0.0.1:3024");
        assert_eq!(v["proxy"]["db"]["mysql_listen_addr"], "0.0.0.0:3036");
        assert_eq!(v["proxy"]["db"]["mysql_public_addr"], "0.0.0.0:3036");
        let f = serde_json::to_value(find(&s, &Version::new(17, 1, 0))).unwrap();
        assert!(f.get("auth").is_none());
        assert_eq!(f["proxy"], v["proxy"]);
    }
}

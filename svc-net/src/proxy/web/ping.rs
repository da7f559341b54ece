//! The `/webapi/ping` and `/webapi/find` documents and [`PingService`], which serves them.
//!
//! Pure: the addresses are derived here from [`PingSettings`] (public address first, listen
//! address otherwise; the tunnel address rule of the ping document) and the JSON is
//! serialized once when the service is built, so the thousands of clients and agents that poll
//! it are served from memory. [`PingService`] is a plain `tower::Service` over HTTP requests: the
//! proxy mounts it on its web API, and an integrator can mount it in a server of its own.

use std::{
    convert::Infallible,
    future::{Ready, ready},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use serde::Serialize;
use svc_core::{
    Addr, Version,
    config::{ListenerMode, ports},
};

use super::{ResponseBody, full, json_error};

pub use svc_core::webapi::{FIND_PATH, PING_PATH};

/// `auth.second_factor` of a cluster signing in by password alone.
pub const SECOND_FACTOR_OFF: &str = "off";

/// What the ping says: the proxy's addresses per listener mode, the cluster, the sign-in
/// settings. [`Default`] is a loopback-only proxy in multiplex mode.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PingSettings {
    /// The cluster name.
    pub cluster_name: String,
    /// TLS routing (one port) or separate ports.
    pub listener_mode: ListenerMode,
    /// Where HTTPS (and, in multiplex mode, everything) is served.
    pub web_listen_addr: Addr,
    /// The public web address.
    pub web_public_addr: Option<Addr>,
    /// SSH listener (separate mode).
    pub ssh_listen_addr: Addr,
    /// Where SSH clients connect, if not the listen address.
    pub ssh_public_addr: Option<Addr>,
    /// Reverse tunnel listener (separate mode).
    pub tunnel_listen_addr: Addr,
    /// Where agents dial their tunnel (separate mode), if not derived.
    pub tunnel_public_addr: Option<Addr>,
    /// Wins over every other tunnel address (`SVC_TUNNEL_PUBLIC_ADDR`).
    pub tunnel_public_addr_override: Option<Addr>,
    /// Whether Kubernetes access is served (the proxy's Kubernetes route is mounted on the web
    /// port in both modes, so a Proxy Service built from a configuration always sets it).
    pub kube_enabled: bool,
    /// Kubernetes listener (separate mode).
    pub kube_listen_addr: Option<Addr>,
    /// Where Kubernetes clients connect.
    pub kube_public_addr: Option<Addr>,
    /// The database listeners (separate mode; Postgres is otherwise multiplexed on the web
    /// port) and where database clients connect, as configured.
    pub db: svc_core::config::ProxyDbAddrs,
    /// Whether the cluster runs automatic agent updates.
    pub automatic_upgrades: bool,
    /// How long the proxy waits when dialing resources.
    pub dial_timeout: Duration,
    /// The authentication type (`auth.type`).
    pub auth_type: String,
    /// The second factor (`auth.second_factor`): `off`, the only one svc implements (sign-in
    /// is by password; a factor that does not exist is never advertised).
    pub second_factor: String,
    /// The local connector's name (`auth.local.name`).
    pub local_auth_connector: String,
}

fn loopback(port: u16) -> Addr {
    Addr::new(svc_core::Host::V4(std::net::Ipv4Addr::LOCALHOST), port)
}

impl Default for PingSettings {
    fn default() -> Self {
        PingSettings {
            cluster_name: "svc.local".into(),
            listener_mode: ListenerMode::default(),
            web_listen_addr: loopback(3080),
            web_public_addr: None,
            ssh_listen_addr: loopback(3023),
            ssh_public_addr: None,
            tunnel_listen_addr: loopback(3024),
            tunnel_public_addr: None,
            tunnel_public_addr_override: None,
            kube_enabled: false,
            kube_listen_addr: None,
            kube_public_addr: None,
            db: svc_core::config::ProxyDbAddrs::default(),
            automatic_upgrades: false,
            dial_timeout: Duration::from_secs(30),
            auth_type: "local".into(),
            second_factor: SECOND_FACTOR_OFF.into(),
            local_auth_connector: String::new(),
        }
    }
}

/// `GET /webapi/ping` and `GET /webapi/find` as a `tower::Service<http::Request<B>>`, answered
/// from bytes serialized once. Other methods get 405, other paths 404 (JSON errors).
#[derive(Debug, Clone)]
pub struct PingService {
    ping: Bytes,
    find: Bytes,
}

impl PingService {
    /// Serves the documents for `settings` and the proxy's `version`.
    pub fn new(settings: &PingSettings, version: &Version) -> Self {
        // Serializing plain structs of strings and numbers cannot fail.
        let ser = |v: serde_json::Result<Vec<u8>>| Bytes::from(v.unwrap_or_default());
        PingService {
            ping: ser(serde_json::to_vec(&ping(settings, version))),
            find: ser(serde_json::to_vec(&find(settings, version))),
        }
    }

    /// The ping document served.
    pub fn ping_body(&self) -> &Bytes {
        &self.ping
    }

    /// The answer for `method` and `path`.
    pub fn answer(&self, method: &Method, path: &str) -> Response<ResponseBody> {
        let body = match path {
            PING_PATH => &self.ping,
            FIND_PATH => &self.find,
            _ => return json_error(StatusCode::NOT_FOUND, &format!("not found: {path}")),
        };
        if method != Method::GET && method != Method::HEAD {
            return json_error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method {method} not allowed on {path}; use GET"),
            );
        }
        let mut resp = Response::new(full(body.clone()));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        resp
    }
}

impl<B> tower::Service<Request<B>> for PingService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Ready<Result<Response<ResponseBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        ready(Ok(self.answer(req.method(), req.uri().path())))
    }
}

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
    /// `off`: svc signs in by password alone.
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
    /// Where clients reach it: `proxy_service.kube_public_addr`, else (separate mode) the
    /// Kubernetes listener, else the public web address.
    pub public_addr: String,
    /// Where the proxy listens for it: the Kubernetes listener in separate mode when set, else
    /// the web listener (the Kubernetes route on the web port).
    pub listen_addr: String,
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
    /// Where the proxy listens for MySQL: its own listener in separate mode when set, else the
    /// web listener (ALPN routing).
    pub mysql_listen_addr: String,
    /// Where MySQL clients connect.
    pub mysql_public_addr: String,
    /// Where the proxy listens for MongoDB: its own listener in separate mode when set, else
    /// the web listener (ALPN routing).
    pub mongo_listen_addr: String,
    /// Where MongoDB clients connect.
    pub mongo_public_addr: String,
    /// Where the proxy listens for Redis (separate mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_listen_addr: Option<String>,
    /// Where Redis clients connect.
    pub redis_public_addr: String,
}

/// Where agents dial their tunnel: `override_addr` (the
/// `SVC_TUNNEL_PUBLIC_ADDR` environment variable, read by the caller) wins; with TLS routing the
/// public web address; otherwise the tunnel public address, else the SSH public address with
/// port 3024, else the tunnel listen address.
pub fn tunnel_public_addr(settings: &PingSettings, override_addr: Option<&Addr>) -> Addr {
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
                .map(|a| a.with_port(ports::PROXY_TUNNEL))
        })
        .unwrap_or_else(|| settings.tunnel_listen_addr.clone())
}

/// Derives the `proxy` member from the settings (listen addresses as bound).
pub(crate) fn proxy_ping(settings: &PingSettings) -> ProxyPing {
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
                public_addr: s
                    .kube_public_addr
                    .as_ref()
                    .map_or_else(|| web_public.clone(), ToString::to_string),
                listen_addr: web_listen.clone(),
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
                mysql_listen_addr: web_listen.clone(),
                mysql_public_addr: web_public.clone(),
                mongo_listen_addr: web_listen,
                mongo_public_addr: web_public.clone(),
                redis_listen_addr: None,
                redis_public_addr: web_public,
            },
            tls_routing_enabled: true,
        }
    } else {
        let listen_or_web = |listen: &Option<Addr>| {
            listen
                .as_ref()
                .map_or_else(|| web_listen.clone(), ToString::to_string)
        };
        ProxyPing {
            kube: KubePing {
                // The Kubernetes route on the web port is live in this mode too.
                enabled: s.kube_enabled,
                public_addr: public_or(&s.kube_public_addr, &s.kube_listen_addr)
                    .unwrap_or_else(|| web_public.clone()),
                listen_addr: listen_or_web(&s.kube_listen_addr),
            },
            ssh: SshPing {
                listen_addr: s.ssh_listen_addr.to_string(),
                tunnel_listen_addr: s.tunnel_listen_addr.to_string(),
                web_listen_addr: web_listen.clone(),
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
                postgres_public_addr: public_or(&s.db.postgres_public_addr, &s.db.postgres_listen_addr)
                    .unwrap_or_else(|| web_public.clone()),
                mysql_listen_addr: listen_or_web(&s.db.mysql_listen_addr),
                mysql_public_addr: public_or(&s.db.mysql_public_addr, &s.db.mysql_listen_addr)
                    .unwrap_or_else(|| web_public.clone()),
                mongo_listen_addr: listen_or_web(&s.db.mongo_listen_addr),
                mongo_public_addr: public_or(&s.db.mongo_public_addr, &s.db.mongo_listen_addr)
                    .unwrap_or_else(|| web_public.clone()),
                redis_listen_addr: s.db.redis_listen_addr.as_ref().map(ToString::to_string),
                redis_public_addr: public_or(&s.db.redis_public_addr, &s.db.redis_listen_addr)
                    .unwrap_or(web_public),
            },
            tls_routing_enabled: false,
        }
    }
}

/// The whole ping document.
pub fn ping(settings: &PingSettings, version: &Version) -> Ping {
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
pub fn find(settings: &PingSettings, version: &Version) -> Find {
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

    fn addr(s: &str) -> Addr {
        s.parse().unwrap()
    }

    #[test]
    fn tunnel_address_rule() {
        let mut s = PingSettings::default();
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
        let mut s = PingSettings {
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
        assert_eq!(v["proxy"]["db"]["redis_public_addr"], "proxy.example.com:443");
        assert!(v["proxy"]["db"].get("redis_listen_addr").is_none());
        assert_eq!(v["proxy"]["ssh"]["dial_timeout"], 30_000_000_000u64);
        assert_eq!(v["auth"]["type"], "local");
        assert_eq!(v["auth"]["second_factor"], "off");
        // The specification's members are present in both modes.
        assert_eq!(v["proxy"]["kube"]["enabled"], false);
        assert_eq!(v["proxy"]["kube"]["public_addr"], "proxy.example.com:443");
        assert_eq!(v["proxy"]["kube"]["listen_addr"], "127.0.0.1:3080");
        assert_eq!(v["proxy"]["db"]["mysql_listen_addr"], "127.0.0.1:3080");
        s.kube_enabled = true;
        s.kube_public_addr = Some(addr("kube.example.com:443"));
        let v = serde_json::to_value(ping(&s, &Version::new(17, 1, 0))).unwrap();
        assert_eq!(v["proxy"]["kube"]["enabled"], true);
        assert_eq!(v["proxy"]["kube"]["public_addr"], "kube.example.com:443");
        s.kube_public_addr = None;

        s.listener_mode = ListenerMode::Separate;
        s.db.mysql_listen_addr = Some(addr("0.0.0.0:3036"));
        let v = serde_json::to_value(ping(&s, &Version::new(17, 1, 0))).unwrap();
        assert_eq!(v["proxy"]["tls_routing_enabled"], false);
        assert_eq!(v["proxy"]["ssh"]["listen_addr"], "127.0.0.1:3023");
        assert_eq!(v["proxy"]["ssh"]["tunnel_listen_addr"], "127.0.0.1:3024");
        assert_eq!(v["proxy"]["ssh"]["ssh_tunnel_public_addr"], "127.0.0.1:3024");
        assert_eq!(v["proxy"]["db"]["mysql_listen_addr"], "0.0.0.0:3036");
        assert_eq!(v["proxy"]["db"]["mysql_public_addr"], "0.0.0.0:3036");
        assert_eq!(v["proxy"]["db"]["redis_public_addr"], "proxy.example.com:443");
        s.db.redis_listen_addr = Some(addr("0.0.0.0:6379"));
        let v = serde_json::to_value(ping(&s, &Version::new(17, 1, 0))).unwrap();
        assert_eq!(v["proxy"]["db"]["redis_listen_addr"], "0.0.0.0:6379");
        assert_eq!(v["proxy"]["db"]["redis_public_addr"], "0.0.0.0:6379");
        s.db.redis_public_addr = Some(addr("redis.example.com:6379"));
        let v = serde_json::to_value(ping(&s, &Version::new(17, 1, 0))).unwrap();
        assert_eq!(v["proxy"]["db"]["redis_public_addr"], "redis.example.com:6379");
        assert_eq!(v["proxy"]["db"]["mongo_listen_addr"], "127.0.0.1:3080");
        assert_eq!(v["proxy"]["kube"]["enabled"], true);
        assert_eq!(v["proxy"]["kube"]["listen_addr"], "127.0.0.1:3080");
        assert_eq!(v["proxy"]["kube"]["public_addr"], "proxy.example.com:443");
        s.kube_listen_addr = Some(addr("0.0.0.0:3026"));
        let v = serde_json::to_value(ping(&s, &Version::new(17, 1, 0))).unwrap();
        assert_eq!(v["proxy"]["kube"]["listen_addr"], "0.0.0.0:3026");
        assert_eq!(v["proxy"]["kube"]["public_addr"], "0.0.0.0:3026");
        let f = serde_json::to_value(find(&s, &Version::new(17, 1, 0))).unwrap();
        assert!(f.get("auth").is_none());
        assert_eq!(f["proxy"], v["proxy"]);
    }

    #[test]
    fn the_service_answers_get_and_head_refuses_other_methods_and_paths() {
        let svc = PingService::new(&PingSettings::default(), &Version::new(17, 1, 0));
        let ok = svc.answer(&Method::GET, PING_PATH);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[header::CONTENT_TYPE], "application/json");
        let v: serde_json::Value = serde_json::from_slice(svc.ping_body()).unwrap();
        assert_eq!(v["cluster_name"], "svc.local");
        assert_eq!(svc.answer(&Method::HEAD, FIND_PATH).status(), StatusCode::OK);
        assert_eq!(
            svc.answer(&Method::POST, PING_PATH).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            svc.answer(&Method::GET, "/webapi/pingx").status(),
            StatusCode::NOT_FOUND
        );
    }
}

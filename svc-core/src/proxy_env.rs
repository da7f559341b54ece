//! The proxy environment: which HTTP CONNECT proxy (if any) a dial to a target goes through.
//!
//! This is the pure half of outbound dialing. `svc-net`'s `dial` module asks [`ProxyEnv::route`]
//! for each target and then either connects directly or opens a CONNECT tunnel through the proxy
//! named here. Nothing in this module touches a socket: the environment is read through an
//! injectable lookup ([`ProxyEnv::from_lookup`]) so tests and embedders can supply their own.
//!
//! Rules (specification §2.2, §7):
//! - `HTTPS_PROXY` / `HTTP_PROXY` (upper case wins over lower case; an empty value is unset) hold
//!   `scheme://[user[:password]@]host:port`; a bare `host:port` gets `http://`. Schemes are `http`
//!   (plain to the proxy) and `https` (TLS to the proxy).
//! - The proxy host must not be `localhost` or `127.0.0.1`: a DNS name or private IP is required.
//! - `NO_PROXY` lists targets that bypass the proxy (see [`NoProxy`]); loopback targets are never
//!   proxied.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use base64::Engine as _;
use ipnet::IpNet;

use crate::{Addr, Host, Secret};

/// How the dialer talks to the proxy itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProxyScheme {
    /// Plain TCP to the proxy.
    Http,
    /// TLS to the proxy (the tunnelled bytes are then inside that TLS session).
    Https,
}

impl ProxyScheme {
    /// The port used when the proxy URL names none: 80 for `http`, 443 for `https`.
    pub fn default_port(self) -> u16 {
        match self {
            ProxyScheme::Http => 80,
            ProxyScheme::Https => 443,
        }
    }

    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyScheme::Http => "http",
            ProxyScheme::Https => "https",
        }
    }
}

/// Credentials for the proxy (`user[:password]` in the URL), percent-decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyCredentials {
    user: String,
    password: Option<Secret>,
}

impl ProxyCredentials {
    /// Credentials from their parts.
    pub fn new(user: impl Into<String>, password: Option<Secret>) -> Self {
        Self {
            user: user.into(),
            password,
        }
    }

    /// The user name (not secret; shown in diagnostics).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password, if the URL carried one.
    pub fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// The value of the `Proxy-Authorization` header: `Basic base64(user:password)`.
    ///
    /// Returned as a [`Secret`]: the header carries the password in a reversible encoding.
    pub fn basic_authorization(&self) -> Secret {
        let password = self.password.as_ref().map_or("", |p| p.expose().as_str());
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", self.user, password));
        Secret::new(format!("Basic {token}"))
    }
}

/// Prints `user:***` (or `user` when there is no password), never the password.
impl fmt::Debug for ProxyCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ProxyCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.password {
            Some(_) => write!(f, "{}:***", self.user),
            None => f.write_str(&self.user),
        }
    }
}

/// A parsed proxy URL: scheme, address and optional credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    scheme: ProxyScheme,
    addr: Addr,
    credentials: Option<ProxyCredentials>,
}

impl ProxyUrl {
    /// Parses the value of a proxy variable; `var` names the variable in errors.
    ///
    /// Accepts `scheme://[user[:password]@]host[:port][/]` and bare `host[:port]` (taken as
    /// `http`). The port defaults to the scheme's. Rejects other schemes, paths, queries and a
    /// proxy host of `localhost` or `127.0.0.1` (or `::1`).
    pub fn parse(var: &str, value: &str) -> Result<Self, ProxyEnvError> {
        let invalid = |reason: String| ProxyEnvError::InvalidProxyUrl {
            var: var.to_owned(),
            value: redact_url(value),
            reason,
        };
        let value = value.trim();
        let (scheme, rest) = match value.split_once("://") {
            Some((scheme, rest)) => {
                let scheme = match scheme.to_ascii_lowercase().as_str() {
                    "http" => ProxyScheme::Http,
                    "https" => ProxyScheme::Https,
                    _ => {
                        return Err(ProxyEnvError::UnsupportedScheme {
                            var: var.to_owned(),
                            scheme: scheme.to_owned(),
                        });
                    }
                };
                (scheme, rest)
            }
            None => (ProxyScheme::Http, value),
        };
        // A single trailing slash is common (`http://proxy:3128/`); anything else after the
        // authority would be silently ignored by a CONNECT proxy, so refuse it.
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err(invalid(
                "expected scheme://[user[:password]@]host:port without a path".into(),
            ));
        }
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        let credentials = match userinfo {
            None => None,
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                let user = percent_decode(user).map_err(|e| invalid(format!("proxy user name: {e}")))?;
                if user.is_empty() {
                    return Err(invalid("empty user name before '@'".into()));
                }
                let password = password
                    .map(|p| percent_decode(p).map(Secret::new))
                    .transpose()
                    .map_err(|e| invalid(format!("proxy password: {e}")))?;
                Some(ProxyCredentials { user, password })
            }
        };
        let addr = Addr::parse_with_default_port(hostport, scheme.default_port())
            .map_err(|e| invalid(e.reason().to_owned()))?;
        if is_forbidden_proxy_host(addr.host()) {
            return Err(ProxyEnvError::LoopbackProxy {
                var: var.to_owned(),
                host: addr.host().to_string(),
            });
        }
        Ok(Self {
            scheme,
            addr,
            credentials,
        })
    }

    /// A proxy URL from its parts, with the same host rule as [`ProxyUrl::parse`].
    pub fn new(
        scheme: ProxyScheme,
        addr: Addr,
        credentials: Option<ProxyCredentials>,
    ) -> Result<Self, ProxyEnvError> {
        if is_forbidden_proxy_host(addr.host()) {
            return Err(ProxyEnvError::LoopbackProxy {
                var: "proxy".to_owned(),
                host: addr.host().to_string(),
            });
        }
        Ok(Self {
            scheme,
            addr,
            credentials,
        })
    }

    /// Plain or TLS to the proxy.
    pub fn scheme(&self) -> ProxyScheme {
        self.scheme
    }

    /// The proxy's host and port.
    pub fn addr(&self) -> &Addr {
        &self.addr
    }

    /// The credentials, if any.
    pub fn credentials(&self) -> Option<&ProxyCredentials> {
        self.credentials.as_ref()
    }
}

/// Prints `scheme://user:***@host:port`: safe for logs.
impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme.as_str())?;
        if let Some(c) = &self.credentials {
            write!(f, "{c}@")?;
        }
        write!(f, "{}", self.addr)
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProxyUrl({self})")
    }
}

/// The specification forbids `localhost` and `127.0.0.1` as the proxy host; `::1` is the same
/// host in IPv6, so it goes with them.
fn is_forbidden_proxy_host(host: &Host) -> bool {
    match host {
        Host::Name(n) => n == "localhost",
        Host::V4(ip) => *ip == Ipv4Addr::LOCALHOST,
        Host::V6(ip) => *ip == Ipv6Addr::LOCALHOST || ip.to_ipv4_mapped() == Some(Ipv4Addr::LOCALHOST),
    }
}

/// Replaces the user information of a URL with `***` so an error can quote the rest.
fn redact_url(value: &str) -> String {
    let (prefix, rest) = match value.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), value),
    };
    // Everything up to the last '@' may be a credential: a password may hold '/', '?', '#'
    // or '@' (unescaped, as people write them), so the path is no boundary. A proxy URL has no
    // path worth quoting, and redacting one by mistake costs nothing.
    match rest.rfind('@') {
        Some(at) => format!("{prefix}***{}", &rest[at..]),
        None => value.to_owned(),
    }
}

/// Decodes `%XX` escapes (RFC 3986 userinfo). Hand-written because it is ten lines and the
/// workspace has no URL crate; invalid escapes and non-UTF-8 results are errors.
fn percent_decode(input: &str) -> Result<String, &'static str> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("'%' must be followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-decoded text is not UTF-8")
}

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// `*`: every target.
    Any,
    /// An IP address or network.
    Net(IpNet),
    /// `host`: the name itself and its subdomains.
    Domain(String),
    /// `.host` / `*.host`: subdomains only.
    Subdomains(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    pattern: Pattern,
    port: Option<u16>,
}

/// The `NO_PROXY` matcher: which targets bypass the proxy.
///
/// A comma-separated list (white space around entries ignored, case-insensitive) of:
/// `*` (everything); an IP address (`10.1.2.3`, `::1`, `[::1]`); a CIDR of any prefix length
/// (`10.0.0.0/8`, `fd00::/8`); `host` (the name itself and its subdomains); `.host` or `*.host`
/// (subdomains only). Each entry may end in `:port`, which must then match exactly; IPv6 takes a
/// port only in brackets (`[::1]:443`, `[fd00::/8]:443`).
///
/// Entries that fit none of these forms are kept in [`NoProxy::ignored`] rather than failing:
/// `NO_PROXY` is shared with other tools (curl, Go, Python) that accept forms of their own, and an
/// agent must not refuse to start over one of them. The caller logs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoProxy {
    entries: Vec<Entry>,
    ignored: Vec<String>,
}

impl NoProxy {
    /// Parses a `NO_PROXY` value. Never fails; see [`NoProxy::ignored`].
    pub fn parse(value: &str) -> Self {
        let mut out = Self::default();
        for raw in value.split(',') {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            match parse_entry(&raw.to_ascii_lowercase()) {
                Some(entry) => out.entries.push(entry),
                None => out.ignored.push(raw.to_owned()),
            }
        }
        out
    }

    /// Entries that were not understood and therefore match nothing.
    pub fn ignored(&self) -> &[String] {
        &self.ignored
    }

    /// Whether the list is empty (nothing bypasses the proxy except loopback).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `target` bypasses the proxy.
    ///
    /// Names are compared with names and IPs with IPs: no DNS lookup happens here, so
    /// `10.0.0.0/8` does not match a name that would resolve into it.
    pub fn matches(&self, target: &Addr) -> bool {
        self.entries.iter().any(|e| entry_matches(e, target))
    }
}

fn entry_matches(entry: &Entry, target: &Addr) -> bool {
    if entry.port.is_some_and(|p| p != target.port()) {
        return false;
    }
    match (&entry.pattern, target.host()) {
        (Pattern::Any, _) => true,
        (Pattern::Net(net), host) => host.ip().is_some_and(|ip| net.contains(&canonical(ip))),
        (Pattern::Domain(d), Host::Name(name)) => name == d || is_strict_subdomain(name, d),
        (Pattern::Subdomains(d), Host::Name(name)) => is_strict_subdomain(name, d),
        (Pattern::Domain(_) | Pattern::Subdomains(_), _) => false,
    }
}

/// `a.b.example.com` is a subdomain of `example.com`; `badexample.com` is not.
fn is_strict_subdomain(name: &str, domain: &str) -> bool {
    name.len() > domain.len() + 1
        && name.ends_with(domain)
        && name.as_bytes()[name.len() - domain.len() - 1] == b'.'
}

/// An IPv4-mapped IPv6 address is compared as the IPv4 address it carries.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn parse_entry(raw: &str) -> Option<Entry> {
    if raw == "*" {
        return Some(Entry {
            pattern: Pattern::Any,
            port: None,
        });
    }
    // `[v6]`, `[v6]:port`, `[v6/len]:port`.
    if let Some(inner) = raw.strip_prefix('[') {
        let (inside, after) = inner.split_once(']')?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(after.strip_prefix(':')?)?),
        };
        return Some(Entry {
            pattern: Pattern::Net(parse_net(inside)?),
            port,
        });
    }
    // A bare IP or a CIDR without a port (`::1`, `fd00::/8`, `10.0.0.0/8`).
    if let Some(net) = parse_net(raw) {
        return Some(Entry {
            pattern: Pattern::Net(net),
            port: None,
        });
    }
    // Everything else may end in `:port`; more than one ':' outside brackets is a bare IPv6
    // address with a bad form, not a host with a port.
    let (body, port) = match raw.rsplit_once(':') {
        Some((body, port)) if !body.contains(':') => (body, Some(parse_port(port)?)),
        Some(_) => return None,
        None => (raw, None),
    };
    if let Some(net) = parse_net(body) {
        return Some(Entry {
            pattern: Pattern::Net(net),
            port,
        });
    }
    let (subdomains_only, name) = if let Some(rest) = body.strip_prefix("*.") {
        (true, rest)
    } else if let Some(rest) = body.strip_prefix('.') {
        (true, rest)
    } else {
        (false, body)
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    // Only names that `Host` would accept as a DNS name: a wildcard in the middle or an IPv6 zone
    // (`::1%25.example.com`) is not a name and must not be matched as one.
    match Host::parse(name).ok()? {
        Host::Name(n) => Some(Entry {
            pattern: if subdomains_only {
                Pattern::Subdomains(n)
            } else {
                Pattern::Domain(n)
            },
            port,
        }),
        _ => None,
    }
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_net(s: &str) -> Option<IpNet> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(IpNet::from(canonical(ip)));
    }
    let net: IpNet = s.parse().ok()?;
    // `::ffff:10.0.0.0/104` is the IPv4 network 10.0.0.0/8.
    match net {
        IpNet::V6(v6) => match v6.network().to_ipv4_mapped() {
            Some(v4) if v6.prefix_len() >= 96 => {
                ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).ok().map(IpNet::V4)
            }
            _ => Some(net.trunc()),
        },
        IpNet::V4(_) => Some(net.trunc()),
    }
}

/// Loopback targets are never proxied: a proxy would reach its own loopback, not ours.
pub(crate) fn is_never_proxied(target: &Addr) -> bool {
    target.is_loopback()
}

/// Which way a dial to one target goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// Connect to the target directly.
    Direct,
    /// Open a CONNECT tunnel through this proxy.
    Proxy(&'a ProxyUrl),
}

/// The proxy settings of the process: `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyEnv {
    https_proxy: Option<ProxyUrl>,
    http_proxy: Option<ProxyUrl>,
    no_proxy: NoProxy,
}

impl ProxyEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ProxyEnvError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (called with `HTTPS_PROXY`, `https_proxy`, …).
    ///
    /// Upper case wins over lower case; an empty value counts as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ProxyEnvError> {
        let get = |upper: &'static str| -> Option<(&'static str, String)> {
            let lower = match upper {
                "HTTPS_PROXY" => "https_proxy",
                "HTTP_PROXY" => "http_proxy",
                _ => "no_proxy",
            };
            [upper, lower]
                .into_iter()
                .find_map(|name| lookup(name).filter(|v| !v.trim().is_empty()).map(|v| (name, v)))
        };
        let parse = |found: Option<(&str, String)>| {
            found
                .map(|(name, value)| ProxyUrl::parse(name, &value))
                .transpose()
        };
        Ok(Self {
            https_proxy: parse(get("HTTPS_PROXY"))?,
            http_proxy: parse(get("HTTP_PROXY"))?,
            no_proxy: get("NO_PROXY")
                .map(|(_, v)| NoProxy::parse(&v))
                .unwrap_or_default(),
        })
    }

    /// Settings from explicit values (configuration rather than environment).
    pub fn new(https_proxy: Option<ProxyUrl>, http_proxy: Option<ProxyUrl>, no_proxy: NoProxy) -> Self {
        Self {
            https_proxy,
            http_proxy,
            no_proxy,
        }
    }

    /// The `HTTPS_PROXY` value.
    pub fn https_proxy(&self) -> Option<&ProxyUrl> {
        self.https_proxy.as_ref()
    }

    /// The `HTTP_PROXY` value.
    pub fn http_proxy(&self) -> Option<&ProxyUrl> {
        self.http_proxy.as_ref()
    }

    /// The `NO_PROXY` matcher.
    pub fn no_proxy(&self) -> &NoProxy {
        &self.no_proxy
    }

    /// The proxy a CONNECT tunnel to `target` uses: `HTTPS_PROXY` if set, else `HTTP_PROXY`.
    ///
    /// Every svc connection (reverse tunnel, trust establishment, version checks) carries TLS
    /// end to end, so `HTTPS_PROXY` is preferred; `HTTP_PROXY` is the fallback because many
    /// hosts set only that one. Loopback targets and targets matched by `NO_PROXY` go direct.
    pub fn route(&self, target: &Addr) -> Route<'_> {
        if is_never_proxied(target) || self.no_proxy.matches(target) {
            return Route::Direct;
        }
        match self.https_proxy.as_ref().or(self.http_proxy.as_ref()) {
            Some(p) => Route::Proxy(p),
            None => Route::Direct,
        }
    }
}

/// Why the proxy environment is invalid. Messages name the variable and never show a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyEnvError {
    /// The scheme is not `http` or `https`.
    #[error("{var}: unsupported proxy scheme \"{scheme}\", expected http or https")]
    UnsupportedScheme {
        /// The variable (`HTTPS_PROXY`, `http_proxy`, …).
        var: String,
        /// The scheme found.
        scheme: String,
    },
    /// The URL does not have the form `scheme://[user[:password]@]host:port`.
    #[error("{var}: invalid proxy URL \"{value}\": {reason}")]
    InvalidProxyUrl {
        /// The variable.
        var: String,
        /// The value, with any credentials replaced by `***`.
        value: String,
        /// What was wrong.
        reason: String,
    },
    /// The proxy host is `localhost` or `127.0.0.1`.
    #[error(
        "{var}: proxy host {host} is not allowed, use the proxy's DNS name or private IP address \
         instead of localhost or 127.0.0.1"
    )]
    LoopbackProxy {
        /// The variable.
        var: String,
        /// The host found.
        host: String,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<ProxyEnv, ProxyEnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ProxyEnv::from_lookup(|name| map.get(name).cloned())
    }

    fn addr(s: &str) -> Addr {
        Addr::parse(s).unwrap()
    }

    #[test]
    fn parses_proxy_urls() {
        let p = ProxyUrl::parse("HTTPS_PROXY", "http://u%40corp:p%3Ass@proxy.corp:3128/").unwrap();
        assert_eq!(p.scheme(), ProxyScheme::Http);
        assert_eq!(p.addr(), &addr("proxy.corp:3128"));
        let c = p.credentials().unwrap();
        assert_eq!(c.user(), "u@corp");
        assert_eq!(c.password().unwrap().expose(), "p:ss");
        assert_eq!(p.to_string(), "http://u@corp:***@proxy.corp:3128");
        assert!(!format!("{p:?}").contains("p:ss"));
        assert_eq!(
            c.basic_authorization().expose(),
            "Basic dUBjb3JwOnA6c3M=" // base64("u@corp:p:ss")
        );

        let p = ProxyUrl::parse("HTTP_PROXY", "proxy.corp:8080").unwrap();
        assert_eq!(p.scheme(), ProxyScheme::Http);
        assert_eq!(p.to_string(), "http://proxy.corp:8080");

        assert_eq!(
            ProxyUrl::parse("V", "https://10.0.0.5").unwrap().addr().port(),
            443
        );
        assert_eq!(ProxyUrl::parse("V", "HTTP://10.0.0.5").unwrap().addr().port(), 80);
        assert_eq!(
            ProxyUrl::parse("V", "http://[fd00::1]:3128")
                .unwrap()
                .addr()
                .to_string(),
            "[fd00::1]:3128"
        );
        let p = ProxyUrl::parse("V", "http://alice@proxy:1").unwrap();
        assert_eq!(p.to_string(), "http://alice@proxy:1");
        assert_eq!(
            p.credentials().unwrap().basic_authorization().expose(),
            "Basic YWxpY2U6"
        );
    }

    #[test]
    fn rejects_bad_proxy_urls_naming_the_variable() {
        let e = ProxyUrl::parse("HTTPS_PROXY", "socks5://proxy:1080").unwrap_err();
        assert_eq!(
            e.to_string(),
            "HTTPS_PROXY: unsupported proxy scheme \"socks5\", expected http or https"
        );
        for host in ["localhost", "127.0.0.1", "[::1]", "LOCALHOST"] {
            let e = ProxyUrl::parse("http_proxy", &format!("http://u:pw@{host}:3128")).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with("http_proxy: proxy host"), "{msg}");
            assert!(msg.contains("DNS name or private IP"), "{msg}");
        }
        for (bad, why) in [
            ("http://u:hunter2@proxy:99999", "port"),
            ("http://u:hunter2@proxy:1/path", "path"),
            ("http://:hunter2@proxy:1", "empty user"),
            ("http://u:hunt%zzer2@proxy:1", "hex"),
            ("http://u:hunter2@", "empty"),
            // Unescaped '/', '?', '#' and '@' in a password: redacted up to the last '@'.
            ("http://u:hun/ter2@proxy:1", "path"),
            ("http://u:hun?ter2@proxy:1", "path"),
            ("http://u:hun#ter2@proxy:1/x", "path"),
            ("http://u:hun@ter2/x@proxy:1", "path"),
        ] {
            let msg = ProxyUrl::parse("HTTPS_PROXY", bad).unwrap_err().to_string();
            assert!(
                msg.starts_with("HTTPS_PROXY: invalid proxy URL \"http://***@"),
                "{msg}"
            );
            assert!(msg.contains(why), "{bad}: {msg}");
            assert!(!msg.contains("hunter2") && !msg.contains("hun"), "{msg}");
            assert!(!msg.contains("ter2"), "{msg}");
        }
    }

    #[test]
    fn upper_case_wins_and_empty_is_unset() {
        let e = env(&[
            ("HTTPS_PROXY", "http://upper:1"),
            ("https_proxy", "http://lower:1"),
            ("HTTP_PROXY", ""),
            ("http_proxy", "http://lowerhttp:2"),
            ("no_proxy", "example.com"),
        ])
        .unwrap();
        assert_eq!(e.https_proxy().unwrap().addr(), &addr("upper:1"));
        assert_eq!(e.http_proxy().unwrap().addr(), &addr("lowerhttp:2"));
        assert!(e.no_proxy().matches(&addr("example.com:443")));
        assert_eq!(env(&[]).unwrap(), ProxyEnv::default());
        let err = env(&[("https_proxy", "ftp://x:1")]).unwrap_err();
        assert!(err.to_string().starts_with("https_proxy: "));
    }

    #[test]
    fn routes_per_target() {
        let e = env(&[
            ("HTTP_PROXY", "http://fallback:3128"),
            ("NO_PROXY", "kube.svc.cluster.local"),
        ])
        .unwrap();
        assert_eq!(
            e.route(&addr("proxy.example.com:3080")),
            Route::Proxy(e.http_proxy().unwrap())
        );
        assert_eq!(e.route(&addr("kube.svc.cluster.local:443")), Route::Direct);
        assert_eq!(e.route(&addr("x.kube.svc.cluster.local:443")), Route::Direct);
        for lo in ["127.0.0.1:3024", "localhost:3080", "[::1]:443", "127.5.5.5:1"] {
            assert_eq!(e.route(&addr(lo)), Route::Direct, "{lo}");
        }
        let e = env(&[("HTTP_PROXY", "http://a:1"), ("HTTPS_PROXY", "https://b:2")]).unwrap();
        assert_eq!(
            e.route(&addr("x.example:3024")).clone(),
            Route::Proxy(e.https_proxy().unwrap())
        );
        assert_eq!(env(&[]).unwrap().route(&addr("x.example:1")), Route::Direct);
    }

    #[test]
    fn no_proxy_table() {
        // (NO_PROXY, target, bypasses)
        let table: &[(&str, &str, bool)] = &[
            ("*", "anything.example:1", true),
            ("*", "10.0.0.1:1", true),
            ("", "example.com:443", false),
            ("example.com", "example.com:443", true),
            ("example.com", "EXAMPLE.com:443", true),
            ("Example.COM.", "a.b.example.com:1", true),
            ("example.com", "badexample.com:443", false),
            ("example.com", "example.com.evil:443", false),
            (".example.com", "example.com:443", false),
            (".example.com", "a.example.com:443", true),
            ("*.example.com", "example.com:443", false),
            ("*.example.com", "a.b.example.com:443", true),
            ("example.com:443", "example.com:443", true),
            ("example.com:443", "example.com:3080", false),
            ("example.com:443", "sub.example.com:443", true),
            ("*.example.com:8443", "a.example.com:443", false),
            ("kube.svc.cluster.local", "kube.svc.cluster.local:443", true),
            ("kube.svc.cluster.local", "x.kube.svc.cluster.local:6443", true),
            ("kube.svc.cluster.local", "svc.cluster.local:443", false),
            ("10.1.2.3", "10.1.2.3:22", true),
            ("10.1.2.3", "10.1.2.4:22", false),
            ("10.1.2.3:22", "10.1.2.3:23", false),
            ("10.0.0.0/8", "10.200.0.1:1", true),
            ("10.0.0.0/8", "11.0.0.1:1", false),
            ("10.0.0.0/8:443", "10.0.0.1:443", true),
            ("10.0.0.0/8:443", "10.0.0.1:80", false),
            ("192.168.1.7/32", "192.168.1.7:1", true),
            ("0.0.0.0/0", "8.8.8.8:1", true),
            ("10.0.0.0/8", "ten.example:1", false),
            ("fd00::/8", "[fd12::1]:1", true),
            ("fd00::/8", "[fe80::1]:1", false),
            ("2001:db8::1", "[2001:db8::1]:443", true),
            ("[2001:db8::1]", "[2001:db8::1]:443", true),
            ("[2001:db8::1]:443", "[2001:db8::1]:443", true),
            ("[2001:db8::1]:443", "[2001:db8::1]:80", false),
            ("[2001:db8::/32]:443", "[2001:db8:1::1]:443", true),
            ("2001:DB8::/127", "[2001:db8::1]:1", true),
            ("::ffff:10.0.0.0/104", "10.9.9.9:1", true),
            ("10.0.0.1", "[::ffff:10.0.0.1]:1", true),
            ("10.0.0.1", "[2001:db8::1]:1", false),
            ("example.com", "10.0.0.1:1", false),
            (" foo.test , bar.test ,, ", "bar.test:1", true),
            ("foo.test,bar.test", "baz.test:1", false),
            ("*.example.com", "[::1]:443", false),
        ];
        for (list, target, want) in table {
            let got = NoProxy::parse(list).matches(&addr(target));
            assert_eq!(got, *want, "NO_PROXY={list:?} target={target}");
        }
    }

    #[test]
    fn zone_ids_are_not_names() {
        // The zone trick: `[::1%25.example.com]` is neither an IPv6 address nor a name under
        // example.com, so it can never become a target that `*.example.com` bypasses.
        let np = NoProxy::parse("*.example.com");
        assert!(Host::parse("[::1%25.example.com]").is_err());
        assert!(Addr::parse("[::1%25.example.com]:443").is_err());
        assert!(Addr::parse("::1%25.example.com:443").is_err());
        // Nor is it accepted as an entry that could match anything.
        let np2 = NoProxy::parse("[::1%25.example.com],::1%25.example.com");
        assert!(np2.is_empty());
        assert_eq!(np2.ignored().len(), 2);
        assert!(!np.matches(&addr("[::1]:443")));
    }

    #[test]
    fn unknown_entries_are_reported_not_fatal() {
        let np = NoProxy::parse("good.test, a*b.test, 10.0.0.0/99, host:port, [::1, :1");
        assert!(np.matches(&addr("good.test:1")));
        assert_eq!(
            np.ignored(),
            ["a*b.test", "10.0.0.0/99", "host:port", "[::1", ":1"]
        );
    }

    proptest! {
        #[test]
        fn random_lists_and_hosts_never_panic(list in "\\PC{0,60}", host in "\\PC{0,30}", port in any::<u16>()) {
            let np = NoProxy::parse(&list);
            if let Ok(h) = Host::parse(&host) {
                let _ = np.matches(&Addr::new(h, port));
            }
            let _ = ProxyUrl::parse("HTTPS_PROXY", &list);
        }

        #[test]
        fn a_host_entry_matches_its_subdomains(
            domain in "[a-z][a-z0-9]{0,8}(\\.[a-z][a-z0-9]{0,8}){0,3}",
            sub in "[a-z0-9][a-z0-9-]{0,8}[a-z0-9]",
            port in any::<u16>(),
        ) {
            let sub_host = format!("{sub}.{domain}");
            let np = NoProxy::parse(&domain);
            prop_assert!(np.matches(&Addr::new(Host::parse(&domain).unwrap(), port)));
            prop_assert!(np.matches(&Addr::new(Host::parse(&sub_host).unwrap(), port)));
            let dotted = NoProxy::parse(&format!(".{domain}"));
            prop_assert!(!dotted.matches(&Addr::new(Host::parse(&domain).unwrap(), port)));
            prop_assert!(dotted.matches(&Addr::new(Host::parse(&sub_host).unwrap(), port)));
            // A name that merely ends with the same letters is not a subdomain.
            let glued = format!("{sub}{domain}");
            prop_assert!(!np.matches(&Addr::new(Host::parse(&glued).unwrap(), port)));
        }

        #[test]
        fn cidr_matches_its_addresses(ip in any::<Ipv4Addr>(), len in 0u8..=32) {
            let net = ipnet::Ipv4Net::new(ip, len).unwrap().trunc();
            let np = NoProxy::parse(&net.to_string());
            prop_assert!(np.matches(&Addr::new(Host::V4(ip), 1)));
        }

        #[test]
        fn debug_never_shows_password(pw in "[a-zA-Z0-9]{6,20}") {
            let p = ProxyUrl::parse("HTTPS_PROXY", &format!("http://user:{pw}@proxy.test:3128")).unwrap();
            let shown = format!("{p:?} {p}");
            prop_assert!(!shown.contains(&pw));
            let e = ProxyEnv::new(Some(p), None, NoProxy::default());
            let shown = format!("{e:?}");
            prop_assert!(!shown.contains(&pw));
        }
    }
}

//! One host:port type for every address in the cluster.
//!
//! An [`Addr`] is a DNS name, an IPv4 address or an IPv6 address, and a port. IPv6 is written in
//! brackets when a port follows (`[::1]:3080`). Each use has its own default port (3080 for the
//! web listener, 3024 for tunnels, …), so [`Addr::parse_with_default_port`] takes it as an argument
//! rather than this module guessing.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    str::FromStr,
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The host part of an [`Addr`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, stored in lower case without a trailing dot.
    Name(String),
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// An IPv6 address (written without brackets here).
    V6(Ipv6Addr),
}

impl Host {
    /// Parses a host: an IPv4 address, an IPv6 address (with or without brackets), or a DNS name.
    pub fn parse(input: &str) -> Result<Self, AddrError> {
        let err = |reason: &'static str| AddrError {
            input: input.to_owned(),
            reason,
        };
        if input.is_empty() {
            return Err(err("empty host"));
        }
        if input.chars().any(char::is_whitespace) {
            return Err(err("white space is not allowed"));
        }
        if let Some(inner) = input.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or_else(|| err("unclosed '['"))?;
            return inner
                .parse()
                .map(Host::V6)
                .map_err(|_| err("not an IPv6 address inside brackets"));
        }
        if let Ok(ip) = input.parse::<IpAddr>() {
            return Ok(Host::from(ip));
        }
        let name = input.strip_suffix('.').unwrap_or(input).to_ascii_lowercase();
        validate_dns_name(&name).map_err(err)?;
        Ok(Host::Name(name))
    }

    /// The IP address, when the host is one.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Host::Name(_) => None,
            Host::V4(ip) => Some(IpAddr::V4(*ip)),
            Host::V6(ip) => Some(IpAddr::V6(*ip)),
        }
    }

    /// Whether this host is a loopback address or the name `localhost` (or a name under it).
    pub fn is_loopback(&self) -> bool {
        match self {
            Host::Name(n) => n == "localhost" || n.ends_with(".localhost"),
            Host::V4(ip) => ip.is_loopback(),
            Host::V6(ip) => ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        }
    }
}

impl From<IpAddr> for Host {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Host::V4(v4),
            IpAddr::V6(v6) => Host::V6(v6),
        }
    }
}

/// Writes the host as it goes into a URL authority: IPv6 in brackets.
impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::V4(ip) => write!(f, "{ip}"),
            Host::V6(ip) => write!(f, "[{ip}]"),
        }
    }
}

fn validate_dns_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty host");
    }
    if name.len() > 253 {
        return Err("DNS name longer than 253 characters");
    }
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label in DNS name");
        }
        if label.len() > 63 {
            return Err("DNS label longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("DNS names may contain only letters, digits, '-', '_' and '.'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a DNS label may not start or end with '-'");
        }
        last = label;
    }
    // `1.2.3` or `300.1.1.1` is a mistyped IP address, not a name.
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err("neither a valid IP address nor a DNS name");
    }
    Ok(())
}

/// A host and a port: `proxy.example.com:443`, `10.0.0.1:3024`, `[::1]:3080`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Addr {
    host: Host,
    port: u16,
}

/// Why a string is not an [`Addr`] or [`Host`]. The message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address \"{input}\": {reason}")]
pub struct AddrError {
    input: String,
    reason: &'static str,
}

impl AddrError {
    /// The rejected input.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What was wrong with it.
    pub fn reason(&self) -> &str {
        self.reason
    }
}

impl Addr {
    /// An address from its parts.
    pub fn new(host: Host, port: u16) -> Self {
        Self { host, port }
    }

    /// Parses `host:port`; the port is required.
    pub fn parse(input: &str) -> Result<Self, AddrError> {
        match Self::split(input)? {
            (host, Some(port)) => Ok(Self { host, port }),
            (_, None) => Err(AddrError {
                input: input.to_owned(),
                reason: "missing port",
            }),
        }
    }

    /// Parses `host` or `host:port`, using `default_port` when no port is given.
    ///
    /// A bare IPv6 address (`::1`) is accepted and gets the default port; with a port it must be
    /// bracketed (`[::1]:3080`).
    pub fn parse_with_default_port(input: &str, default_port: u16) -> Result<Self, AddrError> {
        let (host, port) = Self::split(input)?;
        Ok(Self {
            host,
            port: port.unwrap_or(default_port),
        })
    }

    fn split(input: &str) -> Result<(Host, Option<u16>), AddrError> {
        let err = |reason: &'static str| AddrError {
            input: input.to_owned(),
            reason,
        };
        if input.is_empty() {
            return Err(err("empty address"));
        }
        if input.chars().any(char::is_whitespace) {
            return Err(err("white space is not allowed"));
        }
        if input.contains("://") {
            return Err(err("expected host:port without a scheme"));
        }
        if input.contains('/') {
            return Err(err("expected host:port without a path"));
        }
        let (host, port) = if input.starts_with('[') {
            let close = input.find(']').ok_or_else(|| err("unclosed '['"))?;
            let (host, rest) = input.split_at(close + 1);
            match rest {
                "" => (host, None),
                _ => match rest.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(err("unexpected text after ']'")),
                },
            }
        } else if input.matches(':').count() > 1 {
            // A bare IPv6 address cannot carry a port.
            (input, None)
        } else {
            match input.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (input, None),
            }
        };
        let port = port
            .map(|p| match p.parse::<u16>() {
                Ok(port) if !p.starts_with('+') => Ok(port),
                _ => Err(err("the port must be a number from 0 to 65535")),
            })
            .transpose()?;
        let host = Host::parse(host).map_err(|e| AddrError {
            input: input.to_owned(),
            reason: e.reason,
        })?;
        Ok((host, port))
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The same host with another port.
    pub fn with_port(&self, port: u16) -> Self {
        Self {
            host: self.host.clone(),
            port,
        }
    }

    /// The host's name as TLS SNI and certificates want it: a DNS name, or the IP without brackets.
    pub fn host_str(&self) -> String {
        match &self.host {
            Host::Name(n) => n.clone(),
            Host::V4(ip) => ip.to_string(),
            Host::V6(ip) => ip.to_string(),
        }
    }

    /// The socket address, when the host is an IP address.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.host.ip().map(|ip| SocketAddr::new(ip, self.port))
    }

    /// Whether the host is loopback (see [`Host::is_loopback`]).
    pub fn is_loopback(&self) -> bool {
        self.host.is_loopback()
    }
}

impl From<SocketAddr> for Addr {
    fn from(sa: SocketAddr) -> Self {
        Self {
            host: Host::from(sa.ip()),
            port: sa.port(),
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl FromStr for Addr {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for Addr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Deserializes `host:port` with the port required; configuration with per-field default ports
/// reads a string and calls [`Addr::parse_with_default_port`].
impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Addr::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_names_ipv4_and_bracketed_ipv6() {
        let a = Addr::parse("Proxy.Example.com:443").unwrap();
        assert_eq!(a.host(), &Host::Name("proxy.example.com".into()));
        assert_eq!(a.port(), 443);
        assert_eq!(a.to_string(), "proxy.example.com:443");

        let a = Addr::parse("10.0.0.1:3024").unwrap();
        assert_eq!(a.socket_addr(), Some("10.0.0.1:3024".parse().unwrap()));

        let a = Addr::parse("[::1]:3080").unwrap();
        assert_eq!(a.host(), &Host::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(a.to_string(), "[::1]:3080");
        assert_eq!(a.host_str(), "::1");
        assert!(a.is_loopback());
    }

    #[test]
    fn default_port_per_use() {
        assert_eq!(
            Addr::parse_with_default_port("example.com", 3080)
                .unwrap()
                .to_string(),
            "example.com:3080"
        );
        assert_eq!(
            Addr::parse_with_default_port("example.com:443", 3080)
                .unwrap()
                .port(),
            443
        );
        assert_eq!(
            Addr::parse_with_default_port("[2001:db8::1]", 3024)
                .unwrap()
                .to_string(),
            "[2001:db8::1]:3024"
        );
        assert_eq!(
            Addr::parse_with_default_port("2001:db8::1", 3024)
                .unwrap()
                .to_string(),
            "[2001:db8::1]:3024"
        );
        assert_eq!(
            Addr::parse_with_default_port("0.0.0.0", 3025)
                .unwrap()
                .to_string(),
            "0.0.0.0:3025"
        );
    }

    #[test]
    fn rejects_bad_input_quoting_it() {
        for bad in [
            "",
            "example.com",
            ":443",
            "example.com:",
            "example.com:65536",
            "example.com:-1",
            "example.com:+1",
            "exa mple.com:1",
            "https://example.com:443",
            "example.com:443/path",
            "[::1",
            "[::1]x",
            "[nope]:1",
            "-bad.example.com:1",
            "a..b:1",
            "1.2.3:80",
            "300.1.1.1:80",
            "ex!ample:1",
        ] {
            let err = Addr::parse(bad).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with(&format!("invalid address \"{bad}\": ")),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn loopback_detection() {
        for lo in [
            "localhost:1",
            "127.0.0.1:1",
            "127.9.9.9:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
            "a.localhost:1",
        ] {
            assert!(Addr::parse(lo).unwrap().is_loopback(), "{lo}");
        }
        for not in [
            "example.com:1",
            "10.0.0.1:1",
            "[2001:db8::1]:1",
            "localhost.example.com:1",
        ] {
            assert!(!Addr::parse(not).unwrap().is_loopback(), "{not}");
        }
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(
            host in prop_oneof![
                any::<Ipv4Addr>().prop_map(Host::V4),
                any::<Ipv6Addr>().prop_map(Host::V6),
                "[a-z][a-z0-9-]{0,10}[a-z0-9](\\.[a-z][a-z0-9]{0,8}){0,3}".prop_map(Host::Name),
            ],
            port in any::<u16>(),
        ) {
            let a = Addr::new(host, port);
            prop_assert_eq!(Addr::parse(&a.to_string()).unwrap(), a);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,40}") {
            let _ = Addr::parse(&s);
            let _ = Addr::parse_with_default_port(&s, 1);
        }
    }
}

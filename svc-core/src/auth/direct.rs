//! Which listener a directly joined agent may announce for the proxy to dial (`direct_addr`).
//!
//! The proxy pipes users' connections to an announced listener, so an announcement is a claim
//! the Auth Service checks against what it knows of the agent, never taken on trust:
//!
//! 1. the text is `host:port` with a non-zero port;
//! 2. the host is never an unspecified, link-local (`169.254.0.0/16`, `fe80::/10`: the cloud
//!    metadata service), multicast or broadcast address, IPv4-mapped forms included;
//! 3. never a name or address of the cluster's Proxy or Auth Service (their public names, and
//!    the addresses they listen on);
//! 4. never a loopback address (the proxy's own host), unless the operator opted in for a
//!    single-host lab ([`DirectDialPolicy::allow_loopback`]);
//! 5. an IP address must be the agent's **observed** source address (the TCP peer of its
//!    heartbeat), and a name must be one its host certificate carries (host ID, node name or
//!    an extra name the Auth Service granted at join).
//!
//! [`check_direct_addr`] is the rule, a pure function; [`AuthService`](super::AuthService)
//! applies it to every heartbeat.

use std::net::{IpAddr, SocketAddr};

use crate::identity::HostIdentity;

/// The operator's part of the rule (`auth_service.direct_dial`) and the addresses the
/// cluster's own services listen on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DirectDialPolicy {
    /// Accept loopback addresses (`127.0.0.0/8`, `::1`) when the agent's heartbeat also comes
    /// from loopback: a single-host lab where agent, Auth Service and proxy share one host.
    /// Default `false`: the proxy would otherwise dial its own host's private ports.
    pub allow_loopback: bool,
    /// The addresses the cluster's Proxy and Auth Service listen on; an announcement of one
    /// of them (or of its port on loopback, when it listens on every address) is refused.
    pub service_addrs: Vec<SocketAddr>,
}

impl DirectDialPolicy {
    /// The policy with [`allow_loopback`](Self::allow_loopback) set to `allow`.
    pub fn with_allow_loopback(mut self, allow: bool) -> Self {
        self.allow_loopback = allow;
        self
    }
}

/// Why an announced listener was refused. The text is what the agent's operator and the user
/// whose session it refuses read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DirectAddrRefused {
    /// Not `host:port` with a non-zero port.
    #[error("expected host:port with a non-zero port")]
    Malformed,
    /// Unspecified, link-local, multicast or broadcast.
    #[error(
        "expected the agent's own address, got an unspecified, link-local, multicast or broadcast address"
    )]
    NotDialable,
    /// A name or address of the cluster's Proxy or Auth Service.
    #[error("it is an address of the cluster's Proxy or Auth Service")]
    ClusterService,
    /// A loopback address without the lab opt-in.
    #[error(
        "a loopback address is the proxy's own host (allowed only with auth_service.direct_dial.allow_loopback)"
    )]
    Loopback,
    /// An IP address other than the one the agent's heartbeat comes from.
    #[error("{ip} is not the address the agent connects from ({observed})")]
    NotObserved {
        /// The announced address.
        ip: IpAddr,
        /// The agent's observed source address, or `unknown`.
        observed: String,
    },
    /// A name the agent's host certificate does not carry.
    #[error("the agent's host certificate does not carry the name {name}")]
    NotInCertificate {
        /// The announced name.
        name: String,
    },
}

/// The agent making an announcement, as the Auth Service knows it.
#[derive(Debug, Clone, Copy)]
pub struct Announcer<'a> {
    /// Its verified host certificate.
    pub identity: &'a HostIdentity,
    /// The TCP peer address of its heartbeat; `None` when unknown (then no IP address is
    /// accepted, only names its certificate carries).
    pub observed: Option<IpAddr>,
}

/// The IPv4 address of an IPv4-mapped IPv6 address; other addresses unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The host and port of `host:port` (IPv6 in brackets), if the text has that form.
pub(crate) fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let host = match host.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']')?,
        // An unbracketed IPv6 address (`::1:22`) is ambiguous: refused.
        None if host.contains(':') => return None,
        None => host,
    };
    (!host.is_empty()).then_some((host, port))
}

/// Whether `addr` is `ip:port` of a service listening on `service`.
fn is_service(ip: IpAddr, port: u16, service: &SocketAddr) -> bool {
    if service.port() != port {
        return false;
    }
    let listen = canonical(service.ip());
    listen == ip || (listen.is_unspecified() && ip.is_loopback())
}

/// Checks the listener `addr` that `announcer` announced, by the rule of this module.
/// `reserved` are the cluster's Proxy and Auth Service names (compared case-insensitively).
pub fn check_direct_addr(
    addr: &str,
    announcer: Announcer<'_>,
    reserved: &[String],
    policy: &DirectDialPolicy,
) -> Result<(), DirectAddrRefused> {
    let (host, port) = split_host_port(addr).ok_or(DirectAddrRefused::Malformed)?;
    if reserved.iter().any(|r| r.eq_ignore_ascii_case(host)) {
        return Err(DirectAddrRefused::ClusterService);
    }
    let Ok(ip) = host.parse::<IpAddr>() else {
        // A name: only one the agent's certificate carries. Where it resolves is checked by
        // the proxy at every dial (it never dials a loopback, link-local or unspecified
        // address it resolves to, unless loopback is allowed).
        if host.eq_ignore_ascii_case("localhost") && !policy.allow_loopback {
            return Err(DirectAddrRefused::Loopback);
        }
        return if announcer.identity.names(host) {
            Ok(())
        } else {
            Err(DirectAddrRefused::NotInCertificate {
                name: host.to_owned(),
            })
        };
    };
    let ip = canonical(ip);
    if !super::direct_ip_allowed(ip) {
        return Err(DirectAddrRefused::NotDialable);
    }
    if policy.service_addrs.iter().any(|s| is_service(ip, port, s)) {
        return Err(DirectAddrRefused::ClusterService);
    }
    let observed = announcer.observed.map(canonical);
    if ip.is_loopback() {
        return match observed {
            Some(o) if policy.allow_loopback && o.is_loopback() => Ok(()),
            _ if !policy.allow_loopback => Err(DirectAddrRefused::Loopback),
            _ => Err(DirectAddrRefused::NotObserved {
                ip,
                observed: observed.map_or_else(|| "unknown".to_owned(), |o| o.to_string()),
            }),
        };
    }
    if observed == Some(ip) {
        return Ok(());
    }
    Err(DirectAddrRefused::NotObserved {
        ip,
        observed: observed.map_or_else(|| "unknown".to_owned(), |o| o.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{SystemRole, Validity};
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::{Duration, UNIX_EPOCH};

    fn agent(extra: &[&str]) -> HostIdentity {
        HostIdentity {
            host_id: "3f2c0000-0000-0000-0000-000000000001.example.com".into(),
            cluster: "example.com".into(),
            node_name: "edge-1".into(),
            roles: vec![SystemRole::Node],
            additional_names: extra.iter().map(|s| (*s).to_owned()).collect(),
            validity: Validity {
                not_before: UNIX_EPOCH,
                not_after: UNIX_EPOCH + Duration::from_secs(1),
            },
        }
    }

    fn check(addr: &str, observed: Option<&str>, policy: &DirectDialPolicy) -> Result<(), DirectAddrRefused> {
        let id = agent(&["edge-1.internal.example.com"]);
        let announcer = Announcer {
            identity: &id,
            observed: observed.map(|o| o.parse().unwrap()),
        };
        check_direct_addr(
            addr,
            announcer,
            &["proxy.example.com".to_owned(), "10.0.0.5".to_owned()],
            policy,
        )
    }

    #[test]
    fn the_observed_address_and_the_certificates_names_are_accepted() {
        let p = DirectDialPolicy::default();
        check("10.0.0.7:3022", Some("10.0.0.7"), &p).unwrap();
        check("10.0.0.7:3022", Some("::ffff:10.0.0.7"), &p).unwrap();
        check("[2001:db8::7]:3022", Some("2001:db8::7"), &p).unwrap();
        check("edge-1:3022", None, &p).unwrap();
        check("EDGE-1.internal.example.com:3026", Some("10.0.0.7"), &p).unwrap();
        check("3f2c0000-0000-0000-0000-000000000001.example.com:3028", None, &p).unwrap();
    }

    #[test]
    fn every_other_announcement_is_refused_with_its_reason() {
        use DirectAddrRefused as R;
        let p = DirectDialPolicy {
            allow_loopback: false,
            service_addrs: vec!["0.0.0.0:3080".parse().unwrap(), "10.0.0.7:3025".parse().unwrap()],
        };
        let cases: [(&str, Option<&str>, DirectAddrRefused); 14] = [
            ("edge-1", None, R::Malformed),
            ("edge-1:0", None, R::Malformed),
            ("::1:22", None, R::Malformed),
            ("[::1:22", None, R::Malformed),
            ("169.254.169.254:80", Some("169.254.169.254"), R::NotDialable),
            ("[::ffff:169.254.169.254]:80", None, R::NotDialable),
            ("[fe80::1]:22", Some("fe80::1"), R::NotDialable),
            ("0.0.0.0:3022", None, R::NotDialable),
            ("proxy.example.com:3022", None, R::ClusterService),
            ("10.0.0.5:3022", Some("10.0.0.5"), R::ClusterService),
            ("10.0.0.7:3025", Some("10.0.0.7"), R::ClusterService),
            ("127.0.0.1:3022", Some("127.0.0.1"), R::Loopback),
            ("localhost:3022", None, R::Loopback),
            (
                "db.example.com:3022",
                None,
                R::NotInCertificate {
                    name: "db.example.com".into(),
                },
            ),
        ];
        for (addr, observed, want) in cases {
            assert_eq!(check(addr, observed, &p), Err(want), "{addr}");
        }
        assert_eq!(
            check("10.0.0.8:3022", Some("10.0.0.7"), &p),
            Err(R::NotObserved {
                ip: "10.0.0.8".parse().unwrap(),
                observed: "10.0.0.7".into()
            })
        );
        assert_eq!(
            check("10.0.0.8:3022", None, &p).unwrap_err().to_string(),
            "10.0.0.8 is not the address the agent connects from (unknown)"
        );
    }

    #[test]
    fn loopback_needs_the_opt_in_and_a_loopback_agent_and_never_reaches_a_service_port() {
        let lab = DirectDialPolicy {
            allow_loopback: true,
            service_addrs: vec!["127.0.0.1:3025".parse().unwrap(), "0.0.0.0:3080".parse().unwrap()],
        };
        check("127.0.0.1:3022", Some("127.0.0.1"), &lab).unwrap();
        check("[::1]:3022", Some("127.0.0.1"), &lab).unwrap();
        check("localhost:3022", None, &lab).unwrap_err();
        // A remote agent cannot point the proxy at its own host, even in a lab.
        assert!(matches!(
            check("127.0.0.1:3022", Some("10.0.0.7"), &lab),
            Err(DirectAddrRefused::NotObserved { .. })
        ));
        for service in ["127.0.0.1:3025", "127.0.0.1:3080", "[::1]:3080"] {
            assert_eq!(
                check(service, Some("127.0.0.1"), &lab),
                Err(DirectAddrRefused::ClusterService),
                "{service}"
            );
        }
    }

    fn any_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<u32>().prop_map(|v| IpAddr::V4(Ipv4Addr::from(v))),
            any::<u128>().prop_map(|v| IpAddr::V6(Ipv6Addr::from(v))),
            // Weighted towards the classes the rule is about.
            (any::<u16>()).prop_map(|v| IpAddr::V4(Ipv4Addr::new(169, 254, (v >> 8) as u8, v as u8))),
            (any::<u8>()).prop_map(|v| IpAddr::V4(Ipv4Addr::new(127, 0, 0, v))),
            (any::<u64>()).prop_map(|v| IpAddr::V6(Ipv6Addr::from((0xfe80u128 << 112) | u128::from(v)))),
            (any::<u32>()).prop_map(|v| IpAddr::V6(Ipv4Addr::from(v).to_ipv6_mapped())),
        ]
    }

    fn host_port(ip: IpAddr, port: u16) -> String {
        SocketAddr::new(ip, port).to_string()
    }

    proptest! {
        #[test]
        fn never_panics_on_any_text(addr in ".{0,64}", allow in any::<bool>()) {
            let p = DirectDialPolicy::default().with_allow_loopback(allow);
            let _ = check(&addr, Some("10.0.0.7"), &p);
        }

        #[test]
        fn an_accepted_address_is_the_agents_own_and_dialable(
            ip in any_ip(), observed in any_ip(), port in 1u16.., allow in any::<bool>()
        ) {
            let id = agent(&[]);
            let p = DirectDialPolicy::default().with_allow_loopback(allow);
            let announcer = Announcer { identity: &id, observed: Some(observed) };
            if check_direct_addr(&host_port(ip, port), announcer, &[], &p).is_ok() {
                let ip = canonical(ip);
                prop_assert!(super::super::direct_ip_allowed(ip));
                if ip.is_loopback() {
                    prop_assert!(allow && canonical(observed).is_loopback());
                } else {
                    prop_assert_eq!(ip, canonical(observed));
                }
            }
        }

        #[test]
        fn the_observed_dialable_non_loopback_address_is_accepted(ip in any_ip(), port in 1u16..) {
            let c = canonical(ip);
            prop_assume!(super::super::direct_ip_allowed(c) && !c.is_loopback());
            let id = agent(&[]);
            let announcer = Announcer { identity: &id, observed: Some(ip) };
            prop_assert_eq!(
                check_direct_addr(&host_port(ip, port), announcer, &[], &DirectDialPolicy::default()),
                Ok(())
            );
        }

        #[test]
        fn a_service_address_is_never_accepted(ip in any_ip(), port in 1u16.., allow in any::<bool>()) {
            let id = agent(&[]);
            let p = DirectDialPolicy {
                allow_loopback: allow,
                service_addrs: vec![SocketAddr::new(ip, port)],
            };
            let announcer = Announcer { identity: &id, observed: Some(ip) };
            prop_assert!(check_direct_addr(&host_port(ip, port), announcer, &[], &p).is_err());
        }
    }
}

//! The cluster's proxies: each Proxy Service announces itself with a record under
//! `/proxies/<host id>` that expires unless renewed ([`PROXY_ANNOUNCE_INTERVAL`],
//! [`PROXY_TTL`]) and is deleted when the proxy stops cleanly. Any cluster member may list them:
//! proxies tell their agents which proxies to keep a tunnel to, and directly joined agents point
//! their updater at a proxy's version endpoint.

use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{AuthError, AuthService, Caller};
use crate::backend::{BackendError, Item, Key, KeyRange};
use crate::identity::SystemRole;
use crate::rbac::{AccessDenied, Verb};

/// How often a proxy renews its record.
pub const PROXY_ANNOUNCE_INTERVAL: Duration = Duration::from_secs(60);

/// How long a record lives without renewal (a proxy killed without a clean stop stays listed at
/// most this long).
pub const PROXY_TTL: Duration = Duration::from_secs(10 * 60);

/// The shortest lifetime a proxy may ask for (tests use short ones).
const MIN_PROXY_TTL: Duration = Duration::from_secs(1);

/// A proxy as it announces itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProxyRecord {
    /// `<uuid>.<cluster>`, from the proxy's certificate.
    pub host_id: String,
    /// The proxy's node name.
    pub hostname: String,
    /// Where clients and agents reach it (`proxy_service.public_addr`, often a load balancer's
    /// address shared by every proxy), `host:port`.
    pub public_addr: String,
    /// Where other proxies reach it (proxy peering, 3021), `host:port`; empty when unknown.
    pub peer_addr: String,
    /// Where agents dial their tunnel (`host:port`): the public web address with TLS routing,
    /// else the tunnel address.
    pub tunnel_addr: String,
    /// Whether `tunnel_addr` is a TLS-routing port (SSH inside TLS).
    pub tls_routing: bool,
    /// The proxy's version.
    pub version: String,
    /// When the record was last renewed (Unix seconds).
    pub last_seen: u64,
    /// When it expires unless renewed (Unix seconds).
    pub expires: u64,
    /// Host IDs of the agents holding a reverse tunnel to it (what proxy peering looks up to
    /// reach an agent through this proxy); renewed as agents come and go.
    #[serde(default)]
    pub agents: Vec<String>,
}

impl ProxyRecord {
    /// A record for the proxy `host_id`; the Auth Service fills `last_seen` and `expires`
    /// (and overwrites `host_id` with the caller's own).
    pub fn new(
        host_id: impl Into<String>,
        hostname: impl Into<String>,
        public_addr: impl Into<String>,
    ) -> Self {
        Self {
            host_id: host_id.into(),
            hostname: hostname.into(),
            public_addr: public_addr.into(),
            peer_addr: String::new(),
            tunnel_addr: String::new(),
            tls_routing: false,
            version: String::new(),
            last_seen: 0,
            expires: 0,
            agents: Vec::new(),
        }
    }
}

pub(super) fn proxy_key(host_id: &str) -> Key {
    Key::from_segments(["proxies", host_id])
}

fn unix(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn proxy_host(caller: &Caller, verb: Verb) -> Result<&crate::identity::HostIdentity, AuthError> {
    match caller {
        Caller::Host(host) | Caller::Admin(host) if host.has_role(SystemRole::Proxy) => Ok(host),
        _ => Err(AccessDenied {
            verb,
            resource: "proxy".into(),
        }
        .into()),
    }
}

impl AuthService {
    /// A proxy announces (or renews) itself: the record is stored under the host ID of the
    /// caller's certificate (a proxy can only speak for itself), expiring after `ttl` (default
    /// and upper bound [`PROXY_TTL`]). Only hosts with the `proxy` role may.
    pub async fn upsert_proxy(
        &self,
        caller: &Caller,
        mut record: ProxyRecord,
        ttl: Option<Duration>,
    ) -> Result<ProxyRecord, AuthError> {
        let host = proxy_host(caller, Verb::Update)?;
        if record.public_addr.is_empty() {
            return Err(AuthError::Invalid(format!(
                "proxy {}: public_addr is empty",
                host.host_id
            )));
        }
        let ttl = ttl.unwrap_or(PROXY_TTL).clamp(MIN_PROXY_TTL, PROXY_TTL);
        let now = self.now();
        record.host_id = host.host_id.clone();
        if record.hostname.is_empty() {
            record.hostname = host.node_name.clone();
        }
        record.last_seen = unix(now);
        record.expires = unix(now + ttl);
        let value = serde_json::to_vec(&record).map_err(|e| AuthError::Corrupt {
            what: "proxy record",
            reason: e.to_string(),
        })?;
        self.backend
            .put(Item::new(proxy_key(&host.host_id), value).with_expiry(now + ttl))
            .await?;
        Ok(record)
    }

    /// A proxy stopping cleanly removes its record (absent already: not an error).
    pub async fn delete_proxy(&self, caller: &Caller) -> Result<(), AuthError> {
        let host = proxy_host(caller, Verb::Delete)?;
        match self.backend.delete(&proxy_key(&host.host_id)).await {
            Ok(_) | Err(BackendError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The live proxies, by host ID. Any cluster member (host) may list them, and so may users
    /// whose roles allow `list` on `proxy`.
    pub async fn list_proxies(&self, caller: &Caller) -> Result<Vec<ProxyRecord>, AuthError> {
        if let Caller::User { .. } = caller {
            caller.check(Verb::List, "proxy")?;
        }
        let now = self.now();
        let mut out = Vec::new();
        for item in self
            .backend
            .range(&KeyRange::prefix(Key::from("/proxies/")))
            .await?
        {
            if item.is_expired(now) {
                continue;
            }
            let record: ProxyRecord =
                serde_json::from_slice(&item.value).map_err(|e| AuthError::Corrupt {
                    what: "proxy record",
                    reason: e.to_string(),
                })?;
            out.push(record);
        }
        out.sort_by(|a, b| a.host_id.cmp(&b.host_id));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rcgen::{KeyPair, PublicKeyData};
    use ssh_key::private::Ed25519Keypair;

    use super::*;
    use crate::backend::{Backend, MemoryBackend};
    use crate::clock::{Clock, ManualClock};
    use crate::identity::{HostCertRequest, Identity};

    async fn auth() -> (AuthService, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::at_unix(1_800_000_000));
        let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::with_options(clock.clone(), 64));
        let auth = AuthService::open(backend, "example.com", clock.clone())
            .await
            .unwrap();
        (auth, clock)
    }

    fn host(auth: &AuthService, name: &str, roles: Vec<SystemRole>) -> Caller {
        let tls = KeyPair::generate().unwrap();
        let ssh = ssh_key::PrivateKey::from(Ed25519Keypair::from_seed(&[7; 32]));
        let req = HostCertRequest {
            host_uuid: uuid::Uuid::new_v4(),
            node_name: name.into(),
            roles,
            additional_names: vec![],
            ttl: Duration::from_secs(3600),
        };
        let certs = auth
            .issue_host_certs(&req, &tls.subject_public_key_info(), ssh.public_key())
            .unwrap();
        match auth
            .verifier()
            .verify_any_x509(&[certs.tls_cert], auth.clock.now())
            .unwrap()
        {
            Identity::Host(h) => Caller::Host(h),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn records_round_trip_as_json() {
        let mut r = ProxyRecord::new("p1.example.com", "proxy-1", "lb.example.com:443");
        r.tls_routing = true;
        let back: ProxyRecord = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(proxy_key("p1.example.com").to_string(), "/proxies/p1.example.com");
    }

    #[tokio::test]
    async fn proxies_announce_themselves_expire_and_leave() {
        let (auth, clock) = auth().await;
        let p1 = host(&auth, "proxy-1", vec![SystemRole::Proxy]);
        let p2 = host(&auth, "proxy-2", vec![SystemRole::Proxy]);
        let agent = host(&auth, "node-1", vec![SystemRole::Node]);
        let Caller::Host(h1) = &p1 else { unreachable!() };

        // The record is stored under the caller's own host ID, whatever it claims.
        let claimed = ProxyRecord::new("someone-else.example.com", "", "lb.example.com:443");
        let stored = auth.upsert_proxy(&p1, claimed, None).await.unwrap();
        assert_eq!(stored.host_id, h1.host_id);
        assert_eq!(stored.hostname, "proxy-1");
        assert_eq!(stored.expires - stored.last_seen, PROXY_TTL.as_secs());
        auth.upsert_proxy(
            &p2,
            ProxyRecord::new("", "", "lb.example.com:443"),
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap();

        // Any cluster member lists them; only proxies announce.
        assert_eq!(auth.list_proxies(&agent).await.unwrap().len(), 2);
        let err = auth
            .upsert_proxy(&agent, ProxyRecord::new("", "", "x:1"), None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("proxy"), "{err}");
        let err = auth
            .upsert_proxy(&p1, ProxyRecord::new("", "", ""), None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("public_addr"), "{err}");

        // p2 asked for 30 s and did not renew: gone after that; p1 lives on.
        clock.advance(Duration::from_secs(31));
        let left = auth.list_proxies(&agent).await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].host_id, h1.host_id);

        // A clean stop removes the record at once (twice is not an error).
        auth.delete_proxy(&p1).await.unwrap();
        auth.delete_proxy(&p1).await.unwrap();
        assert!(auth.list_proxies(&agent).await.unwrap().is_empty());
        // Ten minutes is the upper bound on any lifetime.
        let long = auth
            .upsert_proxy(
                &p1,
                ProxyRecord::new("", "", "lb:443"),
                Some(Duration::from_secs(86_400)),
            )
            .await
            .unwrap();
        assert_eq!(long.expires - long.last_seen, PROXY_TTL.as_secs());
    }
}

//! The proxies' records on the wire: `UpsertProxy`, `DeleteProxy` and `ListProxies`, server side
//! (delegating to [`AuthService`]) and client side ([`AuthClient`] methods).

use std::time::Duration;

use svc_core::auth::{AuthError, AuthService, Caller, ProxyRecord};
use svc_core::config::TunnelStrategy;
use tonic::Status;

use super::client::{AuthClient, ClientError};
use super::proto;

fn to_proto(r: ProxyRecord) -> proto::ProxyInfo {
    proto::ProxyInfo {
        host_id: r.host_id,
        hostname: r.hostname,
        public_addr: r.public_addr,
        peer_addr: r.peer_addr,
        tunnel_addr: r.tunnel_addr,
        tls_routing: r.tls_routing,
        version: r.version,
        last_seen_unix: i64::try_from(r.last_seen).unwrap_or(i64::MAX),
        expires_unix: i64::try_from(r.expires).unwrap_or(i64::MAX),
        agents: r.agents,
    }
}

fn strategy_to_proto(s: TunnelStrategy) -> proto::TunnelStrategy {
    match s.agent_connection_count() {
        None => proto::TunnelStrategy {
            r#type: "agent_mesh".into(),
            agent_connection_count: 0,
        },
        Some(n) => proto::TunnelStrategy {
            r#type: "proxy_peering".into(),
            agent_connection_count: u32::try_from(n).unwrap_or(u32::MAX),
        },
    }
}

/// The strategy a `ListProxies` answer carries: agent mesh when absent or not understood.
fn strategy_from_proto(s: Option<proto::TunnelStrategy>) -> TunnelStrategy {
    match s {
        Some(s) if s.r#type == "proxy_peering" => TunnelStrategy::ProxyPeering {
            agent_connection_count: usize::try_from(s.agent_connection_count.max(1)).unwrap_or(1),
        },
        _ => TunnelStrategy::AgentMesh,
    }
}

fn from_proto(p: proto::ProxyInfo) -> ProxyRecord {
    let mut r = ProxyRecord::new(p.host_id, p.hostname, p.public_addr);
    r.peer_addr = p.peer_addr;
    r.tunnel_addr = p.tunnel_addr;
    r.tls_routing = p.tls_routing;
    r.version = p.version;
    r.last_seen = u64::try_from(p.last_seen_unix).unwrap_or(0);
    r.expires = u64::try_from(p.expires_unix).unwrap_or(0);
    r.agents = p.agents;
    r
}

/// `UpsertProxy`.
pub(super) async fn upsert(
    auth: &AuthService,
    caller: &Caller,
    req: proto::UpsertProxyRequest,
    status: fn(AuthError) -> Status,
) -> Result<proto::ProxyInfo, Status> {
    let record = req
        .proxy
        .map(from_proto)
        .ok_or_else(|| Status::invalid_argument("proxy: missing"))?;
    let ttl = (req.ttl_seconds > 0).then(|| Duration::from_secs(req.ttl_seconds));
    let stored = auth.upsert_proxy(caller, record, ttl).await.map_err(status)?;
    Ok(to_proto(stored))
}

/// `ListProxies`.
pub(super) async fn list(
    auth: &AuthService,
    caller: &Caller,
    status: fn(AuthError) -> Status,
) -> Result<proto::ProxyList, Status> {
    let proxies = auth.list_proxies(caller).await.map_err(status)?;
    Ok(proto::ProxyList {
        proxies: proxies.into_iter().map(to_proto).collect(),
        tunnel_strategy: Some(strategy_to_proto(auth.tunnel_strategy())),
    })
}

impl AuthClient {
    /// Announces (or renews) the calling proxy's record, living `ttl` unless renewed (`None`:
    /// the Auth Service's default, 10 minutes). Returns the record as stored.
    pub async fn upsert_proxy(
        &mut self,
        record: &ProxyRecord,
        ttl: Option<Duration>,
    ) -> Result<ProxyRecord, ClientError> {
        let req = proto::UpsertProxyRequest {
            proxy: Some(to_proto(record.clone())),
            ttl_seconds: ttl.map(|t| t.as_secs().max(1)).unwrap_or(0),
        };
        Ok(from_proto(self.raw().upsert_proxy(req).await?.into_inner()))
    }

    /// Removes the calling proxy's record (a clean stop).
    pub async fn delete_proxy(&mut self) -> Result<(), ClientError> {
        self.raw().delete_proxy(proto::Empty {}).await?;
        Ok(())
    }

    /// The cluster's live proxies, by host ID.
    pub async fn list_proxies(&mut self) -> Result<Vec<ProxyRecord>, ClientError> {
        Ok(self.list_proxies_and_strategy().await?.0)
    }

    /// The cluster's live proxies, by host ID, and its tunnel strategy
    /// (`auth_service.tunnel_strategy`; agent mesh from an Auth Service that does not say).
    pub async fn list_proxies_and_strategy(
        &mut self,
    ) -> Result<(Vec<ProxyRecord>, TunnelStrategy), ClientError> {
        let list = self.raw().list_proxies(proto::Empty {}).await?.into_inner();
        Ok((
            list.proxies.into_iter().map(from_proto).collect(),
            strategy_from_proto(list.tunnel_strategy),
        ))
    }
}

//! The proxy in the cluster's proxy registry: it announces itself through the Auth API
//! (`UpsertProxy`, renewed every [`PROXY_ANNOUNCE_INTERVAL`], living [`PROXY_TTL`](svc_core::auth::PROXY_TTL) unless
//! renewed), asks for the live proxies (`ListProxies`) every few seconds and tells every
//! connected agent over the tunnel's discovery channel — on change, and again every announce
//! interval — so that each agent keeps one tunnel per proxy. On a clean stop it removes its
//! record.
//!
//! The list comes with the cluster's tunnel strategy (`auth_service.tunnel_strategy`). With
//! proxy peering the proxy tells each agent only its share of the proxies
//! ([`agent_proxies`](crate::tunnel::agent_proxies)), starts serving peering on
//! `proxy_service.peer_listen_addr` the first time it hears the strategy, keeps the agents it
//! holds in its record (renewed as soon as they change, at the refresh interval) and hands the
//! other proxies' records — peer address and held agents — to its
//! [`PeerDialer`].

use std::{sync::Arc, time::Duration};

use svc_core::auth::{PROXY_ANNOUNCE_INTERVAL, ProxyRecord};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::FailoverClient;
use crate::proxy::{BoundAddrs, ProxySettings};
use crate::tunnel::{DiscoveredProxy, Discovery, Peer, PeerDialer, PeerIdentity, PeerKeys, TunnelServer};

/// How often the proxy asks for the live proxies by default.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(5);

/// How long removing the record may take on a clean stop.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a proxy takes part in the registry.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RegistrationConfig {
    /// What the proxy announces (its host ID is the certificate's, whatever this says).
    pub record: ProxyRecord,
    /// How often the record is renewed.
    pub announce_every: Duration,
    /// How long the record lives unless renewed (`None`: the Auth Service's default).
    pub ttl: Option<Duration>,
    /// How often the live proxies are asked for.
    pub refresh_every: Duration,
}

impl RegistrationConfig {
    /// Announces `record` with the default intervals.
    pub fn new(record: ProxyRecord) -> Self {
        Self {
            record,
            announce_every: PROXY_ANNOUNCE_INTERVAL,
            ttl: None,
            refresh_every: DEFAULT_REFRESH,
        }
    }

    /// Replaces the announce interval, the record's lifetime and the refresh interval.
    pub fn with_intervals(
        mut self,
        announce_every: Duration,
        ttl: Duration,
        refresh_every: Duration,
    ) -> Self {
        self.announce_every = announce_every;
        self.ttl = Some(ttl);
        self.refresh_every = refresh_every;
        self
    }
}

/// The record a proxy with these settings announces: its public web address (else the bound
/// one), and where agents dial their tunnel (with TLS routing the web address; otherwise the
/// tunnel's public address, else the bound tunnel listener). An address whose host is
/// unspecified (`0.0.0.0`) is not announced as a tunnel address: agents then dial the address
/// they were configured with.
pub fn record_for(
    settings: &ProxySettings,
    bound: &BoundAddrs,
    host_id: &str,
    hostname: &str,
) -> ProxyRecord {
    let ping = &settings.ping;
    let web = ping
        .web_public_addr
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_else(|| crate::auth::node::dialable(bound.web).to_string());
    let tls_routing = ping.listener_mode.tls_routing();
    let tunnel = if tls_routing {
        Some(web.clone())
    } else {
        ping.tunnel_public_addr_override
            .as_ref()
            .or(ping.tunnel_public_addr.as_ref())
            .map(ToString::to_string)
            .or_else(|| bound.get("tunnel_listen_addr").map(|a| a.to_string()))
    };
    let tunnel = tunnel
        .filter(|t| {
            svc_core::Addr::parse(t)
                .ok()
                .is_some_and(|a| !a.host().ip().is_some_and(|ip| ip.is_unspecified()))
        })
        .unwrap_or_default();
    let mut record = ProxyRecord::new(host_id, hostname, web);
    record.tunnel_addr = tunnel;
    record.tls_routing = tls_routing;
    // Announced once peering is served (the bound address).
    record.peer_addr = String::new();
    record.version = svc_core::version::current().to_string();
    record
}

/// How a proxy serves peering once the cluster asks for it: where to listen, what to present.
pub struct PeeringConfig {
    /// `proxy_service.peer_listen_addr`.
    pub listen: svc_core::Addr,
    /// The proxy's host identity (its X.509 certificate with the `proxy` role), shared with
    /// the proxy's renewal: the peer server and the peer dialer present whatever it holds.
    pub keys: PeerKeys,
    /// The peer listener's limits (the proxy's own).
    pub options: crate::listen::ListenOptions,
}

impl std::fmt::Debug for PeeringConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeeringConfig")
            .field("listen", &self.listen)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// A proxy announcing itself; [`Registration::leave`] removes the record.
pub struct Registration {
    stop: CancellationToken,
    task: JoinHandle<Option<JoinHandle<()>>>,
    link: Arc<FailoverClient>,
    host_id: String,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("host_id", &self.host_id)
            .finish_non_exhaustive()
    }
}

fn discovered(record: &ProxyRecord) -> DiscoveredProxy {
    DiscoveredProxy {
        proxy_id: record.host_id.clone(),
        tunnel_addr: record.tunnel_addr.clone(),
        tls_routing: record.tls_routing,
    }
}

impl Registration {
    /// Starts announcing `config.record` as the proxy `link` speaks for (its host ID is
    /// `host_id`), telling `tunnel`'s agents about the live proxies. `link` fails over between
    /// the Auth Service's addresses. Must be called inside a tokio runtime.
    pub fn spawn(
        link: Arc<FailoverClient>,
        tunnel: TunnelServer,
        host_id: &str,
        config: RegistrationConfig,
    ) -> Self {
        Self::spawn_with_peering(link, tunnel, host_id, config, None)
    }

    /// Like [`spawn`](Self::spawn); when the cluster's strategy is proxy peering, also serves
    /// peering as `peering` says (until [`leave`](Self::leave)).
    pub fn spawn_with_peering(
        link: Arc<FailoverClient>,
        tunnel: TunnelServer,
        host_id: &str,
        config: RegistrationConfig,
        peering: Option<PeeringConfig>,
    ) -> Self {
        let stop = CancellationToken::new();
        let mut record = config.record.clone();
        record.host_id = host_id.to_owned();
        let task = tokio::spawn(run(link.clone(), tunnel, record, config, peering, stop.clone()));
        Registration {
            stop,
            task,
            link,
            host_id: host_id.to_owned(),
        }
    }

    /// Stops announcing and removes the record (bounded: a failure is logged, and the record
    /// then expires on its own).
    pub async fn leave(self) {
        self.stop.cancel();
        // The peer listener drains (bounded by its drain timeout) with the rest of the proxy.
        if let Ok(Some(peering)) = self.task.await {
            let _ = peering.await;
        }
        let link = self.link.clone();
        let leave = async move { link.client().await?.delete_proxy().await };
        match tokio::time::timeout(LEAVE_TIMEOUT, leave).await {
            Ok(Ok(())) => {
                tracing::info!(host_id = %self.host_id, "removed this proxy from the cluster's proxy registry")
            }
            Ok(Err(e)) => {
                tracing::warn!(host_id = %self.host_id, error = %e, "could not remove this proxy's record; it expires on its own")
            }
            Err(_) => {
                tracing::warn!(host_id = %self.host_id, after = ?LEAVE_TIMEOUT, "removing this proxy's record timed out; it expires on its own")
            }
        }
    }
}

/// Binds the peer listener and serves peering on it until `stop`; sets the tunnel's peer
/// dialer. Returns the address to announce and the serving task.
async fn start_peering(
    peering: &PeeringConfig,
    tunnel: &TunnelServer,
    stop: &CancellationToken,
) -> Result<(String, JoinHandle<()>), String> {
    let dialer = PeerDialer::with_keys(peering.keys.clone()).map_err(|e| e.to_string())?;
    let addr = peering.listen.to_string();
    let listener = tokio::net::TcpListener::bind(addr.as_str())
        .await
        .map_err(|e| format!("binding {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    if bound.ip().is_unspecified() {
        tracing::warn!(peer_listen_addr = %peering.listen, "proxy_service.peer_listen_addr has no specific host: peers are told a loopback address, which only proxies on this host can reach");
    }
    let announced = crate::auth::node::dialable(bound).to_string();
    tunnel.set_peer_dialer(dialer);
    let (tunnel, stop) = (tunnel.clone(), stop.clone());
    let keys = peering.keys.clone();
    let options = peering.options.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = crate::tunnel::serve_peers_with_keys(listener, tunnel, keys, options, stop).await {
            tracing::error!(error = %e, "proxy peering stopped");
        }
    });
    tracing::info!(listen = %bound, announced = %announced, "serving proxy peering");
    Ok((announced, task))
}

/// The agents this proxy holds an online tunnel to, sorted.
fn held_agents(tunnel: &TunnelServer) -> Vec<String> {
    let mut held: Vec<String> = tunnel
        .registry()
        .list()
        .into_iter()
        .filter(|a| a.online)
        .map(|a| a.host_id)
        .collect();
    held.dedup();
    held
}

async fn run(
    link: Arc<FailoverClient>,
    tunnel: TunnelServer,
    mut record: ProxyRecord,
    config: RegistrationConfig,
    peering: Option<PeeringConfig>,
    stop: CancellationToken,
) -> Option<JoinHandle<()>> {
    let mut peer_task: Option<JoinHandle<()>> = None;
    let mut peering_failed = false;
    let mut announce = tokio::time::interval(config.announce_every);
    let mut refresh = tokio::time::interval(config.refresh_every);
    announce.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Vec<DiscoveredProxy>> = None;
    let mut pushed_at = tokio::time::Instant::now();
    // The first announcement goes out before the first list is asked for.
    let mut announced = false;
    loop {
        tokio::select! {
            _ = announce.tick() => {
                let upsert = async { link.client().await?.upsert_proxy(&record, config.ttl).await };
                match upsert.await {
                    Ok(_) => {
                        if !announced {
                            tracing::info!(host_id = %record.host_id, public_addr = %record.public_addr, "announced this proxy in the cluster's proxy registry");
                        }
                        announced = true;
                    }
                    Err(e) => {
                        tracing::warn!(host_id = %record.host_id, error = %e, "announcing this proxy failed; retrying at the next interval");
                        link.reset().await;
                    }
                }
                continue;
            }
            _ = refresh.tick() => {}
            _ = stop.cancelled() => return peer_task,
        }
        let listed = async { link.client().await?.list_proxies_and_strategy().await };
        let (proxies, strategy) = match listed.await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "listing the cluster's proxies failed; agents keep the last list");
                link.reset().await;
                continue;
            }
        };
        if tunnel.strategy() != strategy {
            tracing::info!(?strategy, "the cluster's tunnel strategy");
            tunnel.set_strategy(strategy);
        }
        if strategy.agent_connection_count().is_some()
            && peer_task.is_none()
            && !peering_failed
            && let Some(p) = &peering
        {
            match start_peering(p, &tunnel, &stop).await {
                Ok((addr, task)) => {
                    record.peer_addr = addr;
                    peer_task = Some(task);
                }
                Err(e) => {
                    peering_failed = true;
                    tracing::error!(error = %e, peer_listen_addr = %p.listen, "cannot serve proxy peering: this proxy reaches only the agents tunnelled to it");
                }
            }
        }
        // The record names the agents held here, renewed as soon as they change.
        let held = held_agents(&tunnel);
        if held != record.agents
            || (peer_task.is_some()
                && proxies
                    .iter()
                    .all(|p| p.host_id != record.host_id || p.peer_addr != record.peer_addr))
        {
            record.agents = held;
            let upsert = async { link.client().await?.upsert_proxy(&record, config.ttl).await };
            if let Err(e) = upsert.await {
                tracing::warn!(host_id = %record.host_id, error = %e, "renewing this proxy's record (its agents) failed; retrying at the next refresh");
                link.reset().await;
            }
        }
        if let Some(dialer) = tunnel.peer_dialer() {
            dialer.set_peers(
                proxies
                    .iter()
                    .map(|p| Peer::new(p.host_id.clone(), p.peer_addr.clone(), p.agents.clone()))
                    .collect(),
            );
        }
        let mut list: Vec<DiscoveredProxy> = proxies.iter().map(discovered).collect();
        // This proxy is alive whatever the registry says (its own record may not be stored yet).
        if !list.iter().any(|p| p.proxy_id == record.host_id) {
            list.push(discovered(&record));
        }
        list.sort_by(|a, b| a.proxy_id.cmp(&b.proxy_id));
        let changed = last.as_ref() != Some(&list);
        if changed || pushed_at.elapsed() >= config.announce_every {
            if changed {
                let ids: Vec<&str> = list.iter().map(|p| p.proxy_id.as_str()).collect();
                tracing::info!(proxies = ?ids, "telling the agents about the cluster's proxies");
            }
            tunnel.set_proxies(Discovery {
                proxies: list.clone(),
                complete: true,
                hold: None,
            });
            pushed_at = tokio::time::Instant::now();
            last = Some(list);
        }
    }
}

/// Starts `running`'s registration as the proxy `identity` names (the node's hook: one call
/// after the listeners are bound). Returns the keys peering presents (with
/// `peer_listen_addr`), for the proxy's renewal to replace.
pub(crate) fn register(
    running: super::RunningProxy,
    link: Arc<FailoverClient>,
    tunnel: TunnelServer,
    identity: &crate::auth::ClientIdentity,
    hostname: &str,
) -> (super::RunningProxy, Option<PeerKeys>) {
    let record = record_for(running.settings(), running.addrs(), &identity.name, hostname);
    let peering = running.settings().peer_listen_addr.clone().and_then(|listen| {
        let keys = identity
            .tls_parts()
            .and_then(|(chain, key)| Ok((chain, key, identity.verifier()?)))
            .map_err(|e| e.to_string())
            .and_then(|(chain, key, verifier)| {
                PeerKeys::new(&PeerIdentity {
                    host_id: identity.name.clone(),
                    verifier: Arc::new(verifier),
                    chain,
                    key,
                })
                .map_err(|e| e.to_string())
            });
        match keys {
            Ok(keys) => Some(PeeringConfig {
                listen,
                keys,
                options: running.settings().listen.clone(),
            }),
            Err(e) => {
                tracing::error!(error = %e, "the proxy identity cannot serve proxy peering");
                None
            }
        }
    });
    let keys = peering.as_ref().map(|p| p.keys.clone());
    let registration = Registration::spawn_with_peering(
        link,
        tunnel,
        &identity.name,
        RegistrationConfig::new(record),
        peering,
    );
    (running.with_registration(registration), keys)
}

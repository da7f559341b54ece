//! The proxy in the cluster's proxy registry: it announces itself through the Auth API
//! (`UpsertProxy`, renewed every [`PROXY_ANNOUNCE_INTERVAL`], living [`PROXY_TTL`](svc_core::auth::PROXY_TTL) unless
//! renewed), asks for the live proxies (`ListProxies`) every few seconds and tells every
//! connected agent over the tunnel's discovery channel — on change, and again every announce
//! interval — so that each agent keeps one tunnel per proxy. On a clean stop it removes its
//! record.

use std::sync::Arc;
use std::time::Duration;

use svc_core::auth::{PROXY_ANNOUNCE_INTERVAL, ProxyRecord};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthClient, FailoverClient};
use crate::proxy::{BoundAddrs, ProxySettings};
use crate::tunnel::{DiscoveredProxy, Discovery, TunnelServer};

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
    record.peer_addr = settings
        .peer_listen_addr
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    record.version = svc_core::version::current().to_string();
    record
}

/// A proxy announcing itself; [`Registration::leave`] removes the record.
pub struct Registration {
    stop: CancellationToken,
    task: JoinHandle<()>,
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
    /// Starts announcing `config.record` as the proxy `client` speaks for (its host ID is
    /// `host_id`), telling `tunnel`'s agents about the live proxies. Must be called inside a
    /// tokio runtime.
    pub fn spawn(
        client: AuthClient,
        tunnel: TunnelServer,
        host_id: &str,
        config: RegistrationConfig,
    ) -> Self {
        let link = Arc::new(FailoverClient::with_client(client, "the Auth Service".to_owned()));
        Self::spawn_failover(link, tunnel, host_id, config)
    }

    /// Like [`spawn`](Self::spawn), through `link`: a proxy apart from the Auth Service
    /// announces itself and lists the proxies at whichever of its Auth Service addresses
    /// answers, moving to another after a transport failure.
    pub fn spawn_failover(
        link: Arc<FailoverClient>,
        tunnel: TunnelServer,
        host_id: &str,
        config: RegistrationConfig,
    ) -> Self {
        let stop = CancellationToken::new();
        let mut record = config.record.clone();
        record.host_id = host_id.to_owned();
        let task = tokio::spawn(run(link.clone(), tunnel, record, config, stop.clone()));
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
        let _ = self.task.await;
        let link = self.link.clone();
        let delete = async move {
            let mut client = link.client().await?;
            let deleted = client.delete_proxy().await;
            if let Err(e) = &deleted
                && FailoverClient::is_transport_failure(e)
            {
                link.reset().await;
                return link.client().await?.delete_proxy().await;
            }
            deleted
        };
        match tokio::time::timeout(LEAVE_TIMEOUT, delete).await {
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

async fn run(
    link: Arc<FailoverClient>,
    tunnel: TunnelServer,
    record: ProxyRecord,
    config: RegistrationConfig,
    stop: CancellationToken,
) {
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
                let upserted = match link.client().await {
                    Ok(mut client) => client.upsert_proxy(&record, config.ttl).await,
                    Err(e) => Err(e),
                };
                match upserted {
                    Ok(_) => {
                        if !announced {
                            tracing::info!(host_id = %record.host_id, public_addr = %record.public_addr, "announced this proxy in the cluster's proxy registry");
                        }
                        announced = true;
                    }
                    Err(e) => {
                        if FailoverClient::is_transport_failure(&e) {
                            link.reset().await;
                            // Another Auth Service may answer: try again soon.
                            announce.reset_after(Duration::from_secs(1));
                        }
                        tracing::warn!(host_id = %record.host_id, error = %e, "announcing this proxy failed; retrying");
                    }
                }
                continue;
            }
            _ = refresh.tick() => {}
            _ = stop.cancelled() => return,
        }
        let listed = match link.client().await {
            Ok(mut client) => client.list_proxies().await,
            Err(e) => Err(e),
        };
        let proxies = match listed {
            Ok(p) => p,
            Err(e) => {
                if FailoverClient::is_transport_failure(&e) {
                    link.reset().await;
                }
                tracing::warn!(error = %e, "listing the cluster's proxies failed; agents keep the last list");
                continue;
            }
        };
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
            });
            pushed_at = tokio::time::Instant::now();
            last = Some(list);
        }
    }
}

/// Starts `running`'s registration as the proxy `identity` names (the node's hook: one call
/// after the listeners are bound).
pub(crate) fn register(
    running: super::RunningProxy,
    client: AuthClient,
    tunnel: TunnelServer,
    identity: &crate::auth::ClientIdentity,
    hostname: &str,
) -> super::RunningProxy {
    let record = record_for(running.settings(), running.addrs(), &identity.name, hostname);
    let registration = Registration::spawn(client, tunnel, &identity.name, RegistrationConfig::new(record));
    running.with_registration(registration)
}

/// [`register`] for a proxy apart from the Auth Service: through `link`, failing over between
/// the Auth Service's addresses.
pub(crate) fn register_failover(
    running: super::RunningProxy,
    link: Arc<FailoverClient>,
    tunnel: TunnelServer,
    identity: &crate::auth::ClientIdentity,
    hostname: &str,
) -> super::RunningProxy {
    let record = record_for(running.settings(), running.addrs(), &identity.name, hostname);
    let registration =
        Registration::spawn_failover(link, tunnel, &identity.name, RegistrationConfig::new(record));
    running.with_registration(registration)
}

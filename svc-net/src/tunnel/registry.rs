//! The proxy's registry of connected agents: who is connected, by host ID and node name, and
//! whether each tunnel is online (heartbeats arriving) — what the [`TunnelDialer`] looks up.
//!
//! [`TunnelDialer`]: super::TunnelDialer

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime},
};

use svc_core::Version;
use tokio::{sync::watch, time::Instant};

/// A connected agent, as the registry reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentInfo {
    /// `<uuid>.<cluster>`.
    pub host_id: String,
    /// The node name from the certificate.
    pub node_name: String,
    /// The version the agent reported.
    pub version: Version,
    /// Where the tunnel comes from (the TCP peer: the agent, or its HTTP proxy).
    pub remote_addr: SocketAddr,
    /// When the tunnel was registered.
    pub connected_at: SystemTime,
    /// Whether heartbeats arrive: an offline agent gets no new dials.
    pub online: bool,
    /// Client connections the tunnel carries now.
    pub live_sessions: usize,
    /// Whether the agent serves dials carried in the channel-open message (one round trip per
    /// new connection); agents that predate it are dialed the older way.
    pub open_dial: bool,
}

/// State shared by a tunnel's SSH handler (heartbeats), the dialer (live sessions) and the
/// registry.
#[derive(Debug)]
pub(crate) struct ConnState {
    pub(crate) last_heartbeat: Mutex<Instant>,
    pub(crate) live: AtomicUsize,
    /// The agent named [`super::CAP_OPEN_DIAL`] among its capabilities.
    pub(crate) open_dial: std::sync::atomic::AtomicBool,
    /// The agent named [`super::CAP_DIAL_STATUS`] too: its refusals carry its reason.
    pub(crate) dial_status: std::sync::atomic::AtomicBool,
    /// The agent named [`super::CAP_DISCOVERY_PUSH`]: the proxy pushes it changed lists.
    pub(crate) discovery_push: std::sync::atomic::AtomicBool,
    /// The generation of the last list of proxies pushed to the agent ([`NOTHING_SENT`]
    /// before the first): a change is pushed to those not sent it yet.
    pub(crate) sent_generation: AtomicU64,
}

/// [`ConnState::sent_generation`] before any list went to the agent.
pub(crate) const NOTHING_SENT: u64 = u64::MAX;

impl ConnState {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            last_heartbeat: Mutex::new(Instant::now()),
            live: AtomicUsize::new(0),
            open_dial: std::sync::atomic::AtomicBool::new(false),
            dial_status: std::sync::atomic::AtomicBool::new(false),
            discovery_push: std::sync::atomic::AtomicBool::new(false),
            sent_generation: AtomicU64::new(NOTHING_SENT),
        })
    }

    pub(crate) fn heartbeat(&self) {
        *lock(&self.last_heartbeat) = Instant::now();
    }

    fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*lock(&self.last_heartbeat))
    }
}

/// Counts a client connection on a tunnel while it lives.
#[derive(Debug)]
pub(crate) struct LiveGuard(Arc<ConnState>);

impl LiveGuard {
    pub(crate) fn new(state: Arc<ConnState>) -> Self {
        state.live.fetch_add(1, Ordering::SeqCst);
        Self(state)
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) struct Entry {
    pub(crate) id: u64,
    pub(crate) info: AgentInfo,
    pub(crate) handle: russh::server::Handle,
    pub(crate) state: Arc<ConnState>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    agents: HashMap<String, Vec<Entry>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these maps half-updated in a way that matters
    // more than losing the registry would; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Connected agents by host ID (and node name); cheap to clone.
#[derive(Clone)]
pub struct AgentRegistry {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Default for AgentRegistry {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl std::fmt::Debug for AgentRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRegistry")
            .field("agents", &self.list().len())
            .finish()
    }
}

impl AgentRegistry {
    fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    pub(crate) fn insert(
        &self,
        mut info: AgentInfo,
        handle: russh::server::Handle,
        state: Arc<ConnState>,
    ) -> u64 {
        let mut inner = lock(&self.inner);
        inner.next_id += 1;
        let id = inner.next_id;
        info.online = true;
        // Almost every agent holds one tunnel here: room for one (a first push would make
        // room for four entries, some 600 bytes per idle tunnel).
        inner
            .agents
            .entry(info.host_id.clone())
            .or_insert_with(|| Vec::with_capacity(1))
            .push(Entry {
                id,
                info,
                handle,
                state,
            });
        drop(inner);
        self.notify();
        id
    }

    pub(crate) fn remove(&self, host_id: &str, id: u64) {
        let mut inner = lock(&self.inner);
        if let Some(list) = inner.agents.get_mut(host_id) {
            list.retain(|e| e.id != id);
            if list.is_empty() {
                inner.agents.remove(host_id);
            }
        }
        drop(inner);
        self.notify();
    }

    /// Every tunnel, newest last per agent.
    pub fn list(&self) -> Vec<AgentInfo> {
        let inner = lock(&self.inner);
        let mut all: Vec<AgentInfo> = inner
            .agents
            .values()
            .flatten()
            .map(|e| {
                let mut info = e.info.clone();
                info.live_sessions = e.state.live.load(Ordering::SeqCst);
                info
            })
            .collect();
        all.sort_by(|a, b| {
            a.host_id
                .cmp(&b.host_id)
                .then(a.connected_at.cmp(&b.connected_at))
        });
        all
    }

    /// The host ID that `name` refers to: a host ID, the UUID part of one, or a node name.
    /// Online tunnels win over offline ones.
    pub fn resolve(&self, name: &str) -> Option<String> {
        let inner = lock(&self.inner);
        if inner.agents.contains_key(name) {
            return Some(name.to_owned());
        }
        let mut found: Vec<&Entry> = inner
            .agents
            .values()
            .flatten()
            .filter(|e| {
                e.info.node_name == name
                    || e.info
                        .host_id
                        .split_once('.')
                        .is_some_and(|(uuid, _)| uuid == name)
            })
            .collect();
        found.sort_by_key(|e| (e.info.online, e.id));
        found.last().map(|e| e.info.host_id.clone())
    }

    /// The agent's newest tunnel, whatever its state.
    pub fn get(&self, name: &str) -> Option<AgentInfo> {
        let host_id = self.resolve(name)?;
        self.list().into_iter().rev().find(|a| a.host_id == host_id)
    }

    /// The newest online tunnel of `host_id`, for a dial.
    pub(crate) fn pick(&self, host_id: &str) -> Option<(russh::server::Handle, Arc<ConnState>)> {
        let inner = lock(&self.inner);
        inner
            .agents
            .get(host_id)?
            .iter()
            .rev()
            .find(|e| e.info.online)
            .map(|e| (e.handle.clone(), e.state.clone()))
    }

    /// Every registered tunnel that takes pushed discovery ([`ConnState::discovery_push`]):
    /// its host ID, SSH handle and state.
    pub(crate) fn discovery_subscribers(&self) -> Vec<(String, russh::server::Handle, Arc<ConnState>)> {
        lock(&self.inner)
            .agents
            .values()
            .flatten()
            .filter(|e| e.state.discovery_push.load(Ordering::SeqCst))
            .map(|e| (e.info.host_id.clone(), e.handle.clone(), e.state.clone()))
            .collect()
    }

    /// Every tunnel's SSH handle (for requests to all agents, e.g. reconnect).
    pub(crate) fn handles(&self, host_id: &str) -> Vec<russh::server::Handle> {
        lock(&self.inner)
            .agents
            .get(host_id)
            .map(|l| l.iter().map(|e| e.handle.clone()).collect())
            .unwrap_or_default()
    }

    /// Marks tunnels silent for longer than `offline_after` offline (and those heard from again
    /// online); returns the handles of
    /// those that carry no live session, which the caller closes. Tunnels carrying sessions
    /// stay open (their clients keep working) but get no new dials.
    pub(crate) fn sweep(
        &self,
        now: Instant,
        offline_after: Duration,
    ) -> Vec<(String, russh::server::Handle)> {
        let mut to_close = Vec::new();
        let mut changed = false;
        for e in lock(&self.inner).agents.values_mut().flatten() {
            if e.state.silent_for(now) > offline_after {
                if e.info.online {
                    tracing::warn!(host_id = %e.info.host_id, node = %e.info.node_name, silent_for = ?e.state.silent_for(now), "agent missed its heartbeats; marked offline");
                    e.info.online = false;
                    changed = true;
                }
                if e.state.live.load(Ordering::SeqCst) == 0 {
                    to_close.push((e.info.host_id.clone(), e.handle.clone()));
                }
            } else if !e.info.online {
                tracing::info!(host_id = %e.info.host_id, "agent heartbeats resumed; marked online");
                e.info.online = true;
                changed = true;
            }
        }
        if changed {
            self.notify();
        }
        to_close
    }

    /// Waits until `check` holds for the agent `name` (`None`: not registered); for callers
    /// (and tests) that must see a state change.
    pub async fn wait_for(&self, name: &str, mut check: impl FnMut(Option<&AgentInfo>) -> bool) {
        let mut rx = self.changed.subscribe();
        loop {
            if check(self.get(name).as_ref()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits until `check` holds for the list of every tunnel ([`AgentRegistry::list`]).
    pub async fn wait_until(&self, mut check: impl FnMut(&[AgentInfo]) -> bool) {
        let mut rx = self.changed.subscribe();
        loop {
            if check(&self.list()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

//! The proxy's local view of the Auth Service's state, and the decisions it takes from it.
//!
//! Data flow: [`ProxyCache::spawn`] calls the Auth Service's `Watch` (through a
//! [`FailoverClient`], so any of several Auth Services will do) and keeps a [`CacheBackend`]:
//! the initial snapshot replaces the local copy at once when complete, then each put and
//! delete is applied in order. When the stream ends (the Auth Service stopped, a network
//! fault), the copy stays as it is and keeps serving; the watch is retried with a growing
//! pause and a fresh snapshot replaces the copy on success.
//!
//! [`ProxyDecisions`] answers the per-connection questions — may this user open a session on
//! that node as that login, where does this app, database or Kubernetes cluster live, where
//! does a directly joined agent listen — with [`AccessRules`], the Auth Service's own rules,
//! over the cache (a proxy apart from the Auth Service) or over the Auth Service's backend (the
//! all-in-one process). No call leaves the process on the per-connection path.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use russh::keys::Certificate;
use rustls::pki_types::CertificateDer;
use svc_core::SystemClock;
use svc_core::auth::{AccessRules, AuthService, Caller, ServedKind};
use svc_core::backend::{Backend, BackendError, Item, Key, KeyRange, Revision, Watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::auth::proto::watch_event;
use crate::auth::{ClientError, ClientIdentity, FailoverClient, Resolved};
use crate::ssh::{NodeAuthorizer, NodeDecisionFuture};
use crate::tunnel::{DirectLookup, DirectTarget};

/// The longest pause between two attempts to watch the Auth Service again.
const MAX_RETRY: Duration = Duration::from_secs(5);
/// The first pause after a failed or ended watch.
const FIRST_RETRY: Duration = Duration::from_millis(200);

/// A read-only [`Backend`] holding what the watch delivered. Writes are refused: only the
/// watch changes it.
#[derive(Default)]
pub struct CacheBackend {
    state: RwLock<CacheState>,
}

#[derive(Default)]
struct CacheState {
    items: BTreeMap<Key, Item>,
    revision: Revision,
}

impl std::fmt::Debug for CacheBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("CacheBackend")
            .field("items", &state.items.len())
            .field("revision", &state.revision)
            .finish()
    }
}

fn read_only() -> BackendError {
    BackendError::Storage {
        context: "writing to the proxy's cache",
        source: "the proxy's cache is read-only: only the Auth Service's watch changes it".into(),
    }
}

fn item_from_proto(i: crate::auth::proto::WatchItem) -> Item {
    let mut item = Item::new(Key::from(i.key), i.value);
    item.revision = Revision(i.revision);
    if let Ok(ms) = u64::try_from(i.expires_unix_ms)
        && ms > 0
    {
        item.expires = Some(UNIX_EPOCH + Duration::from_millis(ms));
    }
    item
}

impl CacheBackend {
    fn replace(&self, items: BTreeMap<Key, Item>, revision: Revision) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.items = items;
        state.revision = revision;
    }

    fn apply_put(&self, item: Item) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.revision = state.revision.max(item.revision);
        state.items.insert(item.key.clone(), item);
    }

    fn apply_delete(&self, key: &Key) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.items.remove(key);
    }

    /// How many keys the cache holds.
    pub fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .items
            .len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Backend for CacheBackend {
    async fn get(&self, key: &Key) -> Result<Option<Item>, BackendError> {
        let now = SystemTime::now();
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        Ok(state.items.get(key).filter(|i| !i.is_expired(now)).cloned())
    }

    async fn put(&self, _item: Item) -> Result<Revision, BackendError> {
        Err(read_only())
    }

    async fn create(&self, _item: Item) -> Result<Revision, BackendError> {
        Err(read_only())
    }

    async fn compare_and_swap(&self, _expected: Revision, _item: Item) -> Result<Revision, BackendError> {
        Err(read_only())
    }

    async fn delete(&self, _key: &Key) -> Result<Revision, BackendError> {
        Err(read_only())
    }

    async fn range(&self, range: &KeyRange) -> Result<Vec<Item>, BackendError> {
        let now = SystemTime::now();
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        Ok(state
            .items
            .values()
            .filter(|i| range.contains(&i.key) && !i.is_expired(now))
            .cloned()
            .collect())
    }

    async fn watch(&self, _prefix: &Key) -> Result<Watcher, BackendError> {
        Err(BackendError::Storage {
            context: "watching the proxy's cache",
            source: "the proxy's cache cannot be watched; watch the Auth Service".into(),
        })
    }

    async fn purge_expired(&self) -> Result<usize, BackendError> {
        // Reads skip expired items; the Auth Service's own purge sends the deletes.
        Ok(0)
    }

    async fn current_revision(&self) -> Result<Revision, BackendError> {
        Ok(self.state.read().unwrap_or_else(PoisonError::into_inner).revision)
    }
}

/// Where the cache's watch stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStatus {
    /// How many complete snapshots were received (0: none yet, the cache is empty).
    pub snapshots: u64,
    /// Whether the watch is open now.
    pub connected: bool,
    /// The newest revision applied.
    pub revision: u64,
    /// The last reason the watch ended or could not start, if it did.
    pub last_error: Option<String>,
}

/// The proxy's watched copy of what [`AccessRules`] read.
#[derive(Debug, Clone)]
pub struct ProxyCache {
    backend: Arc<CacheBackend>,
    status: watch::Receiver<CacheStatus>,
}

impl ProxyCache {
    /// Starts watching the Auth Service through `link` until `shutdown`; the cache is empty
    /// until the first snapshot ([`wait_synced`](Self::wait_synced)).
    pub fn spawn(link: Arc<FailoverClient>, shutdown: CancellationToken) -> Self {
        let backend = Arc::new(CacheBackend::default());
        let (tx, status) = watch::channel(CacheStatus::default());
        tokio::spawn(run(backend.clone(), link, tx, shutdown));
        Self { backend, status }
    }

    /// The cached keys, as a [`Backend`] for [`AccessRules`].
    pub fn backend(&self) -> Arc<CacheBackend> {
        self.backend.clone()
    }

    /// Where the watch stands now.
    pub fn status(&self) -> CacheStatus {
        self.status.borrow().clone()
    }

    /// A receiver of the watch's status changes.
    pub fn subscribe(&self) -> watch::Receiver<CacheStatus> {
        self.status.clone()
    }

    /// Waits until the first snapshot arrived, at most `deadline`; the error names the last
    /// reason the watch failed.
    pub async fn wait_synced(&self, deadline: Duration) -> Result<(), String> {
        let mut rx = self.status.clone();
        let waited = tokio::time::timeout(deadline, rx.wait_for(|s| s.snapshots > 0)).await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            _ => Err(format!(
                "no snapshot of the Auth Service's state within {deadline:?}: {}",
                self.status()
                    .last_error
                    .unwrap_or_else(|| "the watch did not answer".into())
            )),
        }
    }
}

async fn run(
    backend: Arc<CacheBackend>,
    link: Arc<FailoverClient>,
    status: watch::Sender<CacheStatus>,
    shutdown: CancellationToken,
) {
    let mut pause = FIRST_RETRY;
    loop {
        let outcome = tokio::select! {
            r = watch_once(&backend, &link, &status) => r,
            () = shutdown.cancelled() => return,
        };
        let reason = match outcome {
            Ok(()) => "the Auth Service ended the watch".to_owned(),
            Err(e) => e.to_string(),
        };
        let was_connected = status.borrow().connected;
        status.send_modify(|s| {
            s.connected = false;
            s.last_error = Some(reason.clone());
        });
        if was_connected {
            tracing::warn!(error = %reason, "lost the Auth Service's watch: deciding from the cache until it is back");
            pause = FIRST_RETRY;
        } else {
            tracing::debug!(error = %reason, "watching the Auth Service failed; retrying");
        }
        link.reset().await;
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shutdown.cancelled() => return,
        }
        pause = (pause * 2).min(MAX_RETRY);
    }
}

/// One watch: returns when the stream ends.
async fn watch_once(
    backend: &CacheBackend,
    link: &FailoverClient,
    status: &watch::Sender<CacheStatus>,
) -> Result<(), ClientError> {
    let mut client = link.client().await?;
    let mut stream = client.watch().await?;
    let mut staging: Option<BTreeMap<Key, Item>> = Some(BTreeMap::new());
    while let Some(msg) = stream.message().await? {
        let Some(event) = msg.event else { continue };
        match event {
            watch_event::Event::SnapshotItem(i) => {
                let item = item_from_proto(i);
                if let Some(staging) = staging.as_mut() {
                    staging.insert(item.key.clone(), item);
                }
            }
            watch_event::Event::SnapshotDone(revision) => {
                let items = staging.take().unwrap_or_default();
                let count = items.len();
                backend.replace(items, Revision(revision));
                status.send_modify(|s| {
                    s.snapshots += 1;
                    s.connected = true;
                    s.revision = revision;
                    s.last_error = None;
                });
                tracing::info!(
                    keys = count,
                    revision,
                    "the proxy's cache holds the Auth Service's snapshot"
                );
            }
            watch_event::Event::Put(i) => {
                let item = item_from_proto(i);
                let revision = item.revision.0;
                backend.apply_put(item);
                status.send_modify(|s| s.revision = s.revision.max(revision));
            }
            watch_event::Event::Delete(key) => backend.apply_delete(&Key::from(key)),
        }
    }
    Ok(())
}

/// The proxy's per-connection decisions, taken in the process with [`AccessRules`].
pub struct ProxyDecisions {
    rules: AccessRules,
    caller: Caller,
    /// The Auth Service of this process (all in one), which also remembers the listeners it
    /// refused to directly joined agents.
    local_auth: Option<Arc<AuthService>>,
}

impl std::fmt::Debug for ProxyDecisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyDecisions")
            .field("in_process_auth", &self.local_auth.is_some())
            .finish_non_exhaustive()
    }
}

impl ProxyDecisions {
    /// Decisions over the watched `cache`, as the proxy holding `identity` (host role
    /// `proxy`).
    pub async fn over_cache(cache: &ProxyCache, identity: &ClientIdentity) -> Result<Arc<Self>, String> {
        let verifier = identity.verifier().map_err(|e| e.to_string())?;
        let rules = AccessRules::new(cache.backend(), verifier, Arc::new(SystemClock));
        let chain = identity.tls_parts().map_err(|e| e.to_string())?.0;
        let me = rules
            .verifier()
            .verify_any_x509(&chain, SystemTime::now())
            .map_err(|e| format!("the proxy's own certificate: {e}"))?;
        let caller = rules.caller(me).await.map_err(|e| e.to_string())?;
        Ok(Arc::new(Self {
            rules,
            caller,
            local_auth: None,
        }))
    }

    /// Decisions over the Auth Service of this process, as `caller` (the proxy).
    pub fn in_process(auth: Arc<AuthService>, caller: Caller) -> Arc<Self> {
        Arc::new(Self {
            rules: auth.rules().clone(),
            caller,
            local_auth: Some(auth),
        })
    }

    /// Whether the user holding `user_cert` may open a session on `node` as `login`: the
    /// route, or the refusal naming the node and why.
    pub async fn authorize_node(&self, user_cert: &Certificate, node: &str, login: &str) -> Resolved {
        let answer = match &self.local_auth {
            Some(auth) => auth.authorize_node(&self.caller, user_cert, node, login).await,
            None => {
                self.rules
                    .authorize_node(&self.caller, user_cert, node, login)
                    .await
            }
        };
        match answer {
            Ok(Ok(route)) => Ok(route),
            Ok(Err(denied)) => Err(denied.to_string()),
            Err(e) => Err(format!("access to node \"{node}\" refused: {e}")),
        }
    }

    /// Why the certificates of `username` no longer work, if they do not (the user was
    /// deleted, or a live lock targets them), by this proxy's view of the cluster: what ends
    /// a web session on its next request.
    pub async fn user_revoked(&self, username: &str) -> Result<Option<String>, String> {
        self.rules.user_revoked(username).await.map_err(|e| e.to_string())
    }

    /// Where a connection to `kind`/`name` goes for the holder of `user_cert` (DER).
    pub async fn resolve_resource(&self, kind: ServedKind, name: &str, user_cert: &[u8]) -> Resolved {
        let chain = [CertificateDer::from(user_cert.to_vec())];
        match self
            .rules
            .resolve_resource(&self.caller, Some(&chain), kind, name)
            .await
        {
            Ok(Ok(route)) => Ok(route),
            Ok(Err(denied)) => Err(denied.to_string()),
            Err(e) => Err(format!("access to {kind} \"{name}\" refused: {e}")),
        }
    }
}

impl ProxyDecisions {
    /// Where a database connection as `db_user` (and `db_name`) goes for the holder of
    /// `user_cert` (DER): labels, then the roles' `db_users`/`db_names`.
    pub async fn resolve_db(
        &self,
        name: &str,
        db_user: &str,
        db_name: Option<&str>,
        user_cert: &[u8],
    ) -> Resolved {
        let chain = [CertificateDer::from(user_cert.to_vec())];
        match self
            .rules
            .resolve_db(&self.caller, Some(&chain), name, db_user, db_name)
            .await
        {
            Ok(Ok(route)) => Ok(route),
            Ok(Err(denied)) => Err(denied.to_string()),
            Err(e) => Err(format!("access to db \"{name}\" refused: {e}")),
        }
    }
}

impl NodeAuthorizer for ProxyDecisions {
    fn authorize(self: Arc<Self>, user_cert: Certificate, node: String, login: String) -> NodeDecisionFuture {
        Box::pin(async move { self.authorize_node(&user_cert, &node, &login).await })
    }
}

impl DirectLookup for ProxyDecisions {
    fn lookup(
        &self,
        server: String,
        conn_type: ServedKind,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<DirectTarget>, String>> + Send>>
    {
        let (rules, caller, local) = (self.rules.clone(), self.caller.clone(), self.local_auth.clone());
        Box::pin(async move {
            let kind = match conn_type {
                ServedKind::Node => ServedKind::Node,
                ServedKind::Kube => ServedKind::Kube,
                ServedKind::WindowsDesktop => ServedKind::WindowsDesktop,
                // Apps and databases are served only through tunnels.
                _ => return Ok(None),
            };
            match rules.direct_route(&caller, &server, kind).await {
                Ok(Some(r)) => Ok(Some(DirectTarget {
                    host_id: r.server_id,
                    addr: r.resource.direct_addr,
                })),
                // An announcement the Auth Service refused: the user learns why.
                Ok(None) => local
                    .and_then(|auth| auth.direct_refusal(&caller, &server, kind))
                    .map_or(Ok(None), Err),
                Err(e) => {
                    tracing::warn!(%server, error = %e, "looking up a directly joined agent failed");
                    Ok(None)
                }
            }
        })
    }
}

/// Where the proxy's resource routes (apps, databases, desktops, Kubernetes) ask for a route:
/// locally ([`ProxyDecisions`]), or the Auth Service over gRPC.
#[derive(Clone, Debug)]
pub enum RouteResolver {
    /// Decided in the process.
    Local(Arc<ProxyDecisions>),
    /// Asked of the Auth Service (`ResolveResource`) for every connection.
    Remote(crate::auth::AuthClient),
}

impl From<crate::auth::AuthClient> for RouteResolver {
    fn from(client: crate::auth::AuthClient) -> Self {
        RouteResolver::Remote(client)
    }
}

impl From<Arc<ProxyDecisions>> for RouteResolver {
    fn from(d: Arc<ProxyDecisions>) -> Self {
        RouteResolver::Local(d)
    }
}

impl RouteResolver {
    /// Where a connection to `kind`/`name` goes for the holder of `user_cert` (DER); the inner
    /// `Err` is the refusal naming the resource.
    pub async fn resolve_resource(
        &self,
        kind: ServedKind,
        name: &str,
        user_cert: &[u8],
    ) -> Result<Resolved, ClientError> {
        match self {
            RouteResolver::Local(d) => Ok(d.resolve_resource(kind, name, user_cert).await),
            RouteResolver::Remote(client) => {
                client.clone().resolve_resource(kind, name, Some(user_cert)).await
            }
        }
    }

    /// Where a database connection as `db_user` (and `db_name`) goes for the holder of
    /// `user_cert` (DER), with the roles' `db_users`/`db_names` checked.
    pub async fn resolve_db(
        &self,
        name: &str,
        db_user: &str,
        db_name: Option<&str>,
        user_cert: &[u8],
    ) -> Result<Resolved, ClientError> {
        match self {
            RouteResolver::Local(d) => Ok(d.resolve_db(name, db_user, db_name, user_cert).await),
            RouteResolver::Remote(client) => {
                client
                    .clone()
                    .resolve_db(name, db_user, db_name, Some(user_cert))
                    .await
            }
        }
    }
}

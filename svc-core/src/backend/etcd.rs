//! [`EtcdBackend`]: the [`Backend`] on an etcd 3.4+ cluster, so several Auth Services share one
//! replicated store.
//!
//! # Layout
//!
//! Every key lives under the cluster's namespace: the configured prefix with a `/` appended
//! (`/svc/example.com` stores `/users/alice` as `/svc/example.com//users/alice`). The `/` ends
//! the namespace, so two clusters on one etcd never see each other's keys unless one prefix is a
//! whole path segment above the other (`/svc/a` and `/svc/a/b`): give each cluster its own.
//!
//! The value is an envelope: a format byte, the expiry (if any), then the stored bytes.
//!
//! # Revisions
//!
//! [`Revision`] is etcd's store revision minus one. etcd starts an empty store at revision 1 and
//! gives every write (put, delete, transaction with writes) the next one, cluster-wide; so
//! `Revision::ZERO` is the empty store, the first write is `Revision(1)`, and an item's revision
//! is its `mod_revision - 1`. The counter is shared by every prefix on the etcd cluster:
//! revisions of one cluster's keys grow but are not dense, and
//! [`current_revision`](Backend::current_revision) is the etcd store's revision.
//!
//! # Writes
//!
//! `create`, `compare_and_swap` and `delete` read the key, apply the shared rules
//! ([`check_write`]) with the expiry judged by this process's clock, then commit with one etcd
//! transaction whose guard is the `mod_revision` that was read (`create_revision == 0` when the
//! key was absent). A guard that fails means another writer came in between: the operation
//! reads again and decides again, so the result is the one a serial execution would give.
//!
//! # A member down
//!
//! etcd-client spreads requests over every configured peer (tonic's balanced channel, which
//! picks per request and keeps a peer that refuses connections in the set), so while one member
//! of a cluster is down some requests still go to it and fail before reaching any server. The
//! client offers no way to pick the peer of a request, so every operation retries on a short,
//! bounded backoff (20 ms doubling to 500 ms, five seconds in all): each retry is balanced
//! afresh, so one of the first few lands on a live member, and an election (one to two seconds)
//! fits in the budget. The connect timeout and HTTP/2 keep-alive make a member that stops
//! answering without refusing (a cut network) fail its requests within seconds instead of
//! hanging them. Which failures are retried depends on what a failure proves:
//!
//! - *Never applied*: the connection could not be made (refused, TCP connect error), or the
//!   member refused the request because it knows no leader (this backend asks for a leader on
//!   every request). Every operation retries these, writes included: nothing was written.
//! - *Ambiguous*: any other `Unavailable` (a stream broken mid-request, `etcdserver: leader
//!   changed` or `request timed out` during an election), and the `Unknown` "transport error"
//!   tonic reports when a connection breaks under a request: the request may or may not have been
//!   applied. Reads retry them. A plain `put` and a lease grant retry them too: a `put` is
//!   last-writer-wins with the same bytes, so writing them twice leaves the store as a serial
//!   execution of the unacknowledged `put` would (at worst one extra revision and watch event;
//!   a `put` of another writer in between is overwritten, as if it had come first), and an
//!   unused lease expires on its own. A guarded write (`create`, `compare_and_swap`, `delete`)
//!   does not blindly resend its transaction: it reads the key again and decides again, like
//!   after a failed guard. If the key now holds exactly the value it wrote (or, for `delete`,
//!   is gone) at a revision after the one the lost transaction was guarded by, that
//!   transaction was applied and its result is returned (for `delete` the store revision read,
//!   at or after the deletion; if another writer stored the very same bytes or deleted the key
//!   meanwhile, the state is the one a serial execution with ours first gives); otherwise it
//!   was not applied, or another writer came after it, and the fresh decision is the one a
//!   serial execution gives. The guard makes sure a new transaction never applies on top of a
//!   state it did not check, so nothing is written twice or over another writer's change.
//!
//! Other errors (a failed authentication, a malformed request) are returned at once, and so is
//! the last error once the budget is spent.
//!
//! # Expiry
//!
//! Reads treat an item past its expiry as absent at once, by the clock, exactly like the
//! embedded store; [`Backend::purge_expired`] deletes such items (one guarded delete each, so a
//! key rewritten meanwhile is left alone) and each delete reaches watchers as an
//! [`Event::Delete`]. In addition every expiring item is attached to an etcd lease of its own
//! (TTL: the time left, rounded up to a whole second), so etcd removes it server-side even when
//! no Auth Service is running `purge_expired`; that deletion also reaches watchers as a delete.
//! A lease per item costs one `LeaseGrant` round trip per expiring write and one lease object
//! per live expiring item in etcd. The alternative, one lease per TTL bucket shared by the items
//! of a bucket, saves the round trip but needs a cache of live leases per process that must be
//! rebuilt after every etcd restart or lease loss, and deletes items up to a bucket late: not
//! worth it at the write rates of an Auth Service (heartbeats every few tens of seconds per
//! agent).
//!
//! # Watches
//!
//! A watch records the store revision `R` it starts after ([`Event::Init`]) and asks etcd for
//! every change from `R + 1`. If the stream breaks (the member it talks to restarts or is
//! killed), the watch opens a new stream from the revision after the last event it delivered:
//! no gap, no duplicate. If etcd has compacted that history away meanwhile, the watcher ends
//! with [`WatchError::Compacted`] and the caller re-lists and watches again, as after
//! [`WatchError::Lagged`]. The position only advances with delivered events (etcd 3.4's
//! progress notifications are not ordered with the events of a lagging stream, so they are not
//! used): a watch of a quiet prefix that reconnects after a compaction past its last event ends
//! with `Compacted` too, a needless but harmless re-list. A watcher that does not read falls behind like on the local
//! backends (a bounded buffer, then [`WatchError::Lagged`]).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, Identity,
    KeyValue, PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::{broadcast, watch};

use super::codec::{FORMAT_V1, MalformedValue, malformed, put_expiry_and_value, take_expiry_and_value};
use super::memory::DEFAULT_WATCH_BUFFER;
use super::{
    Backend, BackendError, Event, Item, Key, KeyRange, Revision, WatchError, Watcher, WriteOp, check_write,
    prefix_end, system_clock,
};
use crate::clock::Clock;

/// How long a connection attempt to one peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take (not a watch stream, which lives on).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// HTTP/2 keep-alive: a member that stops answering is noticed within interval + timeout.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(5));
/// The first and the longest pause between attempts to re-open a broken watch stream.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// How long one operation keeps retrying a request that failed because a member is down or an
/// election is under way (see "A member down" in the module docs). An election after the
/// leader's loss takes one to two seconds with etcd's default timings.
const RETRY_BUDGET: Duration = Duration::from_secs(5);
/// The first and the longest pause between two attempts of one request.
const CALL_RETRY_FIRST: Duration = Duration::from_millis(20);
const CALL_RETRY_MAX: Duration = Duration::from_millis(500);
/// gRPC's `Unavailable` status code.
const GRPC_UNAVAILABLE: i32 = 14;
/// gRPC's `Unknown` status code.
const GRPC_UNKNOWN: i32 = 2;

/// What a failed request proves about whether it was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// It never reached a member that could apply it: safe to send again.
    NotApplied,
    /// A member may have applied it (the answer was lost), or it is an election hiccup.
    Ambiguous,
    /// Retrying does not help (authentication, a malformed request, ...).
    Final,
}

/// Classifies an etcd-client error (see "A member down" in the module docs).
fn classify(error: &etcd_client::Error) -> Failure {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return Failure::Final;
    };
    classify_status(i32::from(status.code()), status.message())
}

/// [`classify`] for a gRPC status's code and message.
fn classify_status(code: i32, message: &str) -> Failure {
    // tonic reports a connection that broke under a request (a member killed while the request
    // was being sent: a broken pipe, a reset) as `Unknown` "transport error", not `Unavailable`:
    // a stream broken mid-request, so ambiguous.
    if code == GRPC_UNKNOWN && message == "transport error" {
        return Failure::Ambiguous;
    }
    if code != GRPC_UNAVAILABLE {
        return Failure::Final;
    }
    let not_applied = [
        "tcp connect error",
        "error trying to connect",
        "Connection refused",
        "connection refused",
        "etcdserver: no leader",
    ];
    if not_applied.iter().any(|m| message.contains(m)) {
        Failure::NotApplied
    } else {
        Failure::Ambiguous
    }
}

/// Sends a request made by `op`, again after failures `retry` allows, on a short backoff for at
/// most `RETRY_BUDGET`; returns the last error otherwise. `peers` and `context` are for the log.
async fn retrying<T, Fut>(
    peers: &str,
    context: &'static str,
    retry: Retry,
    mut op: impl FnMut() -> Fut,
) -> Result<T, etcd_client::Error>
where
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + RETRY_BUDGET;
    let mut pause = CALL_RETRY_FIRST;
    loop {
        let error = match op().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let again = match classify(&error) {
            Failure::NotApplied => true,
            Failure::Ambiguous => retry == Retry::Unavailable,
            Failure::Final => false,
        };
        if !again || tokio::time::Instant::now() + pause > deadline {
            return Err(error);
        }
        tracing::debug!(peers, context, %error, "etcd request failed; retrying");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(CALL_RETRY_MAX);
    }
}

/// Which failures a request may be retried after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Only failures that prove the request was not applied.
    NotApplied,
    /// Those and ambiguous ones (reads, `put`, lease grants: see the module docs).
    Unavailable,
}

/// TLS to the etcd peers: the CA that signed their certificates and, when etcd runs with
/// `--client-cert-auth`, this client's certificate and key. All PEM.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA certificate(s) the peers' certificates chain to.
    pub ca_pem: Vec<u8>,
    /// The client certificate and its private key, if etcd asks for one.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("client_certificate", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

/// How to reach the etcd cluster and where the cluster's keys live. Build it with
/// [`EtcdOptions::new`] and the setters.
#[derive(Clone)]
pub struct EtcdOptions {
    peers: Vec<String>,
    prefix: String,
    tls: Option<EtcdTls>,
    user: Option<(String, String)>,
    clock: Arc<dyn Clock>,
    watch_buffer: usize,
}

impl fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The password never appears: only whether there is one.
        f.debug_struct("EtcdOptions")
            .field("peers", &self.peers)
            .field("prefix", &self.prefix)
            .field("tls", &self.tls)
            .field("username", &self.user.as_ref().map(|(name, _)| name))
            .field("password", &self.user.as_ref().map(|_| "<redacted>"))
            .field("watch_buffer", &self.watch_buffer)
            .finish_non_exhaustive()
    }
}

impl EtcdOptions {
    /// The peers' client URLs (`https://etcd1:2379`, ...) and the cluster's key prefix (without
    /// a trailing `/`; one is added).
    pub fn new(peers: impl IntoIterator<Item = impl Into<String>>, prefix: impl Into<String>) -> Self {
        Self {
            peers: peers.into_iter().map(Into::into).collect(),
            prefix: prefix.into(),
            tls: None,
            user: None,
            clock: system_clock(),
            watch_buffer: DEFAULT_WATCH_BUFFER,
        }
    }

    /// Speaks TLS to the peers.
    pub fn tls(mut self, tls: EtcdTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Signs in to etcd (etcd's `auth enable`) as `username`.
    pub fn user(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((username.into(), password.into()));
        self
    }

    /// Reads the time from `clock` for expiry (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How many events a watcher may fall behind before it lags (default 4096).
    pub fn watch_buffer(mut self, events: usize) -> Self {
        self.watch_buffer = events.max(1);
        self
    }

    /// The peers.
    pub fn peers(&self) -> &[String] {
        &self.peers
    }
}

/// What went wrong talking to etcd, naming the peers.
#[derive(Debug, thiserror::Error)]
#[error("etcd at {peers}: {source}")]
pub struct EtcdError {
    peers: String,
    #[source]
    source: etcd_client::Error,
}

/// The [`Backend`] on etcd. Cheap to clone; share it in an `Arc`. Dropping the last clone ends
/// its watchers with [`WatchError::Closed`].
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    peers: String,
    /// The namespace: the configured prefix followed by `/`.
    namespace: Vec<u8>,
    clock: Arc<dyn Clock>,
    watch_buffer: usize,
    /// Dropped with the backend: every watch task sees the channel close and stops.
    shutdown: watch::Sender<()>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("peers", &self.inner.peers)
            .field("namespace", &String::from_utf8_lossy(&self.inner.namespace))
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the etcd cluster and checks that it answers (a read under the prefix).
    pub async fn connect(options: EtcdOptions) -> Result<Self, BackendError> {
        let peers = options.peers.join(",");
        let wrap = |context: &'static str, source| {
            BackendError::storage(
                context,
                EtcdError {
                    peers: peers.clone(),
                    source,
                },
            )
        };
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(KEEP_ALIVE.0, KEEP_ALIVE.1)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some(tls) = &options.tls {
            let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.client {
                config = config.identity(Identity::from_pem(cert, key));
            }
            connect = connect.with_tls(config);
        }
        if let Some((name, password)) = &options.user {
            connect = connect
                .with_user(name.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        // With a user, connecting signs in: one request, balanced like any other, so it is
        // retried like a read (a second sign-in only makes another token).
        let client = retrying(&peers, "connecting to etcd", Retry::Unavailable, || {
            Client::connect(&options.peers, Some(connect.clone()))
        })
        .await
        .map_err(|e| wrap("connecting to etcd", e))?;
        let mut namespace = options.prefix.into_bytes();
        namespace.push(b'/');
        let (shutdown, _) = watch::channel(());
        let backend = Self {
            inner: Arc::new(Inner {
                client,
                peers: peers.clone(),
                namespace,
                clock: options.clock,
                watch_buffer: options.watch_buffer,
                shutdown,
            }),
        };
        backend.current_revision().await?;
        Ok(backend)
    }

    /// The etcd key of `key`.
    fn etcd_key(&self, key: &Key) -> Vec<u8> {
        let mut out = self.inner.namespace.clone();
        out.extend_from_slice(key.as_bytes());
        out
    }

    /// [`retrying`] on this backend's peers.
    async fn call_raw<T, Fut>(
        &self,
        context: &'static str,
        retry: Retry,
        op: impl FnMut() -> Fut,
    ) -> Result<T, etcd_client::Error>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        retrying(&self.inner.peers, context, retry, op).await
    }

    /// [`call_raw`](Self::call_raw) with the error wrapped for the caller.
    async fn call<T, Fut>(
        &self,
        context: &'static str,
        retry: Retry,
        op: impl FnMut() -> Fut,
    ) -> Result<T, BackendError>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_raw(context, retry, op)
            .await
            .map_err(|e| self.err(context, e))
    }

    fn err(&self, context: &'static str, source: etcd_client::Error) -> BackendError {
        BackendError::storage(
            context,
            EtcdError {
                peers: self.inner.peers.clone(),
                source,
            },
        )
    }

    /// The item stored at `key` (expired or not) and its raw etcd key-value.
    async fn read(&self, key: &Key) -> Result<Option<(Item, i64)>, BackendError> {
        let etcd_key = self.etcd_key(key);
        let resp = self
            .call("reading an item", Retry::Unavailable, || {
                let mut kv = self.inner.client.kv_client();
                let etcd_key = etcd_key.clone();
                async move { kv.get(etcd_key, None).await }
            })
            .await?;
        match resp.kvs().first() {
            Some(found) => Ok(Some((decode(key.clone(), found)?, found.mod_revision()))),
            None => Ok(None),
        }
    }

    /// A lease for an item expiring at `at`: its TTL is the time left by our clock, rounded up
    /// to a whole second (at least one).
    async fn lease_for(&self, at: SystemTime) -> Result<i64, BackendError> {
        let left = at
            .duration_since(self.inner.clock.now())
            .unwrap_or(Duration::ZERO);
        let ttl = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        let ttl = i64::try_from(ttl.max(1)).unwrap_or(i64::MAX);
        let resp = self
            .call(
                "granting a lease for an expiring item",
                Retry::Unavailable,
                || {
                    let mut leases = self.inner.client.lease_client();
                    async move { leases.grant(ttl, None).await }
                },
            )
            .await?;
        Ok(resp.id())
    }

    async fn put_op(&self, item: &Item) -> Result<TxnOp, BackendError> {
        let options = match item.expires {
            Some(at) => Some(PutOptions::new().with_lease(self.lease_for(at).await?)),
            None => None,
        };
        Ok(TxnOp::put(self.etcd_key(&item.key), encode(item), options))
    }

    /// A guarded write: `op` is checked against the key's current item, then committed in a
    /// transaction guarded by what was read; a failed guard means a concurrent writer, so read
    /// and decide again. A transaction whose outcome is unknown (the answer was lost) is not
    /// resent as is: the next round reads the key and first checks whether it was applied (see
    /// "A member down" in the module docs).
    async fn guarded(&self, op: WriteOp, item: Item) -> Result<Revision, BackendError> {
        let etcd_key = self.etcd_key(&item.key);
        let deadline = tokio::time::Instant::now() + RETRY_BUDGET;
        let mut pause = CALL_RETRY_FIRST;
        // The guard's mod_revision (0: absent) of the last transaction with an unknown outcome.
        let mut unknown_after: Option<i64> = None;
        loop {
            let now = self.inner.clock.now();
            let current = self.read(&item.key).await?;
            if let Some(guarded_at) = unknown_after
                && let Some(revision) = self.applied(&op, &item, current.as_ref(), guarded_at).await?
            {
                return Ok(revision);
            }
            let live = current.as_ref().map(|(i, _)| i).filter(|i| !i.is_expired(now));
            check_write(&op, &item.key, live)?;
            let guarded_at = current.as_ref().map_or(0, |(_, mod_revision)| *mod_revision);
            let guard = match &current {
                Some((_, mod_revision)) => {
                    Compare::mod_revision(etcd_key.clone(), CompareOp::Equal, *mod_revision)
                }
                None => Compare::create_revision(etcd_key.clone(), CompareOp::Equal, 0),
            };
            let write = match op {
                WriteOp::Delete => TxnOp::delete(etcd_key.clone(), None),
                _ => self.put_op(&item).await?,
            };
            let txn = Txn::new().when([guard]).and_then([write]);
            let sent = self
                .call_raw("committing a write", Retry::NotApplied, || {
                    let mut kv = self.inner.client.kv_client();
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .await;
            match sent {
                Ok(resp) if resp.succeeded() => return revision_of(resp.header().map(|h| h.revision())),
                // Another writer came in between: read and decide again.
                Ok(_) => {}
                Err(e) => {
                    if classify(&e) != Failure::Ambiguous || tokio::time::Instant::now() + pause > deadline {
                        return Err(self.err("committing a write", e));
                    }
                    tracing::debug!(peers = %self.inner.peers, error = %e,
                        "etcd transaction outcome unknown; reading the key again");
                    unknown_after = Some(guarded_at);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(CALL_RETRY_MAX);
                }
            }
        }
    }

    /// Whether a guarded write whose transaction (guarded by `guarded_at`) had an unknown
    /// outcome was applied, judged by the key's state now: the value written (or, for a delete,
    /// no key) at a later revision. Returns the write's revision if so.
    async fn applied(
        &self,
        op: &WriteOp,
        item: &Item,
        current: Option<&(Item, i64)>,
        guarded_at: i64,
    ) -> Result<Option<Revision>, BackendError> {
        match (op, current) {
            (WriteOp::Delete, None) if guarded_at > 0 => Ok(Some(self.current_revision().await?)),
            (WriteOp::Delete, _) => Ok(None),
            (_, Some((stored, mod_revision)))
                if *mod_revision > guarded_at
                    && stored.value == item.value
                    && stored.expires == item.expires =>
            {
                Ok(Some(to_revision(*mod_revision)))
            }
            _ => Ok(None),
        }
    }

    fn range_bounds(&self, range: &KeyRange) -> (Vec<u8>, Vec<u8>) {
        match range {
            KeyRange::Prefix(prefix) => {
                let start = self.etcd_key(prefix);
                // The namespace ends with `/`, never 0xff: the prefix end exists.
                let end = prefix_end(&start).unwrap_or_default();
                (start, end)
            }
            KeyRange::Between { start, end } => (self.etcd_key(start), self.etcd_key(end)),
        }
    }

    /// Every key-value in `start..end` (etcd returns them sorted by key, ascending).
    async fn get_range(
        &self,
        context: &'static str,
        start: Vec<u8>,
        end: Vec<u8>,
    ) -> Result<etcd_client::GetResponse, BackendError> {
        self.call(context, Retry::Unavailable, || {
            let mut kv = self.inner.client.kv_client();
            let (start, end) = (start.clone(), end.clone());
            async move { kv.get(start, Some(GetOptions::new().with_range(end))).await }
        })
        .await
    }

    /// The key of an etcd key under the namespace.
    fn our_key(&self, etcd_key: &[u8]) -> Option<Key> {
        etcd_key
            .strip_prefix(self.inner.namespace.as_slice())
            .map(|k| Key::new(k.to_vec()))
    }
}

/// An etcd revision as a [`Revision`] (see the module docs).
fn to_revision(etcd: i64) -> Revision {
    Revision(u64::try_from(etcd).unwrap_or(0).saturating_sub(1))
}

fn revision_of(header_revision: Option<i64>) -> Result<Revision, BackendError> {
    header_revision.map(to_revision).ok_or_else(|| {
        BackendError::storage(
            "reading etcd's answer",
            MalformedValue {
                key: Key::default(),
                reason: "the response has no header",
            },
        )
    })
}

fn encode(item: &Item) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 1 + 12 + item.value.len());
    out.push(FORMAT_V1);
    put_expiry_and_value(&mut out, item);
    out
}

fn decode(key: Key, kv: &KeyValue) -> Result<Item, BackendError> {
    let (&version, rest) = kv.value().split_first().ok_or_else(|| malformed(&key, "empty"))?;
    if version != FORMAT_V1 {
        return Err(malformed(&key, "unknown format version"));
    }
    let (expires, value) = take_expiry_and_value(rest).map_err(|reason| malformed(&key, reason))?;
    Ok(Item {
        key,
        value: value.to_vec(),
        revision: to_revision(kv.mod_revision()),
        expires,
    })
}

#[async_trait]
impl Backend for EtcdBackend {
    async fn get(&self, key: &Key) -> Result<Option<Item>, BackendError> {
        let now = self.inner.clock.now();
        Ok(self
            .read(key)
            .await?
            .map(|(item, _)| item)
            .filter(|i| !i.is_expired(now)))
    }

    async fn put(&self, item: Item) -> Result<Revision, BackendError> {
        let options = match item.expires {
            Some(at) => Some(PutOptions::new().with_lease(self.lease_for(at).await?)),
            None => None,
        };
        let (etcd_key, value) = (self.etcd_key(&item.key), encode(&item));
        let resp = self
            .call("writing an item", Retry::Unavailable, || {
                let mut kv = self.inner.client.kv_client();
                let (etcd_key, value, options) = (etcd_key.clone(), value.clone(), options.clone());
                async move { kv.put(etcd_key, value, options).await }
            })
            .await?;
        revision_of(resp.header().map(|h| h.revision()))
    }

    async fn create(&self, item: Item) -> Result<Revision, BackendError> {
        self.guarded(WriteOp::Create, item).await
    }

    async fn compare_and_swap(&self, expected: Revision, item: Item) -> Result<Revision, BackendError> {
        self.guarded(WriteOp::CompareAndSwap(expected), item).await
    }

    async fn delete(&self, key: &Key) -> Result<Revision, BackendError> {
        self.guarded(WriteOp::Delete, Item::new(key.clone(), Vec::new()))
            .await
    }

    async fn range(&self, range: &KeyRange) -> Result<Vec<Item>, BackendError> {
        let now = self.inner.clock.now();
        let (start, end) = self.range_bounds(range);
        let resp = self.get_range("reading a range", start, end).await?;
        let mut out = Vec::with_capacity(resp.kvs().len());
        // etcd returns a range sorted by key, ascending.
        for kv in resp.kvs() {
            let Some(key) = self.our_key(kv.key()) else {
                continue;
            };
            let item = decode(key, kv)?;
            if !item.is_expired(now) {
                out.push(item);
            }
        }
        Ok(out)
    }

    async fn watch(&self, prefix: &Key) -> Result<Watcher, BackendError> {
        let start = self.current_revision().await?;
        let (tx, rx) = broadcast::channel(self.inner.watch_buffer);
        let task = WatchTask {
            client: self.inner.client.clone(),
            namespace: self.inner.namespace.clone(),
            etcd_prefix: self.etcd_key(prefix),
            peers: self.inner.peers.clone(),
            // etcd revision of the first change wanted: (start + 1) + 1.
            next: i64::try_from(start.0).unwrap_or(i64::MAX).saturating_add(2),
            tx,
            shutdown: self.inner.shutdown.subscribe(),
        };
        tokio::spawn(task.run());
        Ok(Watcher::from_relay(rx, start))
    }

    async fn purge_expired(&self) -> Result<usize, BackendError> {
        let now = self.inner.clock.now();
        let (start, end) = self.range_bounds(&KeyRange::prefix(""));
        let resp = self.get_range("scanning for expired items", start, end).await?;
        let mut purged = 0;
        for kv in resp.kvs() {
            let Some(key) = self.our_key(kv.key()) else {
                continue;
            };
            if !decode(key, kv)?.is_expired(now) {
                continue;
            }
            // Guarded by the revision read: an item rewritten since the scan is left alone.
            let guard = Compare::mod_revision(kv.key().to_vec(), CompareOp::Equal, kv.mod_revision());
            // Resending after an unknown outcome is safe: if the first one was applied, the
            // guard fails and the item is not counted twice.
            let txn = Txn::new()
                .when([guard])
                .and_then([TxnOp::delete(kv.key().to_vec(), None::<DeleteOptions>)]);
            let resp = self
                .call("deleting an expired item", Retry::Unavailable, || {
                    let mut kv = self.inner.client.kv_client();
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .await?;
            if resp.succeeded() {
                purged += 1;
            }
        }
        Ok(purged)
    }

    async fn current_revision(&self) -> Result<Revision, BackendError> {
        // Any read carries the store's revision in its header; count-only reads nothing.
        let resp = self
            .call("reading the store revision", Retry::Unavailable, || {
                let mut kv = self.inner.client.kv_client();
                let namespace = self.inner.namespace.clone();
                async move { kv.get(namespace, Some(GetOptions::new().with_count_only())).await }
            })
            .await?;
        revision_of(resp.header().map(|h| h.revision()))
    }
}

/// Feeds one [`Watcher`] from etcd, re-opening the stream where it broke.
struct WatchTask {
    client: Client,
    namespace: Vec<u8>,
    etcd_prefix: Vec<u8>,
    peers: String,
    /// The etcd revision of the next change to deliver.
    next: i64,
    tx: broadcast::Sender<Result<Event, WatchError>>,
    shutdown: watch::Receiver<()>,
}

/// Why a watch stream stopped.
enum StreamEnd {
    /// The backend was dropped or the watcher was: stop.
    Stop,
    /// The stream broke (member gone, network): re-open from `next`. `opened` tells whether
    /// it had been opened (a member answered) or the attempt failed at once (say, balanced onto
    /// a member that is down).
    Broken { reason: String, opened: bool },
}

impl WatchTask {
    async fn run(mut self) {
        let mut pause = RETRY_FIRST;
        loop {
            match self.stream_once().await {
                StreamEnd::Stop => return,
                StreamEnd::Broken { reason, opened } => {
                    tracing::warn!(peers = %self.peers, next_revision = self.next, %reason,
                        "etcd watch stream broke; re-opening it from the next revision");
                    // A stream that worked starts a fresh backoff: the next attempt is balanced
                    // afresh and most likely reaches a live member at once.
                    if opened {
                        pause = RETRY_FIRST;
                    }
                }
            }
            tokio::select! {
                _ = self.shutdown.changed() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RETRY_MAX);
            if self.tx.receiver_count() == 0 {
                return;
            }
        }
    }

    async fn stream_once(&mut self) -> StreamEnd {
        let options = WatchOptions::new()
            .with_range(prefix_end(&self.etcd_prefix).unwrap_or_default())
            .with_start_revision(self.next);
        let mut watch_client = self.client.watch_client();
        let opened = tokio::select! {
            _ = self.shutdown.changed() => return StreamEnd::Stop,
            opened = watch_client.watch(self.etcd_prefix.clone(), Some(options)) => opened,
        };
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(e) => {
                return StreamEnd::Broken {
                    reason: e.to_string(),
                    opened: false,
                };
            }
        };
        loop {
            let message = tokio::select! {
                _ = self.shutdown.changed() => return StreamEnd::Stop,
                message = stream.message() => message,
            };
            let resp = match message {
                Ok(Some(resp)) => resp,
                Ok(None) => {
                    return StreamEnd::Broken {
                        reason: "the stream ended".to_string(),
                        opened: true,
                    };
                }
                Err(e) => {
                    return StreamEnd::Broken {
                        reason: e.to_string(),
                        opened: true,
                    };
                }
            };
            if resp.compact_revision() > 0 {
                tracing::warn!(peers = %self.peers, needed = self.next, compacted = resp.compact_revision(),
                    "etcd compacted the history a watch needed; the watcher re-lists");
                let _ = self.tx.send(Err(WatchError::Compacted {
                    revision: to_revision(resp.compact_revision()),
                }));
                return StreamEnd::Stop;
            }
            if resp.canceled() {
                return StreamEnd::Broken {
                    reason: format!("etcd cancelled the watch: {}", resp.cancel_reason()),
                    opened: true,
                };
            }
            for event in resp.events() {
                let Some(kv) = event.kv() else { continue };
                let Some(key) = kv.key().strip_prefix(self.namespace.as_slice()) else {
                    continue;
                };
                let key = Key::new(key.to_vec());
                let delivered = match event.event_type() {
                    EventType::Put => match decode(key, kv) {
                        Ok(item) => Ok(Event::Put(item)),
                        Err(e) => {
                            tracing::error!(error = %e, "undecodable item in an etcd watch; closing the watch");
                            Err(WatchError::Closed)
                        }
                    },
                    EventType::Delete => Ok(Event::Delete {
                        key,
                        revision: to_revision(kv.mod_revision()),
                    }),
                };
                let stop = delivered.is_err();
                self.next = kv.mod_revision().saturating_add(1);
                if self.tx.send(delivered).is_err() || stop {
                    // No watcher left (dropped), or the watch is finished.
                    return StreamEnd::Stop;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request on a connection that broke under it is retried as ambiguous (reads and
    /// idempotent writes again, guarded writes decide again); other unknown errors are final;
    /// refused connections and "no leader" were never applied.
    #[test]
    fn failures_are_classified_by_what_they_prove() {
        assert_eq!(
            classify_status(GRPC_UNKNOWN, "transport error"),
            Failure::Ambiguous
        );
        assert_eq!(classify_status(GRPC_UNKNOWN, "something else"), Failure::Final);
        assert_eq!(
            classify_status(
                GRPC_UNAVAILABLE,
                "tcp connect error: Connection refused (os error 111)"
            ),
            Failure::NotApplied
        );
        assert_eq!(
            classify_status(GRPC_UNAVAILABLE, "etcdserver: no leader"),
            Failure::NotApplied
        );
        assert_eq!(
            classify_status(GRPC_UNAVAILABLE, "etcdserver: leader changed"),
            Failure::Ambiguous
        );
        assert_eq!(
            classify_status(3, "etcdserver: key is not provided"),
            Failure::Final
        );
    }
}

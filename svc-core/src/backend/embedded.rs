//! [`EmbeddedBackend`]: the default [`Backend`], one redb database file in the data directory.
//!
//! redb is a pure-Rust, copy-on-write B-tree with ACID transactions. Every write is committed
//! with `Durability::Immediate` (redb's default: the commit returns only after the data and the
//! new root are fsynced) before it is acknowledged, so an acknowledged write survives `kill -9`
//! and power loss, and a crash mid-commit leaves the previous committed state. Writes are
//! serialized by one lock, which also orders the watch events; they run on tokio's blocking
//! pool because a commit waits for the disk.
//!
//! Group commit: writes that arrive while a commit waits for the disk queue up, and the next
//! holder of the lock commits them all in one transaction, one fsync for the lot (at most
//! 512 writes). Each keeps its own revision, its own check (a create, compare-and-swap
//! or delete sees the writes queued before it) and its own answer; one that fails its check
//! changes nothing and does not fail the others. Under many concurrent writers (agents'
//! heartbeats) this turns one fsync per write into one per batch.
//!
//! Layout: table `items` maps the key bytes to an encoded [`Item`] (see [`encode_value`]); table
//! `meta` holds the revision counter, so revisions keep growing across restarts.
//!
//! The file holds the CA private keys and the password hashes, so it is created mode `0600` (an
//! existing file readable by others is tightened, with a warning), and [`EmbeddedBackend::open_in_dir`]
//! creates the data directory `0700` ([`crate::fs`]).

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::SystemTime;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use tokio::sync::{broadcast, oneshot};

use super::codec::{FORMAT_V1, malformed, put_expiry_and_value, take_expiry_and_value};
use super::memory::DEFAULT_WATCH_BUFFER;
use super::{
    Backend, BackendError, Event, Item, Key, KeyRange, Revision, Watcher, WriteOp, check_write, system_clock,
};
use crate::clock::Clock;

const ITEMS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("items");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const REVISION: &str = "revision";

/// The most writes committed in one transaction.
const MAX_BATCH: usize = 512;

/// The crash-safe default [`Backend`]: a redb database file. Share it in an `Arc`.
pub struct EmbeddedBackend {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    path: PathBuf,
    /// Held for the whole of every commit (including the fsync); holds the last committed
    /// revision.
    writer: Mutex<Revision>,
    /// Writes waiting for a commit; whoever holds `writer` next takes them all.
    queue: Mutex<Vec<Queued>>,
    /// The last revision announced to watchers. Held only to publish an event or to
    /// subscribe, never across disk I/O, so async callers of `watch` never wait for an fsync.
    published: Mutex<Revision>,
    events: broadcast::Sender<Event>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for EmbeddedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBackend")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl EmbeddedBackend {
    /// The file name used inside a data directory by [`EmbeddedBackend::open_in_dir`].
    pub const FILE_NAME: &'static str = "backend.redb";

    /// Opens (or creates) the database file at `path`. A file left by a crash is recovered to
    /// its last committed state. This does blocking file I/O: call it before serving, or from
    /// `spawn_blocking`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, BackendError> {
        Self::open_with_options(path, system_clock(), DEFAULT_WATCH_BUFFER)
    }

    /// Opens (or creates) `<data_dir>/backend.redb`, creating `data_dir` if needed.
    pub fn open_in_dir(data_dir: impl AsRef<Path>) -> Result<Self, BackendError> {
        let dir = data_dir.as_ref();
        crate::fs::ensure_private_dir(dir)
            .map_err(|e| BackendError::storage("creating the data directory", e))?
            .inspect(crate::fs::log_repair);
        Self::open(dir.join(Self::FILE_NAME))
    }

    /// Like [`open`](Self::open), reading the time from `clock` (for expiry), with watchers
    /// allowed to fall `watch_buffer` events behind before they lag.
    pub fn open_with_options(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
        watch_buffer: usize,
    ) -> Result<Self, BackendError> {
        let path = path.as_ref().to_path_buf();
        create_private(&path)?;
        let db =
            Database::create(&path).map_err(|e| BackendError::storage("opening the database file", e))?;
        // Create both tables up front so readers never meet a missing table.
        let txn = db
            .begin_write()
            .map_err(|e| BackendError::storage("starting the first transaction", e))?;
        let revision = {
            txn.open_table(ITEMS)
                .map_err(|e| BackendError::storage("opening the items table", e))?;
            let meta = txn
                .open_table(META)
                .map_err(|e| BackendError::storage("opening the meta table", e))?;
            meta.get(REVISION)
                .map_err(|e| BackendError::storage("reading the revision", e))?
                .map_or(0, |v| v.value())
        };
        txn.commit()
            .map_err(|e| BackendError::storage("committing the first transaction", e))?;
        let (events, _) = broadcast::channel(watch_buffer.max(1));
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                path,
                writer: Mutex::new(Revision(revision)),
                queue: Mutex::new(Vec::new()),
                published: Mutex::new(Revision(revision)),
                events,
                clock,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, BackendError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, BackendError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| BackendError::storage("running a blocking database task", e))?
    }

    /// Queues the write and commits the queue: this write alone, or with every write queued
    /// meanwhile if a commit was under way.
    async fn write(&self, op: WriteOp, item: Item) -> Result<Revision, BackendError> {
        let (done, answer) = oneshot::channel();
        self.inner
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Queued { op, item, done });
        self.blocking(|inner| {
            inner.commit_queued();
            Ok(())
        })
        .await?;
        // Answered by whichever thread committed it: this one, or the one that held the writer
        // lock when this one tried.
        answer
            .await
            .map_err(|_| BackendError::storage("committing a write", "the write was dropped unanswered"))?
    }
}

/// A write waiting for a commit, and where its answer goes.
struct Queued {
    op: WriteOp,
    item: Item,
    done: oneshot::Sender<Result<Revision, BackendError>>,
}

/// The database holds the CA private keys and the password hashes: it is created `0600` (redb
/// initializes an empty file), and an existing file readable by others is tightened and logged.
fn create_private(path: &Path) -> Result<(), BackendError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(crate::fs::PRIVATE_FILE_MODE);
    }
    opts.open(path)
        .map_err(|e| BackendError::storage("creating the database file", e))?;
    if let Some(repair) = crate::fs::repair_private_file(path)
        .map_err(|e| BackendError::storage("repairing the database file's permissions", e))?
    {
        crate::fs::log_repair(&repair);
    }
    Ok(())
}

impl Inner {
    /// Commits what is queued, in batches of up to [`MAX_BATCH`], unless another thread holds
    /// the writer lock: that thread commits whatever is queued before it lets go (and looks
    /// again after letting go), so a writer never waits in line behind other writers' threads
    /// only to find its write already committed.
    fn commit_queued(&self) {
        loop {
            let mut last = match self.writer.try_lock() {
                Ok(last) => last,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            loop {
                let batch: Vec<Queued> = {
                    let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                    let take = queue.len().min(MAX_BATCH);
                    queue.drain(..take).collect()
                };
                if batch.is_empty() {
                    break;
                }
                self.commit_and_answer(&mut last, batch);
            }
            drop(last);
            // A write queued after the last look but before the lock was free found it held.
            if self
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty()
            {
                return;
            }
        }
    }

    /// Commits `batch` in one transaction and answers each of its writers.
    fn commit_and_answer(&self, last: &mut Revision, batch: Vec<Queued>) {
        let (writes, answers): (Vec<_>, Vec<_>) = batch.into_iter().map(|q| ((q.op, q.item), q.done)).unzip();
        let outcomes = match self.commit_batch(last, writes) {
            Ok(outcomes) => outcomes,
            Err(e) => {
                // Nothing of the batch is committed: every write in it fails.
                let reason = e.to_string();
                answers.into_iter().for_each(|done| {
                    let _ = done.send(Err(BackendError::storage("committing a write", reason.clone())));
                });
                return;
            }
        };
        // Events go out in revision order, before the writers hear back, with the lock held.
        for (outcome, done) in outcomes.into_iter().zip(answers) {
            let answer = outcome.map(|event| {
                let revision = event.revision();
                self.publish(event);
                revision
            });
            // A writer that stopped waiting is not an error: its write is committed all the same.
            let _ = done.send(answer);
        }
    }

    /// Applies `writes` in order in one transaction and commits it (unless none applied). Each
    /// outcome is the write's event or its own refusal; an error is the whole batch's failure.
    fn commit_batch(
        &self,
        last: &mut Revision,
        writes: Vec<(WriteOp, Item)>,
    ) -> Result<Vec<Result<Event, BackendError>>, BackendError> {
        let now = self.clock.now();
        let txn = self
            .db
            .begin_write()
            .map_err(|e| BackendError::storage("starting a write", e))?;
        let mut revision = *last;
        let outcomes = stage(&txn, writes, &mut revision, now)?;
        if revision == *last {
            // Every write was refused: nothing to commit (dropping the transaction aborts it).
            return Ok(outcomes);
        }
        txn.open_table(META)
            .map_err(|e| BackendError::storage("opening the meta table", e))?
            .insert(REVISION, revision.0)
            .map_err(|e| BackendError::storage("writing the revision", e))?;
        // Durability::Immediate is redb's default: this returns after fsync.
        txn.commit()
            .map_err(|e| BackendError::storage("committing a write", e))?;
        *last = revision;
        Ok(outcomes)
    }

    /// Announces a committed change. Called with the writer lock still held, so events go
    /// out in revision order.
    fn publish(&self, event: Event) {
        let mut published = self.published.lock().unwrap_or_else(PoisonError::into_inner);
        *published = event.revision();
        // No watcher is not an error.
        let _ = self.events.send(event);
    }

    fn read_range(&self, range: &KeyRange) -> Result<Vec<Item>, BackendError> {
        let now = self.clock.now();
        let txn = self
            .db
            .begin_read()
            .map_err(|e| BackendError::storage("starting a read", e))?;
        let items = txn
            .open_table(ITEMS)
            .map_err(|e| BackendError::storage("opening the items table", e))?;
        let (start, end) = range.bounds();
        let bounds: (Bound<&[u8]>, Bound<&[u8]>) = (
            Bound::Included(start.as_slice()),
            end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
        );
        let mut out = Vec::new();
        for entry in items
            .range::<&[u8]>(bounds)
            .map_err(|e| BackendError::storage("reading a range", e))?
        {
            let (k, v) = entry.map_err(|e| BackendError::storage("reading a range", e))?;
            let item = decode_value(Key::new(k.value()), v.value())?;
            if !item.is_expired(now) {
                out.push(item);
            }
        }
        Ok(out)
    }
}

/// Writes each of `writes` in `txn` that passes its check against the items as they stand
/// with the earlier writes applied, giving each the next revision after `revision`.
fn stage(
    txn: &WriteTransaction,
    writes: Vec<(WriteOp, Item)>,
    revision: &mut Revision,
    now: SystemTime,
) -> Result<Vec<Result<Event, BackendError>>, BackendError> {
    let mut items = txn
        .open_table(ITEMS)
        .map_err(|e| BackendError::storage("opening the items table", e))?;
    let mut outcomes = Vec::with_capacity(writes.len());
    for (op, mut item) in writes {
        let current = items
            .get(item.key.as_bytes())
            .map_err(|e| BackendError::storage("reading the current item", e))?
            .map(|v| decode_value(item.key.clone(), v.value()));
        // A stored value that does not decode refuses this write only.
        let checked = match current.transpose() {
            Ok(current) => check_write(&op, &item.key, current.filter(|i| !i.is_expired(now)).as_ref()),
            Err(e) => Err(e),
        };
        if let Err(e) = checked {
            outcomes.push(Err(e));
            continue;
        }
        let next = revision.next();
        if matches!(op, WriteOp::Delete) {
            items
                .remove(item.key.as_bytes())
                .map_err(|e| BackendError::storage("deleting an item", e))?;
            outcomes.push(Ok(Event::Delete {
                key: item.key,
                revision: next,
            }));
        } else {
            item.revision = next;
            items
                .insert(item.key.as_bytes(), encode_value(&item).as_slice())
                .map_err(|e| BackendError::storage("writing an item", e))?;
            outcomes.push(Ok(Event::Put(item)));
        }
        *revision = next;
    }
    Ok(outcomes)
}

#[async_trait]
impl Backend for EmbeddedBackend {
    async fn get(&self, key: &Key) -> Result<Option<Item>, BackendError> {
        let key = key.clone();
        self.blocking(move |inner| {
            let now = inner.clock.now();
            let txn = inner
                .db
                .begin_read()
                .map_err(|e| BackendError::storage("starting a read", e))?;
            let items = txn
                .open_table(ITEMS)
                .map_err(|e| BackendError::storage("opening the items table", e))?;
            let found = items
                .get(key.as_bytes())
                .map_err(|e| BackendError::storage("reading an item", e))?;
            match found {
                Some(v) => {
                    Ok(Some(decode_value(key.clone(), v.value())?).filter(|i: &Item| !i.is_expired(now)))
                }
                None => Ok(None),
            }
        })
        .await
    }

    async fn put(&self, item: Item) -> Result<Revision, BackendError> {
        self.write(WriteOp::Put, item).await
    }

    async fn create(&self, item: Item) -> Result<Revision, BackendError> {
        self.write(WriteOp::Create, item).await
    }

    async fn compare_and_swap(&self, expected: Revision, item: Item) -> Result<Revision, BackendError> {
        self.write(WriteOp::CompareAndSwap(expected), item).await
    }

    async fn delete(&self, key: &Key) -> Result<Revision, BackendError> {
        self.write(WriteOp::Delete, Item::new(key.clone(), Vec::new()))
            .await
    }

    async fn range(&self, range: &KeyRange) -> Result<Vec<Item>, BackendError> {
        let range = range.clone();
        self.blocking(move |inner| inner.read_range(&range)).await
    }

    async fn watch(&self, prefix: &Key) -> Result<Watcher, BackendError> {
        // Subscribing under the publish lock: no event can be announced between `revision`
        // and the first event this receiver sees.
        let published = self
            .inner
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let rx = self.inner.events.subscribe();
        Ok(Watcher::from_broadcast(rx, prefix.clone(), *published))
    }

    async fn purge_expired(&self) -> Result<usize, BackendError> {
        self.blocking(|inner| {
            let now = inner.clock.now();
            let mut purged = 0;
            for key in expired_keys(inner, now)? {
                // Each delete re-checks under the writer lock: an item rewritten since the
                // scan is live again and is left alone.
                if inner.purge_one(&key, now)? {
                    purged += 1;
                }
            }
            Ok(purged)
        })
        .await
    }

    async fn current_revision(&self) -> Result<Revision, BackendError> {
        Ok(*self
            .inner
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
    }
}

/// The keys of every expired item (the range read filters them out, so scan raw).
fn expired_keys(inner: &Inner, now: SystemTime) -> Result<Vec<Key>, BackendError> {
    let txn = inner
        .db
        .begin_read()
        .map_err(|e| BackendError::storage("starting a read", e))?;
    let items = txn
        .open_table(ITEMS)
        .map_err(|e| BackendError::storage("opening the items table", e))?;
    let mut out = Vec::new();
    for entry in items
        .iter()
        .map_err(|e| BackendError::storage("scanning items", e))?
    {
        let (k, v) = entry.map_err(|e| BackendError::storage("scanning items", e))?;
        let item = decode_value(Key::new(k.value()), v.value())?;
        if item.is_expired(now) {
            out.push(item.key);
        }
    }
    Ok(out)
}

impl Inner {
    /// Deletes `key` if it is still expired; emits the delete event. Then commits the writes
    /// queued meanwhile: they found the writer lock held (see `commit_queued`).
    fn purge_one(&self, key: &Key, now: SystemTime) -> Result<bool, BackendError> {
        let purged = self.purge_one_locked(key, now);
        self.commit_queued();
        purged
    }

    /// [`Inner::purge_one`] under the writer lock.
    fn purge_one_locked(&self, key: &Key, now: SystemTime) -> Result<bool, BackendError> {
        let mut last = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let txn = self
            .db
            .begin_write()
            .map_err(|e| BackendError::storage("starting a write", e))?;
        let revision = last.next();
        {
            let mut items = txn
                .open_table(ITEMS)
                .map_err(|e| BackendError::storage("opening the items table", e))?;
            let still_expired = items
                .get(key.as_bytes())
                .map_err(|e| BackendError::storage("reading an item", e))?
                .map(|v| decode_value(key.clone(), v.value()))
                .transpose()?
                .is_some_and(|i| i.is_expired(now));
            if !still_expired {
                return Ok(false);
            }
            items
                .remove(key.as_bytes())
                .map_err(|e| BackendError::storage("deleting an expired item", e))?;
            let mut meta = txn
                .open_table(META)
                .map_err(|e| BackendError::storage("opening the meta table", e))?;
            meta.insert(REVISION, revision.0)
                .map_err(|e| BackendError::storage("writing the revision", e))?;
        }
        txn.commit()
            .map_err(|e| BackendError::storage("committing a purge", e))?;
        *last = revision;
        self.publish(Event::Delete {
            key: key.clone(),
            revision,
        });
        Ok(true)
    }
}

/// Encodes an item's stored part: `[version=1][revision u64 BE][has_expiry u8]` then, if the
/// item expires, `[seconds since epoch u64 BE][nanoseconds u32 BE]`, then the value bytes.
fn encode_value(item: &Item) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 + 1 + 12 + item.value.len());
    out.push(FORMAT_V1);
    out.extend_from_slice(&item.revision.0.to_be_bytes());
    put_expiry_and_value(&mut out, item);
    out
}

fn decode_value(key: Key, bytes: &[u8]) -> Result<Item, BackendError> {
    let (&version, rest) = bytes.split_first().ok_or_else(|| malformed(&key, "empty"))?;
    if version != FORMAT_V1 {
        return Err(malformed(&key, "unknown format version"));
    }
    let (revision, rest) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| malformed(&key, "truncated revision"))?;
    let (expires, value) = take_expiry_and_value(rest).map_err(|reason| malformed(&key, reason))?;
    Ok(Item {
        key,
        value: value.to_vec(),
        revision: Revision(u64::from_be_bytes(*revision)),
        expires,
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn value_encoding_round_trips() {
        let mut item = Item::new("/k", b"\x00value".to_vec())
            .with_expiry(UNIX_EPOCH + Duration::new(1_700_000_000, 123));
        item.revision = Revision(42);
        let back = decode_value(item.key.clone(), &encode_value(&item)).unwrap();
        assert_eq!(back, item);
        item.expires = None;
        let back = decode_value(item.key.clone(), &encode_value(&item)).unwrap();
        assert_eq!(back, item);
    }

    #[test]
    fn malformed_values_are_errors() {
        for bad in [
            &b""[..],
            b"\x02",
            b"\x01\x00\x00",
            b"\x01\x00\x00\x00\x00\x00\x00\x00\x01\x07",
        ] {
            let err = decode_value(Key::from("/k"), bad).unwrap_err();
            assert!(err.to_string().contains("/k"), "{err}");
        }
    }
}

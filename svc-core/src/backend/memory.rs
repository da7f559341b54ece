//! [`MemoryBackend`]: the [`Backend`] contract over a sorted map, for tests and for embedding
//! products that keep no state across restarts.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::{
    Backend, BackendError, Event, Item, Key, KeyRange, Revision, Watcher, WriteOp, check_write, system_clock,
};
use crate::clock::Clock;

/// How many events a watcher may fall behind before it gets
/// [`WatchError::Lagged`](super::WatchError::Lagged).
pub(crate) const DEFAULT_WATCH_BUFFER: usize = 4096;

/// An in-memory [`Backend`]. Cloning is not offered: share it in an `Arc`.
pub struct MemoryBackend {
    state: Mutex<State>,
    events: broadcast::Sender<Event>,
    clock: Arc<dyn Clock>,
}

#[derive(Default)]
struct State {
    items: BTreeMap<Key, Item>,
    revision: Revision,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend").finish_non_exhaustive()
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// An empty backend on the system clock.
    pub fn new() -> Self {
        Self::with_options(system_clock(), DEFAULT_WATCH_BUFFER)
    }

    /// An empty backend reading the time from `clock` (for expiry), whose watchers may fall
    /// `watch_buffer` events behind before they lag.
    pub fn with_options(clock: Arc<dyn Clock>, watch_buffer: usize) -> Self {
        let (events, _) = broadcast::channel(watch_buffer.max(1));
        Self {
            state: Mutex::new(State::default()),
            events,
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every write leaves the state consistent before anything can panic, so a poisoned
        // lock still guards valid data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, op: WriteOp, mut item: Item) -> Result<Revision, BackendError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let current = state.items.get(&item.key).filter(|i| !i.is_expired(now));
        check_write(&op, &item.key, current)?;
        let revision = state.revision.next();
        state.revision = revision;
        item.revision = revision;
        let event = if matches!(op, WriteOp::Delete) {
            state.items.remove(&item.key);
            Event::Delete {
                key: item.key,
                revision,
            }
        } else {
            state.items.insert(item.key.clone(), item.clone());
            Event::Put(item)
        };
        // Sent under the lock so watchers see revision order. No receivers is not an error.
        let _ = self.events.send(event);
        Ok(revision)
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn get(&self, key: &Key) -> Result<Option<Item>, BackendError> {
        let now = self.clock.now();
        Ok(self.lock().items.get(key).filter(|i| !i.is_expired(now)).cloned())
    }

    async fn put(&self, item: Item) -> Result<Revision, BackendError> {
        self.write(WriteOp::Put, item)
    }

    async fn create(&self, item: Item) -> Result<Revision, BackendError> {
        self.write(WriteOp::Create, item)
    }

    async fn compare_and_swap(&self, expected: Revision, item: Item) -> Result<Revision, BackendError> {
        self.write(WriteOp::CompareAndSwap(expected), item)
    }

    async fn delete(&self, key: &Key) -> Result<Revision, BackendError> {
        self.write(WriteOp::Delete, Item::new(key.clone(), Vec::new()))
    }

    async fn range(&self, range: &KeyRange) -> Result<Vec<Item>, BackendError> {
        let now = self.clock.now();
        let (start, end) = range.bounds();
        let end = end.map_or(Bound::Unbounded, |e| Bound::Excluded(Key::new(e)));
        Ok(self
            .lock()
            .items
            .range((Bound::Included(Key::new(start)), end))
            .map(|(_, item)| item)
            .filter(|i| !i.is_expired(now))
            .cloned()
            .collect())
    }

    async fn watch(&self, prefix: &Key) -> Result<Watcher, BackendError> {
        let state = self.lock();
        // Subscribing under the lock: no write can land between `revision` and the first
        // event this receiver sees.
        let rx = self.events.subscribe();
        Ok(Watcher::from_broadcast(rx, prefix.clone(), state.revision))
    }

    async fn purge_expired(&self) -> Result<usize, BackendError> {
        let now = self.clock.now();
        let expired: Vec<Key> = self
            .lock()
            .items
            .values()
            .filter(|i| i.is_expired(now))
            .map(|i| i.key.clone())
            .collect();
        let mut purged = 0;
        for key in expired {
            let mut state = self.lock();
            // Re-checked under the lock: the key may have been rewritten meanwhile.
            if state.items.get(&key).is_some_and(|i| i.is_expired(now)) {
                state.items.remove(&key);
                let revision = state.revision.next();
                state.revision = revision;
                let _ = self.events.send(Event::Delete { key, revision });
                purged += 1;
            }
        }
        Ok(purged)
    }

    async fn current_revision(&self) -> Result<Revision, BackendError> {
        Ok(self.lock().revision)
    }
}

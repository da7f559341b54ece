//! Storage: the [`Backend`] trait the Auth Service keeps all cluster state in.
//!
//! Everything the Auth Service owns — certificate authorities, users, roles, join tokens,
//! resources, the agent inventory — is an [`Item`] under a [`Key`]. The Auth gRPC API (in
//! `svc-net`) reads and writes items here and turns [`Watcher`] events into cache updates for
//! proxies and agents. Two implementations live in this module:
//!
//! - [`MemoryBackend`]: a map behind a mutex, for unit tests and for embedding products that do
//!   not persist.
//! - [`EmbeddedBackend`]: the default, an ACID database file (redb) in the data directory, with
//!   durable commits: a write that returned `Ok` survives `kill -9` and power loss.
//! - `EtcdBackend` (feature `etcd`): an etcd 3.4+ cluster, shared by several Auth Services;
//!   its module docs say how revisions, expiry and watches map onto etcd.
//!
//! Every implementation follows one contract, so callers do not change with the backend:
//!
//! - The backend assigns every write a [`Revision`] from one cluster-wide counter that only
//!   grows (etcd's `mod_revision`). Deleting a key also takes a revision.
//! - [`Backend::compare_and_swap`] is the only way to update safely under concurrency: it names
//!   the revision the caller read, and fails with [`BackendError::RevisionMismatch`] if anyone
//!   wrote the key since.
//! - [`Backend::watch`] first yields [`Event::Init`] carrying the revision the watch starts
//!   after, then every change under the prefix in revision order. A watcher that cannot keep up
//!   gets [`WatchError::Lagged`] (or, on etcd, [`WatchError::Compacted`] when the history it
//!   needed to resume was compacted) and must re-list (`range`) and watch again; it never
//!   silently misses an event.
//! - Items may carry an expiry. Reads treat an expired item as absent at once;
//!   [`Backend::purge_expired`] removes expired items and emits their [`Event::Delete`]s (etcd
//!   does the same with leases), so the server calls it periodically.

#[cfg(any(feature = "storage", feature = "etcd"))]
mod codec;
#[cfg(feature = "storage")]
mod embedded;
#[cfg(feature = "etcd")]
mod etcd;
mod memory;
mod watch;

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;

use crate::clock::{Clock, SystemClock};

#[cfg(feature = "storage")]
pub use embedded::EmbeddedBackend;
#[cfg(feature = "etcd")]
pub use etcd::{EtcdBackend, EtcdError, EtcdOptions, EtcdTls};
pub use memory::MemoryBackend;
pub use watch::{WatchError, Watcher};

/// A key: a byte string of `/`-separated segments, such as `/authorities/host/example.com`.
///
/// Keys are compared and ranged as raw bytes. A prefix matches byte-wise, so `/a` matches
/// `/ab/c`; use a trailing `/` (`/a/`) to mean "everything under the segment `a`".
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key(Vec<u8>);

impl Key {
    /// Wraps raw key bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// Builds `/seg1/seg2/...` from segments. Segments are taken as they are; callers keep `/`
    /// out of them (a name with a `/` would read as two segments).
    pub(crate) fn from_segments<S: AsRef<[u8]>>(segments: impl IntoIterator<Item = S>) -> Self {
        let mut bytes = Vec::new();
        for segment in segments {
            bytes.push(b'/');
            bytes.extend_from_slice(segment.as_ref());
        }
        Self(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether this key starts with `prefix` (byte-wise).
    pub fn has_prefix(&self, prefix: &Key) -> bool {
        self.0.starts_with(&prefix.0)
    }

    /// The key's segments (the parts between `/`), empty segments skipped.
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|b| *b == b'/').filter(|s| !s.is_empty())
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Self(s.as_bytes().to_vec())
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Self(s.into_bytes())
    }
}

impl From<Vec<u8>> for Key {
    fn from(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are ASCII paths in practice; anything else prints escaped so a log line stays
        // one line.
        write!(f, "{}", self.0.escape_ascii())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(\"{self}\")")
    }
}

/// The revision a backend assigned to a write. Revisions come from one counter per backend
/// that only grows, so a larger revision is a later write. `Revision::ZERO` is never assigned.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug)]
pub struct Revision(pub u64);

impl Revision {
    /// The revision before any write.
    pub const ZERO: Revision = Revision(0);

    /// The revision after this one.
    pub fn next(self) -> Revision {
        Revision(self.0 + 1)
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A stored resource's opaque revision ([`crate::resource::Revision`], what `tctl` and the API
/// show and send back for compare-and-swap) is the backend revision written as a number.
impl From<Revision> for crate::resource::Revision {
    fn from(revision: Revision) -> Self {
        crate::resource::Revision::from(revision.0)
    }
}

/// One stored value.
///
/// On writes (`put`, `create`, `compare_and_swap`) the `revision` field is ignored: the backend
/// assigns it and returns it. On reads and in events it is the revision of the last write to
/// the key.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Item {
    /// Where the value lives.
    pub key: Key,
    /// The stored bytes (usually a serialized resource).
    pub value: Vec<u8>,
    /// The revision of the write that stored this value.
    pub revision: Revision,
    /// When the item stops existing, if ever.
    pub expires: Option<SystemTime>,
}

impl Item {
    /// An item to write: no revision yet, no expiry.
    pub fn new(key: impl Into<Key>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            revision: Revision::ZERO,
            expires: None,
        }
    }

    /// The same item, expiring at `at`.
    pub fn with_expiry(mut self, at: SystemTime) -> Self {
        self.expires = Some(at);
        self
    }

    /// Whether the item has expired at `now` (an item expiring exactly at `now` has).
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires.is_some_and(|at| at <= now)
    }
}

/// Which keys a [`Backend::range`] returns.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum KeyRange {
    /// Every key that starts with these bytes.
    Prefix(Key),
    /// Keys `k` with `start <= k < end`.
    Between {
        /// First key included.
        start: Key,
        /// First key excluded.
        end: Key,
    },
}

impl KeyRange {
    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: impl Into<Key>) -> Self {
        Self::Prefix(prefix.into())
    }

    /// Keys in `[start, end)`.
    pub fn between(start: impl Into<Key>, end: impl Into<Key>) -> Self {
        Self::Between {
            start: start.into(),
            end: end.into(),
        }
    }

    /// The range as `[start, end)` bytes; `None` as the end means "to the last key".
    pub(crate) fn bounds(&self) -> (Vec<u8>, Option<Vec<u8>>) {
        match self {
            KeyRange::Prefix(prefix) => (prefix.0.clone(), prefix_end(&prefix.0)),
            KeyRange::Between { start, end } => (start.0.clone(), Some(end.0.clone())),
        }
    }

    /// Whether `key` is in the range.
    pub fn contains(&self, key: &Key) -> bool {
        match self {
            KeyRange::Prefix(prefix) => key.has_prefix(prefix),
            KeyRange::Between { start, end } => start <= key && key < end,
        }
    }
}

/// The smallest key greater than every key starting with `prefix` (etcd's "range end" for a
/// prefix): the prefix with its last byte below 0xff incremented and what follows dropped.
/// `None` when no such key exists (empty prefix or all 0xff), meaning "no upper bound".
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A change delivered by a [`Watcher`].
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Event {
    /// First event of every watch: every later event has a revision greater than `revision`.
    /// A cache lists (`range`) after receiving it and skips events not newer than what it
    /// listed.
    Init {
        /// The backend's revision when the watch started.
        revision: Revision,
    },
    /// A key was created or updated; the item carries its new revision.
    Put(Item),
    /// A key was deleted (explicitly or because it expired).
    Delete {
        /// The deleted key.
        key: Key,
        /// The revision of the deletion.
        revision: Revision,
    },
}

impl Event {
    /// The revision of the change (for `Init`, the revision the watch starts after).
    pub fn revision(&self) -> Revision {
        match self {
            Event::Init { revision } | Event::Delete { revision, .. } => *revision,
            Event::Put(item) => item.revision,
        }
    }

    /// The key changed, if the event is a change.
    pub fn key(&self) -> Option<&Key> {
        match self {
            Event::Init { .. } => None,
            Event::Put(item) => Some(&item.key),
            Event::Delete { key, .. } => Some(key),
        }
    }
}

/// Why a backend operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The key does not exist (or has expired).
    #[error("key {key} not found")]
    NotFound {
        /// The key looked for.
        key: Key,
    },
    /// `create` found the key already there.
    #[error("key {key} already exists")]
    AlreadyExists {
        /// The key that exists.
        key: Key,
    },
    /// `compare_and_swap` found another revision than the caller read: someone else wrote the
    /// key in between. Read again and retry.
    #[error("key {key}: expected revision {expected}, found revision {found}")]
    RevisionMismatch {
        /// The key written.
        key: Key,
        /// The revision the caller expected.
        expected: Revision,
        /// The revision the key has now.
        found: Revision,
    },
    /// The storage itself failed (I/O, corruption, a closed database).
    #[error("storage failed while {context}: {source}")]
    Storage {
        /// What the backend was doing.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl BackendError {
    // Only the embedded and etcd backends (features `storage`, `etcd`) have storage to fail.
    #[cfg_attr(not(any(feature = "storage", feature = "etcd")), allow(dead_code))]
    pub(crate) fn storage(
        context: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Storage {
            context,
            source: source.into(),
        }
    }
}

/// The system clock, the default for expiry checks.
pub(crate) fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// The storage contract of the Auth Service. See the [module docs](self) for the semantics
/// every implementation follows.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The live item at `key`, or `None` if it does not exist or has expired.
    async fn get(&self, key: &Key) -> Result<Option<Item>, BackendError>;

    /// Writes `item` whether or not the key exists; returns the new revision.
    async fn put(&self, item: Item) -> Result<Revision, BackendError>;

    /// Writes `item` only if its key does not exist (an expired item counts as absent).
    /// Fails with [`BackendError::AlreadyExists`] otherwise.
    async fn create(&self, item: Item) -> Result<Revision, BackendError>;

    /// Writes `item` only if its key currently has revision `expected`. Fails with
    /// [`BackendError::NotFound`] if the key does not exist and
    /// [`BackendError::RevisionMismatch`] if it has another revision.
    async fn compare_and_swap(&self, expected: Revision, item: Item) -> Result<Revision, BackendError>;

    /// Deletes `key`; returns the revision of the deletion. Fails with
    /// [`BackendError::NotFound`] if the key does not exist.
    async fn delete(&self, key: &Key) -> Result<Revision, BackendError>;

    /// The live items in `range`, ordered by key.
    async fn range(&self, range: &KeyRange) -> Result<Vec<Item>, BackendError>;

    /// Watches every key starting with `prefix`: first [`Event::Init`], then every change in
    /// revision order.
    async fn watch(&self, prefix: &Key) -> Result<Watcher, BackendError>;

    /// Deletes every expired item, emitting a [`Event::Delete`] for each; returns how many.
    async fn purge_expired(&self) -> Result<usize, BackendError>;

    /// The revision of the latest write.
    async fn current_revision(&self) -> Result<Revision, BackendError>;
}

/// A write, checked against the key's current item by [`check_write`]. Shared by both
/// implementations so they cannot disagree on the rules.
#[derive(Debug)]
pub(crate) enum WriteOp {
    Put,
    Create,
    CompareAndSwap(Revision),
    Delete,
}

/// Decides whether `op` may proceed given the key's current item (already filtered for
/// expiry: `None` when absent or expired).
pub(crate) fn check_write(op: &WriteOp, key: &Key, current: Option<&Item>) -> Result<(), BackendError> {
    match (op, current) {
        (WriteOp::Put, _) => Ok(()),
        (WriteOp::Create, None) => Ok(()),
        (WriteOp::Create, Some(_)) => Err(BackendError::AlreadyExists { key: key.clone() }),
        (WriteOp::CompareAndSwap(_) | WriteOp::Delete, None) => {
            Err(BackendError::NotFound { key: key.clone() })
        }
        (WriteOp::CompareAndSwap(expected), Some(item)) if item.revision != *expected => {
            Err(BackendError::RevisionMismatch {
                key: key.clone(),
                expected: *expected,
                found: item.revision,
            })
        }
        (WriteOp::CompareAndSwap(_) | WriteOp::Delete, Some(_)) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte_below_ff() {
        assert_eq!(prefix_end(b"/a/"), Some(b"/a0".to_vec()));
        assert_eq!(prefix_end(b"a\xff\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn resource_revision_is_the_backend_revision() {
        let r: crate::resource::Revision = Revision(42).into();
        assert_eq!(r.as_str(), "42");
    }

    #[test]
    fn key_segments_and_display() {
        let key = Key::from_segments(["authorities", "host", "example.com"]);
        assert_eq!(key.as_bytes(), b"/authorities/host/example.com");
        let segments: Vec<_> = key.segments().collect();
        assert_eq!(segments, [&b"authorities"[..], b"host", b"example.com"]);
        assert_eq!(Key::new(b"/a\n".to_vec()).to_string(), "/a\\n");
    }

    #[test]
    fn ranges_contain_what_they_bound() {
        let r = KeyRange::prefix("/a/");
        assert!(r.contains(&Key::from("/a/b")));
        assert!(!r.contains(&Key::from("/ab")));
        let r = KeyRange::between("/b", "/d");
        assert!(r.contains(&Key::from("/b")));
        assert!(r.contains(&Key::from("/c/x")));
        assert!(!r.contains(&Key::from("/d")));
    }

    #[test]
    fn write_rules() {
        let key = Key::from("/k");
        let mut item = Item::new("/k", "v");
        item.revision = Revision(3);
        assert!(check_write(&WriteOp::Put, &key, Some(&item)).is_ok());
        assert!(matches!(
            check_write(&WriteOp::Create, &key, Some(&item)),
            Err(BackendError::AlreadyExists { .. })
        ));
        assert!(matches!(
            check_write(&WriteOp::CompareAndSwap(Revision(2)), &key, Some(&item)),
            Err(BackendError::RevisionMismatch {
                expected: Revision(2),
                found: Revision(3),
                ..
            })
        ));
        assert!(check_write(&WriteOp::CompareAndSwap(Revision(3)), &key, Some(&item)).is_ok());
        assert!(matches!(
            check_write(&WriteOp::Delete, &key, None),
            Err(BackendError::NotFound { .. })
        ));
    }
}

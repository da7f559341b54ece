//! The receiving end of [`Backend::watch`](super::Backend::watch).
//!
//! The local backends fan every committed change out on one `tokio::sync::broadcast` channel,
//! sent while the writer still holds the write lock, so receivers see changes in revision
//! order. Each [`Watcher`] filters by its prefix. A watcher whose buffer overflows gets
//! [`WatchError::Lagged`] once and is closed: the caller re-lists and watches again, which is
//! exactly what an etcd watcher does after a compaction. The buffer is shared by all prefixes,
//! so a busy prefix can make a watcher of a quiet one lag too (and `missed` counts events of
//! every prefix): the remedy is the same re-list. Other implementations (etcd) feed a watcher
//! through [`Watcher::from_channel`].

use tokio::sync::{broadcast, mpsc};

use super::{Event, Key, Revision};

/// Why a [`Watcher`] stopped delivering events. After either error the watcher is finished:
/// re-list with `range` and start a new watch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WatchError {
    /// The watcher fell behind and `missed` events were dropped before it read them.
    #[error("watcher fell behind and missed {missed} events; re-list and watch again")]
    Lagged {
        /// How many events were lost.
        missed: u64,
    },
    /// The backend is gone (dropped or shut down).
    #[error("watch closed by the backend; re-list and watch again")]
    Closed,
    /// The backend discarded the history the watcher needed to resume (etcd compacted it up to
    /// `revision` while the watch was reconnecting): re-list and watch again.
    #[error(
        "the history the watch needed was compacted (up to revision {revision}); re-list and watch again"
    )]
    Compacted {
        /// The revision up to which history is gone.
        revision: Revision,
    },
}

/// A stream of [`Event`]s under one prefix: [`Event::Init`] first, then every change in
/// revision order. Read it with [`Watcher::next`].
#[derive(Debug)]
pub struct Watcher {
    source: Source,
    finished: Option<WatchError>,
}

#[derive(Debug)]
enum Source {
    Broadcast {
        rx: broadcast::Receiver<Event>,
        prefix: Key,
        init: Option<Revision>,
    },
    Channel(mpsc::Receiver<Result<Event, WatchError>>),
    /// A remote backend's watch task relays etcd's stream into a bounded broadcast channel, so a
    /// watcher that does not read lags exactly as on the local backends.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Relay {
        rx: broadcast::Receiver<Result<Event, WatchError>>,
        init: Option<Revision>,
    },
}

impl Watcher {
    /// A watcher over a local backend's broadcast channel. `start` is the backend revision
    /// when `rx` subscribed; the caller subscribes under the write lock so no change can fall
    /// between `start` and the first event received.
    pub(crate) fn from_broadcast(rx: broadcast::Receiver<Event>, prefix: Key, start: Revision) -> Self {
        Self {
            source: Source::Broadcast {
                rx,
                prefix,
                init: Some(start),
            },
            finished: None,
        }
    }

    /// A watcher fed by another backend implementation (an etcd watch stream, say). The
    /// sender must send [`Event::Init`] first and then changes in revision order, and send a
    /// [`WatchError`] (or drop the sender) when it cannot continue.
    pub fn from_channel(rx: mpsc::Receiver<Result<Event, WatchError>>) -> Self {
        Self {
            source: Source::Channel(rx),
            finished: None,
        }
    }

    /// A watcher fed by a remote backend's relay task through `rx`, which was subscribed
    /// before the task asked for changes after `start`.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn from_relay(rx: broadcast::Receiver<Result<Event, WatchError>>, start: Revision) -> Self {
        Self {
            source: Source::Relay {
                rx,
                init: Some(start),
            },
            finished: None,
        }
    }

    /// How many events have reached this watcher and not been read yet, counting those it will
    /// miss if it has fallen past its buffer. On the local backends the count includes changes
    /// under other prefixes (they share one channel and are filtered on reading).
    pub fn backlog(&self) -> usize {
        match &self.source {
            Source::Broadcast { rx, .. } => rx.len(),
            Source::Relay { rx, .. } => rx.len(),
            Source::Channel(rx) => rx.len(),
        }
    }

    /// The next event. After an error every later call returns the same error.
    pub async fn next(&mut self) -> Result<Event, WatchError> {
        if let Some(err) = &self.finished {
            return Err(err.clone());
        }
        let result = match &mut self.source {
            Source::Broadcast { rx, prefix, init } => {
                if let Some(revision) = init.take() {
                    return Ok(Event::Init { revision });
                }
                loop {
                    match rx.recv().await {
                        Ok(event) if event.key().is_some_and(|k| k.has_prefix(prefix)) => {
                            break Ok(event);
                        }
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(missed)) => {
                            break Err(WatchError::Lagged { missed });
                        }
                        Err(broadcast::error::RecvError::Closed) => break Err(WatchError::Closed),
                    }
                }
            }
            Source::Relay { rx, init } => {
                if let Some(revision) = init.take() {
                    return Ok(Event::Init { revision });
                }
                match rx.recv().await {
                    Ok(result) => result,
                    Err(broadcast::error::RecvError::Lagged(missed)) => Err(WatchError::Lagged { missed }),
                    Err(broadcast::error::RecvError::Closed) => Err(WatchError::Closed),
                }
            }
            Source::Channel(rx) => match rx.recv().await {
                Some(result) => result,
                None => Err(WatchError::Closed),
            },
        };
        if let Err(err) = &result {
            self.finished = Some(err.clone());
        }
        result
    }
}

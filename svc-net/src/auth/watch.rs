//! The server side of the `Watch` call: a snapshot of the keys a proxy decides from
//! ([`WATCHED_PREFIXES`]), then every later change to them, in the backend's revision order.
//!
//! The backend watch starts first; its `Init` revision is where the snapshot's changes begin.
//! The snapshot is then listed, so a write racing with the listing is either in it or comes
//! after as an event; an event not newer than the listed item of its key is skipped, so the
//! client never goes back to an older value. A watcher that falls behind ends the stream: the
//! client watches again and receives a fresh snapshot.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use svc_core::auth::WATCHED_PREFIXES;
use svc_core::backend::{Backend, BackendError, Event, Item, Key, KeyRange, Revision};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::proto::{self, watch_event};

/// How many events may wait for a slow client before the stream ends (it then re-syncs).
const BUFFER: usize = 1024;

fn watched(key: &Key) -> bool {
    WATCHED_PREFIXES
        .iter()
        .any(|p| key.as_bytes().starts_with(p.as_bytes()))
}

/// A backend item on the wire.
pub(crate) fn item_to_proto(item: Item) -> proto::WatchItem {
    proto::WatchItem {
        key: String::from_utf8_lossy(item.key.as_bytes()).into_owned(),
        value: item.value,
        revision: item.revision.0,
        expires_unix_ms: item
            .expires
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0),
    }
}

fn event(e: watch_event::Event) -> Result<proto::WatchEvent, Status> {
    Ok(proto::WatchEvent { event: Some(e) })
}

/// Starts one client's watch; the receiver yields its events until the client goes, the
/// backend watch fails or lags (an error, then the end), or `shutdown`.
pub(super) async fn start(
    backend: Arc<dyn Backend>,
    shutdown: CancellationToken,
) -> Result<mpsc::Receiver<Result<proto::WatchEvent, Status>>, BackendError> {
    let mut watcher = backend.watch(&Key::from("/")).await?;
    let (tx, rx) = mpsc::channel(BUFFER);
    tokio::spawn(async move {
        let init = match watcher.next().await {
            Ok(Event::Init { revision }) => revision,
            Ok(other) => {
                let _ = tx
                    .send(Err(Status::internal(format!(
                        "the backend watch began with {other:?}, not its start revision"
                    ))))
                    .await;
                return;
            }
            Err(e) => {
                let _ = tx
                    .send(Err(Status::unavailable(format!("backend watch: {e}"))))
                    .await;
                return;
            }
        };
        let mut listed: HashMap<Key, Revision> = HashMap::new();
        let mut newest = init;
        for prefix in WATCHED_PREFIXES {
            let items = match backend.range(&KeyRange::prefix(Key::from(prefix))).await {
                Ok(items) => items,
                Err(e) => {
                    let _ = tx
                        .send(Err(Status::unavailable(format!("listing {prefix}: {e}"))))
                        .await;
                    return;
                }
            };
            for item in items {
                listed.insert(item.key.clone(), item.revision);
                newest = newest.max(item.revision);
                if tx
                    .send(event(watch_event::Event::SnapshotItem(item_to_proto(item))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        if tx
            .send(event(watch_event::Event::SnapshotDone(newest.0)))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let next = tokio::select! {
                next = watcher.next() => next,
                () = tx.closed() => return,
                () = shutdown.cancelled() => return,
            };
            let e = match next {
                Ok(e) => e,
                Err(e) => {
                    let _ = tx
                        .send(Err(Status::aborted(format!(
                            "the watch ended ({e}): watch again for a fresh snapshot"
                        ))))
                        .await;
                    return;
                }
            };
            let Some(key) = e.key() else { continue };
            if !watched(key) {
                continue;
            }
            if listed.get(key).is_some_and(|r| e.revision() <= *r) {
                continue;
            }
            let out = match e {
                Event::Put(item) => watch_event::Event::Put(item_to_proto(item)),
                Event::Delete { key, .. } => {
                    watch_event::Event::Delete(String::from_utf8_lossy(key.as_bytes()).into_owned())
                }
                _ => continue,
            };
            if tx.send(event(out)).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

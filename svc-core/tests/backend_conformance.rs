//! The storage contract, run against every `Backend` implementation: the same tests for the
//! in-memory backend, the embedded (redb) one and, with the `etcd` feature, etcd (a real `etcd`
//! member started per test on loopback ports, killed at the end). A new implementation adds
//! one line to the `conformance!` invocations at the bottom.
//!
//! The etcd-only tests at the end: a watch survives the restart of the member it streams from
//! in a 3-member cluster, a watch whose history was compacted meanwhile ends with
//! `WatchError::Compacted`, the prefix isolates two clusters, TLS with client certificates and
//! etcd users. Each test prints how long it took, so the suite's time on each backend can be
//! compared (`--nocapture`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use svc_core::backend::{
    Backend, BackendError, EmbeddedBackend, Event, Item, Key, KeyRange, MemoryBackend, Revision, WatchError,
};
use svc_core::{Clock, ManualClock};

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::at_unix(1_800_000_000))
}

/// A backend under test plus whatever keeps it alive (a temporary directory, an etcd member).
struct Subject {
    backend: Arc<dyn Backend>,
    _dir: Option<tempfile::TempDir>,
    #[cfg(feature = "etcd")]
    _etcd: Option<etcd_support::EtcdCluster>,
}

impl Subject {
    fn local(backend: Arc<dyn Backend>, dir: Option<tempfile::TempDir>) -> Self {
        Self {
            backend,
            _dir: dir,
            #[cfg(feature = "etcd")]
            _etcd: None,
        }
    }
}

/// Makes a fresh backend reading time from the clock, with a watch buffer of that many events.
type Make = fn(Arc<dyn Clock>, usize) -> Pin<Box<dyn Future<Output = Result<Subject>> + Send>>;

fn memory(clock: Arc<dyn Clock>, buffer: usize) -> Pin<Box<dyn Future<Output = Result<Subject>> + Send>> {
    Box::pin(async move {
        Ok(Subject::local(
            Arc::new(MemoryBackend::with_options(clock, buffer)),
            None,
        ))
    })
}

fn embedded(clock: Arc<dyn Clock>, buffer: usize) -> Pin<Box<dyn Future<Output = Result<Subject>> + Send>> {
    Box::pin(async move {
        let dir = tempfile::tempdir()?;
        let backend = EmbeddedBackend::open_with_options(dir.path().join("db.redb"), clock, buffer)?;
        Ok(Subject::local(Arc::new(backend), Some(dir)))
    })
}

#[cfg(feature = "etcd")]
#[path = "support/etcd.rs"]
mod etcd_support;

/// A single etcd member of its own, the backend under a cluster prefix.
#[cfg(feature = "etcd")]
fn etcd(clock: Arc<dyn Clock>, buffer: usize) -> Pin<Box<dyn Future<Output = Result<Subject>> + Send>> {
    Box::pin(async move {
        let cluster = etcd_support::EtcdCluster::start(1).await?;
        let backend = cluster.backend("/svc/conformance", clock, buffer).await?;
        Ok(Subject {
            backend: Arc::new(backend),
            _dir: None,
            _etcd: Some(cluster),
        })
    })
}

async fn crud_and_typed_errors(make: Make) -> Result<()> {
    let s = make(clock(), 64).await?;
    let b = &s.backend;
    let key = Key::from("/users/alice");
    ensure!(b.get(&key).await?.is_none());
    ensure!(b.current_revision().await? == Revision::ZERO);

    let r1 = b.create(Item::new(key.clone(), "v1")).await?;
    ensure!(r1 > Revision::ZERO);
    let got = b.get(&key).await?.expect("created item");
    ensure!(got.value == b"v1" && got.revision == r1 && got.expires.is_none());

    let err = b.create(Item::new(key.clone(), "again")).await.unwrap_err();
    ensure!(
        matches!(err, BackendError::AlreadyExists { .. }),
        "create over an existing key: {err}"
    );

    let r2 = b.compare_and_swap(r1, Item::new(key.clone(), "v2")).await?;
    ensure!(r2 > r1);
    let err = b
        .compare_and_swap(r1, Item::new(key.clone(), "stale"))
        .await
        .unwrap_err();
    match err {
        BackendError::RevisionMismatch { expected, found, .. } => ensure!(expected == r1 && found == r2),
        other => anyhow::bail!("expected a revision mismatch, got {other}"),
    }
    ensure!(b.get(&key).await?.expect("item").value == b"v2");

    let r3 = b.put(Item::new(key.clone(), "v3")).await?;
    ensure!(r3 > r2);
    let r4 = b.delete(&key).await?;
    ensure!(r4 > r3, "a delete takes a revision too");
    ensure!(b.get(&key).await?.is_none());
    ensure!(matches!(
        b.delete(&key).await.unwrap_err(),
        BackendError::NotFound { .. }
    ));
    ensure!(matches!(
        b.compare_and_swap(r3, Item::new(key.clone(), "x"))
            .await
            .unwrap_err(),
        BackendError::NotFound { .. }
    ));
    ensure!(b.current_revision().await? == r4);
    // An error message says what was expected and what was found.
    let msg = BackendError::RevisionMismatch {
        key: key.clone(),
        expected: Revision(3),
        found: Revision(5),
    }
    .to_string();
    ensure!(msg == "key /users/alice: expected revision 3, found revision 5");
    Ok(())
}

async fn range_prefix_and_bounds(make: Make) -> Result<()> {
    let s = make(clock(), 64).await?;
    let b = &s.backend;
    for key in ["/a/2", "/a/1", "/ab", "/a/3/x", "/b/1", "/c"] {
        b.put(Item::new(key, key)).await?;
    }
    let keys = |items: Vec<Item>| -> Vec<String> { items.into_iter().map(|i| i.key.to_string()).collect() };
    ensure!(keys(b.range(&KeyRange::prefix("/a/")).await?) == ["/a/1", "/a/2", "/a/3/x"]);
    ensure!(keys(b.range(&KeyRange::prefix("/a")).await?) == ["/a/1", "/a/2", "/a/3/x", "/ab"]);
    ensure!(keys(b.range(&KeyRange::between("/a/2", "/b/1")).await?) == ["/a/2", "/a/3/x", "/ab"]);
    ensure!(b.range(&KeyRange::prefix("/z")).await?.is_empty());
    ensure!(b.range(&KeyRange::prefix("")).await?.len() == 6);
    // Binary keys, including the 0xff edge of the prefix end.
    b.put(Item::new(Key::new(b"\xff\xff\x01".to_vec()), "bin"))
        .await?;
    ensure!(
        b.range(&KeyRange::prefix(Key::new(b"\xff\xff".to_vec())))
            .await?
            .len()
            == 1
    );
    Ok(())
}

async fn expiry(make: Make) -> Result<()> {
    let clock = clock();
    let s = make(clock.clone(), 64).await?;
    let b = &s.backend;
    let soon = clock.now() + Duration::from_secs(10);
    b.put(Item::new("/tokens/t1", "x").with_expiry(soon)).await?;
    b.put(Item::new("/tokens/t2", "y")).await?;
    let got = b.get(&Key::from("/tokens/t1")).await?.expect("live item");
    ensure!(got.expires == Some(soon), "expiry round-trips exactly");

    let mut watcher = b.watch(&Key::from("/tokens/")).await?;
    ensure!(matches!(watcher.next().await?, Event::Init { .. }));

    clock.advance(Duration::from_secs(10));
    ensure!(
        b.get(&Key::from("/tokens/t1")).await?.is_none(),
        "expired exactly at its expiry time"
    );
    ensure!(b.range(&KeyRange::prefix("/tokens/")).await?.len() == 1);
    // An expired key counts as absent for writes too.
    ensure!(matches!(
        b.compare_and_swap(Revision(1), Item::new("/tokens/t1", "z"))
            .await
            .unwrap_err(),
        BackendError::NotFound { .. }
    ));
    ensure!(matches!(
        b.delete(&Key::from("/tokens/t1")).await.unwrap_err(),
        BackendError::NotFound { .. }
    ));

    let before = b.current_revision().await?;
    ensure!(b.purge_expired().await? == 1);
    match watcher.next().await? {
        Event::Delete { key, revision } => {
            ensure!(key == Key::from("/tokens/t1") && revision > before)
        }
        other => anyhow::bail!("expected the purge's delete event, got {other:?}"),
    }
    ensure!(b.purge_expired().await? == 0);
    // After expiry the key can be created again.
    b.create(Item::new("/tokens/t1", "new")).await?;
    Ok(())
}

async fn cas_race_loses_no_update(make: Make) -> Result<()> {
    const TASKS: u64 = 8;
    const INCREMENTS: u64 = 20;
    let s = make(clock(), 4096).await?;
    let key = Key::from("/counter");
    s.backend.create(Item::new(key.clone(), "0")).await?;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let b = Arc::clone(&s.backend);
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u64;
            for _ in 0..INCREMENTS {
                loop {
                    let item = b.get(&key).await?.expect("counter exists");
                    let n: u64 = std::str::from_utf8(&item.value)?.parse()?;
                    // Let the other tasks run between the read and the write, so the race is
                    // real even for the in-memory backend, which never suspends.
                    tokio::task::yield_now().await;
                    let next = Item::new(key.clone(), (n + 1).to_string());
                    match b.compare_and_swap(item.revision, next).await {
                        Ok(_) => break,
                        Err(BackendError::RevisionMismatch { .. }) => conflicts += 1,
                        Err(other) => return Err(other.into()),
                    }
                }
            }
            anyhow::Ok(conflicts)
        }));
    }
    let mut conflicts = 0;
    for task in tasks {
        conflicts += task.await??;
    }
    let item = s.backend.get(&key).await?.expect("counter exists");
    let n: u64 = std::str::from_utf8(&item.value)?.parse()?;
    println!("cas race: {TASKS} tasks x {INCREMENTS} increments = {n}, {conflicts} conflicts retried");
    ensure!(n == TASKS * INCREMENTS, "lost updates: counter is {n}");
    Ok(())
}

/// Many writers at once (the embedded backend commits them in batches): every write gets its
/// own answer — distinct revisions for those applied, its own typed refusal for the others,
/// which change nothing — and watchers see exactly the applied writes, in revision order.
async fn concurrent_writes_get_their_own_answers(make: Make) -> Result<()> {
    const WRITERS: usize = 64;
    let s = make(clock(), 4096).await?;
    let start = s.backend.current_revision().await?;
    let mut w = s.backend.watch(&Key::from("/batch/")).await?;
    ensure!(matches!(w.next().await?, Event::Init { .. }));
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let b = Arc::clone(&s.backend);
        tasks.push(tokio::spawn(async move {
            let own = b
                .create(Item::new(format!("/batch/own/{i:03}"), i.to_string()))
                .await?;
            let shared = b.create(Item::new("/batch/shared", i.to_string())).await;
            let missing = b.delete(&Key::from(format!("/batch/missing/{i:03}"))).await;
            let stale = b
                .compare_and_swap(start, Item::new(format!("/batch/own/{i:03}"), "stale"))
                .await;
            anyhow::Ok((own, shared, missing, stale))
        }));
    }
    let mut applied = Vec::new();
    let mut shared_winners = 0;
    for task in tasks {
        let (own, shared, missing, stale) = task.await??;
        applied.push(own);
        match shared {
            Ok(r) => {
                shared_winners += 1;
                applied.push(r);
            }
            Err(BackendError::AlreadyExists { key }) => ensure!(key.as_bytes() == b"/batch/shared"),
            Err(other) => anyhow::bail!("creating the shared key: {other}"),
        }
        ensure!(
            matches!(missing, Err(BackendError::NotFound { .. })),
            "deleting a missing key: {missing:?}"
        );
        ensure!(
            matches!(stale, Err(BackendError::RevisionMismatch { .. })),
            "a stale compare-and-swap: {stale:?}"
        );
    }
    ensure!(
        shared_winners == 1,
        "{shared_winners} writers created the same key"
    );
    applied.sort();
    let distinct = applied.len();
    applied.dedup();
    ensure!(applied.len() == distinct, "two writes got the same revision");
    ensure!(
        applied.iter().all(|r| *r > start),
        "a revision at or below the start"
    );
    // The refused writes changed nothing: every own key holds its first value.
    let stored = s.backend.range(&KeyRange::prefix("/batch/own/")).await?;
    ensure!(stored.len() == WRITERS);
    ensure!(
        stored.iter().all(|i| i.value != b"stale"),
        "a stale swap was applied"
    );
    let mut seen = Vec::new();
    while seen.len() < applied.len() {
        match w.next().await? {
            Event::Put(item) => seen.push(item.revision),
            other => anyhow::bail!("only puts were applied, got {other:?}"),
        }
    }
    ensure!(
        seen.windows(2).all(|p| p[0] < p[1]),
        "events out of order: {seen:?}"
    );
    ensure!(seen == applied, "the events are not the applied writes");
    println!(
        "concurrent writes: {WRITERS} writers, {} applied, {} refused",
        applied.len(),
        WRITERS * 4 - applied.len()
    );
    Ok(())
}

async fn watch_delivers_every_change_in_order(make: Make) -> Result<()> {
    let s = make(clock(), 4096).await?;
    let b = &s.backend;
    b.put(Item::new("/nodes/before", "old")).await?;
    let start = b.current_revision().await?;
    let mut w = b.watch(&Key::from("/nodes/")).await?;
    match w.next().await? {
        Event::Init { revision } => ensure!(revision == start),
        other => anyhow::bail!("a watch starts with Init, got {other:?}"),
    }

    // Concurrent writers inside and outside the prefix.
    const WRITERS: usize = 4;
    const EACH: usize = 15;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let b = Arc::clone(b);
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                b.put(Item::new(format!("/nodes/{w}/{i}"), "v")).await?;
                b.put(Item::new(format!("/other/{w}/{i}"), "v")).await?;
                if i % 3 == 0 {
                    b.delete(&Key::from(format!("/nodes/{w}/{i}"))).await?;
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let expected = WRITERS * (EACH + EACH.div_ceil(3));
    let mut last = start;
    let mut puts = 0;
    let mut deletes = 0;
    for _ in 0..expected {
        let event = w.next().await?;
        ensure!(
            event.revision() > last,
            "revisions strictly increase: {event:?} after {last}"
        );
        last = event.revision();
        let key = event.key().expect("a change has a key");
        ensure!(
            key.has_prefix(&Key::from("/nodes/")),
            "only the watched prefix: {key}"
        );
        match event {
            Event::Put(item) => {
                ensure!(item.value == b"v");
                puts += 1;
            }
            Event::Delete { .. } => deletes += 1,
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    ensure!(puts == WRITERS * EACH && deletes == WRITERS * EACH.div_ceil(3));
    // The last event is the latest /nodes/ write; a marker write proves nothing else queued.
    b.put(Item::new("/nodes/marker", "m")).await?;
    match w.next().await? {
        Event::Put(item) => ensure!(item.key == Key::from("/nodes/marker")),
        other => anyhow::bail!("expected the marker, got {other:?}"),
    }
    println!("watch: {puts} puts and {deletes} deletes in revision order");
    Ok(())
}

async fn slow_watcher_gets_lagged(make: Make) -> Result<()> {
    let s = make(clock(), 4).await?;
    let b = &s.backend;
    let mut w = b.watch(&Key::from("/")).await?;
    ensure!(matches!(w.next().await?, Event::Init { .. }));
    for i in 0..10 {
        b.put(Item::new(format!("/k/{i}"), "v")).await?;
    }
    // A remote backend relays its events asynchronously: wait until all ten reached the
    // watcher (a local backend has them at once).
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.backlog() < 10 {
        ensure!(
            Instant::now() < deadline,
            "the 10 writes did not reach the watcher within 20s (backlog {})",
            w.backlog()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match w.next().await {
        Err(WatchError::Lagged { missed }) => ensure!(missed == 6, "missed {missed}"),
        other => anyhow::bail!("a watcher past its buffer must lag, got {other:?}"),
    }
    // A lagged watcher stays finished: no silent resumption in the middle of the stream.
    ensure!(matches!(w.next().await, Err(WatchError::Lagged { .. })));
    // A fresh watch starts cleanly.
    let mut w = b.watch(&Key::from("/")).await?;
    ensure!(matches!(w.next().await?, Event::Init { .. }));
    Ok(())
}

async fn watch_closes_with_backend(make: Make) -> Result<()> {
    let s = make(clock(), 4).await?;
    let mut w = s.backend.watch(&Key::from("/")).await?;
    ensure!(matches!(w.next().await?, Event::Init { .. }));
    drop(s);
    ensure!(matches!(w.next().await, Err(WatchError::Closed)));
    Ok(())
}

/// How long one conformance test may take: a watch that never delivers or a lock never released
/// fails the test naming it instead of hanging the run.
const TEST_LIMIT: Duration = Duration::from_secs(60);

async fn within(test: &str, run: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    let started = Instant::now();
    let result = tokio::time::timeout(TEST_LIMIT, run).await.map_err(|_| {
        anyhow::anyhow!("{test} did not finish within {TEST_LIMIT:?} (a watch event or a write never came)")
    })?;
    println!("{test}: {:?}", started.elapsed());
    result
}

macro_rules! conformance {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn crud_and_typed_errors() -> Result<()> {
                within(
                    concat!(
                        stringify!($backend),
                        "::",
                        stringify!(crud_and_typed_errors)
                    ),
                    super::crud_and_typed_errors(super::$backend),
                )
                .await
            }
            #[tokio::test]
            async fn range_prefix_and_bounds() -> Result<()> {
                within(
                    concat!(
                        stringify!($backend),
                        "::",
                        stringify!(range_prefix_and_bounds)
                    ),
                    super::range_prefix_and_bounds(super::$backend),
                )
                .await
            }
            #[tokio::test]
            async fn expiry() -> Result<()> {
                within(
                    concat!(stringify!($backend), "::", stringify!(expiry)),
                    super::expiry(super::$backend),
                )
                .await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn cas_race_loses_no_update() -> Result<()> {
                within(
                    concat!(
                        stringify!($backend),
                        "::",
                        stringify!(cas_race_loses_no_update)
                    ),
                    super::cas_race_loses_no_update(super::$backend),
                )
                .await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_writes_get_their_own_answers() -> Result<()> {
                within(
                    concat!(
                        stringify!($backend),
                        "::",
                        stringify!(concurrent_writes_get_their_own_answers)
                    ),
                    super::concurrent_writes_get_their_own_answers(super::$backend),
                )
                .await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn watch_delivers_every_change_in_order() -> Result<()> {
                within(
                    concat!(
                        stringify!($backend),
                        "::",
                        stringify!(watch_delivers_every_change_in_order)
                    ),
                    super::watch_delivers_every_change_in_order(super::$backend),
                )
                .await
            }
            #[tokio::test]
            async fn slow_watcher_gets_lagged() -> Result<()> {
                within(
                    concat!(
                        stringify!($backend),
                        "::",
                        stringify!(slow_watcher_gets_lagged)
                    ),
                    super::slow_watcher_gets_lagged(super::$backend),
                )
                .await
            }
            #[tokio::test]
            async fn watch_closes_with_backend() -> Result<()> {
                within(
                    concat!(
                        stringify!($backend),
                        "::",
                        stringify!(watch_closes_with_backend)
                    ),
                    super::watch_closes_with_backend(super::$backend),
                )
                .await
            }
        }
    };
}

conformance!(memory);
conformance!(embedded);
#[cfg(feature = "etcd")]
conformance!(etcd);

/// Embedded only: data and the revision counter survive closing and reopening the file.
#[tokio::test]
async fn embedded_reopen_keeps_items_and_revisions() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let last = {
        let b = EmbeddedBackend::open_in_dir(dir.path())?;
        b.put(Item::new("/a", "1")).await?;
        let r = b.put(Item::new("/b", "2")).await?;
        b.delete(&Key::from("/a")).await?;
        ensure!(b.current_revision().await? > r);
        b.current_revision().await?
    };
    let b = EmbeddedBackend::open_in_dir(dir.path())?;
    ensure!(b.path() == dir.path().join(EmbeddedBackend::FILE_NAME));
    ensure!(b.current_revision().await? == last);
    ensure!(b.get(&Key::from("/a")).await?.is_none());
    ensure!(b.get(&Key::from("/b")).await?.expect("kept").value == b"2");
    ensure!(
        b.put(Item::new("/c", "3")).await? > last,
        "revisions keep growing"
    );
    Ok(())
}

/// etcd only: member restarts, compaction, prefixes, TLS and etcd users, on real members.
#[cfg(feature = "etcd")]
mod etcd_only {
    use std::path::Path;
    use std::process::Command;

    use anyhow::{Context, bail};
    use svc_core::backend::{EtcdBackend, EtcdOptions, EtcdTls};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;

    use super::etcd_support::{EtcdCluster, MemberFlags, wait_ready};
    use super::*;

    /// Reads `n` puts of `/ha/<i>` for `i` in `from..from + n`, in order, revisions strictly
    /// increasing from after `last`; returns the last revision.
    async fn expect_puts(
        w: &mut svc_core::backend::Watcher,
        from: usize,
        n: usize,
        mut last: Revision,
    ) -> Result<Revision> {
        for i in from..from + n {
            match w.next().await? {
                Event::Put(item) => {
                    ensure!(
                        item.key == Key::from(format!("/ha/{i:04}")),
                        "expected /ha/{i:04} next (no gap, no duplicate), got {}",
                        item.key
                    );
                    ensure!(item.revision > last, "revision {} after {last}", item.revision);
                    last = item.revision;
                }
                other => bail!("expected the put of /ha/{i:04}, got {other:?}"),
            }
        }
        Ok(last)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_survives_a_member_restart() -> Result<()> {
        within("etcd_only::watch_survives_a_member_restart", async {
            let mut cluster = EtcdCluster::start(3).await?;
            let peers = cluster.peers();
            // One watcher streams from the member that will be killed; one knows every member.
            let on_m0 = EtcdBackend::connect(EtcdOptions::new([peers[0].clone()], "/svc/ha")).await?;
            let on_all = cluster.backend("/svc/ha", clock(), 4096).await?;
            let writer = EtcdBackend::connect(EtcdOptions::new(peers[1..].to_vec(), "/svc/ha")).await?;
            let mut w0 = on_m0.watch(&Key::from("/ha/")).await?;
            let mut wall = on_all.watch(&Key::from("/ha/")).await?;
            let start = match (w0.next().await?, wall.next().await?) {
                (Event::Init { revision }, Event::Init { .. }) => revision,
                other => bail!("watches start with Init, got {other:?}"),
            };
            for i in 0..20 {
                writer.put(Item::new(format!("/ha/{i:04}"), "v")).await?;
            }
            let last0 = expect_puts(&mut w0, 0, 20, start).await?;
            let last_all = expect_puts(&mut wall, 0, 20, start).await?;

            cluster.members[0].kill()?;
            // If m0 led, the two members left elect a new leader (about a second); a write sent
            // meanwhile fails with an unknown outcome, so wait until a linearizable read passes.
            let deadline = Instant::now() + Duration::from_secs(30);
            while let Err(e) = writer.current_revision().await {
                ensure!(
                    Instant::now() < deadline,
                    "no leader among the two members left within 30s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Writes continue on the two members left (a quorum).
            for i in 20..50 {
                writer.put(Item::new(format!("/ha/{i:04}"), "v")).await?;
            }
            // The watcher on every member resumes on another one, even before m0 is back.
            expect_puts(&mut wall, 20, 30, last_all).await?;
            cluster.members[0].restart()?;
            // The watcher bound to m0 resumes from the revision after its last event.
            let last0 = expect_puts(&mut w0, 20, 30, last0).await?;
            writer.put(Item::new("/ha/marker", "m")).await?;
            match w0.next().await? {
                Event::Put(item) => ensure!(item.key == Key::from("/ha/marker") && item.revision > last0),
                other => bail!("expected the marker after the restart, got {other:?}"),
            }
            println!("watch survived the restart of its member: 50 puts in order, no gap, no duplicate");
            Ok(())
        })
        .await
    }

    /// The index in `peers` of the member that leads now, as the members themselves report it.
    async fn leader_of(peers: &[String]) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut found = None;
            for (i, peer) in peers.iter().enumerate() {
                let Ok(out) = etcdctl(peer, &["endpoint", "status", "-w", "fields"]) else {
                    continue;
                };
                let field = |name: &str| {
                    out.lines()
                        .find(|l| l.trim_start().starts_with(&format!("\"{name}\"")))
                        .and_then(|l| l.split(':').nth(1))
                        .map(|v| v.trim().to_string())
                };
                if let (Some(me), Some(leader)) = (field("MemberID"), field("Leader"))
                    && me == leader
                    && leader != "0"
                {
                    found = Some(i);
                }
            }
            if let Some(i) = found {
                return Ok(i);
            }
            ensure!(
                Instant::now() < deadline,
                "no member of {peers:?} reported itself leader within 30s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// 3 members, one backend knowing all three; one member (the leader or a follower) is
    /// killed under the running backend, then 204 mixed operations (create, get, compare and
    /// swap, put with an expiry, range, delete) must all succeed while it is down: requests the
    /// balancer still sends to the dead member, and those failing during the election, are
    /// retried by the backend.
    async fn every_operation_succeeds_with_a_member_down(kill_leader: bool) -> Result<()> {
        let mut cluster = EtcdCluster::start(3).await?;
        let peers = cluster.peers();
        let backend = EtcdBackend::connect(EtcdOptions::new(peers.clone(), "/svc/down")).await?;
        // Use every member's channel before the kill, like a running Auth Service.
        for i in 0..12 {
            backend.put(Item::new(format!("/warm/{i}"), "w")).await?;
            backend.get(&Key::from(format!("/warm/{i}"))).await?;
        }
        let leader = leader_of(&peers).await?;
        let victim = if kill_leader {
            leader
        } else {
            (leader + 1) % peers.len()
        };
        cluster.members[victim].kill()?;
        println!(
            "killed member {victim} ({}), the leader: {}",
            peers[victim],
            victim == leader
        );

        let mut done = 0;
        for i in 0..34 {
            let key = Key::from(format!("/down/{i:03}"));
            let op = |what: &str| format!("{what} {key} (round {i}) with member {victim} down");
            let created = backend
                .create(Item::new(key.clone(), format!("c{i}")))
                .await
                .with_context(|| op("create"))?;
            done += 1;
            let got = backend.get(&key).await.with_context(|| op("get"))?;
            ensure!(
                got.as_ref().map(|g| g.value.as_slice()) == Some(format!("c{i}").as_bytes()),
                "get {key} after its create: {got:?}"
            );
            done += 1;
            let swapped = backend
                .compare_and_swap(created, Item::new(key.clone(), format!("s{i}")))
                .await
                .with_context(|| op("compare_and_swap"))?;
            ensure!(
                swapped > created,
                "the swap's revision {swapped} after the create's {created}"
            );
            done += 1;
            let expires = std::time::SystemTime::now() + Duration::from_secs(3600);
            backend
                .put(Item::new(key.clone(), format!("p{i}")).with_expiry(expires))
                .await
                .with_context(|| op("put"))?;
            done += 1;
            let listed = backend
                .range(&KeyRange::prefix("/down/"))
                .await
                .with_context(|| op("range"))?;
            ensure!(
                listed.len() == 1 && listed[0].key == key && listed[0].value == format!("p{i}").as_bytes(),
                "range /down/ holds exactly {key} = p{i}: {listed:?}"
            );
            done += 1;
            backend.delete(&key).await.with_context(|| op("delete"))?;
            done += 1;
        }
        ensure!(done >= 200, "only {done} operations ran");
        // A backend started while the member is down connects and reads too (its first
        // requests are balanced onto the dead member as often as not).
        for _ in 0..5 {
            let late = EtcdBackend::connect(EtcdOptions::new(peers.clone(), "/svc/down"))
                .await
                .with_context(|| format!("connecting with member {victim} down"))?;
            ensure!(
                late.get(&Key::from("/warm/0")).await?.is_some(),
                "a backend connected with member {victim} down reads /warm/0"
            );
        }
        ensure!(
            backend.get(&Key::from("/down/000")).await?.is_none(),
            "the deletes stay deleted"
        );

        cluster.members[victim].restart()?;
        // The member is back: it answers on its own (wait_ready has a deadline and a message).
        let alone = wait_ready(EtcdOptions::new([peers[victim].clone()], "/svc/down")).await?;
        ensure!(
            alone.get(&Key::from("/warm/0")).await?.is_some(),
            "the restarted member serves the cluster's data"
        );
        println!("{done} operations with member {victim} down, none failed");
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn operations_succeed_with_a_follower_down() -> Result<()> {
        within(
            "etcd_only::operations_succeed_with_a_follower_down",
            every_operation_succeeds_with_a_member_down(false),
        )
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn operations_succeed_with_the_leader_down() -> Result<()> {
        within(
            "etcd_only::operations_succeed_with_the_leader_down",
            every_operation_succeeds_with_a_member_down(true),
        )
        .await
    }

    /// A TCP relay in front of one member that the test can cut: a watch stream through it
    /// breaks while the member stays up.
    struct Cut {
        addr: String,
        open: watch::Sender<bool>,
    }

    async fn relay_to(upstream: &str) -> Result<Cut> {
        let target = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = format!("http://{}", listener.local_addr()?);
        let (open, is_open) = watch::channel(true);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut is_open = is_open.clone();
                if !*is_open.borrow() {
                    continue; // refused: dropped at once
                }
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = is_open.wait_for(|open| !open) => {}
                    }
                });
            }
        });
        Ok(Cut { addr, open })
    }

    fn etcdctl(endpoint: &str, args: &[&str]) -> Result<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(endpoint)
            .args(args)
            .output()
            .context("running etcdctl (install the Debian package etcd-client)")?;
        ensure!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn compaction_while_reconnecting_ends_the_watch_for_a_resync() -> Result<()> {
        within("etcd_only::compaction_ends_the_watch_for_a_resync", async {
            let cluster = EtcdCluster::start(1).await?;
            let member = cluster.peers()[0].clone();
            let cut = relay_to(&member).await?;
            let watching = EtcdBackend::connect(EtcdOptions::new([cut.addr.clone()], "/svc/c")).await?;
            let writer = cluster.backend("/svc/c", clock(), 64).await?;
            let mut w = watching.watch(&Key::from("/ha/")).await?;
            let start = match w.next().await? {
                Event::Init { revision } => revision,
                other => bail!("a watch starts with Init, got {other:?}"),
            };
            writer.put(Item::new("/ha/0000", "v")).await?;
            expect_puts(&mut w, 0, 1, start).await?;

            cut.open.send_replace(false);
            for i in 1..10 {
                writer.put(Item::new(format!("/ha/{i:04}"), "v")).await?;
            }
            // Compact everything up to now: the history the watch needs to resume is gone.
            let etcd_revision = writer.current_revision().await?.0 + 1;
            etcdctl(&member, &["compact", &etcd_revision.to_string()])?;
            cut.open.send_replace(true);
            match w.next().await {
                Err(WatchError::Compacted { revision }) => {
                    ensure!(revision.0 + 1 == etcd_revision, "compacted up to {revision}")
                }
                other => bail!("a watch whose history was compacted must say so, got {other:?}"),
            }
            ensure!(
                matches!(w.next().await, Err(WatchError::Compacted { .. })),
                "it stays finished"
            );
            // The re-sync: list, then watch again.
            ensure!(watching.range(&KeyRange::prefix("/ha/")).await?.len() == 10);
            let mut w = watching.watch(&Key::from("/ha/")).await?;
            let start = match w.next().await? {
                Event::Init { revision } => revision,
                other => bail!("a watch starts with Init, got {other:?}"),
            };
            writer.put(Item::new("/ha/0010", "v")).await?;
            expect_puts(&mut w, 10, 1, start).await?;
            Ok(())
        })
        .await
    }

    #[tokio::test]
    async fn the_prefix_isolates_two_clusters() -> Result<()> {
        within("etcd_only::the_prefix_isolates_two_clusters", async {
            let cluster = EtcdCluster::start(1).await?;
            let clock = clock();
            // `/svc/a` is a byte prefix of `/svc/ab`: the namespaces must still not overlap.
            let a = cluster.backend("/svc/a", clock.clone(), 64).await?;
            let b = cluster.backend("/svc/ab", clock.clone(), 64).await?;
            let mut wa = a.watch(&Key::from("")).await?;
            ensure!(matches!(wa.next().await?, Event::Init { .. }));
            b.put(Item::new("/users/x", "b")).await?;
            b.put(Item::new("b-no-slash", "b")).await?;
            b.put(Item::new("/tokens/t", "b").with_expiry(clock.now() + Duration::from_secs(5)))
                .await?;
            a.put(Item::new("/users/x", "a")).await?;
            ensure!(a.get(&Key::from("/users/x")).await?.expect("a's item").value == b"a");
            ensure!(b.get(&Key::from("/users/x")).await?.expect("b's item").value == b"b");
            let all_a = a.range(&KeyRange::prefix("")).await?;
            ensure!(all_a.len() == 1, "a sees only its own keys: {all_a:?}");
            ensure!(b.range(&KeyRange::prefix("")).await?.len() == 3);
            // a's watch saw only a's write.
            match wa.next().await? {
                Event::Put(item) => ensure!(item.value == b"a", "a's watch saw {item:?}"),
                other => bail!("expected a's put, got {other:?}"),
            }
            // a's purge leaves b's expired items to b.
            clock.advance(Duration::from_secs(5));
            ensure!(a.purge_expired().await? == 0);
            ensure!(b.purge_expired().await? == 1);
            Ok(())
        })
        .await
    }

    fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
        let out = Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .context("running openssl")?;
        ensure!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it; and
    /// a second, unrelated CA.
    fn make_pki(dir: &Path) -> Result<()> {
        const EC: [&str; 5] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        for ca in ["ca", "other-ca"] {
            let (key, crt) = (format!("{ca}.key"), format!("{ca}.crt"));
            let mut args = vec!["req", "-x509"];
            args.extend(EC);
            args.extend([
                "-keyout",
                &key,
                "-out",
                &crt,
                "-subj",
                "/CN=test etcd CA",
                "-days",
                "2",
            ]);
            openssl(dir, &args)?;
        }
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        )?;
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")?;
        for (name, cn) in [("server", "etcd"), ("client", "svc-auth")] {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            let subj = format!("/CN={cn}");
            let mut args = vec!["req"];
            args.extend(EC);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(dir, &args)?;
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-extfile",
                    &ext,
                ],
            )?;
        }
        Ok(())
    }

    /// `auth_service.storage` from a `svc.yaml` holding `storage` (the mapping's lines), as
    /// backend options.
    fn storage_from_yaml(storage: &str) -> Result<EtcdOptions> {
        let yaml = format!("version: v1\nauth_service:\n  storage:\n    {storage}\n");
        let config = svc_core::config::Config::from_yaml_str(&yaml)?;
        match &config.auth.storage {
            svc_core::config::StorageConfig::Etcd(etcd) => Ok(etcd.options()?),
            other => bail!("expected etcd storage, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn tls_with_client_certificates() -> Result<()> {
        within("etcd_only::tls_with_client_certificates", async {
            let pki = tempfile::tempdir()?;
            make_pki(pki.path())?;
            let path = |f: &str| pki.path().join(f).to_string_lossy().into_owned();
            let cluster = EtcdCluster::start_with(
                1,
                MemberFlags {
                    https: true,
                    args: vec![
                        "--cert-file".into(),
                        path("server.crt"),
                        "--key-file".into(),
                        path("server.key"),
                        "--trusted-ca-file".into(),
                        path("ca.crt"),
                        "--client-cert-auth".into(),
                    ],
                },
            )
            .await?;
            let read = |f: &str| std::fs::read(pki.path().join(f));
            // The options come from svc.yaml, as `svc start` reads them.
            let options = storage_from_yaml(&format!(
                "type: etcd\n    peers: [{}]\n    prefix: /svc/tls\n    tls_ca_file: {}\n    tls_cert_file: {}\n    tls_key_file: {}",
                cluster.peers()[0],
                path("ca.crt"),
                path("client.crt"),
                path("client.key")
            ))?;
            let tls = EtcdTls {
                ca_pem: read("ca.crt")?,
                client: Some((read("client.crt")?, read("client.key")?)),
            };
            let debug = format!("{options:?}");
            ensure!(!debug.contains("PRIVATE KEY"), "no key material in Debug: {debug}");
            let backend = wait_ready(options).await?;
            let r = backend.create(Item::new("/users/alice", "v")).await?;
            ensure!(
                backend
                    .get(&Key::from("/users/alice"))
                    .await?
                    .expect("stored")
                    .revision
                    == r
            );

            // Without a client certificate etcd refuses the connection.
            let no_cert = EtcdOptions::new(cluster.peers(), "/svc/tls").tls(EtcdTls {
                ca_pem: tls.ca_pem.clone(),
                client: None,
            });
            let err = EtcdBackend::connect(no_cert)
                .await
                .expect_err("a client without a certificate is refused");
            let msg = format!("{err:#}");
            let chain = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(": ");
            ensure!(
                chain.contains(&cluster.peers()[0]),
                "the error names the peer: {chain} ({msg})"
            );
            // A server certificate from another CA is not trusted.
            let wrong_ca = EtcdOptions::new(cluster.peers(), "/svc/tls").tls(EtcdTls {
                ca_pem: read("other-ca.crt")?,
                client: tls.client.clone(),
            });
            ensure!(
                EtcdBackend::connect(wrong_ca).await.is_err(),
                "a server from another CA is refused"
            );
            Ok(())
        })
        .await
    }

    #[tokio::test]
    async fn etcd_users_and_roles() -> Result<()> {
        within("etcd_only::etcd_users_and_roles", async {
            let cluster = EtcdCluster::start(1).await?;
            let ep = cluster.peers()[0].clone();
            for args in [
                &["user", "add", "root", "--new-user-password=root-secret"][..],
                &["user", "grant-role", "root", "root"],
                &["role", "add", "svc"],
                &[
                    "role",
                    "grant-permission",
                    "svc",
                    "--prefix=true",
                    "readwrite",
                    "/svc/auth/",
                ],
                &["user", "add", "svc", "--new-user-password=svc-secret-pw"],
                &["user", "grant-role", "svc", "svc"],
                &["auth", "enable"],
            ] {
                etcdctl(&ep, args)?;
            }
            let options = EtcdOptions::new(cluster.peers(), "/svc/auth").user("svc", "svc-secret-pw");
            ensure!(
                !format!("{options:?}").contains("svc-secret-pw"),
                "no password in Debug"
            );
            let b = EtcdBackend::connect(options).await?;
            let mut w = b.watch(&Key::from("/")).await?;
            ensure!(matches!(w.next().await?, Event::Init { .. }));
            b.create(Item::new("/users/alice", "v")).await?;
            b.put(
                Item::new("/tokens/t", "x")
                    .with_expiry(svc_core::SystemClock.now() + Duration::from_secs(60)),
            )
            .await?;
            ensure!(b.range(&KeyRange::prefix("/")).await?.len() == 2);
            ensure!(matches!(w.next().await?, Event::Put(_)));

            // No user, a wrong password, another cluster's prefix: refused, the password never
            // in the error.
            let anonymous = EtcdBackend::connect(EtcdOptions::new(cluster.peers(), "/svc/auth")).await;
            ensure!(anonymous.is_err(), "an anonymous client is refused");
            let wrong = EtcdBackend::connect(
                EtcdOptions::new(cluster.peers(), "/svc/auth").user("svc", "not-the-password"),
            )
            .await
            .expect_err("a wrong password is refused");
            ensure!(!format!("{wrong:?} {wrong}").contains("not-the-password"));
            let elsewhere = EtcdBackend::connect(
                EtcdOptions::new(cluster.peers(), "/svc/other").user("svc", "svc-secret-pw"),
            )
            .await;
            ensure!(elsewhere.is_err(), "the role grants only /svc/auth/");
            Ok(())
        })
        .await
    }

    /// Figures, not assertions: puts/s and compare-and-swap/s on the embedded store and on a
    /// single etcd member, same run, one writer and eight concurrent writers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn throughput_figures_embedded_vs_etcd() -> Result<()> {
        within("etcd_only::throughput_figures_embedded_vs_etcd", async {
            const N: usize = 400;
            let subjects = [
                ("embedded", embedded(clock(), 4096).await?),
                ("etcd", super::etcd(clock(), 4096).await?),
            ];
            for (name, s) in &subjects {
                for writers in [1usize, 8] {
                    let b = &s.backend;
                    let started = Instant::now();
                    let mut tasks = Vec::new();
                    for w in 0..writers {
                        let b = Arc::clone(b);
                        tasks.push(tokio::spawn(async move {
                            for i in 0..N / writers {
                                b.put(Item::new(format!("/bench/put/{w}/{i}"), "value")).await?;
                            }
                            anyhow::Ok(())
                        }));
                    }
                    for t in tasks {
                        t.await??;
                    }
                    let puts = N as f64 / started.elapsed().as_secs_f64();

                    // Each writer compare-and-swaps its own key: no conflicts, the cost of the
                    // guarded write itself (the etcd backend reads, then commits a transaction).
                    let started = Instant::now();
                    let mut tasks = Vec::new();
                    for w in 0..writers {
                        let b = Arc::clone(b);
                        tasks.push(tokio::spawn(async move {
                            let key = Key::from(format!("/bench/cas/{writers}/{w}"));
                            let mut rev = b.put(Item::new(key.clone(), "0")).await?;
                            for i in 0..N / writers {
                                rev = b
                                    .compare_and_swap(rev, Item::new(key.clone(), i.to_string()))
                                    .await?;
                            }
                            anyhow::Ok(())
                        }));
                    }
                    for t in tasks {
                        t.await??;
                    }
                    let cas = N as f64 / started.elapsed().as_secs_f64();
                    println!("throughput {name}, {writers} writer(s): {puts:.0} puts/s, {cas:.0} CAS/s");
                }
            }
            Ok(())
        })
        .await
    }
}

//! Crash safety of the backends: every write acknowledged before a `kill -9` is there after
//! restarting.
//!
//! The test binary plays both parts. Run normally, it starts itself again with
//! `SVC_CRASH_WRITER_DB` (embedded) or `SVC_CRASH_WRITER_ETCD` (etcd) set; that child writes
//! keys as fast as it can and prints `ACK <n>` after each `put` returns. The parent reads the
//! acknowledgements and sends SIGKILL mid-burst: to the writer for the embedded backend (the
//! process holding the database file), to the etcd member for etcd (the process holding the
//! data), then reopens or restarts and checks every acknowledged key. (This file has
//! `harness = false` so `main` is ours and the child needs no extra binary.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use svc_core::backend::{Backend, EmbeddedBackend, Item, Key, KeyRange};

const WRITER_ENV: &str = "SVC_CRASH_WRITER_DB";
/// The etcd writer's peer URL.
#[cfg(feature = "etcd")]
const ETCD_WRITER_ENV: &str = "SVC_CRASH_WRITER_ETCD";
/// The key prefix the etcd writer uses.
#[cfg(feature = "etcd")]
const ETCD_PREFIX: &str = "/svc/crash";

#[cfg(feature = "etcd")]
#[path = "support/etcd.rs"]
mod etcd_support;

/// One test: a function that fails with its reason.
type Test = fn() -> Result<()>;

/// The tests, by name.
const TESTS: &[(&str, Test)] = &[
    (
        "kill9_keeps_every_acknowledged_write",
        kill9_keeps_every_acknowledged_write,
    ),
    (
        "kill9_keeps_every_acknowledged_concurrent_write",
        kill9_keeps_every_acknowledged_concurrent_write,
    ),
    #[cfg(feature = "etcd")]
    (
        "etcd_kill9_keeps_every_acknowledged_write",
        etcd_kill9_keeps_every_acknowledged_write,
    ),
];
/// Acknowledgements the parent waits for before killing the writer.
const KILL_AFTER: usize = 200;
/// How long the writer may take for its first `KILL_AFTER` acknowledgements.
const ACK_LIMIT: Duration = Duration::from_secs(60);
/// The writer's burst: more than it can finish before the kill.
const BURST: usize = 1_000_000;

fn main() -> Result<()> {
    if let Some(path) = std::env::var_os(WRITER_ENV) {
        return writer(path.into());
    }
    #[cfg(feature = "etcd")]
    if let Ok(peer) = std::env::var(ETCD_WRITER_ENV) {
        return etcd_writer(peer);
    }
    // libtest-style arguments: `--list` lists (cargo-nextest lists with `--list --format terse`
    // and again with `--ignored` for the ignored tests: there are none); other flags are
    // ignored; a bare argument is a name filter (nextest runs `<name> --exact`).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            for (name, _) in TESTS {
                println!("{name}: test");
            }
        }
        return Ok(());
    }
    let exact = args.iter().any(|a| a == "--exact");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    for (name, test) in TESTS {
        let selected = filters.is_empty()
            || filters.iter().any(|f| {
                if exact {
                    *name == f.as_str()
                } else {
                    name.contains(f.as_str())
                }
            });
        if selected {
            test()?;
            println!("test {name} ... ok");
        }
    }
    Ok(())
}

fn key(n: usize) -> Key {
    Key::from(format!("/crash/{n:08}"))
}

/// How many writers the child runs at once (`SVC_CRASH_WRITERS`, 1 by default): with several,
/// the embedded backend commits their writes in batches.
const WRITERS_ENV: &str = "SVC_CRASH_WRITERS";
/// The concurrent writers of [`kill9_keeps_every_acknowledged_concurrent_write`].
const CONCURRENT_WRITERS: usize = 32;

fn writer(path: std::path::PathBuf) -> Result<()> {
    let writers: usize = match std::env::var(WRITERS_ENV) {
        Ok(n) => n.parse().with_context(|| format!("{WRITERS_ENV}={n:?}"))?,
        Err(_) => 1,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let backend = std::sync::Arc::new(EmbeddedBackend::open(&path)?);
        let mut tasks = Vec::new();
        for first in 0..writers {
            let backend = std::sync::Arc::clone(&backend);
            tasks.push(tokio::spawn(async move {
                for n in (first..BURST).step_by(writers) {
                    backend.put(Item::new(key(n), n.to_string())).await?;
                    // Only now is the write acknowledged; the parent trusts nothing it has not
                    // read.
                    let mut stdout = std::io::stdout().lock();
                    writeln!(stdout, "ACK {n}")?;
                    stdout.flush()?;
                }
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        anyhow::Ok(())
    })
}

fn kill9_keeps_every_acknowledged_write() -> Result<()> {
    kill9_writer(1)
}

/// The same with many writers at once, whose writes the backend commits in batches: a write
/// is acknowledged only once the batch holding it is on disk.
fn kill9_keeps_every_acknowledged_concurrent_write() -> Result<()> {
    kill9_writer(CONCURRENT_WRITERS)
}

fn kill9_writer(writers: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("crash.redb");
    let mut child = Command::new(std::env::current_exe()?)
        .env(WRITER_ENV, &db)
        .env(WRITERS_ENV, writers.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the writer process")?;
    let stdout = child.stdout.take().context("writer stdout")?;
    // The acknowledgements arrive through a reader thread, so waiting for them has a deadline.
    let (tx, acks) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line).is_err() {
                return;
            }
        }
    });

    let mut acked = Vec::new();
    let deadline = Instant::now() + ACK_LIMIT;
    while acked.len() < KILL_AFTER {
        match acks.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => acked.push(parse_ack(&line?)?),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the writer exited after {} acknowledgements", acked.len())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the writer acknowledged {} of {KILL_AFTER} writes within {ACK_LIMIT:?}",
                    acked.len()
                );
            }
        }
    }
    // Child::kill sends SIGKILL on Unix: no destructors, no flush, no clean close.
    child.kill().context("kill -9 the writer")?;
    // Acknowledgements already in the pipe were printed before the kill: they count too. The
    // reader thread ends at the pipe's end, which the kill brings.
    for line in acks {
        acked.push(parse_ack(&line?)?);
    }
    let status = child.wait()?;
    ensure!(
        !status.success(),
        "the writer must have been killed mid-burst, it exited with {status}"
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let backend = EmbeddedBackend::open(&db).context("reopening after kill -9")?;
        for &n in &acked {
            let item = backend
                .get(&key(n))
                .await?
                .with_context(|| format!("acknowledged write {n} lost after kill -9"))?;
            ensure!(item.value == n.to_string().as_bytes(), "write {n} corrupted");
        }
        let stored = backend.range(&KeyRange::prefix("/crash/")).await?.len();
        // The writes in flight at the kill (one per writer) may or may not have committed;
        // nothing more.
        ensure!(
            stored >= acked.len() && stored <= acked.len() + writers,
            "{stored} keys stored, {} acknowledged by {writers} writers",
            acked.len()
        );
        println!(
            "kill -9 after {} acknowledged writes ({writers} writers): all {} present after reopen ({stored} stored)",
            acked.len(),
            acked.len()
        );
        // The reopened database takes new writes with later revisions.
        let before = backend.current_revision().await?;
        ensure!(backend.put(Item::new("/after", "x")).await? > before);
        anyhow::Ok(())
    })
}

fn parse_ack(line: &str) -> Result<usize> {
    line.strip_prefix("ACK ")
        .with_context(|| format!("unexpected writer output {line:?}"))?
        .parse()
        .with_context(|| format!("bad acknowledgement {line:?}"))
}

/// The etcd writer: puts to the member at `peer` until it fails (the parent kills the member).
#[cfg(feature = "etcd")]
fn etcd_writer(peer: String) -> Result<()> {
    use svc_core::backend::{EtcdBackend, EtcdOptions};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let backend = EtcdBackend::connect(EtcdOptions::new([peer], ETCD_PREFIX)).await?;
        let mut stdout = std::io::stdout().lock();
        for n in 0..BURST {
            backend.put(Item::new(key(n), n.to_string())).await?;
            writeln!(stdout, "ACK {n}")?;
            stdout.flush()?;
        }
        anyhow::Ok(())
    })
}

/// etcd: `kill -9` of the (single) member mid-burst; after its restart on the same data
/// directory every acknowledged write is there (etcd fsyncs its log before answering).
#[cfg(feature = "etcd")]
fn etcd_kill9_keeps_every_acknowledged_write() -> Result<()> {
    use svc_core::backend::EtcdOptions;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut cluster = runtime.block_on(etcd_support::EtcdCluster::start(1))?;
    let peer = cluster.peers()[0].clone();
    let mut child = Command::new(std::env::current_exe()?)
        .env(ETCD_WRITER_ENV, &peer)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the etcd writer process")?;
    let stdout = child.stdout.take().context("writer stdout")?;
    let (tx, acks) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut acked = Vec::new();
    let deadline = Instant::now() + ACK_LIMIT;
    while acked.len() < KILL_AFTER {
        match acks.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => acked.push(parse_ack(&line?)?),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the etcd writer exited after {} acknowledgements", acked.len())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the etcd writer acknowledged {} of {KILL_AFTER} writes within {ACK_LIMIT:?}",
                    acked.len()
                );
            }
        }
    }
    // SIGKILL to the member holding the data, mid-burst; then the writer (its next put fails).
    cluster.members[0].kill()?;
    child.kill().context("stopping the writer")?;
    for line in acks {
        acked.push(parse_ack(&line?)?);
    }
    child.wait()?;
    cluster.members[0].restart()?;
    runtime.block_on(async {
        let backend = etcd_support::wait_ready(EtcdOptions::new([peer], ETCD_PREFIX)).await?;
        for &n in &acked {
            let item = backend
                .get(&key(n))
                .await?
                .with_context(|| format!("acknowledged write {n} lost after kill -9 of etcd"))?;
            ensure!(item.value == n.to_string().as_bytes(), "write {n} corrupted");
        }
        let stored = backend.range(&KeyRange::prefix("/crash/")).await?.len();
        ensure!(
            stored == acked.len() || stored == acked.len() + 1,
            "{stored} keys stored, {} acknowledged",
            acked.len()
        );
        println!(
            "etcd kill -9 after {} acknowledged writes: all {} present after the restart ({stored} stored)",
            acked.len(),
            acked.len()
        );
        let before = backend.current_revision().await?;
        ensure!(backend.put(Item::new("/after", "x")).await? > before);
        anyhow::Ok(())
    })
}

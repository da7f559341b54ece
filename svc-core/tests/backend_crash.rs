//! Crash safety of the embedded backend: every write acknowledged before a `kill -9` is there
//! after reopening.
//!
//! The test binary plays both parts. Run normally, it starts itself again with
//! `SVC_CRASH_WRITER_DB` set; that child writes keys to the embedded backend as fast as it can
//! and prints `ACK <n>` after each `put` returns. The parent reads the acknowledgements, sends
//! SIGKILL mid-burst, reopens the database and checks every acknowledged key. (This file has
//! `harness = false` so `main` is ours and the child needs no extra binary.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use svc_core::backend::{Backend, EmbeddedBackend, Item, Key, KeyRange};

const WRITER_ENV: &str = "SVC_CRASH_WRITER_DB";
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
    // libtest-style arguments (`--list`, filters) are accepted and ignored, except that
    // listing must not run the test. cargo-nextest lists with `--list --format terse` and again
    // with `--ignored` for the ignored tests: there are none.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("kill9_keeps_every_acknowledged_write: test");
        }
        return Ok(());
    }
    kill9_keeps_every_acknowledged_write()?;
    println!("test kill9_keeps_every_acknowledged_write ... ok");
    Ok(())
}

fn key(n: usize) -> Key {
    Key::from(format!("/crash/{n:08}"))
}

fn writer(path: std::path::PathBuf) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let backend = EmbeddedBackend::open(&path)?;
        let mut stdout = std::io::stdout().lock();
        for n in 0..BURST {
            backend.put(Item::new(key(n), n.to_string())).await?;
            // Only now is the write acknowledged; the parent trusts nothing it has not read.
            writeln!(stdout, "ACK {n}")?;
            stdout.flush()?;
        }
        anyhow::Ok(())
    })
}

fn kill9_keeps_every_acknowledged_write() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("crash.redb");
    let mut child = Command::new(std::env::current_exe()?)
        .env(WRITER_ENV, &db)
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
        // The write in flight at the kill may or may not have committed; nothing more.
        ensure!(
            stored == acked.len() || stored == acked.len() + 1,
            "{stored} keys stored, {} acknowledged",
            acked.len()
        );
        println!(
            "kill -9 after {} acknowledged writes: all {} present after reopen ({stored} stored)",
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

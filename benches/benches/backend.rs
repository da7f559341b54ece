//! Storage write and read costs, each against a baseline measured in the same run.
//!
//! - Durable write: `EmbeddedBackend::put` (one redb transaction committed with fsync) against
//!   the floor of any durable write on this disk: overwriting the same bytes in place in a plain
//!   file (`pwrite` at offset 0, so the file size never changes) and `fdatasync`. The ratio says
//!   how much the database costs beyond the one flush a durable write needs. (Appending instead
//!   would make every flush also write the file size, a slower and unfair baseline.)
//! - Concurrent durable writes: the same puts from [`WRITERS`] tasks at once (agents'
//!   heartbeats reach the Auth Service this way), which the embedded backend commits in
//!   batches, one fsync per batch; against the same single-write baseline.
//! - Read: `EmbeddedBackend::get` against `MemoryBackend::get` (a map lookup behind a mutex).
//!
//! The variants alternate in every round; the medians of the rounds and their ratios are
//! printed. Run: `cargo bench -p svc-benches --bench backend`.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use svc_core::backend::{Backend, EmbeddedBackend, Item, Key, MemoryBackend};

const ROUNDS: usize = 7;
const WRITES_PER_ROUND: usize = 200;
const READS_PER_ROUND: usize = 20_000;
const VALUE: &[u8] = &[0x5a; 512];
/// Writers at once in the concurrent write measurement.
const WRITERS: usize = 64;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn per_op(total: Duration, ops: usize) -> Duration {
    total / u32::try_from(ops).unwrap_or(u32::MAX)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // cargo-nextest lists a binary's tests (`--list --format terse`, then with `--ignored`)
    // before running them one by one: this one has a single quick run and nothing ignored.
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("quick_run: test");
        }
        return Ok(());
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` (and nextest) run it once quickly.
    let quick = !args.iter().any(|a| a == "--bench");
    let (rounds, writes, reads) = if quick {
        (1, 10, 100)
    } else {
        (ROUNDS, WRITES_PER_ROUND, READS_PER_ROUND)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let embedded = std::sync::Arc::new(EmbeddedBackend::open(dir.path().join("bench.redb"))?);
    let memory = MemoryBackend::new();
    let raw = std::fs::File::create(dir.path().join("raw.log"))?;
    raw.write_all_at(VALUE, 0)?;
    raw.sync_all()?;

    let (mut raw_w, mut emb_w, mut emb_cw, mut mem_w, mut emb_r, mut mem_r) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for round in 0..rounds {
        let start = Instant::now();
        for _ in 0..writes {
            raw.write_all_at(VALUE, 0)?;
            raw.sync_data()?;
        }
        raw_w.push(per_op(start.elapsed(), writes));

        runtime.block_on(async {
            let start = Instant::now();
            for i in 0..writes {
                embedded
                    .put(Item::new(format!("/bench/{round}/{i}"), VALUE))
                    .await?;
            }
            emb_w.push(per_op(start.elapsed(), writes));

            // The same number of writes per writer, from WRITERS writers at once.
            let start = Instant::now();
            let mut tasks = Vec::new();
            for w in 0..WRITERS {
                let embedded = std::sync::Arc::clone(&embedded);
                tasks.push(tokio::spawn(async move {
                    for i in 0..writes {
                        embedded
                            .put(Item::new(format!("/bench/{round}/c{w}/{i}"), VALUE))
                            .await?;
                    }
                    anyhow::Ok(())
                }));
            }
            for task in tasks {
                task.await??;
            }
            emb_cw.push(per_op(start.elapsed(), writes * WRITERS));

            let start = Instant::now();
            for i in 0..writes {
                memory
                    .put(Item::new(format!("/bench/{round}/{i}"), VALUE))
                    .await?;
            }
            mem_w.push(per_op(start.elapsed(), writes));

            let key = Key::from(format!("/bench/{round}/0"));
            let start = Instant::now();
            for _ in 0..reads {
                std::hint::black_box(embedded.get(&key).await?);
            }
            emb_r.push(per_op(start.elapsed(), reads));

            let start = Instant::now();
            for _ in 0..reads {
                std::hint::black_box(memory.get(&key).await?);
            }
            mem_r.push(per_op(start.elapsed(), reads));
            anyhow::Ok(())
        })?;
    }
    let (raw_w, emb_w, emb_cw, mem_w, emb_r, mem_r) = (
        median(raw_w),
        median(emb_w),
        median(emb_cw),
        median(mem_w),
        median(emb_r),
        median(mem_r),
    );
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-12);
    println!("backend benchmark ({rounds} rounds, medians, 512-byte values)");
    println!(
        "durable write: in-place pwrite+fdatasync {raw_w:?}/op (baseline), embedded put {emb_w:?}/op = {:.2}x baseline; memory put {mem_w:?}/op",
        ratio(emb_w, raw_w)
    );
    println!(
        "concurrent durable writes: {WRITERS} writers, embedded put {emb_cw:?}/op = {:.2}x baseline ({:.1}x the single writer's rate)",
        ratio(emb_cw, raw_w),
        ratio(emb_w, emb_cw)
    );
    println!(
        "read: memory get {mem_r:?}/op (baseline), embedded get {emb_r:?}/op = {:.2}x baseline",
        ratio(emb_r, mem_r)
    );
    Ok(())
}

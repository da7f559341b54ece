//! Benchmarks for svc. Micro-benchmarks run with `cargo bench -p svc-benches`; end-to-end
//! harnesses are binaries of this package. See `docs/performance.md` for results and how to
//! reproduce them.

pub mod sim;

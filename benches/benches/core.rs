//! Micro-benchmarks of the pure paths every connection or poll goes through.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use svc_core::{Addr, Version};

fn parse(c: &mut Criterion) {
    c.bench_function("version_parse", |b| {
        b.iter(|| Version::parse(black_box("v15.1.3-rc.1")))
    });
    c.bench_function("addr_parse", |b| {
        b.iter(|| Addr::parse(black_box("proxy.example.com:443")))
    });
}

criterion_group!(benches, parse);
criterion_main!(benches);

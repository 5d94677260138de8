//! Criterion benches of the in-process rows (row 2 of `npuctl bench`): one dispatch of the noop
//! design and a chain of 32, through hsa-core on the emulator.

use criterion::{Criterion, criterion_group, criterion_main};
use npu_bench::inproc::InProcess;

fn bench(c: &mut Criterion) {
    let mut d = InProcess::open().expect("the emulator opens in process");
    let mut group = c.benchmark_group("npu_bench_in_process");
    let one = std::slice::from_ref(&d.one).to_vec();
    group.bench_function("dispatch", |b| {
        b.iter(|| d.dev.run_chain(&one).expect("dispatch"));
    });
    let chain = vec![d.one.clone(); 32];
    group.bench_function("chain32", |b| {
        b.iter(|| d.dev.run_chain(&chain).expect("chain"));
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

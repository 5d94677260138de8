//! In-process dispatch through hsa-core on the statically linked emulator: the floor the
//! daemon is measured against. Rows: one dispatch of a kernel that does no work, one dispatch
//! of vector_scalar_add (1024 × i32), and chains of 32 of each (per chain; divide by 32 for
//! the per-link cost).

use criterion::{Criterion, criterion_group, criterion_main};
use hsa_core::{Device, DeviceOptions, Dispatch, Generation};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

fn open() -> Device {
    let cfg = hsa_sim::SimConfig::default();
    let abi = cfg.packet_abi();
    hsa_sim::set_config(cfg);
    let api = hsa_sim::api("hsa-sim");
    Device::open(
        api,
        DeviceOptions {
            packet_abi: abi,
            ..Default::default()
        },
    )
    .expect("emulator opens")
}

fn bench(c: &mut Criterion) {
    let mut dev = open();
    let generation = match dev.info().generation {
        Generation::Npu1 => NpuGen::Npu1,
        Generation::Npu2 => NpuGen::Npu2,
    };
    let mut group = c.benchmark_group("in_process");
    for (name, design) in [
        ("noop", EmuDesign::noop(2, 4096)),
        (
            "vector_scalar_add_1024xi32",
            EmuDesign::vector_scalar_add(1024, DType::I32, 1),
        ),
    ] {
        let prog = dev
            .load_program(&design.to_pdi(), &design.insts(generation))
            .unwrap();
        let a = dev.alloc_tensor(4096).unwrap();
        let b = dev.alloc_tensor(4096).unwrap();
        let one = Dispatch::new(prog, [a, b]);
        group.bench_function(format!("{name}/dispatch"), |bench| {
            bench.iter(|| dev.dispatch(&one).unwrap());
        });
        let chain: Vec<Dispatch> = (0..32)
            .map(|i| Dispatch::new(prog, if i % 2 == 0 { [a, b] } else { [b, a] }))
            .collect();
        group.bench_function(format!("{name}/chain32"), |bench| {
            bench.iter(|| dev.run_chain(&chain).unwrap());
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

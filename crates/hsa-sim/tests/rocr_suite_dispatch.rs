//! ROCR's kernel-object-era AIE dispatch suite (`rocrtst/suites/aie/test_dispatch.cc`,
//! ROCm/rocm-systems @029f0cb8), one test per gtest test, named after it, run under every
//! profile that loads AIE hsacos and dispatches kernel objects ([`kernel_object_profiles`]).
//! The suite's hsacos are the emulated designs packed by `npu-artifacts`: the vector-scalar add
//! (`vector_scalar_add`, and `vector_scalar_add:sequence` as a full ELF, aie2p) and the
//! in-place multiply by `MUL_SCALE` (`vector_scalar_mul`). Refusals reach the queue's error
//! callback, as the suite's `ExpectRejected` expects: the callback ran with a status, the
//! completion signal kept its count, the refused packet is still in the ring.
//!
//! On the other profiles the suite's first load fails as that ROCR fails it
//! (`hsaco_kernel_object_is_published` checks it everywhere).

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::ko::*;
use common::suite::*;
use common::*;
use hsa_core::sys::{Signal, Status, SymbolInfo};
use hsa_sim::*;
use npu_artifacts::NpuGen;
use npu_artifacts::hsaco::{Hsaco, HsacoBuilder};

const ADD: &str = "vector_scalar_add";
const MUL: &str = "vector_scalar_mul";
const ELF_ADD: &str = "vector_scalar_add:sequence";
const ELF_MUL: &str = "vector_scalar_mul:sequence";

fn each(f: impl Fn(&Sim)) {
    let profiles = kernel_object_profiles();
    assert!(!profiles.is_empty());
    for p in profiles {
        f(&Sim::new(p));
    }
}

fn add_hsaco(sim: &Sim) -> Vec<u8> {
    add_design().to_hsaco(sim.generation()).unwrap()
}

fn mul_hsaco(sim: &Sim) -> Vec<u8> {
    mul_design().to_hsaco(sim.generation()).unwrap()
}

/// The suite's `data_pool`: the first coarse allocatable pool.
fn data(sim: &Sim) -> hsa_core::sys::MemoryPool {
    find_pool(sim.aie, hsa_core::sys::global_flag::COARSE_GRAINED, true).unwrap()
}

/// `count` add packets naming `ko` over consecutive slices of fresh buffers.
fn add_batch(sim: &Sim, ko: u64, count: usize, sig: Signal) -> (u64, u64, Vec<[u8; 64]>) {
    let input = allocate(data(sim), BYTES * count as u64).unwrap();
    let output = allocate(data(sim), BYTES * count as u64).unwrap();
    iota(input, N * count, 0);
    put_u32s(output, &vec![0; N * count]);
    let packets = (0..count as u64)
        .map(|i| {
            ko_packet(
                sim,
                ko,
                &[(input + i * BYTES, BYTES), (output + i * BYTES, BYTES)],
                sig,
            )
        })
        .collect();
    (input, output, packets)
}

fn run_add(sim: &Sim, q: &TestQueue, ko: u64) {
    let sig = sim.signal(1);
    let (i, o, p) = add_batch(sim, ko, 1, sig);
    q.submit(&p);
    assert_eq!(wait_eq(sig, 0, u64::MAX), 0, "{:?}", last_error());
    assert_added(i, o, N, "add");
}

fn run_mul(sim: &Sim, q: &TestQueue, ko: u64) {
    let inout = allocate(data(sim), BYTES).unwrap();
    iota(inout, N, 0);
    let sig = sim.signal(1);
    q.submit(&[ko_packet(sim, ko, &[(inout, BYTES)], sig)]);
    assert_eq!(wait_eq(sig, 0, u64::MAX), 0, "{:?}", last_error());
    assert_multiplied(inout, N, 0, "mul");
}

/// The suite's `ExpectRejected`: one callback, the signal at `initial`, the packet in the ring.
fn expect_rejected(q: &TestQueue, sig: Signal, initial: i64) -> Status {
    let errors = q.errors();
    assert_eq!(errors.len(), 1, "{:?}", last_error());
    assert_ne!(errors[0], Status::SUCCESS);
    assert_eq!(
        load_signal(sig),
        initial,
        "the signal fired for a packet that never ran"
    );
    assert!(
        q.read_index() < q.write_index(),
        "a refused packet was consumed"
    );
    errors[0]
}

#[test]
fn queue_create() {
    each(check_queue_create);
}

#[test]
fn queue_min_max_size() {
    each(check_queue_min_max_size);
}

#[test]
fn dev_pool_discovery() {
    each(check_dev_pool_discovery);
}

#[test]
fn kernarg_pool_discovery() {
    each(check_kernarg_pool_discovery);
}

#[test]
fn single_dispatch() {
    each(|sim| {
        let l = Loaded::new(sim, &add_hsaco(sim));
        run_add(sim, &sim.queue(), l.kernel_object(ADD));
    });
}

#[test]
fn loads_the_agents_section_of_a_multi_arch_hsaco() {
    // vsmul in an aie2 section, then vsadd in an aie2p one: each agent finds its own.
    for agent in [NpuGen::Npu1, NpuGen::Npu2] {
        for p in kernel_object_profiles() {
            let sim = Sim::with(SimConfig {
                agent,
                profile: p,
                ..Default::default()
            });
            let mut b = HsacoBuilder::new();
            b.pdi_insts(NpuGen::Npu1, mul_design().hsaco_kernel(NpuGen::Npu1))
                .unwrap();
            b.pdi_insts(NpuGen::Npu2, add_design().hsaco_kernel(NpuGen::Npu2))
                .unwrap();
            let l = Loaded::new(&sim, &b.build().unwrap());
            let name = if agent == NpuGen::Npu2 { ADD } else { MUL };
            assert_ne!(l.kernel_object(name), 0, "{p}, {agent:?}");
        }
    }
}

#[test]
fn single_dispatch_vmem() {
    each(|sim| {
        let p = sim.profile;
        let both = [sim.cpu, sim.aie];
        let l = Loaded::new(sim, &add_hsaco(sim));
        let input = vmem_allocate(data(sim), BYTES as usize, &both).unwrap();
        let output = vmem_allocate(data(sim), BYTES as usize, &both).unwrap();
        let kernargs = vmem_allocate(data(sim), 32, &both).unwrap();
        iota(input.va, N, 0);
        put_u32s(output.va, &[0; N]);
        write(
            kernargs.va,
            &[input.va, output.va, BYTES, BYTES]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        let sig = sim.signal(1);
        let mut pkt = ko_packet(
            sim,
            l.kernel_object(ADD),
            &[(input.va, BYTES), (output.va, BYTES)],
            sig,
        );
        pkt[32..40].copy_from_slice(&kernargs.va.to_le_bytes()); // kernarg_address
        sim.queue().submit(&[pkt]);
        assert_eq!(wait_eq(sig, 0, u64::MAX), 0, "{p}: {:?}", last_error());
        assert_added(input.va, output.va, N, "vmem dispatch");
        for b in [&kernargs, &output, &input] {
            assert_eq!(
                vmem_free(b),
                [Status::SUCCESS; 3],
                "{p}: {:?}",
                last_error()
            );
        }
    });
}

fn multi(sim: &Sim, initial: usize, rest: usize, ring_each_rest: bool) {
    let l = Loaded::new(sim, &add_hsaco(sim));
    let total = initial + rest;
    let sig = sim.signal(total as i64);
    let (i, o, packets) = add_batch(sim, l.kernel_object(ADD), total, sig);
    let q = sim.queue();
    for p in &packets[..initial] {
        q.submit(std::slice::from_ref(p));
    }
    if ring_each_rest {
        for p in &packets[initial..] {
            q.submit(std::slice::from_ref(p));
        }
    } else {
        q.submit(&packets[initial..]);
    }
    assert_eq!(wait_eq(sig, 0, u64::MAX), 0, "{:?}", last_error());
    assert_added(i, o, N * total, "multi dispatch");
}

#[test]
fn multi_dispatch() {
    each(|sim| multi(sim, 0, 100, true));
}

#[test]
fn multi_dispatch_async() {
    each(|sim| multi(sim, 0, 40, false));
}

#[test]
fn multi_dispatch_wrap_around() {
    each(|sim| multi(sim, 32, 640, true));
}

#[test]
fn multi_dispatch_wrap_around_async() {
    each(|sim| multi(sim, 63, 40, false));
}

#[test]
fn agent_info() {
    each(check_agent_info);
}

#[test]
fn create_destroy_multiple_queues() {
    each(check_create_destroy_multiple_queues);
}

#[test]
fn destroy_queue_with_pending_packet() {
    each(|sim| {
        let l = Loaded::new(sim, &add_hsaco(sim));
        let sig = sim.signal(1);
        let (_, _, packets) = add_batch(sim, l.kernel_object(ADD), 1, sig);
        let (st, q) = queue(sim.aie, 64);
        assert_eq!(st, Status::SUCCESS);
        // SAFETY: a live queue; one packet in slot 0, then the doorbell.
        unsafe {
            let wr = hsa_queue_add_write_index_relaxed(q, 1);
            (*q).base_address.cast::<[u8; 64]>().write(packets[0]);
            hsa_signal_store_screlease((*q).doorbell_signal, wr as i64);
        }
        assert_eq!(destroy_queue(q), Status::SUCCESS);
    });
}

#[test]
fn concurrent_queues_independent_execution() {
    each(|sim| {
        let l = Loaded::new(sim, &add_hsaco(sim));
        let ko = l.kernel_object(ADD);
        let rounds = 20usize;
        let queues = [sim.queue(), sim.queue()];
        let sigs = [sim.signal(rounds as i64), sim.signal(rounds as i64)];
        let batches: Vec<_> = (0..2)
            .map(|q| add_batch(sim, ko, rounds, sigs[q]))
            .collect();
        for (q, b) in batches.iter().enumerate() {
            iota(b.0, N * rounds, (q * N * rounds) as u32);
        }
        for r in 0..rounds {
            for q in 0..2 {
                queues[q].submit(&[batches[q].2[r]]);
            }
        }
        for q in 0..2 {
            assert_eq!(wait_eq(sigs[q], 0, u64::MAX), 0);
            assert_added(batches[q].0, batches[q].1, N * rounds, "queue");
        }
    });
}

#[test]
fn hsaco_kernel_object_is_published() {
    for p in Profile::ALL {
        check_hsaco_kernel_object_is_published(&Sim::new(p));
    }
}

/// Byte offset of the agent's section's first kernel entry's field at `field` (header 48).
fn entry_field(bytes: &[u8], generation: NpuGen, field: usize) -> usize {
    Hsaco::parse(bytes)
        .unwrap()
        .section(generation)
        .unwrap()
        .file_offset as usize
        + 48
        + field
}

#[test]
fn aie_kind_is_validated() {
    each(|sim| {
        let good = add_hsaco(sim);
        let at = entry_field(&good, sim.generation(), 28);
        for kind in [1u32, 99] {
            let mut bad = good.clone();
            bad[at..at + 4].copy_from_slice(&kind.to_le_bytes());
            let (st, e, r) = try_load(sim, &bad);
            assert_eq!(st, Status::ERROR_INVALID_CODE_OBJECT, "kind {kind}");
            destroy(e, r);
        }
    });
}

#[test]
fn num_cols_out_of_range_rejected_at_load() {
    each(|sim| {
        let good = add_hsaco(sim);
        let at = entry_field(&good, sim.generation(), 24);
        for cols in [0u32, u32::MAX] {
            let mut bad = good.clone();
            bad[at..at + 4].copy_from_slice(&cols.to_le_bytes());
            let (st, e, r) = try_load(sim, &bad);
            assert_eq!(st, Status::ERROR_INVALID_CODE_OBJECT, "num_cols {cols}");
            destroy(e, r);
        }
        Loaded::new(sim, &good).destroy();
    });
}

/// The full-ELF tests run on aie2p agents (the suite's `FullElfDispatchTest` skips others).
fn each_aie2p(f: impl Fn(&Sim, u64)) {
    each(|sim| {
        if sim.generation() != NpuGen::Npu2 {
            return;
        }
        let l = Loaded::new(sim, &add_design().to_full_elf_hsaco().unwrap());
        f(sim, l.kernel_object(ELF_ADD));
    });
}

#[test]
fn hsaco_full_elf_loads() {
    each_aie2p(|sim, ko| {
        assert_ne!(ko, 0);
        let l = Loaded::new(sim, &add_design().to_full_elf_hsaco().unwrap());
        assert_eq!(
            symbol_u64(l.symbol(ELF_ADD), SymbolInfo::KERNEL_KERNARG_SEGMENT_SIZE),
            32
        );
    });
}

#[test]
fn hsaco_full_elf_rejects_unknown_kernel_name() {
    each_aie2p(|sim, _| {
        let mut bytes = add_design().to_full_elf_hsaco().unwrap();
        let name = ELF_ADD.as_bytes();
        let at = bytes.windows(name.len()).position(|w| w == name).unwrap();
        bytes[at..at + name.len()].fill(b'z');
        let (st, e, r) = try_load(sim, &bytes);
        assert_eq!(st, Status::ERROR_INVALID_CODE_OBJECT);
        destroy(e, r);
    });
}

fn elf_chain(sim: &Sim, ko: u64, count: usize) {
    let sig = sim.signal(count as i64);
    let (i, o, packets) = add_batch(sim, ko, count, sig);
    sim.queue().submit(&packets);
    assert_eq!(wait_eq(sig, 0, u64::MAX), 0, "{:?}", last_error());
    assert_added(i, o, N * count, "full-ELF chain");
}

#[test]
fn hsaco_full_elf_dispatches() {
    each_aie2p(|sim, ko| elf_chain(sim, ko, 1));
}

#[test]
fn same_kernel_different_args_in_one_batch() {
    each_aie2p(|sim, ko| {
        let sig = sim.signal(2);
        let (a, b) = (add_batch(sim, ko, 1, sig), add_batch(sim, ko, 1, sig));
        iota(b.0, N, 5000);
        sim.queue().submit(&[a.2[0], b.2[0]]);
        assert_eq!(wait_eq(sig, 0, u64::MAX), 0);
        assert_added(a.0, a.1, N, "first");
        assert_added(b.0, b.1, N, "second");
    });
}

#[test]
fn elf_full_queue_dispatch() {
    each_aie2p(|sim, ko| elf_chain(sim, ko, 64));
}

#[test]
fn elf_repatch() {
    each_aie2p(|sim, ko| {
        let q = sim.queue();
        for round in 0..4u32 {
            let sig = sim.signal(1);
            let (i, o, p) = add_batch(sim, ko, 1, sig);
            iota(i, N, round * 1000);
            q.submit(&p);
            assert_eq!(wait_eq(sig, 0, u64::MAX), 0);
            assert_added(i, o, N, "repatch");
        }
    });
}

#[test]
fn elf_no_pdi_ceiling() {
    each_aie2p(|sim, _| {
        let bytes = add_design().to_full_elf_hsaco().unwrap();
        let loads: Vec<Loaded> = (0..40).map(|_| Loaded::new(sim, &bytes)).collect();
        let q = sim.queue();
        for l in &loads {
            run_add(sim, &q, l.kernel_object(ELF_ADD));
        }
    });
}

#[test]
fn control_code_is_aligned_for_dispatch() {
    each_aie2p(|sim, ko| {
        let dev = find_pool(sim.aie, hsa_core::sys::global_flag::COARSE_GRAINED, false).unwrap();
        let q = sim.queue();
        for bias in [4u64, 1024, 4100, 16384, 16388, 32772] {
            let spacer = allocate(dev, bias).unwrap();
            let sig = sim.signal(2);
            let (i, o, p) = add_batch(sim, ko, 2, sig);
            q.submit(&p);
            assert_eq!(
                wait_eq(sig, 0, u64::MAX),
                0,
                "bias {bias}: {:?}",
                last_error()
            );
            assert_added(i, o, 2 * N, "aligned");
            assert_eq!(pool_free(spacer), Status::SUCCESS);
        }
    });
}

#[test]
fn elf_malformed_packets_rejected() {
    type Mutate = fn(&mut [u8; 64]);
    let cases: [(&str, Mutate); 4] = [
        ("null kernel object", |p| p[20..28].fill(0)),
        ("too few kernargs", |p| {
            p[28..30].copy_from_slice(&1u16.to_le_bytes())
        }),
        ("too many kernargs", |p| {
            p[28..30].copy_from_slice(&3u16.to_le_bytes())
        }),
        ("unrecognised opcode", |p| {
            p[2..4].copy_from_slice(&0xFFu16.to_le_bytes())
        }),
    ];
    each_aie2p(|sim, ko| {
        for (name, mutate) in cases {
            let q = sim.queue();
            let sig = sim.signal(1);
            let (_, o, mut p) = add_batch(sim, ko, 1, sig);
            put_u32s(o, &[0xD0D0_D0D0; N]);
            mutate(&mut p[0]);
            q.submit(&p);
            let st = expect_rejected(&q, sig, 1);
            assert_eq!(st, Status::ERROR_INVALID_PACKET_FORMAT, "{name}");
            assert!(
                u32s(o, N).iter().all(|&v| v == 0xD0D0_D0D0),
                "{name}: output written"
            );
        }
    });
}

#[test]
fn pdi_cache_rolled_back_on_failed_batch() {
    each(|sim| {
        let l = Loaded::new(sim, &add_hsaco(sim));
        let ko = l.kernel_object(ADD);
        let q = sim.queue();
        let sig = sim.signal(2);
        let (_, _, mut p) = add_batch(sim, ko, 2, sig);
        p[1][28..30].copy_from_slice(&2000u16.to_le_bytes());
        q.submit(&p);
        expect_rejected(&q, sig, 2);
        drop(q);
        run_add(sim, &sim.queue(), ko);
    });
}

#[test]
fn kernarg_size_exceeds_buffer_rejected() {
    each(|sim| {
        let l = Loaded::new(sim, &add_hsaco(sim));
        let q = sim.queue();
        let sig = sim.signal(1);
        let (_, o, p) = add_batch(sim, l.kernel_object(ADD), 1, sig);
        put_u32s(o, &[0xD0D0_D0D0; N]);
        let kernargs = u64::from_le_bytes(p[0][32..40].try_into().unwrap());
        write(kernargs + 16, &(1u64 << 30).to_le_bytes());
        q.submit(&p);
        expect_rejected(&q, sig, 1);
        assert!(u32s(o, N).iter().all(|&v| v == 0xD0D0_D0D0));
    });
}

#[test]
fn pdi_cache_rejects_thirty_three() {
    each(|sim| {
        let bytes = add_hsaco(sim);
        let loads: Vec<Loaded> = (0..33).map(|_| Loaded::new(sim, &bytes)).collect();
        let q = sim.queue();
        for l in &loads[..32] {
            run_add(sim, &q, l.kernel_object(ADD));
        }
        let sig = sim.signal(1);
        let (_, o, p) = add_batch(sim, loads[32].kernel_object(ADD), 1, sig);
        put_u32s(o, &[0xD0D0_D0D0; N]);
        q.submit(&p);
        assert_eq!(expect_rejected(&q, sig, 1), Status::ERROR_OUT_OF_RESOURCES);
        assert!(u32s(o, N).iter().all(|&v| v == 0xD0D0_D0D0));
        drop(q);
        run_add(sim, &sim.queue(), loads[0].kernel_object(ADD));
    });
}

#[test]
fn mixed_mode_batch_rejected() {
    each_aie2p(|sim, elf| {
        let l = Loaded::new(sim, &add_hsaco(sim));
        let pdi = l.kernel_object(ADD);
        let q = sim.queue();
        let sig = sim.signal(2);
        let (_, o1, p1) = add_batch(sim, pdi, 1, sig);
        let (_, o2, p2) = add_batch(sim, elf, 1, sig);
        put_u32s(o1, &[0xD0D0_D0D0; N]);
        put_u32s(o2, &[0xD0D0_D0D0; N]);
        q.submit(&[p1[0], p2[0]]);
        expect_rejected(&q, sig, 2);
        for o in [o1, o2] {
            assert!(u32s(o, N).iter().all(|&v| v == 0xD0D0_D0D0));
        }
        drop(q);
        run_add(sim, &sim.queue(), pdi);
    });
}

#[test]
fn pdi_chain_split() {
    each(|sim| {
        let l = Loaded::new(sim, &add_hsaco(sim));
        let before = counters();
        let sig = sim.signal(64);
        let (i, o, p) = add_batch(sim, l.kernel_object(ADD), 64, sig);
        sim.queue().submit(&p);
        assert_eq!(wait_eq(sig, 0, u64::MAX), 0, "{:?}", last_error());
        assert_added(i, o, 64 * N, "64 in one doorbell");
        // floor(4096 / (52 + 4·(6+2·2))) = 44 a chain.
        assert_eq!(counters().since(&before).chain_submissions, 2);
    });
}

#[test]
fn partially_failed_batch_retires_completed_packets() {
    each(|sim| {
        let good = add_hsaco(sim);
        let l = Loaded::new(sim, &good);
        // The suite's BadInstsHsaco: the instruction blob overwritten with 0xFF.
        let mut bad = good.clone();
        let k = Hsaco::parse(&good).unwrap();
        let s = k.section(sim.generation()).unwrap();
        let kernel = s.kernel(ADD).unwrap();
        let start = s.file_offset as usize + kernel.insts.offset as usize;
        bad[start..start + kernel.insts.bytes.len()].fill(0xFF);
        let bad_l = Loaded::new(sim, &bad);
        let sig = sim.signal(64);
        let (i, o, mut p) = add_batch(sim, l.kernel_object(ADD), 64, sig);
        put_u32s(o, &vec![0xD0D0_D0D0; 64 * N]);
        p[63] = ko_packet(
            sim,
            bad_l.kernel_object(ADD),
            &[(i + 63 * BYTES, BYTES), (o + 63 * BYTES, BYTES)],
            sig,
        );
        let q = sim.queue();
        q.submit(&p);
        assert_eq!(q.errors().len(), 1);
        let remaining = load_signal(sig);
        assert!(remaining > 0 && remaining < 64, "{remaining}");
        let retired = 64 - remaining as u64;
        assert_eq!(q.read_index(), retired);
        assert!(q.read_index() < q.write_index());
        assert_added(i, o, N * retired as usize, "retired packets");
        assert!(u32s(o + 63 * BYTES, N).iter().all(|&v| v == 0xD0D0_D0D0));
    });
}

#[test]
fn pdi_cache_holds_thirty_two() {
    each(|sim| {
        let bytes = add_hsaco(sim);
        let loads: Vec<Loaded> = (0..32).map(|_| Loaded::new(sim, &bytes)).collect();
        let q = sim.queue();
        for l in &loads {
            run_add(sim, &q, l.kernel_object(ADD));
        }
    });
}

#[test]
fn mul_single_dispatch() {
    each(|sim| {
        let l = Loaded::new(sim, &mul_hsaco(sim));
        run_mul(sim, &sim.queue(), l.kernel_object(MUL));
    });
}

/// `pairs` add and multiply packets alternating, in one doorbell.
fn interleave(sim: &Sim, add: u64, mul: u64) {
    let pairs = 4;
    let sig = sim.signal(2 * pairs as i64);
    let (ain, aout, adds) = add_batch(sim, add, pairs, sig);
    let mio = allocate(data(sim), BYTES * pairs as u64).unwrap();
    iota(mio, N * pairs, 0);
    let mut packets = Vec::new();
    for (k, add) in adds.iter().enumerate() {
        packets.push(*add);
        packets.push(ko_packet(sim, mul, &[(mio + k as u64 * BYTES, BYTES)], sig));
    }
    sim.queue().submit(&packets);
    assert_eq!(wait_eq(sig, 0, u64::MAX), 0, "{:?}", last_error());
    assert_added(ain, aout, N * pairs, "interleaved add");
    assert_multiplied(mio, N * pairs, 0, "interleaved mul");
}

#[test]
fn interleaved_kernels() {
    each(|sim| {
        let (a, m) = (
            Loaded::new(sim, &add_hsaco(sim)),
            Loaded::new(sim, &mul_hsaco(sim)),
        );
        interleave(sim, a.kernel_object(ADD), m.kernel_object(MUL));
    });
}

#[test]
fn interleaved_kernels_separate_batches() {
    each(|sim| {
        let (a, m) = (
            Loaded::new(sim, &add_hsaco(sim)),
            Loaded::new(sim, &mul_hsaco(sim)),
        );
        let q = sim.queue();
        for _ in 0..4 {
            run_add(sim, &q, a.kernel_object(ADD));
            run_mul(sim, &q, m.kernel_object(MUL));
        }
    });
}

#[test]
fn elf_interleaved_kernels() {
    each_aie2p(|sim, add| {
        let m = Loaded::new(sim, &mul_design().to_full_elf_hsaco().unwrap());
        interleave(sim, add, m.kernel_object(ELF_MUL));
    });
}

#[test]
fn mode_switch_alternating_batches() {
    each_aie2p(|sim, elf| {
        let l = Loaded::new(sim, &add_hsaco(sim));
        let q = sim.queue();
        for ko in [l.kernel_object(ADD), elf, l.kernel_object(ADD), elf] {
            let sig = sim.signal(2);
            let (i, o, p) = add_batch(sim, ko, 2, sig);
            q.submit(&p);
            assert_eq!(wait_eq(sig, 0, u64::MAX), 0, "{:?}", last_error());
            assert_added(i, o, 2 * N, "mode switch");
        }
    });
}

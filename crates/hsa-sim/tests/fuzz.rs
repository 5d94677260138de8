//! Random packets through the doorbell: whatever the bytes, the emulator answers with a
//! status (or runs the packet) and never crashes. Under `rocr-newest` a failure suspends the
//! queue at the failing packet; G1 packets are fuzzed under `rocm-7.0`, whose failures are
//! silent (the releases between abort the process, which a fuzzer cannot survive), with a
//! readable payload and START_CU (ROCm 7.0 faults on the one and hangs on the other).
//! Kernel-object packets are fuzzed under `kernel-object`, which suspends as `rocr-newest`.

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::*;
use hsa_core::sys::{AieDispatchPacket, AieKernelObjectPacket, ErtBits, ErtPacket, Signal, Status};
use hsa_sim::*;
use npu_artifacts::emu::{DType, EmuDesign};
use proptest::prelude::*;

/// Addresses worth trying: null, small garbage, high garbage, and offsets into live buffers.
fn address(bases: Vec<u64>) -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        0u64..0x10000,
        any::<u64>(),
        (prop::sample::select(bases), 0u64..8192).prop_map(|(b, o)| b + o),
    ]
}

/// The statuses a refused packet may carry; `SUCCESS` is none of them: a failure reported as
/// success would be a bug.
const STATUSES: [Status; 7] = [
    Status::ERROR,
    Status::ERROR_INVALID_ARGUMENT,
    Status::ERROR_INVALID_ALLOCATION,
    Status::ERROR_INVALID_SIGNAL,
    Status::ERROR_OUT_OF_RESOURCES,
    Status::ERROR_INVALID_PACKET_FORMAT,
    Status::AMD_ERROR_NOT_SUPPORTED,
];

fn check(q: &TestQueue) {
    match q.errors().as_slice() {
        [] => assert_eq!(q.read_index(), 1),
        [st] => {
            assert!(STATUSES.contains(st), "{st:?}");
            assert!(q.suspended());
            assert_eq!(q.read_index(), 0);
        }
        more => panic!("{more:?}"),
    }
}

/// A silent failure (ROCm 7.0): no callback, the read index past the packet either way, and
/// a failure leaves one of the statuses above as the last error.
fn check_silent(q: &TestQueue, before: &Counters) {
    assert_eq!(q.errors(), vec![]);
    assert!(!q.suspended());
    assert_eq!(q.read_index(), 1);
    let seen = counters().since(before);
    match (seen.packets_completed, seen.packets_failed) {
        (1, 0) => {}
        (0, 1) => {
            let st = last_error_status().unwrap();
            assert!(STATUSES.contains(&st), "{st:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn random_g2_packets_are_refused_or_run() {
    let sim = Sim::new(Profile::RocrNewest);
    let d = Dispatch::new(
        sim.load(&EmuDesign::vector_scalar_add(256, DType::I32, 1)),
        &[(sim.alloc(DATA, 1024), 1024), (sim.alloc(DATA, 1024), 1024)],
        Signal::default(),
    );
    let kernarg = sim.kernargs(&d.args);
    let bases = vec![d.pdi, d.insts, d.args[0].0, d.args[1].0, kernarg];
    let strategy = (
        address(bases.clone()),
        address(bases.clone()),
        address(bases.clone()),
        0u16..4,
        0u64..2048,
        any::<u16>(),
        0u16..3,
    );
    proptest!(ProptestConfig::with_cases(128), |(pdi in strategy.0, insts in strategy.1,
            kernarg in strategy.2, n in strategy.3, size in strategy.4, header in strategy.5,
            opcode in strategy.6)| {
        let p = AieDispatchPacket {
            header: header & 0x1F01,
            opcode,
            insts_addr_low: insts as u32,
            insts_addr_high: (insts >> 32) as u32,
            num_kernargs: n,
            kernarg_address: kernarg,
            insts_size: size,
            pdi_addr: pdi,
            ..Default::default()
        };
        let q = sim.queue();
        q.submit(&[g2_bytes(&p)]);
        check(&q);
    });
}

#[test]
fn random_g1_packets_are_refused_or_run() {
    let sim = Sim::new(Profile::Rocm70);
    let d = Dispatch::new(
        sim.load(&EmuDesign::vector_scalar_add(256, DType::I32, 1)),
        &[(sim.alloc(DATA, 1024), 1024), (sim.alloc(DATA, 1024), 1024)],
        Signal::default(),
    );
    let good = g1_packet(&sim, &d);
    let bases = vec![d.pdi, d.insts, good.payload_data];
    // ROCm 7.0 dereferences the payload unchecked and loops forever on an opcode other than
    // START_CU (rocm_7_0.rs checks both in a child process): the fuzzer keeps the payload
    // pointer at readable memory and the opcode at START_CU, and varies everything else.
    let opcode = hsa_core::sys::ert_opcode::START_CU;
    let readable = prop::sample::select(bases.clone());
    proptest!(ProptestConfig::with_cases(128), |(payload in readable,
            count in 0u32..20, state in 0u32..12, words in prop::collection::vec(any::<u32>(), 12))| {
        // Scribble over the good payload's data words, then point the packet somewhere.
        let mut bytes = read(good.payload_data, 8 + 4 * 11);
        for (i, w) in words.iter().enumerate().take(11) {
            if w % 3 == 0 {
                bytes[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
            }
        }
        write(good.payload_data, &bytes);
        let p = ErtPacket {
            ert: ErtBits { state, count, opcode, ..Default::default() }.pack(),
            payload_data: payload,
            ..good
        };
        let q = sim.queue();
        let before = counters();
        q.submit(&[g1_bytes(&p)]);
        check_silent(&q, &before);
    });
}

#[test]
fn random_kernel_object_packets_are_refused_or_run() {
    let sim = Sim::new(Profile::KernelObject);
    let d = EmuDesign::vector_scalar_add(256, DType::I32, 1);
    let (pdi_insts, full_elf) = (
        d.to_hsaco(npu_artifacts::NpuGen::Npu2).unwrap(),
        d.to_full_elf_hsaco().unwrap(),
    );
    let (a, b) = (
        ko::Loaded::new(&sim, &pdi_insts),
        ko::Loaded::new(&sim, &full_elf),
    );
    let kos = [
        a.kernel_object("vector_scalar_add"),
        b.kernel_object("vector_scalar_add:sequence"),
    ];
    let args = [(sim.alloc(DATA, 1024), 1024), (sim.alloc(DATA, 1024), 1024)];
    let kernarg = sim.kernargs(&args);
    let bases = vec![kos[0], kos[1], args[0].0, args[1].0, kernarg];
    let strategy = (
        prop_oneof![prop::sample::select(kos.to_vec()), address(bases.clone())],
        address(bases.clone()),
        0u16..5,
        0u16..3,
        any::<u64>(),
    );
    proptest!(ProptestConfig::with_cases(128), |(ko in strategy.0, kernarg in strategy.1,
            n in strategy.2, opcode in strategy.3, reserved in strategy.4)| {
        let mut p = AieKernelObjectPacket {
            opcode,
            num_kernargs: n,
            kernarg_address: kernarg,
            reserved_insts_size: reserved,
            ..Default::default()
        };
        p.set_kernel_object(ko);
        let q = sim.queue();
        q.submit(&[ko::packet_bytes(&p)]);
        check(&q);
    });
    a.destroy();
    b.destroy();
}

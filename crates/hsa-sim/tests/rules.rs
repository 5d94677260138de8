//! Each dispatch and queue rule, triggered through the C functions under every profile where
//! it holds, and checked by what a caller of that runtime sees: the status given to the error
//! callback, suspension and the read index (`rocr-newest`); silence with the read index at the
//! write index (`rocm-7.0`); or the process aborting with the status on stderr (the others,
//! checked in a child process). See `common::profiles`.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use common::profiles::{ALL, Case, fails_on};
use common::*;
use hsa_core::sys::{Queue, QueueType, Status};
use hsa_sim::*;
use npu_artifacts::NpuGen;
use npu_artifacts::emu::EmuDesign;

/// Memory no allocation covers, alive for the whole process.
fn stray() -> u64 {
    Vec::leak(vec![0u8; 4096]).as_ptr() as u64
}

fn create_queue(sim: &Sim, agent: hsa_core::sys::Agent, size: u32, ty: QueueType) -> Status {
    let mut q: *mut Queue = std::ptr::null_mut();
    // SAFETY: `q` is a valid out-pointer; no callback.
    let st = unsafe { hsa_queue_create(agent, size, ty, None, std::ptr::null_mut(), 0, 0, &mut q) };
    if st == Status::SUCCESS {
        // SAFETY: the queue was just created.
        unsafe { hsa_queue_destroy(q) };
    }
    let _ = sim;
    st
}

#[test]
fn queue_creation_checks_size_type_and_agent() {
    for profile in ALL {
        queue_creation_under(profile);
    }
}

fn queue_creation_under(profile: Profile) {
    let sim = Sim::new(profile);
    assert_eq!(
        create_queue(&sim, sim.aie, 64, QueueType::SINGLE),
        Status::SUCCESS
    );
    for size in [0, 32, 63, 128] {
        assert_eq!(
            create_queue(&sim, sim.aie, size, QueueType::SINGLE),
            Status::ERROR_INVALID_ARGUMENT
        );
    }
    for ty in [QueueType::MULTI, QueueType::COOPERATIVE] {
        assert_eq!(
            create_queue(&sim, sim.aie, 64, ty),
            Status::ERROR_INVALID_QUEUE_CREATION
        );
    }
    assert_eq!(
        create_queue(&sim, sim.cpu, 64, QueueType::SINGLE),
        Status::ERROR_INVALID_AGENT
    );
    let stranger = hsa_core::sys::Agent { handle: 42 };
    assert_eq!(
        create_queue(&sim, stranger, 64, QueueType::SINGLE),
        Status::ERROR_INVALID_AGENT
    );
    // ROCR's order: malformed arguments first, then the agent's queue type, then its sizes.
    assert_eq!(
        create_queue(&sim, sim.aie, 64, QueueType(5)),
        Status::ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        create_queue(&sim, sim.aie, 128, QueueType::MULTI),
        Status::ERROR_INVALID_QUEUE_CREATION
    );
    assert!(last_error().unwrap().contains("only SINGLE"));
}

#[test]
fn a_pdi_outside_the_device_heap_fails_as_aie2_config_cu() {
    fails_on(
        "a_pdi_outside_the_device_heap_fails_as_aie2_config_cu",
        &ALL,
        &[Case::one(
            "PDI in pool 2",
            Status::ERROR,
            &["aie2_config_cu: Invalid BO type", "not in the device heap"],
            |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.pdi = sim.put(DATA, &add_one().to_pdi());
                sim.packet(&d)
            },
        )],
    );
}

#[test]
fn a_pdi_that_is_no_allocation_is_an_invalid_allocation() {
    fails_on(
        "a_pdi_that_is_no_allocation_is_an_invalid_allocation",
        &ALL,
        &[Case::one(
            "PDI in plain host memory",
            Status::ERROR_INVALID_ALLOCATION,
            &["PDI"],
            |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.pdi = Vec::leak(add_one().to_pdi()).as_ptr() as u64;
                sim.packet(&d)
            },
        )],
    );
}

#[test]
fn insts_and_arguments_must_be_known_allocations_of_their_declared_size() {
    let bad = Status::ERROR_INVALID_ALLOCATION;
    fails_on(
        "insts_and_arguments_must_be_known_allocations_of_their_declared_size",
        &ALL,
        &[
            Case::one("stray insts", bad, &["instruction buffer"], |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.insts = stray();
                sim.packet(&d)
            }),
            Case::one(
                "insts past the allocation",
                bad,
                &["instruction buffer"],
                |sim| {
                    let mut d = valid(sim, sim.signal(1));
                    d.insts_size += 4096 * 16;
                    sim.packet(&d)
                },
            ),
            Case::one("stray argument", bad, &["argument 1"], |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.args[1].0 = stray();
                sim.packet(&d)
            }),
            Case::one("argument too small", bad, &["only 4096 left"], |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.args[0].1 = 8192; // the allocation has 4096
                sim.packet(&d)
            }),
            // Host memory from the CPU agent's pool is not something the AIE driver can resolve.
            Case::one("CPU-pool argument", bad, &["system pool"], |sim| {
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: `p` is a valid out-pointer.
                let st = unsafe { hsa_amd_memory_pool_allocate(sim.cpu_pools[0], 1024, 0, &mut p) };
                assert_eq!(st, Status::SUCCESS);
                let mut d = valid(sim, sim.signal(1));
                d.args[0].0 = p as u64;
                sim.packet(&d)
            }),
        ],
    );
}

fn thirty_three_pdis(sim: &Sim, sig: hsa_core::sys::Signal) -> Vec<[u8; 64]> {
    let (a, b) = io_i32(sim, &[1; 256]);
    let insts = add_one().insts(sim.generation());
    let insts_va = sim.put(HEAP, &insts);
    (0..33)
        .map(|_| {
            let pdi = sim.put(HEAP, &add_one().to_pdi());
            let d = Dispatch::new(
                (pdi, insts_va, insts.len() as u64),
                &[(a, 1024), (b, 1024)],
                sig,
            );
            sim.packet(&d)
        })
        .collect()
}

fn thirty_three_pdis_case(failing_at: u64) -> Case {
    Case::new(
        "33 PDIs",
        Status::ERROR_OUT_OF_RESOURCES,
        &["at most 32"],
        |sim| thirty_three_pdis(sim, sim.signal(33)),
    )
    .failing_at(failing_at)
}

/// Where the runtime submits packet by packet, the 32 packets ahead of the 33rd PDI run.
#[test]
fn a_33rd_distinct_pdi_is_out_of_resources_and_earlier_packets_retire() {
    // ROCm 7.0 builds its chain before it submits: its 33rd PDI is `rocm_7_0.rs`'s.
    let by_packet: Vec<Profile> = ALL
        .into_iter()
        .filter(|p| !p.checks_whole_batch_first() && *p != Profile::Rocm70)
        .collect();
    fails_on(
        "a_33rd_distinct_pdi_is_out_of_resources_and_earlier_packets_retire",
        &by_packet,
        &[thirty_three_pdis_case(32)],
    );
}

/// The newest runtime builds the whole batch before it submits any: the 33rd PDI fails the
/// batch while it is built, so none of the 32 packets ahead of it runs and the signal keeps
/// every count (as ROCR's AIE suites expect of a refused batch, `PdiCacheRolledBackOnFailedBatch`).
#[test]
fn a_33rd_distinct_pdi_fails_the_whole_batch_where_the_runtime_checks_it_first() {
    let whole: Vec<Profile> = ALL
        .into_iter()
        .filter(|p| p.checks_whole_batch_first())
        .collect();
    assert!(!whole.is_empty());
    fails_on(
        "a_33rd_distinct_pdi_fails_the_whole_batch_where_the_runtime_checks_it_first",
        &whole,
        &[thirty_three_pdis_case(0)],
    );
    for profile in whole {
        let sim = Sim::new(profile);
        let sig = sim.signal(33);
        let q = sim.queue();
        let before = counters();
        q.submit(&thirty_three_pdis(&sim, sig));
        assert_eq!(q.read_index(), 0, "{profile}: nothing retired");
        assert_eq!(load_signal(sig), 33, "{profile}: and no signal fired");
        assert_eq!(counters().since(&before).packets_completed, 0, "{profile}");
    }
}

fn other_generation(sim: &Sim) -> [u8; 64] {
    let mut d = valid(sim, sim.signal(1));
    let npu1 = add_one().insts(NpuGen::Npu1);
    d.insts = sim.put(HEAP, &npu1);
    d.insts_size = npu1.len() as u64;
    sim.packet(&d)
}

#[test]
fn insts_for_the_other_generation_hang_until_the_runtime_gives_up() {
    fails_on(
        "insts_for_the_other_generation_hang_until_the_runtime_gives_up",
        &ALL, // the emulated agent is aie2p (npu2) under every profile
        &[Case::one(
            "npu1 insts",
            Status::ERROR,
            &["devGen 3", "aie2p"],
            other_generation,
        )],
    );
    let sim = Sim::new(Profile::RocrNewest);
    let start = Instant::now();
    let detail = fails_with(&sim, other_generation(&sim), Status::ERROR);
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(detail.contains("Device isn't making progress"), "{detail}");
    drop(sim);
    let sim = Sim::new(Profile::Rocm70);
    let detail = fails_with(&sim, other_generation(&sim), Status::ERROR);
    assert!(
        detail.contains("WAIT_CMD timed out") && detail.contains("50 ms"),
        "{detail}"
    );
}

#[test]
fn insts_the_txn_parser_rejects_fail_on_the_device() {
    fails_on(
        "insts_the_txn_parser_rejects_fail_on_the_device",
        &ALL,
        &[Case::one(
            "garbage insts",
            Status::ERROR,
            &["instruction sequence is malformed"],
            |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.insts = sim.put(HEAP, &[0xAB; 64]);
                d.insts_size = 64;
                sim.packet(&d)
            },
        )],
    );
}

#[test]
fn arguments_must_cover_the_txn_patches() {
    let bad = Status::ERROR_INVALID_ALLOCATION;
    fails_on(
        "arguments_must_cover_the_txn_patches",
        &ALL,
        &[
            Case::one("one argument short", bad, &[], |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.args.pop();
                sim.packet(&d)
            }),
            Case::one("argument smaller than the TXN moves", bad, &[], |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.args[1].1 = 512; // the TXN's buffer descriptor moves 1024 bytes
                sim.packet(&d)
            }),
        ],
    );
}

fn partial_pdi() -> Vec<u8> {
    const SMAP: [u32; 4] = [0xDD, 0x1122_3344, 0x5566_7788, 0x99AA_BBCC];
    let mut pdi = vec![0u8; 16 + 128];
    let mut put = |at: usize, w: u32| pdi[at..at + 4].copy_from_slice(&w.to_le_bytes());
    for (i, w) in SMAP.iter().enumerate() {
        put(i * 4, *w);
    }
    put(16, 0x0004_0000);
    put(16 + 24, 0x14CA_8093);
    put(16 + 40, 0x5050_4449); // "PPDI"
    let sum = (0..31).fold(0u32, |s, i| {
        s.wrapping_add(u32::from_le_bytes(
            pdi[16 + i * 4..20 + i * 4].try_into().unwrap(),
        ))
    });
    pdi[16 + 124..16 + 128].copy_from_slice(&(!sum).to_le_bytes());
    pdi
}

#[test]
fn a_real_partial_pdi_is_not_supported() {
    fails_on(
        "a_real_partial_pdi_is_not_supported",
        &ALL,
        &[Case::one(
            "PPDI",
            Status::AMD_ERROR_NOT_SUPPORTED,
            &["real designs need an NPU"],
            |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.pdi = sim.put(HEAP, &partial_pdi());
                sim.packet(&d)
            },
        )],
    );
}

fn design_packet(sim: &Sim, design: &EmuDesign) -> [u8; 64] {
    let (a, b) = (sim.alloc(DATA, 64), sim.alloc(DATA, 64));
    sim.packet(&Dispatch::new(
        sim.load(design),
        &[(a, 64), (b, 64)],
        sim.signal(1),
    ))
}

#[test]
fn fault_and_hang_designs_fail_like_the_device() {
    fails_on(
        "fault_and_hang_designs_fail_like_the_device",
        &ALL,
        &[
            Case::one("fault", Status::ERROR, &["device error"], |sim| {
                design_packet(sim, &EmuDesign::fault(64))
            }),
            Case::one(
                "hang",
                Status::ERROR,
                &["the hang design never completes"],
                |sim| design_packet(sim, &EmuDesign::hang(64)),
            ),
        ],
    );
    let sim = Sim::new(Profile::RocrNewest);
    let start = Instant::now();
    let detail = fails_with(
        &sim,
        design_packet(&sim, &EmuDesign::hang(64)),
        Status::ERROR,
    );
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(detail.contains("Device isn't making progress"), "{detail}");
}

#[test]
fn an_unknown_completion_signal_is_invalid() {
    // G1a packets have no completion signal.
    fails_on(
        "an_unknown_completion_signal_is_invalid",
        &[
            Profile::RocrLate2025,
            Profile::RocrG2May2026,
            Profile::RocrNewest,
        ],
        &[Case::one(
            "signal 0xdead",
            Status::ERROR_INVALID_SIGNAL,
            &["0xdead"],
            |sim| sim.packet(&valid(sim, hsa_core::sys::Signal { handle: 0xdead })),
        )],
    );
}

#[test]
fn device_heap_limits_are_rocrs() {
    for profile in ALL {
        let sim = Sim::new(profile);
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: (whole block) `p` is a valid out-pointer.
        unsafe {
            assert_eq!(
                hsa_amd_memory_pool_allocate(sim.pools[HEAP], (64 << 20) + 1, 0, &mut p),
                Status::ERROR_INVALID_ALLOCATION
            );
            assert_eq!(
                hsa_amd_memory_pool_allocate(sim.pools[HEAP], 0, 0, &mut p),
                Status::ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                hsa_amd_memory_pool_allocate(sim.pools[HEAP], 48 << 20, 0, &mut p),
                Status::SUCCESS
            );
            assert_eq!(p as usize % (32 << 10), 0);
            let big = p;
            assert_eq!(
                hsa_amd_memory_pool_allocate(sim.pools[HEAP], 32 << 20, 0, &mut p),
                Status::ERROR_OUT_OF_RESOURCES
            );
            assert_eq!(hsa_amd_memory_pool_free(big), Status::SUCCESS);
            assert_eq!(
                hsa_amd_memory_pool_allocate(sim.pools[HEAP], 32 << 20, 0, &mut p),
                Status::SUCCESS
            );
            assert_eq!(hsa_amd_memory_pool_free(p), Status::SUCCESS);
            assert_eq!(
                hsa_amd_memory_pool_free(p),
                Status::ERROR_INVALID_ALLOCATION
            );
        }
    }
}

#[test]
fn a_queue_without_a_callback_aborts_except_where_failures_are_silent() {
    // The newest ROCR's default queue error handler prints and aborts; the releases that
    // throw abort anyway; ROCm 7.0 says nothing.
    fails_on(
        "a_queue_without_a_callback_aborts_except_where_failures_are_silent",
        &ALL,
        &[Case::one(
            "insts_size 3, no callback",
            Status::ERROR_INVALID_ARGUMENT,
            &["insts_size"],
            |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.insts_size = 3;
                // G1 packets count dwords: a size of 3 bytes becomes 0 dwords.
                sim.packet(&d)
            },
        )
        .without_callback()],
    );
    // Destroying the queue twice is refused.
    let sim = Sim::new(Profile::RocrNewest);
    let q = sim.queue_with(false);
    // SAFETY: a live queue, destroyed once here; the TestQueue's own destroy then fails.
    unsafe {
        assert_eq!(hsa_queue_destroy(q.q), Status::SUCCESS);
        assert_eq!(hsa_queue_destroy(q.q), Status::ERROR_INVALID_QUEUE);
    }
}

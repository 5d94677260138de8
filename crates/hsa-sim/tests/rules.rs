//! Each dispatch and queue rule, triggered through the C functions, checked by what a caller
//! sees: the status given to the error callback, suspension, the last error's text, signal
//! values and the read index.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use common::*;
use hsa_core::sys::{
    AccessDesc, AccessPermission, AieDispatchPacket, MemoryType, Queue, QueueType, Status,
    VmemHandle,
};
use hsa_sim::*;
use npu_artifacts::NpuGen;
use npu_artifacts::emu::EmuDesign;

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
    let sim = Sim::new(PacketAbi::G2);
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
fn g2_header_type_and_opcode_are_checked() {
    let sim = Sim::new(PacketAbi::G2);
    let sig = sim.signal(1);
    let mut p = g2_packet(&sim, &valid(&sim, sig));
    p.header = 1; // HSA_AMD_AIE_PACKET_TYPE_INVALID
    let detail = fails_with(&sim, g2_bytes(&p), Status::ERROR_INVALID_PACKET_FORMAT);
    assert!(detail.contains("READY"), "{detail}");
    let mut p = g2_packet(&sim, &valid(&sim, sig));
    p.opcode = 1;
    let detail = fails_with(&sim, g2_bytes(&p), Status::ERROR_INVALID_PACKET_FORMAT);
    assert!(detail.contains("KMQ"), "{detail}");
    assert_eq!(
        load_signal(sig),
        1,
        "a failed packet does not fire its signal"
    );
    // The fence bits are ignored: header 0 works as well as 0x1400.
    let mut p = g2_packet(&sim, &valid(&sim, sig));
    p.header = 0;
    let q = sim.queue();
    q.submit(&[g2_bytes(&p)]);
    assert_eq!(q.errors(), vec![]);
    assert_eq!(load_signal(sig), 0);
}

#[test]
fn a_pdi_outside_the_device_heap_fails_as_aie2_config_cu() {
    let sim = Sim::new(PacketAbi::G2);
    let mut d = valid(&sim, sim.signal(1));
    d.pdi = sim.put(DATA, &add_one().to_pdi());
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR);
    assert!(
        detail.contains("aie2_config_cu: Invalid BO type"),
        "{detail}"
    );
    assert!(detail.contains("not in the device heap"), "{detail}");
}

#[test]
fn a_pdi_that_is_no_allocation_is_an_invalid_allocation() {
    let sim = Sim::new(PacketAbi::G2);
    let pdi = add_one().to_pdi();
    let mut d = valid(&sim, sim.signal(1));
    d.pdi = pdi.as_ptr() as u64;
    fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);
}

#[test]
fn insts_and_arguments_must_be_known_allocations_of_their_declared_size() {
    let sim = Sim::new(PacketAbi::G2);
    let sig = sim.signal(1);
    let stray = vec![0u8; 4096];

    let mut d = valid(&sim, sig);
    d.insts = stray.as_ptr() as u64;
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);
    assert!(detail.contains("instruction buffer"), "{detail}");

    let mut d = valid(&sim, sig);
    d.insts_size += 4096 * 16; // past the end of its allocation
    fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);

    let mut d = valid(&sim, sig);
    d.args[1].0 = stray.as_ptr() as u64;
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);
    assert!(detail.contains("argument 1"), "{detail}");

    let mut d = valid(&sim, sig);
    d.args[0].1 = 8192; // the allocation has 4096
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);
    assert!(detail.contains("only 4096 left"), "{detail}");

    // Host memory from the CPU agent's pool is not something the AIE driver can resolve.
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer.
    let st = unsafe { hsa_amd_memory_pool_allocate(sim.cpu_pools[0], 1024, 0, &mut p) };
    assert_eq!(st, Status::SUCCESS);
    let mut d = valid(&sim, sig);
    d.args[0].0 = p as u64;
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);
    assert!(detail.contains("system pool"), "{detail}");
    assert_eq!(load_signal(sig), 1);
}

#[test]
fn the_g2_kernarg_buffer_must_be_a_known_allocation() {
    let sim = Sim::new(PacketAbi::G2);
    let d = valid(&sim, sim.signal(1));
    let words: Vec<u64> = vec![d.args[0].0, d.args[1].0, 1024, 1024];
    let mut p = g2_packet(&sim, &d);
    p.kernarg_address = words.as_ptr() as u64;
    let detail = fails_with(&sim, g2_bytes(&p), Status::ERROR_INVALID_ALLOCATION);
    assert!(detail.contains("kernarg buffer"), "{detail}");
    let mut p = g2_packet(&sim, &d);
    p.kernarg_address = 0;
    fails_with(&sim, g2_bytes(&p), Status::ERROR_INVALID_ARGUMENT);
}

#[test]
fn insts_size_must_be_a_multiple_of_four() {
    let sim = Sim::new(PacketAbi::G2);
    let mut d = valid(&sim, sim.signal(1));
    d.insts_size -= 2;
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ARGUMENT);
    assert!(detail.contains("multiple of 4"), "{detail}");
}

#[test]
fn a_33rd_distinct_pdi_is_out_of_resources_and_earlier_packets_retire() {
    let sim = Sim::new(PacketAbi::G2);
    let sig = sim.signal(33);
    let (a, b) = io_i32(&sim, &[1; 256]);
    let insts = add_one().insts(sim.generation());
    let insts_va = sim.put(HEAP, &insts);
    let packets: Vec<[u8; 64]> = (0..33)
        .map(|_| {
            let pdi = sim.put(HEAP, &add_one().to_pdi());
            let d = Dispatch::new(
                (pdi, insts_va, insts.len() as u64),
                &[(a, 1024), (b, 1024)],
                sig,
            );
            sim.packet(&d)
        })
        .collect();
    let q = sim.queue();
    q.submit(&packets);
    assert_eq!(q.errors(), vec![Status::ERROR_OUT_OF_RESOURCES]);
    assert!(
        last_error().unwrap().contains("at most 32"),
        "{:?}",
        last_error()
    );
    assert_eq!(
        q.read_index(),
        32,
        "the 32 packets before the failing one retired"
    );
    assert_eq!(load_signal(sig), 1, "and fired their signals");
    assert!(q.suspended());
}

#[test]
fn a_suspended_queue_ignores_later_doorbells() {
    let sim = Sim::new(PacketAbi::G2);
    let sig = sim.signal(1);
    let mut bad = valid(&sim, sig);
    bad.insts_size = 2;
    let q = sim.queue();
    q.submit(&[sim.packet(&bad)]);
    assert_eq!(q.errors(), vec![Status::ERROR_INVALID_ARGUMENT]);
    q.submit(&[sim.packet(&valid(&sim, sig))]);
    assert_eq!(q.errors().len(), 1, "no second callback");
    assert_eq!(q.read_index(), 0);
    assert_eq!(q.write_index(), 2);
    assert_eq!(load_signal(sig), 1);
    // A new queue works.
    let q2 = sim.queue();
    q2.submit(&[sim.packet(&valid(&sim, sig))]);
    assert_eq!(q2.errors(), vec![]);
    assert_eq!(load_signal(sig), 0);
}

#[test]
fn insts_for_the_other_generation_hang_until_the_timeout() {
    let sim = Sim::new(PacketAbi::G2); // aie2p = npu2
    let mut d = valid(&sim, sim.signal(1));
    let npu1 = add_one().insts(NpuGen::Npu1);
    d.insts = sim.put(HEAP, &npu1);
    d.insts_size = npu1.len() as u64;
    let start = Instant::now();
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR);
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(detail.contains("Device isn't making progress"), "{detail}");
    assert!(
        detail.contains("devGen 3") && detail.contains("aie2p"),
        "{detail}"
    );
}

#[test]
fn insts_the_txn_parser_rejects_fail_on_the_device() {
    let sim = Sim::new(PacketAbi::G2);
    let mut d = valid(&sim, sim.signal(1));
    d.insts = sim.put(HEAP, &[0xAB; 64]);
    d.insts_size = 64;
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR);
    assert!(
        detail.contains("instruction sequence is malformed"),
        "{detail}"
    );
}

#[test]
fn arguments_must_cover_the_txn_patches() {
    let sim = Sim::new(PacketAbi::G2);
    let mut d = valid(&sim, sim.signal(1));
    d.args.pop();
    fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);
    let mut d = valid(&sim, sim.signal(1));
    d.args[1].1 = 512; // the TXN's buffer descriptor moves 1024 bytes
    fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);
}

#[test]
fn a_real_partial_pdi_is_not_supported() {
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

    let sim = Sim::new(PacketAbi::G2);
    let mut d = valid(&sim, sim.signal(1));
    d.pdi = sim.put(HEAP, &pdi);
    let detail = fails_with(&sim, sim.packet(&d), Status::AMD_ERROR_NOT_SUPPORTED);
    assert!(detail.contains("real designs need an NPU"), "{detail}");
}

#[test]
fn fault_and_hang_designs_fail_like_the_device() {
    let sim = Sim::new(PacketAbi::G2);
    let (a, b) = (sim.alloc(DATA, 64), sim.alloc(DATA, 64));
    let d = Dispatch::new(
        sim.load(&EmuDesign::fault(64)),
        &[(a, 64), (b, 64)],
        sim.signal(1),
    );
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR);
    assert!(detail.contains("device error"), "{detail}");

    let d = Dispatch::new(
        sim.load(&EmuDesign::hang(64)),
        &[(a, 64), (b, 64)],
        sim.signal(1),
    );
    let start = Instant::now();
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR);
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(detail.contains("Device isn't making progress"), "{detail}");
}

#[test]
fn an_unknown_completion_signal_is_invalid() {
    let sim = Sim::new(PacketAbi::G2);
    let d = valid(&sim, hsa_core::sys::Signal { handle: 0xdead });
    fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_SIGNAL);
}

#[test]
fn vmem_mappings_are_arguments_only_with_aie_access() {
    let sim = Sim::new(PacketAbi::G2);
    let size = 4096;
    // SAFETY: (whole block) out-pointers are live locals; the range comes from the reserve.
    let va = unsafe {
        let mut h = VmemHandle::default();
        assert_eq!(
            hsa_amd_vmem_handle_create(sim.pools[KERNARG], size, MemoryType::PINNED, 0, &mut h),
            Status::SUCCESS
        );
        let mut va: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            hsa_amd_vmem_address_reserve_align(&mut va, size, 0, 0, 1),
            Status::SUCCESS
        );
        assert_eq!(hsa_amd_vmem_map(va, size, 0, h, 0), Status::SUCCESS);
        let cpu_only = [AccessDesc {
            permissions: AccessPermission::RW,
            agent_handle: sim.cpu,
        }];
        assert_eq!(
            hsa_amd_vmem_set_access(va, size, cpu_only.as_ptr(), 1),
            Status::SUCCESS
        );
        va as u64
    };
    let mut d = valid(&sim, sim.signal(1));
    d.args[1] = (va, 1024);
    let detail = fails_with(&sim, sim.packet(&d), Status::ERROR_INVALID_ALLOCATION);
    assert!(detail.contains("no access"), "{detail}");
    let aie = [AccessDesc {
        permissions: AccessPermission::RW,
        agent_handle: sim.aie,
    }];
    // SAFETY: the mapping made above.
    let st = unsafe { hsa_amd_vmem_set_access(va as *mut c_void, size, aie.as_ptr(), 1) };
    assert_eq!(st, Status::SUCCESS);
    let q = sim.queue();
    q.submit(&[sim.packet(&d)]);
    assert_eq!(q.errors(), vec![]);
    assert_eq!(bytes_i32(&read(va, 1024)), vec![6; 256]);
}

#[test]
fn device_heap_limits_are_rocrs() {
    let sim = Sim::new(PacketAbi::G2);
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

#[test]
fn a_queue_without_a_callback_fails_quietly() {
    let sim = Sim::new(PacketAbi::G2);
    let mut q: *mut Queue = std::ptr::null_mut();
    // SAFETY: (whole block) a fresh queue used and destroyed here.
    unsafe {
        assert_eq!(
            hsa_queue_create(
                sim.aie,
                64,
                QueueType::SINGLE,
                None,
                std::ptr::null_mut(),
                0,
                0,
                &mut q
            ),
            Status::SUCCESS
        );
        let mut d = valid(&sim, sim.signal(1));
        d.insts_size = 3;
        let wr = hsa_queue_add_write_index_relaxed(q, 1);
        (*q).base_address
            .cast::<AieDispatchPacket>()
            .add(wr as usize)
            .write(g2_packet(&sim, &d));
        hsa_signal_store_relaxed((*q).doorbell_signal, wr as i64);
        assert_eq!(is_suspended(q), Some(true));
        assert_eq!(hsa_queue_destroy(q), Status::SUCCESS);
        assert_eq!(hsa_queue_destroy(q), Status::ERROR_INVALID_QUEUE);
    }
}

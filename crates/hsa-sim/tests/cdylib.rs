//! The cdylib as a drop-in `libhsa-runtime64.so`: every symbol a client resolves by name is
//! there, and a dispatch through the resolved table works.

#![allow(clippy::cast_possible_truncation)]

mod device_support;

use std::ffi::{c_char, c_void};

use hsa_core::sys::{
    AIE_DISPATCH_COUNT, AIE_DISPATCH_HEADER, Agent, AgentInfo, AieDispatchPacket, HsaFns,
    MemoryPool, PoolInfo, Queue, QueueType, Signal, SignalCondition, Status, WaitState,
};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};

/// The 24 symbols IRON's HSA backend resolves before it runs anything (rocr-aie.md §10).
const IRON: [&str; 24] = [
    "hsa_init",
    "hsa_system_get_info",
    "hsa_shut_down",
    "hsa_iterate_agents",
    "hsa_agent_get_info",
    "hsa_amd_agent_iterate_memory_pools",
    "hsa_amd_memory_pool_get_info",
    "hsa_amd_memory_pool_allocate",
    "hsa_amd_memory_pool_free",
    "hsa_amd_vmem_handle_create",
    "hsa_amd_vmem_handle_release",
    "hsa_amd_vmem_address_reserve_align",
    "hsa_amd_vmem_address_free",
    "hsa_amd_vmem_map",
    "hsa_amd_vmem_unmap",
    "hsa_amd_vmem_set_access",
    "hsa_queue_create",
    "hsa_queue_destroy",
    "hsa_queue_load_write_index_relaxed",
    "hsa_queue_add_write_index_relaxed",
    "hsa_queue_load_read_index_scacquire",
    "hsa_signal_create",
    "hsa_signal_store_screlease",
    "hsa_signal_wait_scacquire",
];

/// Other entry points the emulator exports. The last five are the `hsa_ext_amd.h` entry points
/// ROCR's AIE memory suite binds (`test_memory.cc`): a program that links them must load.
const EXTRA: [&str; 23] = [
    "hsa_sim_last_error",
    "hsa_sim_counters",
    "hsa_signal_load_relaxed",
    "hsa_signal_subtract_screlease",
    "hsa_queue_load_read_index_relaxed",
    "hsa_queue_add_write_index_screlease",
    "hsa_queue_store_write_index_relaxed",
    "hsa_queue_store_write_index_screlease",
    "hsa_queue_cas_write_index_scacq_screl",
    "hsa_amd_vmem_address_reserve",
    "hsa_amd_vmem_import_shareable_handle",
    "hsa_amd_agents_allow_access",
    "hsa_agent_iterate_regions",
    "hsa_region_get_info",
    "hsa_memory_allocate",
    "hsa_memory_free",
    "hsa_amd_memory_lock",
    "hsa_amd_memory_unlock",
    "hsa_amd_agent_memory_pool_get_info",
    "hsa_amd_memory_lock_to_pool",
    "hsa_amd_pointer_info",
    "hsa_amd_memory_pool_can_migrate",
    "hsa_amd_interop_map_buffer",
];

fn open() -> libloading::Library {
    // SAFETY: loading the emulator runs no initialisers beyond Rust's own statics.
    unsafe { libloading::Library::new(device_support::cdylib_path()) }.unwrap()
}

#[test]
fn every_symbol_clients_resolve_is_exported() {
    let lib = open();
    let names = HsaFns::REQUIRED
        .iter()
        .chain(HsaFns::OPTIONAL)
        .chain(&IRON)
        .chain(&EXTRA);
    for name in names {
        // SAFETY: only the address is looked up; nothing is called.
        let sym = unsafe { lib.get::<*const c_void>(name.as_bytes()) };
        assert!(sym.is_ok(), "{name} is not exported");
    }
    // SAFETY: every symbol is this crate's function of the C name's signature.
    let fns = unsafe {
        HsaFns::resolve(|name| {
            lib.get::<*const c_void>(name.as_bytes())
                .map_or(std::ptr::null(), |s| *s)
        })
    }
    .unwrap();
    assert!(fns.missing_optional().is_empty());
}

unsafe extern "C" fn push<T>(x: T, data: *mut c_void) -> Status {
    // SAFETY: `data` is the caller's Vec<T>.
    unsafe { (*data.cast::<Vec<T>>()).push(x) };
    Status::SUCCESS
}

/// A queue error callback that only lets the failure be reported (without one, the newest
/// ROCR aborts the process).
unsafe extern "C" fn ignore_queue_error(_status: Status, _q: *mut Queue, _data: *mut c_void) {}

#[test]
fn a_dispatch_through_the_loaded_library_runs_and_errors_read_back_through_c() {
    let lib = open();
    // SAFETY: (whole test) every symbol is this crate's function of the C name's signature;
    // calls follow ROCR's contracts: live out-pointers, handles from the runtime, buffers sized
    // as declared. Device memory is viewed as a slice only after the completion signal says
    // the dispatch finished; the emulator runs nothing else, so nothing writes it meanwhile.
    unsafe {
        let f = HsaFns::resolve(|n| {
            lib.get::<*const c_void>(n.as_bytes())
                .map_or(std::ptr::null(), |s| *s)
        })
        .unwrap();
        let last_error = *lib
            .get::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(b"hsa_sim_last_error")
            .unwrap();
        assert_eq!((f.init)(), Status::SUCCESS);
        let mut agents: Vec<Agent> = Vec::new();
        (f.iterate_agents)(Some(push::<Agent>), (&raw mut agents).cast());
        let aie = agents[1];
        let mut device = 0u32;
        (f.agent_get_info)(aie, AgentInfo::DEVICE, (&raw mut device).cast());
        assert_eq!(device, 3);
        let mut pools: Vec<MemoryPool> = Vec::new();
        (f.agent_iterate_memory_pools)(aie, Some(push::<MemoryPool>), (&raw mut pools).cast());
        let rec = |p: MemoryPool| {
            let mut g = 0usize;
            (f.memory_pool_get_info)(p, PoolInfo::RUNTIME_ALLOC_REC_GRANULE, (&raw mut g).cast());
            g
        };
        let heap = *pools.iter().find(|&&p| rec(p) == 0).unwrap();
        let data = *pools.iter().find(|&&p| rec(p) != 0).unwrap();
        let alloc = |pool, bytes: &[u8]| {
            let mut p: *mut c_void = std::ptr::null_mut();
            assert_eq!(
                (f.memory_pool_allocate)(pool, bytes.len(), 0, &mut p),
                Status::SUCCESS
            );
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast(), bytes.len());
            p as u64
        };
        let design = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
        let insts = design.insts(NpuGen::Npu2);
        let (pdi, ins) = (alloc(heap, &design.to_pdi()), alloc(heap, &insts));
        let input: Vec<u8> = (1..=1024i32).flat_map(|x| x.to_le_bytes()).collect();
        let (a, b) = (alloc(data, &input), alloc(data, &[0; 4096]));
        let kernargs: Vec<u8> = [a, b, 4096, 4096]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let ka = alloc(data, &kernargs);
        let mut sig = Signal::default();
        (f.signal_create)(1, 0, std::ptr::null(), &mut sig);
        let mut q: *mut Queue = std::ptr::null_mut();
        assert_eq!(
            (f.queue_create)(
                aie,
                64,
                QueueType::SINGLE,
                Some(ignore_queue_error),
                std::ptr::null_mut(),
                0,
                0,
                &mut q
            ),
            Status::SUCCESS
        );
        let packet = AieDispatchPacket {
            header: AIE_DISPATCH_HEADER,
            count: AIE_DISPATCH_COUNT,
            completion_signal: sig,
            insts_addr_low: ins as u32,
            insts_addr_high: (ins >> 32) as u32,
            num_kernargs: 2,
            kernarg_address: ka,
            insts_size: insts.len() as u64,
            pdi_addr: pdi,
            ..Default::default()
        };
        let wr = (f.queue_add_write_index_relaxed)(q, 1);
        (*q).base_address
            .cast::<AieDispatchPacket>()
            .add(wr as usize % 64)
            .write(packet);
        (f.signal_store_screlease)((*q).doorbell_signal, wr as i64);
        assert_eq!(
            (f.signal_wait_scacquire)(sig, SignalCondition::EQ, 0, u64::MAX, WaitState::BLOCKED),
            0
        );
        let out = std::slice::from_raw_parts(b as *const i32, 1024);
        assert!(out.iter().enumerate().all(|(i, &v)| v == i as i32 + 2));

        // A failing packet: the detail comes back through the C symbol.
        let bad = AieDispatchPacket {
            insts_size: 6,
            ..packet
        };
        let wr = (f.queue_add_write_index_relaxed)(q, 1);
        (*q).base_address
            .cast::<AieDispatchPacket>()
            .add(wr as usize % 64)
            .write(bad);
        (f.signal_store_screlease)((*q).doorbell_signal, wr as i64);
        let mut buf = [0 as c_char; 256];
        let n = last_error(buf.as_mut_ptr(), buf.len());
        assert!(n > 0);
        let msg = std::ffi::CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert!(msg.contains("insts_size 6"), "{msg}");
        assert_eq!((f.queue_load_read_index_scacquire)(q), 1);
        // Exit with the queue and buffers live, as IRON does; balance only the init.
        assert_eq!((f.shut_down)(), Status::SUCCESS);
        assert_eq!((f.shut_down)(), Status::ERROR_NOT_INITIALIZED);
    }
}

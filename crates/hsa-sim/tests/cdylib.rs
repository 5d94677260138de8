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

/// The loaded library's runtime is one per process (`hsa_init` counts references, as ROCR's
/// does): two tests that init and shut it down at once, as `cargo test` runs them on threads
/// of one process, would read each other's counts. Each such test holds this for its whole
/// length (nextest runs each test in a process of its own, where it costs nothing).
static RUNTIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`RUNTIME`]; a test that panicked while holding it left nothing half-done that the
/// next one depends on (every test inits and shuts down itself).
fn runtime() -> std::sync::MutexGuard<'static, ()> {
    RUNTIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let _runtime = runtime();
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

/// The calls ROCR's AIE memory suite makes where the emulator used to differ from ROCR, made
/// through symbols resolved from the loaded library as a C program makes them (default profile,
/// `rocr-newest`): vmem unmap with access still granted, closing an exported fd, the five
/// `hsa_ext_amd.h` entry points, and the CPU agent's coarse pool.
#[test]
fn the_memory_suites_calls_answer_as_rocr_through_the_loaded_library() {
    use hsa_core::sys::{AccessDesc, AccessPermission, MemoryType, VmemHandle, global_flag};
    use std::ffi::c_int;
    type PoolCb = unsafe extern "C" fn(MemoryPool, *mut c_void) -> Status;
    let _runtime = runtime();
    let lib = open();
    // SAFETY: (whole test) every symbol is this crate's function of the C name's signature;
    // out-pointers are live locals; addresses and handles come from the library.
    unsafe {
        macro_rules! sym {
            ($name:literal: $ty:ty) => {
                *lib.get::<$ty>($name.as_bytes()).expect($name)
            };
        }
        let init = sym!("hsa_init": unsafe extern "C" fn() -> Status);
        let shut_down = sym!("hsa_shut_down": unsafe extern "C" fn() -> Status);
        let iterate_agents = sym!("hsa_iterate_agents": unsafe extern "C" fn(Option<unsafe extern "C" fn(Agent, *mut c_void) -> Status>, *mut c_void) -> Status);
        let iterate_pools = sym!("hsa_amd_agent_iterate_memory_pools": unsafe extern "C" fn(Agent, Option<PoolCb>, *mut c_void) -> Status);
        let pool_info = sym!("hsa_amd_memory_pool_get_info": unsafe extern "C" fn(MemoryPool, PoolInfo, *mut c_void) -> Status);
        let allocate = sym!("hsa_amd_memory_pool_allocate": unsafe extern "C" fn(MemoryPool, usize, u32, *mut *mut c_void) -> Status);
        let handle_create = sym!("hsa_amd_vmem_handle_create": unsafe extern "C" fn(MemoryPool, usize, MemoryType, u64, *mut VmemHandle) -> Status);
        let reserve = sym!("hsa_amd_vmem_address_reserve_align": unsafe extern "C" fn(*mut *mut c_void, usize, u64, u64, u64) -> Status);
        let map = sym!("hsa_amd_vmem_map": unsafe extern "C" fn(*mut c_void, usize, usize, VmemHandle, u64) -> Status);
        let set_access = sym!("hsa_amd_vmem_set_access": unsafe extern "C" fn(*mut c_void, usize, *const AccessDesc, usize) -> Status);
        let unmap = sym!("hsa_amd_vmem_unmap": unsafe extern "C" fn(*mut c_void, usize) -> Status);
        let export = sym!("hsa_amd_vmem_export_shareable_handle": unsafe extern "C" fn(*mut c_int, VmemHandle, u64) -> Status);
        let close_dmabuf =
            sym!("hsa_amd_portable_close_dmabuf": unsafe extern "C" fn(c_int) -> Status);
        let agent_pool_info = sym!("hsa_amd_agent_memory_pool_get_info": unsafe extern "C" fn(Agent, MemoryPool, u32, *mut c_void) -> Status);
        let can_migrate = sym!("hsa_amd_memory_pool_can_migrate": unsafe extern "C" fn(MemoryPool, MemoryPool, *mut bool) -> Status);
        let lock_to_pool = sym!("hsa_amd_memory_lock_to_pool": unsafe extern "C" fn(*mut c_void, usize, *const Agent, c_int, MemoryPool, u32, *mut *mut c_void) -> Status);
        let pointer_info = sym!("hsa_amd_pointer_info": unsafe extern "C" fn(*const c_void, *mut [u8; 56], *const c_void, *mut u32, *mut *mut Agent) -> Status);
        let interop_map = sym!("hsa_amd_interop_map_buffer": unsafe extern "C" fn(u32, *const Agent, c_int, u32, *mut usize, *mut *mut c_void, *mut usize, *mut *const c_void) -> Status);

        assert_eq!(init(), Status::SUCCESS);
        let mut agents: Vec<Agent> = Vec::new();
        iterate_agents(Some(push::<Agent>), (&raw mut agents).cast());
        let (cpu, aie) = (agents[0], agents[1]);
        let pools_of = |a| {
            let mut v: Vec<MemoryPool> = Vec::new();
            iterate_pools(a, Some(push::<MemoryPool>), (&raw mut v).cast());
            v
        };
        let flags = |p| {
            let mut v = 0u32;
            pool_info(p, PoolInfo::GLOBAL_FLAGS, (&raw mut v).cast());
            v
        };
        // D4: the CPU agent's coarse pool.
        let cpu_coarse = *pools_of(cpu)
            .iter()
            .find(|&&p| flags(p) & global_flag::COARSE_GRAINED != 0)
            .expect("the CPU agent has a coarse-grained pool");
        let aie_pool = pools_of(aie)[0];

        // D1: unmap with CPU and AIE access still granted.
        let size = 4096;
        let mut h = VmemHandle::default();
        assert_eq!(
            handle_create(aie_pool, size, MemoryType::PINNED, 0, &mut h),
            Status::SUCCESS
        );
        let mut va: *mut c_void = std::ptr::null_mut();
        assert_eq!(reserve(&mut va, size, 0, 0, 1), Status::SUCCESS);
        assert_eq!(map(va, size, 0, h, 0), Status::SUCCESS);
        let rw = [cpu, aie].map(|a| AccessDesc {
            permissions: AccessPermission::RW,
            agent_handle: a,
        });
        assert_eq!(set_access(va, size, rw.as_ptr(), 2), Status::SUCCESS);
        assert_eq!(unmap(va, size), Status::SUCCESS);

        // D2: the exported fd is closed by hsa_amd_portable_close_dmabuf.
        let mut fd: c_int = -1;
        assert_eq!(export(&mut fd, h, 0), Status::SUCCESS);
        assert_eq!(close_dmabuf(fd), Status::SUCCESS);
        assert_eq!(libc::fcntl(fd, libc::F_GETFD), -1, "fd {fd} is still open");

        // D3: the five entry points.
        let mut access = u32::MAX;
        assert_eq!(
            agent_pool_info(aie, aie_pool, 0, (&raw mut access).cast()),
            Status::SUCCESS
        );
        assert_eq!(access, 1, "ALLOWED_BY_DEFAULT");
        let mut migrate = true;
        assert_eq!(
            can_migrate(aie_pool, cpu_coarse, &mut migrate),
            Status::ERROR_OUT_OF_RESOURCES
        );
        assert!(!migrate);
        let mut host = vec![0u8; 4096];
        let mut out: *mut c_void = std::ptr::null_mut();
        assert_ne!(
            lock_to_pool(
                host.as_mut_ptr().cast(),
                4096,
                &aie,
                1,
                aie_pool,
                0,
                &mut out
            ),
            Status::SUCCESS
        );
        let mut p: *mut c_void = std::ptr::null_mut();
        assert_eq!(allocate(aie_pool, 4096, 0, &mut p), Status::SUCCESS);
        let mut info = [0u8; 56];
        info[..4].copy_from_slice(&56u32.to_le_bytes());
        assert_eq!(
            pointer_info(
                p,
                &mut info,
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            Status::SUCCESS
        );
        assert_eq!(
            u32::from_le_bytes(info[4..8].try_into().unwrap()),
            1,
            "HSA_EXT_POINTER_TYPE_HSA"
        );
        assert_eq!(
            u64::from_le_bytes(info[40..48].try_into().unwrap()),
            aie.handle,
            "owner"
        );
        let (mut sz, mut ptr) = (0usize, std::ptr::null_mut());
        assert_eq!(
            interop_map(
                1,
                &aie,
                3,
                0,
                &mut sz,
                &mut ptr,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            Status::ERROR
        );
        assert_eq!(shut_down(), Status::SUCCESS);
    }
}

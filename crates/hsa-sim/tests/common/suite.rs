//! What ROCR's own AIE suites (`rocrtst/suites/aie/` in ROCm/rocm-systems) do before and around
//! their checks, in our terms: the pool predicates they search with, the two designs they
//! dispatch (vector-scalar add, and the in-place multiply by `MUL_SCALE`), and the profile
//! filters that say which runtime a suite was written for.

use std::ffi::c_void;

use hsa_core::sys::{
    AccessDesc, AccessPermission, Agent, MemoryPool, MemoryType, PoolInfo, Segment, Status,
    VmemHandle, global_flag,
};
use hsa_sim::*;
use npu_artifacts::emu::{DType, EmuDesign};

use super::{Dispatch, pool_usize, read, write};

/// Elements of the suites' I/O buffers.
pub const N: usize = 1024;
/// Bytes of one I/O buffer.
pub const BYTES: u64 = (N * 4) as u64;
/// The multiply design's factor (the suites take it from the build's `VSMUL_SCALE`).
pub const MUL_SCALE: u32 = 3;

/// The add design: `out = in + 1` over 1024 u32 (`aie_vector_scalar_kernel`).
pub fn add_design() -> EmuDesign {
    EmuDesign::vector_scalar_add(N as u32, DType::U32, 1)
}

/// The multiply design: `inout *= MUL_SCALE` in place (`aie_vector_scalar_mul_kernel`).
pub fn mul_design() -> EmuDesign {
    EmuDesign::vector_scalar_mul(N as u32, DType::U32, i64::from(MUL_SCALE))
}

/// Profiles whose packets are the G2 dispatch.cc writes: a PDI and an instruction buffer.
pub fn g2_profiles() -> Vec<Profile> {
    Profile::ALL
        .into_iter()
        .filter(|p| p.packet_abi() == PacketAbi::G2 && !p.speaks_kernel_objects())
        .collect()
}

/// Profiles that load AIE hsacos and dispatch kernel objects, as test_dispatch.cc does.
pub fn kernel_object_profiles() -> Vec<Profile> {
    Profile::ALL
        .into_iter()
        .filter(|p| p.speaks_kernel_objects())
        .collect()
}

unsafe extern "C" fn collect_pool(p: MemoryPool, data: *mut c_void) -> Status {
    // SAFETY: `data` is the caller's Vec.
    unsafe { (*data.cast::<Vec<MemoryPool>>()).push(p) };
    Status::SUCCESS
}

/// Every pool of `agent`, in the runtime's order.
pub fn pools_of(agent: Agent) -> Vec<MemoryPool> {
    let mut v: Vec<MemoryPool> = Vec::new();
    // SAFETY: the callback pushes into `v`, which outlives the call.
    let st = unsafe {
        hsa_amd_agent_iterate_memory_pools(agent, Some(collect_pool), (&raw mut v).cast())
    };
    assert_eq!(st, Status::SUCCESS);
    v
}

pub fn pool_u32(pool: MemoryPool, attr: PoolInfo) -> u32 {
    let mut v = 0u32;
    // SAFETY: a u32 out-pointer for a u32 attribute.
    let st = unsafe { hsa_amd_memory_pool_get_info(pool, attr, (&raw mut v).cast()) };
    assert_eq!(st, Status::SUCCESS, "{attr:?}");
    v
}

/// test_memory.cc's `discover_first_global_coarse_grain_mem_pool`: the first global pool with
/// the COARSE flag and a non-zero `RUNTIME_ALLOC_GRANULE`.
pub fn first_coarse_pool(agent: Agent) -> Option<MemoryPool> {
    pools_of(agent).into_iter().find(|&p| {
        pool_u32(p, PoolInfo::SEGMENT) == Segment::GLOBAL.0
            && pool_u32(p, PoolInfo::GLOBAL_FLAGS) & global_flag::COARSE_GRAINED != 0
            && pool_usize(p, PoolInfo::RUNTIME_ALLOC_GRANULE) != 0
    })
}

/// The dispatch suites' `find_memory_pool`: the first global pool with any of `flags` whose
/// `RUNTIME_ALLOC_REC_GRANULE` is non-zero exactly when `allocatable`.
pub fn find_pool(agent: Agent, flags: u32, allocatable: bool) -> Option<MemoryPool> {
    pools_of(agent).into_iter().find(|&p| {
        pool_u32(p, PoolInfo::SEGMENT) == Segment::GLOBAL.0
            && pool_u32(p, PoolInfo::GLOBAL_FLAGS) & flags != 0
            && (pool_usize(p, PoolInfo::RUNTIME_ALLOC_REC_GRANULE) != 0) == allocatable
    })
}

pub fn allocate(pool: MemoryPool, size: u64) -> Result<u64, Status> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a live out-pointer.
    let st = unsafe { hsa_amd_memory_pool_allocate(pool, size as usize, 0, &mut p) };
    if st == Status::SUCCESS {
        Ok(p as u64)
    } else {
        Err(st)
    }
}

pub fn pool_free(p: u64) -> Status {
    // SAFETY: any address; the runtime checks it.
    unsafe { hsa_amd_memory_pool_free(p as *mut c_void) }
}

pub fn u32s(addr: u64, n: usize) -> Vec<u32> {
    read(addr, n * 4)
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn put_u32s(addr: u64, v: &[u32]) {
    write(
        addr,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    );
}

/// `std::iota` from `start` over `n` u32 at `addr`.
pub fn iota(addr: u64, n: usize, start: u32) {
    put_u32s(
        addr,
        &(0..n as u32)
            .map(|i| start.wrapping_add(i))
            .collect::<Vec<_>>(),
    );
}

/// The suites' `VerifyAdd`: `out[i] == in[i] + 1`.
pub fn assert_added(input: u64, output: u64, n: usize, what: &str) {
    let (i, o) = (u32s(input, n), u32s(output, n));
    for (k, (a, b)) in i.iter().zip(&o).enumerate() {
        assert_eq!(*b, a.wrapping_add(1), "{what}: add mismatch at index {k}");
    }
}

/// The suites' `VerifyMul`: the buffer seeded with `iota(base)` now holds each times the scale.
pub fn assert_multiplied(inout: u64, n: usize, base: u32, what: &str) {
    for (k, v) in u32s(inout, n).iter().enumerate() {
        let want = (base + k as u32).wrapping_mul(MUL_SCALE);
        assert_eq!(*v, want, "{what}: mul mismatch at index {k}");
    }
}

/// A G2 dispatch of a loaded design over `args` (address, size) with `completion`.
pub fn dispatch(
    loaded: (u64, u64, u64),
    args: &[(u64, u64)],
    sig: hsa_core::sys::Signal,
) -> Dispatch {
    Dispatch::new(loaded, args, sig)
}

/// A vmem buffer as the suites' `vmem_allocate` makes one: handle, reservation, map, access.
pub struct VmemBuf {
    pub handle: VmemHandle,
    pub va: u64,
    pub size: usize,
}

pub fn access(agents: &[Agent], perm: AccessPermission) -> Vec<AccessDesc> {
    agents
        .iter()
        .map(|&a| AccessDesc {
            permissions: perm,
            agent_handle: a,
        })
        .collect()
}

pub fn set_access(va: u64, size: usize, descs: &[AccessDesc]) -> Status {
    // SAFETY: `descs` is a live slice.
    unsafe { hsa_amd_vmem_set_access(va as *mut c_void, size, descs.as_ptr(), descs.len()) }
}

pub fn handle_create(pool: MemoryPool, size: usize) -> Result<VmemHandle, Status> {
    let mut h = VmemHandle::default();
    // SAFETY: a live out-pointer.
    let st = unsafe { hsa_amd_vmem_handle_create(pool, size, MemoryType::PINNED, 0, &mut h) };
    if st == Status::SUCCESS {
        Ok(h)
    } else {
        Err(st)
    }
}

pub fn reserve(size: usize, flags: u64) -> u64 {
    let mut va: *mut c_void = std::ptr::null_mut();
    // SAFETY: a live out-pointer.
    let st = unsafe { hsa_amd_vmem_address_reserve_align(&mut va, size, 0, 0, flags) };
    assert_eq!(st, Status::SUCCESS);
    va as u64
}

pub fn map(va: u64, size: usize, h: VmemHandle) -> Status {
    // SAFETY: addresses from the runtime; it checks them.
    unsafe { hsa_amd_vmem_map(va as *mut c_void, size, 0, h, 0) }
}

pub fn unmap(va: u64, size: usize) -> Status {
    // SAFETY: addresses from the runtime; it checks them.
    unsafe { hsa_amd_vmem_unmap(va as *mut c_void, size) }
}

pub fn address_free(va: u64, size: usize) -> Status {
    // SAFETY: addresses from the runtime; it checks them.
    unsafe { hsa_amd_vmem_address_free(va as *mut c_void, size) }
}

pub fn handle_release(h: VmemHandle) -> Status {
    // SAFETY: a handle; the runtime checks it.
    unsafe { hsa_amd_vmem_handle_release(h) }
}

pub fn get_access(va: u64, agent: Agent) -> (Status, AccessPermission) {
    let mut p = AccessPermission::NONE;
    // SAFETY: a live out-pointer.
    let st = unsafe { hsa_amd_vmem_get_access(va as *mut c_void, &mut p, agent) };
    (st, p)
}

/// The suites' `vmem_allocate`: `size` rounded up to the pool's granule, RW for `agents`.
/// `Err` is the first call that failed and its status.
pub fn vmem_allocate(
    pool: MemoryPool,
    size: usize,
    agents: &[Agent],
) -> Result<VmemBuf, (&'static str, Status)> {
    let g = pool_usize(pool, PoolInfo::RUNTIME_ALLOC_GRANULE);
    let size = size.div_ceil(g) * g;
    let handle = handle_create(pool, size).map_err(|s| ("hsa_amd_vmem_handle_create", s))?;
    let va = reserve(size, 1);
    let st = map(va, size, handle);
    if st != Status::SUCCESS {
        address_free(va, size);
        handle_release(handle);
        return Err(("hsa_amd_vmem_map", st));
    }
    let st = set_access(va, size, &access(agents, AccessPermission::RW));
    if st != Status::SUCCESS {
        return Err(("hsa_amd_vmem_set_access", st));
    }
    Ok(VmemBuf { handle, va, size })
}

/// The suites' `vmem_free`: unmap (access still granted), free the range, release the handle;
/// every step's status.
pub fn vmem_free(b: &VmemBuf) -> [Status; 3] {
    [
        unmap(b.va, b.size),
        address_free(b.va, b.size),
        handle_release(b.handle),
    ]
}

// The checks both dispatch suites (`test_dispatch.cc` and `dispatch.cc`) make identically.

pub fn queue(agent: Agent, size: u32) -> (Status, *mut hsa_core::sys::Queue) {
    let mut q: *mut hsa_core::sys::Queue = std::ptr::null_mut();
    // SAFETY: a live out-pointer; no callback.
    let st = unsafe {
        hsa_queue_create(
            agent,
            size,
            hsa_core::sys::QueueType::SINGLE,
            None,
            std::ptr::null_mut(),
            0,
            0,
            &mut q,
        )
    };
    (st, q)
}

pub fn destroy_queue(q: *mut hsa_core::sys::Queue) -> Status {
    // SAFETY: a queue from `hsa_queue_create`, destroyed once.
    unsafe { hsa_queue_destroy(q) }
}

/// `Dispatch.QueueCreate`.
pub fn check_queue_create(sim: &super::Sim) {
    let min = super::u32_info(sim.aie, hsa_core::sys::AgentInfo::QUEUE_MIN_SIZE);
    assert!(min > 0);
    let (st, q) = queue(sim.aie, min);
    assert_eq!(st, Status::SUCCESS);
    assert!(!q.is_null());
    assert_eq!(destroy_queue(q), Status::SUCCESS);
}

/// `Dispatch.QueueMinMaxSize`.
pub fn check_queue_min_max_size(sim: &super::Sim) {
    use hsa_core::sys::AgentInfo;
    let min = super::u32_info(sim.aie, AgentInfo::QUEUE_MIN_SIZE);
    let max = super::u32_info(sim.aie, AgentInfo::QUEUE_MAX_SIZE);
    assert!(min > 0 && max > 0 && min <= max);
}

/// `Dispatch.DevPoolDiscovery`: a coarse pool that cannot be allocated from at will.
pub fn check_dev_pool_discovery(sim: &super::Sim) {
    assert!(find_pool(sim.aie, global_flag::COARSE_GRAINED, false).is_some());
}

/// `Dispatch.KernargPoolDiscovery`: KERNARG_INIT (else coarse) allocatable, and 64 bytes from it.
pub fn check_kernarg_pool_discovery(sim: &super::Sim) {
    let pool = find_pool(sim.aie, global_flag::KERNARG_INIT, true)
        .or_else(|| find_pool(sim.aie, global_flag::COARSE_GRAINED, true))
        .expect("a kernarg pool");
    let b = allocate(pool, 64).unwrap();
    assert_ne!(b, 0);
    assert_eq!(pool_free(b), Status::SUCCESS);
}

/// `Dispatch.AgentInfo`.
pub fn check_agent_info(sim: &super::Sim) {
    use hsa_core::sys::{AGENT_FEATURE_AGENT_DISPATCH, AgentInfo, QueueType};
    let name = |attr| {
        let mut buf = [0u8; 64];
        // SAFETY: a 64-byte buffer for a name attribute.
        let st = unsafe { hsa_agent_get_info(sim.aie, attr, buf.as_mut_ptr().cast()) };
        assert_eq!(st, Status::SUCCESS, "{attr:?}");
        let end = buf.iter().position(|&b| b == 0).unwrap_or(64);
        String::from_utf8_lossy(&buf[..end]).into_owned()
    };
    assert!(!name(AgentInfo::NAME).is_empty());
    name(AgentInfo::AMD_PRODUCT_NAME);
    assert_eq!(name(AgentInfo::VENDOR_NAME), "AMD");
    // UUID: exactly 21 bytes written, guards either side untouched.
    let mut buf = [0xABu8; 8 + 21 + 8];
    buf[8..29].fill(0xCD);
    // SAFETY: 21 writable bytes at offset 8.
    let st =
        unsafe { hsa_agent_get_info(sim.aie, AgentInfo::AMD_UUID, buf[8..].as_mut_ptr().cast()) };
    assert_eq!(st, Status::SUCCESS);
    assert!(
        buf[..8].iter().chain(&buf[29..]).all(|&b| b == 0xAB),
        "UUID wrote past 21 bytes"
    );
    assert_eq!(&buf[8..15], b"AIE-XX\0");
    assert_eq!(
        super::u32_info(sim.aie, AgentInfo::FEATURE),
        AGENT_FEATURE_AGENT_DISPATCH
    );
    assert_eq!(
        super::u32_info(sim.aie, AgentInfo::QUEUE_TYPE),
        QueueType::SINGLE.0
    );
}

/// `Dispatch.CreateDestroyMultipleQueues`: min(QUEUES_MAX, 4) queues.
pub fn check_create_destroy_multiple_queues(sim: &super::Sim) {
    use hsa_core::sys::AgentInfo;
    let min = super::u32_info(sim.aie, AgentInfo::QUEUE_MIN_SIZE);
    let max = super::u32_info(sim.aie, AgentInfo::QUEUES_MAX);
    assert!(max > 0);
    let qs: Vec<_> = (0..max.min(4))
        .map(|_| {
            let (st, q) = queue(sim.aie, min);
            assert_eq!(st, Status::SUCCESS);
            q
        })
        .collect();
    for q in qs {
        assert_eq!(destroy_queue(q), Status::SUCCESS);
    }
}

/// `DispatchTest.HsacoKernelObjectIsPublished`: where the profile's ROCR loads AIE hsacos, the
/// kernel object reads 0 before freeze and a handle after, and the kernarg size is 32; where it
/// has no AIE section loader, the load fails with `INVALID_CODE_OBJECT` (ROCR's GPU loader finds
/// no ISA). A profile that dispatches kernel objects must load.
pub fn check_hsaco_kernel_object_is_published(sim: &super::Sim) {
    use super::ko::{Loaded, destroy, freeze, symbol_u64, try_load};
    use hsa_core::sys::SymbolInfo;
    let p = sim.profile;
    let bytes = add_design().to_hsaco(sim.generation()).unwrap();
    let (st, e, r) = try_load(sim, &bytes);
    if st != Status::SUCCESS {
        assert_eq!(st, Status::ERROR_INVALID_CODE_OBJECT, "{p}");
        assert!(
            !p.speaks_kernel_objects(),
            "{p} dispatches kernel objects but cannot load"
        );
        destroy(e, r);
        return;
    }
    let l = Loaded {
        exec: e,
        reader: r,
        agent: sim.aie,
    };
    let name = "vector_scalar_add";
    assert_eq!(
        symbol_u64(l.symbol(name), SymbolInfo::KERNEL_OBJECT),
        0,
        "{p}: before freeze"
    );
    assert_eq!(
        symbol_u64(l.symbol(name), SymbolInfo::KERNEL_KERNARG_SEGMENT_SIZE),
        32
    );
    assert_eq!(freeze(e), Status::SUCCESS);
    assert_ne!(l.kernel_object(name), 0, "{p}: after freeze");
    l.destroy();
}

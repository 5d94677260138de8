//! ROCR's AIE memory suite (`rocrtst/suites/aie/test_memory.cc`, ROCm/rocm-systems @17785555,
//! the kernel-object era), one test per gtest test that needs no GPU, named after it, run under
//! every profile. Where a release differs the profile decides, through its properties
//! ([`Profile::vmem_maps_aie_handles`], [`Profile::vmem_imports`],
//! [`Profile::vmem_exports_aie_handles`], [`Profile::pointer_info_knows_aie_memory`]).
//!
//! Nine suite tests need a GPU agent and skip without one, as they do on the emulator (no agent
//! is a GPU: `no_agent_is_a_gpu_so_the_gpu_tests_skip`): DMABufExportImportGPUtoAIE,
//! DMABufExportImportAIEtoGPU, PoolAllocateAllowAccessGPUtoAIE, PoolAllocateAllowAccessAIEtoGPU,
//! VMemSetAccessFromGPU, VMemSetUnsetAccessFromGPU, VMemSetAccessFromNPU,
//! VMemSetUnsetAccessFromNPU, VMemUnmapRemapCycleFromGPUPool.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::ffi::{c_int, c_void};

use common::suite::*;
use common::*;
use hsa_core::sys::{
    AccessPermission, Agent, AgentInfo, DeviceType, MemoryPool, MemoryType, PoolInfo, Segment,
    Status, VmemHandle, global_flag,
};
use hsa_sim::*;

/// Runs `f` under every profile.
fn each(f: impl Fn(&Sim, MemoryPool)) {
    for p in Profile::ALL {
        let sim = Sim::new(p);
        let pool = first_coarse_pool(sim.aie).expect("the AIE agent has a coarse pool");
        f(&sim, pool);
    }
}

const SIZE: usize = 4096;

/// A handle of `size` from `pool`, reserved (`flags`) and mapped; `None` where the profile's
/// ROCR maps only KFD memory, after checking that it says so (`INVALID_AGENT`).
fn mapped(sim: &Sim, pool: MemoryPool, size: usize, flags: u64) -> Option<(VmemHandle, u64)> {
    let h = handle_create(pool, size).unwrap();
    let va = reserve(size, flags);
    let st = map(va, size, h);
    if !sim.profile.vmem_maps_aie_handles() {
        assert_eq!(st, Status::ERROR_INVALID_AGENT, "{}", sim.profile);
        assert_eq!(address_free(va, size), Status::SUCCESS);
        assert_eq!(handle_release(h), Status::SUCCESS);
        return None;
    }
    assert_eq!(st, Status::SUCCESS, "{}", sim.profile);
    Some((h, va))
}

/// The suites' cleanup: unmap with access still granted, free, release; all succeed.
fn teardown(sim: &Sim, h: VmemHandle, va: u64, size: usize) {
    let p = sim.profile;
    assert_eq!(unmap(va, size), Status::SUCCESS, "{p}: {:?}", last_error());
    assert_eq!(address_free(va, size), Status::SUCCESS, "{p}");
    assert_eq!(handle_release(h), Status::SUCCESS, "{p}");
}

#[test]
fn pool_allocate() {
    each(|_, pool| {
        let b = allocate(pool, SIZE as u64).unwrap();
        iota(b, 1024, 0);
        assert_eq!(pool_free(b), Status::SUCCESS);
    });
}

#[test]
fn memory_lock() {
    each(|sim, _| {
        let mut host = vec![0u32; 1024];
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live buffer and out-pointer; one agent.
        let st =
            unsafe { hsa_amd_memory_lock(host.as_mut_ptr().cast(), SIZE, &sim.aie, 1, &mut out) };
        assert_ne!(st, Status::SUCCESS, "{}", sim.profile);
    });
}

#[test]
fn vmem_create_npu() {
    each(|_, pool| {
        let h = handle_create(pool, SIZE).unwrap();
        assert_eq!(handle_release(h), Status::SUCCESS);
    });
}

#[test]
fn vmem_map_npu() {
    each(|sim, pool| {
        if let Some((h, va)) = mapped(sim, pool, SIZE, 0) {
            teardown(sim, h, va, SIZE);
        }
    });
}

#[test]
fn pool_get_info() {
    each(|_, pool| {
        assert_eq!(pool_u32(pool, PoolInfo::SEGMENT), Segment::GLOBAL.0);
        assert_ne!(
            pool_u32(pool, PoolInfo::GLOBAL_FLAGS) & global_flag::COARSE_GRAINED,
            0
        );
        assert!(pool_usize(pool, PoolInfo::SIZE) > 0);
        let mut allowed = false;
        // SAFETY: a bool out-pointer for a bool attribute.
        let st = unsafe {
            hsa_amd_memory_pool_get_info(
                pool,
                PoolInfo::RUNTIME_ALLOC_ALLOWED,
                (&raw mut allowed).cast(),
            )
        };
        assert_eq!(st, Status::SUCCESS);
        assert!(allowed);
        assert!(pool_usize(pool, PoolInfo::RUNTIME_ALLOC_GRANULE) > 0);
        assert!(pool_usize(pool, PoolInfo::RUNTIME_ALLOC_ALIGNMENT).is_power_of_two());
        let mut all = false;
        // SAFETY: as above.
        let st = unsafe {
            hsa_amd_memory_pool_get_info(pool, PoolInfo::ACCESSIBLE_BY_ALL, (&raw mut all).cast())
        };
        assert_eq!(st, Status::SUCCESS);
        assert!(pool_usize(pool, PoolInfo::ALLOC_MAX_SIZE) > 0);
    });
}

fn agent_pool_access(agent: Agent, pool: MemoryPool) -> (Status, u32) {
    let mut v = u32::MAX;
    // SAFETY: a u32 out-pointer for ACCESS.
    let st = unsafe {
        hsa_amd_agent_memory_pool_get_info(agent, pool, AGENT_POOL_INFO_ACCESS, (&raw mut v).cast())
    };
    (st, v)
}

#[test]
fn agent_pool_get_info() {
    each(|sim, pool| {
        let (st, aie) = agent_pool_access(sim.aie, pool);
        assert_eq!(st, Status::SUCCESS, "{}", sim.profile);
        assert_ne!(aie, POOL_ACCESS_NEVER_ALLOWED);
        assert_eq!(agent_pool_access(sim.cpu, pool).0, Status::SUCCESS);
    });
}

#[test]
fn vmem_get_access() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 1) else {
            return;
        };
        let rw = access(&[sim.cpu, sim.aie], AccessPermission::RW);
        assert_eq!(set_access(va, SIZE, &rw), Status::SUCCESS);
        assert_eq!(
            get_access(va, sim.aie),
            (Status::SUCCESS, AccessPermission::RW)
        );
        assert_eq!(
            get_access(va, sim.cpu),
            (Status::SUCCESS, AccessPermission::RW)
        );
        teardown(sim, h, va, SIZE);
    });
}

#[test]
fn vmem_data_integrity() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 1) else {
            return;
        };
        let rw = access(&[sim.cpu, sim.aie], AccessPermission::RW);
        assert_eq!(set_access(va, SIZE, &rw), Status::SUCCESS);
        let v: Vec<u32> = (0..1024u32).map(|i| i * 3 + 7).collect();
        put_u32s(va, &v);
        assert_eq!(u32s(va, 1024), v);
        teardown(sim, h, va, SIZE);
    });
}

fn export(h: VmemHandle) -> (Status, c_int) {
    let mut fd: c_int = -1;
    // SAFETY: a live out-pointer.
    let st = unsafe { hsa_amd_vmem_export_shareable_handle(&mut fd, h, 0) };
    (st, fd)
}

fn import(fd: c_int) -> (Status, VmemHandle) {
    let mut h = VmemHandle::default();
    // SAFETY: a live out-pointer; the runtime dups `fd`.
    let st = unsafe { hsa_amd_vmem_import_shareable_handle(fd, &mut h) };
    (st, h)
}

fn close_dmabuf(fd: c_int) -> Status {
    // SAFETY: the fd is ours to give up.
    unsafe { hsa_amd_portable_close_dmabuf(fd) }
}

fn fd_is_open(fd: c_int) -> bool {
    // SAFETY: F_GETFD only reads the descriptor table.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

#[test]
fn vmem_export_import_shareable_handle() {
    each(|sim, pool| {
        let p = sim.profile;
        let h = handle_create(pool, SIZE).unwrap();
        let (st, fd) = export(h);
        if !p.vmem_exports_aie_handles() {
            assert_eq!(st, Status::ERROR, "{p}");
            assert_eq!(handle_release(h), Status::SUCCESS);
            return;
        }
        assert_eq!(st, Status::SUCCESS, "{p}");
        assert!(fd > 0);
        let (st, imported) = import(fd);
        assert_eq!(st, Status::SUCCESS, "{p}");
        // Import dups the fd, so the exported one is the caller's to close, and ROCR closes it.
        assert_eq!(close_dmabuf(fd), Status::SUCCESS, "{p}: {:?}", last_error());
        assert!(
            !fd_is_open(fd),
            "{p}: hsa_amd_portable_close_dmabuf left fd {fd} open"
        );
        assert_eq!(handle_release(imported), Status::SUCCESS);
        assert_eq!(handle_release(h), Status::SUCCESS);
    });
}

#[test]
fn pointer_info() {
    each(|sim, pool| {
        let p = sim.profile;
        let b = allocate(pool, SIZE as u64).unwrap();
        let mut info = PointerInfo {
            size: size_of::<PointerInfo>() as u32,
            ..Default::default()
        };
        // SAFETY: `info` is a live, sized struct; no agent list is asked for.
        let st = unsafe {
            hsa_amd_pointer_info(
                b as *const c_void,
                &mut info,
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(st, Status::SUCCESS, "{p}");
        if p.pointer_info_knows_aie_memory() {
            assert_eq!(info.kind, POINTER_TYPE_HSA, "{p}");
            assert_eq!(info.host_base_address as u64, b);
            assert_eq!(info.size_in_bytes, SIZE);
            assert!(!info.agent_base_address.is_null());
            assert_eq!(info.agent_owner, sim.aie);
        } else {
            // ROCm 7.0's PtrInfo asks KFD's thunk, which does not know XDNA buffers.
            assert_eq!(info.kind, POINTER_TYPE_UNKNOWN, "{p}");
        }
        assert_eq!(pool_free(b), Status::SUCCESS);
    });
}

#[test]
fn iterate_all_pools() {
    each(|sim, _| {
        let pools = pools_of(sim.aie);
        assert_eq!(pools.len(), 3);
        for &pool in &pools {
            assert_eq!(pool_u32(pool, PoolInfo::SEGMENT), Segment::GLOBAL.0);
        }
        let coarse = pools
            .iter()
            .filter(|&&p| pool_u32(p, PoolInfo::GLOBAL_FLAGS) & global_flag::COARSE_GRAINED != 0)
            .count();
        assert_eq!(coarse, 3);
    });
}

fn can_migrate(src: MemoryPool, dst: MemoryPool) -> (Status, bool) {
    let mut r = true;
    // SAFETY: a live out-pointer.
    let st = unsafe { hsa_amd_memory_pool_can_migrate(src, dst, &mut r) };
    (st, r)
}

#[test]
fn pool_can_migrate() {
    each(|sim, aie_pool| {
        // ROCR's CPU agent has a coarse-grained pool on a node that is not an APU node, which a
        // Ryzen AI CPU node is not (KFD lists its GPU as a node of its own).
        let cpu_pool = first_coarse_pool(sim.cpu).expect("the CPU agent has a coarse pool");
        assert_eq!(
            can_migrate(aie_pool, cpu_pool),
            (Status::ERROR_OUT_OF_RESOURCES, false)
        );
        assert_eq!(
            can_migrate(cpu_pool, aie_pool),
            (Status::ERROR_OUT_OF_RESOURCES, false)
        );
    });
}

#[test]
fn vmem_map_same_handle_twice() {
    each(|sim, pool| {
        let g = pool_usize(pool, PoolInfo::RUNTIME_ALLOC_GRANULE);
        let size = 2 * g;
        let Some((h, first)) = mapped(sim, pool, size, 1) else {
            return;
        };
        assert_eq!(
            set_access(first, size, &access(&[sim.cpu], AccessPermission::RW)),
            Status::SUCCESS
        );
        let second = reserve(size, 1);
        let word2 = g as u64;
        for agent in [sim.cpu, sim.aie] {
            put_u32s(first, &[0x1111_1111]);
            put_u32s(first + word2, &[0x2222_2222]);
            assert_eq!(map(second, size, h), Status::SUCCESS);
            assert_eq!(
                set_access(second, size, &access(&[agent], AccessPermission::RW)),
                Status::SUCCESS
            );
            assert_eq!(u32s(second, 1), [0x1111_1111]);
            assert_eq!(u32s(second + word2, 1), [0x2222_2222]);
            put_u32s(second, &[0x3333_3333]);
            put_u32s(second + word2, &[0x4444_4444]);
            assert_eq!(u32s(first, 1), [0x3333_3333]);
            assert_eq!(u32s(first + word2, 1), [0x4444_4444]);
            assert_eq!(unmap(second, size), Status::SUCCESS, "{:?}", last_error());
        }
        assert_eq!(address_free(second, size), Status::SUCCESS);
        teardown(sim, h, first, size);
    });
}

#[test]
fn vmem_double_map() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 0) else {
            return;
        };
        assert_ne!(map(va, SIZE, h), Status::SUCCESS);
        teardown(sim, h, va, SIZE);
    });
}

#[test]
fn vmem_release_before_unmap() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 0) else {
            return;
        };
        let st = handle_release(h);
        assert!(st == Status::SUCCESS || st == Status::ERROR, "{st:?}");
        assert_eq!(unmap(va, SIZE), Status::SUCCESS);
        assert_eq!(address_free(va, SIZE), Status::SUCCESS);
    });
}

#[test]
fn pool_double_free() {
    each(|_, pool| {
        let b = allocate(pool, 4096).unwrap();
        assert_eq!(pool_free(b), Status::SUCCESS);
        assert_ne!(pool_free(b), Status::SUCCESS);
    });
}

#[test]
fn pool_allocate_multiple() {
    each(|_, pool| {
        let sizes = [1024u64, 4096, 8192, 16384];
        let bufs: Vec<u64> = sizes.iter().map(|&s| allocate(pool, s).unwrap()).collect();
        for (i, (&b, &s)) in bufs.iter().zip(&sizes).enumerate() {
            put_u32s(b, &vec![0xA0 + i as u32; s as usize / 4]);
        }
        for (i, (&b, &s)) in bufs.iter().zip(&sizes).enumerate() {
            assert!(
                u32s(b, s as usize / 4)
                    .iter()
                    .all(|&v| v == 0xA0 + i as u32)
            );
        }
        for &b in bufs.iter().rev() {
            assert_eq!(pool_free(b), Status::SUCCESS);
        }
    });
}

#[test]
fn memory_lock_to_pool() {
    each(|sim, pool| {
        let mut host = vec![0u32; 1024];
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live buffer and out-pointer; one agent.
        let st = unsafe {
            hsa_amd_memory_lock_to_pool(
                host.as_mut_ptr().cast(),
                SIZE,
                &sim.aie,
                1,
                pool,
                0,
                &mut out,
            )
        };
        assert_ne!(st, Status::SUCCESS, "{}", sim.profile);
        assert!(out.is_null());
    });
}

#[test]
fn vmem_map_out_of_bounds_rejected() {
    each(|_, pool| {
        let h = handle_create(pool, SIZE).unwrap();
        let va = reserve(2 * SIZE, 1);
        assert_ne!(map(va, 2 * SIZE, h), Status::SUCCESS);
        assert_eq!(address_free(va, 2 * SIZE), Status::SUCCESS);
        assert_eq!(handle_release(h), Status::SUCCESS);
    });
}

#[test]
fn vmem_export_imported_handle_rejected() {
    each(|sim, pool| {
        let p = sim.profile;
        if !p.vmem_exports_aie_handles() {
            // The suite's first ASSERT (the export) fails on these releases; the export test
            // above checks how.
            return;
        }
        let h = handle_create(pool, SIZE).unwrap();
        let (st, fd) = export(h);
        assert_eq!(st, Status::SUCCESS);
        let (st, imported) = import(fd);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(close_dmabuf(fd), Status::SUCCESS, "{p}: {:?}", last_error());
        assert_ne!(export(imported).0, Status::SUCCESS);
        assert_eq!(handle_release(imported), Status::SUCCESS);
        assert_eq!(handle_release(h), Status::SUCCESS);
    });
}

#[test]
fn vmem_set_access_permission_change() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 1) else {
            return;
        };
        assert_eq!(
            set_access(va, SIZE, &access(&[sim.aie], AccessPermission::RW)),
            Status::SUCCESS
        );
        assert_eq!(
            get_access(va, sim.aie),
            (Status::SUCCESS, AccessPermission::RW)
        );
        assert_eq!(
            set_access(va, SIZE, &access(&[sim.aie], AccessPermission::RO)),
            Status::SUCCESS
        );
        assert_eq!(
            get_access(va, sim.aie),
            (Status::SUCCESS, AccessPermission::RO)
        );
        teardown(sim, h, va, SIZE);
    });
}

#[test]
fn vmem_get_access_before_set_access() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 1) else {
            return;
        };
        assert_eq!(
            get_access(va, sim.aie),
            (Status::SUCCESS, AccessPermission::NONE)
        );
        teardown(sim, h, va, SIZE);
    });
}

#[test]
fn vmem_unmap_remap_cycle() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 1) else {
            return;
        };
        let rw = access(&[sim.aie], AccessPermission::RW);
        assert_eq!(set_access(va, SIZE, &rw), Status::SUCCESS);
        iota(va, 1024, 0);
        assert_eq!(unmap(va, SIZE), Status::SUCCESS, "{:?}", last_error());
        assert_eq!(map(va, SIZE, h), Status::SUCCESS);
        assert_eq!(set_access(va, SIZE, &rw), Status::SUCCESS);
        assert_eq!(u32s(va, 1024), (0..1024u32).collect::<Vec<_>>());
        teardown(sim, h, va, SIZE);
    });
}

#[test]
fn vmem_repeated_unmap_remap_cycles() {
    each(|sim, pool| {
        let h = handle_create(pool, SIZE).unwrap();
        let va = reserve(SIZE, 1);
        let rw = access(&[sim.aie], AccessPermission::RW);
        for cycle in 0..8u32 {
            let st = map(va, SIZE, h);
            if !sim.profile.vmem_maps_aie_handles() {
                assert_eq!(st, Status::ERROR_INVALID_AGENT);
                break;
            }
            assert_eq!(st, Status::SUCCESS, "cycle {cycle}");
            assert_eq!(set_access(va, SIZE, &rw), Status::SUCCESS, "cycle {cycle}");
            if cycle > 0 {
                let want: Vec<u32> = (0..1024).map(|i| i + cycle - 1).collect();
                assert_eq!(u32s(va, 1024), want, "cycle {cycle}");
            }
            iota(va, 1024, cycle);
            assert_eq!(
                unmap(va, SIZE),
                Status::SUCCESS,
                "cycle {cycle}: {:?}",
                last_error()
            );
        }
        assert_eq!(address_free(va, SIZE), Status::SUCCESS);
        assert_eq!(handle_release(h), Status::SUCCESS);
    });
}

#[test]
fn vmem_retain_alloc_handle() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 1) else {
            return;
        };
        let mut retained = VmemHandle::default();
        // SAFETY: a live out-pointer; a mapped address.
        let st = unsafe { hsa_amd_vmem_retain_alloc_handle(&mut retained, va as *mut c_void) };
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(retained, h);
        assert_eq!(handle_release(retained), Status::SUCCESS);
        teardown(sim, h, va, SIZE);
    });
}

#[test]
fn vmem_get_alloc_properties_from_handle() {
    each(|_, pool| {
        let h = handle_create(pool, SIZE).unwrap();
        let mut got = MemoryPool::default();
        let mut ty = MemoryType::default();
        // SAFETY: live out-pointers.
        let st = unsafe { hsa_amd_vmem_get_alloc_properties_from_handle(h, &mut got, &mut ty) };
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(got, pool);
        assert_eq!(ty, MemoryType::PINNED);
        assert_eq!(handle_release(h), Status::SUCCESS);
    });
}

#[test]
fn vmem_double_release_rejected() {
    each(|_, pool| {
        let h = handle_create(pool, SIZE).unwrap();
        assert_eq!(handle_release(h), Status::SUCCESS);
        assert_ne!(handle_release(h), Status::SUCCESS);
    });
}

#[test]
fn vmem_create_zero_size_rejected() {
    each(|_, pool| assert!(handle_create(pool, 0).is_err()));
}

#[test]
fn vmem_create_misaligned_size_rejected() {
    each(|_, pool| assert!(handle_create(pool, 1).is_err()));
}

#[test]
fn vmem_set_access_mixed_permissions() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 1) else {
            return;
        };
        let mut descs = access(&[sim.aie], AccessPermission::RW);
        descs.extend(access(&[sim.cpu], AccessPermission::RO));
        assert_eq!(set_access(va, SIZE, &descs), Status::SUCCESS);
        assert_eq!(
            get_access(va, sim.aie),
            (Status::SUCCESS, AccessPermission::RW)
        );
        assert_eq!(
            get_access(va, sim.cpu),
            (Status::SUCCESS, AccessPermission::RO)
        );
        teardown(sim, h, va, SIZE);
    });
}

#[test]
fn vmem_unmap_keeps_reservation() {
    each(|sim, pool| {
        let Some((h, va)) = mapped(sim, pool, SIZE, 1) else {
            return;
        };
        let rw = access(&[sim.cpu, sim.aie], AccessPermission::RW);
        assert_eq!(set_access(va, SIZE, &rw), Status::SUCCESS);
        iota(va, 1024, 0);
        assert_eq!(
            unmap(va, SIZE),
            Status::SUCCESS,
            "{}: {:?}",
            sim.profile,
            last_error()
        );
        let page = rustix::param::page_size();
        let mut residency = vec![0u8; SIZE.div_ceil(page)];
        // SAFETY: mincore only reads the page tables of the range into `residency`.
        let rc = unsafe { libc::mincore(va as *mut c_void, SIZE, residency.as_mut_ptr()) };
        assert_eq!(rc, 0, "the reserved range is no longer mapped");
        assert_eq!(address_free(va, SIZE), Status::SUCCESS);
        assert_eq!(handle_release(h), Status::SUCCESS);
    });
}

unsafe extern "C" fn collect_agent(a: Agent, data: *mut c_void) -> Status {
    // SAFETY: `data` is the caller's Vec.
    unsafe { (*data.cast::<Vec<Agent>>()).push(a) };
    Status::SUCCESS
}

/// The nine GPU tests skip when no agent is a GPU, which is the emulator's case.
#[test]
fn no_agent_is_a_gpu_so_the_gpu_tests_skip() {
    each(|sim, _| {
        let mut agents: Vec<Agent> = Vec::new();
        // SAFETY: the callback pushes into `agents`, which outlives the call.
        let st = unsafe { hsa_iterate_agents(Some(collect_agent), (&raw mut agents).cast()) };
        assert_eq!(st, Status::SUCCESS);
        for a in agents {
            assert_ne!(
                u32_info(a, AgentInfo::DEVICE),
                DeviceType::GPU.0,
                "{}",
                sim.profile
            );
        }
    });
}

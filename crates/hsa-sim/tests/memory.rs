//! Agents and their names per profile, pools, regions, pool allocations, dmabuf export
//! (refused on every profile) through the C functions, and the counters.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::ffi::{c_int, c_void};

use common::*;
use hsa_core::sys::{AgentInfo, MemoryPool, MemoryType, PoolInfo, Status, VmemHandle, global_flag};
use hsa_sim::*;
use npu_artifacts::emu::{DType, EmuDesign};

fn page() -> usize {
    rustix::param::page_size()
}

#[test]
fn agents_answer_like_rocrs_aie_agent() {
    let sim = Sim::with(SimConfig {
        agent: NpuGen::Npu1,
        ..Default::default()
    });
    assert_eq!(u32_info(sim.cpu, AgentInfo::DEVICE), 0);
    assert_eq!(u32_info(sim.aie, AgentInfo::DEVICE), 3);
    assert_eq!(u32_info(sim.aie, AgentInfo::FEATURE), 2);
    assert_eq!(u32_info(sim.aie, AgentInfo::QUEUES_MAX), 1);
    assert_eq!(u32_info(sim.aie, AgentInfo::QUEUE_MIN_SIZE), 64);
    assert_eq!(u32_info(sim.aie, AgentInfo::QUEUE_MAX_SIZE), 64);
    assert_eq!(u32_info(sim.aie, AgentInfo::QUEUE_TYPE), 1);
    let text = |attr| {
        let mut b = [0xFFu8; 64];
        // SAFETY: a 64-byte buffer for a name attribute.
        let st = unsafe { hsa_agent_get_info(sim.aie, attr, b.as_mut_ptr().cast()) };
        assert_eq!(st, Status::SUCCESS);
        let n = b.iter().position(|&c| c == 0).unwrap();
        assert!(b[n..].iter().all(|&c| c == 0), "NUL-padded to 64 bytes");
        String::from_utf8(b[..n].to_vec()).unwrap()
    };
    assert_eq!(text(AgentInfo::NAME), "aie2");
    assert_eq!(text(AgentInfo::VENDOR_NAME), "AMD");
    assert!(text(AgentInfo::AMD_PRODUCT_NAME).contains("Phoenix"));
    let mut near = 0u64;
    // SAFETY: a u64 out-pointer for NEAREST_CPU.
    unsafe { hsa_agent_get_info(sim.aie, AgentInfo::AMD_NEAREST_CPU, (&raw mut near).cast()) };
    assert_eq!(near, sim.cpu.handle);
    let mut v = 0u32;
    // SAFETY: out-pointers are live locals.
    unsafe {
        assert_eq!(
            hsa_agent_get_info(sim.aie, AgentInfo(0x7777), (&raw mut v).cast()),
            Status::ERROR_INVALID_ARGUMENT
        );
        let bogus = hsa_core::sys::Agent { handle: 1 };
        assert_eq!(
            hsa_agent_get_info(bogus, AgentInfo::DEVICE, (&raw mut v).cast()),
            Status::ERROR_INVALID_AGENT
        );
    }
    drop(sim);
    // ROCm 7.0 calls every AIE agent aie2 / AIE-ML; later releases name the generation.
    for (profile, npu, name, product) in [
        (Profile::Rocm70, NpuGen::Npu2, "aie2", "AIE-ML"),
        (Profile::Rocm70, NpuGen::Npu1, "aie2", "AIE-ML"),
        (
            Profile::RocrLate2025,
            NpuGen::Npu2,
            "aie2p",
            "NPU Strix (hsa-sim)",
        ),
        (
            Profile::RocrG2May2026,
            NpuGen::Npu1,
            "aie2",
            "NPU Phoenix (hsa-sim)",
        ),
        (
            Profile::RocrNewest,
            NpuGen::Npu2,
            "aie2p",
            "NPU Strix (hsa-sim)",
        ),
    ] {
        let sim = Sim::with(SimConfig {
            agent: npu,
            profile,
            ..Default::default()
        });
        assert_eq!(name_of(&sim, AgentInfo::NAME), name, "{profile} {npu:?}");
        assert_eq!(
            name_of(&sim, AgentInfo::AMD_PRODUCT_NAME),
            product,
            "{profile}"
        );
    }
}

fn name_of(sim: &Sim, attr: AgentInfo) -> String {
    let mut b = [0u8; 64];
    // SAFETY: a 64-byte buffer for a name attribute.
    let st = unsafe { hsa_agent_get_info(sim.aie, attr, b.as_mut_ptr().cast()) };
    assert_eq!(st, Status::SUCCESS);
    let n = b.iter().position(|&c| c == 0).unwrap();
    String::from_utf8(b[..n].to_vec()).unwrap()
}

#[test]
fn the_build_version_says_hsa_sim_and_the_profile() {
    for profile in Profile::ALL {
        let sim = Sim::new(profile);
        let mut s: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: a `const char*` out-pointer for BUILD_VERSION; the string is static.
        let text = unsafe {
            let st = hsa_system_get_info(
                hsa_core::sys::SystemInfo::AMD_BUILD_VERSION,
                (&raw mut s).cast(),
            );
            assert_eq!(st, Status::SUCCESS);
            std::ffi::CStr::from_ptr(s).to_str().unwrap()
        };
        assert_eq!(
            text,
            format!(
                "hsa-sim {} (software AIE agent, profile {profile})",
                env!("CARGO_PKG_VERSION")
            )
        );
        assert_eq!(profile_of_build_version(text), Some(profile));
        drop(sim);
    }
}

unsafe extern "C" fn stop_at_second(_a: hsa_core::sys::Agent, data: *mut c_void) -> Status {
    // SAFETY: `data` is the caller's counter.
    let n = unsafe { &mut *data.cast::<u32>() };
    *n += 1;
    if *n == 2 {
        Status::INFO_BREAK
    } else {
        Status::SUCCESS
    }
}

#[test]
fn iteration_stops_on_info_break() {
    let _sim = Sim::new(Profile::RocrNewest);
    let mut n = 0u32;
    // SAFETY: the callback takes the counter passed as data.
    let st = unsafe { hsa_iterate_agents(Some(stop_at_second), (&raw mut n).cast()) };
    assert_eq!((st, n), (Status::INFO_BREAK, 2));
}

#[test]
fn the_three_aie_pools_have_rocrs_flags_granules_and_sizes() {
    let sim = Sim::new(Profile::RocrNewest);
    assert_eq!(sim.pools.len(), 3);
    let flags = |p: MemoryPool| {
        let mut f = 0u32;
        // SAFETY: a u32 out-pointer for GLOBAL_FLAGS.
        unsafe { hsa_amd_memory_pool_get_info(p, PoolInfo::GLOBAL_FLAGS, (&raw mut f).cast()) };
        f
    };
    assert_eq!(
        flags(sim.pools[0]),
        global_flag::KERNARG_INIT | global_flag::COARSE_GRAINED
    );
    assert_eq!(flags(sim.pools[1]), global_flag::COARSE_GRAINED);
    assert_eq!(flags(sim.pools[2]), global_flag::COARSE_GRAINED);
    let rec = |i| pool_usize(sim.pools[i], PoolInfo::RUNTIME_ALLOC_REC_GRANULE);
    assert_eq!((rec(0), rec(1), rec(2)), (page(), 0, page()));
    assert_eq!(pool_usize(sim.pools[1], PoolInfo::SIZE), 64 << 20);
    assert_eq!(
        pool_usize(sim.pools[2], PoolInfo::RUNTIME_ALLOC_GRANULE),
        page()
    );
    let mut allowed = false;
    // SAFETY: a bool out-pointer for RUNTIME_ALLOC_ALLOWED.
    unsafe {
        hsa_amd_memory_pool_get_info(
            sim.pools[0],
            PoolInfo::RUNTIME_ALLOC_ALLOWED,
            (&raw mut allowed).cast(),
        )
    };
    assert!(allowed);
    let bogus = MemoryPool { handle: 3 };
    let mut x = 0usize;
    // SAFETY: a size_t out-pointer.
    let st = unsafe { hsa_amd_memory_pool_get_info(bogus, PoolInfo::SIZE, (&raw mut x).cast()) };
    assert_eq!(st, Status::AMD_ERROR_INVALID_MEMORY_POOL);
}

#[test]
fn portable_dmabuf_export_of_aie_memory_fails_on_every_profile() {
    for profile in Profile::ALL {
        let sim = Sim::new(profile);
        let before = counters();
        for pool in [KERNARG, HEAP, DATA] {
            let p = sim.alloc(pool, 3 * page());
            let (mut fd, mut off): (c_int, u64) = (7, 0);
            // SAFETY: out-pointers are live locals; the range lies in the allocation.
            let st = unsafe {
                hsa_amd_portable_export_dmabuf((p + 8) as *const c_void, 64, &mut fd, &mut off)
            };
            // ROCm 7.0 answers INVALID_AGENT, as observed (rocm70-observed.md); the later
            // releases ERROR.
            let want = if profile == Profile::Rocm70 {
                Status::ERROR_INVALID_AGENT
            } else {
                Status::ERROR
            };
            assert_eq!(st, want, "{profile}, pool {pool}");
            assert_eq!(fd, -1, "{profile}: the fd stays invalid");
            let detail = last_error().unwrap();
            assert!(detail.contains(profile.as_str()), "{detail}");
            // As ROCR's AIE memory test does after the refusal.
            // SAFETY: closing -1 touches no descriptor.
            let st = unsafe { hsa_amd_portable_close_dmabuf(fd) };
            assert_eq!(st, Status::SUCCESS);
            sim.free(p);
        }
        // ROCR closes whatever fd it is given; a number no fd has fails as `close` does.
        // SAFETY: no descriptor has this number, so nothing is closed.
        let st = unsafe { hsa_amd_portable_close_dmabuf(c_int::MAX) };
        assert_eq!(st, Status::ERROR_RESOURCE_FREE);
        // SAFETY: an address that is no allocation.
        let st =
            unsafe { hsa_amd_portable_export_dmabuf(8usize as *const c_void, 1, &mut 0, &mut 0) };
        assert_eq!(st, Status::ERROR_INVALID_ALLOCATION);
        // Host memory of the CPU agent is not exportable either.
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: (whole block) out-pointers are live locals.
        unsafe {
            assert_eq!(
                hsa_amd_memory_pool_allocate(sim.cpu_pools[0], 4096, 0, &mut p),
                Status::SUCCESS
            );
            let st = hsa_amd_portable_export_dmabuf(p, 1, &mut 0, &mut 0);
            assert_eq!(st, Status::ERROR_INVALID_AGENT);
            assert_eq!(hsa_amd_memory_pool_free(p), Status::SUCCESS);
        }
        let delta = counters().since(&before);
        assert_eq!(delta.dmabufs_exported, 0);
        assert!(delta.balanced(), "{:?}", delta.unbalanced());
    }
}

#[test]
fn a_full_create_destroy_cycle_balances_the_counters() {
    // Held across the whole cycle, so no other test moves the process-wide counters between
    // the two readings.
    let _g = hsa_sim::serial_test_guard();
    let before = counters();
    {
        let sim = Sim::new(Profile::RocrNewest);
        let design = EmuDesign::vector_scalar_add(256, DType::I32, 1);
        let loaded = sim.load(&design);
        let (a, b) = io_i32(&sim, &[1; 256]);
        let sig = sim.signal(1);
        let q = sim.queue();
        let packet = g2_packet(&sim, &Dispatch::new(loaded, &[(a, 1024), (b, 1024)], sig));
        q.submit(&[g2_bytes(&packet)]);
        assert_eq!(q.errors(), vec![]);
        drop(q);
        for p in [loaded.0, loaded.1, a, b, packet.kernarg_address] {
            sim.free(p);
        }
        // SAFETY: the signal is not used again.
        assert_eq!(unsafe { hsa_signal_destroy(sig) }, Status::SUCCESS);
        assert!(
            !counters().since(&before).balanced(),
            "the init is still open"
        );
    }
    let delta = counters().since(&before);
    assert_eq!(
        (delta.inits, delta.queues_created, delta.signals_created),
        (1, 1, 1)
    );
    assert_eq!(delta.allocations_created, 5);
    assert!(delta.balanced(), "{:?}", delta.unbalanced());
}

#[test]
fn the_c_counters_symbol_matches_the_rust_snapshot() {
    let _sim = Sim::new(Profile::RocrNewest);
    let mut c = Counters::default();
    // SAFETY: `c` is a valid out-pointer.
    assert_eq!(unsafe { hsa_sim_counters(&mut c) }, Status::SUCCESS);
    assert_eq!(c, counters());
    // SAFETY: null is refused.
    let st = unsafe { hsa_sim_counters(std::ptr::null_mut()) };
    assert_eq!(st, Status::ERROR_INVALID_ARGUMENT);
}

unsafe extern "C" fn push_region(r: Region, data: *mut c_void) -> Status {
    // SAFETY: `data` is the caller's Vec<Region>.
    unsafe { (*data.cast::<Vec<Region>>()).push(r) };
    Status::SUCCESS
}

#[test]
fn regions_are_the_pools_under_the_core_api() {
    let sim = Sim::new(Profile::RocrNewest);
    let mut regions: Vec<Region> = Vec::new();
    // SAFETY: (whole block) out-pointers are live locals of the documented types.
    unsafe {
        let st = hsa_agent_iterate_regions(sim.aie, Some(push_region), (&raw mut regions).cast());
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(regions, sim.pools);
        let mut flags = 0u32;
        let st = hsa_region_get_info(
            regions[0],
            region_info::GLOBAL_FLAGS,
            (&raw mut flags).cast(),
        );
        assert_eq!((st, flags), (Status::SUCCESS, 5));
        let mut size = 0usize;
        hsa_region_get_info(regions[1], region_info::SIZE, (&raw mut size).cast());
        assert_eq!(size, 64 << 20);
        let mut p: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            hsa_memory_allocate(regions[2], 100, &mut p),
            Status::SUCCESS
        );
        assert_eq!(hsa_memory_free(p), Status::SUCCESS);
        let bogus = MemoryPool { handle: 9 };
        assert_eq!(
            hsa_memory_allocate(bogus, 100, &mut p),
            Status::ERROR_INVALID_REGION
        );
        assert_eq!(
            hsa_region_get_info(bogus, 0, (&raw mut flags).cast()),
            Status::ERROR_INVALID_REGION
        );
    }
}

#[test]
fn null_pointers_and_unknown_handles_are_refused_without_crashing() {
    let sim = Sim::new(Profile::RocrNewest);
    let null = std::ptr::null_mut::<c_void>();
    let bad_pool = MemoryPool { handle: 1 };
    // SAFETY: (whole block) every pointer is null or a live local; nothing is dereferenced
    // by the emulator when the call is refused.
    unsafe {
        assert_eq!(
            hsa_iterate_agents(None, null),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_agent_get_info(sim.aie, AgentInfo::DEVICE, null),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_agent_iterate_memory_pools(sim.aie, None, null),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_memory_pool_get_info(sim.pools[0], PoolInfo::SIZE, null),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_memory_pool_allocate(sim.pools[0], 64, 0, std::ptr::null_mut()),
            Status::ERROR_INVALID_ARGUMENT
        );
        let mut p = null;
        assert_eq!(
            hsa_amd_memory_pool_allocate(bad_pool, 64, 0, &mut p),
            Status::AMD_ERROR_INVALID_MEMORY_POOL
        );
        assert_eq!(hsa_amd_memory_pool_free(null), Status::SUCCESS);
        assert_eq!(
            hsa_amd_memory_pool_free(8usize as *mut c_void),
            Status::ERROR_INVALID_ALLOCATION
        );
        let q = std::ptr::null_mut();
        assert_eq!(
            hsa_queue_create(
                sim.aie,
                64,
                hsa_core::sys::QueueType::SINGLE,
                None,
                null,
                0,
                0,
                q
            ),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_queue_destroy(std::ptr::null_mut()),
            Status::ERROR_INVALID_QUEUE
        );
        assert_eq!(hsa_queue_load_read_index_scacquire(std::ptr::null()), 0);
        assert_eq!(
            hsa_signal_create(0, 0, std::ptr::null(), std::ptr::null_mut()),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_signal_create(0, 1, std::ptr::null(), &mut Default::default()),
            Status::ERROR_INVALID_ARGUMENT
        );
        let ghost = hsa_core::sys::Signal { handle: 77 };
        assert_eq!(hsa_signal_load_scacquire(ghost), 0);
        hsa_signal_store_screlease(ghost, 1);
        assert!(last_error().unwrap().contains("unknown signal"));
        assert_eq!(hsa_signal_destroy(ghost), Status::ERROR_INVALID_SIGNAL);
        assert_eq!(
            hsa_amd_vmem_handle_create(
                sim.pools[0],
                4096,
                MemoryType::PINNED,
                0,
                std::ptr::null_mut()
            ),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_vmem_handle_create(
                bad_pool,
                4096,
                MemoryType::PINNED,
                0,
                &mut VmemHandle::default()
            ),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_vmem_address_reserve_align(std::ptr::null_mut(), 4096, 0, 0, 1),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_vmem_set_access(null, 4096, std::ptr::null(), 0),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_vmem_get_access(null, std::ptr::null_mut(), sim.aie),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_vmem_export_shareable_handle(std::ptr::null_mut(), VmemHandle::default(), 0),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_portable_export_dmabuf(null, 1, std::ptr::null_mut(), std::ptr::null_mut()),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_status_string(Status::SUCCESS, std::ptr::null_mut()),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_system_get_info(hsa_core::sys::SystemInfo::TIMESTAMP, null),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert!(hsa_sim_last_error(std::ptr::null_mut(), 0) > 0);
    }
}

#[test]
fn locking_user_memory_works_for_the_cpu_only() {
    let sim = Sim::new(Profile::RocrNewest);
    let mut buf = vec![0u8; 4096];
    let host = buf.as_mut_ptr().cast::<c_void>();
    let mut agent_ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: (whole block) live locals; nothing is pinned or written through.
    unsafe {
        assert_eq!(
            hsa_amd_memory_lock(host, 4096, &sim.aie, 1, &mut agent_ptr),
            Status::ERROR_INVALID_AGENT
        );
        assert_eq!(
            hsa_amd_memory_lock(host, 4096, &sim.cpu, 1, &mut agent_ptr),
            Status::SUCCESS
        );
        assert_eq!(agent_ptr, host);
        assert_eq!(hsa_amd_memory_unlock(host), Status::SUCCESS);
    }
}

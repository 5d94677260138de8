//! vmem through the C functions: ROCR's teardown order and statuses, contiguous mappings,
//! and shareable handles that map the same bytes elsewhere.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::ffi::{c_int, c_void};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

use common::*;
use hsa_core::sys::{AccessDesc, AccessPermission, MemoryType, Status, VmemHandle};
use hsa_sim::*;
use rustix::mm::{MapFlags, ProtFlags};

fn page() -> usize {
    rustix::param::page_size()
}

fn set_access(va: *mut c_void, size: usize, descs: &[AccessDesc]) -> Status {
    // SAFETY: `descs` is a live slice of `len` descriptors.
    unsafe { hsa_amd_vmem_set_access(va, size, descs.as_ptr(), descs.len()) }
}

#[test]
fn vmem_teardown_in_irons_order_and_counters_balance() {
    let sim = Sim::new(Profile::RocrNewest);
    let before = counters();
    let size = 4 * page();
    // SAFETY: (whole block) out-pointers are live locals; addresses come from the runtime.
    unsafe {
        let mut h = VmemHandle::default();
        assert_eq!(
            hsa_amd_vmem_handle_create(sim.pools[DATA], size + 1, MemoryType::PINNED, 0, &mut h),
            Status::ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            hsa_amd_vmem_handle_create(sim.pools[DATA], size, MemoryType::PINNED, 0, &mut h),
            Status::SUCCESS
        );
        let mut va: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            hsa_amd_vmem_address_reserve_align(&mut va, size, 0, 1 << 20, 1),
            Status::SUCCESS
        );
        assert_eq!(va as usize % (1 << 20), 0);
        assert_eq!(hsa_amd_vmem_map(va, size, 0, h, 0), Status::SUCCESS);
        assert_eq!(
            hsa_amd_vmem_map(va, size, 0, h, 0),
            Status::ERROR_INVALID_ARGUMENT,
            "already mapped"
        );
        let rw = [
            AccessDesc {
                permissions: AccessPermission::RW,
                agent_handle: sim.cpu,
            },
            AccessDesc {
                permissions: AccessPermission::RW,
                agent_handle: sim.aie,
            },
        ];
        assert_eq!(set_access(va, size, &rw), Status::SUCCESS);
        let mut perm = AccessPermission::NONE;
        assert_eq!(
            hsa_amd_vmem_get_access(va, &mut perm, sim.aie),
            Status::SUCCESS
        );
        assert_eq!(perm, AccessPermission::RW);
        write(va as u64 + 100, b"hello");
        assert_eq!(read(va as u64 + 100, 5), b"hello");

        // Wrong order: free with a live mapping.
        assert_eq!(
            hsa_amd_vmem_address_free(va, size),
            Status::ERROR_RESOURCE_FREE
        );
        assert!(
            last_error().unwrap().contains("unmap them first"),
            "{:?}",
            last_error()
        );

        // IRON's order.
        let none = [
            AccessDesc {
                permissions: AccessPermission::NONE,
                agent_handle: sim.cpu,
            },
            AccessDesc {
                permissions: AccessPermission::NONE,
                agent_handle: sim.aie,
            },
        ];
        assert_eq!(set_access(va, size, &none), Status::SUCCESS);
        assert_eq!(hsa_amd_vmem_unmap(va, size), Status::SUCCESS);
        assert_eq!(hsa_amd_vmem_address_free(va, size), Status::SUCCESS);
        assert_eq!(hsa_amd_vmem_handle_release(h), Status::SUCCESS);
        assert_eq!(
            hsa_amd_vmem_handle_release(h),
            Status::ERROR_INVALID_ALLOCATION
        );
        // What ROCR's Runtime::VMemory* return for ranges it does not know.
        assert_eq!(
            hsa_amd_vmem_unmap(va, size),
            Status::ERROR_INVALID_ALLOCATION,
            "not reserved"
        );
        assert_eq!(
            hsa_amd_vmem_address_free(va, size),
            Status::ERROR_INVALID_ALLOCATION
        );
        let mut perm = AccessPermission::RW;
        let st = hsa_amd_vmem_get_access(va, &mut perm, sim.cpu);
        assert_eq!(st, Status::ERROR_INVALID_ALLOCATION);
    }
    let delta = counters().since(&before);
    assert_eq!(
        (
            delta.vmem_handles_created,
            delta.mappings_created,
            delta.reservations_created
        ),
        (1, 1, 1)
    );
    assert!(delta.balanced(), "{:?}", delta.unbalanced());
}

/// Maps `len` bytes of `fd` from `offset` (a page multiple) in a second, independent mapping.
fn map_fd(fd: BorrowedFd<'_>, offset: u64, len: usize) -> *mut u8 {
    // SAFETY: a fresh shared mapping at a kernel-chosen address.
    unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            offset,
        )
    }
    .unwrap()
    .cast()
}

#[test]
fn a_vmem_handle_exported_as_a_shareable_fd_shares_its_bytes() {
    let sim = Sim::new(Profile::RocrNewest);
    let size = page();
    // SAFETY: (whole block) out-pointers are live locals; the fd is owned once exported; the
    // slice of the fd's mapping is read after the write that filled it, with no writer left.
    unsafe {
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
        let mut fd: c_int = -1;
        assert_eq!(
            hsa_amd_vmem_export_shareable_handle(&mut fd, h, 0),
            Status::SUCCESS
        );
        let fd = OwnedFd::from_raw_fd(fd);
        let m = map_fd(std::os::fd::AsFd::as_fd(&fd), 0, size);
        write(va as u64, b"shared");
        assert_eq!(std::slice::from_raw_parts(m, 6), b"shared");
        rustix::mm::munmap(m.cast(), size).unwrap();
        // Import gives a second handle over the same memory.
        let mut h2 = VmemHandle::default();
        assert_eq!(
            hsa_amd_vmem_import_shareable_handle(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut h2),
            Status::SUCCESS
        );
        let mut va2: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            hsa_amd_vmem_address_reserve_align(&mut va2, size, 0, 0, 1),
            Status::SUCCESS
        );
        assert_eq!(hsa_amd_vmem_map(va2, size, 0, h2, 0), Status::SUCCESS);
        assert_eq!(read(va2 as u64, 6), b"shared");
        for (v, hh) in [(va, h), (va2, h2)] {
            assert_eq!(hsa_amd_vmem_unmap(v, size), Status::SUCCESS);
            assert_eq!(hsa_amd_vmem_address_free(v, size), Status::SUCCESS);
            assert_eq!(hsa_amd_vmem_handle_release(hh), Status::SUCCESS);
        }
    }
}

#[test]
fn set_access_and_unmap_walk_contiguous_mappings() {
    let sim = Sim::new(Profile::RocrNewest);
    let p = page();
    // SAFETY: (whole block) out-pointers are live locals; ranges come from the reservation.
    unsafe {
        let mut h = VmemHandle::default();
        let st = hsa_amd_vmem_handle_create(sim.pools[DATA], 2 * p, MemoryType::PINNED, 0, &mut h);
        assert_eq!(st, Status::SUCCESS);
        let mut va: *mut c_void = std::ptr::null_mut();
        // Sizes are rounded up to pages; free repeats the size asked for.
        assert_eq!(
            hsa_amd_vmem_address_reserve_align(&mut va, 4 * p - 1, 0, 0, 1),
            Status::SUCCESS
        );
        let at = |i: usize| va.cast::<u8>().add(i * p).cast::<c_void>();
        // Two adjacent mappings of the two halves of the handle, then a gap, then one more.
        assert_eq!(hsa_amd_vmem_map(at(0), p, 0, h, 0), Status::SUCCESS);
        assert_eq!(hsa_amd_vmem_map(at(1), p, p, h, 0), Status::SUCCESS);
        assert_eq!(hsa_amd_vmem_map(at(3), p, 0, h, 0), Status::SUCCESS);
        let rw = [AccessDesc {
            permissions: AccessPermission::RW,
            agent_handle: sim.aie,
        }];
        assert_eq!(set_access(at(0), 2 * p, &rw), Status::SUCCESS);
        assert_eq!(
            set_access(at(0), 4 * p, &rw),
            Status::ERROR_INVALID_ALLOCATION,
            "the gap"
        );
        let bogus = [AccessDesc {
            permissions: AccessPermission::RW,
            agent_handle: hsa_core::sys::Agent { handle: 5 },
        }];
        assert_eq!(set_access(at(0), p, &bogus), Status::ERROR_INVALID_AGENT);
        let mut perm = AccessPermission::NONE;
        assert_eq!(
            hsa_amd_vmem_get_access(at(1), &mut perm, sim.aie),
            Status::SUCCESS
        );
        assert_eq!(perm, AccessPermission::RW);
        // Unmapping both at once removes the access granted on both (ROCR's unmap does).
        assert_eq!(
            hsa_amd_vmem_unmap(at(0), p + 1),
            Status::ERROR_INVALID_ALLOCATION,
            "mid-mapping end"
        );
        assert_eq!(hsa_amd_vmem_unmap(at(0), 2 * p), Status::SUCCESS);
        assert_eq!(
            hsa_amd_vmem_unmap(at(2), p),
            Status::ERROR_INVALID_ALLOCATION,
            "nothing there"
        );
        assert_eq!(
            hsa_amd_vmem_address_free(va, 4 * p - 1),
            Status::ERROR_RESOURCE_FREE
        );
        assert_eq!(hsa_amd_vmem_unmap(at(3), p), Status::SUCCESS);
        assert_eq!(
            hsa_amd_vmem_address_free(va, 4 * p),
            Status::ERROR_INVALID_ARGUMENT,
            "wrong size"
        );
        assert_eq!(hsa_amd_vmem_address_free(va, 4 * p - 1), Status::SUCCESS);
        assert_eq!(hsa_amd_vmem_handle_release(h), Status::SUCCESS);
    }
}

/// A handle of `size` bytes from `pool`, reserved and mapped; `hsa_amd_vmem_map`'s status.
fn map_new(pool: hsa_core::sys::MemoryPool, size: usize) -> (VmemHandle, *mut c_void, Status) {
    // SAFETY: (whole block) out-pointers are live locals; the range comes from the reserve.
    unsafe {
        let mut h = VmemHandle::default();
        let st = hsa_amd_vmem_handle_create(pool, size, MemoryType::PINNED, 0, &mut h);
        assert_eq!(st, Status::SUCCESS, "creating a handle works everywhere");
        let mut va: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            hsa_amd_vmem_address_reserve_align(&mut va, size, 0, 0, 1),
            Status::SUCCESS
        );
        (h, va, hsa_amd_vmem_map(va, size, 0, h, 0))
    }
}

#[test]
fn vmem_maps_aie_memory_only_from_the_first_g2_runtime_on() {
    for profile in Profile::ALL {
        let sim = Sim::new(profile);
        let size = page();
        let (h, va, st) = map_new(sim.pools[DATA], size);
        // CPU-pool (KFD) memory maps under every profile.
        let (hc, vc, stc) = map_new(sim.cpu_pools[0], size);
        assert_eq!(stc, Status::SUCCESS, "{profile}");
        let fd = rustix::fs::memfd_create("foreign", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, size as u64).unwrap();
        let mut imported = VmemHandle::default();
        // SAFETY: (whole block) live locals and runtime-made handles and ranges.
        unsafe {
            let import = hsa_amd_vmem_import_shareable_handle(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                &mut imported,
            );
            if profile.vmem_maps_aie_handles() {
                assert_eq!(
                    (st, import),
                    (Status::SUCCESS, Status::SUCCESS),
                    "{profile}"
                );
                assert_eq!(hsa_amd_vmem_unmap(va, size), Status::SUCCESS);
                assert_eq!(hsa_amd_vmem_handle_release(imported), Status::SUCCESS);
            } else {
                assert_eq!(st, Status::ERROR_INVALID_AGENT, "{profile}");
                assert!(last_error().unwrap().contains("KFD"), "{:?}", last_error());
                assert_eq!(import, Status::ERROR_INVALID_ALLOCATION, "{profile}");
            }
            for (v, hh) in [(va, h), (vc, hc)] {
                if v == vc {
                    assert_eq!(hsa_amd_vmem_unmap(v, size), Status::SUCCESS);
                }
                assert_eq!(hsa_amd_vmem_address_free(v, size), Status::SUCCESS);
                assert_eq!(hsa_amd_vmem_handle_release(hh), Status::SUCCESS);
            }
        }
    }
}

#[test]
fn only_the_newest_runtimes_export_aie_vmem_and_the_fd_is_sealed() {
    use rustix::fs::SealFlags;
    for profile in Profile::ALL {
        let sim = Sim::new(profile);
        let size = page();
        let (h, va, _) = map_new(sim.pools[KERNARG], size);
        let mut raw: c_int = -1;
        // SAFETY: a live out-pointer and a runtime-made handle.
        let st = unsafe { hsa_amd_vmem_export_shareable_handle(&mut raw, h, 0) };
        if !matches!(
            profile,
            Profile::RocrG2Jul2026 | Profile::RocrNewest | Profile::KernelObject
        ) {
            assert_eq!(st, Status::ERROR, "{profile}");
            assert!(
                last_error().unwrap().contains("does not export AIE memory"),
                "{:?}",
                last_error()
            );
            continue;
        }
        assert_eq!(st, Status::SUCCESS);
        // SAFETY: the export handed this fd to the caller.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let seals = rustix::fs::fcntl_get_seals(&fd).unwrap();
        assert!(
            seals.contains(SealFlags::SHRINK | SealFlags::GROW),
            "{seals:?}"
        );
        for len in [0, size as u64 / 2, 2 * size as u64] {
            let e = rustix::fs::ftruncate(&fd, len).unwrap_err();
            assert_eq!(e, rustix::io::Errno::PERM, "ftruncate to {len}");
        }
        // The emulator keeps working on the mapping: a dispatch writes its output there.
        let aie = [AccessDesc {
            permissions: AccessPermission::RW,
            agent_handle: sim.aie,
        }];
        assert_eq!(set_access(va, size, &aie), Status::SUCCESS);
        let mut d = valid(&sim, sim.signal(1));
        d.args[1] = (va as u64, 1024);
        let q = sim.queue();
        let hsaco = add_one().to_hsaco(sim.agent).unwrap();
        let loaded = profile
            .speaks_kernel_objects()
            .then(|| ko::Loaded::new(&sim, &hsaco));
        let packet = match &loaded {
            Some(l) => ko::ko_packet(
                &sim,
                l.kernel_object("vector_scalar_add"),
                &d.args,
                d.completion,
            ),
            None => sim.packet(&d),
        };
        q.submit(&[packet]);
        assert_eq!(q.errors(), vec![], "{:?}", last_error());
        drop(q);
        if let Some(l) = loaded {
            l.destroy();
        }
        let m = map_fd(std::os::fd::AsFd::as_fd(&fd), 0, size);
        // SAFETY: `m` maps one live page of the exported fd, and nothing writes it while the
        // copy is made: the dispatch that wrote it has completed and nothing else runs.
        let seen = unsafe { std::slice::from_raw_parts(m, 1024) }.to_vec();
        assert_eq!(bytes_i32(&seen), vec![6; 256]);
        // SAFETY: the mapping made above, unmapped once.
        unsafe { rustix::mm::munmap(m.cast(), size).unwrap() };
        // An imported handle cannot be exported again (ROCR's AIE memory test).
        let mut h2 = VmemHandle::default();
        // SAFETY: (whole block) live locals and runtime-made handles.
        unsafe {
            let st =
                hsa_amd_vmem_import_shareable_handle(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut h2);
            assert_eq!(st, Status::SUCCESS);
            let mut again: c_int = -1;
            assert_eq!(
                hsa_amd_vmem_export_shareable_handle(&mut again, h2, 0),
                Status::ERROR
            );
            assert!(last_error().unwrap().contains("imported"));
            assert_eq!(hsa_amd_vmem_handle_release(h2), Status::SUCCESS);
        }
    }
}

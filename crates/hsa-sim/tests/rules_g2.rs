//! The rules specific to G2 packets (`rocr-g2-2026-05`, `rocr-newest`): the header and
//! opcode, the kernarg buffer, the instruction size, vmem mappings as arguments, and the
//! newest runtime's suspended queue. The rules every generation shares are in `rules.rs`.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::ffi::c_void;

use common::profiles::{Case, G2, fails_on};
use common::*;
use hsa_core::sys::{AccessDesc, AccessPermission, MemoryType, Status, VmemHandle};
use hsa_sim::*;

#[test]
fn g2_header_type_and_opcode_are_checked_by_the_newest_runtime_only() {
    fails_on(
        "g2_header_type_and_opcode_are_checked_by_the_newest_runtime_only",
        &[Profile::RocrNewest],
        &[
            Case::one(
                "header type INVALID",
                Status::ERROR_INVALID_PACKET_FORMAT,
                &["READY"],
                |sim| {
                    let mut p = g2_packet(sim, &valid(sim, sim.signal(1)));
                    p.header = 1; // HSA_AMD_AIE_PACKET_TYPE_INVALID
                    g2_bytes(&p)
                },
            ),
            Case::one(
                "opcode 1",
                Status::ERROR_INVALID_PACKET_FORMAT,
                &["KMQ"],
                |sim| {
                    let mut p = g2_packet(sim, &valid(sim, sim.signal(1)));
                    p.opcode = 1;
                    g2_bytes(&p)
                },
            ),
        ],
    );
    for profile in G2 {
        let sim = Sim::new(profile);
        let sig = sim.signal(2);
        // The fence bits are ignored: header 0 works as well as 0x1400.
        let mut zero = g2_packet(&sim, &valid(&sim, sig));
        zero.header = 0;
        // The first G2 release checks neither the header type nor the opcode.
        let mut odd = g2_packet(&sim, &valid(&sim, sig));
        (odd.header, odd.opcode) = (1, 1);
        let q = sim.queue();
        if profile == Profile::RocrNewest {
            q.submit(&[g2_bytes(&zero)]);
            assert_eq!((q.errors(), load_signal(sig)), (vec![], 1));
        } else {
            q.submit(&[g2_bytes(&zero), g2_bytes(&odd)]);
            assert_eq!((q.read_index(), load_signal(sig)), (2, 0), "{profile}");
        }
    }
}

#[test]
fn the_g2_kernarg_buffer_must_be_a_known_allocation() {
    fails_on(
        "the_g2_kernarg_buffer_must_be_a_known_allocation",
        &G2,
        &[
            Case::one(
                "kernargs in host memory",
                Status::ERROR_INVALID_ALLOCATION,
                &["kernarg buffer"],
                |sim| {
                    let d = valid(sim, sim.signal(1));
                    let words = Vec::leak(vec![d.args[0].0, d.args[1].0, 1024, 1024]);
                    let mut p = g2_packet(sim, &d);
                    p.kernarg_address = words.as_ptr() as u64;
                    g2_bytes(&p)
                },
            ),
            Case::one(
                "NULL kernargs",
                Status::ERROR_INVALID_ARGUMENT,
                &["NULL"],
                |sim| {
                    let mut p = g2_packet(sim, &valid(sim, sim.signal(1)));
                    p.kernarg_address = 0;
                    g2_bytes(&p)
                },
            ),
        ],
    );
}

#[test]
fn insts_size_must_be_a_multiple_of_four() {
    // G1 packets count instructions in dwords, so only G2 can say otherwise.
    fails_on(
        "insts_size_must_be_a_multiple_of_four",
        &G2,
        &[Case::one(
            "insts_size - 2",
            Status::ERROR_INVALID_ARGUMENT,
            &["multiple of 4"],
            |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.insts_size -= 2;
                sim.packet(&d)
            },
        )],
    );
}

#[test]
fn a_suspended_queue_ignores_later_doorbells() {
    let sim = Sim::new(Profile::RocrNewest);
    let sig = sim.signal(1);
    let mut bad = valid(&sim, sig);
    bad.insts_size = 2;
    let q = sim.queue();
    q.submit(&[sim.packet(&bad)]);
    assert_eq!(q.errors(), vec![Status::ERROR_INVALID_ARGUMENT]);
    assert_eq!(
        load_signal(sig),
        1,
        "a failed packet does not fire its signal"
    );
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

/// A mapping of one page from AIE pool 0 with the given access for the CPU agent only.
fn cpu_only_mapping(sim: &Sim, size: usize) -> u64 {
    // SAFETY: (whole block) out-pointers are live locals; the range comes from the reserve.
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
        let cpu_only = [AccessDesc {
            permissions: AccessPermission::RW,
            agent_handle: sim.cpu,
        }];
        assert_eq!(
            hsa_amd_vmem_set_access(va, size, cpu_only.as_ptr(), 1),
            Status::SUCCESS
        );
        va as u64
    }
}

#[test]
fn vmem_mappings_are_arguments_only_with_aie_access() {
    // The 2025 runtimes cannot map AIE memory through vmem at all (tests/vmem.rs).
    fails_on(
        "vmem_mappings_are_arguments_only_with_aie_access",
        &G2,
        &[Case::one(
            "CPU-only mapping",
            Status::ERROR_INVALID_ALLOCATION,
            &["no access"],
            |sim| {
                let mut d = valid(sim, sim.signal(1));
                d.args[1] = (cpu_only_mapping(sim, 4096), 1024);
                sim.packet(&d)
            },
        )],
    );
    for profile in G2 {
        let sim = Sim::new(profile);
        let va = cpu_only_mapping(&sim, 4096);
        let mut d = valid(&sim, sim.signal(1));
        d.args[1] = (va, 1024);
        let aie = [AccessDesc {
            permissions: AccessPermission::RW,
            agent_handle: sim.aie,
        }];
        // SAFETY: the mapping made above.
        let st = unsafe { hsa_amd_vmem_set_access(va as *mut c_void, 4096, aie.as_ptr(), 1) };
        assert_eq!(st, Status::SUCCESS);
        let q = sim.queue();
        q.submit(&[sim.packet(&d)]);
        assert_eq!(q.errors(), vec![], "{profile}");
        assert_eq!(bytes_i32(&read(va, 1024)), vec![6; 256], "{profile}");
    }
}

#[test]
fn a_kernel_object_packet_is_an_unknown_instruction_buffer_to_a_g2_runtime() {
    // The wrong-form hazard the other way round (`rocr-aie-hsaco.md` §1): a G2 runtime reads a
    // kernel object (a host descriptor whose first u32 is 1) as an instruction address, and the
    // reserved word 40 as a size of 0. It cannot resolve the address to a BO.
    fails_on(
        "a_kernel_object_packet_is_an_unknown_instruction_buffer_to_a_g2_runtime",
        &G2,
        &[Case::one(
            "kernel-object packet",
            Status::ERROR_INVALID_ALLOCATION,
            &["instruction buffer", "not an allocation the runtime knows"],
            |sim| {
                let descriptor: &'static [u32; 4] = Box::leak(Box::new([1, 0, 0, 0]));
                let d = valid(sim, sim.signal(1));
                let mut p = hsa_core::sys::AieKernelObjectPacket {
                    header: hsa_core::sys::AIE_DISPATCH_HEADER,
                    count: hsa_core::sys::AIE_DISPATCH_COUNT,
                    num_kernargs: 2,
                    kernarg_address: sim.kernargs(&d.args),
                    ..Default::default()
                };
                p.set_kernel_object(descriptor.as_ptr() as u64);
                ko::packet_bytes(&p)
            },
        )],
    );
}

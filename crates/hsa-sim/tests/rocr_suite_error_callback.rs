//! ROCR's AIE error-callback suite (`rocrtst/suites/aie/error_callback_test.cc`,
//! ROCm/rocm-systems @3c5c75e0, the G2 era), one test per gtest test, under every profile.
//!
//! The suite creates a queue with an error callback, writes a G2 packet whose PDI address
//! (`0x1000`) is no buffer the driver knows and whose instruction buffer is NULL, and rings the
//! doorbell: the callback must have run, with a status other than success, naming the queue,
//! by the time the store returns. That holds where the runtime reports through the callback
//! ([`FailureReport::Callback`]: `rocr-newest`, `kernel-object`). The late 2025 and first G2
//! runtimes report the same refusal by aborting the process (checked in a child process). ROCm
//! 7.0 (G1a packets) reads the G2 packet as a G1a packet with a NULL payload and dies in its
//! submit path (the crate's rule table; `rocm_7_0.rs` checks that death), so it is left out.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use common::profiles::{Case, fails_on};
use common::*;
use hsa_core::sys::{
    AIE_DISPATCH_COUNT, AIE_DISPATCH_HEADER, AgentInfo, AieDispatchPacket, Queue, QueueType, Status,
};
use hsa_sim::*;

/// The suite's `error_capture`.
#[derive(Default)]
struct Capture {
    invoked: AtomicBool,
    status: AtomicI32,
    source: AtomicUsize,
}

unsafe extern "C" fn capture(status: Status, source: *mut Queue, data: *mut c_void) {
    // SAFETY: `data` is the test's `Capture`, alive while its queue is.
    let c = unsafe { &*data.cast::<Capture>() };
    c.status.store(status.0 as i32, Ordering::Relaxed);
    c.source.store(source as usize, Ordering::Relaxed);
    c.invoked.store(true, Ordering::Release);
}

fn queue_with_capture(sim: &Sim, c: &Capture) -> *mut Queue {
    let min = u32_info(sim.aie, AgentInfo::QUEUE_MIN_SIZE);
    let mut q: *mut Queue = std::ptr::null_mut();
    // SAFETY: the callback data outlives the queue (destroyed before `c` is dropped).
    let st = unsafe {
        hsa_queue_create(
            sim.aie,
            min,
            QueueType::SINGLE,
            Some(capture),
            std::ptr::from_ref(c).cast_mut().cast(),
            0,
            0,
            &mut q,
        )
    };
    assert_eq!(st, Status::SUCCESS);
    assert!(!q.is_null());
    q
}

fn destroy(q: *mut Queue) {
    // SAFETY: a queue from `hsa_queue_create`, destroyed once.
    assert_eq!(unsafe { hsa_queue_destroy(q) }, Status::SUCCESS);
}

#[test]
fn queue_create_with_callback() {
    for p in Profile::ALL {
        let sim = Sim::new(p);
        let c = Capture::default();
        let q = queue_with_capture(&sim, &c);
        assert!(!c.invoked.load(Ordering::Acquire), "{p}");
        destroy(q);
    }
}

/// The suite's packet: READY + system fences, KMQ, count 24, `pdi_addr` 0x1000, nothing else.
fn invalid_packet() -> [u8; 64] {
    g2_bytes(&AieDispatchPacket {
        header: AIE_DISPATCH_HEADER,
        opcode: 0,
        count: AIE_DISPATCH_COUNT,
        pdi_addr: 0x1000,
        ..Default::default()
    })
}

/// What each release answers for that packet: a G2 runtime finds no buffer at the NULL
/// instruction address; the kernel-object runtime reads words 20/24 as a NULL kernel object;
/// the late 2025 runtime reads the G2 header as a G1b packet's, which must be 0.
fn status_on(p: Profile) -> Status {
    if p.packet_abi() == PacketAbi::G2 && !p.speaks_kernel_objects() {
        Status::ERROR_INVALID_ALLOCATION
    } else {
        Status::ERROR_INVALID_PACKET_FORMAT
    }
}

#[test]
fn invalid_dispatch_invokes_callback() {
    let profiles: Vec<Profile> = Profile::ALL
        .into_iter()
        .filter(|p| p.packet_abi() != PacketAbi::G1a)
        .collect();
    fails_on(
        "invalid_dispatch_invokes_callback",
        &profiles,
        &[Case::one(
            "PDI at 0x1000, NULL instruction buffer",
            Status::ERROR,
            &[],
            |_| invalid_packet(),
        )
        .want_on(status_on)],
    );
    // The suite's own checks, where the runtime reports through the callback.
    for p in Profile::ALL {
        if p.failure_report() != FailureReport::Callback {
            continue;
        }
        let sim = Sim::new(p);
        let c = Capture::default();
        let q = queue_with_capture(&sim, &c);
        // SAFETY: (whole block) the queue is live; its ring holds 64 packets of 64 bytes.
        unsafe {
            let wr = hsa_queue_add_write_index_relaxed(q, 1);
            let ring = (*q).base_address.cast::<[u8; 64]>();
            ring.add((wr % u64::from((*q).size)) as usize)
                .write(invalid_packet());
            hsa_signal_store_screlease((*q).doorbell_signal, wr as i64);
        }
        assert!(c.invoked.load(Ordering::Acquire), "{p}: the callback ran");
        assert_ne!(
            c.status.load(Ordering::Relaxed),
            Status::SUCCESS.0 as i32,
            "{p}"
        );
        assert_eq!(
            c.source.load(Ordering::Relaxed),
            q as usize,
            "{p}: it names the queue"
        );
        destroy(q);
    }
}

//! Signals' wait semantics and the queue's indexes and doorbell, through the C functions.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use hsa_core::sys::{Signal, SignalCondition, Status, SystemInfo, WaitState};
use hsa_sim::*;
use npu_artifacts::emu::{DType, EmuDesign};

fn wait(s: Signal, cond: SignalCondition, v: i64, timeout_ns: u64) -> i64 {
    // SAFETY: a signal handle; unknown ones read 0.
    unsafe { hsa_signal_wait_scacquire(s, cond, v, timeout_ns, WaitState::BLOCKED) }
}

#[test]
fn waits_return_the_current_value_when_they_time_out() {
    let sim = Sim::new(Profile::RocrNewest);
    let mut freq = 0u64;
    // SAFETY: a u64 out-pointer.
    unsafe { hsa_system_get_info(SystemInfo::TIMESTAMP_FREQUENCY, (&raw mut freq).cast()) };
    let s = sim.signal(5);
    let start = Instant::now();
    assert_eq!(
        wait(s, SignalCondition::EQ, 0, freq / 50),
        5,
        "timed out: current value"
    );
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert_eq!(wait(s, SignalCondition::NE, 0, u64::MAX), 5);
    assert_eq!(wait(s, SignalCondition::LT, 6, u64::MAX), 5);
    assert_eq!(wait(s, SignalCondition::GTE, 5, u64::MAX), 5);
    // SAFETY: (whole block) a live signal.
    unsafe {
        hsa_signal_subtract_screlease(s, 2);
        assert_eq!(hsa_signal_load_scacquire(s), 3);
        hsa_signal_store_relaxed(s, -1);
        assert_eq!(wait(s, SignalCondition::LT, 0, 0), -1);
        assert_eq!(hsa_signal_destroy(s), Status::SUCCESS);
        assert_eq!(hsa_signal_destroy(s), Status::ERROR_INVALID_SIGNAL);
    }
}

#[test]
fn a_blocked_waiter_wakes_when_another_thread_stores() {
    let sim = Sim::new(Profile::RocrNewest);
    let s = sim.signal(1);
    let h = std::thread::spawn(move || wait(s, SignalCondition::EQ, 0, u64::MAX));
    std::thread::sleep(Duration::from_millis(20));
    // SAFETY: a live signal.
    unsafe { hsa_signal_store_screlease(s, 0) };
    assert_eq!(h.join().unwrap(), 0);
}

#[test]
fn the_read_index_moves_only_inside_a_doorbell_and_the_value_stored_is_ignored() {
    let sim = Sim::new(Profile::RocrNewest);
    let sig = sim.signal(3);
    let (a, b) = io_i32(&sim, &[0; 256]);
    let d = Dispatch::new(
        sim.load(&EmuDesign::vector_scalar_add(256, DType::I32, 1)),
        &[(a, 1024), (b, 1024)],
        sig,
    );
    let q = sim.queue();
    q.enqueue(&[sim.packet(&d), sim.packet(&d), sim.packet(&d)]);
    assert_eq!((q.read_index(), q.write_index()), (0, 3));
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(q.read_index(), 0, "nothing runs without a doorbell");
    // SAFETY: the queue's doorbell; the value is deliberately wrong.
    unsafe { hsa_signal_store_screlease((*q.q).doorbell_signal, 12345) };
    assert_eq!(
        q.read_index(),
        3,
        "the whole batch ran before the store returned"
    );
    assert_eq!(load_signal(sig), 0);
    // Ringing with nothing pending is harmless.
    q.ring();
    assert_eq!((q.read_index(), q.errors()), (3, vec![]));
    // SAFETY: a live queue; a doorbell cannot be destroyed as a signal.
    let st = unsafe { hsa_signal_destroy((*q.q).doorbell_signal) };
    assert_eq!(st, Status::ERROR_INVALID_SIGNAL);
}

#[test]
fn the_queue_descriptor_is_rocrs_and_the_index_functions_agree() {
    let sim = Sim::new(Profile::RocrNewest);
    let q = sim.queue();
    // SAFETY: (whole block) a live queue.
    unsafe {
        let desc = &*q.q;
        assert_eq!((desc.type_, desc.features, desc.size), (1, 0, 64));
        assert_eq!(desc.base_address as usize % 4096, 0);
        assert_ne!(desc.doorbell_signal.handle, 0);
        assert_eq!(hsa_queue_add_write_index_screlease(q.q, 2), 0);
        assert_eq!(hsa_queue_add_write_index_relaxed(q.q, 1), 2);
        assert_eq!(hsa_queue_load_write_index_scacquire(q.q), 3);
        assert_eq!(
            hsa_queue_cas_write_index_scacq_screl(q.q, 7, 9),
            3,
            "failed CAS returns the value seen"
        );
        assert_eq!(hsa_queue_cas_write_index_relaxed(q.q, 3, 0), 3);
        hsa_queue_store_write_index_screlease(q.q, 0);
        hsa_queue_store_write_index_relaxed(q.q, 0);
        assert_eq!(hsa_queue_load_read_index_relaxed(q.q), 0);
        assert_eq!(
            hsa_queue_load_write_index_relaxed(std::ptr::null()),
            0,
            "unknown queues read 0"
        );
    }
}

#[test]
fn the_ring_wraps_over_many_doorbells_on_g2() {
    let sim = Sim::new(Profile::RocrNewest);
    let input: Vec<i32> = (0..256).collect();
    let (a, b) = io_i32(&sim, &input);
    let loaded = sim.load(&EmuDesign::vector_scalar_add(256, DType::I32, 1));
    let sig = sim.signal(200);
    let q = sim.queue();
    let mut bufs = [a, b];
    for chunk in 0..10 {
        let packets: Vec<[u8; 64]> = (0..20)
            .map(|_| {
                let p = sim.packet(&Dispatch::new(
                    loaded,
                    &[(bufs[0], 1024), (bufs[1], 1024)],
                    sig,
                ));
                bufs.swap(0, 1);
                p
            })
            .collect();
        q.submit(&packets);
        assert_eq!(q.read_index(), (chunk + 1) * 20);
    }
    assert_eq!(q.errors(), vec![]);
    assert_eq!(wait_eq(sig, 0, 0), 0);
    assert_eq!(
        bytes_i32(&read(bufs[0], 1024)),
        input.iter().map(|x| x + 200).collect::<Vec<_>>()
    );
}

#[test]
fn queues_on_several_threads_run_independently() {
    let sim = Sim::new(Profile::RocrNewest);
    let loaded = sim.load(&EmuDesign::vector_scalar_add(256, DType::I32, 1));
    std::thread::scope(|s| {
        for t in 0..4i32 {
            let sim = &sim;
            s.spawn(move || {
                let input: Vec<i32> = (0..256).map(|i| i * t).collect();
                let (a, b) = io_i32(sim, &input);
                let sig = sim.signal(50);
                let q = sim.queue();
                let mut bufs = [a, b];
                for _ in 0..5 {
                    let packets: Vec<[u8; 64]> = (0..10)
                        .map(|_| {
                            let d = Dispatch::new(loaded, &[(bufs[0], 1024), (bufs[1], 1024)], sig);
                            bufs.swap(0, 1);
                            sim.packet(&d)
                        })
                        .collect();
                    q.submit(&packets);
                }
                assert_eq!(wait_eq(sig, 0, u64::MAX), 0);
                assert_eq!(q.errors(), vec![]);
                let want: Vec<i32> = input.iter().map(|x| x + 50).collect();
                assert_eq!(bytes_i32(&read(bufs[0], 1024)), want, "thread {t}");
            });
        }
    });
}

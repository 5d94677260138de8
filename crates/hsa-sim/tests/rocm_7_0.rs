//! ROCm 7.0 fails silently (`rocr-aie.md` §5.6): its doorbell only `assert`s, which release
//! builds compile out, so a failed batch calls no callback, suspends nothing, and moves the
//! read index to the write index as if every packet had run. What a client can still see is
//! what did not happen: the output untouched.

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::*;
use hsa_core::sys::{Signal, Status};
use hsa_sim::*;
use npu_artifacts::emu::EmuDesign;

/// Rings a fault or hang design writing into a zeroed output, then a valid packet, in one batch.
fn ring_failing(sim: &Sim, q: &TestQueue, design: &EmuDesign) -> (u64, Dispatch) {
    let (a, b) = (sim.put(DATA, &[7; 64]), sim.alloc(DATA, 64));
    let bad = Dispatch::new(sim.load(design), &[(a, 64), (b, 64)], Signal::default());
    let after = valid(sim, Signal::default());
    q.submit(&[sim.packet(&bad), sim.packet(&after)]);
    (b, after)
}

#[test]
fn a_fault_is_silent_and_the_rest_of_the_batch_does_not_run() {
    let sim = Sim::new(Profile::Rocm70);
    let q = sim.queue();
    let before = counters();
    let (out, after) = ring_failing(&sim, &q, &EmuDesign::fault(64));
    let seen = counters().since(&before);
    assert_eq!(q.errors(), vec![], "no callback");
    assert!(!q.suspended());
    assert_eq!((q.read_index(), q.write_index()), (2, 2));
    assert_eq!(
        read(out, 64),
        vec![0; 64],
        "the fault left its output untouched"
    );
    assert_eq!(
        read(after.args[1].0, 1024),
        vec![0; 1024],
        "the packet after it never ran"
    );
    assert_eq!((seen.packets_completed, seen.packets_failed), (0, 1));
    assert_eq!(last_error_status(), Some(Status::ERROR));
    assert!(last_error().unwrap().contains("device error"));
    // The queue takes the next batch as if nothing happened.
    let d = valid(&sim, Signal::default());
    q.submit(&[sim.packet(&d)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 3));
    assert_eq!(bytes_i32(&read(d.args[1].0, 1024)), vec![6; 256]);
}

#[test]
fn a_hang_gives_up_at_the_50_ms_command_wait_silently() {
    // A watchdog far longer than ROCm 7.0's WAIT_CMD timeout: the runtime gives up first.
    let sim = Sim::with(SimConfig {
        profile: Profile::Rocm70,
        timeout: std::time::Duration::from_secs(3600),
        ..Default::default()
    });
    let q = sim.queue();
    let (out, _) = ring_failing(&sim, &q, &EmuDesign::hang(64));
    assert_eq!(q.errors(), vec![]);
    assert_eq!((q.read_index(), q.write_index()), (2, 2));
    assert_eq!(read(out, 64), vec![0; 64]);
    let detail = last_error().unwrap();
    assert!(
        detail.contains("WAIT_CMD timed out") && detail.contains("50 ms"),
        "{detail}"
    );
}

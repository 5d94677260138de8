//! The timing model (`HSA_SIM_TIMING=model`): a doorbell returns no sooner than the device time
//! the model gives what it ran, one doorbell of many packets is charged one submission, and
//! with the model off nothing is charged.

#![allow(clippy::cast_possible_truncation)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use hsa_sim::timing::{Model, Timing};
use hsa_sim::*;

/// `packets` add-one dispatches of one program sharing a completion signal, on `profile`
/// with `timing`; returns what the counters saw and how long the doorbells took, rung
/// `per_doorbell` packets at a time.
fn run(
    profile: Profile,
    timing: Timing,
    packets: usize,
    per_doorbell: usize,
) -> (Counters, Duration) {
    let sim = Sim::with(SimConfig {
        profile,
        timing,
        timeout: Duration::from_secs(2),
        ..SimConfig::default()
    });
    let d = valid(&sim, sim.signal(packets as i64));
    let all: Vec<[u8; 64]> = (0..packets).map(|_| sim.packet(&d)).collect();
    let q = sim.queue();
    let before = counters();
    let t = Instant::now();
    for batch in all.chunks(per_doorbell) {
        q.submit(batch);
    }
    let took = t.elapsed();
    assert_eq!(
        q.read_index(),
        packets as u64,
        "{profile}: every packet ran"
    );
    assert_eq!(
        bytes_i32(&read(d.args[1].0, 1024)),
        vec![6; 256],
        "{profile}"
    );
    (counters().since(&before), took)
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

#[test]
fn a_doorbell_takes_at_least_its_modelled_time_and_batching_is_charged_one_submission() {
    let m = Model::of(npu_artifacts::NpuGen::Npu2);
    // add-one over 256 i32: 1 KiB in, 1 KiB out.
    let kernel = m.kernel(2048, 0);
    for profile in [Profile::RocrNewest, Profile::RocrLate2025] {
        // One doorbell of 16: one chain, 16 commands, the queue's context built for the PDI.
        let (one, took) = run(profile, Timing::Model, 16, 16);
        let want = m.context + m.submit + 16 * (m.per_command + kernel);
        assert_eq!(one.chain_submissions, 1, "{profile}");
        assert_eq!(one.modelled_device_ns, ns(want), "{profile}");
        assert!(took >= want, "{profile}: {took:?} < {want:?}");
        // Sixteen doorbells of one: sixteen submissions.
        let (sixteen, took) = run(profile, Timing::Model, 16, 1);
        let want = 16 * (m.submit + m.per_command + kernel) + m.context;
        assert_eq!(sixteen.modelled_device_ns, ns(want), "{profile}");
        assert!(took >= want, "{profile}: {took:?} < {want:?}");
        assert!(sixteen.modelled_device_ns > one.modelled_device_ns);
        // Off: nothing charged.
        let (off, _) = run(profile, Timing::Off, 16, 1);
        assert_eq!(off.modelled_device_ns, 0, "{profile}");
    }
}

#[test]
fn rocm_7_0_builds_a_context_at_every_doorbell_that_misses_its_cache() {
    let m = Model::of(npu_artifacts::NpuGen::Npu2);
    let kernel = m.kernel(2048, 0);
    let (seen, took) = run(Profile::Rocm70, Timing::Model, 2, 1);
    let want = seen.hw_context_builds as u32 * m.context
        + seen.chain_submissions as u32 * m.submit
        + 2 * (m.per_command + kernel);
    // Two doorbells, two contexts: the second misses the cache the first stored under the
    // handle of the context it destroyed.
    assert_eq!(seen.hw_context_builds, 2, "{seen:?}");
    assert_eq!(seen.modelled_device_ns, ns(want), "{seen:?}");
    assert!(took >= want, "{took:?} < {want:?}");
}

/// A fault is not free on the model, though nothing is charged for the failing command itself:
/// its runtime suspends the queue, npud re-creates it (ROCR destroys the hardware context with
/// the queue), and the new queue's first doorbell builds a context again for the PDI it runs
/// (35 ms). A fault design new to the queue also costs the context built to run it.
#[test]
fn a_fault_costs_a_context_built_again_at_the_recreated_queues_first_doorbell() {
    let m = Model::of(npu_artifacts::NpuGen::Npu2);
    let kernel = m.kernel(2048, 0);
    let sim = Sim::with(SimConfig {
        profile: Profile::RocrNewest,
        timing: Timing::Model,
        timeout: Duration::from_secs(2),
        ..SimConfig::default()
    });
    let good = valid(&sim, sim.signal(3));
    let (a, b) = io_i32(&sim, &[0; 256]);
    let fault = common::Dispatch::new(
        sim.load(&npu_artifacts::emu::EmuDesign::fault(1024)),
        &[(a, 1024), (b, 1024)],
        sim.signal(1),
    );
    let q = sim.queue();
    let before = counters();
    // One doorbell: a good dispatch, the fault, and a good dispatch after it, which never runs.
    q.submit(&[sim.packet(&good), sim.packet(&fault), sim.packet(&good)]);
    assert!(q.suspended());
    assert_eq!(q.read_index(), 1);
    let failed = counters().since(&before);
    // The good PDI's context and the fault design's; one chain, one command done.
    assert_eq!(
        failed.modelled_device_ns,
        ns(2 * m.context + m.submit + m.per_command + kernel),
        "{failed:?}"
    );
    drop(q);
    // The recovery: a new queue, whose first doorbell builds the context again.
    let q = sim.queue();
    let before = counters();
    let t = Instant::now();
    q.submit(&[sim.packet(&good), sim.packet(&good)]);
    let took = t.elapsed();
    assert_eq!(q.read_index(), 2);
    let after = counters().since(&before);
    let want = m.context + m.submit + 2 * (m.per_command + kernel);
    assert_eq!(after.modelled_device_ns, ns(want), "{after:?}");
    assert!(took >= want, "{took:?} < {want:?}");
    // The same queue's next doorbell builds none.
    let before = counters();
    q.submit(&[sim.packet(&good)]);
    let again = counters().since(&before);
    assert_eq!(
        again.modelled_device_ns,
        ns(m.submit + m.per_command + kernel)
    );
}

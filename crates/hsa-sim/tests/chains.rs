//! Command chains per profile: how many packets one doorbell may carry before the driver's
//! 4 KiB chain buffer overflows (`rocr-aie.md` §5.2, §7; `rocr-aie-hsaco.md` §4), and how the
//! newest runtime splits a batch instead. `Doorbells` counts the rings, `ChainSubmissions`
//! the chains they became.

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::profiles::{Case, fails_on};
use common::*;
use hsa_core::sys::Status;
use hsa_sim::*;
use npu_artifacts::emu::EmuDesign;

/// `packets` dispatches of a no-op design taking `n_args` buffers of 4 KiB, sharing one
/// completion signal armed to `packets`.
fn batch(sim: &Sim, n_args: u8, packets: usize) -> Vec<[u8; 64]> {
    let loaded = sim.load(&EmuDesign::noop(n_args, 4096));
    let args: Vec<(u64, u64)> = (0..n_args).map(|_| (sim.alloc(DATA, 4096), 4096)).collect();
    let d = Dispatch::new(loaded, &args, sim.signal(packets as i64));
    // A payload each: ROCm 7.0 rewrites a payload it has run, so one payload repeated runs
    // only once.
    (0..packets).map(|_| sim.packet(&d)).collect()
}

/// Rings `packets` on a fresh queue and returns what the counters saw.
fn ring(sim: &Sim, packets: &[[u8; 64]]) -> (TestQueue, Counters) {
    let before = counters();
    let q = sim.queue();
    q.submit(packets);
    (q, counters().since(&before))
}

const UNSPLIT: [Profile; 3] = [
    Profile::Rocm70,
    Profile::RocrLate2025,
    Profile::RocrG2May2026,
];

#[test]
fn thirty_two_dispatches_of_six_arguments_overflow_every_chain_but_the_newest() {
    // G1: 32 × (52 + 4·(6+18)) = 4736 bytes; the first G2: 32 × (52 + 4·(8+12)) = 4224.
    fails_on(
        "thirty_two_dispatches_of_six_arguments_overflow_every_chain_but_the_newest",
        &UNSPLIT,
        &[Case::new(
            "32 × N=6",
            Status::ERROR,
            &["32 commands", "4096", "do not split chains"],
            |sim| batch(sim, 6, 32),
        )],
    );
    // ROCm 7.0 says nothing, but nothing ran.
    let sim = Sim::new(Profile::Rocm70);
    let (q, seen) = ring(&sim, &batch(&sim, 6, 32));
    assert_eq!((q.errors(), q.read_index()), (vec![], 32));
    assert_eq!(
        (
            seen.packets_completed,
            seen.packets_failed,
            seen.chain_submissions
        ),
        (0, 1, 0)
    );
    drop((q, sim));
    // The newest ROCR fits them in one chain: 32 × (52 + 4·(6+12)) = 3968 bytes.
    let sim = Sim::new(Profile::RocrNewest);
    let (q, seen) = ring(&sim, &batch(&sim, 6, 32));
    assert_eq!((q.errors(), q.read_index()), (vec![], 32));
    assert_eq!(
        (
            seen.doorbells,
            seen.chain_submissions,
            seen.packets_completed
        ),
        (1, 1, 32)
    );
}

#[test]
fn forty_dispatches_of_two_arguments_fit_one_unsplit_chain_and_forty_one_do_not() {
    fails_on(
        "forty_dispatches_of_two_arguments_fit_one_unsplit_chain_and_forty_one_do_not",
        &UNSPLIT,
        &[Case::new(
            "41 × N=2",
            Status::ERROR,
            &["41 commands", "4100 bytes"],
            |sim| batch(sim, 2, 41),
        )],
    );
    for profile in UNSPLIT {
        let sim = Sim::new(profile);
        let (q, seen) = ring(&sim, &batch(&sim, 2, 40));
        assert_eq!((q.errors(), q.read_index()), (vec![], 40), "{profile}");
        assert_eq!(
            (
                seen.doorbells,
                seen.chain_submissions,
                seen.packets_completed
            ),
            (1, 1, 40),
            "{profile}"
        );
    }
}

#[test]
fn thirty_one_dispatches_of_six_arguments_fit_the_first_g2_chain() {
    let sim = Sim::new(Profile::RocrG2May2026);
    let (q, seen) = ring(&sim, &batch(&sim, 6, 31));
    assert_eq!((q.errors(), q.read_index()), (vec![], 31));
    assert_eq!((seen.chain_submissions, seen.packets_completed), (1, 31));
}

#[test]
fn the_newest_runtime_splits_a_full_ring_into_chains_of_44() {
    let sim = Sim::new(Profile::RocrNewest);
    let packets = batch(&sim, 2, 64);
    let (q, seen) = ring(&sim, &packets);
    assert_eq!((q.errors(), q.read_index()), (vec![], 64));
    // 52 + 4·(6+4) = 92 bytes a command: 44 fit in 4096, then the other 20.
    assert_eq!(
        (
            seen.doorbells,
            seen.chain_submissions,
            seen.packets_completed
        ),
        (1, 2, 64)
    );
}

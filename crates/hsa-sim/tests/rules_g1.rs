//! The rules specific to the G1 packet generations (ROCm 7.0's G1a and the later G1b):
//! chain size, the non-wrapping G1a ring, field checks and payload reads.

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::*;
use hsa_core::sys::{ErtBits, ErtPacket, Status, ert_opcode, ert_state};
use hsa_sim::*;

#[test]
fn g1_chains_must_fit_the_4_kib_buffer_but_g2_splits_its_own() {
    for abi in [PacketAbi::G1b, PacketAbi::G1a] {
        let sim = Sim::new(abi);
        let sig = sim.signal(41);
        let d = valid(&sim, sig);
        let q = sim.queue();
        q.submit(&vec![sim.packet(&d); 41]);
        assert_eq!(q.errors(), vec![Status::ERROR], "{abi:?}");
        let detail = last_error().unwrap();
        assert!(
            detail.contains("41 commands") && detail.contains("4096"),
            "{detail}"
        );
        assert_eq!(
            (q.read_index(), load_signal(sig)),
            (0, 41),
            "{abi:?}: nothing ran"
        );

        let q = sim.queue();
        q.submit(&vec![sim.packet(&d); 40]);
        assert_eq!(
            q.errors(),
            vec![],
            "{abi:?}: 40 commands of two arguments fit"
        );
        assert_eq!(q.read_index(), 40);
    }
    let sim = Sim::new(PacketAbi::G2);
    let sig = sim.signal(64);
    let d = valid(&sim, sig);
    let q = sim.queue();
    q.submit(&vec![sim.packet(&d); 64]);
    assert_eq!(q.errors(), vec![]);
    assert_eq!((q.read_index(), load_signal(sig)), (64, 0));
}

#[test]
fn a_g1a_queue_fails_past_64_packets_in_its_lifetime() {
    let sim = Sim::new(PacketAbi::G1a);
    let d = valid(&sim, hsa_core::sys::Signal::default());
    let p = sim.packet(&d);
    let q = sim.queue();
    q.submit(&[p; 32]);
    q.submit(&[p; 32]);
    assert_eq!(q.errors(), vec![]);
    assert_eq!(q.read_index(), 64);
    q.submit(&[p]);
    assert_eq!(q.errors(), vec![Status::ERROR_INVALID_PACKET_FORMAT]);
    let detail = last_error().unwrap();
    assert!(
        detail.contains("does not wrap") || detail.contains("without wrapping"),
        "{detail}"
    );
    assert!(
        detail.contains("recreate the queue before it has taken 64 packets"),
        "{detail}"
    );
    assert_eq!(q.read_index(), 64);

    // G1b wraps.
    drop(q);
    drop(sim);
    let sim = Sim::new(PacketAbi::G1b);
    let d = valid(&sim, sim.signal(65));
    let q = sim.queue();
    q.submit(&[sim.packet(&d); 32]);
    q.submit(&[sim.packet(&d); 32]);
    q.submit(&[sim.packet(&d)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 65));
}

#[test]
fn g1_packets_are_checked_field_by_field() {
    let sim = Sim::new(PacketAbi::G1b);
    let sig = sim.signal(1);
    let base = g1_packet(&sim, &valid(&sim, sig));
    type Change = Box<dyn Fn(&mut ErtPacket)>;
    let cases: Vec<(&str, Change)> = vec![
        ("header", Box::new(|p| p.header = 0x1400)),
        ("AmdFormat", Box::new(|p| p.amd_format = 3)),
        (
            "START_CU",
            Box::new(|p| {
                p.ert = ErtBits {
                    opcode: ert_opcode::CMD_CHAIN,
                    ..p.bits()
                }
                .pack()
            }),
        ),
        (
            "state",
            Box::new(|p| {
                p.ert = ErtBits {
                    state: ert_state::QUEUED,
                    ..p.bits()
                }
                .pack()
            }),
        ),
        (
            "5 + 3N",
            Box::new(|p| {
                p.ert = ErtBits {
                    count: 12,
                    ..p.bits()
                }
                .pack()
            }),
        ),
        ("NULL", Box::new(|p| p.payload_data = 0)),
    ];
    for (what, change) in cases {
        let mut p = base;
        change(&mut p);
        let detail = fails_with(&sim, g1_bytes(&p), Status::ERROR_INVALID_PACKET_FORMAT);
        assert!(detail.contains(what), "{what}: {detail}");
    }
    let mut p = base;
    p.ert = ErtBits {
        opcode: ert_opcode::START_NPU,
        ..p.bits()
    }
    .pack();
    let detail = fails_with(&sim, g1_bytes(&p), Status::ERROR_INVALID_PACKET_FORMAT);
    assert!(detail.contains("loop forever"), "{detail}");
}

#[test]
fn a_g1_payload_may_live_in_any_host_memory_but_must_be_readable() {
    let sim = Sim::new(PacketAbi::G1b);
    let sig = sim.signal(1);
    let d = valid(&sim, sig);
    let mut p = g1_packet(&sim, &d);
    // The same payload, copied into plain host memory the runtime never allocated.
    let host: Vec<u8> = read(p.payload_data, 8 + 4 * 11);
    p.payload_data = host.as_ptr() as u64;
    let q = sim.queue();
    q.submit(&[g1_bytes(&p)]);
    assert_eq!(q.errors(), vec![], "{:?}", last_error());
    assert_eq!(load_signal(sig), 0);
    p.payload_data = 0x10;
    let detail = fails_with(&sim, g1_bytes(&p), Status::ERROR_INVALID_PACKET_FORMAT);
    assert!(detail.contains("readable"), "{detail}");
}

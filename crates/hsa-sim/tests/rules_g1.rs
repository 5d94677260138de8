//! The rules specific to the G1 packet generations (ROCm 7.0's G1a and the later G1b): the
//! non-wrapping G1a ring, field checks and payload reads. Chain limits are in `chains.rs`.

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::profiles::{Case, G1, check_in_process, fails_on};
use common::*;
use hsa_core::sys::{ErtBits, ErtPacket, Status, ert_opcode, ert_state};
use hsa_sim::*;

#[test]
fn a_g1a_queue_fails_silently_past_64_packets_in_its_lifetime() {
    let sim = Sim::new(Profile::Rocm70);
    let d = valid(&sim, hsa_core::sys::Signal::default());
    let p = sim.packet(&d);
    let q = sim.queue();
    q.submit(&[p; 32]);
    q.submit(&[p; 32]);
    assert_eq!(q.errors(), vec![]);
    assert_eq!(q.read_index(), 64);
    q.submit(&[p]);
    let detail = check_in_process(&sim, &q, Status::ERROR_INVALID_PACKET_FORMAT, 64);
    assert!(detail.contains("without wrapping"), "{detail}");
    assert!(
        detail.contains("recreate the queue before it has taken 64 packets"),
        "{detail}"
    );
    assert_eq!(q.read_index(), 65, "ROCm 7.0 moves on as if packet 64 ran");

    // G1b wraps.
    drop(q);
    drop(sim);
    let sim = Sim::new(Profile::RocrLate2025);
    let d = valid(&sim, sim.signal(65));
    let q = sim.queue();
    q.submit(&[sim.packet(&d); 32]);
    q.submit(&[sim.packet(&d); 32]);
    q.submit(&[sim.packet(&d)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 65));
}

fn changed(sim: &Sim, change: impl Fn(&mut ErtPacket)) -> [u8; 64] {
    let mut p = g1_packet(sim, &valid(sim, sim.signal(1)));
    change(&mut p);
    g1_bytes(&p)
}

#[test]
fn g1_packets_are_checked_field_by_field() {
    let bad = Status::ERROR_INVALID_PACKET_FORMAT;
    // ROCm 7.0 checks only some of them: see below, and rocm_7_0.rs for its hang on an
    // opcode other than START_CU and its fault on a NULL payload.
    fails_on(
        "g1_packets_are_checked_field_by_field",
        &[Profile::RocrLate2025],
        &[
            Case::one("AmdFormat of the other G1", bad, &["AmdFormat"], |sim| {
                let other = if sim.abi == PacketAbi::G1a { 200 } else { 3 };
                changed(sim, |p| p.amd_format = other)
            }),
            Case::one("CMD_CHAIN opcode", bad, &["START_CU"], |sim| {
                changed(sim, |p| {
                    p.ert = ErtBits {
                        opcode: ert_opcode::CMD_CHAIN,
                        ..p.bits()
                    }
                    .pack()
                })
            }),
            Case::one("state QUEUED", bad, &["state"], |sim| {
                changed(sim, |p| {
                    p.ert = ErtBits {
                        state: ert_state::QUEUED,
                        ..p.bits()
                    }
                    .pack()
                })
            }),
            Case::one("count 12", bad, &["5 + 3N"], |sim| {
                changed(sim, |p| {
                    p.ert = ErtBits {
                        count: 12,
                        ..p.bits()
                    }
                    .pack()
                })
            }),
            Case::one("NULL payload", bad, &["NULL"], |sim| {
                changed(sim, |p| p.payload_data = 0)
            }),
            Case::one("START_NPU opcode", bad, &["loop forever"], |sim| {
                changed(sim, |p| {
                    p.ert = ErtBits {
                        opcode: ert_opcode::START_NPU,
                        ..p.bits()
                    }
                    .pack()
                })
            }),
        ],
    );
}

#[test]
fn rocm_7_0_only_asserts_the_amd_format_and_the_state_and_refuses_a_bad_count_silently() {
    fails_on(
        "rocm_7_0_only_asserts_the_amd_format_and_the_state_and_refuses_a_bad_count_silently",
        &[Profile::Rocm70],
        &[Case::one(
            "count 12",
            Status::ERROR_INVALID_PACKET_FORMAT,
            &["5 + 3N"],
            |sim| {
                changed(sim, |p| {
                    p.ert = ErtBits {
                        count: 12,
                        ..p.bits()
                    }
                    .pack()
                })
            },
        )],
    );
    let sim = Sim::new(Profile::Rocm70);
    let q = sim.queue();
    for change in [
        (|p: &mut ErtPacket| p.amd_format = 200) as fn(&mut ErtPacket),
        |p| {
            p.ert = ErtBits {
                state: ert_state::QUEUED,
                ..p.bits()
            }
            .pack()
        },
    ] {
        let d = valid(&sim, hsa_core::sys::Signal::default());
        let mut p = g1_packet(&sim, &d);
        change(&mut p);
        q.submit(&[g1_bytes(&p)]);
        assert_eq!(last_error(), None);
        assert_eq!(bytes_i32(&read(d.args[1].0, 1024)), vec![6; 256]);
    }
}

#[test]
fn the_g1_header_must_be_0_where_it_is_checked() {
    fails_on(
        "the_g1_header_must_be_0_where_it_is_checked",
        &[Profile::RocrLate2025],
        &[Case::one(
            "header 0x1400",
            Status::ERROR_INVALID_PACKET_FORMAT,
            &["header"],
            |sim| changed(sim, |p| p.header = 0x1400),
        )],
    );
    // ROCm 7.0 only asserts it, and release builds compile the assert out: the packet runs.
    let sim = Sim::new(Profile::Rocm70);
    let d = valid(&sim, hsa_core::sys::Signal::default());
    let mut p = g1_packet(&sim, &d);
    p.header = 0x1400;
    let q = sim.queue();
    q.submit(&[g1_bytes(&p)]);
    assert_eq!((q.errors(), q.read_index()), (vec![], 1));
    assert_eq!(last_error(), None);
    assert_eq!(bytes_i32(&read(d.args[1].0, 1024)), vec![6; 256]);
}

#[test]
fn a_g1_payload_may_live_in_any_host_memory_but_must_be_readable() {
    // ROCm 7.0 reads it unchecked and dies (as with a NULL payload, rocm_7_0.rs).
    fails_on(
        "a_g1_payload_may_live_in_any_host_memory_but_must_be_readable",
        &[Profile::RocrLate2025],
        &[Case::one(
            "payload at 0x10",
            Status::ERROR_INVALID_PACKET_FORMAT,
            &["readable"],
            |sim| changed(sim, |p| p.payload_data = 0x10),
        )],
    );
    for profile in G1 {
        let sim = Sim::new(profile);
        let d = valid(&sim, sim.signal(1));
        let mut p = g1_packet(&sim, &d);
        // The same payload, copied into plain host memory the runtime never allocated.
        let host: Vec<u8> = read(p.payload_data, 8 + 4 * 11);
        p.payload_data = host.as_ptr() as u64;
        let q = sim.queue();
        q.submit(&[g1_bytes(&p)]);
        assert_eq!(q.errors(), vec![], "{:?}", last_error());
        assert_eq!(last_error(), None, "{profile}");
        assert_eq!(
            bytes_i32(&read(d.args[1].0, 1024)),
            vec![6; 256],
            "{profile}"
        );
    }
}

//! G2 full-ELF packets (`pdi_patch_offset` ≠ 0), mirroring the G2-era AIE suite's full-ELF
//! tests (`rocrtst/suites/aie/dispatch.cc`, `FullElfDispatchTest` and friends) on the runtimes
//! that have them (`rocr-g2-2026-07`, `rocr-newest`), and what the others do with such a packet.
//!
//! As the suite does, the test parses the full ELF itself, places the PDI and the control code
//! in the device heap (the control code 16 KiB aligned), patches the argument addresses into the
//! control code, and names the PDI site in word 56; the runtime writes the PDI's device address
//! there.

mod common;

use common::profiles::{Case, fails_on};
use common::{DATA, Dispatch, HEAP, Sim, add_one, bytes_i32, g2_bytes, g2_packet, io_i32, read};
use hsa_core::sys::{AieDispatchPacket, DEVICE_HEAP_DEVICE_BASE, Signal, Status};
use hsa_sim::{Profile, SimConfig, counters};
use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};
use npu_artifacts::hsaco::{FullElf, PatchScheme, SiteTarget, patch_shim_dma48};

/// The runtimes with G2 full ELF.
const FULL_ELF: [Profile; 2] = [Profile::RocrG2Jul2026, Profile::RocrNewest];

const ALIGN: u64 = 16 << 10;
const ALIGN_BYTES: usize = 16 << 10;
const N: usize = 256;
const NI: i32 = 256;
/// Bytes of one buffer.
const NB: u64 = 1024;

/// A full ELF as the suite's reader gives it.
struct Elf {
    ctrl: Vec<u8>,
    pdi: Vec<u8>,
    pdi_site: u32,
    arg_sites: Vec<(u32, u16, u32)>,
}

fn elf(design: &EmuDesign) -> Elf {
    let bytes = design.to_full_elf().unwrap();
    let parsed = FullElf::parse(&bytes).unwrap();
    let k = &parsed.kernels[0];
    let pdi_site = k
        .sites
        .iter()
        .find(|s| matches!(s.target, SiteTarget::Pdi(_)))
        .unwrap()
        .offset;
    let arg_sites = k
        .sites
        .iter()
        .filter_map(|s| match s.target {
            SiteTarget::Arg(i) if s.scheme == PatchScheme::SHIM_DMA_48 => {
                Some((s.offset, i, s.addend))
            }
            _ => None,
        })
        .collect();
    Elf {
        ctrl: k.ctrl_code.to_vec(),
        pdi: k.pdis[0].bytes.to_vec(),
        pdi_site,
        arg_sites,
    }
}

impl Elf {
    /// The control code with `args` patched in, from the pristine copy.
    fn patched(&self, args: &[u64]) -> Vec<u8> {
        let mut c = self.ctrl.clone();
        for &(off, i, addend) in &self.arg_sites {
            patch_shim_dma48(&mut c, off, args[usize::from(i)] + u64::from(addend)).unwrap();
        }
        c
    }

    /// A 16 KiB-aligned control-code buffer in the device heap, `skew` bytes past the boundary.
    fn place(&self, sim: &Sim, args: &[u64], skew: u64) -> u64 {
        let base = sim.alloc(HEAP, self.ctrl.len() + 3 * ALIGN_BYTES);
        let at = base.next_multiple_of(ALIGN) + skew;
        common::write(at, &self.patched(args));
        at
    }

    fn packet(
        &self,
        sim: &Sim,
        ctrl: u64,
        pdi: u64,
        args: &[(u64, u64)],
        sig: Signal,
    ) -> AieDispatchPacket {
        let mut p = g2_packet(
            sim,
            &Dispatch {
                pdi,
                insts: ctrl,
                insts_size: self.ctrl.len() as u64,
                args: args.to_vec(),
                completion: sig,
            },
        );
        p.reserved4 = u64::from(self.pdi_site);
        p
    }
}

/// One add-one full-ELF dispatch's buffers: (elf, pdi, input, output, ctrl).
fn setup(sim: &Sim, sentinel: Option<i32>) -> (Elf, u64, u64, u64, u64) {
    let e = elf(&add_one());
    let pdi = sim.put(HEAP, &e.pdi);
    let input: Vec<i32> = (0..NI).collect();
    let (a, b) = io_i32(sim, &input);
    if let Some(s) = sentinel {
        common::write(b, &common::i32_bytes(&vec![s; N]));
    }
    let ctrl = e.place(sim, &[a, b], 0);
    (e, pdi, a, b, ctrl)
}

fn out(b: u64) -> Vec<i32> {
    bytes_i32(&read(b, N * 4))
}

fn plus(a: u64, k: i32) -> Vec<i32> {
    out(a).iter().map(|v| v + k).collect()
}

#[test]
fn elf_single_dispatch_writes_the_pdi_device_address_and_runs() {
    for profile in FULL_ELF {
        let sim = Sim::new(profile);
        let q = sim.queue();
        let (e, pdi, a, b, ctrl) = setup(&sim, None);
        let sig = sim.signal(1);
        let args = [(a, NB), (b, NB)];
        q.submit(&[g2_bytes(&e.packet(&sim, ctrl, pdi, &args, sig))]);
        assert_eq!(q.errors(), vec![], "{profile}");
        assert_eq!(common::load_signal(sig), 0, "{profile}");
        assert_eq!(out(b), plus(a, 1), "{profile}");
        // The runtime wrote the PDI's device address at the site the packet named.
        let site = read(ctrl + u64::from(e.pdi_site), 8);
        let dev = u64::from_le_bytes(site.try_into().unwrap());
        assert_eq!(
            dev & !0x03FF_FFFF,
            DEVICE_HEAP_DEVICE_BASE,
            "{profile}: {dev:#x}"
        );
        assert_eq!(dev % 8, pdi % 8, "{profile}");
    }
}

#[test]
fn elf_repatch_one_control_code_buffer_gives_the_right_answer_every_time() {
    for profile in FULL_ELF {
        let sim = Sim::new(profile);
        let q = sim.queue();
        let e = elf(&add_one());
        let pdi = sim.put(HEAP, &e.pdi);
        let base = sim.alloc(HEAP, e.ctrl.len() + 2 * ALIGN_BYTES);
        let ctrl = base.next_multiple_of(ALIGN);
        for round in 0..4 {
            let input: Vec<i32> = (0..NI).map(|v| v + 1000 * round).collect();
            let (a, b) = io_i32(&sim, &input);
            common::write(ctrl, &e.patched(&[a, b]));
            let sig = sim.signal(1);
            let args = [(a, NB), (b, NB)];
            q.submit(&[g2_bytes(&e.packet(&sim, ctrl, pdi, &args, sig))]);
            assert_eq!(out(b), plus(a, 1), "{profile}, round {round}");
        }
        assert_eq!(q.errors(), vec![], "{profile}");
    }
}

#[test]
fn elf_full_queue_dispatch_is_one_chain_of_64_and_has_no_pdi_ceiling() {
    for profile in FULL_ELF {
        let sim = Sim::new(profile);
        let q = sim.queue();
        let e = elf(&add_one());
        let sig = sim.signal(64);
        let mut packets = Vec::new();
        let mut pairs = Vec::new();
        for _ in 0..64 {
            // A PDI copy each: 64 distinct PDIs, past the PDI path's 32.
            let pdi = sim.put(HEAP, &e.pdi);
            let input: Vec<i32> = (0..NI).collect();
            let (a, b) = io_i32(&sim, &input);
            let ctrl = e.place(&sim, &[a, b], 0);
            let args = [(a, NB), (b, NB)];
            packets.push(g2_bytes(&e.packet(&sim, ctrl, pdi, &args, sig)));
            pairs.push((a, b));
        }
        let before = counters();
        q.submit(&packets);
        assert_eq!(q.errors(), vec![], "{profile}");
        assert_eq!(common::load_signal(sig), 0, "{profile}");
        // 60 bytes a command: 68 fit the driver's chain buffer, so the queue tops out first.
        assert_eq!(counters().since(&before).chain_submissions, 1, "{profile}");
        for (a, b) in pairs {
            assert_eq!(out(b), plus(a, 1), "{profile}");
        }
    }
}

#[test]
fn mode_switch_alternating_batches_run_each_mode_on_one_queue() {
    for profile in FULL_ELF {
        let sim = Sim::new(profile);
        let q = sim.queue();
        let (e, pdi, _, _, _) = setup(&sim, None);
        let loaded = sim.load(&add_one());
        let before = counters();
        for (round, full) in [false, true, false, true].into_iter().enumerate() {
            let sig = sim.signal(2);
            let mut packets = Vec::new();
            let mut pairs = Vec::new();
            for _ in 0..2 {
                let input: Vec<i32> = (0..NI).map(|v| v * 3).collect();
                let (a, b) = io_i32(&sim, &input);
                let args = [(a, NB), (b, NB)];
                packets.push(if full {
                    let ctrl = e.place(&sim, &[a, b], 0);
                    g2_bytes(&e.packet(&sim, ctrl, pdi, &args, sig))
                } else {
                    g2_bytes(&g2_packet(&sim, &Dispatch::new(loaded, &args, sig)))
                });
                pairs.push((a, b));
            }
            q.submit(&packets);
            assert_eq!(q.errors(), vec![], "{profile}, batch {round}");
            for (a, b) in pairs {
                assert_eq!(out(b), plus(a, 1), "{profile}, batch {round}");
            }
        }
        assert_eq!(
            counters().since(&before).hw_context_mode_switches,
            3,
            "{profile}"
        );
    }
}

#[test]
fn elf_interleaved_kernels_run_each_against_its_own_control_code_and_pdi() {
    for profile in FULL_ELF {
        let sim = Sim::new(profile);
        let q = sim.queue();
        let add = elf(&add_one());
        let add_pdi = sim.put(HEAP, &add.pdi);
        let relu = elf(&EmuDesign::relu(256, DType::I32));
        let relu_pdi = sim.put(HEAP, &relu.pdi);
        let sig = sim.signal(8);
        let mut packets = Vec::new();
        let mut checks = Vec::new();
        for i in 0..4 {
            let input: Vec<i32> = (0..NI).map(|v| v - 100 - i).collect();
            for (e, pdi, is_add) in [(&add, add_pdi, true), (&relu, relu_pdi, false)] {
                let (a, b) = io_i32(&sim, &input);
                let ctrl = e.place(&sim, &[a, b], 0);
                let args = [(a, NB), (b, NB)];
                packets.push(g2_bytes(&e.packet(&sim, ctrl, pdi, &args, sig)));
                checks.push((a, b, is_add));
            }
        }
        q.submit(&packets);
        assert_eq!(q.errors(), vec![], "{profile}");
        for (a, b, is_add) in checks {
            let want: Vec<i32> = if is_add {
                plus(a, 1)
            } else {
                out(a).iter().map(|v| (*v).max(0)).collect()
            };
            assert_eq!(out(b), want, "{profile}");
        }
    }
}

/// A packet built by `make` from a good full-ELF dispatch (sentinel output), for a case.
fn elf_case(
    name: &'static str,
    want: Status,
    detail: &'static str,
    make: impl Fn(&Sim, &Elf, u64, u64, &[(u64, u64)]) -> AieDispatchPacket + 'static,
) -> Case {
    Case::one(name, want, &[detail], move |sim| {
        let (e, pdi, a, b, ctrl) = setup(sim, Some(-7));
        let args = [(a, NB), (b, NB)];
        g2_bytes(&make(sim, &e, ctrl, pdi, &args))
    })
}

fn sig0() -> Signal {
    Signal { handle: 0 }
}

#[test]
fn elf_malformed_packets_are_refused_before_anything_runs() {
    const FMT: Status = Status::ERROR_INVALID_PACKET_FORMAT;
    let cases = vec![
        elf_case(
            "null control code",
            FMT,
            "control code",
            |s, e, _, pdi, args| e.packet(s, 0, pdi, args, sig0()),
        ),
        elf_case(
            "zero insts_size",
            FMT,
            "PDI site",
            |s, e, ctrl, pdi, args| {
                let mut p = e.packet(s, ctrl, pdi, args, sig0());
                p.insts_size = 0;
                p
            },
        ),
        elf_case(
            "insts_size past the allocation",
            FMT,
            "past",
            |s, e, ctrl, pdi, args| {
                let mut p = e.packet(s, ctrl, pdi, args, sig0());
                p.insts_size += 1 << 20;
                p.reserved4 = 16;
                p
            },
        ),
        elf_case("null PDI", FMT, "PDI", |s, e, ctrl, _, args| {
            e.packet(s, ctrl, 0, args, sig0())
        }),
        elf_case(
            "PDI not in device memory",
            FMT,
            "device memory",
            |s, e, ctrl, _, args| {
                let host = s.put(DATA, &e.pdi);
                e.packet(s, ctrl, host, args, sig0())
            },
        ),
        elf_case(
            "PDI site past the control code",
            FMT,
            "PDI site",
            |s, e, ctrl, pdi, args| {
                let mut p = e.packet(s, ctrl, pdi, args, sig0());
                p.reserved4 = e.ctrl.len() as u64 - 4;
                p
            },
        ),
        elf_case(
            "PDI site misaligned",
            FMT,
            "PDI site",
            |s, e, ctrl, pdi, args| {
                let mut p = e.packet(s, ctrl, pdi, args, sig0());
                p.reserved4 += 1;
                p
            },
        ),
        elf_case(
            "misaligned control code",
            FMT,
            "16 KiB",
            |s, e, _, pdi, args| {
                let ctrl = e.place(s, &[args[0].0, args[1].0], 4096);
                e.packet(s, ctrl, pdi, args, sig0())
            },
        ),
        elf_case(
            "host-only control code",
            FMT,
            "device memory",
            |s, e, _, pdi, args| {
                let ctrl = s.put(DATA, &e.patched(&[args[0].0, args[1].0]));
                e.packet(s, ctrl, pdi, args, sig0())
            },
        ),
        elf_case(
            "unknown control code",
            Status::ERROR_INVALID_ALLOCATION,
            "not an allocation",
            |s, e, _, pdi, args| e.packet(s, 0x1000, pdi, args, sig0()),
        ),
    ];
    fails_on(
        "elf_malformed_packets_are_refused_before_anything_runs",
        &FULL_ELF,
        &cases,
    );
}

#[test]
fn mixed_mode_batch_rejected_and_neither_packet_runs() {
    for profile in FULL_ELF {
        let sim = Sim::new(profile);
        let q = sim.queue();
        let (e, pdi, a, b, ctrl) = setup(&sim, Some(-7));
        let loaded = sim.load(&add_one());
        let (c, d) = io_i32(&sim, &(0..NI).collect::<Vec<_>>());
        common::write(d, &common::i32_bytes(&vec![-7; N]));
        let sig = sim.signal(2);
        let args = [(a, NB), (b, NB)];
        let pdi_args = [(c, NB), (d, NB)];
        q.submit(&[
            g2_bytes(&g2_packet(&sim, &Dispatch::new(loaded, &pdi_args, sig))),
            g2_bytes(&e.packet(&sim, ctrl, pdi, &args, sig)),
        ]);
        assert_eq!(
            q.errors(),
            vec![Status::ERROR_INVALID_PACKET_FORMAT],
            "{profile}"
        );
        assert_eq!(
            (q.read_index(), common::load_signal(sig)),
            (0, 2),
            "{profile}"
        );
        assert_eq!(out(b), vec![-7; N], "{profile}");
        assert_eq!(out(d), vec![-7; N], "{profile}");
        // A fresh queue still runs the PDI packet.
        let q = sim.queue();
        let sig = sim.signal(1);
        q.submit(&[g2_bytes(&g2_packet(
            &sim,
            &Dispatch::new(loaded, &pdi_args, sig),
        ))]);
        assert_eq!(out(d), plus(c, 1), "{profile}");
    }
}

#[test]
fn full_elf_needs_an_aie2p_agent() {
    for profile in FULL_ELF {
        let sim = Sim::with(SimConfig {
            profile,
            agent: NpuGen::Npu1,
            timeout: std::time::Duration::from_millis(100),
            ..SimConfig::default()
        });
        let q = sim.queue();
        let (e, pdi, a, b, ctrl) = setup(&sim, Some(-7));
        let args = [(a, NB), (b, NB)];
        q.submit(&[g2_bytes(&e.packet(&sim, ctrl, pdi, &args, sig0()))]);
        assert_eq!(
            q.errors(),
            vec![Status::ERROR_INVALID_PACKET_FORMAT],
            "{profile}"
        );
        assert!(
            hsa_sim::last_error().unwrap_or_default().contains("aie2p"),
            "{profile}: {:?}",
            hsa_sim::last_error()
        );
        assert_eq!(out(b), vec![-7; N], "{profile}");
    }
}

#[test]
fn the_first_g2_release_reads_word_56_as_reserved_and_runs_the_control_code_as_instructions() {
    // Its driver has no full-ELF path: the packet is PDI + insts, the control code is no
    // instruction stream the device can run, and a failed batch aborts the process there.
    let cases = vec![elf_case(
        "full-ELF packet on the first G2 release",
        Status::ERROR,
        "",
        |s, e, ctrl, pdi, args| e.packet(s, ctrl, pdi, args, sig0()),
    )];
    fails_on(
        "the_first_g2_release_reads_word_56_as_reserved_and_runs_the_control_code_as_instructions",
        &[Profile::RocrG2May2026],
        &cases,
    );
}

#[test]
fn control_code_naming_memory_outside_every_buffer_is_a_device_error_not_an_empty_input() {
    // The application patches the argument addresses into the control code itself: one that
    // points past its buffers makes the NPU's DMA fault, so the dispatch fails and writes
    // nothing (never a kernel run on no input).
    for profile in FULL_ELF {
        let sim = Sim::new(profile);
        let q = sim.queue();
        let (e, pdi, a, b, _) = setup(&sim, Some(-7));
        let stray = e.place(&sim, &[1 << 46, b], 0);
        let sig = sim.signal(1);
        q.submit(&[g2_bytes(&e.packet(
            &sim,
            stray,
            pdi,
            &[(a, NB), (b, NB)],
            sig,
        ))]);
        assert_eq!(q.errors(), vec![Status::ERROR], "{profile}");
        assert_eq!(out(b), vec![-7; N], "{profile}: the output was written");
    }
}

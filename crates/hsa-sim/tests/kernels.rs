//! Each reference kernel, dispatched through the C functions, against an independently
//! computed expectation.

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::*;
use half::bf16;
use hsa_sim::{PacketAbi, Profile};
use npu_artifacts::emu::{DType, EmuDesign};

/// Runs `design` once on a G2 queue with `args` and checks the batch succeeded.
fn run(sim: &Sim, design: &EmuDesign, args: &[(u64, u64)]) {
    let loaded = sim.load(design);
    let sig = sim.signal(1);
    let q = sim.queue();
    q.submit(&[sim.packet(&Dispatch::new(loaded, args, sig))]);
    assert_eq!(q.errors(), vec![], "{:?}", hsa_sim::last_error());
    assert_eq!(load_signal(sig), 0);
    assert_eq!(q.read_index(), 1);
}

#[test]
fn vector_scalar_add_1024_i32_is_in_plus_one() {
    let sim = Sim::new(Profile::RocrNewest);
    let input: Vec<i32> = (1..=1024).collect();
    let (a, b) = io_i32(&sim, &input);
    run(
        &sim,
        &EmuDesign::vector_scalar_add(1024, DType::I32, 1),
        &[(a, 4096), (b, 4096)],
    );
    let out = bytes_i32(&read(b, 4096));
    assert!(out.iter().enumerate().all(|(i, &v)| v == i as i32 + 2));
}

#[test]
fn vector_scalar_add_runs_on_every_packet_generation() {
    for profile in profiles::ALL {
        let abi = profile.packet_abi();
        let sim = Sim::new(profile);
        let input: Vec<i32> = (0..256).map(|i| i * 5 - 300).collect();
        let (a, b) = io_i32(&sim, &input);
        let loaded = sim.load(&EmuDesign::vector_scalar_add(256, DType::I32, 7));
        let sig = sim.signal(1);
        let q = sim.queue();
        q.submit(&[sim.packet(&Dispatch::new(loaded, &[(a, 1024), (b, 1024)], sig))]);
        assert_eq!(q.errors(), vec![], "{abi:?}: {:?}", hsa_sim::last_error());
        let want: Vec<i32> = input.iter().map(|x| x + 7).collect();
        assert_eq!(bytes_i32(&read(b, 1024)), want, "{abi:?}");
        // G1a has no completion signal: the doorbell's return is the completion.
        assert_eq!(
            load_signal(sig),
            if abi == PacketAbi::G1a { 1 } else { 0 },
            "{abi:?}"
        );
    }
}

#[test]
fn passthrough_copies_bytes_with_an_unused_third_buffer() {
    let sim = Sim::new(Profile::RocrNewest);
    let input: Vec<u8> = (1..=4096u32).map(|i| i as u8).collect();
    let a = sim.put(DATA, &input);
    let b = sim.alloc(DATA, 4096);
    let trace = sim.alloc(DATA, 4096);
    run(
        &sim,
        &EmuDesign::passthrough(4096),
        &[(a, 4096), (b, 4096), (trace, 4096)],
    );
    assert_eq!(read(b, 4096), input);
}

#[test]
fn vector_vector_add_and_mul_wrap_like_i32() {
    let sim = Sim::new(Profile::RocrNewest);
    let x: Vec<i32> = (0..64).map(|i| i * 1_000_003 - i32::MAX / 2).collect();
    let y: Vec<i32> = (0..64).map(|i| i32::MAX - i * 77).collect();
    let (a, b, c) = (
        sim.put(DATA, &i32_bytes(&x)),
        sim.put(DATA, &i32_bytes(&y)),
        sim.alloc(DATA, 256),
    );
    let args = [(a, 256), (b, 256), (c, 256)];
    run(&sim, &EmuDesign::vector_vector_add(64, DType::I32), &args);
    let want: Vec<i32> = x.iter().zip(&y).map(|(p, q)| p.wrapping_add(*q)).collect();
    assert_eq!(bytes_i32(&read(c, 256)), want);
    run(&sim, &EmuDesign::vector_mul(64, DType::I32), &args);
    let want: Vec<i32> = x.iter().zip(&y).map(|(p, q)| p.wrapping_mul(*q)).collect();
    assert_eq!(bytes_i32(&read(c, 256)), want);
}

fn i16_bytes(v: &[i16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_i16(b: &[u8]) -> Vec<i16> {
    b.chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// IRON's `basic/vector_scalar_mul`: 4096 i16 elements (its `-i1s 8192`) times the i32 factor
/// its host scripts put in a one-element buffer, in both buffer orders IRON's scripts pass
/// (in, out, factor and in, factor, out). The factor is read when the batch runs: a second
/// dispatch after the host rewrites it multiplies by the new one.
#[test]
fn vector_scale_multiplies_by_the_factor_buffer_in_both_iron_orders() {
    let sim = Sim::new(Profile::RocrNewest);
    let x: Vec<i16> = (1..=4096).map(|i| (i * 7 - 9000) as i16).collect();
    let a = sim.put(DATA, &i16_bytes(&x));
    let factor = sim.put(DATA, &3i32.to_le_bytes());
    let out = sim.alloc(DATA, 8192);
    let want = |f: i16| -> Vec<i16> { x.iter().map(|v| v.wrapping_mul(f)).collect() };

    run(
        &sim,
        &EmuDesign::vector_scale(4096, DType::I16),
        &[(a, 8192), (out, 8192), (factor, 4)],
    );
    assert_eq!(bytes_i16(&read(out, 8192)), want(3));
    // The factor is the buffer's content at run time, not part of the design.
    write(factor, &(-5i32).to_le_bytes());
    run(
        &sim,
        &EmuDesign::vector_scale(4096, DType::I16),
        &[(a, 8192), (out, 8192), (factor, 4)],
    );
    assert_eq!(bytes_i16(&read(out, 8192)), want(-5));

    let out2 = sim.alloc(DATA, 8192);
    run(
        &sim,
        &EmuDesign::vector_scale_mid(4096, DType::I16),
        &[(a, 8192), (factor, 4), (out2, 8192)],
    );
    assert_eq!(bytes_i16(&read(out2, 8192)), want(-5));
    // The inputs are unchanged.
    assert_eq!(bytes_i16(&read(a, 8192)), x);
    assert_eq!(read(factor, 4), (-5i32).to_le_bytes());

    // i32 elements wrap like i32.
    let y: Vec<i32> = vec![i32::MAX, -7, 1 << 30, 0];
    let (b, c) = (sim.put(DATA, &i32_bytes(&y)), sim.alloc(DATA, 16));
    write(factor, &4i32.to_le_bytes());
    run(
        &sim,
        &EmuDesign::vector_scale(4, DType::I32),
        &[(b, 16), (c, 16), (factor, 4)],
    );
    let want: Vec<i32> = y.iter().map(|v| v.wrapping_mul(4)).collect();
    assert_eq!(bytes_i32(&read(c, 16)), want);
}

/// IRON's `algorithms/for_each.py` (`a + 1` on one int32 buffer in place) and
/// `test/npu-xrt/add_one_objFifo` (u32 `out = in + 41` with an unused second buffer).
#[test]
fn vector_scalar_add_in_place_and_with_an_unused_buffer() {
    let sim = Sim::new(Profile::RocrNewest);
    let x: Vec<i32> = (0..1024).map(|i| i * 3 - 100).collect();
    let inout = sim.put(DATA, &i32_bytes(&x));
    run(
        &sim,
        &EmuDesign::vector_scalar_add_inplace(1024, DType::I32, 1),
        &[(inout, 4096)],
    );
    let want: Vec<i32> = x.iter().map(|v| v + 1).collect();
    assert_eq!(bytes_i32(&read(inout, 4096)), want);

    let a: Vec<u8> = (1..=64u32).flat_map(u32::to_le_bytes).collect();
    let (a, unused, out) = (
        sim.put(DATA, &a),
        sim.put(DATA, &[0xa5; 256]),
        sim.alloc(DATA, 256),
    );
    run(
        &sim,
        &EmuDesign::vector_scalar_add_unused(64, DType::U32, 41),
        &[(a, 256), (unused, 256), (out, 256)],
    );
    let want: Vec<i32> = (42..=105).collect();
    assert_eq!(bytes_i32(&read(out, 256)), want);
    assert_eq!(read(unused, 256), vec![0xa5; 256]);
}

#[test]
fn relu_clamps_negative_ints_and_floats() {
    let sim = Sim::new(Profile::RocrNewest);
    let x: Vec<i32> = (-32..32).collect();
    let (a, b) = io_i32(&sim, &x);
    run(
        &sim,
        &EmuDesign::relu(64, DType::I32),
        &[(a, 256), (b, 256)],
    );
    assert_eq!(
        bytes_i32(&read(b, 256)),
        x.iter().map(|v| (*v).max(0)).collect::<Vec<_>>()
    );

    let f: Vec<f32> = (-8..8).map(|i| i as f32 * 0.75).collect();
    let fa = sim.put(
        DATA,
        &f.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    let fb = sim.alloc(DATA, 64);
    run(
        &sim,
        &EmuDesign::relu(16, DType::F32),
        &[(fa, 64), (fb, 64)],
    );
    let out: Vec<f32> = read(fb, 64)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(out, f.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());

    let h: Vec<bf16> = (-8..8).map(|i| bf16::from_f32(i as f32 * 1.5)).collect();
    let ha = sim.put(
        DATA,
        &h.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    let hb = sim.alloc(DATA, 32);
    run(
        &sim,
        &EmuDesign::relu(16, DType::Bf16),
        &[(ha, 32), (hb, 32)],
    );
    let out: Vec<f32> = read(hb, 32)
        .chunks_exact(2)
        .map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f32())
        .collect();
    assert_eq!(
        out,
        h.iter().map(|v| v.to_f32().max(0.0)).collect::<Vec<_>>()
    );
}

/// A small deterministic generator (no dependency needed for test data).
fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

#[test]
fn matmul_i16_to_i32_matches_a_naive_loop_and_wraps() {
    let sim = Sim::new(Profile::RocrNewest);
    let (m, k, n) = (8usize, 16usize, 12usize);
    let mut seed = 7;
    // IRON draws int16 as rand() % 0x10000: the full range, so sums overflow i32.
    let a: Vec<i16> = (0..m * k).map(|_| lcg(&mut seed) as u16 as i16).collect();
    let b: Vec<i16> = (0..k * n).map(|_| lcg(&mut seed) as u16 as i16).collect();
    let pa = sim.put(
        DATA,
        &a.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    let pb = sim.put(
        DATA,
        &b.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    let pc = sim.alloc(DATA, m * n * 4);
    let design = EmuDesign::matmul(m as u32, k as u32, n as u32, DType::I16, DType::I32);
    run(
        &sim,
        &design,
        &[
            (pa, (m * k * 2) as u64),
            (pb, (k * n * 2) as u64),
            (pc, (m * n * 4) as u64),
        ],
    );
    let c = bytes_i32(&read(pc, m * n * 4));
    for i in 0..m {
        for j in 0..n {
            let want = (0..k).fold(0i32, |acc, p| {
                acc.wrapping_add(i32::from(a[i * k + p]).wrapping_mul(i32::from(b[p * n + j])))
            });
            assert_eq!(c[i * n + j], want, "C[{i}][{j}]");
        }
    }
}

#[test]
fn matmul_bf16_to_f32_is_within_irons_tolerance() {
    let sim = Sim::new(Profile::RocrNewest);
    let (m, k, n) = (4usize, 32usize, 8usize);
    let mut seed = 11;
    // IRON draws bf16 uniformly in [0, 4).
    let mut draw = || bf16::from_f32((lcg(&mut seed) % 4096) as f32 / 1024.0);
    let a: Vec<bf16> = (0..m * k).map(|_| draw()).collect();
    let b: Vec<bf16> = (0..k * n).map(|_| draw()).collect();
    let pa = sim.put(
        DATA,
        &a.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    let pb = sim.put(
        DATA,
        &b.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    let pc = sim.alloc(DATA, m * n * 4);
    let design = EmuDesign::matmul(m as u32, k as u32, n as u32, DType::Bf16, DType::F32);
    run(
        &sim,
        &design,
        &[
            (pa, (m * k * 2) as u64),
            (pb, (k * n * 2) as u64),
            (pc, (m * n * 4) as u64),
        ],
    );
    let c: Vec<f32> = read(pc, m * n * 4)
        .chunks_exact(4)
        .map(|x| f32::from_le_bytes(x.try_into().unwrap()))
        .collect();
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p].to_f32()) * f64::from(b[p * n + j].to_f32()))
                .sum();
            let got = f64::from(c[i * n + j]);
            // iron-host.md §5: |a-b| < max(abs_tol 0.5, rel_tol 0.05 · (|a|+|b|)).
            assert!(
                (got - want).abs() < 0.5f64.max(0.05 * (got.abs() + want.abs())),
                "C[{i}][{j}] {got} vs {want}"
            );
        }
    }
}

#[test]
fn noop_runs_and_changes_nothing() {
    let sim = Sim::new(Profile::RocrNewest);
    let a = sim.put(DATA, &[9u8; 64]);
    let b = sim.put(DATA, &[5u8; 64]);
    run(&sim, &EmuDesign::noop(2, 64), &[(a, 64), (b, 64)]);
    assert_eq!(read(a, 64), vec![9u8; 64]);
    assert_eq!(read(b, 64), vec![5u8; 64]);
}

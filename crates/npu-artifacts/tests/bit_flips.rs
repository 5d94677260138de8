//! Every single-bit mutant of streams shaped like aiecc's: the parser must never accept one in
//! which a DDR_PATCH runs before anything gave the patched shim BD a non-zero transfer length.
//!
//! Whether a patch has a length is decided here by a walker of this file's own (the current
//! format's layout table and the register effects of WRITE, BLOCKWRITE and MASKWRITE), not by
//! the parser's bookkeeping, so the count means something even if that bookkeeping is wrong.

use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};
use npu_artifacts::txn::{TxnBuilder, TxnProgram};
use std::collections::HashMap;

/// The shape mlir-aie's lowering gives a two-buffer design (its `add_one_two` test data): per
/// buffer, a BLOCKWRITE of the whole shim BD with the length in word 0, a DDR_PATCH of the BD's
/// base-address word, a WRITE that pushes the BD onto a DMA channel's task queue; then a TCT.
fn aiecc_shaped(generation: NpuGen) -> Vec<u8> {
    let mut b = TxnBuilder::new(generation);
    b.shim_buffer(0, 1, 2, 256)
        .write(TxnBuilder::reg(0, 0, 0x1D204), 0x8000_0001)
        .shim_buffer(0, 0, 0, 256)
        .write(TxnBuilder::reg(0, 0, 0x1D214), 0)
        .sync(0, 0, 0, 0);
    b.finish()
}

fn word(bytes: &[u8], i: usize) -> u32 {
    let b = &bytes[i * 4..i * 4 + 4];
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Op indices of the DDR_PATCHes in a current-format (0.1) stream whose BD length word (the
/// patched register − 4) no earlier WRITE, BLOCKWRITE or MASKWRITE set to a non-zero value.
/// The stream must be well framed (the parser accepted it).
fn patches_without_length(bytes: &[u8]) -> Vec<usize> {
    assert_eq!(
        &bytes[0..2],
        &[0, 1],
        "only current-format streams are walked here"
    );
    let words = bytes.len() / 4;
    let mut regs: HashMap<u32, u32> = HashMap::new();
    let mut missing = Vec::new();
    let (mut at, mut index) = (4, 0);
    while at < words {
        let w = |i: usize| word(bytes, at + i);
        let len_words = match w(0) & 0xFF {
            0x00 => {
                regs.insert(w(2), w(4));
                6
            }
            0x01 => {
                let n = w(3) as usize / 4;
                let mut addr = w(2);
                for k in 4..n {
                    regs.insert(addr, w(k));
                    addr = addr.wrapping_add(4);
                }
                n
            }
            0x03 => {
                let (addr, value, mask) = (w(2), w(4), w(5));
                match regs.get_mut(&addr) {
                    Some(old) => *old = (*old & !mask) | (value & mask),
                    None if mask == u32::MAX => {
                        regs.insert(addr, value);
                    }
                    None => {}
                }
                w(6) as usize / 4
            }
            0x04 | 0x07 => w(6) as usize / 4,
            0x05 | 0x06 => 1,
            0x08 => 4,
            0x09 => 2,
            0x80 | 0x82 | 0x84 | 0x83 => w(1) as usize / 4,
            0x81 => {
                let len = regs.get(&w(6).wrapping_sub(4)).copied().unwrap_or(0);
                if len == 0 {
                    missing.push(index);
                }
                12
            }
            other => panic!("opcode {other:#04x} in an accepted stream"),
        };
        at += len_words;
        index += 1;
    }
    missing
}

/// (mutants accepted, accepted mutants with a patch that has no BD length).
fn flip_every_bit(stream: &[u8]) -> (usize, usize) {
    assert!(patches_without_length(stream).is_empty());
    TxnProgram::parse(stream).unwrap();
    let (mut accepted, mut without_length) = (0, 0);
    for bit in 0..stream.len() * 8 {
        let mut m = stream.to_vec();
        m[bit / 8] ^= 1 << (bit % 8);
        if TxnProgram::parse(&m).is_ok() {
            accepted += 1;
            if !patches_without_length(&m).is_empty() {
                without_length += 1;
            }
        }
    }
    (accepted, without_length)
}

#[test]
fn no_single_bit_mutant_patches_a_bd_without_a_length() {
    let streams = [
        ("aiecc-shaped npu1", aiecc_shaped(NpuGen::Npu1)),
        ("aiecc-shaped npu2", aiecc_shaped(NpuGen::Npu2)),
        (
            "emulated vector_scalar_add npu1",
            EmuDesign::vector_scalar_add(1024, DType::I32, 1).insts(NpuGen::Npu1),
        ),
        (
            "emulated noop (8 buffers) npu2",
            EmuDesign::noop(8, 4096).insts(NpuGen::Npu2),
        ),
    ];
    let mut report = Vec::new();
    let mut total_without_length = 0;
    for (name, stream) in &streams {
        let (accepted, without_length) = flip_every_bit(stream);
        report.push(format!(
            "{name}: {} mutants, {accepted} accepted, {without_length} of them patch a BD with no length",
            stream.len() * 8
        ));
        total_without_length += without_length;
    }
    let report = report.join("\n");
    println!("{report}");
    assert_eq!(total_without_length, 0, "\n{report}");
}

//! TXN streams built word by word from the layout tables: every valid form is accepted, both
//! header versions parse, and every validation rule rejects its own malformed case with its own
//! message.

use npu_artifacts::txn::{TxnProgram, listing};
use npu_artifacts::{ArtifactError, NpuGen};

const CURRENT: (u8, u8) = (0, 1);
const OLDER: (u8, u8) = (1, 0);

/// A stream with a correct header (op count and size) around `ops`.
fn stream(version: (u8, u8), dev_gen: u8, ops: &[&[u32]]) -> Vec<u8> {
    let body: Vec<u32> = ops.iter().flat_map(|op| op.iter().copied()).collect();
    let n_ops = u32::try_from(ops.len()).unwrap();
    let size = u32::try_from((body.len() + 4) * 4).unwrap();
    let w0 = u32::from_le_bytes([version.0, version.1, dev_gen, 6]);
    let w1 = u32::from_le_bytes([4, 1, 0, 0]);
    [w0, w1, n_ops, size]
        .iter()
        .chain(&body)
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

fn cur(ops: &[&[u32]]) -> Vec<u8> {
    stream(CURRENT, 3, ops)
}

fn err(bytes: &[u8]) -> String {
    TxnProgram::parse(bytes).unwrap_err().to_string()
}

/// Shim BD 2 of column 1, word 0 (length) and word 1 (address low, the patched register).
const BD2: u32 = (1 << 25) | 0x1D040;

fn write(addr: u32, value: u32) -> [u32; 6] {
    [0, 0, addr, 0, value, 24]
}

fn patch(reg: u32, arg: u32, plus: u32) -> [u32; 12] {
    [0x81, 48, 0, 0, 0, 0, reg, 0, arg, 0, plus, 0]
}

fn blockwrite(col: u32, row: u32, addr: u32, data: &[u32]) -> Vec<u32> {
    let size = u32::try_from((4 + data.len()) * 4).unwrap();
    let mut w = vec![1, col | (row << 8), addr, size];
    w.extend_from_slice(data);
    w
}

// ---------------------------------------------------------------- valid forms

#[test]
fn every_supported_current_op_is_accepted() {
    let bw = blockwrite(1, 0, BD2, &[256, 0, 0, 0, 0, 0, 0, 0]);
    let bytes = cur(&[
        &write(0x0220_0000, 1),
        &[3, 0, 0x0010_0010, 0, 5, 0xF, 28],
        &[3, 0, 0x0010_0014, 0, 5, 0xF, 32, 0], // aie-rt's naturally aligned 8-word form
        &[4, 0, 0x0010_0018, 0, 1, 1, 28],
        &[7, 0, 0x0010_0018, 0, 1, 1, 28],
        &bw,
        &[5],
        &[6 | (2 << 8)],
        &[8 | (1 << 16), 4096, 0x1000, 0],
        &[9 | (3 << 8), 7],
        &[0x80, 16, 0x0001_0000, 0x0101_0100],
        &patch(BD2 + 4, 0, 64),
        &[0x82, 16, 1, 0x1D004],
        &[0x83, 12, 9],
        &[0x84, 12, 2],
    ]);
    let p = TxnProgram::parse(&bytes).unwrap();
    assert_eq!(p.version, CURRENT);
    assert_eq!(p.generation, NpuGen::Npu1);
    assert_eq!((p.rows, p.cols, p.mem_tile_rows), (6, 4, 1));
    assert_eq!(p.op_count, 15);
    assert_eq!(p.size_bytes as usize, bytes.len());
    assert_eq!(p.arg_count(), 1);
    let patch = &p.args[0].patches[0];
    assert_eq!(patch.op_index, 11);
    assert_eq!(patch.reg_addr, BD2 + 4);
    assert_eq!((patch.offset, patch.folded), (64, false));
    assert_eq!(patch.bd_len_bytes, 1024);
    assert_eq!(p.min_arg_sizes(), vec![64 + 1024]);
    let text = listing(&bytes).unwrap();
    assert_eq!(text.lines().count(), 1 + 15 + 2);
    for name in [
        "WRITE",
        "MASKWRITE",
        "MASKPOLL",
        "MASKPOLL_BUSY",
        "BLOCKWRITE",
        "NOOP",
        "PREEMPT",
        "LOADPDI",
        "LOAD_PM_START",
        "TCT",
        "DDR_PATCH",
        "READ_REGS",
        "RECORD_TIMER",
        "MERGE_SYNC",
    ] {
        assert!(
            text.contains(&format!("  {name} ")),
            "{name} missing from\n{text}"
        );
    }
}

#[test]
fn older_format_parses() {
    let bytes = stream(
        OLDER,
        3,
        &[
            &[0, 0x0220_0000, 1],
            &[3, 0x0010_0010, 5, 0xF],
            &[1, BD2, 5 * 4, 128, 0],
            &[0x80, 16, 0, 0x0101_0100],
            &[0x81, 24, BD2 + 4, 6, 0x8000_0010, 0],
        ],
    );
    let p = TxnProgram::parse(&bytes).unwrap();
    assert_eq!(p.version, OLDER);
    assert_eq!(p.op_count, 5);
    assert_eq!(p.arg_count(), 7);
    let patch = &p.args[0].patches[0];
    assert_eq!((p.args[0].index, patch.offset, patch.folded), (6, 16, true));
    assert_eq!(patch.bd_len_bytes, 512);
    assert_eq!(p.min_arg_size(6), 16 + 512);
    assert_eq!(p.min_arg_size(0), 0);
    assert!(
        listing(&bytes)
            .unwrap()
            .starts_with("TXN 1.0 for npu1 (aie2)")
    );
}

#[test]
fn npu2_header_and_empty_program() {
    let p = TxnProgram::parse(&stream(CURRENT, 4, &[])).unwrap();
    assert_eq!(p.generation, NpuGen::Npu2);
    assert_eq!((p.op_count, p.size_bytes, p.arg_count()), (0, 16, 0));
    assert!(p.min_arg_sizes().is_empty());
}

// ---------------------------------------------------------------- BD lengths

/// Word 0 of BD 2 of column 1 holds its transfer length in 32-bit words.
const BD2_LEN: u32 = BD2;

fn maskwrite(addr: u32, value: u32, mask: u32) -> [u32; 7] {
    [3, 0, addr, 0, value, mask, 28]
}

fn lengths(bytes: &[u8]) -> Vec<u64> {
    let p = TxnProgram::parse(bytes).unwrap();
    p.args
        .iter()
        .flat_map(|a| a.patches.iter().map(|p| p.bd_len_bytes))
        .collect()
}

#[test]
fn bd_length_comes_from_the_latest_write_before_the_patch() {
    let p = TxnProgram::parse(&cur(&[
        &write(BD2_LEN, 10),
        &maskwrite(BD2_LEN, 0x100, 0xF00), // length becomes 0x100 | 10
        &patch(BD2 + 4, 1, 8),
        &write(BD2_LEN, 1000),
        &patch(BD2 + 4, 1, 4000),
        &write(BD2_LEN, 2),
        &patch(BD2 + 4, 1, 0),
    ]))
    .unwrap();
    let got: Vec<_> = p.args[0].patches.iter().map(|p| p.bd_len_bytes).collect();
    assert_eq!(got, vec![0x10A * 4, 4000, 8]);
    assert_eq!(p.min_arg_size(1), 8000);
    assert_eq!(p.min_arg_sizes(), vec![0, 8000]);
    assert!(matches!(
        p.check_buffers(&[0, 7999]),
        Err(ArtifactError::BufferTooSmall {
            index: 1,
            needed: 8000,
            op_index: 4,
            ..
        })
    ));
}

#[test]
fn blockwrite_write_and_maskwrite_each_set_a_length() {
    let bw = blockwrite(1, 0, BD2, &[16, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(lengths(&cur(&[&bw, &patch(BD2 + 4, 0, 0)])), vec![64]);
    // A BLOCKWRITE that starts earlier and runs over word 0 sets it too.
    let bw = blockwrite(1, 0, BD2 - 8, &[7, 7, 16, 0]);
    assert_eq!(lengths(&cur(&[&bw, &patch(BD2 + 4, 0, 0)])), vec![64]);
    assert_eq!(
        lengths(&cur(&[&write(BD2_LEN, 16), &patch(BD2 + 4, 0, 0)])),
        vec![64]
    );
    assert_eq!(
        lengths(&cur(&[
            &maskwrite(BD2_LEN, 16, u32::MAX),
            &patch(BD2 + 4, 0, 0)
        ])),
        vec![64]
    );
    // The older format's forms.
    assert_eq!(
        lengths(&stream(
            OLDER,
            3,
            &[&[0, BD2_LEN, 16], &[0x81, 24, BD2 + 4, 0, 0, 0]]
        )),
        vec![64]
    );
    assert_eq!(
        lengths(&stream(
            OLDER,
            3,
            &[&[3, BD2_LEN, 16, u32::MAX], &[0x81, 24, BD2 + 4, 0, 0, 0]]
        )),
        vec![64]
    );
}

#[test]
fn patch_of_a_bd_the_stream_never_gave_a_length() {
    assert_eq!(
        err(&cur(&[&[5], &patch(BD2 + 4, 0, 0)])),
        "TXN op 1 (DDR_PATCH) at byte offset 20: argument 0 is patched into register 0x0201d044, \
         but no earlier op wrote the length word of that shim BD (0x0201d040, the patched \
         register - 4); expected an earlier WRITE, BLOCKWRITE or full-mask MASKWRITE to set it to \
         a non-zero transfer length in 32-bit words, as aiecc's lowering writes the whole BD \
         before every patch (without a length the DMA moves whatever the BD holds, past the \
         buffer); rebuild insts.bin with aiecc, or write the BD's length before the patch"
    );
    let refused = |bytes: &[u8]| {
        matches!(
            TxnProgram::parse(bytes),
            Err(ArtifactError::TxnPatchWithoutLength {
                written_zero: false,
                ..
            })
        )
    };
    // Older format.
    assert!(refused(&stream(OLDER, 3, &[&[0x81, 24, BD2 + 4, 0, 0, 0]])));
    // The length comes after the patch.
    assert!(refused(&cur(&[&patch(BD2 + 4, 0, 0), &write(BD2_LEN, 16)])));
    // A BLOCKWRITE from the patched register on leaves word 0 unwritten.
    assert!(refused(&cur(&[
        &blockwrite(1, 0, BD2 + 4, &[0, 0, 0, 0, 0, 0, 0]),
        &patch(BD2 + 4, 0, 0)
    ])));
    // Another BD's length, or the same BD in another column or row, is not this BD's.
    assert!(refused(&cur(&[
        &write(BD2_LEN + 0x20, 16),
        &write(BD2_LEN - (1 << 25), 16),
        &write(BD2_LEN | (2 << 20), 16),
        &patch(BD2 + 4, 0, 0)
    ])));
    // A MASKWRITE of some bits of an unwritten word leaves the rest unknown.
    assert!(refused(&cur(&[
        &maskwrite(BD2_LEN, 16, 0xFFFF),
        &patch(BD2 + 4, 0, 0)
    ])));
}

#[test]
fn patch_of_a_bd_whose_length_is_zero() {
    let zero = |bytes: &[u8]| {
        let e = TxnProgram::parse(bytes).unwrap_err();
        assert!(
            matches!(
                e,
                ArtifactError::TxnPatchWithoutLength {
                    written_zero: true,
                    ..
                }
            ),
            "{e}"
        );
        e.to_string()
    };
    let e = zero(&cur(&[
        &blockwrite(1, 0, BD2, &[0, 0, 0, 0, 0, 0, 0, 0]),
        &patch(BD2 + 4, 0, 0),
    ]));
    assert!(
        e.starts_with(
            "TXN op 1 (DDR_PATCH) at byte offset 64: argument 0 is patched into register \
             0x0201d044, but the stream last wrote 0 to the length word of that shim BD"
        ),
        "{e}"
    );
    zero(&cur(&[&write(BD2_LEN, 0), &patch(BD2 + 4, 0, 0)]));
    // A length cleared after it was set.
    zero(&cur(&[
        &write(BD2_LEN, 16),
        &maskwrite(BD2_LEN, 0, 0xFF),
        &patch(BD2 + 4, 0, 0),
    ]));
    zero(&cur(&[
        &write(BD2_LEN, 16),
        &patch(BD2 + 4, 0, 0),
        &write(BD2_LEN, 0),
        &patch(BD2 + 4, 0, 0),
    ]));
}

// ---------------------------------------------------------------- stream-level rules

#[test]
fn too_short() {
    assert_eq!(
        err(&[0; 12]),
        "insts.bin is 12 bytes; expected at least 16 (the TXN header is 4 words)"
    );
}

#[test]
fn not_whole_words() {
    let mut b = cur(&[]);
    b.push(0);
    assert_eq!(
        err(&b),
        "insts.bin is 17 bytes; expected a multiple of 4 (the stream is 32-bit words)"
    );
}

#[test]
fn header_size_disagrees_with_length() {
    let mut b = cur(&[&[5]]);
    b[12] = 24;
    assert_eq!(
        err(&b),
        "TXN header (byte offset 12) declares 24 bytes but the stream is 20 bytes; the file is \
         truncated, padded or not a TXN stream"
    );
}

#[test]
fn unknown_version() {
    assert_eq!(
        err(&stream((0, 2), 3, &[])),
        "TXN header (byte offset 0) has version 0.2; expected 0.1 (current) or 1.0 (older)"
    );
}

#[test]
fn unknown_generation() {
    assert_eq!(
        err(&stream(CURRENT, 2, &[])),
        "TXN header (byte offset 2) has device generation 2; expected 3 (npu1, aie2) or 4 (npu2, aie2p)"
    );
}

#[test]
fn fewer_ops_declared_than_present() {
    let mut b = cur(&[&[5], &[5]]);
    b[8] = 1;
    assert_eq!(
        err(&b),
        "TXN header (byte offset 8) declares 1 ops but 4 bytes remain at byte offset 20, after op 0"
    );
    b[8] = 0;
    assert_eq!(
        err(&b),
        "TXN header (byte offset 8) declares 0 ops but 8 bytes remain at byte offset 16, after the header"
    );
}

#[test]
fn more_ops_declared_than_present() {
    let mut b = cur(&[&[5]]);
    b[8] = 3;
    assert_eq!(
        err(&b),
        "TXN header (byte offset 8) declares 3 ops but the stream ends at byte offset 20 after 1 ops"
    );
}

// ---------------------------------------------------------------- op-level rules

#[test]
fn unknown_opcode() {
    assert_eq!(
        err(&cur(&[&[5], &[0x1234_5610]])),
        "TXN op 1 at byte offset 20 has unknown opcode 0x10 (word 0x12345610)"
    );
}

#[test]
fn unsupported_opcodes() {
    let e = err(&cur(&[&[2, 0, 0x1D000, 20, 7]]));
    assert!(
        e.starts_with(
            "TXN op 0 at byte offset 16 is BLOCKSET (opcode 0x02), which is not supported in TXN \
             version 0.1: aie-rt serializes block-sets as BLOCKWRITE"
        ),
        "{e}"
    );
    for code in 0x0A..=0x0F {
        let e = err(&cur(&[&[code, 0, 0, 0]]));
        assert!(
            e.contains("which is not supported in TXN version 0.1: IRON's compiler never emits it"),
            "{e}"
        );
    }
    let e = err(&stream(OLDER, 3, &[&[5]]));
    assert_eq!(
        e,
        "TXN op 0 at byte offset 16 is NOOP (opcode 0x05), which is not supported in TXN version \
         1.0: the older (1.0) format only defines WRITE, BLOCKWRITE, MASKWRITE, TCT and DDR_PATCH"
    );
}

#[test]
fn size_fields_must_match_the_layout() {
    let cases: [(Vec<u32>, &str); 8] = [
        (
            vec![0, 0, 0x100, 0, 1, 20],
            "TXN op 0 (WRITE) at byte offset 16: size field (byte offset 36) is 20; expected 24 (6 words)",
        ),
        (
            vec![3, 0, 0x100, 0, 1, 1, 24],
            "TXN op 0 (MASKWRITE) at byte offset 16: size field (byte offset 40) is 24; expected 28 (7 words) or 32 (8 words)",
        ),
        (
            vec![4, 0, 0x100, 0, 1, 1, 36, 0, 0],
            "TXN op 0 (MASKPOLL) at byte offset 16: size field (byte offset 40) is 36; expected 28 (7 words) or 32 (8 words)",
        ),
        (
            vec![1, 0, 0x100, 18, 0],
            "TXN op 0 (BLOCKWRITE) at byte offset 16: size field (byte offset 28) is 18; expected a multiple of 4 and at least 16 (the op's total size in bytes)",
        ),
        (
            vec![1, 0, 0x100, 12, 0],
            "TXN op 0 (BLOCKWRITE) at byte offset 16: size field (byte offset 28) is 12; expected a multiple of 4 and at least 16 (the op's total size in bytes)",
        ),
        (
            vec![0x80, 20, 0, 0, 0],
            "TXN op 0 (TCT) at byte offset 16: size field (byte offset 20) is 20; expected 16 (4 words)",
        ),
        (
            vec![0x81, 44, 0, 0, 0, 0, 0x1D004, 0, 0, 0, 0],
            "TXN op 0 (DDR_PATCH) at byte offset 16: size field (byte offset 20) is 44; expected 48 (12 words)",
        ),
        (
            vec![0x83, 16, 0, 0],
            "TXN op 0 (RECORD_TIMER) at byte offset 16: size field (byte offset 20) is 16; expected 12 (3 words)",
        ),
    ];
    for (op, msg) in cases {
        assert_eq!(err(&cur(&[&op])), msg);
    }
    assert_eq!(
        err(&stream(OLDER, 3, &[&[0x81, 48, 0x1D004, 0, 0, 0]])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: size field (byte offset 20) is 48; expected 24 (6 words)"
    );
    assert_eq!(
        err(&stream(OLDER, 3, &[&[1, 0x1D000, 8]])),
        "TXN op 0 (BLOCKWRITE) at byte offset 16: size field (byte offset 24) is 8; expected a \
         multiple of 4 and at least 12 (the op's total size in bytes)"
    );
}

#[test]
fn ops_that_run_past_the_end() {
    assert_eq!(
        err(&cur(&[&[1, 0, 0x100, 64, 0]])),
        "TXN op 0 (BLOCKWRITE) at byte offset 16 needs 64 bytes but only 20 remain"
    );
    assert_eq!(
        err(&cur(&[&[0, 0, 0x100]])),
        "TXN op 0 (WRITE) at byte offset 16 needs 24 bytes but only 12 remain"
    );
    assert_eq!(
        err(&cur(&[&[8, 0]])),
        "TXN op 0 (LOADPDI) at byte offset 16 needs 16 bytes but only 8 remain"
    );
    assert_eq!(
        err(&stream(OLDER, 3, &[&[3, 0x100, 1]])),
        "TXN op 0 (MASKWRITE) at byte offset 16 needs 16 bytes but only 12 remain"
    );
}

#[test]
fn register_addresses_are_32_bit() {
    assert_eq!(
        err(&cur(&[&[0, 0, 0x100, 1, 1, 24]])),
        "TXN op 0 (WRITE) at byte offset 16: register address high word (byte offset 28) is 0x1; \
         expected 0 (register addresses are 32-bit)"
    );
}

// ---------------------------------------------------------------- DDR_PATCH rules

#[test]
fn patch_outside_the_shim_row() {
    let reg = (1 << 25) | (2 << 20) | 0x1D004;
    assert_eq!(
        err(&cur(&[&patch(reg, 0, 0)])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: register address 0x0221d004 (byte offset 40) is \
         in row 2 (column 1); expected the shim row 0, where the DMA buffer descriptors live"
    );
}

#[test]
fn patch_register_unaligned() {
    assert_eq!(
        err(&cur(&[&patch(0x1D006, 0, 0)])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: register address 0x0001d006 is not word-aligned; \
         expected a multiple of 4"
    );
}

#[test]
fn patch_argument_index_too_large() {
    assert_eq!(
        err(&cur(&[&patch(0x1D004, 64, 0x8000_0000)])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: argument index 64; expected below 64"
    );
}

#[test]
fn unfolded_argument_five() {
    assert_eq!(
        err(&cur(&[&patch(0x1D004, 5, 16)])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: argument 5 has arg_plus 0x00000010 without the \
         fold bit 0x80000000; expected the folded ABI for arguments 5 and above (this insts.bin \
         looks built for HRX or a full ELF; rebuild it for XRT/HSA, aiecc's default)"
    );
}

#[test]
fn folded_low_argument() {
    assert_eq!(
        err(&cur(&[&patch(0x1D004, 4, 0x8000_0000)])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: argument 4 has arg_plus 0x80000000 with the fold \
         bit 0x80000000; expected it only on arguments 5 and above"
    );
}

#[test]
fn patch_reserved_and_action_words() {
    let mut p = patch(0x1D004, 0, 0);
    p[5] = 1;
    assert_eq!(
        err(&cur(&[&p])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: action word (byte offset 36) is 0x1; expected 0 \
         (patch the register)"
    );
    let mut p = patch(0x1D004, 0, 0);
    p[11] = 1;
    assert_eq!(
        err(&cur(&[&p])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: arg_plus high word (byte offset 60) is 0x1; \
         expected 0 (offsets are below 4 GiB)"
    );
    assert_eq!(
        err(&stream(OLDER, 3, &[&[0x81, 24, 0x1D004, 0, 0, 9]])),
        "TXN op 0 (DDR_PATCH) at byte offset 16: reserved word 5 (byte offset 36) is 0x9; expected 0"
    );
}

#[test]
fn fuzz_seeds_are_streams_the_parser_accepts() {
    // The seeds start the fuzzer from valid streams; one the rules refuse would only exercise
    // the first error.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/txn");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let p = TxnProgram::parse(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(p.arg_count() > 0, "{} patches no buffer", path.display());
        seen += 1;
    }
    assert_eq!(seen, 8);
}

#[test]
fn errors_name_the_file_when_wrapped() {
    let e = TxnProgram::parse(&[0; 4])
        .unwrap_err()
        .in_file("build/insts.bin");
    assert_eq!(
        e.to_string(),
        "build/insts.bin: insts.bin is 4 bytes; expected at least 16 (the TXN header is 4 words)"
    );
}

#[test]
fn long_streams_walk_in_one_pass() {
    // 200k one-word ops: the walk advances at least a word per op, so it ends after 200k steps.
    let noops = vec![[5u32]; 200_000];
    let ops: Vec<&[u32]> = noops.iter().map(|w| &w[..]).collect();
    let p = TxnProgram::parse(&cur(&ops)).unwrap();
    assert_eq!(p.op_count, 200_000);
    // A header that claims far more ops than the bytes can hold fails without allocating for them.
    let mut b = cur(&[&[5]]);
    b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        err(&b),
        "TXN header (byte offset 8) declares 4294967295 ops but the stream ends at byte offset 20 after 1 ops"
    );
}

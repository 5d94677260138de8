//! Property tests: random and mutated bytes never panic any parser (and the walk terminates by
//! construction: every op consumes at least one word); a DDR patch is accepted exactly when its
//! BD was given a non-zero length first; written emulated designs read back equal; random,
//! mutated and packed hsacos parse or fail cleanly, and packed kernel sets read back equal.

use npu_artifacts::design::{self, Design};
use npu_artifacts::emu::{DType, EmuDesign, EmuKernel};
use npu_artifacts::hsaco::{self, FullElf, Hsaco, HsacoBuilder, KernelKind, PdiInstsKernel};
use npu_artifacts::pdi::{self, PdiKind};
use npu_artifacts::txn::{self, TxnBuilder, TxnProgram};
use npu_artifacts::{ArtifactError, NpuGen};
use proptest::prelude::*;
use std::collections::HashMap;

/// Shim BD 0's offset in its tile, and the distance between BDs (AIE2).
const SHIM_BD_BASE: u32 = 0x1D000;
const SHIM_BD_STRIDE: u32 = 0x20;

fn any_gen() -> impl Strategy<Value = NpuGen> {
    prop_oneof![Just(NpuGen::Npu1), Just(NpuGen::Npu2)]
}

fn any_dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

/// Designs that validate, covering every kernel.
fn valid_design() -> impl Strategy<Value = EmuDesign> {
    let n4 = (1u32..2048).prop_map(|n| n * 4); // element counts that keep every buffer whole words
    prop_oneof![
        n4.clone().prop_map(EmuDesign::passthrough),
        (n4.clone(), any_dtype(), any::<i64>()).prop_map(|(n, d, s)| {
            let (lo, hi) = d.exact_integer_range();
            EmuDesign::vector_scalar_add(n, d, s.clamp(lo, hi))
        }),
        (n4.clone(), any_dtype()).prop_map(|(n, d)| EmuDesign::vector_vector_add(n, d)),
        (n4.clone(), any_dtype()).prop_map(|(n, d)| EmuDesign::vector_mul(n, d)),
        (
            n4.clone(),
            prop_oneof![
                Just(DType::I8),
                Just(DType::I16),
                Just(DType::I32),
                Just(DType::F32),
                Just(DType::Bf16)
            ]
        )
            .prop_map(|(n, d)| EmuDesign::relu(n, d)),
        (1u32..64, 1u32..64, 1u32..64, any::<bool>()).prop_map(|(m, k, n, bf)| {
            // m*k and k*n elements of 2 bytes must be whole words: make k even.
            let (k, n) = (k * 2, n * 2);
            if bf {
                EmuDesign::matmul(m, k, n, DType::Bf16, DType::F32)
            } else {
                EmuDesign::matmul(m, k, n, DType::I16, DType::I32)
            }
        }),
        (0u8..=64, n4.clone()).prop_map(|(a, n)| EmuDesign::noop(a, n)),
        n4.clone().prop_map(EmuDesign::fault),
        n4.prop_map(EmuDesign::hang),
    ]
}

/// Any field values at all, most of which do not validate.
fn raw_design() -> impl Strategy<Value = EmuDesign> {
    (
        proptest::sample::select(EmuKernel::ALL.to_vec()),
        any_dtype(),
        any_dtype(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<i64>(),
        any::<u8>(),
    )
        .prop_map(
            |(kernel, dtype_in, dtype_out, m, k, n, scalar, num_args)| EmuDesign {
                kernel,
                dtype_in,
                dtype_out,
                m,
                k,
                n,
                scalar,
                num_args,
            },
        )
}

/// Runs every parser on `bytes`; they may fail but must not panic.
fn parse_everything(bytes: &[u8]) {
    if let Ok(p) = TxnProgram::parse(bytes) {
        assert!(p.arg_count() <= txn::MAX_ARGS as usize);
        assert_eq!(p.size_bytes as usize, bytes.len());
        for patch in p.args.iter().flat_map(|a| &a.patches) {
            assert!(patch.bd_len_bytes > 0 && patch.bd_len_bytes.is_multiple_of(4));
        }
        let sizes = p.min_arg_sizes();
        assert_eq!(sizes.len(), p.arg_count());
        p.check_buffers(&sizes).unwrap();
        txn::listing(bytes).unwrap();
        assert_eq!(txn::explain(bytes), txn::listing(bytes).unwrap());
    } else {
        assert!(txn::listing(bytes).is_err());
        assert!(txn::explain(bytes).contains("error: "));
    }
    let _ = pdi::identify(bytes);
    let _ = EmuDesign::from_pdi(bytes);
    let _ = design::check_pair(bytes, bytes);
    parse_hsaco(bytes);
}

/// Runs the hsaco readers on `bytes`: they may fail but must not panic, and what they accept
/// must be consistent.
fn parse_hsaco(bytes: &[u8]) {
    for arch in [NpuGen::Npu1, NpuGen::Npu2] {
        if let Ok(s) = hsaco::parse_for_arch(bytes, arch) {
            assert_eq!(s.arch, arch);
            for k in &s.kernels {
                assert!(k.num_cols > 0 && !k.name.is_empty());
                assert_eq!(k.kind == KernelKind::FullElf, k.full_elf.is_some());
                assert_eq!(k.kind == KernelKind::PdiInsts, k.pdi.is_some());
            }
        }
    }
    let _ = Hsaco::parse(bytes);
    if let Ok(e) = FullElf::parse(bytes) {
        let _ = e.xrt_columns();
        assert!(!e.kernels.is_empty());
    }
}

/// A PdiInsts kernel to pack: (arch, name, insts words, PDI bytes, kernarg, cols).
type KernelSpec = (NpuGen, String, Vec<u8>, Vec<u8>, u32, u32);

/// A random set of PdiInsts kernels over both arches.
fn kernel_set() -> impl Strategy<Value = Vec<KernelSpec>> {
    proptest::collection::vec(
        (
            any_gen(),
            "[a-z_][a-z0-9_:]{0,12}",
            proptest::collection::vec(any::<u8>(), 1..8).prop_map(|w| w.repeat(4)),
            // Small alphabets so that identical blobs occur and are deduplicated.
            proptest::collection::vec(0u8..2, 1..12),
            any::<u32>(),
            1u32..=8,
        ),
        1..8,
    )
}

fn pack(set: &[KernelSpec]) -> (Vec<u8>, Vec<usize>) {
    let mut b = HsacoBuilder::new();
    let mut kept = Vec::new();
    for (i, (arch, name, insts, pdi, kernarg_size, num_cols)) in set.iter().enumerate() {
        let k = PdiInstsKernel {
            name: name.clone(),
            pdi: pdi.clone(),
            insts: insts.clone(),
            num_cols: *num_cols,
            kernarg_size: *kernarg_size,
        };
        // A repeated name in one arch is refused; the rest are kept.
        if b.pdi_insts(*arch, k).is_ok() {
            kept.push(i);
        }
    }
    (b.build().unwrap(), kept)
}

/// A valid TXN stream with a mix of ops, to mutate. Its DDR patches follow a BD length set by a
/// BLOCKWRITE of the whole BD, a WRITE or a full-mask MASKWRITE of its word 0.
fn valid_stream() -> impl Strategy<Value = Vec<u8>> {
    (
        any_gen(),
        proptest::collection::vec((0u8..8, any::<u32>(), 0u32..16, 1u32..=u32::MAX), 0..12),
    )
        .prop_map(|(generation, ops)| {
            let mut b = TxnBuilder::new(generation);
            for (kind, v, small, len_words) in ops {
                let bd_len = TxnBuilder::reg(1, 0, SHIM_BD_BASE + small * SHIM_BD_STRIDE);
                match kind {
                    0 => b.write(v, small),
                    1 => b.mask_write(v, small, v),
                    2 => b.block_write(0, 0, v & !3, &[small, v, 0]),
                    3 => b.shim_buffer(0, small, small, u64::from(len_words) * 4),
                    4 => b.sync(0, 0, 0, 0),
                    5 => b
                        .write(bd_len, len_words)
                        .ddr_patch(bd_len + 4, small, v >> 1),
                    6 => b.mask_write(bd_len, len_words, u32::MAX).ddr_patch(
                        bd_len + 4,
                        small,
                        v >> 1,
                    ),
                    _ => b.noop(),
                };
            }
            b.finish()
        })
}

/// What a stream does to one shim BD's length word, for [`patches_and_lengths`].
#[derive(Debug, Clone, Copy)]
enum BdOp {
    /// `shim_buffer`: BLOCKWRITE of the BD with this many bytes, then a patch.
    Buffer(u32),
    /// WRITE of this many words into word 0.
    SetLength(u32),
    /// A bare DDR_PATCH.
    Patch,
    /// An op that touches no shim BD.
    Other,
}

/// A stream of BD ops on (column, BD) pairs.
fn patches_and_lengths() -> impl Strategy<Value = Vec<(u8, u32, BdOp)>> {
    let op = prop_oneof![
        (4u32..1 << 20).prop_map(BdOp::Buffer),
        prop_oneof![Just(0u32), 1u32..1 << 18].prop_map(BdOp::SetLength),
        Just(BdOp::Patch),
        Just(BdOp::Patch),
        Just(BdOp::Other),
    ];
    proptest::collection::vec((0u8..2, 0u32..3, op), 0..16)
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Truncate(usize),
    Insert(usize, u8),
    Remove(usize),
    Word(usize, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        (
            any::<usize>(),
            prop_oneof![Just(0u32), Just(u32::MAX), Just(0x8000_0000), any::<u32>()]
        )
            .prop_map(|(i, w)| Mutation::Word(i, w)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let at = |i: usize| i % bytes.len();
    match *m {
        Mutation::Flip(i, b) => {
            let i = at(i);
            bytes[i] ^= b;
        }
        Mutation::Set(i, b) => {
            let i = at(i);
            bytes[i] = b;
        }
        Mutation::Truncate(i) => bytes.truncate(at(i)),
        Mutation::Insert(i, b) => bytes.insert(at(i), b),
        Mutation::Remove(i) => {
            bytes.remove(at(i));
        }
        Mutation::Word(i, w) => {
            let i = at(i) & !3;
            if i + 4 <= bytes.len() {
                bytes[i..i + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn packed_kernel_sets_read_back_equal(set in kernel_set()) {
        let (bytes, kept) = pack(&set);
        let h = Hsaco::parse(&bytes).unwrap();
        for arch in [NpuGen::Npu1, NpuGen::Npu2] {
            let want: Vec<_> = kept.iter().map(|&i| &set[i]).filter(|k| k.0 == arch).collect();
            let Some(s) = h.section(arch) else {
                prop_assert!(want.is_empty());
                continue;
            };
            prop_assert_eq!(s, &hsaco::parse_for_arch(&bytes, arch).unwrap());
            prop_assert_eq!(s.kernels.len(), want.len());
            for (k, (_, name, insts, pdi, kernarg, cols)) in s.kernels.iter().zip(want) {
                prop_assert_eq!(&k.name, name);
                prop_assert_eq!(k.insts.bytes, insts.as_slice());
                prop_assert_eq!(k.pdi.unwrap().bytes, pdi.as_slice());
                prop_assert_eq!((k.kernarg_size, k.num_cols), (*kernarg, *cols));
            }
            // Identical blobs are stored once: offsets are equal exactly when bytes are.
            let blobs: Vec<_> = s.kernels.iter().flat_map(|k| [k.insts, k.pdi.unwrap()]).collect();
            for a in &blobs {
                for b in &blobs {
                    prop_assert_eq!(a.offset == b.offset, a.bytes == b.bytes);
                }
            }
        }
    }

    #[test]
    fn mutated_hsacos_never_panic(set in kernel_set(), full_elf in any::<bool>(), muts in proptest::collection::vec(mutation(), 1..6)) {
        let mut bytes = if full_elf {
            EmuDesign::noop(2, 16).to_full_elf_hsaco().unwrap()
        } else {
            pack(&set).0
        };
        for m in &muts {
            apply(&mut bytes, m);
        }
        parse_hsaco(&bytes);
    }

    #[test]
    fn mutated_full_elves_never_panic(d in valid_design(), muts in proptest::collection::vec(mutation(), 1..6)) {
        let mut bytes = d.to_full_elf().unwrap();
        prop_assert!(FullElf::parse(&bytes).is_ok());
        for m in &muts {
            apply(&mut bytes, m);
        }
        parse_hsaco(&bytes);
    }

    #[test]
    fn random_bytes_behind_an_elf64_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut bytes = pack(&[(NpuGen::Npu2, "k".into(), vec![0; 4], vec![1], 0, 1)]).0;
        bytes.truncate(64);
        bytes.extend_from_slice(&tail);
        parse_hsaco(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        parse_everything(&bytes);
    }

    #[test]
    fn random_words_behind_a_valid_header_never_panic(
        dev_gen in 0u8..6,
        major_minor in prop_oneof![Just((0u8, 1u8)), Just((1, 0))],
        declared_ops in 0u32..40,
        words in proptest::collection::vec(
            prop_oneof![0u32..0x10, 0x80u32..0x86, Just(48), Just(24), Just(16), Just(28), any::<u32>()],
            0..80,
        ),
    ) {
        let size = u32::try_from((words.len() + 4) * 4).unwrap();
        let w0 = u32::from_le_bytes([major_minor.0, major_minor.1, dev_gen, 6]);
        let bytes: Vec<u8> = [w0, 5, declared_ops, size]
            .iter()
            .chain(&words)
            .flat_map(|w| w.to_le_bytes())
            .collect();
        parse_everything(&bytes);
    }

    #[test]
    fn mutated_streams_never_panic(stream in valid_stream(), muts in proptest::collection::vec(mutation(), 1..6)) {
        prop_assert!(TxnProgram::parse(&stream).is_ok());
        let mut bytes = stream;
        for m in &muts {
            apply(&mut bytes, m);
        }
        parse_everything(&bytes);
    }

    #[test]
    fn patches_are_accepted_exactly_when_their_bd_has_a_length(
        generation in any_gen(),
        ops in patches_and_lengths(),
    ) {
        // The model: the last length each (column, BD) was given, and the first patch (op index)
        // that finds none, or 0, with which of the two it found.
        let mut lengths: HashMap<(u8, u32), u32> = HashMap::new();
        let mut first_bad: Option<(u32, bool)> = None;
        let mut expected_sizes: HashMap<u32, u64> = HashMap::new();
        let mut b = TxnBuilder::new(generation);
        for (col, bd, op) in ops {
            let bd_base = TxnBuilder::reg(col, 0, SHIM_BD_BASE + bd * SHIM_BD_STRIDE);
            let arg = u32::from(col) * 3 + bd;
            match op {
                BdOp::Buffer(bytes) => {
                    lengths.insert((col, bd), bytes / 4);
                    b.shim_buffer(col, bd, arg, u64::from(bytes));
                }
                BdOp::SetLength(words) => {
                    lengths.insert((col, bd), words);
                    b.write(bd_base, words);
                }
                BdOp::Other => {
                    b.noop().write(TxnBuilder::reg(col, 2, SHIM_BD_BASE), 0);
                }
                BdOp::Patch => {
                    b.ddr_patch(bd_base + 4, arg, 0);
                }
            }
            if matches!(op, BdOp::Buffer(_) | BdOp::Patch) {
                match lengths.get(&(col, bd)) {
                    Some(&w) if w > 0 => {
                        let size = expected_sizes.entry(arg).or_default();
                        *size = (*size).max(u64::from(w) * 4);
                    }
                    found => {
                        first_bad.get_or_insert((b.op_count() - 1, found.is_some()));
                    }
                }
            }
        }
        let bytes = b.finish();
        match (TxnProgram::parse(&bytes), first_bad) {
            (Ok(p), None) => {
                for (arg, size) in expected_sizes {
                    prop_assert_eq!(p.min_arg_size(arg as usize), size);
                }
            }
            (
                Err(ArtifactError::TxnPatchWithoutLength { op_index, written_zero, .. }),
                Some((bad_op, zero)),
            ) => prop_assert_eq!((op_index, written_zero), (bad_op, zero)),
            (r, m) => prop_assert!(false, "parse {:?} but the model expected {:?}", r, m),
        }
    }

    #[test]
    fn mutated_designs_never_panic(
        d in valid_design(),
        generation in any_gen(),
        muts in proptest::collection::vec(mutation(), 1..4),
    ) {
        let mut p = d.to_pdi();
        let mut i = d.insts(generation);
        for m in &muts {
            apply(&mut p, m);
            apply(&mut i, m);
        }
        parse_everything(&p);
        parse_everything(&i);
        let _ = design::check_pair(&p, &i);
    }

    #[test]
    fn emulated_designs_round_trip(d in valid_design(), generation in any_gen()) {
        prop_assert_eq!(d.validate().map_err(|e| e.to_string()), Ok(()));
        prop_assert_eq!(EmuDesign::from_pdi(&d.to_pdi()).unwrap(), d.clone());
        let (kind, program) = design::check_pair(&d.to_pdi(), &d.insts(generation)).unwrap();
        prop_assert_eq!(kind, PdiKind::Emulated(d.clone()));
        prop_assert_eq!(program.generation, generation);
        prop_assert_eq!(program.min_arg_sizes(), d.arg_sizes());
        program.check_buffers(&d.arg_sizes()).unwrap();
    }

    #[test]
    fn any_field_values_validate_or_fail_cleanly(d in raw_design()) {
        let bytes = d.to_pdi();
        match (d.validate(), EmuDesign::from_pdi(&bytes)) {
            (Ok(()), Ok(back)) => prop_assert_eq!(back, d),
            (Err(_), Err(ArtifactError::EmuInvalid { .. })) => {}
            (v, r) => prop_assert!(false, "validate {:?} but from_pdi {:?}", v, r),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn written_design_directories_read_back_equal(d in valid_design(), generation in any_gen(), in_build in any::<bool>()) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = if in_build { tmp.path().join("build") } else { tmp.path().to_path_buf() };
        std::fs::create_dir_all(&dir).unwrap();
        let files = d.write_dir(&dir, generation).unwrap();
        let opened = Design::open(tmp.path()).unwrap();
        prop_assert_eq!(&opened.files, &files);
        prop_assert_eq!(opened.kind, PdiKind::Emulated(d.clone()));
        prop_assert_eq!(opened.program.generation, generation);
        prop_assert_eq!(opened.program.min_arg_sizes(), d.arg_sizes());
        prop_assert_eq!(opened.insts, d.insts(generation));
    }
}

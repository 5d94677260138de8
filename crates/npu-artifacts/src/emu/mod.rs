//! Emulated designs: a `main.pdi` that names a reference kernel for the software NPU (hsa-sim).
//!
//! The byte layout is documented in the [crate docs](crate#the-emulated-mainpdi-format-version-1)
//! and in the crate's README. [`EmuDesign::write_dir`] writes a whole design directory: that
//! `main.pdi` plus a valid TXN `insts.bin` with, for each buffer, a BLOCKWRITE of a shim DMA buffer
//! descriptor (length = the buffer's size) followed by a DDR_PATCH of that argument, so the TXN's
//! [`crate::txn::TxnProgram::min_arg_sizes`] equals [`EmuDesign::arg_sizes`].
//!
//! Kernels, with their buffers in argument order (IRON's programming examples):
//!
//! | Kernel | Buffers | Semantics | Parameters |
//! |---|---|---|---|
//! | `passthrough` | in, out, unused (trace slot) | `out = in` | `n` elements; dtype_in = dtype_out |
//! | `vector_scalar_add` | in, out | `out[i] = in[i] + scalar` (wrapping for integers) | `n`, `scalar` representable in the dtype (integers) or within ±2^24 (floats) |
//! | `vector_scalar_add_inplace` | inout | `inout[i] = inout[i] + scalar`, in place (IRON's `algorithms/for_each.py`, `a + 1`) | as `vector_scalar_add` |
//! | `vector_scalar_add_unused` | in, unused, out | `out[i] = in[i] + scalar`, the second buffer neither read nor written (IRON's `test/npu-xrt/add_one_objFifo`, `in + 41`) | as `vector_scalar_add` |
//! | `vector_scalar_mul` | inout | `inout[i] = inout[i] * scalar`, in place (wrapping for integers; ROCR's AIE suites' second kernel, `MUL_SCALE`) | as `vector_scalar_add` |
//! | `vector_scale` | in, out, factor | `out[i] = in[i] * factor[0]`, the factor an i32 in a one-element buffer read at run time (wrapping; IRON's `vector_scalar_mul` as its JIT and its host script from mid-2026 pass it) | `n` |
//! | `vector_scale_mid` | in, factor, out | as `vector_scale` (IRON's `vector_scalar_mul` as its host script passed it until spring 2026) | `n` |
//! | `vector_vector_add` | a, b, c | `c = a + b` (wrapping) | `n` |
//! | `vector_mul` | a, b, c | `c = a * b` (wrapping) | `n` |
//! | `relu` | in, out | `out = max(in, 0)` | `n`; signed or float dtype |
//! | `matmul` | A (m×k), B (k×n), C (m×n), row-major | `C = A @ B`, accumulated in dtype_out (wrapping for i32) | `m`, `k`, `n`; i16→i32 or bf16→f32 |
//! | `noop` | `num_args` buffers of `n` bytes | does nothing (benchmarks) | u8 |
//! | `fault` | in, out of `n` bytes | fails on the device (fault injection) | u8 |
//! | `hang` | in, out of `n` bytes | never completes; the emulator's driver-like timeout fails it | u8 |
//!
//! Every buffer's size must be a positive multiple of 4 bytes (a shim BD counts 32-bit words) and
//! at most 4 GiB − 4; unused parameters (`m`, `k`, `scalar`) must be 0 so a design has exactly one
//! encoding.

mod dtype;
mod format;
mod hsaco;

pub use hsaco::{EMU_CTRL_ARG_SITES, EMU_CTRL_MAGIC, EMU_CTRL_PDI_SITE, EMU_INSTANCE};

pub use dtype::DType;

pub use format::{HEADER_LEN, MAGIC, VERSION};

use crate::design::DesignFiles;
use crate::txn::TxnBuilder;
use crate::{ArtifactError, NpuGen};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// A reference kernel the software NPU runs instead of AIE cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EmuKernel {
    /// `out = in`, with an unused third buffer (IRON's trace slot).
    Passthrough,
    /// `out = in + scalar`.
    VectorScalarAdd,
    /// `inout = inout + scalar`, in place, one buffer.
    VectorScalarAddInPlace,
    /// `out = in + scalar`; buffers (in, unused, out).
    VectorScalarAddUnused,
    /// `inout = inout * scalar`, in place, one buffer.
    VectorScalarMul,
    /// `out = in * factor[0]`, the factor an i32 buffer; buffers (in, out, factor).
    VectorScale,
    /// `out = in * factor[0]`; buffers (in, factor, out).
    VectorScaleMid,
    /// `c = a + b`.
    VectorVectorAdd,
    /// `c = a * b`.
    VectorMul,
    /// `out = max(in, 0)`.
    Relu,
    /// `C = A @ B`.
    Matmul,
    /// Does nothing.
    Noop,
    /// Fails on the device.
    Fault,
    /// Hangs until the driver-like timeout, then fails.
    Hang,
}

impl EmuKernel {
    /// Every kernel, in documentation order.
    pub const ALL: [EmuKernel; 14] = [
        Self::Passthrough,
        Self::VectorScalarAdd,
        Self::VectorScalarAddInPlace,
        Self::VectorScalarAddUnused,
        Self::VectorScalarMul,
        Self::VectorScale,
        Self::VectorScaleMid,
        Self::VectorVectorAdd,
        Self::VectorMul,
        Self::Relu,
        Self::Matmul,
        Self::Noop,
        Self::Fault,
        Self::Hang,
    ];

    /// The name stored in `main.pdi`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Passthrough => "passthrough",
            Self::VectorScalarAdd => "vector_scalar_add",
            Self::VectorScalarAddInPlace => "vector_scalar_add_inplace",
            Self::VectorScalarAddUnused => "vector_scalar_add_unused",
            Self::VectorScalarMul => "vector_scalar_mul",
            Self::VectorScale => "vector_scale",
            Self::VectorScaleMid => "vector_scale_mid",
            Self::VectorVectorAdd => "vector_vector_add",
            Self::VectorMul => "vector_mul",
            Self::Relu => "relu",
            Self::Matmul => "matmul",
            Self::Noop => "noop",
            Self::Fault => "fault",
            Self::Hang => "hang",
        }
    }

    /// The number of buffers the kernel takes (`None` for `noop`, which takes any number).
    #[must_use]
    pub fn fixed_num_args(self) -> Option<u8> {
        match self {
            Self::Passthrough
            | Self::VectorScalarAddUnused
            | Self::VectorScale
            | Self::VectorScaleMid
            | Self::VectorVectorAdd
            | Self::VectorMul
            | Self::Matmul => Some(3),
            Self::VectorScalarAdd | Self::Relu | Self::Fault | Self::Hang => Some(2),
            Self::VectorScalarMul | Self::VectorScalarAddInPlace => Some(1),
            Self::Noop => None,
        }
    }
}

impl fmt::Display for EmuKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EmuKernel {
    type Err = ArtifactError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| ArtifactError::Emu {
                detail: format!(
                    "unknown kernel {s:?}; expected one of {}",
                    Self::ALL.map(EmuKernel::name).join(", ")
                ),
            })
    }
}

/// An emulated design: a kernel and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmuDesign {
    /// The kernel.
    pub kernel: EmuKernel,
    /// Element type of the inputs.
    pub dtype_in: DType,
    /// Element type of the outputs.
    pub dtype_out: DType,
    /// Matmul: rows of A and C (otherwise 0).
    pub m: u32,
    /// Matmul: inner dimension (otherwise 0).
    pub k: u32,
    /// Matmul: columns of B and C; elementwise kernels: element count; `noop`, `fault`, `hang`:
    /// bytes per buffer.
    pub n: u32,
    /// `vector_scalar_add`'s addend, `vector_scalar_mul`'s factor (otherwise 0).
    pub scalar: i64,
    /// Number of buffer arguments.
    pub num_args: u8,
}

impl EmuDesign {
    fn elementwise(kernel: EmuKernel, n: u32, dtype: DType) -> Self {
        Self {
            kernel,
            dtype_in: dtype,
            dtype_out: dtype,
            m: 0,
            k: 0,
            n,
            scalar: 0,
            num_args: kernel.fixed_num_args().unwrap_or(0),
        }
    }

    /// IRON's passthrough: copies `bytes` u8 elements; buffers (in, out, unused trace slot).
    #[must_use]
    pub fn passthrough(bytes: u32) -> Self {
        Self::elementwise(EmuKernel::Passthrough, bytes, DType::U8)
    }

    /// IRON's vector_scalar_add: `out = in + scalar`; buffers (in, out).
    #[must_use]
    pub fn vector_scalar_add(n: u32, dtype: DType, scalar: i64) -> Self {
        Self {
            scalar,
            ..Self::elementwise(EmuKernel::VectorScalarAdd, n, dtype)
        }
    }

    /// IRON's `algorithms/for_each.py` (`a + 1` in place): `inout = inout + scalar`; one buffer.
    #[must_use]
    pub fn vector_scalar_add_inplace(n: u32, dtype: DType, scalar: i64) -> Self {
        Self {
            scalar,
            ..Self::elementwise(EmuKernel::VectorScalarAddInPlace, n, dtype)
        }
    }

    /// IRON's `test/npu-xrt/add_one_objFifo` (`out = in + 41`): `out = in + scalar`; buffers
    /// (in, an unused buffer of the same size, out).
    #[must_use]
    pub fn vector_scalar_add_unused(n: u32, dtype: DType, scalar: i64) -> Self {
        Self {
            scalar,
            ..Self::elementwise(EmuKernel::VectorScalarAddUnused, n, dtype)
        }
    }

    /// The in-place multiply of ROCR's AIE suites: `inout = inout * scale`; one buffer.
    #[must_use]
    pub fn vector_scalar_mul(n: u32, dtype: DType, scale: i64) -> Self {
        Self {
            scalar: scale,
            ..Self::elementwise(EmuKernel::VectorScalarMul, n, dtype)
        }
    }

    /// IRON's vector_scalar_mul as its JIT and its newer host script pass the buffers:
    /// `out = in * factor[0]`, the factor one i32 read from the third buffer at run time;
    /// buffers (in, out, factor of 4 bytes).
    #[must_use]
    pub fn vector_scale(n: u32, dtype: DType) -> Self {
        Self::elementwise(EmuKernel::VectorScale, n, dtype)
    }

    /// IRON's vector_scalar_mul as its older host script passes the buffers: as
    /// [`EmuDesign::vector_scale`] with buffers (in, factor of 4 bytes, out).
    #[must_use]
    pub fn vector_scale_mid(n: u32, dtype: DType) -> Self {
        Self::elementwise(EmuKernel::VectorScaleMid, n, dtype)
    }

    /// IRON's vector_vector_add: `c = a + b`; buffers (a, b, c).
    #[must_use]
    pub fn vector_vector_add(n: u32, dtype: DType) -> Self {
        Self::elementwise(EmuKernel::VectorVectorAdd, n, dtype)
    }

    /// Elementwise product `c = a * b`; buffers (a, b, c).
    #[must_use]
    pub fn vector_mul(n: u32, dtype: DType) -> Self {
        Self::elementwise(EmuKernel::VectorMul, n, dtype)
    }

    /// `out = max(in, 0)`; buffers (in, out).
    #[must_use]
    pub fn relu(n: u32, dtype: DType) -> Self {
        Self::elementwise(EmuKernel::Relu, n, dtype)
    }

    /// IRON's single-core matmul: `C = A @ B` with A m×k, B k×n, C m×n, row-major; i16→i32 or
    /// bf16→f32.
    #[must_use]
    pub fn matmul(m: u32, k: u32, n: u32, dtype_in: DType, dtype_out: DType) -> Self {
        Self {
            kernel: EmuKernel::Matmul,
            dtype_in,
            dtype_out,
            m,
            k,
            n,
            scalar: 0,
            num_args: 3,
        }
    }

    /// Does no work: `num_args` buffers of `bytes_per_arg` bytes each (for benchmarks).
    #[must_use]
    pub fn noop(num_args: u8, bytes_per_arg: u32) -> Self {
        Self {
            num_args,
            ..Self::elementwise(EmuKernel::Noop, bytes_per_arg, DType::U8)
        }
    }

    /// Fails on the device (fault injection); buffers (in, out) of `n` bytes.
    #[must_use]
    pub fn fault(n: u32) -> Self {
        Self::elementwise(EmuKernel::Fault, n, DType::U8)
    }

    /// Hangs until the driver-like timeout, then fails; buffers (in, out) of `n` bytes.
    #[must_use]
    pub fn hang(n: u32) -> Self {
        Self::elementwise(EmuKernel::Hang, n, DType::U8)
    }

    /// A design by kernel name with one size parameter and IRON's defaults: `n` elements for the
    /// elementwise kernels (dtype default i32, the `vector_scalar_add` kernels add 1, `vector_scalar_mul`
    /// multiplies by 3, `vector_scale` by its factor buffer; passthrough u8), an
    /// n×n×n matmul (default i16→i32; `bf16` gives bf16→f32), 3 `noop` buffers of `n` bytes, and
    /// `n`-byte `fault`/`hang` buffers.
    ///
    /// # Errors
    ///
    /// An unknown kernel name, or parameters [`EmuDesign::validate`] refuses.
    pub fn by_name(kernel: &str, n: u32, dtype: Option<DType>) -> Result<Self, ArtifactError> {
        let kernel: EmuKernel = kernel.parse()?;
        let d = dtype.unwrap_or(DType::I32);
        let design = match kernel {
            EmuKernel::Passthrough => Self {
                dtype_in: dtype.unwrap_or(DType::U8),
                dtype_out: dtype.unwrap_or(DType::U8),
                ..Self::passthrough(n)
            },
            EmuKernel::VectorScalarAdd => Self::vector_scalar_add(n, d, 1),
            EmuKernel::VectorScalarAddInPlace => Self::vector_scalar_add_inplace(n, d, 1),
            EmuKernel::VectorScalarAddUnused => Self::vector_scalar_add_unused(n, d, 1),
            EmuKernel::VectorScalarMul => Self::vector_scalar_mul(n, d, 3),
            EmuKernel::VectorScale => Self::vector_scale(n, d),
            EmuKernel::VectorScaleMid => Self::vector_scale_mid(n, d),
            EmuKernel::VectorVectorAdd => Self::vector_vector_add(n, d),
            EmuKernel::VectorMul => Self::vector_mul(n, d),
            EmuKernel::Relu => Self::relu(n, d),
            EmuKernel::Matmul => match dtype {
                Some(DType::Bf16 | DType::F32) => Self::matmul(n, n, n, DType::Bf16, DType::F32),
                _ => Self::matmul(n, n, n, DType::I16, DType::I32),
            },
            EmuKernel::Noop => Self::noop(3, n),
            EmuKernel::Fault => Self::fault(n),
            EmuKernel::Hang => Self::hang(n),
        };
        design.validate()?;
        Ok(design)
    }

    /// Byte size of each buffer, in argument order (saturating, for designs that do not
    /// validate).
    #[must_use]
    pub fn arg_sizes(&self) -> Vec<u64> {
        let (m, k, n) = (u64::from(self.m), u64::from(self.k), u64::from(self.n));
        let bytes = |elems: u64, d: DType| elems.saturating_mul(d.size() as u64);
        match self.kernel {
            EmuKernel::Matmul => vec![
                bytes(m.saturating_mul(k), self.dtype_in),
                bytes(k.saturating_mul(n), self.dtype_in),
                bytes(m.saturating_mul(n), self.dtype_out),
            ],
            EmuKernel::Noop | EmuKernel::Fault | EmuKernel::Hang => {
                vec![n; usize::from(self.num_args)]
            }
            EmuKernel::Passthrough => {
                let b = bytes(n, self.dtype_in);
                vec![b; 3]
            }
            // The factor is one i32.
            EmuKernel::VectorScale => vec![bytes(n, self.dtype_in), bytes(n, self.dtype_out), 4],
            EmuKernel::VectorScaleMid => {
                vec![bytes(n, self.dtype_in), 4, bytes(n, self.dtype_out)]
            }
            _ => {
                let mut sizes = vec![bytes(n, self.dtype_in); usize::from(self.num_args)];
                if let Some(last) = sizes.last_mut() {
                    *last = bytes(n, self.dtype_out);
                }
                sizes
            }
        }
    }

    /// Checks that the parameters describe a runnable kernel (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`ArtifactError::EmuInvalid`] naming the parameter, what was expected and what was found.
    pub fn validate(&self) -> Result<(), ArtifactError> {
        let kernel = self.kernel.name();
        let bad = |detail: String| Err(ArtifactError::EmuInvalid { kernel, detail });
        if let Some(expected) = self.kernel.fixed_num_args()
            && self.num_args != expected
        {
            return bad(format!(
                "num_args is {}; expected {expected}",
                self.num_args
            ));
        }
        if self.num_args as u32 > crate::txn::MAX_ARGS {
            return bad(format!(
                "num_args is {}; expected at most {}",
                self.num_args,
                crate::txn::MAX_ARGS
            ));
        }
        use DType::*;
        match self.kernel {
            EmuKernel::Matmul => {
                if !matches!((self.dtype_in, self.dtype_out), (I16, I32) | (Bf16, F32)) {
                    return bad(format!(
                        "dtypes are {}->{}; expected i16->i32 or bf16->f32",
                        self.dtype_in, self.dtype_out
                    ));
                }
                for (name, v) in [("m", self.m), ("k", self.k), ("n", self.n)] {
                    if v == 0 {
                        return bad(format!("{name} is 0; expected at least 1"));
                    }
                }
            }
            _ => {
                if self.dtype_in != self.dtype_out {
                    return bad(format!(
                        "dtypes are {}->{}; expected the same dtype in and out",
                        self.dtype_in, self.dtype_out
                    ));
                }
                let byte_kernels = [EmuKernel::Noop, EmuKernel::Fault, EmuKernel::Hang];
                if byte_kernels.contains(&self.kernel) && self.dtype_in != U8 {
                    return bad(format!("dtype is {}; expected u8", self.dtype_in));
                }
                if self.kernel == EmuKernel::Relu && matches!(self.dtype_in, U8 | U32) {
                    return bad(format!(
                        "dtype is {}; expected a signed or float dtype (relu of unsigned is a copy)",
                        self.dtype_in
                    ));
                }
                if self.m != 0 || self.k != 0 {
                    return bad(format!(
                        "m and k are {} and {}; expected 0 (only matmul uses them)",
                        self.m, self.k
                    ));
                }
                if self.n == 0 {
                    return bad("n is 0; expected at least 1".into());
                }
            }
        }
        if matches!(
            self.kernel,
            EmuKernel::VectorScalarAdd
                | EmuKernel::VectorScalarAddInPlace
                | EmuKernel::VectorScalarAddUnused
                | EmuKernel::VectorScalarMul
        ) {
            let (lo, hi) = self.dtype_in.exact_integer_range();
            if !(lo..=hi).contains(&self.scalar) {
                return bad(format!(
                    "scalar is {}; expected {lo}..={hi} for {}",
                    self.scalar, self.dtype_in
                ));
            }
        } else if self.scalar != 0 {
            return bad(format!(
                "scalar is {}; expected 0 (only the vector_scalar_add kernels and vector_scalar_mul \
             use it)",
                self.scalar
            ));
        }
        for (i, size) in self.arg_sizes().into_iter().enumerate() {
            if size == 0 || !size.is_multiple_of(4) || size > u64::from(u32::MAX - 3) {
                return bad(format!(
                    "buffer {i} is {size} bytes; expected a positive multiple of 4 below 4 GiB \
                     (a shim DMA descriptor counts 32-bit words)"
                ));
            }
        }
        Ok(())
    }

    /// A current-format (0.1) TXN stream for `generation`: for each buffer `i`, a BLOCKWRITE of
    /// shim DMA BD `i % 16` in column `i / 16` with the buffer's length, then a DDR_PATCH of
    /// argument `i` at offset 0 (with the fold bit from argument 5 on), then one TCT sync. For a
    /// valid design [`crate::txn::TxnProgram::parse`] accepts it and its `min_arg_sizes()` equals
    /// [`EmuDesign::arg_sizes`]; a buffer under 4 bytes gives its BD a length of 0, which parse
    /// refuses.
    #[must_use]
    pub fn insts(&self, generation: NpuGen) -> Vec<u8> {
        let mut b = TxnBuilder::new(generation);
        for (i, size) in self.arg_sizes().into_iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            let col = u8::try_from(i / 16).unwrap_or(u8::MAX);
            b.shim_buffer(col, i % 16, i, size);
        }
        if self.num_args > 0 {
            b.sync(0, 0, 0, 0);
        }
        b.finish()
    }

    /// Writes `main.pdi` and `insts.bin` for `generation` into `dir` (which must exist).
    ///
    /// # Errors
    ///
    /// [`ArtifactError::EmuInvalid`] for a design that does not validate, [`ArtifactError::Io`]
    /// when a file cannot be written.
    pub fn write_dir(&self, dir: &Path, generation: NpuGen) -> Result<DesignFiles, ArtifactError> {
        self.validate()?;
        let files = DesignFiles {
            dir: dir.to_path_buf(),
            pdi_path: dir.join(crate::design::PDI_NAME),
            insts_path: dir.join(crate::design::INSTS_NAME),
        };
        for (path, bytes) in [
            (&files.pdi_path, self.to_pdi()),
            (&files.insts_path, self.insts(generation)),
        ] {
            std::fs::write(path, bytes).map_err(|source| ArtifactError::Io {
                path: path.clone(),
                source,
            })?;
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::TxnProgram;

    #[test]
    fn constructors_follow_iron_argument_orders() {
        assert_eq!(EmuDesign::passthrough(4096).arg_sizes(), vec![4096; 3]);
        assert_eq!(
            EmuDesign::vector_scalar_add(1024, DType::I32, 1).arg_sizes(),
            vec![4096, 4096]
        );
        assert_eq!(
            EmuDesign::vector_vector_add(32, DType::I16).arg_sizes(),
            vec![64; 3]
        );
        assert_eq!(
            EmuDesign::vector_scale(4096, DType::I16).arg_sizes(),
            vec![8192, 8192, 4]
        );
        assert_eq!(
            EmuDesign::vector_scale_mid(4096, DType::I16).arg_sizes(),
            vec![8192, 4, 8192]
        );
        assert_eq!(
            EmuDesign::vector_scalar_add_inplace(1024, DType::I32, 1).arg_sizes(),
            vec![4096]
        );
        assert_eq!(
            EmuDesign::vector_scalar_add_unused(64, DType::U32, 41).arg_sizes(),
            vec![256; 3]
        );
        assert_eq!(EmuDesign::relu(8, DType::Bf16).arg_sizes(), vec![16, 16]);
        assert_eq!(
            EmuDesign::matmul(2, 4, 6, DType::I16, DType::I32).arg_sizes(),
            vec![16, 48, 48]
        );
        assert_eq!(EmuDesign::noop(5, 64).arg_sizes(), vec![64; 5]);
        assert_eq!(EmuDesign::fault(8).arg_sizes(), vec![8, 8]);
        assert_eq!(EmuDesign::hang(8).arg_sizes(), vec![8, 8]);
    }

    #[test]
    fn every_kernel_name_parses_back() {
        for k in EmuKernel::ALL {
            assert_eq!(k.name().parse::<EmuKernel>().unwrap(), k);
        }
        let e = "conv2d".parse::<EmuKernel>().unwrap_err().to_string();
        assert!(
            e.starts_with(
                "emulated design: unknown kernel \"conv2d\"; expected one of passthrough,"
            ),
            "{e}"
        );
    }

    #[test]
    fn by_name_uses_iron_defaults() {
        let d = EmuDesign::by_name("vector_scalar_add", 1024, None).unwrap();
        assert_eq!(d, EmuDesign::vector_scalar_add(1024, DType::I32, 1));
        let d = EmuDesign::by_name("matmul", 64, Some(DType::Bf16)).unwrap();
        assert_eq!(d, EmuDesign::matmul(64, 64, 64, DType::Bf16, DType::F32));
        let d = EmuDesign::by_name("passthrough", 4096, None).unwrap();
        assert_eq!(d, EmuDesign::passthrough(4096));
        assert!(EmuDesign::by_name("relu", 3, Some(DType::I8)).is_err());
    }

    #[test]
    fn validate_names_the_parameter() {
        let msg = |d: EmuDesign| d.validate().unwrap_err().to_string();
        assert_eq!(
            msg(EmuDesign::matmul(4, 4, 4, DType::I32, DType::I32)),
            "emulated design matmul: dtypes are i32->i32; expected i16->i32 or bf16->f32"
        );
        assert_eq!(
            msg(EmuDesign::matmul(4, 0, 4, DType::I16, DType::I32)),
            "emulated design matmul: k is 0; expected at least 1"
        );
        assert_eq!(
            msg(EmuDesign::vector_scalar_add(4, DType::U8, 256)),
            "emulated design vector_scalar_add: scalar is 256; expected 0..=255 for u8"
        );
        assert_eq!(
            msg(EmuDesign::relu(4, DType::U32)),
            "emulated design relu: dtype is u32; expected a signed or float dtype (relu of unsigned is a copy)"
        );
        assert_eq!(
            msg(EmuDesign::passthrough(6)),
            "emulated design passthrough: buffer 0 is 6 bytes; expected a positive multiple of 4 \
             below 4 GiB (a shim DMA descriptor counts 32-bit words)"
        );
        assert_eq!(
            msg(EmuDesign {
                num_args: 2,
                ..EmuDesign::passthrough(64)
            }),
            "emulated design passthrough: num_args is 2; expected 3"
        );
        assert_eq!(
            msg(EmuDesign {
                scalar: 1,
                ..EmuDesign::relu(4, DType::I32)
            }),
            "emulated design relu: scalar is 1; expected 0 (only the vector_scalar_add kernels \
             and vector_scalar_mul use it)"
        );
        assert_eq!(
            msg(EmuDesign {
                m: 1,
                ..EmuDesign::relu(4, DType::I32)
            }),
            "emulated design relu: m and k are 1 and 0; expected 0 (only matmul uses them)"
        );
        assert_eq!(
            msg(EmuDesign::noop(65, 4)),
            "emulated design noop: num_args is 65; expected at most 64"
        );
    }

    #[test]
    fn insts_patch_one_buffer_each_with_its_size() {
        for generation in [NpuGen::Npu1, NpuGen::Npu2] {
            // Every constructor: each buffer's BD gets its length before its patch.
            for d in [
                EmuDesign::passthrough(4096),
                EmuDesign::vector_scalar_add(1024, DType::I32, 1),
                EmuDesign::vector_vector_add(256, DType::Bf16),
                EmuDesign::vector_scale(4096, DType::I16),
                EmuDesign::vector_scalar_add_inplace(1024, DType::I32, 1),
                EmuDesign::vector_scalar_add_unused(64, DType::U32, 41),
                EmuDesign::vector_scale_mid(1024, DType::I32),
                EmuDesign::vector_mul(256, DType::U8),
                EmuDesign::relu(64, DType::I16),
                EmuDesign::matmul(8, 16, 4, DType::Bf16, DType::F32),
                EmuDesign::noop(20, 64),
                EmuDesign::noop(0, 4),
                EmuDesign::fault(4),
                EmuDesign::hang(1 << 20),
            ] {
                d.validate().unwrap();
                let p = TxnProgram::parse(&d.insts(generation)).unwrap();
                assert_eq!(p.generation, generation);
                assert_eq!(p.version, (0, 1));
                assert_eq!(p.min_arg_sizes(), d.arg_sizes());
                assert_eq!(p.arg_count(), usize::from(d.num_args));
                for a in &p.args {
                    assert_eq!(a.patches.len(), 1);
                    assert_eq!(a.patches[0].folded, a.index >= 5);
                    assert_eq!(a.patches[0].offset, 0);
                }
            }
        }
    }
}

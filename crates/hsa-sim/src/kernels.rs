//! Reference kernels: what an emulated design computes instead of AIE cores, with the
//! semantics of IRON's programming examples (`iron-host.md` §5).
//!
//! Kernels work on copies of the argument bytes (decoded with `bytemuck`, which makes no
//! alignment assumption) and return the output buffer's new bytes; the dispatcher copies them
//! back. Integer arithmetic wraps; bf16 is computed in f32 and rounded to nearest even.
//!
//! | Kernel | Inputs → output | Semantics |
//! |---|---|---|
//! | passthrough | 0 → 1 | bytes copied (argument 2 is IRON's unused trace slot) |
//! | vector_scalar_add | 0 → 1 | `out = in + scalar` |
//! | vector_scalar_add_inplace | 0 → 0 | `inout = inout + scalar`, in place |
//! | vector_scalar_add_unused | 0 → 2 | `out = in + scalar` (argument 1 is unused) |
//! | vector_scalar_mul | 0 → 0 | `inout = inout * scalar`, in place |
//! | vector_scale | 0, 2 → 1 | `out = in * factor[0]`, the factor an i32 buffer |
//! | vector_scale_mid | 0, 1 → 2 | `out = in * factor[0]`, the factor an i32 buffer |
//! | vector_vector_add | 0, 1 → 2 | `c = a + b` |
//! | vector_mul | 0, 1 → 2 | `c = a * b` |
//! | relu | 0 → 1 | `max(x, 0)` (unsigned types unchanged) |
//! | matmul | 0, 1 → 2 | `C = A @ B`, row-major, integers accumulated in wrapping i32, floats in f32 |
//! | noop, fault, hang | none | nothing (fault and hang are handled by the dispatcher) |

use bytemuck::Pod;
use half::bf16;
use npu_artifacts::emu::{DType, EmuDesign, EmuKernel};

/// The arguments a kernel reads and the one it writes.
pub(crate) fn io(kernel: EmuKernel) -> (&'static [usize], Option<usize>) {
    match kernel {
        EmuKernel::Passthrough | EmuKernel::VectorScalarAdd | EmuKernel::Relu => (&[0], Some(1)),
        EmuKernel::VectorScalarMul | EmuKernel::VectorScalarAddInPlace => (&[0], Some(0)),
        EmuKernel::VectorScalarAddUnused => (&[0], Some(2)),
        // Inputs in the order (in, factor).
        EmuKernel::VectorScale => (&[0, 2], Some(1)),
        EmuKernel::VectorScaleMid => (&[0, 1], Some(2)),
        EmuKernel::VectorVectorAdd | EmuKernel::VectorMul | EmuKernel::Matmul => (&[0, 1], Some(2)),
        EmuKernel::Noop | EmuKernel::Fault | EmuKernel::Hang => (&[], None),
    }
}

trait Elem: Pod {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn relu(self) -> Self;
    fn from_scalar(s: i64) -> Self;
}

macro_rules! int_elem {
    ($($t:ty: $relu:expr),*) => {$(
        impl Elem for $t {
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn relu(self) -> Self { let f: fn($t) -> $t = $relu; f(self) }
            // Truncation is the point: the scalar wraps into the element type.
            #[allow(clippy::cast_possible_truncation)]
            fn from_scalar(s: i64) -> Self { s as $t }
        }
    )*};
}

int_elem!(u8: |x| x, i8: |x| x.max(0), i16: |x| x.max(0), i32: |x| x.max(0), u32: |x| x);

impl Elem for f32 {
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
    fn relu(self) -> Self {
        if self < 0.0 { 0.0 } else { self }
    }
    #[allow(clippy::cast_precision_loss)]
    fn from_scalar(s: i64) -> Self {
        s as f32
    }
}

impl Elem for bf16 {
    fn add(self, o: Self) -> Self {
        bf16::from_f32(self.to_f32() + o.to_f32())
    }
    fn mul(self, o: Self) -> Self {
        bf16::from_f32(self.to_f32() * o.to_f32())
    }
    fn relu(self) -> Self {
        if self.to_f32() < 0.0 {
            bf16::ZERO
        } else {
            self
        }
    }
    #[allow(clippy::cast_precision_loss)]
    fn from_scalar(s: i64) -> Self {
        bf16::from_f32(s as f32)
    }
}

fn decode<T: Pod>(bytes: &[u8], n: usize) -> Vec<T> {
    let len = (n * size_of::<T>()).min(bytes.len());
    bytemuck::pod_collect_to_vec(&bytes[..len - len % size_of::<T>()])
}

fn encode<T: Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

fn unary<T: Elem>(a: &[u8], n: usize, f: impl Fn(T) -> T) -> Vec<u8> {
    encode(&decode::<T>(a, n).into_iter().map(f).collect::<Vec<_>>())
}

fn binary<T: Elem>(a: &[u8], b: &[u8], n: usize, f: impl Fn(T, T) -> T) -> Vec<u8> {
    let (a, b) = (decode::<T>(a, n), decode::<T>(b, n));
    encode(
        &a.into_iter()
            .zip(b)
            .map(|(x, y)| f(x, y))
            .collect::<Vec<_>>(),
    )
}

/// Runs `body` with `$T` bound to the Rust type of a dtype.
macro_rules! with_dtype {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::I16 => {
                type $T = i16;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::Bf16 => {
                type $T = bf16;
                $body
            }
        }
    };
}

fn to_i32(bytes: &[u8], d: DType, n: usize) -> Option<Vec<i32>> {
    Some(match d {
        DType::U8 => decode::<u8>(bytes, n).into_iter().map(i32::from).collect(),
        DType::I8 => decode::<i8>(bytes, n).into_iter().map(i32::from).collect(),
        DType::I16 => decode::<i16>(bytes, n).into_iter().map(i32::from).collect(),
        DType::I32 => decode::<i32>(bytes, n),
        DType::U32 => bytemuck::cast_vec(decode::<u32>(bytes, n)),
        DType::F32 | DType::Bf16 => return None,
    })
}

fn to_f32(bytes: &[u8], d: DType, n: usize) -> Option<Vec<f32>> {
    Some(match d {
        DType::F32 => decode::<f32>(bytes, n),
        DType::Bf16 => decode::<bf16>(bytes, n)
            .into_iter()
            .map(bf16::to_f32)
            .collect(),
        _ => return None,
    })
}

/// `C = A @ B` with wrapping i32 accumulation (A m×k, B k×n, row-major).
pub(crate) fn matmul_i32(a: &[i32], b: &[i32], m: usize, k: usize, n: usize) -> Vec<i32> {
    let mut c = vec![0i32; m * n];
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            for (cj, &bj) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *cj = cj.wrapping_add(x.wrapping_mul(bj));
            }
        }
    }
    c
}

/// `C = A @ B` with f32 accumulation.
pub(crate) fn matmul_f32(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            for (cj, &bj) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *cj += x * bj;
            }
        }
    }
    c
}

fn matmul(d: &EmuDesign, a: &[u8], b: &[u8]) -> Result<Vec<u8>, String> {
    let (m, k, n) = (d.m as usize, d.k as usize, d.n as usize);
    let unsupported = || {
        format!(
            "matmul {} → {} is not supported",
            d.dtype_in.name(),
            d.dtype_out.name()
        )
    };
    match d.dtype_out {
        DType::I32 | DType::U32 => {
            let a = to_i32(a, d.dtype_in, m * k).ok_or_else(unsupported)?;
            let b = to_i32(b, d.dtype_in, k * n).ok_or_else(unsupported)?;
            if a.len() < m * k || b.len() < k * n {
                return Err("matmul inputs are shorter than the design's sizes".into());
            }
            Ok(encode(&matmul_i32(&a, &b, m, k, n)))
        }
        DType::F32 | DType::Bf16 => {
            let a = to_f32(a, d.dtype_in, m * k).ok_or_else(unsupported)?;
            let b = to_f32(b, d.dtype_in, k * n).ok_or_else(unsupported)?;
            if a.len() < m * k || b.len() < k * n {
                return Err("matmul inputs are shorter than the design's sizes".into());
            }
            let c = matmul_f32(&a, &b, m, k, n);
            Ok(if d.dtype_out == DType::F32 {
                encode(&c)
            } else {
                encode(&c.into_iter().map(bf16::from_f32).collect::<Vec<_>>())
            })
        }
        _ => Err(unsupported()),
    }
}

/// Computes the output bytes of `design` from its input buffers (in the order of [`io`]).
/// Returns `None` for kernels that write nothing.
///
/// # Errors
/// A sentence naming an unsupported dtype combination.
pub(crate) fn run(design: &EmuDesign, inputs: &[Vec<u8>]) -> Result<Option<Vec<u8>>, String> {
    let n = design.n as usize;
    let input = |i: usize| inputs.get(i).map_or(&[][..], Vec::as_slice);
    let bytes_in: u64 = inputs.iter().map(|v| v.len() as u64).sum();
    if matches!(
        design.kernel,
        EmuKernel::Noop | EmuKernel::Fault | EmuKernel::Hang
    ) {
        crate::timing::kernel(bytes_in, 0);
        return Ok(None);
    }
    if design.kernel != EmuKernel::Matmul && design.dtype_in != design.dtype_out {
        return Err(format!(
            "{} with {} in and {} out is not supported",
            design.kernel.name(),
            design.dtype_in.name(),
            design.dtype_out.name()
        ));
    }
    let d = design.dtype_in;
    let out = match design.kernel {
        EmuKernel::Passthrough => input(0)[..(n * d.size()).min(input(0).len())].to_vec(),
        EmuKernel::VectorScalarAdd
        | EmuKernel::VectorScalarAddInPlace
        | EmuKernel::VectorScalarAddUnused => with_dtype!(d, T => {
            let s = T::from_scalar(design.scalar);
            unary::<T>(input(0), n, |x| x.add(s))
        }),
        EmuKernel::VectorScalarMul => with_dtype!(d, T => {
            let s = T::from_scalar(design.scalar);
            unary::<T>(input(0), n, |x| x.mul(s))
        }),
        EmuKernel::VectorScale | EmuKernel::VectorScaleMid => {
            // The factor buffer's first i32, converted (wrapping) to the element type as the
            // design's scalar is.
            let factor = decode::<i32>(input(1), 1)
                .first()
                .copied()
                .ok_or("the factor buffer holds no i32")?;
            with_dtype!(d, T => {
                let s = T::from_scalar(i64::from(factor));
                unary::<T>(input(0), n, |x| x.mul(s))
            })
        }
        EmuKernel::VectorVectorAdd => {
            with_dtype!(d, T => binary::<T>(input(0), input(1), n, Elem::add))
        }
        EmuKernel::VectorMul => with_dtype!(d, T => binary::<T>(input(0), input(1), n, Elem::mul)),
        EmuKernel::Relu => with_dtype!(d, T => unary::<T>(input(0), n, Elem::relu)),
        EmuKernel::Matmul => matmul(design, input(0), input(1))?,
        EmuKernel::Noop | EmuKernel::Fault | EmuKernel::Hang => return Ok(None),
    };
    let ops = match design.kernel {
        EmuKernel::Matmul => 2 * u64::from(design.m) * u64::from(design.k) * u64::from(design.n),
        _ => 0,
    };
    crate::timing::kernel(bytes_in + out.len() as u64, ops);
    Ok(Some(out))
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
mod tests {
    use super::*;

    fn bytes<T: Pod>(v: &[T]) -> Vec<u8> {
        encode(v)
    }

    #[test]
    fn vector_scalar_add_wraps_integers() {
        let d = EmuDesign::vector_scalar_add(3, DType::I32, 1);
        let out = run(&d, &[bytes(&[1i32, -1, i32::MAX])]).unwrap().unwrap();
        assert_eq!(decode::<i32>(&out, 3), vec![2, 0, i32::MIN]);
    }

    #[test]
    fn vector_scale_reads_its_factor_from_the_buffer() {
        let x = bytes(&[-3i16, 4, 300, i16::MAX]);
        for d in [
            EmuDesign::vector_scale(4, DType::I16),
            EmuDesign::vector_scale_mid(4, DType::I16),
        ] {
            // Inputs in io() order: (in, factor).
            let out = run(&d, &[x.clone(), bytes(&[3i32])]).unwrap().unwrap();
            assert_eq!(
                decode::<i16>(&out, 4),
                vec![-9, 12, 900, i16::MAX.wrapping_mul(3)]
            );
            let e = run(&d, &[x.clone(), vec![]]).unwrap_err();
            assert_eq!(e, "the factor buffer holds no i32");
        }
        assert_eq!(io(EmuKernel::VectorScale), (&[0, 2][..], Some(1)));
        assert_eq!(io(EmuKernel::VectorScaleMid), (&[0, 1][..], Some(2)));
    }

    #[test]
    fn elementwise_kernels_match_their_definitions() {
        let a = bytes(&[-3i16, 4, 300]);
        let b = bytes(&[5i16, -6, 300]);
        let add = run(
            &EmuDesign::vector_vector_add(3, DType::I16),
            &[a.clone(), b.clone()],
        );
        assert_eq!(decode::<i16>(&add.unwrap().unwrap(), 3), vec![2, -2, 600]);
        let mul = run(&EmuDesign::vector_mul(3, DType::I16), &[a.clone(), b]);
        assert_eq!(
            decode::<i16>(&mul.unwrap().unwrap(), 3),
            vec![-15, -24, 300i16.wrapping_mul(300)]
        );
        let relu = run(&EmuDesign::relu(3, DType::I16), &[a]).unwrap().unwrap();
        assert_eq!(decode::<i16>(&relu, 3), vec![0, 4, 300]);
        let f = bytes(&[bf16::from_f32(-1.5), bf16::from_f32(2.5)]);
        let relu = run(&EmuDesign::relu(2, DType::Bf16), &[f])
            .unwrap()
            .unwrap();
        assert_eq!(
            decode::<bf16>(&relu, 2),
            vec![bf16::ZERO, bf16::from_f32(2.5)]
        );
    }

    #[test]
    fn unaligned_input_bytes_decode() {
        let mut raw = [0u8; 1 + 8];
        raw[1..5].copy_from_slice(&7i32.to_le_bytes());
        raw[5..9].copy_from_slice(&9i32.to_le_bytes());
        assert_eq!(decode::<i32>(&raw[1..], 2), vec![7, 9]);
    }

    #[test]
    fn matmul_i16_to_i32_matches_a_naive_loop() {
        let (m, k, n) = (3usize, 4usize, 2usize);
        let a: Vec<i16> = (0..m * k)
            .map(|i| i16::try_from(i).unwrap() * 7 - 20)
            .collect();
        let b: Vec<i16> = (0..k * n)
            .map(|i| 30 - i16::try_from(i).unwrap() * 3)
            .collect();
        let d = EmuDesign::matmul(3, 4, 2, DType::I16, DType::I32);
        let c = decode::<i32>(&run(&d, &[bytes(&a), bytes(&b)]).unwrap().unwrap(), m * n);
        for i in 0..m {
            for j in 0..n {
                let want: i32 = (0..k)
                    .map(|p| i32::from(a[i * k + p]) * i32::from(b[p * n + j]))
                    .sum();
                assert_eq!(c[i * n + j], want);
            }
        }
    }

    /// Elementwise kernels for every dtype against arithmetic done independently: integers
    /// in i64 then truncated to the width (two's-complement wrapping), floats in f32.
    #[test]
    fn elementwise_kernels_cover_every_dtype() {
        fn ints<T: Pod>(n: usize, seed: i64, conv: impl Fn(i64) -> T) -> Vec<u8> {
            let v: Vec<T> = (0..n as i64)
                .map(|i| conv((i * 7919 + seed) * 104_729 - 3_000_000))
                .collect();
            encode(&v)
        }
        macro_rules! check_int {
            ($t:ty, $d:expr) => {{
                let n = 97;
                let (a, b) = (ints::<$t>(n, 1, |x| x as $t), ints::<$t>(n, 5, |x| x as $t));
                let (xa, xb) = (decode::<$t>(&a, n), decode::<$t>(&b, n));
                let add = run(
                    &EmuDesign::vector_vector_add(n as u32, $d),
                    &[a.clone(), b.clone()],
                );
                let want: Vec<$t> = xa
                    .iter()
                    .zip(&xb)
                    .map(|(p, q)| (*p as i64 + *q as i64) as $t)
                    .collect();
                assert_eq!(
                    decode::<$t>(&add.unwrap().unwrap(), n),
                    want,
                    "add {:?}",
                    $d
                );
                let mul = run(&EmuDesign::vector_mul(n as u32, $d), &[a.clone(), b]);
                let want: Vec<$t> = xa
                    .iter()
                    .zip(&xb)
                    .map(|(p, q)| (*p as i64).wrapping_mul(*q as i64) as $t)
                    .collect();
                assert_eq!(
                    decode::<$t>(&mul.unwrap().unwrap(), n),
                    want,
                    "mul {:?}",
                    $d
                );
                let vsa = run(
                    &EmuDesign::vector_scalar_add(n as u32, $d, 3),
                    std::slice::from_ref(&a),
                );
                let want: Vec<$t> = xa.iter().map(|p| (*p as i64 + 3) as $t).collect();
                assert_eq!(
                    decode::<$t>(&vsa.unwrap().unwrap(), n),
                    want,
                    "vsa {:?}",
                    $d
                );
                let relu = run(&EmuDesign::relu(n as u32, $d), &[a]);
                let want: Vec<$t> = xa
                    .iter()
                    .map(|p| if (*p as i64) < 0 { 0 as $t } else { *p })
                    .collect();
                assert_eq!(
                    decode::<$t>(&relu.unwrap().unwrap(), n),
                    want,
                    "relu {:?}",
                    $d
                );
            }};
        }
        check_int!(u8, DType::U8);
        check_int!(i8, DType::I8);
        check_int!(i16, DType::I16);
        check_int!(i32, DType::I32);
        check_int!(u32, DType::U32);

        let n = 64;
        let fa: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 9.0).collect();
        let fb: Vec<f32> = (0..n).map(|i| 5.5 - i as f32 * 0.21).collect();
        let out = run(
            &EmuDesign::vector_mul(n as u32, DType::F32),
            &[encode(&fa), encode(&fb)],
        );
        let want: Vec<f32> = fa.iter().zip(&fb).map(|(p, q)| p * q).collect();
        assert_eq!(decode::<f32>(&out.unwrap().unwrap(), n), want);
        let (ha, hb): (Vec<bf16>, Vec<bf16>) = (
            fa.iter().map(|x| bf16::from_f32(*x)).collect(),
            fb.iter().map(|x| bf16::from_f32(*x)).collect(),
        );
        let out = run(
            &EmuDesign::vector_vector_add(n as u32, DType::Bf16),
            &[encode(&ha), encode(&hb)],
        );
        let want: Vec<bf16> = ha
            .iter()
            .zip(&hb)
            .map(|(p, q)| bf16::from_f32(p.to_f32() + q.to_f32()))
            .collect();
        assert_eq!(decode::<bf16>(&out.unwrap().unwrap(), n), want);
        let out = run(
            &EmuDesign::vector_scalar_add(n as u32, DType::Bf16, -2),
            &[encode(&ha)],
        );
        let want: Vec<bf16> = ha
            .iter()
            .map(|p| bf16::from_f32(p.to_f32() - 2.0))
            .collect();
        assert_eq!(decode::<bf16>(&out.unwrap().unwrap(), n), want);
    }

    #[test]
    fn unsupported_dtypes_are_refused_with_a_sentence() {
        let d = EmuDesign::matmul(1, 1, 1, DType::Bf16, DType::I32);
        let e = run(&d, &[vec![0; 2], vec![0; 2]]).unwrap_err();
        assert!(e.contains("not supported"), "{e}");
    }
}

//! The emulated `main.pdi` byte layout (version 1): [`EmuDesign::to_pdi`] and
//! [`EmuDesign::from_pdi`]. The table is in the [crate docs](crate#the-emulated-mainpdi-format-version-1).

use super::{DType, EmuDesign, EmuKernel};
use crate::ArtifactError;
use crate::le::{u16_at, u32_at, u64_at};

/// The magic an emulated `main.pdi` starts with.
pub const MAGIC: &[u8; 8] = b"NPUD-EMU";
/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;
/// Header length in bytes (the whole file in version 1).
pub const HEADER_LEN: u16 = 80;

const KERNEL_AT: usize = 12;
const KERNEL_LEN: usize = 32;
const CHECKSUM_AT: usize = 76;

/// Reserved byte ranges that must be zero.
const RESERVED: [(usize, usize); 3] = [(47, 1), (60, 4), (72, 4)];

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), as zlib computes it.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

fn err(detail: String) -> ArtifactError {
    ArtifactError::Emu { detail }
}

impl EmuDesign {
    /// The design as an emulated `main.pdi` (80 bytes).
    #[must_use]
    pub fn to_pdi(&self) -> Vec<u8> {
        let mut b = vec![0u8; usize::from(HEADER_LEN)];
        b[0..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&HEADER_LEN.to_le_bytes());
        let name = self.kernel.name().as_bytes();
        b[KERNEL_AT..KERNEL_AT + name.len()].copy_from_slice(name);
        b[44] = self.dtype_in.code();
        b[45] = self.dtype_out.code();
        b[46] = self.num_args;
        b[48..52].copy_from_slice(&self.m.to_le_bytes());
        b[52..56].copy_from_slice(&self.k.to_le_bytes());
        b[56..60].copy_from_slice(&self.n.to_le_bytes());
        b[64..72].copy_from_slice(&self.scalar.to_le_bytes());
        let crc = crc32(&b[..CHECKSUM_AT]);
        b[CHECKSUM_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads an emulated `main.pdi` and validates the design it names.
    ///
    /// # Errors
    ///
    /// [`ArtifactError::Emu`] for a wrong magic, unknown version, wrong header or file length,
    /// failing checksum, unknown kernel or dtype, or non-zero reserved bytes (each with its byte
    /// offset, what was expected and what was found); [`ArtifactError::EmuInvalid`] for
    /// parameters the kernel does not accept.
    ///
    /// # Cost
    ///
    /// Constant: the format is one 80-byte header; nothing is allocated for longer input.
    pub fn from_pdi(bytes: &[u8]) -> Result<Self, ArtifactError> {
        if !bytes.starts_with(MAGIC) {
            let first: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
            return Err(err(format!(
                "magic (byte offset 0) is [{}]; expected \"NPUD-EMU\"",
                first.join(" ")
            )));
        }
        let version = u16_at(bytes, 8).ok_or_else(|| too_short(bytes.len()))?;
        if version != VERSION {
            return Err(err(format!(
                "format version (byte offset 8) is {version}; expected {VERSION} (this file was \
                 written by another npud release)"
            )));
        }
        let header_len = u16_at(bytes, 10).ok_or_else(|| too_short(bytes.len()))?;
        if header_len != HEADER_LEN {
            return Err(err(format!(
                "header length (byte offset 10) is {header_len}; expected {HEADER_LEN}"
            )));
        }
        if bytes.len() != usize::from(HEADER_LEN) {
            return Err(err(format!(
                "file is {} bytes; expected exactly {HEADER_LEN}",
                bytes.len()
            )));
        }
        let stored = u32_at(bytes, CHECKSUM_AT).unwrap_or(0);
        let computed = crc32(&bytes[..CHECKSUM_AT]);
        if stored != computed {
            return Err(err(format!(
                "checksum (byte offset {CHECKSUM_AT}) is {stored:#010x}; expected {computed:#010x} \
                 (CRC-32 of bytes 0..{CHECKSUM_AT}): the file is corrupt"
            )));
        }
        let kernel = kernel_at(bytes)?;
        let dtype = |at: usize| {
            DType::from_code(bytes[at]).ok_or_else(|| {
                err(format!(
                    "dtype code (byte offset {at}) is {}; expected 1..=7 (u8, i8, i16, i32, u32, f32, bf16)",
                    bytes[at]
                ))
            })
        };
        let (dtype_in, dtype_out) = (dtype(44)?, dtype(45)?);
        for (at, len) in RESERVED {
            if let Some(i) = bytes[at..at + len].iter().position(|&b| b != 0) {
                return Err(err(format!(
                    "reserved byte at offset {} is {:#04x}; expected 0",
                    at + i,
                    bytes[at + i]
                )));
            }
        }
        let design = EmuDesign {
            kernel,
            dtype_in,
            dtype_out,
            m: u32_at(bytes, 48).unwrap_or(0),
            k: u32_at(bytes, 52).unwrap_or(0),
            n: u32_at(bytes, 56).unwrap_or(0),
            scalar: u64_at(bytes, 64).map_or(0, |v| i64::from_le_bytes(v.to_le_bytes())),
            num_args: bytes[46],
        };
        design.validate()?;
        Ok(design)
    }
}

fn too_short(len: usize) -> ArtifactError {
    err(format!(
        "file is {len} bytes; expected exactly {HEADER_LEN}"
    ))
}

fn kernel_at(bytes: &[u8]) -> Result<EmuKernel, ArtifactError> {
    let field = &bytes[KERNEL_AT..KERNEL_AT + KERNEL_LEN];
    let end = field.iter().position(|&b| b == 0).unwrap_or(KERNEL_LEN);
    if let Some(i) = field[end..].iter().position(|&b| b != 0) {
        return Err(err(format!(
            "kernel name (byte offset {KERNEL_AT}) is not NUL-padded: byte {} is {:#04x} after the \
             terminating NUL; expected 0",
            KERNEL_AT + end + i,
            field[end + i]
        )));
    }
    let name = std::str::from_utf8(&field[..end]).map_err(|_| {
        err(format!(
            "kernel name (byte offset {KERNEL_AT}) is not ASCII: {:?}",
            String::from_utf8_lossy(&field[..end])
        ))
    })?;
    name.parse::<EmuKernel>().map_err(|_| {
        err(format!(
            "kernel (byte offset {KERNEL_AT}) is {name:?}; expected one of {}",
            EmuKernel::ALL.map(EmuKernel::name).join(", ")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resealed(mut b: Vec<u8>) -> Vec<u8> {
        let crc = crc32(&b[..CHECKSUM_AT]);
        b[CHECKSUM_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn msg(b: &[u8]) -> String {
        EmuDesign::from_pdi(b).unwrap_err().to_string()
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn layout_matches_the_documented_table() {
        let b = EmuDesign::vector_scalar_add(1024, DType::I32, -3).to_pdi();
        assert_eq!(b.len(), 80);
        assert_eq!(&b[0..8], b"NPUD-EMU");
        assert_eq!(&b[8..12], &[1, 0, 80, 0]);
        assert_eq!(&b[12..29], b"vector_scalar_add");
        assert!(b[29..44].iter().all(|&x| x == 0));
        assert_eq!(&b[44..48], &[4, 4, 2, 0]);
        assert_eq!(&b[48..60], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0]);
        assert_eq!(&b[64..72], &(-3i64).to_le_bytes());
        assert_eq!(
            u32::from_le_bytes([b[76], b[77], b[78], b[79]]),
            crc32(&b[..76])
        );
    }

    #[test]
    fn every_kernel_round_trips() {
        for d in [
            EmuDesign::passthrough(4096),
            EmuDesign::vector_scalar_add(16, DType::I8, -128),
            EmuDesign::vector_vector_add(16, DType::F32),
            EmuDesign::vector_mul(16, DType::U32),
            EmuDesign::relu(16, DType::Bf16),
            EmuDesign::matmul(4, 8, 2, DType::I16, DType::I32),
            EmuDesign::noop(7, 64),
            EmuDesign::fault(4),
            EmuDesign::hang(4),
        ] {
            assert_eq!(EmuDesign::from_pdi(&d.to_pdi()).unwrap(), d);
        }
    }

    #[test]
    fn each_malformation_has_its_own_message() {
        let good = EmuDesign::relu(16, DType::I32).to_pdi();

        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(
            msg(&b),
            "emulated design: magic (byte offset 0) is [58 50 55 44 2d 45 4d 55]; expected \"NPUD-EMU\""
        );

        let mut b = good.clone();
        b[8] = 2;
        assert_eq!(
            msg(&resealed(b)),
            "emulated design: format version (byte offset 8) is 2; expected 1 (this file was \
             written by another npud release)"
        );

        let mut b = good.clone();
        b[10] = 96;
        assert_eq!(
            msg(&resealed(b)),
            "emulated design: header length (byte offset 10) is 96; expected 80"
        );

        let mut b = good.clone();
        b.push(0);
        assert_eq!(
            msg(&b),
            "emulated design: file is 81 bytes; expected exactly 80"
        );
        assert_eq!(
            msg(&good[..9]),
            "emulated design: file is 9 bytes; expected exactly 80"
        );

        let mut b = good.clone();
        b[56] ^= 0x40;
        assert!(msg(&b).starts_with("emulated design: checksum (byte offset 76) is 0x"));
        assert!(msg(&b).ends_with("(CRC-32 of bytes 0..76): the file is corrupt"));

        let mut b = good.clone();
        b[12..16].copy_from_slice(b"gelu");
        assert!(msg(&resealed(b)).starts_with(
            "emulated design: kernel (byte offset 12) is \"gelu\"; expected one of passthrough,"
        ));

        let mut b = good.clone();
        b[40] = b'x';
        assert_eq!(
            msg(&resealed(b)),
            "emulated design: kernel name (byte offset 12) is not NUL-padded: byte 40 is 0x78 \
             after the terminating NUL; expected 0"
        );

        let mut b = good.clone();
        b[45] = 9;
        assert_eq!(
            msg(&resealed(b)),
            "emulated design: dtype code (byte offset 45) is 9; expected 1..=7 (u8, i8, i16, \
             i32, u32, f32, bf16)"
        );

        let mut b = good.clone();
        b[61] = 1;
        assert_eq!(
            msg(&resealed(b)),
            "emulated design: reserved byte at offset 61 is 0x01; expected 0"
        );

        let mut b = good;
        b[46] = 5;
        assert_eq!(
            msg(&resealed(b)),
            "emulated design relu: num_args is 5; expected 2"
        );
    }
}

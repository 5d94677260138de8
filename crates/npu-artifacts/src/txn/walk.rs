//! The TXN header and the op walk shared by [`super::TxnProgram::parse`] and [`super::listing`].
//!
//! The walk never panics, never loops (every op consumes at least one word, so it stops within
//! `len / 4` steps) and allocates only in proportion to the bytes it has already checked.

use super::{TxnOp, opcode};
use crate::{ArtifactError, NpuGen};

/// Length of the TXN header in bytes.
pub(crate) const HEADER_BYTES: usize = 16;

/// Fold bit the XRT/HSA firmware ABI adds to `arg_plus` for arguments 5 and above.
pub(crate) const FOLD_BIT: u32 = 0x8000_0000;

/// Arguments at this index and above must carry [`FOLD_BIT`].
pub(crate) const FIRST_FOLDED_ARG: u32 = 5;

/// The decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub major: u8,
    pub minor: u8,
    pub generation: NpuGen,
    pub rows: u8,
    pub cols: u8,
    pub mem_tile_rows: u8,
    pub op_count: u32,
    pub size_bytes: u32,
}

impl Header {
    pub(crate) fn is_current(&self) -> bool {
        (self.major, self.minor) == (0, 1)
    }
}

/// One decoded op with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Located {
    pub index: u32,
    pub offset: usize,
    pub op: TxnOp,
}

pub(crate) use crate::le::u32_at as word;

/// Checks the stream-level rules and decodes the header.
pub(crate) fn header(bytes: &[u8]) -> Result<Header, ArtifactError> {
    if bytes.len() < HEADER_BYTES {
        return Err(ArtifactError::TxnTooShort { found: bytes.len() });
    }
    if !bytes.len().is_multiple_of(4) {
        return Err(ArtifactError::TxnNotWords { found: bytes.len() });
    }
    let [major, minor, dev_gen, rows] = bytes[0..4] else {
        unreachable!("length checked above")
    };
    if !matches!((major, minor), (0, 1) | (1, 0)) {
        return Err(ArtifactError::TxnVersion { major, minor });
    }
    let generation =
        NpuGen::from_txn_dev_gen(dev_gen).ok_or(ArtifactError::TxnGeneration { found: dev_gen })?;
    let (cols, mem_tile_rows) = (bytes[4], bytes[5]);
    let op_count = word(bytes, 8).unwrap_or(0);
    let size_bytes = word(bytes, 12).unwrap_or(0);
    if usize::try_from(size_bytes).ok() != Some(bytes.len()) {
        return Err(ArtifactError::TxnSizeMismatch {
            declared: size_bytes,
            found: bytes.len(),
        });
    }
    Ok(Header {
        major,
        minor,
        generation,
        rows,
        cols,
        mem_tile_rows,
        op_count,
        size_bytes,
    })
}

/// Walks every op, calling `visit` for each, and checks that the walk ends exactly at the end of
/// the stream after exactly the declared number of ops.
pub(crate) fn walk(
    bytes: &[u8],
    mut visit: impl FnMut(&Header, Located) -> Result<(), ArtifactError>,
) -> Result<Header, ArtifactError> {
    let header = header(bytes)?;
    let mut offset = HEADER_BYTES;
    let mut index: u32 = 0;
    while offset < bytes.len() {
        if index == header.op_count {
            return Err(ArtifactError::TxnOpCount {
                declared: header.op_count,
                detail: format!(
                    "{} bytes remain at byte offset {offset}, after {}",
                    bytes.len() - offset,
                    if index == 0 {
                        "the header".to_string()
                    } else {
                        format!("op {}", index - 1)
                    },
                ),
            });
        }
        let (op, len) = decode(&header, bytes, offset, index)?;
        visit(&header, Located { index, offset, op })?;
        // `decode` guarantees 4 <= len <= remaining, so this neither overflows nor stalls.
        offset += len;
        index += 1;
    }
    if index != header.op_count {
        return Err(ArtifactError::TxnOpCount {
            declared: header.op_count,
            detail: format!("the stream ends at byte offset {offset} after {index} ops"),
        });
    }
    Ok(header)
}

/// A view of one op's words, with the error context it needs.
struct OpView<'a> {
    bytes: &'a [u8],
    offset: usize,
    index: u32,
    name: &'static str,
}

impl OpView<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.offset
    }

    /// Word `i` of the op, failing with "truncated" when the op needs `need_words` words.
    fn w(&self, i: usize, need_words: usize) -> Result<u32, ArtifactError> {
        word(self.bytes, self.offset + i * 4).ok_or_else(|| self.truncated(need_words as u64 * 4))
    }

    fn truncated(&self, needed: u64) -> ArtifactError {
        ArtifactError::TxnTruncated {
            op_index: self.index,
            offset: self.offset,
            name: self.name,
            needed,
            remaining: self.remaining(),
        }
    }

    /// Requires `needed` bytes to be present.
    fn need(&self, needed: u64) -> Result<usize, ArtifactError> {
        match usize::try_from(needed) {
            Ok(n) if n <= self.remaining() => Ok(n),
            _ => Err(self.truncated(needed)),
        }
    }

    fn size_error(
        &self,
        word_index: usize,
        expected: impl Into<String>,
        found: u32,
    ) -> ArtifactError {
        ArtifactError::TxnOpSize {
            op_index: self.index,
            offset: self.offset,
            field_offset: self.offset + word_index * 4,
            name: self.name,
            expected: expected.into(),
            found,
        }
    }

    /// Checks a fixed-size op's size field against the allowed sizes and returns the length.
    fn fixed(&self, size_word: usize, allowed: &[u32]) -> Result<usize, ArtifactError> {
        let min = allowed.iter().copied().min().unwrap_or(0);
        let size = word(self.bytes, self.offset + size_word * 4)
            .ok_or_else(|| self.truncated(u64::from(min)))?;
        if !allowed.contains(&size) {
            let expected = allowed
                .iter()
                .map(|s| format!("{s} ({} words)", s / 4))
                .collect::<Vec<_>>()
                .join(" or ");
            return Err(self.size_error(size_word, expected, size));
        }
        self.need(u64::from(size))
    }

    /// Checks a variable-size op's size field (at least `min`, whole words) and returns the length.
    fn variable(&self, size_word: usize, min: u32) -> Result<usize, ArtifactError> {
        let size = word(self.bytes, self.offset + size_word * 4)
            .ok_or_else(|| self.truncated(u64::from(min)))?;
        if size < min || !size.is_multiple_of(4) {
            return Err(self.size_error(
                size_word,
                format!("a multiple of 4 and at least {min} (the op's total size in bytes)"),
                size,
            ));
        }
        self.need(u64::from(size))
    }

    /// Requires word `word_index` (named `field`) to be 0.
    fn zero(
        &self,
        word_index: usize,
        field: &str,
        expected: &'static str,
        need_words: usize,
    ) -> Result<(), ArtifactError> {
        let v = self.w(word_index, need_words)?;
        if v != 0 {
            return Err(ArtifactError::TxnOpField {
                op_index: self.index,
                offset: self.offset,
                name: self.name,
                field: field.to_string(),
                field_offset: self.offset + word_index * 4,
                expected,
                found: v,
            });
        }
        Ok(())
    }

    /// Payload words `from..len/4` (the op is known to be in bounds).
    fn data(&self, from: usize, len: usize) -> Vec<u32> {
        let end = self.offset + len;
        self.bytes[self.offset + from * 4..end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// Decodes the op at `offset`, returning it and its length in bytes (at least 4, at most the
/// bytes remaining).
fn decode(
    header: &Header,
    bytes: &[u8],
    offset: usize,
    index: u32,
) -> Result<(TxnOp, usize), ArtifactError> {
    // The walk only calls this with at least one word left: lengths are whole words.
    let w0 = word(bytes, offset).unwrap_or(0);
    let code = w0.to_le_bytes()[0];
    let Some(name) = opcode::name(code) else {
        return Err(ArtifactError::TxnUnknownOpcode {
            op_index: index,
            offset,
            opcode: code,
            word: w0,
        });
    };
    let v = OpView {
        bytes,
        offset,
        index,
        name,
    };
    if header.is_current() {
        decode_current(&v, code, w0)
    } else {
        decode_older(&v, code)
    }
}

const ADDR_32: &str = "0 (register addresses are 32-bit)";

type DecodeResult = Result<(TxnOp, usize), ArtifactError>;

const WHY_NOT_EMITTED: &str = "IRON's compiler never emits it and its encoded size is not established, \
     so the rest of the stream could not be framed safely";
const WHY_BLOCKSET: &str = "aie-rt serializes block-sets as BLOCKWRITE, so no encoded form of this \
     opcode is established and the rest of the stream could not be framed safely";
const WHY_OLDER: &str =
    "the older (1.0) format only defines WRITE, BLOCKWRITE, MASKWRITE, TCT and DDR_PATCH";

fn decode_current(v: &OpView<'_>, code: u8, w0: u32) -> DecodeResult {
    use opcode::*;
    let hi = |w: usize, need: usize| -> Result<(), ArtifactError> {
        v.zero(w, "register address high word", ADDR_32, need)
    };
    let op_and_len = match code {
        WRITE => {
            let len = v.fixed(5, &[24])?;
            hi(3, 6)?;
            let op = TxnOp::Write {
                addr: v.w(2, 6)?,
                value: v.w(4, 6)?,
            };
            (op, len)
        }
        MASKWRITE | MASKPOLL | MASKPOLL_BUSY => {
            // 7 words as IRON emits them; aie-rt's naturally aligned struct is 8 words. The
            // firmware advances by the size field, so both frame the stream the same way.
            let len = v.fixed(6, &[28, 32])?;
            hi(3, 7)?;
            let (addr, value, mask) = (v.w(2, 7)?, v.w(4, 7)?, v.w(5, 7)?);
            let op = match code {
                MASKWRITE => TxnOp::MaskWrite { addr, value, mask },
                _ => TxnOp::MaskPoll {
                    addr,
                    value,
                    mask,
                    busy: code == MASKPOLL_BUSY,
                },
            };
            (op, len)
        }
        BLOCKWRITE => {
            let len = v.variable(3, 16)?;
            let tile = v.w(1, 4)?.to_le_bytes();
            let op = TxnOp::BlockWrite {
                col: tile[0],
                row: tile[1],
                addr: v.w(2, 4)?,
                data: v.data(4, len),
            };
            (op, len)
        }
        NOOP => (TxnOp::Noop, 4),
        PREEMPT => (
            TxnOp::Preempt {
                level: w0.to_le_bytes()[1],
            },
            4,
        ),
        LOADPDI => {
            let len = v.need(16)?;
            let op = TxnOp::LoadPdi {
                id: u16::from_le_bytes([w0.to_le_bytes()[2], w0.to_le_bytes()[3]]),
                size: v.w(1, 4)?,
                addr: u64::from(v.w(2, 4)?) | (u64::from(v.w(3, 4)?) << 32),
            };
            (op, len)
        }
        LOAD_PM_START => {
            let len = v.need(8)?;
            let op = TxnOp::LoadPmStart {
                sequence_count: w0 >> 8,
                pm_id: v.w(1, 2)?,
            };
            (op, len)
        }
        TCT => {
            let len = v.fixed(1, &[16])?;
            (sync(v.w(2, 4)?, v.w(3, 4)?), len)
        }
        DDR_PATCH => {
            let len = v.fixed(1, &[48])?;
            for w in 2..=4 {
                v.zero(w, &format!("reserved word {w}"), "0", 12)?;
            }
            v.zero(5, "action word", "0 (patch the register)", 12)?;
            v.zero(7, "register address high word", ADDR_32, 12)?;
            v.zero(9, "argument index high word", "0", 12)?;
            v.zero(11, "arg_plus high word", "0 (offsets are below 4 GiB)", 12)?;
            let op = TxnOp::DdrPatch {
                reg_addr: v.w(6, 12)?,
                arg_idx: v.w(8, 12)?,
                arg_plus: v.w(10, 12)?,
            };
            (op, len)
        }
        READ_REGS | MERGE_SYNC => {
            let len = v.variable(1, 8)?;
            let op = TxnOp::Custom {
                opcode: code,
                payload: v.data(2, len),
            };
            (op, len)
        }
        RECORD_TIMER => {
            let len = v.fixed(1, &[12])?;
            (TxnOp::RecordTimer { id: v.w(2, 3)? }, len)
        }
        BLOCKSET => return Err(unsupported(v, code, "0.1", WHY_BLOCKSET)),
        _ => return Err(unsupported(v, code, "0.1", WHY_NOT_EMITTED)),
    };
    Ok(op_and_len)
}

fn decode_older(v: &OpView<'_>, code: u8) -> DecodeResult {
    use opcode::*;
    let op_and_len = match code {
        WRITE => {
            let len = v.need(12)?;
            let op = TxnOp::Write {
                addr: v.w(1, 3)?,
                value: v.w(2, 3)?,
            };
            (op, len)
        }
        MASKWRITE => {
            let len = v.need(16)?;
            let op = TxnOp::MaskWrite {
                addr: v.w(1, 4)?,
                value: v.w(2, 4)?,
                mask: v.w(3, 4)?,
            };
            (op, len)
        }
        BLOCKWRITE => {
            let len = v.variable(2, 12)?;
            let addr = v.w(1, 3)?;
            let op = TxnOp::BlockWrite {
                col: col_of(addr),
                row: row_of(addr),
                addr,
                data: v.data(3, len),
            };
            (op, len)
        }
        TCT => {
            let len = v.fixed(1, &[16])?;
            (sync(v.w(2, 4)?, v.w(3, 4)?), len)
        }
        DDR_PATCH => {
            let len = v.fixed(1, &[24])?;
            v.zero(5, "reserved word 5", "0", 6)?;
            let op = TxnOp::DdrPatch {
                reg_addr: v.w(2, 6)?,
                arg_idx: v.w(3, 6)?,
                arg_plus: v.w(4, 6)?,
            };
            (op, len)
        }
        _ => return Err(unsupported(v, code, "1.0", WHY_OLDER)),
    };
    Ok(op_and_len)
}

fn unsupported(
    v: &OpView<'_>,
    opcode: u8,
    version: &'static str,
    why: &'static str,
) -> ArtifactError {
    ArtifactError::TxnUnsupportedOpcode {
        op_index: v.index,
        offset: v.offset,
        opcode,
        name: v.name,
        version,
        why,
    }
}

fn sync(w2: u32, w3: u32) -> TxnOp {
    let a = w2.to_le_bytes();
    let b = w3.to_le_bytes();
    TxnOp::Sync {
        dir: a[0],
        row: a[1],
        col: a[2],
        row_num: b[1],
        col_num: b[2],
        channel: b[3],
    }
}

/// Column of an absolute AIE2 register address (`col << 25`).
pub(crate) fn col_of(addr: u32) -> u8 {
    addr.to_le_bytes()[3] >> 1
}

/// Row of an absolute AIE2 register address (`row << 20`, 5 bits).
pub(crate) fn row_of(addr: u32) -> u8 {
    ((addr >> 20) & 0x1F).to_le_bytes()[0]
}

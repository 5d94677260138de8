//! `insts.bin`: the TXN (transaction) instruction stream the NPU firmware runs for a dispatch.
//!
//! The stream is little-endian 32-bit words: a 4-word header, then operations.
//!
//! | Header word | Content |
//! |---|---|
//! | 0 | `major \| minor << 8 \| dev_gen << 16 \| num_rows << 24`: version 0.1 (current) or 1.0 (older); dev_gen 3 = npu1, 4 = npu2 |
//! | 1 | `num_cols \| num_mem_tile_rows << 8` |
//! | 2 | number of operations |
//! | 3 | total size in bytes, header included |
//!
//! An op's opcode is the low byte of its first word. Layouts this crate accepts:
//!
//! | Op (opcode) | Current format 0.1 | Older format 1.0 |
//! |---|---|---|
//! | WRITE (0x00) | 6 words `[0, 0, addr, 0, value, 24]` | 3 words `[0, addr, value]` |
//! | BLOCKWRITE (0x01) | `[1, col \| row << 8, addr, size, data...]`, size = total bytes | `[1, addr, size, data...]` |
//! | MASKWRITE (0x03) | 7 words `[3, 0, addr, 0, value, mask, 28]` (aie-rt's 8-word form with size 32 too) | 4 words `[3, addr, value, mask]` |
//! | MASKPOLL (0x04), MASKPOLL_BUSY (0x07) | as MASKWRITE | refused |
//! | NOOP (0x05) | 1 word | refused |
//! | PREEMPT (0x06) | 1 word `[6 \| level << 8]` | refused |
//! | LOADPDI (0x08) | 4 words `[8 \| id << 16, size, addr_lo, addr_hi]` | refused |
//! | LOAD_PM_START (0x09) | 2 words `[9 \| count << 8, pm_id]` | refused |
//! | TCT / sync (0x80) | 4 words `[0x80, 16, dir \| row << 8 \| col << 16, row_num << 8 \| col_num << 16 \| channel << 24]` | same |
//! | DDR_PATCH (0x81) | 12 words: w1 = 48, w2..w5 = 0 (w5 action 0 = patch), w6 reg addr, w8 arg index, w10 arg_plus, w7/w9/w11 = 0 | 6 words `[0x81, 24, addr, arg_idx, arg_plus, 0]` |
//! | READ_REGS (0x82), MERGE_SYNC (0x84) | `[op, size, payload...]`, size = total bytes | refused |
//! | RECORD_TIMER (0x83) | 3 words `[0x83, 12, id]` | refused |
//!
//! Refused as unsupported (with their own message): BLOCKSET (0x02; aie-rt serializes block-sets
//! as BLOCKWRITE, so no encoded form is established), CREATE_SCRATCHPAD, UPDATE_STATE_TABLE,
//! UPDATE_REG, UPDATE_SCRATCH, CONFIG_SHIMDMA_BD and CONFIG_SHIMDMA_DMABUF_BD (0x0A..0x0F; IRON
//! never emits them and their encoded sizes are not established, so the stream after them could
//! not be framed). Any other opcode byte is unknown.
//!
//! # Validation
//!
//! [`TxnProgram::parse`] accepts a stream only if its length is a multiple of 4 and at least 16;
//! header word 3 equals the length; the version is 0.1 or 1.0; the device generation is 3 or 4;
//! walking the ops ends exactly at the end in exactly the declared number of ops; every opcode is
//! known and supported and every size field matches its layout; and every DDR_PATCH targets a
//! word-aligned register in the shim row (row 0), with an argument index below [`MAX_ARGS`] and
//! the folded ABI's bit: arguments 5 and above carry `0x8000_0000` in `arg_plus` (the firmware
//! address-translates only the first five buffers), arguments 0..5 do not. An insts.bin built
//! unfolded (for HRX or full ELF) is refused, since the HSA path would patch wrong addresses.
//!
//! Every DDR_PATCH must also come after a non-zero transfer length for the BD it patches (see
//! below): a patch whose BD's word 0 no earlier op set, or set to 0, is refused with
//! [`ArtifactError::TxnPatchWithoutLength`]. Without a length the DMA would move whatever count
//! the BD already holds, past the client's buffer.
//!
//! # Buffer sizes
//!
//! A DDR_PATCH writes a buffer's device address plus `arg_plus` into a shim DMA buffer
//! descriptor's base-address-low word (BD base + 4, for example `0x1D004 + bd * 0x20`). Word 0 of
//! the BD (the patched register − 4) holds the transfer length in 32-bit words (AIE2; mlir-aie
//! lowers npu2's shim BDs with the same layout). The length is the value the stream last gave
//! that word before the patch: a WRITE or a BLOCKWRITE covering it sets it; a MASKWRITE updates
//! it once known, and sets it from nothing only with a mask of all 32 bits (otherwise the other
//! bits are whatever the register held). The patch records it as [`ArgPatch::bd_len_bytes`] and
//! requires `offset + bd_len_bytes` bytes.
//!
//! The rule follows what aiecc emits. mlir-aie's lowerings (`AIEDmaToNpu.cpp` for
//! `npu.dma_memcpy_nd`, `AIEDMATasksToNPU.cpp` for `dma_configure_task`, and the trace helpers in
//! `python/utils/trace.py`) write every shim BD before its `npu.address_patch`, as one BLOCKWRITE
//! of the whole BD (or, in the runtime-size path, as WRITEs of each word), with word 0 the length;
//! the binary translation (`AIETargetNPU.cpp`) emits ops in that order. The lowered length is
//! never 0: the verifiers refuse every size below one 32-bit word. aiebu, the ELF packager,
//! likewise rejects a patch with no earlier BLOCKWRITE covering the patched register. Streams that
//! patch without a BD write appear upstream only as hand-written translator tests, not designs.
//!
//! **The BD word layout is read from mlir-aie's BD lowering, not confirmed on hardware**; the
//! length is a transfer count, so a BD whose strides skip or repeat data touches a different
//! extent than `length * 4` bytes. Writes to the BD after its patch are not tracked. Streams that
//! add a length at run time (mlir-aie's `npu.update_from_scratchpad`, encoded as UPDATE_REG 0x0C
//! after a CREATE_SCRATCHPAD 0x0A) are refused as unsupported.

mod build;
mod listing;
mod patch;
mod walk;

pub use build::TxnBuilder;
pub use listing::{explain, listing};

use crate::{ArtifactError, NpuGen};
use patch::{Patch, ShimRegs};

/// Argument indices at or above this are refused: no design has that many buffers, and the
/// daemon sizes per-dispatch tables by it.
pub const MAX_ARGS: u32 = 64;

/// Opcode numbers (the low byte of an op's first word), as the current firmware defines them.
pub mod opcode {
    #![allow(missing_docs)]
    pub const WRITE: u8 = 0x00;
    pub const BLOCKWRITE: u8 = 0x01;
    pub const BLOCKSET: u8 = 0x02;
    pub const MASKWRITE: u8 = 0x03;
    pub const MASKPOLL: u8 = 0x04;
    pub const NOOP: u8 = 0x05;
    pub const PREEMPT: u8 = 0x06;
    pub const MASKPOLL_BUSY: u8 = 0x07;
    pub const LOADPDI: u8 = 0x08;
    pub const LOAD_PM_START: u8 = 0x09;
    pub const CREATE_SCRATCHPAD: u8 = 0x0A;
    pub const UPDATE_STATE_TABLE: u8 = 0x0B;
    pub const UPDATE_REG: u8 = 0x0C;
    pub const UPDATE_SCRATCH: u8 = 0x0D;
    pub const CONFIG_SHIMDMA_BD: u8 = 0x0E;
    pub const CONFIG_SHIMDMA_DMABUF_BD: u8 = 0x0F;
    pub const TCT: u8 = 0x80;
    pub const DDR_PATCH: u8 = 0x81;
    pub const READ_REGS: u8 = 0x82;
    pub const RECORD_TIMER: u8 = 0x83;
    pub const MERGE_SYNC: u8 = 0x84;

    /// The name of a defined opcode, `None` for bytes no format defines.
    #[must_use]
    pub fn name(code: u8) -> Option<&'static str> {
        Some(match code {
            WRITE => "WRITE",
            BLOCKWRITE => "BLOCKWRITE",
            BLOCKSET => "BLOCKSET",
            MASKWRITE => "MASKWRITE",
            MASKPOLL => "MASKPOLL",
            NOOP => "NOOP",
            PREEMPT => "PREEMPT",
            MASKPOLL_BUSY => "MASKPOLL_BUSY",
            LOADPDI => "LOADPDI",
            LOAD_PM_START => "LOAD_PM_START",
            CREATE_SCRATCHPAD => "CREATE_SCRATCHPAD",
            UPDATE_STATE_TABLE => "UPDATE_STATE_TABLE",
            UPDATE_REG => "UPDATE_REG",
            UPDATE_SCRATCH => "UPDATE_SCRATCH",
            CONFIG_SHIMDMA_BD => "CONFIG_SHIMDMA_BD",
            CONFIG_SHIMDMA_DMABUF_BD => "CONFIG_SHIMDMA_DMABUF_BD",
            TCT => "TCT",
            DDR_PATCH => "DDR_PATCH",
            READ_REGS => "READ_REGS",
            RECORD_TIMER => "RECORD_TIMER",
            MERGE_SYNC => "MERGE_SYNC",
            _ => return None,
        })
    }
}

/// One decoded operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// Write a 32-bit register.
    Write {
        /// Absolute register address.
        addr: u32,
        /// Value.
        value: u32,
    },
    /// `reg = (reg & !mask) | (value & mask)`.
    MaskWrite {
        /// Absolute register address.
        addr: u32,
        /// Value.
        value: u32,
        /// Mask.
        mask: u32,
    },
    /// Wait until `(reg & mask) == value`.
    MaskPoll {
        /// Absolute register address.
        addr: u32,
        /// Expected value.
        value: u32,
        /// Mask.
        mask: u32,
        /// MASKPOLL_BUSY rather than MASKPOLL.
        busy: bool,
    },
    /// Write consecutive registers starting at `addr`.
    BlockWrite {
        /// Column field (current format; derived from `addr` in the older one).
        col: u8,
        /// Row field.
        row: u8,
        /// Absolute address of the first word.
        addr: u32,
        /// The words.
        data: Vec<u32>,
    },
    /// Does nothing.
    Noop,
    /// Preemption point.
    Preempt {
        /// Preemption level.
        level: u8,
    },
    /// Load a PDI from device memory.
    LoadPdi {
        /// PDI id.
        id: u16,
        /// Size in bytes.
        size: u32,
        /// Device address.
        addr: u64,
    },
    /// Start of a program-memory load sequence.
    LoadPmStart {
        /// Load sequence count (24 bits).
        sequence_count: u32,
        /// Program-memory load id.
        pm_id: u32,
    },
    /// Wait for a DMA task-completion token (TCT).
    Sync {
        /// Channel direction (0 = S2MM, 1 = MM2S in the usual AIE encoding).
        dir: u8,
        /// Row.
        row: u8,
        /// Column.
        col: u8,
        /// Number of rows.
        row_num: u8,
        /// Number of columns.
        col_num: u8,
        /// DMA channel.
        channel: u8,
    },
    /// Patch a buffer's device address (plus `arg_plus`) into a register.
    DdrPatch {
        /// Register to patch.
        reg_addr: u32,
        /// Buffer argument index.
        arg_idx: u32,
        /// Byte offset into the buffer, with the fold bit for arguments 5 and above.
        arg_plus: u32,
    },
    /// RECORD_TIMER.
    RecordTimer {
        /// Timer id.
        id: u32,
    },
    /// READ_REGS or MERGE_SYNC: framed by their size field, payload not interpreted.
    Custom {
        /// The opcode.
        opcode: u8,
        /// Payload words after the two-word header.
        payload: Vec<u32>,
    },
}

/// What a valid `insts.bin` does, as far as the daemon needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnProgram {
    /// `(major, minor)`: `(0, 1)` current, `(1, 0)` older.
    pub version: (u8, u8),
    /// Device generation from the header.
    pub generation: NpuGen,
    /// Rows, including the shim row.
    pub rows: u8,
    /// Columns.
    pub cols: u8,
    /// Memory-tile rows.
    pub mem_tile_rows: u8,
    /// Number of operations.
    pub op_count: u32,
    /// Size of the stream in bytes.
    pub size_bytes: u32,
    /// Buffer arguments the DDR patches use, sorted by index, one entry per index named.
    pub args: Vec<ArgUse>,
}

/// The DDR patches that use one buffer argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgUse {
    /// Argument index.
    pub index: u32,
    /// Patches in stream order.
    pub patches: Vec<ArgPatch>,
}

/// One DDR_PATCH of a buffer argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgPatch {
    /// Index of the DDR_PATCH op.
    pub op_index: u32,
    /// Patched register (a shim BD's base-address-low word).
    pub reg_addr: u32,
    /// Byte offset into the buffer (`arg_plus` without the fold bit).
    pub offset: u64,
    /// Whether `arg_plus` carried the fold bit `0x8000_0000`.
    pub folded: bool,
    /// The BD's transfer length in bytes: word 0 of the BD (the patched register − 4) as the
    /// stream last set it before the patch, times 4. Never 0: [`TxnProgram::parse`] refuses a
    /// patch whose BD has no length.
    pub bd_len_bytes: u64,
}

impl ArgPatch {
    /// The smallest buffer this patch fits in: `offset + bd_len_bytes`.
    #[must_use]
    pub fn min_size(&self) -> u64 {
        self.offset.saturating_add(self.bd_len_bytes)
    }
}

impl TxnProgram {
    /// Validates a TXN stream (see the [module docs](self)) and describes it.
    ///
    /// # Cost
    ///
    /// One pass over the stream, a bounded amount of work per 4-byte word. Memory: the register
    /// model keeps one entry per distinct shim register written (at most one per 8 input
    /// bytes), a BLOCKWRITE's payload is copied while its op is visited, and each DDR patch keeps
    /// one record (arguments are capped at [`MAX_ARGS`]): under one byte per input byte measured
    /// (`tests/cost.rs`).
    ///
    /// # Errors
    ///
    /// The first rule the stream breaks, naming the op index and byte offset, what was expected
    /// and what was found.
    pub fn parse(bytes: &[u8]) -> Result<TxnProgram, ArtifactError> {
        let mut regs = ShimRegs::default();
        let mut args: Vec<ArgUse> = Vec::new();
        let header = walk::walk(bytes, |_, located| {
            match located.op {
                TxnOp::Write { addr, value } => regs.write(addr, value),
                TxnOp::MaskWrite { addr, value, mask } => regs.mask_write(addr, value, mask),
                TxnOp::BlockWrite { addr, ref data, .. } => regs.block_write(addr, data),
                TxnOp::DdrPatch {
                    reg_addr,
                    arg_idx,
                    arg_plus,
                } => {
                    let p = Patch {
                        op_index: located.index,
                        offset: located.offset,
                        reg_addr,
                        arg_idx,
                        arg_plus,
                    };
                    let patch = patch::check_patch(p, &regs)?;
                    match args.binary_search_by_key(&arg_idx, |a| a.index) {
                        Ok(i) => args[i].patches.push(patch),
                        Err(i) => args.insert(
                            i,
                            ArgUse {
                                index: arg_idx,
                                patches: vec![patch],
                            },
                        ),
                    }
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(TxnProgram {
            version: (header.major, header.minor),
            generation: header.generation,
            rows: header.rows,
            cols: header.cols,
            mem_tile_rows: header.mem_tile_rows,
            op_count: header.op_count,
            size_bytes: header.size_bytes,
            args,
        })
    }

    /// Number of buffer arguments a dispatch must supply: the highest patched index + 1, or 0.
    #[must_use]
    pub fn arg_count(&self) -> usize {
        self.args.last().map_or(0, |a| a.index as usize + 1)
    }

    /// The smallest size buffer `index` may have: every patch of it must fit (0 if unused).
    #[must_use]
    pub fn min_arg_size(&self, index: usize) -> u64 {
        self.arg(index).map_or(0, |a| {
            a.patches.iter().map(ArgPatch::min_size).max().unwrap_or(0)
        })
    }

    /// [`TxnProgram::min_arg_size`] for every index in `0..arg_count()`.
    #[must_use]
    pub fn min_arg_sizes(&self) -> Vec<u64> {
        (0..self.arg_count())
            .map(|i| self.min_arg_size(i))
            .collect()
    }

    /// The patches of argument `index`, if any.
    #[must_use]
    pub fn arg(&self, index: usize) -> Option<&ArgUse> {
        self.args.iter().find(|a| a.index as usize == index)
    }

    /// Refuses a dispatch whose buffers (sizes in bytes, in argument order) are too few or too
    /// small for this program's DDR patches. Extra buffers are allowed (IRON's trace slot).
    ///
    /// # Errors
    ///
    /// [`ArtifactError::TooFewBuffers`] or [`ArtifactError::BufferTooSmall`] for the first
    /// offending argument.
    pub fn check_buffers(&self, sizes: &[u64]) -> Result<(), ArtifactError> {
        if sizes.len() < self.arg_count() {
            return Err(ArtifactError::TooFewBuffers {
                needed: self.arg_count(),
                supplied: sizes.len(),
            });
        }
        for arg in &self.args {
            let supplied = sizes[arg.index as usize];
            let worst = arg.patches.iter().max_by_key(|p| p.min_size());
            if let Some(p) = worst.filter(|p| p.min_size() > supplied) {
                let bd = format!(": offset {} + BD length {} bytes", p.offset, p.bd_len_bytes);
                return Err(ArtifactError::BufferTooSmall {
                    index: arg.index as usize,
                    supplied,
                    needed: p.min_size(),
                    op_index: p.op_index,
                    bd,
                });
            }
        }
        Ok(())
    }

    /// Refuses a program built for another generation than the device's.
    ///
    /// # Errors
    ///
    /// [`ArtifactError::GenerationMismatch`].
    pub fn check_generation(&self, device: NpuGen) -> Result<(), ArtifactError> {
        if self.generation == device {
            Ok(())
        } else {
            Err(ArtifactError::GenerationMismatch {
                expected: device,
                found: self.generation,
                found_gen: self.generation.txn_dev_gen(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(offset: u64, bd_len_bytes: u64) -> ArgPatch {
        ArgPatch {
            op_index: 0,
            reg_addr: 0x1D004,
            offset,
            folded: false,
            bd_len_bytes,
        }
    }

    #[test]
    fn min_size_is_the_offset_plus_the_bd_length() {
        assert_eq!(patch(16, 64).min_size(), 80);
        assert_eq!(patch(0, 4).min_size(), 4);
        assert_eq!(patch(u64::MAX, 4).min_size(), u64::MAX);
    }

    #[test]
    fn parse_refuses_a_patch_whose_bd_has_no_length() {
        let mut b = TxnBuilder::new(NpuGen::Npu1);
        b.noop().ddr_patch(0x1D004, 0, 0);
        assert!(matches!(
            TxnProgram::parse(&b.finish()),
            Err(ArtifactError::TxnPatchWithoutLength {
                op_index: 1,
                offset: 20,
                reg_addr: 0x1D004,
                arg_idx: 0,
                length_addr: 0x1D000,
                written_zero: false,
            })
        ));
    }

    #[test]
    fn buffers_are_checked_against_every_patch() {
        let mut b = TxnBuilder::new(NpuGen::Npu1);
        b.shim_buffer(0, 0, 0, 256).shim_buffer(0, 1, 2, 64);
        let p = TxnProgram::parse(&b.finish()).unwrap();
        assert_eq!(p.arg_count(), 3);
        assert_eq!(p.min_arg_sizes(), vec![256, 0, 64]);
        p.check_buffers(&[256, 0, 64]).unwrap();
        p.check_buffers(&[256, 0, 64, 8]).unwrap();
        let e = p.check_buffers(&[256, 0]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the program patches 3 buffer arguments but the dispatch supplies 2"
        );
        let e = p.check_buffers(&[255, 0, 64]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "buffer argument 0 is 255 bytes but the program needs at least 256 bytes \
             (DDR_PATCH op 1: offset 0 + BD length 256 bytes)"
        );
    }

    #[test]
    fn generation_is_checked_against_the_device() {
        let p = TxnProgram::parse(&TxnBuilder::new(NpuGen::Npu2).finish()).unwrap();
        p.check_generation(NpuGen::Npu2).unwrap();
        assert_eq!(
            p.check_generation(NpuGen::Npu1).unwrap_err().to_string(),
            "insts.bin was built for npu2 (aie2p) (TXN device generation 4) but the device is npu1 (aie2)"
        );
    }
}

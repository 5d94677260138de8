//! [`TxnBuilder`]: writes TXN streams in the current (0.1) format.

use super::opcode;
use super::walk::{FIRST_FOLDED_ARG, FOLD_BIT};
use crate::NpuGen;

/// Shim DMA buffer descriptor 0's address in a column (AIE2); BD `i` is at `+ i * 0x20`.
pub const SHIM_BD_BASE: u32 = 0x1D000;
/// Distance between shim BDs.
pub const SHIM_BD_STRIDE: u32 = 0x20;
/// Number of shim DMA buffer descriptors per column.
pub const SHIM_BD_COUNT: u32 = 16;

/// Builds a current-format (0.1) TXN stream op by op.
///
/// ```
/// use npu_artifacts::{NpuGen, txn::{TxnBuilder, TxnProgram}};
/// let mut b = TxnBuilder::new(NpuGen::Npu1);
/// b.shim_buffer(0, 0, 0, 1024); // BD 0 of column 0 moves 1024 bytes of argument 0
/// let program = TxnProgram::parse(&b.finish()).unwrap();
/// assert_eq!(program.min_arg_sizes(), vec![1024]);
/// ```
#[derive(Debug, Clone)]
pub struct TxnBuilder {
    generation: NpuGen,
    shape: (u8, u8, u8),
    words: Vec<u32>,
    ops: u32,
}

impl TxnBuilder {
    /// An empty stream for `generation`, with that generation's array shape in the header.
    #[must_use]
    pub fn new(generation: NpuGen) -> Self {
        Self {
            generation,
            shape: generation.array_shape(),
            words: Vec::new(),
            ops: 0,
        }
    }

    /// Overrides the (rows, cols, mem-tile rows) recorded in the header.
    #[must_use]
    pub fn with_shape(mut self, rows: u8, cols: u8, mem_tile_rows: u8) -> Self {
        self.shape = (rows, cols, mem_tile_rows);
        self
    }

    /// Absolute AIE2 register address of `offset` in tile (`col`, `row`).
    #[must_use]
    pub fn reg(col: u8, row: u8, offset: u32) -> u32 {
        (u32::from(col) << 25) | (u32::from(row) << 20) | (offset & 0xF_FFFF)
    }

    fn push(&mut self, words: &[u32]) -> &mut Self {
        self.words.extend_from_slice(words);
        self.ops += 1;
        self
    }

    /// WRITE: 6 words.
    pub fn write(&mut self, addr: u32, value: u32) -> &mut Self {
        self.push(&[u32::from(opcode::WRITE), 0, addr, 0, value, 24])
    }

    /// MASKWRITE: 7 words.
    pub fn mask_write(&mut self, addr: u32, value: u32, mask: u32) -> &mut Self {
        self.push(&[u32::from(opcode::MASKWRITE), 0, addr, 0, value, mask, 28])
    }

    /// BLOCKWRITE of `data` to consecutive registers from `addr` in tile (`col`, `row`).
    ///
    /// # Panics
    ///
    /// If `data` is longer than a TXN op can be (about 2^30 words).
    pub fn block_write(&mut self, col: u8, row: u8, addr: u32, data: &[u32]) -> &mut Self {
        let size = u32::try_from((data.len() + 4) * 4).expect("BLOCKWRITE larger than 4 GiB");
        let mut words = vec![
            u32::from(opcode::BLOCKWRITE),
            u32::from(col) | (u32::from(row) << 8),
            addr,
            size,
        ];
        words.extend_from_slice(data);
        self.push(&words)
    }

    /// DDR_PATCH of argument `arg_idx` at byte `offset` into `reg_addr`, with the fold bit added
    /// for arguments 5 and above.
    ///
    /// This is the bare op: [`TxnProgram::parse`](super::TxnProgram::parse) refuses the stream
    /// unless an earlier op set a non-zero length in the BD's word 0 (`reg_addr - 4`).
    /// [`TxnBuilder::shim_buffer`] writes the BD and the patch together.
    pub fn ddr_patch(&mut self, reg_addr: u32, arg_idx: u32, offset: u32) -> &mut Self {
        let arg_plus = if arg_idx >= FIRST_FOLDED_ARG {
            offset | FOLD_BIT
        } else {
            offset
        };
        let mut w = [0u32; 12];
        w[0] = u32::from(opcode::DDR_PATCH);
        w[1] = 48;
        w[6] = reg_addr;
        w[8] = arg_idx;
        w[10] = arg_plus;
        self.push(&w)
    }

    /// TCT sync on (`col`, `row`), direction `dir`, `channel`, over 1×1 tiles.
    pub fn sync(&mut self, col: u8, row: u8, dir: u8, channel: u8) -> &mut Self {
        let w2 = u32::from(dir) | (u32::from(row) << 8) | (u32::from(col) << 16);
        let w3 = (1 << 8) | (1 << 16) | (u32::from(channel) << 24);
        self.push(&[u32::from(opcode::TCT), 16, w2, w3])
    }

    /// NOOP: 1 word.
    pub fn noop(&mut self) -> &mut Self {
        self.push(&[u32::from(opcode::NOOP)])
    }

    /// Writes shim DMA BD `bd` of column `col` (length `bytes / 4` words, address 0) and patches
    /// argument `arg_idx` into it: the pair IRON's lowering emits for each buffer.
    ///
    /// `bytes` below 4 writes a length of 0 words, which
    /// [`TxnProgram::parse`](super::TxnProgram::parse) refuses, as it would in a real stream.
    ///
    /// # Panics
    ///
    /// If `bd >= 16`. A length beyond 2^32 words is written as `u32::MAX` words.
    pub fn shim_buffer(&mut self, col: u8, bd: u32, arg_idx: u32, bytes: u64) -> &mut Self {
        assert!(bd < SHIM_BD_COUNT, "shim BD {bd} out of range");
        let len_words = u32::try_from(bytes / 4).unwrap_or(u32::MAX);
        let bd_addr = Self::reg(col, 0, SHIM_BD_BASE + bd * SHIM_BD_STRIDE);
        self.block_write(col, 0, bd_addr, &[len_words, 0, 0, 0, 0, 0, 0, 0]);
        self.ddr_patch(bd_addr + 4, arg_idx, 0)
    }

    /// Ops appended so far.
    #[must_use]
    pub fn op_count(&self) -> u32 {
        self.ops
    }

    /// The finished stream: header plus ops, little-endian.
    ///
    /// # Panics
    ///
    /// If the stream exceeds 4 GiB.
    #[must_use]
    pub fn finish(&self) -> Vec<u8> {
        let (rows, cols, mem_tile_rows) = self.shape;
        let total = u32::try_from((self.words.len() + 4) * 4).expect("TXN stream beyond 4 GiB");
        let header = [
            u32::from_le_bytes([0, 1, self.generation.txn_dev_gen(), rows]),
            u32::from_le_bytes([cols, mem_tile_rows, 0, 0]),
            self.ops,
            total,
        ];
        header
            .iter()
            .chain(&self.words)
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::TxnProgram;

    #[test]
    fn header_matches_the_layout_table() {
        let bytes = TxnBuilder::new(NpuGen::Npu1).finish();
        // w0 = major 0 | minor 1 << 8 | devGen 3 << 16 | rows 6 << 24.
        assert_eq!(&bytes[0..4], &0x0603_0100u32.to_le_bytes());
        assert_eq!(&bytes[4..8], &0x0000_0105u32.to_le_bytes());
        assert_eq!(&bytes[8..16], &[0, 0, 0, 0, 16, 0, 0, 0]);
    }

    #[test]
    fn every_builder_op_parses() {
        let mut b = TxnBuilder::new(NpuGen::Npu2);
        b.write(TxnBuilder::reg(0, 2, 0x1234), 7)
            .mask_write(TxnBuilder::reg(1, 0, 0x10), 1, 3)
            .noop()
            .shim_buffer(0, 0, 0, 64)
            .shim_buffer(1, 15, 6, 128)
            .sync(0, 0, 0, 0);
        let p = TxnProgram::parse(&b.finish()).unwrap();
        assert_eq!(p.op_count, 8);
        assert_eq!(p.generation, NpuGen::Npu2);
        assert_eq!(p.arg_count(), 7);
        assert_eq!(p.min_arg_sizes(), vec![64, 0, 0, 0, 0, 0, 128]);
        assert!(p.args[1].patches[0].folded);
    }
}

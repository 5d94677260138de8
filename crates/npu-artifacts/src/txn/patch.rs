//! What a DDR_PATCH must satisfy: its own fields (shim row, alignment, argument index, the folded
//! ABI), and a non-zero transfer length already in the shim BD it patches.

use super::walk::{FIRST_FOLDED_ARG, FOLD_BIT, col_of, row_of};
use super::{ArgPatch, MAX_ARGS};
use crate::ArtifactError;
use std::collections::HashMap;

/// The last value the stream wrote to each shim-row (row 0) register, where it is known.
///
/// WRITE and BLOCKWRITE define a register. MASKWRITE updates a known one, and defines an unknown
/// one only when its mask covers all 32 bits: otherwise the bits it leaves are whatever the
/// register held before the stream ran. The map grows by at most one entry per word of the
/// stream.
#[derive(Debug, Default)]
pub(super) struct ShimRegs(HashMap<u32, u32>);

impl ShimRegs {
    pub(super) fn write(&mut self, addr: u32, value: u32) {
        if row_of(addr) == 0 {
            self.0.insert(addr, value);
        }
    }

    pub(super) fn block_write(&mut self, addr: u32, data: &[u32]) {
        let mut a = addr;
        for &w in data {
            self.write(a, w);
            a = a.wrapping_add(4);
        }
    }

    pub(super) fn mask_write(&mut self, addr: u32, value: u32, mask: u32) {
        match self.0.get_mut(&addr) {
            Some(old) => *old = (*old & !mask) | (value & mask),
            None if mask == u32::MAX => self.write(addr, value),
            None => {}
        }
    }

    fn get(&self, addr: u32) -> Option<u32> {
        self.0.get(&addr).copied()
    }
}

/// One DDR_PATCH, as decoded.
#[derive(Debug, Clone, Copy)]
pub(super) struct Patch {
    pub op_index: u32,
    pub offset: usize,
    pub reg_addr: u32,
    pub arg_idx: u32,
    pub arg_plus: u32,
}

/// Checks one DDR_PATCH against the registers the stream wrote before it.
pub(super) fn check_patch(p: Patch, regs: &ShimRegs) -> Result<ArgPatch, ArtifactError> {
    check_fields(p)?;
    // Word 0 of the BD holds the transfer length in 32-bit words; the patched register is word 1.
    let length_addr = p.reg_addr.wrapping_sub(4);
    let length_words = match regs.get(length_addr) {
        Some(words) if words > 0 => words,
        found => {
            return Err(ArtifactError::TxnPatchWithoutLength {
                op_index: p.op_index,
                offset: p.offset,
                reg_addr: p.reg_addr,
                arg_idx: p.arg_idx,
                length_addr,
                written_zero: found.is_some(),
            });
        }
    };
    Ok(ArgPatch {
        op_index: p.op_index,
        reg_addr: p.reg_addr,
        offset: u64::from(p.arg_plus & !FOLD_BIT),
        folded: p.arg_plus & FOLD_BIT != 0,
        bd_len_bytes: u64::from(length_words) * 4,
    })
}

/// Checks the patch's own fields: where it writes, which argument, the fold bit.
fn check_fields(p: Patch) -> Result<(), ArtifactError> {
    let Patch {
        op_index,
        offset,
        reg_addr,
        arg_idx,
        arg_plus,
    } = p;
    let err = |detail: String| ArtifactError::TxnPatch {
        op_index,
        offset,
        detail,
    };
    let row = row_of(reg_addr);
    if row != 0 {
        return Err(err(format!(
            "register address {reg_addr:#010x} (byte offset {}) is in row {row} (column {}); \
             expected the shim row 0, where the DMA buffer descriptors live",
            offset + 24,
            col_of(reg_addr)
        )));
    }
    if !reg_addr.is_multiple_of(4) {
        return Err(err(format!(
            "register address {reg_addr:#010x} is not word-aligned; expected a multiple of 4"
        )));
    }
    if arg_idx >= MAX_ARGS {
        return Err(err(format!(
            "argument index {arg_idx}; expected below {MAX_ARGS}"
        )));
    }
    let folded = arg_plus & FOLD_BIT != 0;
    if arg_idx >= FIRST_FOLDED_ARG && !folded {
        return Err(err(format!(
            "argument {arg_idx} has arg_plus {arg_plus:#010x} without the fold bit 0x80000000; \
             expected the folded ABI for arguments 5 and above (this insts.bin looks built for \
             HRX or a full ELF; rebuild it for XRT/HSA, aiecc's default)"
        )));
    }
    if arg_idx < FIRST_FOLDED_ARG && folded {
        return Err(err(format!(
            "argument {arg_idx} has arg_plus {arg_plus:#010x} with the fold bit 0x80000000; \
             expected it only on arguments 5 and above"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BD0: u32 = 0x1D000;

    fn patch(reg_addr: u32) -> Patch {
        Patch {
            op_index: 3,
            offset: 112,
            reg_addr,
            arg_idx: 1,
            arg_plus: 16,
        }
    }

    #[test]
    fn a_patch_needs_a_non_zero_length_in_word_0_of_its_bd() {
        let mut regs = ShimRegs::default();
        let e = check_patch(patch(BD0 + 4), &regs).unwrap_err();
        assert!(matches!(
            e,
            ArtifactError::TxnPatchWithoutLength {
                op_index: 3,
                offset: 112,
                reg_addr: 0x1D004,
                arg_idx: 1,
                length_addr: 0x1D000,
                written_zero: false,
            }
        ));
        regs.write(BD0, 0);
        let e = check_patch(patch(BD0 + 4), &regs).unwrap_err();
        assert!(matches!(
            e,
            ArtifactError::TxnPatchWithoutLength {
                written_zero: true,
                ..
            }
        ));
        regs.write(BD0, 8);
        let p = check_patch(patch(BD0 + 4), &regs).unwrap();
        assert_eq!((p.offset, p.bd_len_bytes, p.min_size()), (16, 32, 48));
    }

    #[test]
    fn only_the_word_before_the_patched_register_is_the_length() {
        let mut regs = ShimRegs::default();
        regs.block_write(BD0 + 4, &[64, 64, 64]); // words 1..3, not word 0
        assert!(check_patch(patch(BD0 + 4), &regs).is_err());
        regs.block_write(BD0, &[64]);
        assert_eq!(
            check_patch(patch(BD0 + 4), &regs).unwrap().bd_len_bytes,
            256
        );
    }

    #[test]
    fn mask_writes_define_a_length_only_when_every_bit_is_known() {
        let mut regs = ShimRegs::default();
        regs.mask_write(BD0, 0x10, 0xFF);
        assert!(
            check_patch(patch(BD0 + 4), &regs).is_err(),
            "bits 8..32 unknown"
        );
        regs.mask_write(BD0, 0x10, u32::MAX);
        assert_eq!(check_patch(patch(BD0 + 4), &regs).unwrap().bd_len_bytes, 64);
        regs.mask_write(BD0, 0x300, 0xF00);
        assert_eq!(
            check_patch(patch(BD0 + 4), &regs).unwrap().bd_len_bytes,
            0x310 * 4
        );
        regs.mask_write(BD0, 0, 0xFFF);
        assert!(matches!(
            check_patch(patch(BD0 + 4), &regs),
            Err(ArtifactError::TxnPatchWithoutLength {
                written_zero: true,
                ..
            })
        ));
    }

    #[test]
    fn registers_outside_the_shim_row_are_not_tracked() {
        let mut regs = ShimRegs::default();
        regs.write(BD0 | (2 << 20), 64);
        regs.mask_write(BD0 | (1 << 20), 64, u32::MAX);
        assert!(regs.0.is_empty());
    }

    #[test]
    fn the_message_names_the_rule_the_op_the_register_and_the_argument() {
        let e = check_patch(patch(BD0 + 4), &ShimRegs::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TXN op 3 (DDR_PATCH) at byte offset 112: argument 1 is patched into register \
             0x0001d004, but no earlier op wrote the length word of that shim BD (0x0001d000, the \
             patched register - 4); expected an earlier WRITE, BLOCKWRITE or full-mask MASKWRITE \
             to set it to a non-zero transfer length in 32-bit words, as aiecc's lowering writes \
             the whole BD before every patch (without a length the DMA moves whatever the BD \
             holds, past the buffer); rebuild insts.bin with aiecc, or write the BD's length \
             before the patch"
        );
        let mut regs = ShimRegs::default();
        regs.write(BD0, 0);
        let e = check_patch(patch(BD0 + 4), &regs).unwrap_err();
        assert!(
            e.to_string()
                .contains("but the stream last wrote 0 to the length word of that shim BD"),
            "{e}"
        );
    }
}

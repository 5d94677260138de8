//! Patch sites: the relocations of a full ELF's control code, as ROCR decodes them.

/// Highest argument index a relocation may name.
pub const MAX_ARG_INDEX: u32 = 4095;

/// How a patch site is written (`ELF32_R_TYPE`, or the low 4 bits of `r_addend` when
/// `EI_ABIVERSION == 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct PatchScheme(pub u32);

impl PatchScheme {
    /// A shim DMA buffer descriptor's 48-bit address (three words), for a kernel argument.
    pub const SHIM_DMA_48: Self = Self(5);
    /// A 64-bit address stored low word first, for a PDI.
    pub const ADDRESS_64: Self = Self(8);
}

/// What a patch site receives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SiteTarget {
    /// The address of kernel argument N.
    Arg(u16),
    /// The device address of the PDI in the section with this name.
    Pdi(String),
}

/// One relocation of a kernel's control code.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PatchSite {
    /// The scheme.
    pub scheme: PatchScheme,
    /// Byte offset in the control code (`r_offset`).
    pub offset: u32,
    /// The addend, decoded for the ELF's `EI_ABIVERSION`.
    pub addend: u32,
    /// An argument or a PDI.
    pub target: SiteTarget,
}

/// Adds `addr` to the 48-bit address of the shim DMA buffer descriptor at `offset` (three
/// words; the first untouched), as ROCR's `PatchShimDma48` does: `base = (w2 & 0xFFFF) << 32 |
/// w1; base += addr + 0x80000000; w1 = low(base) & !3; w2 = (w2 & 0xFFFF0000) | high(base)`.
/// Additive: always patch a pristine copy. `None` when the site does not fit `ctrl`.
pub fn patch_shim_dma48(ctrl: &mut [u8], offset: u32, addr: u64) -> Option<()> {
    let at = offset as usize;
    let word = |c: &[u8], i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            c.get(at + 4 * i..at + 4 * i + 4)?.try_into().ok()?,
        ))
    };
    let (w1, w2) = (word(ctrl, 1)?, word(ctrl, 2)?);
    let mut base = (u64::from(w2 & 0xFFFF) << 32) | u64::from(w1);
    base = base.wrapping_add(addr).wrapping_add(0x8000_0000);
    // Truncation is the formula: the low and high halves of the 48-bit sum.
    #[allow(clippy::cast_possible_truncation)]
    let (lo, hi) = (base as u32, (base >> 32) as u32);
    ctrl.get_mut(at + 4..at + 8)?
        .copy_from_slice(&(lo & 0xFFFF_FFFC).to_le_bytes());
    ctrl.get_mut(at + 8..at + 12)?
        .copy_from_slice(&((w2 & 0xFFFF_0000) | hi).to_le_bytes());
    Some(())
}

/// A decimal argument index 0..=4095 (digits only).
pub(crate) fn arg_index(name: &[u8]) -> Option<u16> {
    if name.is_empty() || name.len() > 4 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v: u16 = std::str::from_utf8(name).ok()?.parse().ok()?;
    (u32::from(v) <= MAX_ARG_INDEX).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_names_are_decimal_up_to_4095() {
        assert_eq!(arg_index(b"0"), Some(0));
        assert_eq!(arg_index(b"4095"), Some(4095));
        assert_eq!(arg_index(b"4096"), None);
        assert_eq!(arg_index(b"12a"), None);
        assert_eq!(arg_index(b""), None);
        assert_eq!(arg_index(b"00001"), None);
    }
}

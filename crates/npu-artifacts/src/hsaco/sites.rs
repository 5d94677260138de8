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

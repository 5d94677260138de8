//! Little-endian reads that return `None` past the end instead of panicking.

/// The u32 at byte `at`.
pub(crate) fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let end = at.checked_add(4)?;
    let b = bytes.get(at..end)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The u16 at byte `at`.
pub(crate) fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    let end = at.checked_add(2)?;
    let b = bytes.get(at..end)?;
    Some(u16::from_le_bytes([b[0], b[1]]))
}

/// The u64 at byte `at`.
pub(crate) fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let lo = u32_at(bytes, at)?;
    let hi = u32_at(bytes, at.checked_add(4)?)?;
    Some(u64::from(lo) | (u64::from(hi) << 32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_end() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(u32_at(&b, 4), Some(0x0807_0605));
        assert_eq!(u32_at(&b, 5), None);
        assert_eq!(u32_at(&b, usize::MAX), None);
        assert_eq!(u16_at(&b, 6), Some(0x0807));
        assert_eq!(u64_at(&b, 0), Some(0x0807_0605_0403_0201));
        assert_eq!(u64_at(&b, 1), None);
    }
}

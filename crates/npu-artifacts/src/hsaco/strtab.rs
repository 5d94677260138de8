//! NUL-terminated string tables, read in time proportional to the table plus a constant per
//! lookup, with an index of 1/16 of the table's size: a file with many names pointing into one
//! long string must make lookups neither quadratic nor large.

/// Bytes a lookup scans before it uses the index.
const BLOCK: usize = 64;

/// A string table with, per 64-byte block, the position of the first NUL at or after the block.
#[derive(Debug, Clone)]
pub(crate) struct StrTab<'a> {
    bytes: &'a [u8],
    /// `next_nul[b]`: the first NUL at or after `b * BLOCK`, or `u32::MAX` when none; tables of
    /// 4 GiB or more are not indexed (no lookup finds a NUL in them).
    next_nul: Vec<u32>,
}

impl<'a> StrTab<'a> {
    /// Indexes `bytes` in one pass; costs 4 bytes per 64 table bytes.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        if u32::try_from(bytes.len()).is_err() {
            return Self {
                bytes: &[],
                next_nul: Vec::new(),
            };
        }
        let blocks = bytes.len().div_ceil(BLOCK);
        let mut next_nul = vec![u32::MAX; blocks];
        let mut next = u32::MAX;
        for b in (0..blocks).rev() {
            let start = b * BLOCK;
            let end = (start + BLOCK).min(bytes.len());
            if let Some(p) = bytes[start..end].iter().position(|&c| c == 0) {
                // In range: the table is shorter than 4 GiB.
                next = u32::try_from(start + p).unwrap_or(u32::MAX);
            }
            next_nul[b] = next;
        }
        Self { bytes, next_nul }
    }

    /// The string starting at `offset`, without its NUL; `None` if `offset` is outside the table
    /// or no NUL follows it inside the table. Scans at most 64 bytes.
    pub(crate) fn get(&self, offset: u64) -> Option<&'a [u8]> {
        let start = usize::try_from(offset).ok()?;
        if start >= self.bytes.len() {
            return None;
        }
        let block_end = ((start / BLOCK + 1) * BLOCK).min(self.bytes.len());
        let end = match self.bytes[start..block_end].iter().position(|&c| c == 0) {
            Some(p) => start + p,
            None => {
                let n = *self.next_nul.get(start / BLOCK + 1)?;
                usize::try_from(n).ok().filter(|_| n != u32::MAX)?
            }
        };
        Some(&self.bytes[start..end])
    }
}

/// `bytes[offset..offset + len]`, or `None` past the end.
pub(crate) fn slice(bytes: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    bytes.get(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_stop_at_the_table_end() {
        let t = StrTab::new(b"ab\0c\0de");
        assert_eq!(t.get(0), Some(&b"ab"[..]));
        assert_eq!(t.get(1), Some(&b"b"[..]));
        assert_eq!(t.get(2), Some(&b""[..]));
        assert_eq!(t.get(3), Some(&b"c"[..]));
        assert_eq!(t.get(5), None, "no NUL before the end");
        assert_eq!(t.get(7), None);
        assert_eq!(t.get(u64::MAX), None);
        let mut long = vec![b'x'; 1000];
        long[700] = 0;
        let t = StrTab::new(&long);
        assert_eq!(t.get(0).map(<[u8]>::len), Some(700));
        assert_eq!(t.get(65).map(<[u8]>::len), Some(635));
        assert_eq!(t.get(699).map(<[u8]>::len), Some(1));
        assert_eq!(t.get(700), Some(&b""[..]));
        assert_eq!(t.get(701), None);
        assert_eq!(slice(b"abc", 1, 2), Some(&b"bc"[..]));
        assert_eq!(slice(b"abc", 2, 2), None);
        assert_eq!(slice(b"abc", u64::MAX, 1), None);
    }
}

//! NUL-terminated string tables, read in time proportional to the table plus a logarithm per
//! lookup: a file with many names pointing into one long string must not make lookups quadratic.

/// A string table with the positions of its NULs.
#[derive(Debug, Clone)]
pub(crate) struct StrTab<'a> {
    bytes: &'a [u8],
    nuls: Vec<usize>,
}

impl<'a> StrTab<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        let nuls = bytes
            .iter()
            .enumerate()
            .filter_map(|(i, &b)| (b == 0).then_some(i))
            .collect();
        Self { bytes, nuls }
    }

    /// The string starting at `offset`, without its NUL; `None` if `offset` is outside the table
    /// or no NUL follows it inside the table.
    pub(crate) fn get(&self, offset: u64) -> Option<&'a [u8]> {
        let start = usize::try_from(offset).ok()?;
        if start >= self.bytes.len() {
            return None;
        }
        let i = self.nuls.partition_point(|&n| n < start);
        let end = *self.nuls.get(i)?;
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
        assert_eq!(slice(b"abc", 1, 2), Some(&b"bc"[..]));
        assert_eq!(slice(b"abc", 2, 2), None);
        assert_eq!(slice(b"abc", u64::MAX, 1), None);
    }
}

//! A work budget that keeps a parser's cost linear in its input.
//!
//! A structure may point many of its entries at the same bytes: section headers at one name,
//! groups at one member list, relocations at one symbol, table entries at one blob. Reading each
//! entry is then cheap, but anything done per entry to the shared bytes (hashing a name,
//! comparing sections, walking a list, parsing a blob) multiplies. Each such step charges its
//! size here first; the budget is a fixed multiple of the input, so a parse does at most that
//! much of it whatever the bytes say, and allocations made after a charge are bounded with it.
//! Files a packer writes charge each byte about once.

use crate::ArtifactError;

/// Units of work allowed per input byte.
pub(crate) const WORK_PER_INPUT_BYTE: u64 = 4;
/// Units of work any input may use (small files with a few names).
pub(crate) const WORK_FLOOR: u64 = 1 << 16;

/// Work left for one parse.
#[derive(Debug)]
pub(crate) struct Budget {
    artifact: &'static str,
    input_bytes: u64,
    limit: u64,
    used: u64,
}

impl Budget {
    /// The budget for parsing `input_bytes` bytes of an `artifact`.
    pub(crate) fn new(artifact: &'static str, input_bytes: usize) -> Self {
        let input_bytes = input_bytes as u64;
        Self {
            artifact,
            input_bytes,
            limit: input_bytes
                .saturating_mul(WORK_PER_INPUT_BYTE)
                .saturating_add(WORK_FLOOR),
            used: 0,
        }
    }

    /// A budget of exactly `limit` units.
    pub(crate) fn with_limit(artifact: &'static str, input_bytes: usize, limit: u64) -> Self {
        Self {
            artifact,
            input_bytes: input_bytes as u64,
            limit,
            used: 0,
        }
    }

    /// The kind of input this budget is for.
    pub(crate) fn artifact(&self) -> &'static str {
        self.artifact
    }

    /// Counts `units` of work on `what`.
    ///
    /// # Errors
    ///
    /// [`ArtifactError::OverLimit`] naming `what` when the budget is spent.
    pub(crate) fn charge(&mut self, what: &'static str, units: u64) -> Result<(), ArtifactError> {
        self.used = self.used.saturating_add(units);
        if self.used > self.limit {
            return Err(ArtifactError::OverLimit {
                artifact: self.artifact,
                what,
                found: self.used,
                limit: self.limit,
                input_bytes: self.input_bytes,
            });
        }
        Ok(())
    }

    /// [`Self::charge`] for `len` bytes.
    pub(crate) fn charge_bytes(
        &mut self,
        what: &'static str,
        len: usize,
    ) -> Result<(), ArtifactError> {
        self.charge(what, len as u64)
    }
}

/// At most `MAX_SHOWN` bytes of a name, lossily decoded, with "…" and the full length when cut:
/// error messages name what they refuse without copying a multi-megabyte name into each.
pub(crate) fn shown(name: &[u8]) -> String {
    const MAX_SHOWN: usize = 64;
    if name.len() <= MAX_SHOWN {
        return String::from_utf8_lossy(name).into_owned();
    }
    format!(
        "{}… ({} bytes)",
        String::from_utf8_lossy(&name[..MAX_SHOWN]),
        name.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_a_multiple_of_the_input() {
        let mut b = Budget::new("test", 100);
        b.charge("names", WORK_FLOOR + 400).unwrap();
        let e = b.charge("names", 1).unwrap_err().to_string();
        assert_eq!(
            e,
            "test: names would take 65937 units of parsing work; a 100-byte input allows at most 65936"
        );
    }

    #[test]
    fn long_names_are_cut_in_messages() {
        assert_eq!(shown(b"aie2"), "aie2");
        let long = vec![b'a'; 1000];
        assert_eq!(shown(&long), format!("{}… (1000 bytes)", "a".repeat(64)));
    }
}

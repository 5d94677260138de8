//! Shares of the NPU, their ids, the token name of an allocation, and the preferred
//! allocation.
//!
//! One npud owns one NPU, so a plugin advertises the shares of one device, `npu0`:
//! `npu0-share-0` .. `npu0-share-{N-1}`. A container's allocation is a set of shares; its
//! token file is named after the set, `npu0-share-` and the indexes in ascending order joined
//! by `.` (`npu0-share-3`, `npu0-share-0.1.5`), so npud's identity for the pod is
//! `token:npu0-share-3`. With at most [`crate::config::MAX_SHARES`] shares the longest name
//! is under 200 characters.

use std::collections::BTreeSet;

/// The device every share belongs to.
pub const DEVICE: &str = "npu0";
const PREFIX: &str = "npu0-share-";

/// The id of share `index`.
#[must_use]
pub fn share_id(index: u32) -> String {
    format!("{PREFIX}{index}")
}

/// The index of a share id among `shares`, or `None` when it is no such id.
#[must_use]
pub fn share_index(id: &str, shares: u32) -> Option<u32> {
    let digits = id.strip_prefix(PREFIX)?;
    canonical_index(digits).filter(|&i| i < shares)
}

/// A decimal index written without sign or leading zeros.
fn canonical_index(digits: &str) -> Option<u32> {
    let i: u32 = digits.parse().ok()?;
    (i.to_string() == digits).then_some(i)
}

/// The shares one container was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation(BTreeSet<u32>);

/// A share id that is not one of the plugin's, or a malformed request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    #[error("{id:?} is not one of this plugin's devices (npu0-share-0 .. npu0-share-{last})")]
    Unknown { id: String, last: u32 },
    #[error("{id:?} is listed twice")]
    Duplicate { id: String },
    #[error("no devices listed")]
    Empty,
}

impl Allocation {
    /// The allocation of the share ids `ids`, each one of `shares`.
    ///
    /// # Errors
    ///
    /// [`ShareError`] for an unknown or repeated id, or no ids at all.
    pub fn parse<S: AsRef<str>>(ids: &[S], shares: u32) -> Result<Allocation, ShareError> {
        if ids.is_empty() {
            return Err(ShareError::Empty);
        }
        let mut set = BTreeSet::new();
        for id in ids {
            let id = id.as_ref();
            let i = share_index(id, shares).ok_or_else(|| ShareError::Unknown {
                id: id.to_owned(),
                last: shares.saturating_sub(1),
            })?;
            if !set.insert(i) {
                return Err(ShareError::Duplicate { id: id.to_owned() });
            }
        }
        Ok(Allocation(set))
    }

    /// The name of the allocation's token file (and npud's identity `token:<name>`).
    #[must_use]
    pub fn token_name(&self) -> String {
        let indexes: Vec<String> = self.0.iter().map(u32::to_string).collect();
        format!("{PREFIX}{}", indexes.join("."))
    }

    /// The allocation a token file name stands for, when it is one of this plugin's names
    /// (any index, so that files of a larger earlier `--shares` are recognized too).
    #[must_use]
    pub fn from_token_name(name: &str) -> Option<Allocation> {
        let rest = name.strip_prefix(PREFIX)?;
        let mut set = BTreeSet::new();
        for part in rest.split('.') {
            if !set.insert(canonical_index(part)?) {
                return None;
            }
        }
        Some(Allocation(set))
    }

    /// Whether the two allocations hold a share in common.
    #[must_use]
    pub fn overlaps(&self, other: &Allocation) -> bool {
        self.0.intersection(&other.0).next().is_some()
    }
}

/// The shares the plugin would rather see allocated: those in `must_include` first (in the
/// order given), then the available ones, healthy before unhealthy and lower indexes first,
/// until `size` are chosen. Ids that are not the plugin's are passed over.
///
/// # Errors
///
/// A message when `size` is not positive, when `must_include` holds more than `size` shares,
/// or when fewer than `size` shares are offered.
pub fn preferred(
    available: &[String],
    must_include: &[String],
    size: i32,
    shares: u32,
    healthy: bool,
) -> Result<Vec<String>, String> {
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| format!("allocation_size {size} is not positive"))?;
    let mut chosen: Vec<String> = Vec::with_capacity(size);
    for id in must_include {
        if !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    if chosen.len() > size {
        return Err(format!(
            "must_include_deviceIDs holds {} devices, more than allocation_size {size}",
            chosen.len()
        ));
    }
    let mut rest: Vec<(bool, u32, &String)> = available
        .iter()
        .filter(|id| !chosen.contains(id))
        .filter_map(|id| share_index(id, shares).map(|i| (!healthy, i, id)))
        .collect();
    rest.sort();
    rest.dedup_by(|a, b| a.2 == b.2);
    for (_, _, id) in rest {
        if chosen.len() == size {
            break;
        }
        chosen.push(id.clone());
    }
    if chosen.len() < size {
        return Err(format!(
            "allocation_size {size} but only {} of this plugin's devices are offered",
            chosen.len()
        ));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn ids_and_indexes_round_trip() {
        assert_eq!(share_id(3), "npu0-share-3");
        assert_eq!(share_index("npu0-share-3", 4), Some(3));
        assert_eq!(share_index("npu0-share-4", 4), None);
        assert_eq!(share_index("npu0-share-03", 4), None);
        assert_eq!(share_index("npu1-share-0", 4), None);
        assert_eq!(share_index("npu0-share-+1", 4), None);
    }

    #[test]
    fn token_names_list_the_shares_in_order() {
        let a = Allocation::parse(&["npu0-share-5", "npu0-share-0", "npu0-share-1"], 8).unwrap();
        assert_eq!(a.token_name(), "npu0-share-0.1.5");
        assert_eq!(Allocation::from_token_name("npu0-share-0.1.5"), Some(a));
        let one = Allocation::parse(&["npu0-share-2"], 8).unwrap();
        assert_eq!(one.token_name(), "npu0-share-2");
        for other in [
            "npu0-share-",
            "npu0-share-1..2",
            "npu0-share-1.1",
            ".npu0-share-1",
            "x",
        ] {
            assert_eq!(Allocation::from_token_name(other), None, "{other}");
        }
        let all: Vec<String> = (0..64).map(share_id).collect();
        let longest = Allocation::parse(&all, 64).unwrap().token_name();
        assert!(longest.len() < 200, "{}", longest.len());
    }

    #[test]
    fn bad_allocations_are_named() {
        assert_eq!(
            Allocation::parse(&["npu0-share-9"], 4)
                .unwrap_err()
                .to_string(),
            "\"npu0-share-9\" is not one of this plugin's devices (npu0-share-0 .. npu0-share-3)"
        );
        assert!(matches!(
            Allocation::parse(&["npu0-share-1", "npu0-share-1"], 4),
            Err(ShareError::Duplicate { .. })
        ));
        assert_eq!(Allocation::parse::<&str>(&[], 4), Err(ShareError::Empty));
    }

    #[test]
    fn overlap_is_a_shared_share() {
        let a = Allocation::from_token_name("npu0-share-0.2").unwrap();
        assert!(a.overlaps(&Allocation::from_token_name("npu0-share-2").unwrap()));
        assert!(!a.overlaps(&Allocation::from_token_name("npu0-share-1.3").unwrap()));
    }

    #[test]
    fn preferred_takes_must_include_then_the_lowest() {
        let avail = ids(&[
            "npu0-share-3",
            "npu0-share-1",
            "npu0-share-2",
            "npu0-share-0",
        ]);
        assert_eq!(
            preferred(&avail, &ids(&["npu0-share-2"]), 3, 4, true).unwrap(),
            ids(&["npu0-share-2", "npu0-share-0", "npu0-share-1"])
        );
        assert_eq!(
            preferred(&avail, &[], 1, 4, false).unwrap(),
            ids(&["npu0-share-0"])
        );
        assert!(
            preferred(&avail, &[], 5, 4, true)
                .unwrap_err()
                .contains("only 4")
        );
        assert!(
            preferred(&avail, &avail, 2, 4, true)
                .unwrap_err()
                .contains("more than allocation_size 2")
        );
        assert!(
            preferred(&avail, &[], 0, 4, true)
                .unwrap_err()
                .contains("not positive")
        );
        // Ids that are not the plugin's are not chosen.
        assert!(preferred(&ids(&["gpu-0"]), &[], 1, 4, true).is_err());
    }
}

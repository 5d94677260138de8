//! Quarantine in the store: records by content hash, apart from the programs stored, so that the
//! bytes of a program that faulted the device stay refused (at registration and at dispatch)
//! after every session let go of it and after a restart, until ClearQuarantine removes the
//! record. The records' files are `state_dir::quarantine`'s.

use npu_proto::v1 as pb;

use super::Programs;
use crate::error::NpudError;
use crate::state_dir::QuarantineRecord;
use crate::state_dir::quarantine::is_hash;

impl Programs {
    /// Quarantines program `id` for `reason`: flags it, keeps a record of its hash, and writes
    /// the record durably to the state directory (a failure there is logged: the program then
    /// stays quarantined only until the daemon stops). Returns the record.
    pub fn quarantine(&self, id: u64, reason: &str) -> Option<QuarantineRecord> {
        let record = {
            let mut g = self.lock();
            let e = g.set_quarantined(id, true)?;
            let r = QuarantineRecord::now(&e.program.hash, &e.program.name, reason);
            g.quarantine.insert(r.content_hash.clone(), r.clone());
            r
        };
        if let Some(dir) = &self.records
            && let Err(e) = dir.write(&record)
        {
            tracing::error!(
                program = id,
                hash = %record.content_hash,
                error = %e,
                "the quarantine record could not be written; the program is quarantined only \
                 until the daemon stops"
            );
        }
        Some(record)
    }

    /// Removes the quarantine record of `hash` (on disk first, then in memory) and lets a stored
    /// program with those bytes run again. Returns the record removed; `None` when there was
    /// none.
    ///
    /// # Errors
    /// INVALID_ARGUMENT when `hash` is not a content hash; INTERNAL when the record's file
    /// cannot be removed (nothing changes then).
    pub fn clear_quarantine(&self, hash: &str) -> Result<Option<QuarantineRecord>, NpudError> {
        let hash = hash.trim().to_ascii_lowercase();
        if !is_hash(&hash) {
            return Err(NpudError::InvalidArgument(format!(
                "content_hash: {hash:?} is not a content hash (64 hex characters, as `npuctl \
                 programs` and RegisterProgram show it)"
            )));
        }
        let on_disk = match &self.records {
            Some(dir) => dir.remove(&hash).map_err(|e| {
                NpudError::Internal(format!("clearing the quarantine of {hash}: {e}"))
            })?,
            None => false,
        };
        let mut g = self.lock();
        let removed = g.quarantine.remove(&hash);
        if let Some(id) = g.by_hash.get(&hash).copied() {
            g.set_quarantined(id, false);
        }
        Ok(match removed {
            Some(r) => Some(r),
            // A file this daemon had not read (written by hand, or by another daemon since).
            None if on_disk => Some(QuarantineRecord {
                content_hash: hash,
                name: String::new(),
                faulted_unix_s: 0,
                reason: String::new(),
            }),
            None => None,
        })
    }

    /// One page of the quarantine records, in content-hash order after `after` ("" from the
    /// first), at most `max`: every record (`None`, an admin's view), or those of programs any
    /// of `sessions` references; and the hash the next page starts after ("" when none
    /// follows). Its cost grows with the page and the number of sessions, never with the
    /// number of records.
    pub fn quarantine_records(
        &self,
        sessions: Option<&[u64]>,
        after: &str,
        max: usize,
    ) -> (Vec<pb::QuarantineRecord>, String) {
        use std::ops::Bound::{Excluded, Unbounded};
        let g = self.lock();
        let stored = |hash: &str| g.by_hash.get(hash).copied().unwrap_or(0);
        let above = (Excluded(after), Unbounded);
        // One more than the page, to tell whether another page follows.
        let want = max.saturating_add(1);
        let records: Vec<&QuarantineRecord> = match sessions {
            None => g
                .quarantine
                .range::<str, _>(above)
                .take(want)
                .map(|(_, r)| r)
                .collect(),
            Some(ss) => {
                // The first `want` hashes above `after` of each session hold the first `want`
                // of their union.
                let hashes: std::collections::BTreeSet<&str> = ss
                    .iter()
                    .filter_map(|s| g.held.get(s))
                    .flat_map(|h| {
                        h.quarantined
                            .range::<str, _>(above)
                            .take(want)
                            .map(String::as_str)
                    })
                    .collect();
                hashes
                    .iter()
                    .take(want)
                    .filter_map(|h| g.quarantine.get(*h))
                    .collect()
            }
        };
        let mut page: Vec<pb::QuarantineRecord> = records
            .into_iter()
            .map(|r| record_proto(r, stored(&r.content_hash)))
            .collect();
        if page.len() > max {
            page.truncate(max);
            let next = page
                .last()
                .map(|r| r.content_hash.clone())
                .unwrap_or_default();
            (page, next)
        } else {
            (page, String::new())
        }
    }
}

/// `since T: reason; to run it again, ...`: when and why a program was quarantined, and how to
/// clear it.
pub(super) fn explain(r: &QuarantineRecord) -> String {
    format!(
        "since {}: {}; once the design is fixed (or to try it again), clear it with `npuctl \
         programs --clear-quarantine {}`",
        r.faulted_at(),
        r.reason,
        r.content_hash
    )
}

pub(super) fn refused_at_registration(r: &QuarantineRecord) -> NpudError {
    let name = if r.name.is_empty() {
        String::new()
    } else {
        format!(" ({})", r.name)
    };
    NpudError::FailedPrecondition(format!(
        "program {}{name} is quarantined {}",
        r.content_hash,
        explain(r)
    ))
}

/// A record as the API shows it; `program_id` is the stored program with its bytes, or 0.
pub fn record_proto(r: &QuarantineRecord, program_id: u64) -> pb::QuarantineRecord {
    pb::QuarantineRecord {
        content_hash: r.content_hash.clone(),
        name: r.name.clone(),
        faulted_unix_s: r.faulted_unix_s,
        faulted_at: r.faulted_at(),
        reason: r.reason.clone(),
        program_id,
    }
}

#[cfg(test)]
mod tests {
    use npu_artifacts::NpuGen;
    use npu_artifacts::emu::{DType, EmuDesign};

    use super::super::Runs;
    use super::*;
    use crate::state_dir::QuarantineDir;

    fn vsa(scalar: i64) -> (Vec<u8>, Vec<u8>) {
        let d = EmuDesign::vector_scalar_add(1024, DType::I32, scalar);
        (d.to_pdi(), d.insts(NpuGen::Npu2))
    }

    #[test]
    fn quarantine_records_come_in_pages_in_hash_order() {
        let p = Programs::new(
            8 << 20,
            64 << 20,
            NpuGen::Npu2,
            Runs::EmulatedDesigns,
            None,
            Vec::new(),
        );
        // Five quarantined programs: session 1 holds the first three, session 2 the other two
        // and the first.
        let mut ids = Vec::new();
        let mut hashes: Vec<String> = (1..=5)
            .map(|k| {
                let (pdi, insts) = vsa(k);
                let session = if k <= 3 { 1 } else { 2 };
                let a = p.register(session, pdi.clone(), insts.clone(), String::new());
                let id = a.unwrap().program.id;
                if k == 1 {
                    p.register(2, pdi, insts, String::new()).unwrap();
                }
                ids.push(id);
                p.quarantine(id, "boom").unwrap().content_hash
            })
            .collect();
        let (first, second) = (hashes[0].clone(), hashes[1].clone());
        let of_1: std::collections::BTreeSet<String> = hashes[..3].iter().cloned().collect();
        hashes.sort();
        let walk = |sessions: Option<&[u64]>, max| {
            let (mut seen, mut after, mut pages) = (Vec::new(), String::new(), 0);
            loop {
                let (page, next) = p.quarantine_records(sessions, &after, max);
                assert!(page.len() <= max);
                seen.extend(page.into_iter().map(|r| r.content_hash));
                pages += 1;
                if next.is_empty() {
                    return (seen, pages);
                }
                assert_eq!(
                    Some(&next),
                    seen.last(),
                    "the cursor is the page's last hash"
                );
                after = next;
            }
        };
        assert_eq!(walk(None, 2), (hashes.clone(), 3));
        assert_eq!(walk(None, 5), (hashes.clone(), 1));
        let (mine, _) = walk(Some(&[1]), 1);
        assert_eq!(
            mine,
            hashes
                .iter()
                .filter(|h| of_1.contains(*h))
                .cloned()
                .collect::<Vec<_>>()
        );
        assert_eq!(walk(Some(&[3]), 2), (vec![], 1));
        // Two sessions' records: their union, each once, in pages.
        assert_eq!(walk(Some(&[1, 2]), 2), (hashes.clone(), 3));
        let of_2 = |h: &String| !of_1.contains(h) || *h == first;
        let (theirs, _) = walk(Some(&[2]), 2);
        assert_eq!(
            theirs,
            hashes
                .iter()
                .filter(|h| of_2(h))
                .cloned()
                .collect::<Vec<_>>()
        );

        // A program session 1 lets go of leaves its records and stays in the admin's; one
        // cleared leaves every view.
        p.unregister(1, ids[1]).unwrap();
        let (mine, _) = walk(Some(&[1]), 2);
        assert!(!mine.contains(&second) && mine.len() == 2, "{mine:?}");
        assert_eq!(walk(None, 2).0, hashes);
        p.clear_quarantine(&first).unwrap();
        assert!(!walk(Some(&[1]), 2).0.contains(&first));
        assert!(!walk(Some(&[2]), 2).0.contains(&first));
        assert!(!walk(None, 2).0.contains(&first));
    }

    #[test]
    fn a_quarantined_hash_is_refused_at_registration_and_dispatch_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = QuarantineDir::open(dir.path()).unwrap();
        let p = Programs::new(
            8 << 20,
            64 << 20,
            NpuGen::Npu2,
            Runs::EmulatedDesigns,
            Some(records),
            Vec::new(),
        );
        let (pdi, insts) = vsa(1);
        let a = p
            .register(1, pdi.clone(), insts.clone(), "vsa".into())
            .unwrap();
        let hash = a.program.hash.clone();
        let r = p
            .quarantine(a.program.id, "it faulted the device: boom")
            .unwrap();
        assert_eq!(r.name, "vsa");
        let e = p.for_dispatch(1, a.program.id, "program_id").unwrap_err();
        assert!(matches!(e, NpudError::FailedPrecondition(_)), "{e}");
        for needle in [
            "program_id: program 1 (vsa, hash ",
            "is quarantined since ",
            "boom",
            &format!("npuctl programs --clear-quarantine {hash}"),
        ] {
            assert!(e.message().contains(needle), "{needle:?} in {e}");
        }
        // Dropped by every session, its bytes are still refused: the record is by hash.
        assert_eq!(p.release_session(1), vec![a.program.id]);
        let e = p
            .register(2, pdi.clone(), insts.clone(), String::new())
            .unwrap_err();
        assert!(matches!(e, NpudError::FailedPrecondition(_)), "{e}");
        assert!(
            e.message()
                .starts_with(&format!("program {hash} (vsa) is quarantined since ")),
            "{e}"
        );
        assert_eq!(p.quarantine_records(None, "", 8).0.len(), 1);
        assert!(p.quarantine_records(Some(&[2]), "", 8).0.is_empty());

        // A restarted store reads the record back.
        let (records, back) = QuarantineDir::open(dir.path()).unwrap();
        assert_eq!(back, vec![r.clone()]);
        let p = Programs::new(
            8 << 20,
            64 << 20,
            NpuGen::Npu2,
            Runs::EmulatedDesigns,
            Some(records),
            back,
        );
        assert!(
            p.register(3, pdi.clone(), insts.clone(), String::new())
                .is_err()
        );
        let e = p.clear_quarantine("not a hash").unwrap_err();
        assert!(matches!(e, NpudError::InvalidArgument(_)), "{e}");
        assert_eq!(p.clear_quarantine(&hash.to_uppercase()).unwrap(), Some(r));
        assert_eq!(p.clear_quarantine(&hash).unwrap(), None);
        p.register(3, pdi, insts, String::new()).unwrap();
        assert!(QuarantineDir::open(dir.path()).unwrap().1.is_empty());
    }
}

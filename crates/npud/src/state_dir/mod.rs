//! The state directory (`state_dir`): what the daemon keeps across restarts.
//!
//! - `quarantine/<hash>.json`: one record per quarantined program ([`quarantine`]), written
//!   durably when a program faults the device and read at start, so a restarted daemon refuses
//!   the same bytes until an operator clears the record (`npuctl programs --clear-quarantine`).
//! - `inflight`: the programs on the device right now ([`inflight`]), so that a daemon that its
//!   runtime aborted in the middle of a dispatch knows at its next start which programs were
//!   running.
//! - `suspects.json`: programs that were on the device when a daemon died once
//!   ([`suspects`]). A death alone is not evidence (the OOM killer, an operator's `kill -9` or
//!   another client's request can end the daemon while a bystander's program runs): a program
//!   in flight at a death becomes a suspect, and is quarantined only when a daemon dies with it
//!   on the device again before a run of it completed, so that a program that makes the runtime
//!   abort does not run into the same abort forever (a crash loop under `Restart=on-failure`).
//!
//! The directory is created (mode 0700) when missing; a directory that cannot be created,
//! listed or written is a start error naming it. An empty `state_dir` turns persistence off:
//! quarantine then lasts until the daemon stops, as it did before this directory existed.

pub mod inflight;
pub mod quarantine;
pub mod suspects;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

pub use inflight::{InFlight, InFlightProgram};
pub use quarantine::{QuarantineDir, QuarantineRecord};
pub use suspects::{Suspect, Suspects};

/// Why a program found in the in-flight record at start is quarantined.
pub const DIED_REASON: &str = "the daemon died while it ran on the device, at two deaths with \
                               no completed run of it between";

/// A state directory that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory: {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl StateError {
    pub(crate) fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What the state directory gave the daemon at start.
#[derive(Debug, Default)]
pub struct Persisted {
    /// Where records are written; `None` when persistence is off.
    pub quarantine: Option<QuarantineDir>,
    /// Every quarantine record, including the programs the previous daemon died running.
    pub records: Vec<QuarantineRecord>,
    /// The executor's in-flight record; `None` when persistence is off.
    pub inflight: Option<InFlight>,
}

impl Persisted {
    /// Opens the state directory `dir` (an empty path turns persistence off, logged once as a
    /// warning): creates it (0700) when missing; of the programs the in-flight record names (the
    /// previous daemon died while they ran), quarantines those that were already suspects and
    /// makes the others suspects; then clears that record, and reads every quarantine record.
    ///
    /// # Errors
    /// [`StateError`] naming the path and the OS error when the directory or its files cannot be
    /// created, read or written.
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        if dir.as_os_str().is_empty() {
            tracing::warn!(
                "state_dir is empty: quarantine is kept in memory only, and a program that makes \
                 the runtime abort the daemon will be run again after a restart"
            );
            return Ok(Self::default());
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StateError::io("creating", dir, e))?;
        let (mut inflight, died) = InFlight::open(dir)?;
        let (quarantine, mut records) = QuarantineDir::open(dir)?;
        let mut suspects = Suspects::open(dir);
        let now = quarantine::unix_now();
        for p in &died {
            if !suspects.remove(&p.content_hash) {
                tracing::warn!(
                    hash = %p.content_hash,
                    name = %p.name,
                    "the previous daemon died while this program ran on the device; it is a \
                     suspect now, and is quarantined if a daemon dies while it runs again before \
                     a run of it completes"
                );
                suspects.add(Suspect {
                    content_hash: p.content_hash.clone(),
                    name: p.name.clone(),
                    died_unix_s: now,
                });
                continue;
            }
            tracing::error!(
                hash = %p.content_hash,
                name = %p.name,
                "the previous daemon died while this program ran on the device, as one did \
                 the last time it ran; quarantined it"
            );
            let r = QuarantineRecord::now(&p.content_hash, &p.name, DIED_REASON);
            quarantine.write(&r)?;
            records.retain(|x| x.content_hash != r.content_hash);
            records.push(r);
        }
        // Quarantined programs need no suspicion.
        for r in &records {
            suspects.remove(&r.content_hash);
        }
        suspects.write()?;
        inflight.reset()?;
        inflight.set_suspects(suspects);
        if !records.is_empty() {
            tracing::info!(
                count = records.len(),
                dir = %dir.display(),
                "quarantined programs from the state directory"
            );
        }
        Ok(Self {
            quarantine: Some(quarantine),
            records,
            inflight: Some(inflight),
        })
    }
}

/// Writes `bytes` to `path` durably, as `tmp` first: a 0600 file written and `fsync`ed, renamed
/// into place, and the directory `dir` `fsync`ed, so a crash leaves the old file or the new
/// one, never a torn one.
///
/// # Errors
/// [`StateError::Io`] naming the file and the step that failed.
pub(crate) fn write_durably(
    dir: &Path,
    tmp: &Path,
    path: &Path,
    bytes: &[u8],
) -> Result<(), StateError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let written = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(tmp);
        return Err(StateError::io("writing", tmp, e));
    }
    std::fs::rename(tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(tmp);
        StateError::io("renaming into place", path, e)
    })?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StateError::io("syncing", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_program_in_flight_at_one_death_is_a_suspect_and_at_two_in_a_row_quarantined() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let mut p = Persisted::open(&dir).unwrap();
        assert!(p.records.is_empty());
        let mode = std::fs::metadata(&dir).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o700
        );
        p.inflight.as_mut().unwrap().begin([(A, "hang")]);
        drop(p); // dies with the doorbell ringing
        let mut p = Persisted::open(&dir).unwrap();
        assert!(p.records.is_empty(), "one death is no evidence");
        let r = p.inflight.as_mut().unwrap();
        assert!(r.is_suspect(A));
        r.begin([(A, "hang")]);
        drop(p); // dies again with it on the device
        let p = Persisted::open(&dir).unwrap();
        assert_eq!(p.records.len(), 1);
        assert_eq!(p.records[0].content_hash, A);
        assert_eq!(p.records[0].name, "hang");
        assert_eq!(p.records[0].reason, DIED_REASON);
        assert!(!p.inflight.as_ref().unwrap().is_suspect(A));
        drop(p);
        // The record is durable; the in-flight record was cleared.
        let p = Persisted::open(&dir).unwrap();
        assert_eq!(p.records.len(), 1);
    }

    #[test]
    fn a_suspect_whose_run_completed_needs_two_more_deaths() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let mut p = Persisted::open(&dir).unwrap();
        p.inflight
            .as_mut()
            .unwrap()
            .begin([(A, "vsa"), (B, "other")]);
        drop(p);
        let mut p = Persisted::open(&dir).unwrap();
        let r = p.inflight.as_mut().unwrap();
        assert!(r.is_suspect(A) && r.is_suspect(B));
        // A batch of A completes; then the daemon dies with A on the device again.
        r.begin([(A, "vsa")]);
        r.end();
        r.completed();
        assert!(!r.is_suspect(A) && r.is_suspect(B));
        r.begin([(A, "vsa")]);
        drop(p);
        let p = Persisted::open(&dir).unwrap();
        assert!(p.records.is_empty(), "{:?}", p.records);
        let r = p.inflight.as_ref().unwrap();
        assert!(r.is_suspect(A) && r.is_suspect(B));
    }

    #[test]
    fn an_empty_path_turns_persistence_off_and_an_unusable_one_names_itself() {
        let p = Persisted::open(Path::new("")).unwrap();
        assert!(p.quarantine.is_none() && p.inflight.is_none());
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        let e = Persisted::open(&file.join("state"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("state directory: creating "), "{e}");
        assert!(e.contains("a-file/state"), "{e}");
        assert!(e.contains("os error"), "{e}");
    }
}

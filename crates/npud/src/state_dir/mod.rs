//! The state directory (`state_dir`): what the daemon keeps across restarts.
//!
//! - `quarantine/<hash>.json`: one record per quarantined program ([`quarantine`]), written
//!   durably when a program faults the device and read at start, so a restarted daemon refuses
//!   the same bytes until an operator clears the record (`npuctl programs --clear-quarantine`).
//! - `inflight`: the programs on the device right now ([`inflight`]), so that a daemon that its
//!   runtime aborted in the middle of a dispatch quarantines them at its next start instead of
//!   running them again into the same abort (a crash loop under `Restart=on-failure`).
//!
//! The directory is created (mode 0700) when missing; a directory that cannot be created,
//! listed or written is a start error naming it. An empty `state_dir` turns persistence off:
//! quarantine then lasts until the daemon stops, as it did before this directory existed.

pub mod inflight;
pub mod quarantine;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

pub use inflight::{InFlight, InFlightProgram};
pub use quarantine::{QuarantineDir, QuarantineRecord};

/// Why a program found in the in-flight record at start is quarantined.
pub const DIED_REASON: &str = "the daemon died while it ran on the device";

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
    /// warning): creates it (0700) when missing, quarantines the programs the in-flight record
    /// names (the previous daemon died while they ran), then clears that record, and reads every
    /// quarantine record.
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
        for p in died {
            tracing::error!(
                hash = %p.content_hash,
                name = %p.name,
                "the previous daemon died while this program ran on the device; quarantined it"
            );
            let r = QuarantineRecord::now(&p.content_hash, &p.name, DIED_REASON);
            quarantine.write(&r)?;
            records.retain(|x| x.content_hash != r.content_hash);
            records.push(r);
        }
        inflight.reset()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn programs_in_flight_when_the_daemon_died_are_quarantined_at_the_next_start() {
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
        let p = Persisted::open(&dir).unwrap();
        assert_eq!(p.records.len(), 1);
        assert_eq!(p.records[0].content_hash, A);
        assert_eq!(p.records[0].name, "hang");
        assert_eq!(p.records[0].reason, DIED_REASON);
        drop(p);
        // The record is durable; the in-flight record was cleared.
        let p = Persisted::open(&dir).unwrap();
        assert_eq!(p.records.len(), 1);
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

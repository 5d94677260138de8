//! Suspects: programs that were on the device when a daemon died once, and have not completed a
//! run since.
//!
//! A daemon can die in the middle of a dispatch for reasons that have nothing to do with the
//! program on the device: the OOM killer, an operator's `kill -9`, another client's request
//! that brought the process down, a machine that lost power. The program in flight then
//! belongs to whoever's turn it was, often a bystander. So one death is not evidence against
//! it: the next start makes it a *suspect* and lets it run. It is quarantined only when a
//! daemon dies with it on the device again before any run of it completed in between, which is
//! what a program that makes the runtime abort does every time it runs (so a crash loop under
//! `Restart=on-failure` stops at its second turn, one later than with quarantine at the first
//! death). A suspect whose doorbell batch returns (the executor tells [`Suspects::cleared`]) is
//! no longer one.
//!
//! `state/suspects.json` holds them, written durably (temporary file, `fsync`, `rename`,
//! `fsync` of the directory) at start and whenever a suspect is cleared; at most
//! [`MAX_SUSPECTS`] are kept, the newest. A file that cannot be read or parsed is logged and
//! treated as empty: the programs it named need one more death to be quarantined.
//!
//! ```json
//! { "version": 1,
//!   "suspects": [ { "content_hash": "9f2c…", "name": "vsa", "died_unix_s": 1777896000 } ] }
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StateError;
use super::quarantine::is_hash;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "suspects.json";

/// The most suspects kept: 8 deaths of 32 programs each.
pub const MAX_SUSPECTS: usize = 256;

const VERSION: u32 = 1;

/// A program that was on the device when a daemon died.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspect {
    pub content_hash: String,
    #[serde(default)]
    pub name: String,
    /// When the daemon that ran it died (as its successor saw it), seconds since the epoch.
    pub died_unix_s: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    version: u32,
    suspects: Vec<Suspect>,
}

/// The suspects, kept in memory and in `state/suspects.json`.
#[derive(Debug)]
pub struct Suspects {
    dir: PathBuf,
    list: Vec<Suspect>,
}

impl Suspects {
    /// Reads `state/suspects.json` (none is no suspects).
    pub fn open(state: &Path) -> Self {
        let path = state.join(FILE_NAME);
        let list = match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<OnDisk>(&bytes) {
                Ok(d) if d.version == VERSION => d
                    .suspects
                    .into_iter()
                    .filter(|s| is_hash(&s.content_hash))
                    .collect(),
                Ok(d) => {
                    tracing::warn!(file = %path.display(), version = d.version, "the suspects file has another version; treating it as empty");
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "the suspects file is unreadable; treating it as empty");
                    Vec::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "the suspects file cannot be read; treating it as empty");
                Vec::new()
            }
        };
        Self {
            dir: state.to_path_buf(),
            list,
        }
    }

    /// Whether a program with this content hash is a suspect.
    pub fn contains(&self, hash: &str) -> bool {
        self.list.iter().any(|s| s.content_hash == hash)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn list(&self) -> &[Suspect] {
        &self.list
    }

    /// Makes `s` a suspect (replacing an older entry for its hash), dropping the oldest past
    /// [`MAX_SUSPECTS`]. Not written until [`Suspects::write`].
    pub fn add(&mut self, s: Suspect) {
        self.remove(&s.content_hash);
        self.list.push(s);
        if self.list.len() > MAX_SUSPECTS {
            let extra = self.list.len() - MAX_SUSPECTS;
            self.list.drain(..extra);
        }
    }

    /// Removes `hash`; whether it was a suspect. Not written until [`Suspects::write`].
    pub fn remove(&mut self, hash: &str) -> bool {
        let before = self.list.len();
        self.list.retain(|s| s.content_hash != hash);
        self.list.len() != before
    }

    /// Clears the suspicion on the programs of a batch that completed, and writes the file when
    /// any was a suspect. A failed write is logged: the program then stays a suspect on disk.
    pub fn cleared<'a>(&mut self, hashes: impl IntoIterator<Item = &'a str>) {
        let mut changed = false;
        for h in hashes {
            if self.remove(h) {
                tracing::info!(
                    hash = %h,
                    "a run of a suspect program completed; it is no longer a suspect"
                );
                changed = true;
            }
        }
        if changed && let Err(e) = self.write() {
            tracing::error!(error = %e, "writing the suspects file failed");
        }
    }

    /// Writes the file durably: temporary file, fsync, rename, fsync of the directory.
    ///
    /// # Errors
    /// [`StateError::Io`] naming the file and the step that failed.
    pub fn write(&self) -> Result<(), StateError> {
        let path = self.dir.join(FILE_NAME);
        let tmp = self.dir.join(format!("{FILE_NAME}.tmp"));
        let mut bytes = serde_json::to_vec_pretty(&OnDisk {
            version: VERSION,
            suspects: self.list.clone(),
        })
        .map_err(|e| StateError::io("encoding", &path, std::io::Error::other(e)))?;
        bytes.push(b'\n');
        super::write_durably(&self.dir, &tmp, &path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn suspect(hash: &str) -> Suspect {
        Suspect {
            content_hash: hash.into(),
            name: "n".into(),
            died_unix_s: 1,
        }
    }

    #[test]
    fn suspects_round_trip_and_a_completed_run_clears_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Suspects::open(dir.path());
        assert!(s.is_empty());
        s.add(suspect(A));
        s.add(suspect(B));
        s.write().unwrap();
        let mut s = Suspects::open(dir.path());
        assert!(s.contains(A) && s.contains(B));
        s.cleared([A, "not a suspect"]);
        let s = Suspects::open(dir.path());
        assert!(!s.contains(A) && s.contains(B));
        assert!(!dir.path().join(format!("{FILE_NAME}.tmp")).exists());
    }

    #[test]
    fn an_unreadable_file_is_no_suspects_and_the_list_is_capped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), b"{ not json").unwrap();
        let mut s = Suspects::open(dir.path());
        assert!(s.is_empty());
        for i in 0..MAX_SUSPECTS + 3 {
            s.add(suspect(&format!("{i:064x}")));
        }
        assert_eq!(s.list().len(), MAX_SUSPECTS);
        assert!(!s.contains(&format!("{:064x}", 0)));
        assert!(s.contains(&format!("{:064x}", MAX_SUSPECTS + 2)));
    }
}

//! Quarantine records on disk: one file per program, `quarantine/<content hash>.json`, so that
//! a restarted daemon refuses the bytes of a program that faulted the device (or was on the
//! device when the daemon died) until an operator clears the record.
//!
//! A record is written durably: a temporary file beside it, `fsync`, `rename` over the final
//! name, then `fsync` of the directory; a crash at any point leaves either no record or a whole
//! one. The file's name is the key: a record whose contents cannot be read or parsed still
//! quarantines the hash its name carries (with a reason that says so, and a warning in the log),
//! so damage to the state directory never lets a faulting program back in silently, and never
//! keeps the daemon from starting. Files whose names are not `<64 hex>.json` are left alone
//! (leftover temporary files are removed).
//!
//! The file, for people and tools:
//!
//! ```json
//! {
//!   "version": 1,
//!   "content_hash": "9f2c…64 hex…",
//!   "name": "fault",
//!   "faulted_unix_s": 1777896000,
//!   "faulted_at": "2026-05-04T12:00:00Z",
//!   "reason": "the device failed the dispatch: …"
//! }
//! ```
//!
//! `faulted_unix_s` is the instant; `faulted_at` repeats it readably and is not read back.

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::StateError;

/// The subdirectory of the state directory that holds the records.
pub const SUBDIR: &str = "quarantine";

/// The record format's version.
const VERSION: u32 = 1;

/// A program quarantined by content hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineRecord {
    /// blake3 of the PDI and insts, 64 lowercase hex characters.
    pub content_hash: String,
    /// The program's name when it was quarantined (may be empty).
    pub name: String,
    /// When, in seconds since the Unix epoch.
    pub faulted_unix_s: u64,
    /// Why.
    pub reason: String,
}

impl QuarantineRecord {
    /// A record made now.
    pub fn now(content_hash: &str, name: &str, reason: &str) -> Self {
        Self {
            content_hash: content_hash.to_owned(),
            name: name.to_owned(),
            faulted_unix_s: unix_now(),
            reason: reason.to_owned(),
        }
    }

    /// `faulted_unix_s` as RFC 3339 UTC.
    pub fn faulted_at(&self) -> String {
        rfc3339(self.faulted_unix_s)
    }

    /// The record as the file holds it.
    ///
    /// # Errors
    /// Never in practice (plain strings and integers); serde's error otherwise.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut v = serde_json::to_vec_pretty(&OnDisk {
            version: VERSION,
            content_hash: self.content_hash.clone(),
            name: self.name.clone(),
            faulted_unix_s: self.faulted_unix_s,
            faulted_at: Some(self.faulted_at()),
            reason: self.reason.clone(),
        })?;
        v.push(b'\n');
        Ok(v)
    }

    /// Parses a record file's bytes; `hash` is the hash its name carries.
    ///
    /// # Errors
    /// A message saying what is wrong: not JSON, another version, or a hash that is not the
    /// file's.
    pub fn from_json(hash: &str, bytes: &[u8]) -> Result<Self, String> {
        let d: OnDisk = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if d.version != VERSION {
            return Err(format!(
                "record version {}; this daemon reads {VERSION}",
                d.version
            ));
        }
        if d.content_hash != hash {
            return Err(format!(
                "the record names hash {:?}, not its file's",
                d.content_hash
            ));
        }
        Ok(Self {
            content_hash: d.content_hash,
            name: d.name,
            faulted_unix_s: d.faulted_unix_s,
            reason: d.reason,
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    version: u32,
    content_hash: String,
    #[serde(default)]
    name: String,
    faulted_unix_s: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    faulted_at: Option<String>,
    #[serde(default)]
    reason: String,
}

/// Whether `s` is a content hash: 64 lowercase hex characters.
pub fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The directory of records.
#[derive(Debug)]
pub struct QuarantineDir {
    dir: PathBuf,
}

impl QuarantineDir {
    /// Opens (creating, mode 0700) `state/quarantine` and reads every record in it.
    ///
    /// # Errors
    /// [`StateError::Io`] when the directory cannot be created or listed. A single record that
    /// cannot be read is not an error: it is logged and kept quarantined by its file name.
    pub fn open(state: &Path) -> Result<(Self, Vec<QuarantineRecord>), StateError> {
        let dir = state.join(SUBDIR);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| StateError::io("creating", &dir, e))?;
        let listing = fs::read_dir(&dir).map_err(|e| StateError::io("listing", &dir, e))?;
        let mut records = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| StateError::io("listing", &dir, e))?;
            let path = entry.path();
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                tracing::warn!(file = %path.display(), "ignoring a file in the quarantine directory: not a record's name");
                continue;
            };
            if file_name.ends_with(".tmp") {
                // A write that did not reach its rename: the record was never made.
                if let Err(e) = fs::remove_file(&path) {
                    tracing::warn!(file = %path.display(), error = %e, "removing an unfinished quarantine record failed");
                }
                continue;
            }
            let Some(hash) = file_name.strip_suffix(".json").filter(|h| is_hash(h)) else {
                tracing::warn!(file = %path.display(), "ignoring a file in the quarantine directory: not a record's name (<64 hex>.json)");
                continue;
            };
            records.push(read_record(&path, hash));
        }
        records.sort_by(|a, b| a.content_hash.cmp(&b.content_hash));
        Ok((Self { dir }, records))
    }

    /// The file of the record for `hash`.
    pub fn path_of(&self, hash: &str) -> PathBuf {
        self.dir.join(format!("{hash}.json"))
    }

    /// Writes a record durably: temporary file, fsync, rename, fsync of the directory.
    ///
    /// # Errors
    /// [`StateError::Io`] naming the file and the step that failed.
    pub fn write(&self, r: &QuarantineRecord) -> Result<(), StateError> {
        let path = self.path_of(&r.content_hash);
        let tmp = self.dir.join(format!("{}.json.tmp", r.content_hash));
        let bytes = r
            .to_json()
            .map_err(|e| StateError::io("encoding", &path, std::io::Error::other(e)))?;
        super::write_durably(&self.dir, &tmp, &path, &bytes)
    }

    /// Removes the record for `hash`; `false` when there was none.
    ///
    /// # Errors
    /// [`StateError::Io`] when the file exists but cannot be removed.
    pub fn remove(&self, hash: &str) -> Result<bool, StateError> {
        let path = self.path_of(hash);
        match fs::remove_file(&path) {
            Ok(()) => {
                self.sync_dir()?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StateError::io("removing", &path, e)),
        }
    }

    fn sync_dir(&self) -> Result<(), StateError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StateError::io("syncing", &self.dir, e))
    }
}

/// Reads one record; a record that cannot be read still quarantines its hash.
fn read_record(path: &Path, hash: &str) -> QuarantineRecord {
    let parsed = fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| QuarantineRecord::from_json(hash, &b));
    match parsed {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(
                file = %path.display(),
                error = %e,
                "a quarantine record is unreadable; its program stays quarantined (the file's \
                 name is its hash) until it is cleared"
            );
            let faulted_unix_s = fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            QuarantineRecord {
                content_hash: hash.to_owned(),
                name: String::new(),
                faulted_unix_s,
                reason: format!("unknown: its quarantine record is unreadable ({e})"),
            }
        }
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Seconds since the Unix epoch as RFC 3339 UTC (`2026-05-04T12:00:00Z`).
pub fn rfc3339(unix_s: u64) -> String {
    let days = unix_s / 86_400;
    let secs = unix_s % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn record() -> QuarantineRecord {
        QuarantineRecord {
            content_hash: H.into(),
            name: "fault \"quoted\"".into(),
            faulted_unix_s: 1_777_896_000,
            reason: "the device failed: HSA_STATUS_ERROR_EXCEPTION\nwith a second line".into(),
        }
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_777_896_000), "2026-05-04T12:00:00Z");
        assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn a_record_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let (q, none) = QuarantineDir::open(dir.path()).unwrap();
        assert!(none.is_empty());
        let r = record();
        q.write(&r).unwrap();
        let text = fs::read_to_string(q.path_of(H)).unwrap();
        assert!(
            text.contains("\"faulted_at\": \"2026-05-04T12:00:00Z\""),
            "{text}"
        );
        let (q, back) = QuarantineDir::open(dir.path()).unwrap();
        assert_eq!(back, vec![r]);
        assert!(q.remove(H).unwrap());
        assert!(!q.remove(H).unwrap());
        let (_, none) = QuarantineDir::open(dir.path()).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn writing_goes_through_a_temporary_file_and_leaves_none_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (q, _) = QuarantineDir::open(dir.path()).unwrap();
        // A record written before (an older fault) is replaced whole by the rename.
        fs::write(q.path_of(H), b"old").unwrap();
        q.write(&record()).unwrap();
        let names: Vec<String> = fs::read_dir(dir.path().join(SUBDIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![format!("{H}.json")]);
        // A temporary file left by a write that died before its rename is not a record, and is
        // cleaned up at the next start.
        let tmp = dir.path().join(SUBDIR).join(format!("{H}.json.tmp"));
        fs::write(&tmp, b"{").unwrap();
        let (_, back) = QuarantineDir::open(dir.path()).unwrap();
        assert_eq!(back, vec![record()]);
        assert!(!tmp.exists());
    }

    #[test]
    fn a_corrupt_record_keeps_its_hash_quarantined_and_other_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (q, _) = QuarantineDir::open(dir.path()).unwrap();
        fs::write(q.path_of(H), b"{\"version\": 1, \"content_ha").unwrap();
        fs::write(dir.path().join(SUBDIR).join("README"), b"notes").unwrap();
        let other = H.replace('0', "f");
        let mut wrong = record();
        wrong.content_hash = H.into();
        // A record whose contents name another hash than its file.
        fs::write(q.path_of(&other), wrong.to_json().unwrap()).unwrap();
        let (_, back) = QuarantineDir::open(dir.path()).unwrap();
        assert_eq!(back.len(), 2, "{back:?}");
        assert_eq!(back[0].content_hash, H);
        assert!(
            back[0]
                .reason
                .starts_with("unknown: its quarantine record is unreadable")
        );
        assert_eq!(back[1].content_hash, other);
        assert!(
            back[1].reason.contains("not its file's"),
            "{}",
            back[1].reason
        );
    }

    #[test]
    fn hashes_are_64_lowercase_hex() {
        assert!(is_hash(H));
        assert!(!is_hash(&H.to_uppercase()));
        assert!(!is_hash(&H[1..]));
        assert!(!is_hash("../../etc/passwd"));
    }
}

//! Token identities: each regular file in `auth.token_dir` whose name matches
//! `[A-Za-z0-9._-]+` (no leading dot) defines the identity `token:<file name>`, and holds its
//! secret, one line of 32 to 128 characters from `[A-Za-z0-9_-]`. A caller presents the secret
//! in the `x-npud-token` metadata.
//!
//! The directory is cached: per file, its secret and its stamp (device, inode, size, mtime and
//! ctime). A call carrying a token costs one `stat` of its file: a file whose stamp is unchanged
//! and last changed more than [`RACY`] before it was read keeps its cached secret; any other is
//! read again, so a removed or rewritten file stops working at once (a rewrite within the
//! timestamps' granularity is caught because a file changed that recently is always read). A
//! secret no cached file holds refreshes the cache: the directory is listed, and only the
//! files whose stamps changed are read. No lock is held across file I/O: a slow file delays
//! the call that reads it, not every other caller's.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use super::Identity;
use crate::error::NpudError;

/// Shortest and longest secret.
const SECRET_LEN: std::ops::RangeInclusive<usize> = 32..=128;

/// A file changed less than this long before it was read may change again within the same
/// timestamp tick, so its cached secret is not trusted and it is read at each use.
const RACY: Duration = Duration::from_secs(2);

/// What identifies one version of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether a read at `read_at` saw a version that cannot change without changing the stamp.
    fn settled(&self, read_at: SystemTime) -> bool {
        let changed = self.mtime.max(self.ctime).0;
        let changed = u64::try_from(changed).map_or(SystemTime::UNIX_EPOCH, |s| {
            SystemTime::UNIX_EPOCH + Duration::from_secs(s)
        });
        // Whole seconds, rounded down above: one more second covers the fraction.
        read_at
            .duration_since(changed)
            .is_ok_and(|d| d > RACY + Duration::from_secs(1))
    }
}

/// A token file as last read.
#[derive(Debug, Clone)]
struct Cached {
    stamp: Stamp,
    /// `None`: the file holds no valid secret.
    secret: Option<String>,
    settled: bool,
}

/// The token directory and the secrets last read from it.
#[derive(Debug)]
pub struct Tokens {
    dir: PathBuf,
    /// File name to what it held.
    files: RwLock<HashMap<String, Cached>>,
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && !n.starts_with('.')
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn valid_secret(s: &str) -> bool {
    SECRET_LEN.contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// The file at `path` now: `old` again when its stamp is unchanged and settled, else read.
/// `None` when it is gone or is not a regular file of at most 1 KiB.
fn current(path: &Path, old: Option<&Cached>) -> Option<Cached> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 1024 {
        return None;
    }
    let stamp = Stamp::of(&meta);
    if let Some(old) = old
        && old.settled
        && old.stamp == stamp
    {
        return Some(old.clone());
    }
    let read_at = SystemTime::now();
    let text = std::fs::read_to_string(path).ok()?;
    let s = text.strip_suffix('\n').unwrap_or(&text);
    let s = s.strip_suffix('\r').unwrap_or(s);
    // The stamp is taken again: the read saw the version it names (a change in between makes
    // the two differ, and then this read is not trusted).
    let after = std::fs::metadata(path).ok().map(|m| Stamp::of(&m));
    Some(Cached {
        stamp,
        secret: valid_secret(s).then(|| s.to_owned()),
        settled: after == Some(stamp) && stamp.settled(read_at),
    })
}

impl Tokens {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            files: RwLock::new(HashMap::new()),
        }
    }

    fn cached(&self) -> HashMap<String, Cached> {
        self.files
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The directory as it is now, reading only the files that changed since `old`.
    fn scan(&self, old: &HashMap<String, Cached>) -> HashMap<String, Cached> {
        let mut m = HashMap::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            tracing::warn!(dir = %self.dir.display(), "auth.token_dir cannot be read");
            return m;
        };
        for e in entries.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !valid_name(&name) {
                continue;
            }
            if let Some(c) = current(&e.path(), old.get(&name)) {
                m.insert(name, c);
            }
        }
        m
    }

    /// The identity whose file holds `secret`.
    ///
    /// # Errors
    /// UNAUTHENTICATED for a malformed secret or one no file holds.
    pub fn resolve(&self, secret: &str) -> Result<Identity, NpudError> {
        let key = npu_proto::IDENTITY_TOKEN_HEADER;
        if !valid_secret(secret) {
            return Err(NpudError::Unauthenticated(format!(
                "{key}: not a token secret (32 to 128 characters from A-Z a-z 0-9 _ -)"
            )));
        }
        let holds = |c: &Cached| c.secret.as_deref() == Some(secret);
        let hit = self
            .files
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(_, c)| holds(c))
            .map(|(n, c)| (n.clone(), c.clone()));
        if let Some((name, old)) = hit {
            let now = current(&self.dir.join(&name), Some(&old));
            let mut files = self.files.write().unwrap_or_else(PoisonError::into_inner);
            match now {
                Some(c) if holds(&c) => {
                    files.insert(name.clone(), c);
                    return Ok(Identity::token(&name));
                }
                Some(c) => {
                    files.insert(name, c);
                }
                None => {
                    files.remove(&name);
                }
            }
        }
        let old = self.cached();
        let fresh = self.scan(&old);
        let found = fresh.iter().find(|(_, c)| holds(c)).map(|(n, _)| n.clone());
        *self.files.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        match found {
            Some(name) => Ok(Identity::token(&name)),
            None => Err(NpudError::Unauthenticated(format!(
                "{key}: unknown secret (no file in auth.token_dir holds it; a token file that \
                 was removed or rewritten no longer works)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_define_identities_and_stop_working_when_removed_or_rewritten() {
        let d = tempfile::tempdir().unwrap();
        let t = Tokens::new(d.path().to_path_buf());
        let secret = "a".repeat(40);
        let e = t.resolve(&secret).unwrap_err();
        assert_eq!(e.code_name(), "UNAUTHENTICATED");
        assert!(e.message().contains("unknown secret"), "{e}");
        std::fs::write(d.path().join("pod-a"), format!("{secret}\n")).unwrap();
        std::fs::write(d.path().join(".hidden"), "b".repeat(40)).unwrap();
        std::fs::write(d.path().join("short"), "c".repeat(31)).unwrap();
        assert_eq!(t.resolve(&secret).unwrap().name(), "token:pod-a");
        assert!(t.resolve(&"b".repeat(40)).is_err());
        assert!(t.resolve(&"c".repeat(31)).is_err());
        std::fs::write(d.path().join("pod-a"), "d".repeat(40)).unwrap();
        assert!(t.resolve(&secret).is_err());
        assert_eq!(t.resolve(&"d".repeat(40)).unwrap().name(), "token:pod-a");
        std::fs::remove_file(d.path().join("pod-a")).unwrap();
        assert!(t.resolve(&"d".repeat(40)).is_err());
        assert!(t.resolve("x y").is_err());
    }

    #[test]
    fn a_settled_file_is_trusted_by_its_stamp_and_a_rewrite_of_the_same_size_is_seen() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("pod-b");
        std::fs::write(&path, "e".repeat(40)).unwrap();
        // As if written long ago: its stamp alone then vouches for its secret.
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let t = Tokens::new(d.path().to_path_buf());
        assert_eq!(t.resolve(&"e".repeat(40)).unwrap().name(), "token:pod-b");
        // ctime moved with set_modified, so the first read was not settled: read again now.
        let c = current(&path, None).unwrap();
        assert_eq!(c.secret.as_deref(), Some("e".repeat(40).as_str()));
        // Rewritten in place with a secret of the same length: the old one stops at once.
        std::fs::write(&path, "f".repeat(40)).unwrap();
        assert!(t.resolve(&"e".repeat(40)).is_err());
        assert_eq!(t.resolve(&"f".repeat(40)).unwrap().name(), "token:pod-b");
    }
}

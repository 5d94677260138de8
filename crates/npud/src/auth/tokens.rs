//! Token identities: each regular file in `auth.token_dir` whose name matches
//! `[A-Za-z0-9._-]+` (no leading dot) defines the identity `token:<file name>`, and holds its
//! secret, one line of 32 to 128 characters from `[A-Za-z0-9_-]`. A caller presents the secret
//! in the `x-npud-token` metadata.
//!
//! Secrets are looked up in a map read from the directory. A secret the map does not know makes
//! the directory be read again (files written after start work), and a known secret's file is
//! read again at each use (a removed or rewritten file stops working at once).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::Identity;
use crate::error::NpudError;

/// Shortest and longest secret.
const SECRET_LEN: std::ops::RangeInclusive<usize> = 32..=128;

/// The token directory and the secrets last read from it.
#[derive(Debug)]
pub struct Tokens {
    dir: PathBuf,
    /// Secret to file name.
    known: Mutex<HashMap<String, String>>,
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

/// The secret a token file holds, if it holds a valid one.
fn read_secret(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 1024 {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let s = text.strip_suffix('\n').unwrap_or(&text);
    let s = s.strip_suffix('\r').unwrap_or(s);
    valid_secret(s).then(|| s.to_owned())
}

impl Tokens {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            known: Mutex::new(HashMap::new()),
        }
    }

    fn scan(&self) -> HashMap<String, String> {
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
            if let Some(secret) = read_secret(&e.path()) {
                m.insert(secret, name);
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
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(name) = known.get(secret).cloned() {
            if read_secret(&self.dir.join(&name)).as_deref() == Some(secret) {
                return Ok(Identity::token(&name));
            }
            known.remove(secret);
        }
        *known = self.scan();
        match known.get(secret) {
            Some(name) => Ok(Identity::token(name)),
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
}

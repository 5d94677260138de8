//! Token files: the per-pod identities npud reads from its `auth.token_dir`.
//!
//! The contract with npud: each regular file in the directory whose name matches
//! `[A-Za-z0-9._-]+` (no leading dot) defines the identity `token:<name>`, and holds its
//! secret, one line of 32 to 128 characters of `[A-Za-z0-9_-]`. A client presents the secret
//! in the gRPC metadata `x-npud-token`; npud re-reads the directory for a secret it does not
//! know, so a file written after npud started works and a removed or rewritten one stops
//! working.
//!
//! The plugin keeps the directory at mode 0711 (others may open a file they know the name of,
//! not list the directory) and at each Allocate writes the allocation's file, mode 0644, with a
//! fresh secret of [`SECRET_LEN`] characters; the file is written beside its final name under a
//! leading-dot name (which npud ignores) and renamed over it, so npud never reads half a secret.
//! Every other of the plugin's files naming one of the same shares is removed: the kubelet
//! gives a share to one container at a time, so such a file belongs to a container that no
//! longer holds it. The previous holder of a share thus loses access when the share is
//! allocated again; a container that keeps running keeps its file, and with it its identity,
//! across plugin restarts.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::shares::Allocation;

/// Characters in a secret: 48 characters of a 64-letter alphabet, 288 random bits.
pub const SECRET_LEN: usize = 48;
/// The directory's mode.
pub const DIR_MODE: u32 = 0o711;
/// A token file's mode.
pub const FILE_MODE: u32 = 0o644;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// A failure to prepare the directory or to write a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("token directory {path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("no random bytes for a token secret: {0}")]
    Random(#[source] std::io::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TokenError + '_ {
    move |source| TokenError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The token directory.
#[derive(Debug)]
pub struct TokenDir {
    dir: PathBuf,
    /// One Allocate's files at a time: the removal of overlapping files and the write.
    lock: Mutex<()>,
}

impl TokenDir {
    /// Creates the directory (and its parents) when missing, and sets its mode to 0711.
    ///
    /// # Errors
    ///
    /// [`TokenError`] naming the directory when it cannot be created or its mode set.
    pub fn prepare(dir: &Path) -> Result<TokenDir, TokenError> {
        match fs::metadata(dir) {
            Ok(m) if !m.is_dir() => {
                return Err(TokenError::NotADirectory {
                    path: dir.to_owned(),
                });
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(dir).map_err(io(dir))?;
            }
            Err(e) => return Err(io(dir)(e)),
        }
        let mode = fs::metadata(dir).map_err(io(dir))?.permissions().mode() & 0o7777;
        if mode != DIR_MODE {
            fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE)).map_err(io(dir))?;
        }
        Ok(TokenDir {
            dir: dir.to_owned(),
            lock: Mutex::new(()),
        })
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes `allocation`'s token file with a fresh secret and removes the plugin's other
    /// files that name any of its shares. Returns the file's name.
    ///
    /// # Errors
    ///
    /// [`TokenError`] when no random bytes can be had or a file cannot be written or renamed.
    pub fn issue(&self, allocation: &Allocation) -> Result<String, TokenError> {
        let _one_at_a_time = self
            .lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let name = allocation.token_name();
        let secret = secret()?;
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let path = self.dir.join(&name);
        let _ = fs::remove_file(&tmp);
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(FILE_MODE)
                .open(&tmp)
                .map_err(io(&tmp))?;
            // The process umask may have narrowed the mode given at creation.
            f.set_permissions(fs::Permissions::from_mode(FILE_MODE))
                .map_err(io(&tmp))?;
            f.write_all(secret.as_bytes()).map_err(io(&tmp))?;
            f.write_all(b"\n").map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        fs::rename(&tmp, &path).map_err(io(&path))?;
        for entry in fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let other = entry.file_name();
            let Some(other) = other.to_str() else {
                continue;
            };
            if other == name {
                continue;
            }
            if Allocation::from_token_name(other).is_some_and(|a| a.overlaps(allocation)) {
                let p = entry.path();
                match fs::remove_file(&p) {
                    Ok(()) => {
                        tracing::info!(token = other, "revoked: its shares were allocated again")
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(&p)(e)),
                }
            }
        }
        Ok(name)
    }
}

/// A fresh secret of [`SECRET_LEN`] characters from the token alphabet.
fn secret() -> Result<String, TokenError> {
    let mut bytes = [0u8; SECRET_LEN];
    let mut filled = 0;
    while filled < bytes.len() {
        let n =
            rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())
                .map_err(|e| TokenError::Random(e.into()))?;
        filled += n;
    }
    // 256 is a multiple of 64, so each character is uniform.
    Ok(bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(b % 64)]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(name: &str) -> Allocation {
        Allocation::from_token_name(name).unwrap()
    }

    #[test]
    fn a_token_is_one_line_of_the_alphabet_with_mode_0644_in_a_0711_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/tokens");
        let t = TokenDir::prepare(&dir).unwrap();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o7777,
            0o711
        );
        let name = t.issue(&alloc("npu0-share-1")).unwrap();
        assert_eq!(name, "npu0-share-1");
        let file = dir.join(&name);
        assert_eq!(
            fs::metadata(&file).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        let text = fs::read_to_string(&file).unwrap();
        let line = text.strip_suffix('\n').unwrap();
        assert_eq!(line.len(), SECRET_LEN);
        assert!(line.bytes().all(|b| ALPHABET.contains(&b)), "{line}");
        // Nothing but the token is left behind.
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["npu0-share-1"]);
    }

    #[test]
    fn each_issue_rotates_and_revokes_overlapping_allocations() {
        let root = tempfile::tempdir().unwrap();
        let t = TokenDir::prepare(root.path()).unwrap();
        let read = |n: &str| fs::read_to_string(root.path().join(n)).ok();
        t.issue(&alloc("npu0-share-0.2")).unwrap();
        t.issue(&alloc("npu0-share-1")).unwrap();
        fs::write(root.path().join("someone-else"), "x").unwrap();
        let first = read("npu0-share-1").unwrap();
        t.issue(&alloc("npu0-share-1")).unwrap();
        assert_ne!(read("npu0-share-1").unwrap(), first, "a fresh secret");
        t.issue(&alloc("npu0-share-2")).unwrap();
        assert_eq!(read("npu0-share-0.2"), None, "revoked: share 2 moved on");
        assert!(read("npu0-share-1").is_some(), "no share in common");
        assert!(read("someone-else").is_some(), "not the plugin's file");
    }

    #[test]
    fn an_existing_directory_gets_mode_0711_and_a_file_is_refused() {
        let root = tempfile::tempdir().unwrap();
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
        TokenDir::prepare(root.path()).unwrap();
        assert_eq!(
            fs::metadata(root.path()).unwrap().permissions().mode() & 0o7777,
            0o711
        );
        let file = root.path().join("f");
        fs::write(&file, "").unwrap();
        let e = TokenDir::prepare(&file).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
    }

    #[test]
    fn secrets_differ() {
        assert_ne!(secret().unwrap(), secret().unwrap());
    }
}

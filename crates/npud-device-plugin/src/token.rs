//! Token files: the per-pod identities npud reads from its `auth.token_dir`.
//!
//! The contract with npud: each regular file in the directory whose name matches
//! `[A-Za-z0-9._-]+` (no leading dot) holds a secret, one line of 32 to 128 characters of
//! `[A-Za-z0-9_-]`, and a client presenting it in the gRPC metadata `x-npud-token` is
//! `token:<name>@<allocation>` (the allocation names the secret, so each Allocate's holder is
//! its own identity). npud reads the directory every `auth.token_poll_ms`, so a file written
//! after npud started works and a removed or rewritten one stops working.
//!
//! Who can read a secret: the directory is mode 0700 and owned by npud's uid
//! (`--token-dir-uid`), so no other local user can list it or open a file in it, whatever the
//! file's name; the plugin (root) writes into it through its DAC_OVERRIDE. A token file is
//! mode 0644, because the plugin does not know the uid of the container it is for: the
//! kubelet's runtime bind-mounts the file itself into the container (as root, which needs no
//! access to the directory), and the container reads it there. Another user on the node
//! reaches it neither through the directory nor through the container (`/proc/<pid>/root`
//! needs the container's uid). The plugin refuses a token directory that is a symbolic link
//! or owned by another uid, and narrows the mode of its own directory through a descriptor
//! opened without following links; every file operation is relative to that descriptor.
//!
//! At each Allocate the plugin writes the allocation's file with a fresh secret of
//! [`SECRET_LEN`] characters; the file is written beside its final name under a leading-dot
//! name (which npud ignores) and renamed over it, so npud never reads half a secret, and a
//! container still holding the previous file keeps a secret that no longer works. Every other
//! of the plugin's files naming one of the same shares is removed: the kubelet gives a share to
//! one container at a time, so such a file belongs to a container that no longer holds it. The
//! previous holder of a share thus loses access when the share is allocated again; a container
//! that keeps running keeps its file, and with it its identity, across plugin restarts.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};

use crate::shares::Allocation;

/// Characters in a secret: 48 characters of a 64-letter alphabet, 288 random bits.
pub const SECRET_LEN: usize = 48;
/// The directory's mode: nobody but its owner (npud's uid) and root may list or enter it.
pub const DIR_MODE: u32 = 0o700;
/// A token file's mode: readable by the container's uid, whatever it is, through the mount.
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
    #[error(
        "token directory {path} is a symbolic link; name the directory itself (its mode and \
         owner are checked, and a link's target is not changed)"
    )]
    Symlink { path: PathBuf },
    #[error(
        "token directory {path} is owned by uid {owner}; it must be owned by npud's uid \
         {expected} (--token-dir-uid), with mode 0700"
    )]
    Owner {
        path: PathBuf,
        owner: u32,
        expected: u32,
    },
    #[error(
        "token directory {path} has mode {mode:04o} and it could not be set to 0700 ({source}); \
         it must be owned by npud's uid with no access for group or others: token files hold \
         secrets"
    )]
    Mode {
        path: PathBuf,
        mode: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("no random bytes for a token secret: {0}")]
    Random(#[source] std::io::Error),
}

fn io(path: &Path) -> impl FnOnce(rustix::io::Errno) -> TokenError + '_ {
    move |e| TokenError::Io {
        path: path.to_owned(),
        source: e.into(),
    }
}

/// The token directory.
#[derive(Debug)]
pub struct TokenDir {
    dir: PathBuf,
    /// The directory, opened without following links: every file is written relative to it.
    fd: OwnedFd,
    /// One Allocate's files at a time: the removal of overlapping files and the write.
    lock: Mutex<()>,
}

impl TokenDir {
    /// Creates the directory (and its parents) when missing, owned by `owner`, and checks an
    /// existing one: not a symbolic link, owned by `owner` (npud's uid); its mode is narrowed
    /// to 0700.
    ///
    /// # Errors
    ///
    /// [`TokenError`] naming the directory when it is a link, owned by another uid, cannot be
    /// created, or its mode cannot be set.
    pub fn prepare(dir: &Path, owner: u32) -> Result<TokenDir, TokenError> {
        let mut created = false;
        match rustix::fs::statat(CWD, dir, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => match FileType::from_raw_mode(s.st_mode) {
                FileType::Directory => {}
                FileType::Symlink => {
                    return Err(TokenError::Symlink {
                        path: dir.to_owned(),
                    });
                }
                _ => {
                    return Err(TokenError::NotADirectory {
                        path: dir.to_owned(),
                    });
                }
            },
            Err(rustix::io::Errno::NOENT) => {
                if let Some(parent) = dir.parent() {
                    std::fs::create_dir_all(parent).map_err(|source| TokenError::Io {
                        path: dir.to_owned(),
                        source,
                    })?;
                }
                match rustix::fs::mkdirat(CWD, dir, Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) => created = true,
                    Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(io(dir)(e)),
                }
            }
            Err(e) => return Err(io(dir)(e)),
        }
        let fd = rustix::fs::openat(
            CWD,
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => TokenError::Symlink {
                path: dir.to_owned(),
            },
            rustix::io::Errno::NOTDIR => TokenError::NotADirectory {
                path: dir.to_owned(),
            },
            e => io(dir)(e),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io(dir))?;
        if st.st_uid != owner {
            // A directory this plugin just made is its own: hand it to npud's uid.
            let given = created
                && rustix::fs::fchown(&fd, Some(rustix::process::Uid::from_raw(owner)), None)
                    .is_ok();
            if !given {
                return Err(TokenError::Owner {
                    path: dir.to_owned(),
                    owner: st.st_uid,
                    expected: owner,
                });
            }
        }
        let mode = st.st_mode & 0o7777;
        if mode != DIR_MODE {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE)).map_err(|e| {
                TokenError::Mode {
                    path: dir.to_owned(),
                    mode,
                    source: e.into(),
                }
            })?;
        }
        Ok(TokenDir {
            dir: dir.to_owned(),
            fd,
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
        let tmp = format!(".{name}.tmp");
        let tmp_path = self.dir.join(&tmp);
        let path = self.dir.join(&name);
        let _ = rustix::fs::unlinkat(&self.fd, &tmp, AtFlags::empty());
        {
            let fd = rustix::fs::openat(
                &self.fd,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(FILE_MODE),
            )
            .map_err(io(&tmp_path))?;
            // The process umask may have narrowed the mode given at creation.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE)).map_err(io(&tmp_path))?;
            let mut f = std::fs::File::from(fd);
            let wrote = f
                .write_all(secret.as_bytes())
                .and_then(|()| f.write_all(b"\n"))
                .and_then(|()| f.sync_all());
            wrote.map_err(|source| TokenError::Io {
                path: tmp_path.clone(),
                source,
            })?;
        }
        rustix::fs::renameat(&self.fd, &tmp, &self.fd, &name).map_err(io(&path))?;
        let entries = rustix::fs::Dir::read_from(&self.fd).map_err(io(&self.dir))?;
        for entry in entries {
            let entry = entry.map_err(io(&self.dir))?;
            let Ok(other) = entry.file_name().to_str() else {
                continue;
            };
            if other == name {
                continue;
            }
            if Allocation::from_token_name(other).is_some_and(|a| a.overlaps(allocation)) {
                match rustix::fs::unlinkat(&self.fd, other, AtFlags::empty()) {
                    Ok(()) => {
                        tracing::info!(token = other, "revoked: its shares were allocated again")
                    }
                    Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => return Err(io(&self.dir.join(other))(e)),
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
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;

    use super::*;

    fn alloc(name: &str) -> Allocation {
        Allocation::from_token_name(name).unwrap()
    }

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_token_is_one_line_of_the_alphabet_with_mode_0644_in_a_0700_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/tokens");
        let t = TokenDir::prepare(&dir, me()).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let name = t.issue(&alloc("npu0-share-1")).unwrap();
        assert_eq!(name, "npu0-share-1");
        let file = dir.join(&name);
        assert_eq!(mode(&file), 0o644);
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
        let t = TokenDir::prepare(root.path(), me()).unwrap();
        let read = |n: &str| fs::read_to_string(root.path().join(n)).ok();
        t.issue(&alloc("npu0-share-0.2")).unwrap();
        t.issue(&alloc("npu0-share-1")).unwrap();
        fs::write(root.path().join("someone-else"), "x").unwrap();
        let first = read("npu0-share-1").unwrap();
        let inode = fs::metadata(root.path().join("npu0-share-1"))
            .unwrap()
            .ino();
        t.issue(&alloc("npu0-share-1")).unwrap();
        assert_ne!(read("npu0-share-1").unwrap(), first, "a fresh secret");
        assert_ne!(
            fs::metadata(root.path().join("npu0-share-1"))
                .unwrap()
                .ino(),
            inode,
            "a new file: a container holding the old one by its mount keeps the old secret"
        );
        t.issue(&alloc("npu0-share-2")).unwrap();
        assert_eq!(read("npu0-share-0.2"), None, "revoked: share 2 moved on");
        assert!(read("npu0-share-1").is_some(), "no share in common");
        assert!(read("someone-else").is_some(), "not the plugin's file");
    }

    #[test]
    fn an_existing_directory_is_narrowed_to_0700_and_a_file_is_refused() {
        let root = tempfile::tempdir().unwrap();
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o711)).unwrap();
        TokenDir::prepare(root.path(), me()).unwrap();
        assert_eq!(mode(root.path()), 0o700);
        let file = root.path().join("f");
        fs::write(&file, "").unwrap();
        let e = TokenDir::prepare(&file, me()).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
    }

    #[test]
    fn a_symbolic_link_is_refused_and_its_target_left_as_it_was() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("elsewhere");
        fs::create_dir(&target).unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).unwrap();
        let link = root.path().join("tokens");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = TokenDir::prepare(&link, me()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "token directory {} is a symbolic link; name the directory itself (its mode and \
                 owner are checked, and a link's target is not changed)",
                link.display()
            )
        );
        assert_eq!(mode(&target), 0o755, "the target's mode is untouched");
    }

    #[test]
    fn a_directory_owned_by_another_uid_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("tokens");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let e = TokenDir::prepare(&dir, me() + 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "token directory {} is owned by uid {}; it must be owned by npud's uid {} \
                 (--token-dir-uid), with mode 0700",
                dir.display(),
                me(),
                me() + 1
            )
        );
        assert_eq!(mode(&dir), 0o755, "a refused directory is left as it was");
    }

    /// With root, a directory the plugin makes is handed to npud's uid, and another uid can
    /// neither list it nor read a token in it by name.
    #[test]
    fn another_uid_cannot_read_a_token() {
        if me() != 0 {
            eprintln!("not root: no second uid to try");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let dir = root.path().join("tokens");
        let npud_uid = 65532;
        let t = TokenDir::prepare(&dir, npud_uid).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().uid(), npud_uid);
        let name = t.issue(&alloc("npu0-share-3")).unwrap();
        let file = dir.join(name);
        assert!(fs::read_to_string(&file).unwrap().len() > SECRET_LEN);
        for (cmd, arg) in [("cat", &file), ("ls", &dir)] {
            let out = std::process::Command::new(cmd)
                .arg(arg)
                .uid(65534)
                .gid(65534)
                .output()
                .unwrap();
            assert!(
                !out.status.success(),
                "{cmd} {} as uid 65534",
                arg.display()
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("Permission denied"), "{err}");
        }
    }

    #[test]
    fn secrets_differ() {
        assert_ne!(secret().unwrap(), secret().unwrap());
    }
}

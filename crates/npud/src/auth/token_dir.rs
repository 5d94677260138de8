//! Reading `auth.token_dir` as only its owner could have written it.
//!
//! The directory is opened without following a symbolic link and must be owned by the
//! daemon's uid with no access for group or others (mode 0700, or narrower): token files hold
//! secrets, and a directory another local user can list or traverse would let that user read
//! them by name. Files in it are looked at without following symbolic links either: a link
//! defines no identity, whatever it points to. A scan costs one directory listing and one
//! `stat` per entry; only files whose stamp changed are opened and read (at most 1 KiB each).

use std::collections::HashMap;
use std::ffi::CStr;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, Stat};

/// Shortest and longest secret.
pub const SECRET_LEN: std::ops::RangeInclusive<usize> = 32..=128;

/// The largest token file read.
const MAX_FILE: i64 = 1024;

/// A file changed less than this long before it was read may change again within the same
/// timestamp tick, so its cached secret is not trusted and it is read at each scan.
const RACY: Duration = Duration::from_secs(2);

/// What identifies one version of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, u64),
    ctime: (i64, u64),
}

impl Stamp {
    fn of(s: &Stat) -> Self {
        Self {
            dev: s.st_dev,
            ino: s.st_ino,
            size: s.st_size,
            mtime: (s.st_mtime, s.st_mtime_nsec),
            ctime: (s.st_ctime, s.st_ctime_nsec),
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
pub struct Cached {
    stamp: Stamp,
    /// `None`: the file holds no valid secret.
    pub secret: Option<String>,
    settled: bool,
}

/// Whether `n` may name a token file: `[A-Za-z0-9._-]+`, no leading dot.
pub fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && !n.starts_with('.')
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `s` may be a secret: 32 to 128 characters from `[A-Za-z0-9_-]`.
pub fn valid_secret(s: &str) -> bool {
    SECRET_LEN.contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// Opens the token directory `dir` and checks that only `uid` can list or enter it.
///
/// # Errors
/// A message naming the path, what it is (owner and mode) and what is expected, for a
/// directory that is missing, a symbolic link, not a directory, owned by another uid, or open
/// to group or others.
pub fn open_dir(dir: &Path, uid: u32) -> Result<OwnedFd, String> {
    let shown = dir.display();
    let expected = format!(
        "it must be a directory (not a symbolic link) owned by npud's uid {uid} with no access \
         for group or others (mode 0700): token files hold secrets"
    );
    let fd = rustix::fs::openat(
        CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        let link = rustix::fs::statat(CWD, dir, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink);
        if link {
            format!("auth.token_dir {shown} is a symbolic link; {expected}")
        } else {
            format!(
                "auth.token_dir {shown}: {}; {expected}",
                std::io::Error::from(e)
            )
        }
    })?;
    let st = rustix::fs::fstat(&fd)
        .map_err(|e| format!("auth.token_dir {shown}: {}", std::io::Error::from(e)))?;
    let mode = st.st_mode & 0o7777;
    if st.st_uid != uid || mode & 0o077 != 0 {
        return Err(format!(
            "auth.token_dir {shown} is owned by uid {} with mode {mode:04o}; {expected}",
            st.st_uid
        ));
    }
    Ok(fd)
}

/// The token files in the directory `fd` now, reading only those whose stamp changed since
/// `old`. Entries that are not regular files (a symbolic link among them), are larger than
/// 1 KiB, or cannot be read are left out.
pub fn scan(
    fd: &OwnedFd,
    old: &HashMap<String, Cached>,
) -> Result<HashMap<String, Cached>, String> {
    let mut m = HashMap::new();
    let entries =
        rustix::fs::Dir::read_from(fd).map_err(|e| std::io::Error::from(e).to_string())?;
    for e in entries {
        let Ok(e) = e else {
            break;
        };
        let Some(name) = e.file_name().to_str().ok().filter(|n| valid_name(n)) else {
            continue;
        };
        if let Some(c) = current(fd, e.file_name(), old.get(name)) {
            m.insert(name.to_owned(), c);
        }
    }
    Ok(m)
}

/// The file `name` in `dir` now: `old` again when its stamp is unchanged and settled, else
/// read. `None` when it is gone or is not a regular file of at most 1 KiB.
fn current(dir: &OwnedFd, name: &CStr, old: Option<&Cached>) -> Option<Cached> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_size > MAX_FILE {
        return None;
    }
    let stamp = Stamp::of(&st);
    if let Some(old) = old
        && old.settled
        && old.stamp == stamp
    {
        return Some(old.clone());
    }
    let read_at = SystemTime::now();
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )
    .ok()?;
    let opened = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(opened.st_mode) != FileType::RegularFile
        || Stamp::of(&opened) != stamp
    {
        return None;
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(u64::try_from(MAX_FILE).unwrap_or(1024))
        .read_to_string(&mut text)
        .ok()?;
    let s = text.strip_suffix('\n').unwrap_or(&text);
    let s = s.strip_suffix('\r').unwrap_or(s);
    // The stamp is taken again: the read saw the version it names (a change in between makes
    // the two differ, and then this read is not trusted).
    let after = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .map(|s| Stamp::of(&s));
    Some(Cached {
        stamp,
        secret: valid_secret(s).then(|| s.to_owned()),
        settled: after == Some(stamp) && stamp.settled(read_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    #[test]
    fn a_directory_open_to_others_a_link_or_another_owner_is_refused_naming_what_is_expected() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("tokens");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        open_dir(&dir, me()).unwrap();
        for mode in [0o711, 0o755, 0o750, 0o701] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = open_dir(&dir, me()).unwrap_err();
            assert_eq!(
                e,
                format!(
                    "auth.token_dir {} is owned by uid {} with mode {mode:04o}; it must be a \
                     directory (not a symbolic link) owned by npud's uid {} with no access for \
                     group or others (mode 0700): token files hold secrets",
                    dir.display(),
                    me(),
                    me()
                )
            );
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = open_dir(&dir, me() + 1).unwrap_err();
        assert!(
            e.contains(&format!("is owned by uid {} with mode 0700", me())),
            "{e}"
        );
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = open_dir(&link, me()).unwrap_err();
        assert!(e.contains("is a symbolic link; it must be"), "{e}");
        let e = open_dir(&root.path().join("missing"), me()).unwrap_err();
        assert!(e.contains("No such file or directory"), "{e}");
    }

    #[test]
    fn a_symbolic_link_in_the_directory_defines_no_identity() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("tokens");
        std::fs::create_dir(&dir).unwrap();
        let outside = root.path().join("outside");
        std::fs::write(&outside, "x".repeat(40)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("pod-l")).unwrap();
        std::fs::write(dir.join("pod-f"), "y".repeat(40)).unwrap();
        std::fs::create_dir(dir.join("pod-d")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let fd = open_dir(&dir, me()).unwrap();
        let m = scan(&fd, &HashMap::new()).unwrap();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["pod-f"]);
    }
}

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

/// Why the token directory could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirError {
    /// It is not what it must be (missing, a symbolic link, not a directory, another owner,
    /// open to others): no token identity works until it is fixed.
    Refused(String),
    /// Reading it failed for a reason that says nothing about its files (out of file
    /// descriptors or memory, an I/O error): the last scan's identities stay.
    Failed(String),
}

impl std::fmt::Display for DirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(why) | Self::Failed(why) => f.write_str(why),
        }
    }
}

/// Whether an error of the system says nothing about the file it was about: the process or the
/// machine ran short (descriptors, memory), or the device failed. A scan that meets one keeps
/// what it knew rather than revoke identities (and end their calls) it could not check.
fn transient(e: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    [
        Errno::MFILE,
        Errno::NFILE,
        Errno::NOMEM,
        Errno::NOBUFS,
        Errno::IO,
        Errno::INTR,
        Errno::AGAIN,
    ]
    .contains(&e)
}

/// Opens the token directory `dir` and checks that only `uid` can list or enter it.
///
/// # Errors
/// [`DirError::Refused`] with a message naming the path, what it is (owner and mode) and what
/// is expected, for a directory that is missing, a symbolic link, not a directory, owned by
/// another uid, or open to group or others; [`DirError::Failed`] when the system could not
/// open or examine it ([`transient`]).
pub fn open_dir(dir: &Path, uid: u32) -> Result<OwnedFd, DirError> {
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
        if transient(e) {
            return DirError::Failed(format!(
                "auth.token_dir {shown}: {}",
                std::io::Error::from(e)
            ));
        }
        let link = rustix::fs::statat(CWD, dir, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink);
        DirError::Refused(if link {
            format!("auth.token_dir {shown} is a symbolic link; {expected}")
        } else {
            format!(
                "auth.token_dir {shown}: {}; {expected}",
                std::io::Error::from(e)
            )
        })
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| {
        DirError::Failed(format!(
            "auth.token_dir {shown}: {}",
            std::io::Error::from(e)
        ))
    })?;
    let mode = st.st_mode & 0o7777;
    if st.st_uid != uid || mode & 0o077 != 0 {
        return Err(DirError::Refused(format!(
            "auth.token_dir {shown} is owned by uid {} with mode {mode:04o}; {expected}",
            st.st_uid
        )));
    }
    Ok(fd)
}

/// What one scan of the directory found.
#[derive(Debug, Default)]
pub struct Scanned {
    /// File name to what it held.
    pub files: HashMap<String, Cached>,
    /// Files that define no identity, each with why: not a regular file, too large, not
    /// readable by npud, or holding no valid secret.
    pub skipped: HashMap<String, String>,
    /// Files whose read failed for a reason that says nothing about them ([`transient`]):
    /// each kept as the previous scan read it, with the error.
    pub kept: HashMap<String, String>,
}

/// The token files in the directory `fd` now, reading only those whose stamp changed since
/// `old`. Entries that are not regular files (a symbolic link among them), are larger than
/// 1 KiB, or cannot be read by npud are skipped, with why; a file whose read fails for a
/// [`transient`] reason is kept as `old` holds it.
///
/// # Errors
/// [`DirError::Failed`] when listing the directory failed part way: the caller keeps its
/// previous view rather than revoke the identities of files it did not reach.
pub fn scan(fd: &OwnedFd, old: &HashMap<String, Cached>) -> Result<Scanned, DirError> {
    let failed =
        |e: rustix::io::Errno| DirError::Failed(format!("listing it: {}", std::io::Error::from(e)));
    let mut found = Scanned::default();
    for e in rustix::fs::Dir::read_from(fd).map_err(failed)? {
        let e = e.map_err(failed)?;
        let Some(name) = e.file_name().to_str().ok().filter(|n| valid_name(n)) else {
            continue;
        };
        let prev = old.get(name);
        match current(fd, e.file_name(), prev) {
            Ok(Some(c)) => {
                if c.secret.is_none() {
                    found.skipped.insert(
                        name.to_owned(),
                        "holds no valid secret (one line of 32 to 128 characters from \
                         A-Z a-z 0-9 _ -)"
                            .into(),
                    );
                }
                found.files.insert(name.to_owned(), c);
            }
            Ok(None) => {}
            Err(Skip::Permanent(why)) => {
                found.skipped.insert(name.to_owned(), why);
            }
            Err(Skip::Transient(why)) => {
                if let Some(p) = prev {
                    found.files.insert(name.to_owned(), p.clone());
                }
                found.kept.insert(name.to_owned(), why);
            }
        }
    }
    Ok(found)
}

/// Why a file defines no identity at this scan.
enum Skip {
    /// What the file is (not a regular file, too large, not readable by npud).
    Permanent(String),
    /// What the system could not do ([`transient`], or the file changed while it was read).
    Transient(String),
}

impl Skip {
    fn of(what: &str, e: rustix::io::Errno) -> Self {
        let why = format!("{what}: {}", std::io::Error::from(e));
        if transient(e) {
            Self::Transient(why)
        } else {
            Self::Permanent(why)
        }
    }
}

/// The file `name` in `dir` now: `old` again when its stamp is unchanged and settled, else
/// read. `None` when it is gone.
fn current(dir: &OwnedFd, name: &CStr, old: Option<&Cached>) -> Result<Option<Cached>, Skip> {
    use rustix::io::Errno;
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(Skip::of("stat", e)),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Skip::Permanent(
            "not a regular file (a symbolic link defines no identity)".into(),
        ));
    }
    if st.st_size > MAX_FILE {
        return Err(Skip::Permanent(format!(
            "{} bytes, more than a token file's {MAX_FILE}",
            st.st_size
        )));
    }
    let stamp = Stamp::of(&st);
    if let Some(old) = old
        && old.settled
        && old.stamp == stamp
    {
        return Ok(Some(old.clone()));
    }
    let read_at = SystemTime::now();
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(Skip::of("npud cannot open it", e)),
    };
    let opened = rustix::fs::fstat(&fd).map_err(|e| Skip::of("stat", e))?;
    if FileType::from_raw_mode(opened.st_mode) != FileType::RegularFile
        || Stamp::of(&opened) != stamp
    {
        return Err(Skip::Transient("it changed while it was opened".into()));
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(u64::try_from(MAX_FILE).unwrap_or(1024))
        .read_to_end(&mut bytes)
        .map_err(|e| match e.raw_os_error().map(Errno::from_raw_os_error) {
            Some(errno) => Skip::of("reading it", errno),
            None => Skip::Transient(format!("reading it: {e}")),
        })?;
    let text = String::from_utf8_lossy(&bytes);
    let s = text.strip_suffix('\n').unwrap_or(&text);
    let s = s.strip_suffix('\r').unwrap_or(s);
    // The stamp is taken again: the read saw the version it names (a change in between makes
    // the two differ, and then this read is not trusted).
    let after = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .map(|s| Stamp::of(&s));
    Ok(Some(Cached {
        stamp,
        secret: valid_secret(s).then(|| s.to_owned()),
        settled: after == Some(stamp) && stamp.settled(read_at),
    }))
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
            let e = open_dir(&dir, me()).unwrap_err().to_string();
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
        let e = open_dir(&dir, me() + 1).unwrap_err().to_string();
        assert!(
            e.contains(&format!("is owned by uid {} with mode 0700", me())),
            "{e}"
        );
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = open_dir(&link, me()).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link; it must be"), "{e}");
        let e = open_dir(&root.path().join("missing"), me())
            .unwrap_err()
            .to_string();
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
        assert_eq!(m.files.keys().collect::<Vec<_>>(), ["pod-f"]);
        // Each entry left out is named with why.
        let mut skipped: Vec<_> = m.skipped.iter().collect();
        skipped.sort();
        assert_eq!(
            skipped,
            [
                (
                    &"pod-d".to_owned(),
                    &"not a regular file (a symbolic link defines no identity)".to_owned()
                ),
                (
                    &"pod-l".to_owned(),
                    &"not a regular file (a symbolic link defines no identity)".to_owned()
                )
            ]
        );
    }

    #[test]
    fn a_file_too_large_or_without_a_valid_secret_is_skipped_with_why() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        std::fs::write(dir.join("big"), "z".repeat(2000)).unwrap();
        std::fs::write(dir.join("short"), "z".repeat(31)).unwrap();
        std::fs::write(dir.join("ok"), "z".repeat(32)).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let m = scan(&open_dir(dir, me()).unwrap(), &HashMap::new()).unwrap();
        assert_eq!(
            m.skipped.get("big").map(String::as_str),
            Some("2000 bytes, more than a token file's 1024")
        );
        assert!(
            m.skipped["short"].starts_with("holds no valid secret"),
            "{m:?}"
        );
        assert!(!m.skipped.contains_key("ok") && m.kept.is_empty(), "{m:?}");
        assert!(m.files["ok"].secret.is_some());
    }

    #[test]
    fn out_of_descriptors_the_directory_is_not_refused_but_failed() {
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        // Every descriptor taken (this test runs in a process of its own under nextest; under
        // `cargo test` other tests' threads may briefly fail to open files too).
        use rustix::process::{Resource, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        let mut low = limit;
        low.current = Some(512);
        setrlimit(Resource::Nofile, low).unwrap();
        let mut held = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            held.push(f);
        }
        let e = open_dir(root.path(), me()).unwrap_err();
        drop(held);
        setrlimit(Resource::Nofile, limit).unwrap();
        assert!(
            matches!(&e, DirError::Failed(why) if why.contains("Too many open files")),
            "{e:?}"
        );
    }
}

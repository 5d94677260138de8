//! Creating memfds and checking the ones clients send.
//!
//! A tensor a client shares with the daemon lives in a memfd: anonymous shared memory with a file
//! descriptor, created with `memfd_create(MFD_ALLOW_SEALING)`. The daemon maps it and reads and
//! writes it while a dispatch runs. If the client could shrink the memfd after the daemon mapped
//! it, the daemon's next touch of a vanished page would raise `SIGBUS` and kill it. So the daemon
//! accepts only memfds that carry `F_SEAL_SHRINK` and `F_SEAL_GROW` (the size is then fixed for
//! the life of the inode), that carry no write seal (the daemon writes results into them), whose
//! size equals the declared tensor size, and that were sent open read-write. [`check_import`]
//! enforces exactly that and nothing more.
//!
//! Limits of the contract:
//! - `F_SEAL_WRITE` is never required, and is refused (as is `F_SEAL_FUTURE_WRITE`): the client
//!   writes its next inputs into the same memory and the daemon its results.
//!   The daemon therefore never relies on the contents staying put; see [`crate::mapping`] for
//!   when the contents may be read.
//! - Seals are per inode, so they hold for every fd and mapping of that memfd, in every process.
//! - A tmpfs file (for example under `/dev/shm`) is shmem too and is accepted only if it carries
//!   both seals, which a file not created by `memfd_create` normally cannot.
//! - [`create`] is what a client does before importing; the daemon uses it for the memfds it
//!   exports.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::{FileType, MemfdFlags, OFlags};
use rustix::io::Errno;

pub use rustix::fs::SealFlags;

use crate::FdError;

/// The two seals that fix a memfd's size: `F_SEAL_SHRINK | F_SEAL_GROW`.
pub const SIZE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// What kind of file an fd refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FdKind {
    /// A memfd (`memfd_create`).
    Memfd,
    /// A shmem file that was not made by `memfd_create` (tmpfs, `/dev/shm`).
    Shmem,
    /// A file on a disk file system.
    RegularFile,
    /// A socket.
    Socket,
    /// A pipe or FIFO.
    Pipe,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A directory.
    Directory,
    /// Anything else (an anonymous inode such as an eventfd or a dma-buf, ...).
    Other,
}

impl fmt::Display for FdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FdKind::Memfd => "a memfd",
            FdKind::Shmem => "a tmpfs/shared-memory file not made by memfd_create",
            FdKind::RegularFile => "a regular file",
            FdKind::Socket => "a socket",
            FdKind::Pipe => "a pipe",
            FdKind::CharDevice => "a character device",
            FdKind::BlockDevice => "a block device",
            FdKind::Directory => "a directory",
            FdKind::Other => "an anonymous or special file",
        })
    }
}

/// How an fd was opened (`fcntl(F_GETFL) & O_ACCMODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `O_RDONLY`.
    ReadOnly,
    /// `O_WRONLY`.
    WriteOnly,
    /// `O_RDWR`.
    ReadWrite,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::ReadOnly => "read-only (O_RDONLY)",
            Access::WriteOnly => "write-only (O_WRONLY)",
            Access::ReadWrite => "read-write (O_RDWR)",
        })
    }
}

/// What [`inspect`] found out about an fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdFacts {
    /// The kind of file.
    pub kind: FdKind,
    /// The seals (`F_GET_SEALS`); empty for files that are not shmem.
    pub seals: SealFlags,
    /// The size in bytes (`fstat`).
    pub size: u64,
    /// How the fd was opened.
    pub access: Access,
}

impl FdFacts {
    /// Whether the size can no longer change (`F_SEAL_SHRINK` and `F_SEAL_GROW` are set).
    pub fn size_is_sealed(&self) -> bool {
        self.seals.contains(SIZE_SEALS)
    }
}

/// Creates a memfd of `size` bytes (zero-filled) and seals its size.
///
/// The fd is close-on-exec and carries `F_SEAL_SHRINK | F_SEAL_GROW`, so it passes
/// [`check_import`] for `size`.
///
/// # Errors
///
/// [`FdError::Sys`] when `memfd_create` (a name longer than 249 bytes or containing a NUL byte),
/// `ftruncate` (for example `RLIMIT_FSIZE`) or `fcntl(F_ADD_SEALS)` fails.
#[doc(alias = "memfd_create")]
pub fn create(name: &str, size: u64) -> Result<OwnedFd, FdError> {
    let fd = create_unsealed(name, size)?;
    add_size_seals(fd.as_fd())?;
    Ok(fd)
}

/// Creates a memfd of `size` bytes that allows sealing but carries no seal yet.
///
/// # Errors
///
/// [`FdError::Sys`] when `memfd_create` or `ftruncate` fails.
pub fn create_unsealed(name: &str, size: u64) -> Result<OwnedFd, FdError> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(FdError::sys("memfd_create"))?;
    rustix::fs::ftruncate(&fd, size).map_err(FdError::sys("ftruncate"))?;
    Ok(fd)
}

/// Adds `F_SEAL_SHRINK | F_SEAL_GROW` to a memfd, fixing its current size.
///
/// # Errors
///
/// [`FdError::Sys`] when `fcntl(F_ADD_SEALS)` fails: `EPERM` if `F_SEAL_SEAL` is set or the
/// memfd was created without `MFD_ALLOW_SEALING`, `EINVAL` if the fd is not a memfd or is not
/// writable.
#[doc(alias = "F_ADD_SEALS")]
pub fn add_size_seals(fd: BorrowedFd<'_>) -> Result<(), FdError> {
    rustix::fs::fcntl_add_seals(fd, SIZE_SEALS).map_err(FdError::sys("fcntl(F_ADD_SEALS)"))
}

/// Adds `F_SEAL_SEAL` to a memfd: no seal can be added or removed afterwards. A memfd handed
/// to an untrusted process gets it, so that process cannot add a write seal that would make
/// the owner's own later mappings or writes fail.
///
/// # Errors
///
/// [`FdError::Sys`] when `fcntl(F_ADD_SEALS)` fails (as for [`add_size_seals`]).
#[doc(alias = "F_SEAL_SEAL")]
pub fn freeze_seals(fd: BorrowedFd<'_>) -> Result<(), FdError> {
    rustix::fs::fcntl_add_seals(fd, SealFlags::SEAL).map_err(FdError::sys("fcntl(F_ADD_SEALS)"))
}

/// Finds out what an fd is: kind, seals, size and access mode.
///
/// An fd is shmem when `F_GET_SEALS` succeeds on it; its `/proc/self/fd` link (`/memfd:NAME`)
/// then tells a memfd from another tmpfs file. When `/proc` is not mounted, shmem counts as a
/// memfd.
///
/// # Errors
///
/// [`FdError::Sys`] when `fstat`, `fcntl(F_GETFL)` or `fcntl(F_GET_SEALS)` fails for another
/// reason than "not shmem" (`EBADF` for a closed fd, for example).
pub fn inspect(fd: BorrowedFd<'_>) -> Result<FdFacts, FdError> {
    let stat = rustix::fs::fstat(fd).map_err(FdError::sys("fstat"))?;
    let flags = rustix::fs::fcntl_getfl(fd).map_err(FdError::sys("fcntl(F_GETFL)"))?;
    let access = match flags & OFlags::ACCMODE {
        mode if mode == OFlags::RDWR => Access::ReadWrite,
        mode if mode == OFlags::WRONLY => Access::WriteOnly,
        _ => Access::ReadOnly,
    };
    let seals = match rustix::fs::fcntl_get_seals(fd) {
        Ok(seals) => Some(seals),
        Err(Errno::INVAL) => None,
        Err(errno) => return Err(FdError::sys("fcntl(F_GET_SEALS)")(errno)),
    };
    let kind = match seals {
        Some(_) if proc_link_says_memfd(fd) == Some(false) => FdKind::Shmem,
        Some(_) => FdKind::Memfd,
        None => kind_from_mode(FileType::from_raw_mode(stat.st_mode)),
    };
    Ok(FdFacts {
        kind,
        seals: seals.unwrap_or_else(SealFlags::empty),
        // A negative size cannot come from the kernel; treat it as empty rather than trust it.
        size: u64::try_from(stat.st_size).unwrap_or(0),
        access,
    })
}

/// Checks an fd a client sent for a tensor it declared as `declared_size` bytes.
///
/// Accepts a memfd (or another shmem file) that carries `F_SEAL_SHRINK` and `F_SEAL_GROW`, is
/// exactly `declared_size` bytes long and is open read-write. A write seal (`F_SEAL_WRITE`,
/// `F_SEAL_FUTURE_WRITE`) is refused: such a memfd cannot be mapped writable. `F_SEAL_SEAL` is
/// neither required nor refused.
///
/// # Errors
///
/// In the order checked: [`FdError::NotMemfd`], [`FdError::MissingSeals`],
/// [`FdError::WriteSealed`], [`FdError::SizeMismatch`], [`FdError::NotReadWrite`]; or [`FdError::Sys`] from [`inspect`].
pub fn check_import(fd: BorrowedFd<'_>, declared_size: u64) -> Result<FdFacts, FdError> {
    let facts = inspect(fd)?;
    match facts.kind {
        FdKind::Memfd => {}
        FdKind::Shmem if facts.size_is_sealed() => {}
        kind => return Err(FdError::NotMemfd { kind }),
    }
    let missing = SIZE_SEALS.difference(facts.seals);
    if !missing.is_empty() {
        return Err(FdError::MissingSeals {
            missing: seal_names(missing),
            sealing_locked: facts.seals.contains(SealFlags::SEAL),
        });
    }
    for (seal, name) in [
        (SealFlags::WRITE, "F_SEAL_WRITE"),
        (SealFlags::FUTURE_WRITE, "F_SEAL_FUTURE_WRITE"),
    ] {
        if facts.seals.contains(seal) {
            return Err(FdError::WriteSealed { seal: name });
        }
    }
    if facts.size != declared_size {
        return Err(FdError::SizeMismatch {
            actual: facts.size,
            declared: declared_size,
        });
    }
    if facts.access != Access::ReadWrite {
        return Err(FdError::NotReadWrite {
            access: facts.access,
        });
    }
    Ok(facts)
}

fn seal_names(missing: SealFlags) -> &'static str {
    match (
        missing.contains(SealFlags::SHRINK),
        missing.contains(SealFlags::GROW),
    ) {
        (true, true) => "F_SEAL_SHRINK and F_SEAL_GROW",
        (true, false) => "F_SEAL_SHRINK",
        _ => "F_SEAL_GROW",
    }
}

fn kind_from_mode(file_type: FileType) -> FdKind {
    match file_type {
        FileType::RegularFile => FdKind::RegularFile,
        FileType::Socket => FdKind::Socket,
        FileType::Fifo => FdKind::Pipe,
        FileType::CharacterDevice => FdKind::CharDevice,
        FileType::BlockDevice => FdKind::BlockDevice,
        FileType::Directory => FdKind::Directory,
        _ => FdKind::Other,
    }
}

/// `Some(true)` if `/proc/self/fd/N` reads `/memfd:...`, `Some(false)` for another target, `None`
/// when the link cannot be read.
fn proc_link_says_memfd(fd: BorrowedFd<'_>) -> Option<bool> {
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    Some(
        target
            .as_os_str()
            .as_encoded_bytes()
            .starts_with(b"/memfd:"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_seals_the_size() {
        let fd = create("npu-fd-unit", 4096).expect("memfd");
        let facts = inspect(fd.as_fd()).expect("inspect");
        assert_eq!(facts.kind, FdKind::Memfd);
        assert_eq!(facts.size, 4096);
        assert_eq!(facts.access, Access::ReadWrite);
        assert!(facts.size_is_sealed());
        assert!(!facts.seals.contains(SealFlags::WRITE));
    }

    #[test]
    fn unsealed_memfd_has_no_seals() {
        let fd = create_unsealed("npu-fd-unit", 10).expect("memfd");
        let facts = inspect(fd.as_fd()).expect("inspect");
        assert_eq!(facts.kind, FdKind::Memfd);
        assert!(facts.seals.is_empty());
        add_size_seals(fd.as_fd()).expect("seal");
        assert!(inspect(fd.as_fd()).expect("inspect").size_is_sealed());
    }

    #[test]
    fn seal_names_name_what_is_missing() {
        assert_eq!(seal_names(SIZE_SEALS), "F_SEAL_SHRINK and F_SEAL_GROW");
        assert_eq!(seal_names(SealFlags::SHRINK), "F_SEAL_SHRINK");
        assert_eq!(seal_names(SealFlags::GROW), "F_SEAL_GROW");
    }

    #[test]
    fn name_with_nul_is_an_error_not_a_panic() {
        let err = create("bad\0name", 1).expect_err("NUL in name");
        assert!(err.to_string().starts_with("memfd_create failed"), "{err}");
    }
}

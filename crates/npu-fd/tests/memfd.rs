//! `check_import` against real fds of every kind a client might send by mistake.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use npu_fd::wire::Status;
use npu_fd::{Access, FdError, FdKind, memfd};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;

const SIZE: u64 = 4096;

fn sealed() -> OwnedFd {
    memfd::create("npu-fd-test", SIZE).expect("memfd")
}

fn refusal(fd: impl AsFd, declared: u64) -> FdError {
    memfd::check_import(fd.as_fd(), declared).expect_err("check_import should refuse")
}

#[test]
fn sealed_memfd_passes_and_cannot_be_resized() {
    let fd = sealed();
    let facts = memfd::check_import(fd.as_fd(), SIZE).expect("a sealed memfd passes");
    assert_eq!(facts.kind, FdKind::Memfd);
    assert_eq!(facts.size, SIZE);
    assert_eq!(facts.access, Access::ReadWrite);
    assert!(facts.seals.contains(SealFlags::SHRINK | SealFlags::GROW));
    assert!(
        !facts.seals.contains(SealFlags::WRITE),
        "F_SEAL_WRITE is never added"
    );
    assert_eq!(rustix::fs::ftruncate(&fd, 1), Err(Errno::PERM));
    assert_eq!(rustix::fs::ftruncate(&fd, 2 * SIZE), Err(Errno::PERM));
}

#[test]
fn write_sealed_memfd_is_refused_with_its_own_status() {
    let fd = sealed();
    rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE).expect("F_SEAL_WRITE");
    let err = refusal(&fd, SIZE);
    assert_eq!(err.wire_status(), Status::WRITE_SEALED);
    assert!(
        err.to_string().starts_with("memfd carries F_SEAL_WRITE: "),
        "{err}"
    );
    // F_SEAL_SEAL alone is fine.
    let fd = sealed();
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SEAL).expect("F_SEAL_SEAL");
    memfd::check_import(fd.as_fd(), SIZE).expect("F_SEAL_SEAL is neither required nor refused");
}

#[test]
fn unsealed_memfd_is_refused_with_how_to_seal_it() {
    let fd = memfd::create_unsealed("npu-fd-test", SIZE).expect("memfd");
    let err = refusal(&fd, SIZE);
    assert_eq!(
        err.to_string(),
        "memfd lacks the F_SEAL_SHRINK and F_SEAL_GROW seals: add them with fcntl(fd, \
         F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) before sending the fd, so it cannot be \
         truncated under the daemon's mapping"
    );
    assert_eq!(err.wire_status(), Status::MISSING_SEALS);
    memfd::add_size_seals(fd.as_fd()).expect("seal");
    memfd::check_import(fd.as_fd(), SIZE).expect("sealed now");
}

#[test]
fn half_sealed_memfd_names_the_missing_seal() {
    let fd = memfd::create_unsealed("npu-fd-test", SIZE).expect("memfd");
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).expect("shrink seal");
    let err = refusal(&fd, SIZE);
    assert!(
        err.to_string()
            .starts_with("memfd lacks the F_SEAL_GROW seal: add them"),
        "{err}"
    );
}

#[test]
fn memfd_without_allow_sealing_says_to_recreate_it() {
    let fd = rustix::fs::memfd_create("npu-fd-test", MemfdFlags::CLOEXEC).expect("memfd");
    rustix::fs::ftruncate(&fd, SIZE).expect("size");
    let err = refusal(&fd, SIZE);
    let text = err.to_string();
    assert!(
        text.starts_with(
            "memfd lacks the F_SEAL_SHRINK and F_SEAL_GROW seals: this memfd has F_SEAL_SEAL"
        ),
        "{text}"
    );
    assert!(text.contains("MFD_ALLOW_SEALING"), "{text}");
    assert!(memfd::add_size_seals(fd.as_fd()).is_err());
}

#[test]
fn wrong_size_is_refused_with_both_numbers() {
    let fd = sealed();
    let err = refusal(&fd, 8192);
    assert_eq!(
        err.to_string(),
        "memfd is 4096 bytes but the tensor was declared as 8192 bytes: ftruncate it to 8192 \
         before sealing, or declare 4096"
    );
    assert_eq!(err.wire_status(), Status::SIZE_MISMATCH);
}

#[test]
fn regular_file_is_not_a_memfd() {
    let file = tempfile::tempfile().expect("temp file");
    file.set_len(SIZE).expect("size");
    let err = refusal(&file, SIZE);
    assert_eq!(
        err.to_string(),
        "fd is a regular file, not a memfd: create it with memfd_create(name, MFD_CLOEXEC | \
         MFD_ALLOW_SEALING), size it with ftruncate, and seal it with fcntl(fd, F_ADD_SEALS, \
         F_SEAL_SHRINK | F_SEAL_GROW)"
    );
    assert_eq!(err.wire_status(), Status::NOT_A_MEMFD);
}

#[test]
fn pipe_is_not_a_memfd() {
    let (reader, _writer) = std::io::pipe().expect("pipe");
    let err = refusal(&reader, SIZE);
    assert!(
        err.to_string().starts_with("fd is a pipe, not a memfd: "),
        "{err}"
    );
}

#[test]
fn socket_is_not_a_memfd() {
    let (a, _b) = UnixStream::pair().expect("socketpair");
    let err = refusal(&a, SIZE);
    assert!(
        err.to_string().starts_with("fd is a socket, not a memfd: "),
        "{err}"
    );
}

#[test]
fn shm_file_is_not_a_memfd() {
    let Ok(file) = tempfile::tempfile_in("/dev/shm") else {
        eprintln!("no writable /dev/shm; skipped");
        return;
    };
    file.set_len(SIZE).expect("size");
    let facts = memfd::inspect(file.as_fd()).expect("inspect");
    if facts.kind != FdKind::Shmem {
        eprintln!("/dev/shm is not tmpfs here ({:?}); skipped", facts.kind);
        return;
    }
    let err = refusal(&file, SIZE);
    assert!(
        err.to_string()
            .starts_with("fd is a tmpfs/shared-memory file not made by memfd_create, not a memfd"),
        "{err}"
    );
}

#[test]
fn read_only_reopen_is_refused() {
    let fd = sealed();
    let read_only = File::open(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("reopen");
    let facts = memfd::inspect(read_only.as_fd()).expect("inspect");
    assert_eq!(facts.kind, FdKind::Memfd, "same inode, same seals");
    assert_eq!(facts.access, Access::ReadOnly);
    let err = refusal(&read_only, SIZE);
    assert_eq!(
        err.to_string(),
        "fd is open read-only (O_RDONLY), but the daemon maps tensors read-write: send the memfd \
         itself (memfd_create opens it O_RDWR), not a reopened copy"
    );
    assert_eq!(err.wire_status(), Status::NOT_READ_WRITE);
}

#[test]
fn every_refusal_reads_differently() {
    let unsealed = memfd::create_unsealed("npu-fd-test", SIZE).expect("memfd");
    let file = tempfile::tempfile().expect("temp file");
    file.set_len(SIZE).expect("size");
    let (pipe, _writer) = std::io::pipe().expect("pipe");
    let fd = sealed();
    let read_only = File::open(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("reopen");
    let messages = [
        refusal(&unsealed, SIZE).to_string(),
        refusal(&fd, SIZE + 1).to_string(),
        refusal(&file, SIZE).to_string(),
        refusal(&pipe, SIZE).to_string(),
        refusal(&read_only, SIZE).to_string(),
    ];
    for (i, a) in messages.iter().enumerate() {
        for b in &messages[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

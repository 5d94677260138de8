//! The process's file descriptors: whether it is out of them, and how a client refused for it
//! is told. The accept loops and the allocation paths (a memfd the runtime cannot create) both
//! ask.
//!
//! Cost: [`fd_exhaustion`] lists `/proc/self/fd`, on failure paths only.

use std::io;

/// Whether an accept error means the process or the system is out of descriptors.
pub fn out_of_fds(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(c) if c == rustix::io::Errno::MFILE.raw_os_error()
            || c == rustix::io::Errno::NFILE.raw_os_error()
    )
}

/// The process's soft `RLIMIT_NOFILE`, for messages.
pub fn nofile_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Whether the process is out of file descriptors (or within a few of its limit), as a message
/// for a client whose request failed for it; `None` when it is not. Called on failure paths
/// only (an allocation the runtime refused), where memory exhaustion and descriptor exhaustion
/// look alike: a memfd that cannot be created is `OUT_OF_RESOURCES` to the runtime.
pub fn fd_exhaustion() -> Option<String> {
    let limit = nofile_limit()?;
    let open = match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => d.count() as u64,
        // Reading the directory needs a descriptor itself.
        Err(e) if out_of_fds(&e) => limit,
        Err(_) => return None,
    };
    (open + 4 >= limit).then(|| {
        format!(
            "the daemon is out of file descriptors ({open} of RLIMIT_NOFILE {limit} in use; \
             LimitNOFILE= in npud.service): try again later"
        )
    })
}

/// What a client refused for fd exhaustion reads.
pub fn fd_exhaustion_message(e: &io::Error) -> String {
    let limit = nofile_limit().map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    format!(
        "the daemon is out of file descriptors ({e}; RLIMIT_NOFILE {limit}, LimitNOFILE= in \
         npud.service): try again later"
    )
}

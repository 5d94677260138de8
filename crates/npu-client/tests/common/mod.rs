//! Starts the real `npud` binary on the emulator for the client's tests.
//!
//! The binary is looked up beside the test executable (`target/<profile>/npud`, which
//! `cargo test --workspace` and `cargo build -p npud` put there); when it is missing, the harness
//! runs `cargo build -p npud` once for the same profile.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use npu_client::local::{LocalDaemon, LocalOptions};

static BUILD: Mutex<()> = Mutex::new(());

/// The `target/<profile>` directory the tests run from.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let deps = exe.parent().expect("the test executable is in a directory");
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps has a parent").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// The `npud` binary of this build, built first if it is missing.
pub fn npud_binary() -> PathBuf {
    let dir = profile_dir();
    let bin = dir.join("npud");
    let _guard = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if bin.is_file() {
        return bin;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "npud", "--bin", "npud"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status();
    assert!(
        bin.is_file(),
        "no npud binary at {} and `cargo build -p npud` did not make one ({status:?}); run \
         `cargo build -p npud` (or `cargo test --workspace`) first",
        bin.display()
    );
    bin
}

/// A running `npud --backend emulator` on private sockets and a loopback TCP port (the library's
/// own [`LocalDaemon`]); SIGKILLed on drop.
#[derive(Debug)]
pub struct Daemon(pub LocalDaemon);

impl Daemon {
    /// Starts a daemon with a 10 s session grace period.
    pub fn start() -> Daemon {
        Self::start_with_grace(10_000)
    }

    /// Starts a daemon and waits until it serves.
    pub fn start_with_grace(grace_ms: u64) -> Daemon {
        Self::start_with_args(grace_ms, &[])
    }

    /// Starts a daemon with more command-line arguments.
    pub fn start_with_args(grace_ms: u64, args: &[&str]) -> Daemon {
        let mut opts = LocalOptions::new(npud_binary());
        opts.session_grace_ms = Some(grace_ms);
        opts.args = ["--log-level", "npud=debug,info"]
            .iter()
            .chain(args)
            .map(Into::into)
            .collect();
        Daemon(LocalDaemon::start(opts).unwrap_or_else(|e| panic!("{e}")))
    }

    /// The Unix socket address.
    pub fn unix(&self) -> String {
        self.0.socket().display().to_string()
    }

    /// The TCP address.
    pub fn http(&self) -> String {
        self.0.http_url().expect("started with a TCP port")
    }

    /// The TCP socket address.
    pub fn tcp(&self) -> SocketAddr {
        self.0.tcp().expect("started with a TCP port")
    }

    /// The daemon's private directory.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }

    /// What the daemon wrote to stderr.
    pub fn stderr(&self) -> String {
        self.0.log()
    }

    /// SIGKILL, and wait for the exit.
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// SIGKILL, then start again on the same sockets and port.
    pub fn restart(&mut self) {
        self.0.restart().unwrap_or_else(|e| panic!("{e}"));
    }

    /// SIGTERM and wait (SIGKILL after 20 s); returns whether it exited 0 and cleaned up.
    pub fn terminate(&mut self) -> bool {
        self.0
            .stop(Duration::from_secs(20))
            .is_ok_and(|s| s.clean())
    }
}

/// A design directory path inside the daemon's tempdir.
pub fn subdir(d: &Daemon, name: &str) -> PathBuf {
    let p = d.dir().join(name);
    std::fs::create_dir_all(&p).expect("a design directory");
    p
}

/// Whether `path` exists and is a socket.
pub fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

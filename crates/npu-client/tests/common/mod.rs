//! Starts the real `npud` binary on the emulator for the client's tests.
//!
//! The binary is looked up beside the test executable (`target/<profile>/npud`, which
//! `cargo test --workspace` and `cargo build -p npud` put there); when it is missing, the harness
//! runs `cargo build -p npud` once for the same profile.

#![allow(dead_code)]

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// A running `npud --backend emulator` on private sockets and a loopback TCP port; SIGKILLed on
/// drop.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub fd_socket: PathBuf,
    pub tcp: SocketAddr,
    ready: PathBuf,
    stderr: PathBuf,
    grace_ms: u64,
}

impl Daemon {
    /// Starts a daemon with a 10 s session grace period.
    pub fn start() -> Daemon {
        Self::start_with_grace(10_000)
    }

    /// Starts a daemon and waits for its ready file.
    pub fn start_with_grace(grace_ms: u64) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("nc")
            .tempdir_in("/tmp")
            .expect("a temporary directory in /tmp");
        let mut d = Daemon {
            child: None,
            socket: dir.path().join("s"),
            fd_socket: dir.path().join("f"),
            tcp: free_port(),
            ready: dir.path().join("ready"),
            stderr: dir.path().join("stderr"),
            dir,
            grace_ms,
        };
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        let _ = std::fs::remove_file(&self.ready);
        let mut cmd = Command::new(npud_binary());
        cmd.args(["--backend", "emulator"])
            .arg("--socket")
            .arg(&self.socket)
            .arg("--fd-socket")
            .arg(&self.fd_socket)
            .arg("--tcp")
            .arg(self.tcp.to_string())
            .arg("--ready-file")
            .arg(&self.ready)
            .arg("--session-grace-ms")
            .arg(self.grace_ms.to_string())
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                File::options()
                    .create(true)
                    .append(true)
                    .open(&self.stderr)
                    .expect("a stderr file"),
            );
        for (k, _) in std::env::vars() {
            if k.starts_with("NPUD_") || k.starts_with("HSA_SIM_") {
                cmd.env_remove(k);
            }
        }
        self.child = Some(cmd.spawn().expect("npud starts"));
        let until = Instant::now() + Duration::from_secs(30);
        while !self.ready.exists() {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("npud exited with {status}:\n{}", self.stderr());
            }
            assert!(
                Instant::now() < until,
                "npud not ready in 30 s:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The Unix socket address.
    pub fn unix(&self) -> String {
        self.socket.display().to_string()
    }

    /// The TCP address.
    pub fn http(&self) -> String {
        format!("http://{}", self.tcp)
    }

    /// What the daemon wrote to stderr.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGKILL, and wait for the exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL, then start again on the same sockets and port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGTERM and wait (SIGKILL after 20 s); returns whether it exited 0.
    pub fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        let pid = rustix::process::Pid::from_child(&c);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                return s.success();
            }
            if Instant::now() > until {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    l.local_addr().expect("a bound address")
}

/// A design directory path inside the daemon's tempdir.
pub fn subdir(d: &Daemon, name: &str) -> PathBuf {
    let p = d.dir.path().join(name);
    std::fs::create_dir_all(&p).expect("a design directory");
    p
}

/// Whether `path` exists and is a socket.
pub fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

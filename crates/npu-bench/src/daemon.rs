//! The daemon under test: npud on the emulator, started here on private sockets, or one given
//! by address.
//!
//! The `npud` binary is found beside this executable (cargo builds both into
//! `target/<profile>/`), else at `$NPUD_BIN`, else on `PATH`; when it is nowhere and this
//! executable still sits in the cargo workspace it was built from, it is built with
//! `cargo build -p npud` for the same profile.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{BenchError, Result};

/// Sessions and tensors the daemon must allow: row 8 holds 64 sessions of 16 tensors while the
/// other rows' sessions are open too.
const MAX_SESSIONS: u32 = 512;

/// A running npud, stopped with SIGTERM on drop.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub binary: PathBuf,
    pub socket: PathBuf,
    pub tcp: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts `npud --backend emulator` on sockets in a private directory under /tmp, with TCP
    /// on a free loopback port, and waits for its ready file.
    ///
    /// # Errors
    /// When npud cannot be found or built, or does not become ready within 30 s (with its log).
    pub fn start() -> Result<Daemon> {
        let binary = find_npud()?;
        let dir = tempfile::Builder::new().prefix("npub").tempdir_in("/tmp")?;
        let socket = dir.path().join("s");
        let ready = dir.path().join("ready");
        let log = dir.path().join("npud.log");
        let tcp = TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
        let mut cmd = Command::new(&binary);
        cmd.args(["--backend", "emulator", "--log-level", "warn"])
            .arg("--socket")
            .arg(&socket)
            .arg("--fd-socket")
            .arg(dir.path().join("f"))
            .arg("--ready-file")
            .arg(&ready)
            .arg("--tcp")
            .arg(&tcp)
            .env_remove("RUST_LOG");
        // npud reads every NPUD_* variable as configuration (NPUD_BIN included, which it
        // refuses): the daemon measured gets only the settings below.
        for (k, _) in std::env::vars_os() {
            if k.to_str().is_some_and(|k| k.starts_with("NPUD_")) {
                cmd.env_remove(k);
            }
        }
        cmd.env("NPUD_LIMITS__MAX_SESSIONS", MAX_SESSIONS.to_string())
            .env("NPUD_LIMITS__MAX_PENDING_PER_SESSION", "1024")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?);
        let child = cmd
            .spawn()
            .map_err(|e| BenchError(format!("starting {}: {e}", binary.display())))?;
        let mut d = Daemon {
            child: Some(child),
            binary,
            socket,
            tcp,
            log,
            _dir: dir,
        };
        let until = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            if let Some(c) = d.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(BenchError(format!(
                    "npud exited with {status} before it was ready:\n{}",
                    d.log()
                )));
            }
            if Instant::now() > until {
                return Err(BenchError(format!(
                    "npud was not ready within 30 s:\n{}",
                    d.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    /// The daemon's process id.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What npud logged so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits (SIGKILL after 20 s). Returns how it ended.
    pub fn stop(&mut self) -> Option<String> {
        let mut child = self.child.take()?;
        let pid = rustix::process::Pid::from_child(&child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                return Some(s.to_string());
            }
            if Instant::now() > until {
                let _ = child.kill();
                return child
                    .wait()
                    .ok()
                    .map(|s| format!("killed after 20 s ({s})"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// VmRSS of a process, KiB.
///
/// # Errors
/// When /proc/<pid>/status cannot be read or has no VmRSS line.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| BenchError(format!("/proc/{pid}/status has no VmRSS")))
}

/// This executable's directory.
fn own_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

/// Finds npud (see the module docs), building it when needed.
///
/// # Errors
/// When it is nowhere and cannot be built, with the command that builds it.
pub fn find_npud() -> Result<PathBuf> {
    if let Some(p) = own_dir().map(|d| d.join("npud")).filter(|p| p.is_file()) {
        return Ok(p);
    }
    if let Some(p) = std::env::var_os("NPUD_BIN").map(PathBuf::from) {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(BenchError(format!(
                "NPUD_BIN={}: no such file",
                p.display()
            )))
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let p = d.join("npud");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    build_npud()
}

/// Builds npud with cargo for this executable's profile, when this executable is in the
/// workspace's target directory.
fn build_npud() -> Result<PathBuf> {
    let how = "no npud beside npuctl-bench, in $NPUD_BIN or on PATH; build it with \
               `cargo build --release -p npud`";
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = own_dir().ok_or_else(|| BenchError(how.into()))?;
    let in_workspace = dir
        .ancestors()
        .any(|a| a.file_name().is_some_and(|n| n == "target"));
    if !root.join("Cargo.toml").is_file() || !in_workspace {
        return Err(BenchError(how.into()));
    }
    let release = dir.file_name().is_some_and(|n| n == "release");
    eprintln!(
        "npuctl-bench: building npud first (cargo build{} -p npud)",
        if release { " --release" } else { "" }
    );
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "-p", "npud", "--bin", "npud"])
        .current_dir(&root);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .map_err(|e| BenchError(format!("running cargo: {e}; {how}")))?;
    let built = dir.join("npud");
    if status.success() && built.is_file() {
        Ok(built)
    } else {
        Err(BenchError(format!(
            "cargo build -p npud failed ({status}); {how}"
        )))
    }
}

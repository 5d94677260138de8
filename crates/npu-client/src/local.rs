//! A private npud: start the daemon binary on the emulator on sockets of its own, wait until it
//! serves, and stop it. What `npuctl demo`, the benchmarks and tests use, and what a program's
//! own tests can use to run against a real daemon without an NPU.
//!
//! The daemon runs with `--backend emulator` on `DIR/npud.sock` and `DIR/npud.fd.sock`, where
//! `DIR` is a new directory under `/tmp` (Unix socket paths are limited to 108 bytes), keeps its
//! state (quarantine records) in `DIR/state` unless the options' `args` name a `--state-dir`,
//! logs to `DIR/npud.log`, and is ready when it writes `DIR/ready`. `NPUD_*` and `HSA_SIM_*` variables
//! of the calling process are not passed on (the options' `env` is), so the caller's own
//! configuration cannot change what it measures or tests. Dropping a [`LocalDaemon`] kills it.

use std::ffi::OsString;
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::ClientError;

/// How to start a [`LocalDaemon`].
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// The `npud` executable.
    pub binary: PathBuf,
    /// Also serve gRPC on a free loopback TCP port.
    pub tcp: bool,
    /// `--session-grace-ms`; the daemon's default when `None`.
    pub session_grace_ms: Option<u64>,
    /// More command-line arguments.
    pub args: Vec<OsString>,
    /// Environment variables to set (e.g. `NPUD_LIMITS__MAX_SESSIONS`).
    pub env: Vec<(OsString, OsString)>,
    /// How long to wait for the daemon to serve.
    pub ready_timeout: Duration,
}

impl LocalOptions {
    /// Options for `binary` with a TCP port, the daemon's grace period and a 30 s start limit.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            tcp: true,
            session_grace_ms: None,
            args: Vec::new(),
            env: Vec::new(),
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// How a [`LocalDaemon::stop`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub status: ExitStatus,
    pub elapsed: Duration,
    /// Whether the daemon removed its socket files, as it does on a clean stop.
    pub sockets_removed: bool,
    /// Whether it had to be killed after not exiting within the timeout.
    pub killed: bool,
}

impl Stopped {
    /// Exited 0 by itself and cleaned up after itself.
    pub fn clean(&self) -> bool {
        self.status.success() && self.sockets_removed && !self.killed
    }
}

/// A running npud on private sockets.
#[derive(Debug)]
pub struct LocalDaemon {
    child: Option<Child>,
    opts: LocalOptions,
    dir: tempfile::TempDir,
    socket: PathBuf,
    fd_socket: PathBuf,
    tcp: Option<SocketAddr>,
    started: Duration,
}

fn local_err(message: String) -> ClientError {
    ClientError::LocalDaemon { message }
}

impl LocalDaemon {
    /// Starts the daemon and waits until it serves.
    ///
    /// # Errors
    /// [`ClientError::LocalDaemon`] when the directory, the port or the process cannot be had,
    /// or the daemon exits or does not serve in time (with its log).
    pub fn start(opts: LocalOptions) -> Result<LocalDaemon, ClientError> {
        let dir = tempfile::Builder::new()
            .prefix("npud")
            .tempdir_in("/tmp")
            .map_err(|e| local_err(format!("a private directory in /tmp: {e}")))?;
        let tcp = if opts.tcp {
            let addr = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| local_err(format!("a free loopback port: {e}")))?;
            Some(addr)
        } else {
            None
        };
        let mut d = LocalDaemon {
            child: None,
            socket: dir.path().join("npud.sock"),
            fd_socket: dir.path().join("npud.fd.sock"),
            dir,
            tcp,
            opts,
            started: Duration::ZERO,
        };
        d.spawn()?;
        Ok(d)
    }

    fn spawn(&mut self) -> Result<(), ClientError> {
        let ready = self.dir.path().join("ready");
        let _ = std::fs::remove_file(&ready);
        let log_path = self.log_path();
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| local_err(format!("{}: {e}", log_path.display())))?;
        let mut cmd = Command::new(&self.opts.binary);
        cmd.args(["--backend", "emulator"])
            .arg("--socket")
            .arg(&self.socket)
            .arg("--fd-socket")
            .arg(&self.fd_socket)
            .arg("--ready-file")
            .arg(&ready)
            .args(&self.opts.args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(a) = self.tcp {
            cmd.arg("--tcp").arg(a.to_string());
        }
        // Never the user's own state directory: a test's faulting design must not stay
        // quarantined for the next run, nor for the user's real daemon.
        if !self.opts.args.iter().any(|a| a == "--state-dir") {
            cmd.arg("--state-dir").arg(self.dir.path().join("state"));
        }
        if let Some(ms) = self.opts.session_grace_ms {
            cmd.arg("--session-grace-ms").arg(ms.to_string());
        }
        for (k, _) in std::env::vars_os() {
            let name = k.to_string_lossy();
            if name.starts_with("NPUD_") || name.starts_with("HSA_SIM_") {
                cmd.env_remove(&k);
            }
        }
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        let t0 = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| local_err(format!("starting {}: {e}", self.opts.binary.display())))?;
        self.child = Some(child);
        let until = t0 + self.opts.ready_timeout;
        while !ready.exists() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(local_err(format!(
                    "npud exited with {status} before it was ready:\n{}",
                    self.log()
                )));
            }
            if Instant::now() > until {
                self.kill();
                return Err(local_err(format!(
                    "npud was not ready within {:?}:\n{}",
                    self.opts.ready_timeout,
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.started = t0.elapsed();
        Ok(())
    }

    /// The gRPC Unix socket (also a valid client address).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The fd socket.
    pub fn fd_socket(&self) -> &Path {
        &self.fd_socket
    }

    /// The loopback TCP address, when started with `tcp`.
    pub fn tcp(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// `http://127.0.0.1:PORT`, when started with `tcp`.
    pub fn http_url(&self) -> Option<String> {
        self.tcp.map(|a| format!("http://{a}"))
    }

    /// The private directory (sockets, log; free for the caller's files too).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("npud.log")
    }

    /// What the daemon has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// How long the last start took, from spawn to serving.
    pub fn startup_time(&self) -> Duration {
        self.started
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM, then wait up to `timeout` (SIGKILL after it).
    ///
    /// # Errors
    /// [`ClientError::LocalDaemon`] when the daemon is not running or cannot be waited for.
    pub fn stop(&mut self, timeout: Duration) -> Result<Stopped, ClientError> {
        let mut c = self
            .child
            .take()
            .ok_or_else(|| local_err("npud is not running".into()))?;
        let pid = rustix::process::Pid::from_child(&c);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let t0 = Instant::now();
        let mut killed = false;
        let status = loop {
            match c.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if t0.elapsed() < timeout => std::thread::sleep(Duration::from_millis(10)),
                Ok(None) => {
                    killed = true;
                    let _ = c.kill();
                    break c
                        .wait()
                        .map_err(|e| local_err(format!("waiting for npud: {e}")))?;
                }
                Err(e) => return Err(local_err(format!("waiting for npud: {e}"))),
            }
        };
        Ok(Stopped {
            status,
            elapsed: t0.elapsed(),
            sockets_removed: !self.socket.exists() && !self.fd_socket.exists(),
            killed,
        })
    }

    /// SIGKILL, and wait for the exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Keeps the private directory (the log and anything the caller put there) when this value
    /// is dropped, and returns its path.
    pub fn keep_dir(&mut self) -> PathBuf {
        self.dir.disable_cleanup(true);
        self.dir.path().to_path_buf()
    }

    /// SIGKILL, then start again on the same sockets and port.
    ///
    /// # Errors
    /// As [`LocalDaemon::start`].
    pub fn restart(&mut self) -> Result<(), ClientError> {
        self.kill();
        self.spawn()
    }
}

impl Drop for LocalDaemon {
    fn drop(&mut self) {
        self.kill();
    }
}

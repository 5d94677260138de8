//! Harness for npud's end-to-end tests: start the real `npud` binary on the emulator in a
//! temporary directory, connect to it, and drive it through a small session client.
//!
//! The `npud` binary is looked up beside the test executable (`target/<profile>/npud`);
//! `cargo test --workspace` and `cargo nextest run -p npud -p npud-e2e` build it.

#![forbid(unsafe_code)]

pub mod bystander;
pub mod certs;
pub mod configmap;
pub mod container;
pub mod netns;
pub mod peers;
pub mod python;
pub mod ring;
pub mod tokens;

use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use npu_artifacts::NpuGen;
use npu_artifacts::emu::EmuDesign;
use npu_fd::Mapping;
use npu_fd::wire::{Ticket, client};
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

/// The path of a binary built beside the test executable.
///
/// # Panics
/// When it is not there (build it with `cargo build -p npud`).
pub fn binary(name: &str) -> PathBuf {
    built(&[name]).unwrap_or_else(|exe| {
        panic!(
            "no {name} binary near {exe}: run `cargo build -p npud` (or `cargo nextest run -p npud \
             -p npud-e2e`)"
        )
    })
}

/// The first of `names` (paths relative to a directory) found in a directory above the test
/// executable, up to `target/`; the executable's path when none is.
fn built(names: &[&str]) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().expect("the test executable has a path");
    for dir in exe.ancestors().skip(1) {
        if let Some(found) = names.iter().map(|n| dir.join(n)).find(|c| c.is_file()) {
            return Ok(found);
        }
        if dir.file_name().is_some_and(|n| n == "target") {
            break;
        }
    }
    Err(exe.display().to_string())
}

/// `target/<profile>` of the running test executable, and whether it is a release build.
pub fn profile_dir() -> (PathBuf, bool) {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let deps = exe.parent().expect("the test executable is in a directory");
    let dir = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps has a parent")
    } else {
        deps
    };
    let release = dir.file_name().is_some_and(|n| n == "release");
    (dir.to_path_buf(), release)
}

/// The emulator's runtime profiles, as users install the runtimes they model (hsa-sim's
/// `Profile`), with the packet ABI each speaks.
pub const PROFILES: [(&str, &str); 6] = [
    ("rocm-7.0", "g1a"),
    ("rocr-late-2025", "g1b"),
    ("rocr-g2-2026-05", "g2"),
    ("rocr-g2-2026-07", "g2"),
    ("rocr-newest", "g2"),
    ("kernel-object", "kernel-object"),
];

/// The profile whose packet form `packet_abi = "auto"` cannot prove.
pub const AUTO_CANNOT_TELL: &str = "rocr-late-2025";

/// How the daemon reaches the emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// `--backend emulator`: hsa-sim linked into the daemon.
    Linked,
    /// `--backend hsa --library <hsa-sim's cdylib>`: the run-time-loaded path that users with an
    /// NPU run, with `HSA_SIM_PROFILE` choosing the profile and `--packet-abi` its ABI.
    Loaded,
}

/// hsa-sim's shared library as the build left it beside the test executable (the copy in
/// `deps/` is rebuilt with every dependency build, so it is preferred).
///
/// # Panics
/// When it is not there (build it with `cargo build -p hsa-sim`).
pub fn hsa_sim_library() -> PathBuf {
    built(&["deps/libhsa_sim.so", "libhsa_sim.so"])
        .unwrap_or_else(|exe| panic!("no libhsa_sim.so near {exe}: run `cargo build -p hsa-sim`"))
}

/// The `npuctl` binary of this build (`target/<profile>/npuctl`), built with `cargo build -p
/// npu-client --bin npuctl` first when it is missing (`cargo nextest run -p npu-client ...`
/// builds it anyway).
///
/// # Panics
/// When it is missing and cannot be built.
pub fn npuctl_binary() -> PathBuf {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let (profile, _) = profile_dir();
    let bin = profile.join("npuctl");
    let _guard = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !bin.is_file() {
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.args(["build", "-p", "npu-client", "--bin", "npuctl"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status();
        assert!(
            bin.is_file(),
            "no npuctl at {} and `cargo build -p npu-client --bin npuctl` did not make one \
             ({status:?})",
            bin.display()
        );
    }
    bin
}

/// The binary `bin` of the workspace package `package` (in `crates/<package>`) in this build's
/// profile directory, built with `cargo build -p PACKAGE --bin BIN` first when it is missing or
/// older than its crate's `src/`, `build.rs` or `Cargo.toml` (so that running one test file
/// after an edit does not test an old binary; `cargo test --workspace` builds it anyway).
///
/// # Panics
/// When it is missing and cannot be built.
pub fn package_binary(package: &str, bin: &str) -> PathBuf {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let (profile, _) = profile_dir();
    let path = profile.join(bin);
    let _guard = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let built_at = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    // What cargo rebuilds the binary for (a README is not), so that a binary cargo would call
    // fresh is never rebuilt from here.
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates")
        .join(package);
    let newest = [
        krate.join("src"),
        krate.join("build.rs"),
        krate.join("Cargo.toml"),
    ]
    .iter()
    .filter_map(|p| {
        if p.is_dir() {
            newest_file(p)
        } else {
            std::fs::metadata(p).and_then(|m| m.modified()).ok()
        }
    })
    .max();
    if built_at.is_none_or(|t| newest.is_some_and(|s| s > t)) {
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.args(["build", "-p", package, "--bin", bin])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status();
        assert!(
            path.is_file(),
            "no {bin} at {} and `cargo build -p {package} --bin {bin}` did not make one \
             ({status:?})",
            path.display()
        );
    }
    path
}

/// The latest modification time of a file under `dir`.
fn newest_file(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let t = if p.is_dir() {
            newest_file(&p)
        } else {
            e.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// How to start a daemon.
#[derive(Debug, Clone)]
pub struct Options {
    /// The emulator profile (`rocm-7.0`, ...); the daemon's default when `None`. On
    /// `rocm-7.0`, whose agent name does not tell the generation, `--generation npu2` is
    /// passed unless `args` names a generation or a sysfs root; on `rocr-late-2025`, whose
    /// packet form `auto` cannot prove, `--packet-abi g1b` unless `args` names one. Otherwise
    /// the packet ABI is `auto` on both backends.
    pub profile: Option<String>,
    pub runtime: Runtime,
    pub grace_ms: u64,
    pub tcp: bool,
    /// `NPUD_*` variables, e.g. `("NPUD_LIMITS__MAX_CHAIN_LINKS", "8")`.
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// Start it through `npud-socket-activate`, as systemd's socket activation would: the two
    /// Unix sockets are bound by that wrapper and passed as fds 3 and 4 (names `npud`, `fd`).
    pub socket_activated: bool,
    /// `--state-dir`; by default `state` in the daemon's own temporary directory, so that no
    /// test's quarantine reaches another test or the machine's real state directory. Set it to
    /// a directory that outlives the daemon to restart one with the same state.
    pub state_dir: Option<PathBuf>,
    /// A network namespace (`ip netns` name) to start it in, through `ip netns exec` (which
    /// execs the daemon, so its pid is the daemon's); its Unix sockets stay reachable from here.
    pub netns: Option<String>,
    /// The command that runs npud, in place of this build's `npud` binary: a program and its
    /// leading arguments (`prlimit --as=N -- target/release/npud`). It must exec npud, so that
    /// the pid is the daemon's. See [`bystander`].
    pub program: Option<Vec<std::ffi::OsString>>,
    /// An address-space limit (`RLIMIT_AS`, bytes) to start it under, through `prlimit` (which
    /// execs the daemon): an allocation past it fails in the daemon, as under a container's
    /// memory limit, instead of driving the machine into the OOM killer.
    pub address_space: Option<u64>,
    /// `--log-level`; `npud=debug,info` when `None`, so that a failing test's daemon says what
    /// it did.
    pub log_level: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            profile: None,
            runtime: Runtime::Linked,
            grace_ms: 10_000,
            tcp: false,
            env: Vec::new(),
            args: Vec::new(),
            socket_activated: false,
            state_dir: None,
            netns: None,
            program: None,
            address_space: None,
            log_level: None,
        }
    }
}

impl Options {
    #[must_use]
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }

    /// The emulator profile `profile`, reached through `runtime`.
    #[must_use]
    pub fn profile(mut self, profile: &str, runtime: Runtime) -> Self {
        self.profile = Some(profile.to_owned());
        self.runtime = runtime;
        self
    }

    #[must_use]
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_owned());
        self
    }

    /// The command-line arguments that choose the runtime and its profile.
    fn runtime_args(&self) -> (Vec<String>, Vec<(String, String)>) {
        let mut args = Vec::new();
        let mut env = Vec::new();
        match self.runtime {
            Runtime::Linked => {
                args.extend(["--backend".into(), "emulator".into()]);
                if let Some(p) = &self.profile {
                    args.extend(["--emulator-profile".into(), p.clone()]);
                }
            }
            Runtime::Loaded => {
                let p = self.profile.as_deref().unwrap_or("rocr-newest");
                args.extend(["--backend".into(), "hsa".into(), "--library".into()]);
                args.push(hsa_sim_library().display().to_string());
                env.push(("HSA_SIM_PROFILE".into(), p.into()));
            }
        }
        // `packet_abi = "auto"` proves every profile's packet form on both backends, except
        // late 2025's, which nothing a runtime shows tells apart from a G1a build: its users
        // must name it, and so do the tests (`rocm_7_0.rs` checks the refusal).
        if self.profile.as_deref() == Some(AUTO_CANNOT_TELL)
            && !self.args.iter().any(|a| a == "--packet-abi")
        {
            args.extend(["--packet-abi".into(), "g1b".into()]);
        }
        if self.profile.as_deref() == Some("rocm-7.0")
            && !self
                .args
                .iter()
                .any(|a| a == "--generation" || a == "--sysfs-root")
        {
            args.extend(["--generation".into(), "npu2".into()]);
        }
        (args, env)
    }
}

/// A running `npud`, stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub fd_socket: PathBuf,
    pub tcp: Option<SocketAddr>,
    stderr: PathBuf,
    opts: Options,
}

impl Daemon {
    /// Starts a daemon and waits until it writes its ready file.
    ///
    /// # Panics
    /// When it does not become ready within 30 s (with its stderr in the message).
    pub fn start(opts: Options) -> Daemon {
        match Self::try_start(opts) {
            Ok(d) => d,
            Err((status, stderr)) => {
                panic!("npud exited with {status} before it was ready:\n{stderr}")
            }
        }
    }

    /// Starts a daemon that may refuse to start: its exit status and stderr when it exits
    /// before it is ready.
    ///
    /// # Errors
    /// The exit status and what the daemon wrote to stderr.
    ///
    /// # Panics
    /// When it neither becomes ready nor exits within 30 s.
    pub fn try_start(opts: Options) -> Result<Daemon, (ExitStatus, String)> {
        let dir = tempfile::Builder::new()
            .prefix("npud")
            .tempdir_in("/tmp")
            .expect("a temporary directory in /tmp");
        let socket = dir.path().join("s");
        let fd_socket = dir.path().join("f");
        let stderr = dir.path().join("stderr");
        let tcp = opts.tcp.then(free_port);
        let mut d = Daemon {
            child: None,
            dir,
            socket,
            fd_socket,
            tcp,
            stderr,
            opts,
        };
        d.spawn()?;
        Ok(d)
    }

    /// Starts the daemon again with the same sockets, files and options once it has exited
    /// (as systemd's `Restart=` would), and waits until it is ready.
    ///
    /// # Panics
    /// When the previous process is still running, or as [`Daemon::start`].
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            assert!(
                c.try_wait().ok().flatten().is_some(),
                "restart needs the previous daemon to have exited"
            );
        }
        if let Err((status, stderr)) = self.spawn() {
            panic!("npud exited with {status} before it was ready:\n{stderr}");
        }
    }

    /// Waits up to `timeout` for the daemon to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                return Some(s);
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn spawn(&mut self) -> Result<(), (ExitStatus, String)> {
        let opts = &self.opts;
        let ready = self.dir.path().join("ready");
        let _ = std::fs::remove_file(&ready);
        let npud = opts
            .program
            .clone()
            .unwrap_or_else(|| vec![binary("npud").into_os_string()]);
        let mut cmd = if let Some(ns) = &opts.netns {
            assert!(
                !opts.socket_activated,
                "socket activation in a namespace is not supported"
            );
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).args(&npud);
            c
        } else if opts.socket_activated {
            let mut c = Command::new(binary("npud-socket-activate"));
            c.arg("--listen")
                .arg(&self.socket)
                .arg("--listen")
                .arg(&self.fd_socket)
                .args(["--names", "npud:fd", "--"])
                .args(&npud);
            c
        } else if let Some(bytes) = opts.address_space {
            let mut c = Command::new("prlimit");
            c.arg(format!("--as={bytes}")).arg("--").args(&npud);
            c
        } else {
            let (program, args) = npud
                .split_first()
                .expect("Options::program names a program");
            let mut c = Command::new(program);
            c.args(args);
            c
        };
        let (runtime_args, runtime_env) = opts.runtime_args();
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr)
            .expect("a stderr file");
        cmd.args(&runtime_args)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--fd-socket")
            .arg(&self.fd_socket)
            .arg("--ready-file")
            .arg(&ready)
            .arg("--state-dir")
            .arg(
                opts.state_dir
                    .clone()
                    .unwrap_or_else(|| self.dir.path().join("state")),
            )
            .arg("--session-grace-ms")
            .arg(opts.grace_ms.to_string())
            .arg("--log-level")
            .arg(opts.log_level.as_deref().unwrap_or("npud=debug,info"))
            .args(&opts.args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        for (k, _) in std::env::vars() {
            if k.starts_with("NPUD_")
                || k.starts_with("HSA_SIM_")
                || k.starts_with("LISTEN_")
                || k.starts_with("WATCHDOG_")
                || k == "NOTIFY_SOCKET"
            {
                cmd.env_remove(k);
            }
        }
        if let Some(a) = self.tcp {
            cmd.arg("--tcp").arg(a.to_string());
        }
        for (k, v) in runtime_env.iter().chain(&opts.env) {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("npud starts"));
        let until = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err((status, self.stderr()));
            }
            assert!(
                Instant::now() < until,
                "npud not ready in 30 s:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The daemon's process id, while it runs.
    /// A `key=value` line of the daemon's ready file (`unix`, `metrics`, ...).
    pub fn ready_value(&self, key: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.dir.path().join("ready")).ok()?;
        text.lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_owned())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the daemon is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The CPU time the daemon has used (user + system), in clock ticks (`/proc/PID/stat`).
    ///
    /// # Panics
    /// When the daemon is not running or its stat file cannot be read.
    pub fn cpu_ticks(&self) -> u64 {
        let pid = self.pid().expect("the daemon runs");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
        // Fields after the command name (which may hold spaces) start after the last ')'.
        let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
    }

    /// Lowers the running daemon's `RLIMIT_NOFILE` (soft and hard) to `n`, as a tight
    /// `LimitNOFILE=` would.
    ///
    /// # Panics
    /// When the daemon is not running or `prlimit` fails.
    pub fn set_nofile(&self, n: u64) {
        let child = self.child.as_ref().expect("the daemon runs");
        rustix::process::prlimit(
            Some(rustix::process::Pid::from_child(child)),
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(n),
                maximum: Some(n),
            },
        )
        .expect("prlimit on the daemon");
    }

    /// Lowers the running daemon's `RLIMIT_AS` (soft and hard) to `bytes`, so that a runaway
    /// allocation fails in the daemon (which aborts) rather than driving the machine into the
    /// OOM killer.
    ///
    /// # Panics
    /// When the daemon is not running or `prlimit` fails.
    pub fn set_address_space(&self, bytes: u64) {
        let child = self.child.as_ref().expect("the daemon runs");
        rustix::process::prlimit(
            Some(rustix::process::Pid::from_child(child)),
            rustix::process::Resource::As,
            rustix::process::Rlimit {
                current: Some(bytes),
                maximum: Some(bytes),
            },
        )
        .expect("prlimit on the daemon");
    }

    /// Open file descriptors of the daemon (`/proc/PID/fd`).
    pub fn open_fds(&self) -> usize {
        self.pid()
            .and_then(|p| std::fs::read_dir(format!("/proc/{p}/fd")).ok())
            .map_or(0, Iterator::count)
    }

    /// What the daemon wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// A gRPC client on the Unix socket.
    pub async fn connect(&self) -> NpudClient<Channel> {
        NpudClient::new(self.channel().await)
    }

    /// A channel on the Unix socket.
    pub async fn channel(&self) -> Channel {
        connect_unix(&self.socket).await
    }

    /// Sends the daemon a signal without waiting.
    pub fn send_signal(&self, sig: rustix::process::Signal) {
        if let Some(c) = &self.child {
            signal(c, sig);
        }
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after 20 s).
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        signal(&child, rustix::process::Signal::TERM);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                return Some(s);
            }
            if Instant::now() > until {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// Sends `sig` to a child process.
pub fn signal(child: &Child, sig: rustix::process::Signal) {
    let _ = rustix::process::kill_process(rustix::process::Pid::from_child(child), sig);
}

fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    l.local_addr().expect("a bound address")
}

/// A gRPC channel on a Unix socket.
///
/// # Panics
/// When the socket does not accept.
pub async fn connect_unix(path: &Path) -> Channel {
    Endpoint::try_from(format!("unix:{}", path.display()))
        .expect("a unix endpoint")
        .connect()
        .await
        .expect("connect to npud's socket")
}

/// A session: the client and the metadata every call carries.
#[derive(Debug, Clone)]
pub struct Session {
    pub client: NpudClient<Channel>,
    pub id: u64,
    pub token: String,
    pub fd_socket: Option<PathBuf>,
    /// An `x-npud-token` secret every call carries (the session's identity is the token's).
    pub identity_token: Option<String>,
    /// The session's dispatch ring, which `dispatch` uses when set (see [`ring::rings_on`]).
    pub ring: Option<std::sync::Arc<ring::TestRing>>,
}

/// Copies of `i32`s in and out of a shared mapping: tests read and write tensor memory the
/// daemon also maps by copying, since a view of shared memory is `unsafe`.
pub trait I32Copies {
    /// Every element, copied out.
    ///
    /// # Errors
    /// The mapping's length is not a multiple of 4.
    fn i32s(&self) -> Result<Vec<i32>, npu_fd::FdError>;
    /// Sets every element to `v`.
    ///
    /// # Errors
    /// As [`I32Copies::i32s`], or a read-only mapping.
    fn fill_i32(&mut self, v: i32) -> Result<(), npu_fd::FdError>;
    /// Copies `v` in at the start.
    ///
    /// # Errors
    /// `v` is longer than the mapping, or a read-only mapping.
    fn set_i32s(&mut self, v: &[i32]) -> Result<(), npu_fd::FdError>;
}

impl I32Copies for Mapping {
    fn i32s(&self) -> Result<Vec<i32>, npu_fd::FdError> {
        if !self.len().is_multiple_of(4) {
            return Err(npu_fd::FdError::RangeOutsideMapping {
                offset: 0,
                len: self.len().next_multiple_of(4),
                mapped: self.len(),
            });
        }
        self.read_vec(0, self.len() / 4)
    }

    fn fill_i32(&mut self, v: i32) -> Result<(), npu_fd::FdError> {
        self.write_from(0, &vec![v; self.len() / 4])
    }

    fn set_i32s(&mut self, v: &[i32]) -> Result<(), npu_fd::FdError> {
        self.write_from(0, v)
    }
}

/// A tensor the client maps, and its id.
#[derive(Debug)]
pub struct Mapped {
    pub id: u64,
    pub map: Mapping,
    /// Kept so an imported memfd lives as long as the test wants.
    pub fd: OwnedFd,
}

impl Session {
    /// Opens a session.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn open(client: NpudClient<Channel>, name: &str) -> Result<Session, Status> {
        Self::open_as(client, name, None).await
    }

    /// Opens a session as the token identity whose secret is `secret` (when given): every
    /// call of the session carries it.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn open_as(
        client: NpudClient<Channel>,
        name: &str,
        secret: Option<&str>,
    ) -> Result<Session, Status> {
        let req = pb::OpenSessionRequest {
            client_name: name.to_owned(),
            ..Default::default()
        };
        Self::open_with(client, req, secret).await
    }

    /// Opens a session as `req` asks (its class and deadline), as the token identity whose
    /// secret is `secret` (when given).
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn open_with(
        mut client: NpudClient<Channel>,
        req: pb::OpenSessionRequest,
        secret: Option<&str>,
    ) -> Result<Session, Status> {
        let r = client
            .open_session(with_identity_token(req, secret))
            .await?
            .into_inner();
        let mut s = Session {
            client,
            id: r.session_id,
            token: r.token,
            fd_socket: None,
            identity_token: secret.map(str::to_owned),
            ring: None,
        };
        if ring::rings_on() {
            s.attach_ring().await?;
        }
        Ok(s)
    }

    /// Attaches a dispatch ring to the session: `dispatch` goes through it from now on.
    ///
    /// # Errors
    /// The daemon's status, or INTERNAL for a failed attach on the fd socket.
    pub async fn attach_ring(&mut self) -> Result<(), Status> {
        let r = self
            .client
            .attach_ring(self.req(pb::AttachRingRequest {}))
            .await?
            .into_inner();
        let ring = tokio::task::spawn_blocking(move || ring::TestRing::attach(&r))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(Status::internal)?;
        self.ring = Some(std::sync::Arc::new(ring));
        Ok(())
    }

    /// A request carrying this session's metadata (and its identity token).
    pub fn req<T>(&self, msg: T) -> Request<T> {
        let mut r = with_session(msg, self.id, &self.token);
        if let Some(secret) = &self.identity_token {
            r.metadata_mut().insert(
                npu_proto::IDENTITY_TOKEN_HEADER,
                secret.parse().expect("a token secret is ASCII"),
            );
        }
        r
    }

    /// The device's generation.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn generation(&mut self) -> Result<NpuGen, Status> {
        let info = self.device_info().await?;
        Ok(if info.generation == "npu1" {
            NpuGen::Npu1
        } else {
            NpuGen::Npu2
        })
    }

    /// `GetDeviceInfo`.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn device_info(&mut self) -> Result<pb::DeviceInfo, Status> {
        Ok(self
            .client
            .get_device_info(pb::GetDeviceInfoRequest {})
            .await?
            .into_inner())
    }

    /// Registers an emulated design for the device's generation.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn register(&mut self, d: &EmuDesign) -> Result<pb::RegisterProgramResponse, Status> {
        let g = self.generation().await?;
        self.register_bytes(d.to_pdi(), d.insts(g), d.kernel.name())
            .await
    }

    /// Registers raw bytes.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn register_bytes(
        &mut self,
        pdi: Vec<u8>,
        insts: Vec<u8>,
        name: &str,
    ) -> Result<pb::RegisterProgramResponse, Status> {
        let req = self.req(pb::RegisterProgramRequest {
            pdi,
            insts,
            name: name.to_owned(),
            ..Default::default()
        });
        Ok(self.client.register_program(req).await?.into_inner())
    }

    /// Registers kernel `kernel` of an AIE hsaco.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn register_hsaco(
        &mut self,
        hsaco: Vec<u8>,
        kernel: &str,
        name: &str,
    ) -> Result<pb::RegisterProgramResponse, Status> {
        let req = self.req(pb::RegisterProgramRequest {
            hsaco,
            kernel: kernel.to_owned(),
            name: name.to_owned(),
            ..Default::default()
        });
        Ok(self.client.register_program(req).await?.into_inner())
    }

    /// Allocates a tensor and maps it through the fd socket.
    ///
    /// # Errors
    /// The daemon's status or the fd socket's refusal, as text.
    pub async fn alloc_mapped(&mut self, size: u64) -> Result<Mapped, String> {
        let req = self.req(pb::AllocateTensorRequest {
            size_bytes: size,
            name: String::new(),
        });
        let r = self
            .client
            .allocate_tensor(req)
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        if r.fd_ticket.is_empty() {
            return Err("AllocateTensor returned no fd ticket".into());
        }
        let ticket = Ticket::from_slice(&r.fd_ticket).map_err(|e| e.to_string())?;
        let sock = StdUnixStream::connect(&r.fd_socket).map_err(|e| e.to_string())?;
        let (fd, offset, len) = client::redeem_export(&sock, &ticket).map_err(|e| e.to_string())?;
        let len = usize::try_from(len).map_err(|e| e.to_string())?;
        let map =
            Mapping::new(std::os::fd::AsFd::as_fd(&fd), offset, len).map_err(|e| e.to_string())?;
        Ok(Mapped {
            id: r.tensor_id,
            map,
            fd,
        })
    }

    /// Declares an import of `declared` bytes and sends `fd` for it.
    ///
    /// Returns the tensor id, and the fd socket's answer (`Err` with its message when refused).
    ///
    /// # Errors
    /// The daemon's status for ImportTensor, as text.
    pub async fn import(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        declared: u64,
    ) -> Result<(u64, Result<(), String>), String> {
        let req = self.req(pb::ImportTensorRequest {
            size_bytes: declared,
            name: String::new(),
        });
        let r = self
            .client
            .import_tensor(req)
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        let ticket = Ticket::from_slice(&r.fd_ticket).map_err(|e| e.to_string())?;
        let sock = StdUnixStream::connect(&r.fd_socket).map_err(|e| e.to_string())?;
        let sent = client::import(&sock, &ticket, fd).map_err(|e| e.to_string());
        Ok((r.tensor_id, sent))
    }

    /// Dispatches `program` over whole tensors.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn dispatch(
        &mut self,
        program: u64,
        tensors: &[u64],
    ) -> Result<pb::DispatchResponse, Status> {
        let d = dispatch_request(program, tensors);
        if let Some(ring) = self.ring.clone() {
            let sent = d.clone();
            let answer = tokio::task::spawn_blocking(move || {
                ring.try_dispatch(&sent, Duration::from_secs(60))
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
            match answer {
                Some(a) => return a,
                // The ring closed before the daemon took it: gRPC, as the spec allows.
                None => self.ring = None,
            }
        }
        let req = self.req(d);
        Ok(self.client.dispatch(req).await?.into_inner())
    }

    /// Runs a chain.
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn chain(
        &mut self,
        links: Vec<pb::DispatchRequest>,
    ) -> Result<pb::ChainResponse, Status> {
        let req = self.req(pb::ChainRequest { links });
        Ok(self.client.chain(req).await?.into_inner())
    }

    /// Statistics (no session needed).
    ///
    /// # Errors
    /// The daemon's status.
    pub async fn statistics(&mut self) -> Result<pb::Statistics, Status> {
        Ok(self
            .client
            .get_statistics(with_identity_token(
                pb::GetStatisticsRequest::default(),
                self.identity_token.as_deref(),
            ))
            .await?
            .into_inner())
    }
}

/// `msg` carrying the identity token `secret`, when given.
pub fn with_identity_token<T>(msg: T, secret: Option<&str>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(secret) = secret {
        r.metadata_mut().insert(
            npu_proto::IDENTITY_TOKEN_HEADER,
            secret.parse().expect("a token secret is ASCII"),
        );
    }
    r
}

/// A request with session metadata.
pub fn with_session<T>(msg: T, id: u64, token: &str) -> Request<T> {
    let mut r = Request::new(msg);
    if let Ok(v) = id.to_string().parse() {
        r.metadata_mut().insert(npu_proto::SESSION_HEADER, v);
    }
    if let Ok(v) = token.parse() {
        r.metadata_mut().insert(npu_proto::TOKEN_HEADER, v);
    }
    r
}

/// A dispatch over whole tensors.
pub fn dispatch_request(program: u64, tensors: &[u64]) -> pb::DispatchRequest {
    pb::DispatchRequest {
        program_id: program,
        args: tensors
            .iter()
            .map(|t| pb::TensorArg {
                tensor_id: *t,
                offset: 0,
                length: 0,
                read_only: false,
            })
            .collect(),
    }
}

/// i32 values as little-endian bytes.
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes as i32 values.
pub fn bytes_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A codec that sends and receives message bodies as raw bytes, so a test can send bytes that
/// are no protobuf at all.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

/// A unary call of `path` (`/npud.v1.Npud/OpenSession`) with `body` as the raw message bytes.
///
/// # Errors
/// The daemon's status.
pub async fn raw_unary(
    channel: Channel,
    path: &'static str,
    request: Request<Vec<u8>>,
) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    Ok(grpc.unary(request, path, RawCodec).await?.into_inner())
}

/// A unary gRPC call made with a bare HTTP/2 client on the Unix socket `socket`: `message` is
/// sent as the one length-prefixed message, with `headers` (`grpc-timeout`, session metadata)
/// added. No client-side deadline applies, so the answer is the daemon's own. Returns the
/// `grpc-status` (from the headers of a trailers-only answer, else from the trailers) and the
/// `grpc-message`.
///
/// # Panics
/// When the socket does not accept or the HTTP/2 exchange fails.
pub async fn raw_h2_call(
    socket: &Path,
    path: &str,
    headers: &[(&str, &str)],
    message: &[u8],
) -> (i32, String) {
    use http_body_util::BodyExt;
    let io = hyper_util::rt::TokioIo::new(
        tokio::net::UnixStream::connect(socket)
            .await
            .expect("connect to npud's socket"),
    );
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .expect("an HTTP/2 handshake");
    tokio::spawn(conn);
    let len = u32::try_from(message.len()).expect("a message under 4 GiB");
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(message);
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::from(frame)))
        .expect("a request");
    let resp = send.send_request(req).await.expect("a response");
    let (parts, body) = resp.into_parts();
    let status = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
    };
    let text = |h: &http::HeaderMap| {
        h.get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    if let Some(code) = status(&parts.headers) {
        return (code, text(&parts.headers));
    }
    let collected = body.collect().await.expect("the response body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (status(&trailers).unwrap_or(-1), text(&trailers))
}

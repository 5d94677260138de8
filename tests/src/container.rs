//! The runtime image for the container tests, and containers run from it with podman.
//!
//! The image is the Containerfile's `from-host` target: the binaries this build made
//! (`npud`, `npuctl`, `npud-device-plugin`, their debug sections stripped) in
//! `target/npud-image/bin/`, on a Debian bookworm base made with mmdebstrap and imported into
//! podman (no registry is reachable where these tests run). The base carries Debian's
//! `systemd` too, so that the systemd test (`tests/tests/systemd_real.rs`) boots the same base
//! as its PID 1 ([`base`]). The base's tarball is kept in
//! `target/npud-base/base-bookworm-systemd-procps.tar` between runs, so only the first run pays for
//! it, and a lock file beside it makes concurrent tests wait for one build.
//!
//! Podman runs every container with `--runtime runc` and explicit `nofile`/`nproc` limits
//! (crun refuses hybrid cgroup hierarchies, and podman's default limits may exceed what a
//! sandbox allows). Containers carry the label `npud_e2e_pid=<pid>`; [`Pod`]'s drop removes
//! its container, and [`Image::build`] first removes containers of runs whose process is gone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The base image's name in podman's storage.
pub const BASE: &str = "localhost/npud-e2e-base:bookworm-systemd-procps";

/// What the base carries beyond Debian's minbase: systemd as PID 1, and procps (`kill`, which
/// `npud.service`'s `ExecReload=` runs, as on any host with systemd and a shell).
const INCLUDE: &str = "--include=systemd,systemd-sysv,procps";
const LABEL: &str = "npud_e2e_pid";

/// Whether this machine can run the container tests: `Err` says what is missing.
///
/// # Errors
/// Not root, or no podman, runc, mmdebstrap or objcopy.
pub fn available() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("needs root".into());
    }
    for tool in ["podman", "runc", "mmdebstrap", "objcopy"] {
        if crate::netns::which(tool).is_none() {
            return Err(format!("needs {tool} on PATH"));
        }
    }
    Ok(())
}

/// The flags every `podman run` and `podman build` gets: runc, and this process's own
/// `nofile` and `nproc` limits (a container may not raise them).
pub fn runtime_flags() -> Vec<String> {
    use rustix::process::{Resource, getrlimit};
    let limit = |r: Resource, most: u64| {
        let l = getrlimit(r);
        let hard = l.maximum.unwrap_or(most).min(most);
        let soft = l.current.unwrap_or(hard).min(hard);
        format!("{soft}:{hard}")
    };
    vec![
        "--runtime".into(),
        "runc".into(),
        "--ulimit".into(),
        format!("nofile={}", limit(Resource::Nofile, 65536)),
        "--ulimit".into(),
        // More may be refused even under this process's own limit (runc's "error setting
        // rlimit type 6"); a pod needs far fewer.
        format!("nproc={}", limit(Resource::Nproc, 4096)),
    ]
}

/// Runs `cmd` within `limit`, with its output (failing or not).
///
/// # Panics
/// When it cannot start or takes longer.
pub fn run_within(cmd: &mut Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let o = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut b);
        b
    });
    let e = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut b);
        b
    });
    let until = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} took more than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: o.join().unwrap_or_default(),
        stderr: e.join().unwrap_or_default(),
    }
}

/// Runs `cmd` within `limit` and requires success; its stdout.
///
/// # Panics
/// When it fails or takes longer.
pub fn check(cmd: &mut Command, limit: Duration) -> String {
    let what = format!("{cmd:?}");
    let out = run_within(cmd, limit);
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn podman() -> Command {
    Command::new("podman")
}

/// The repository's root (the Containerfile's build context).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the repository")
        .to_path_buf()
}

/// The runtime image, removed from podman's storage on drop (the base image stays).
#[derive(Debug)]
pub struct Image {
    pub name: String,
    /// How long the base took (made or imported) and the build, for the test to print.
    pub base_took: Duration,
    pub build_took: Duration,
    /// Whether the base tarball had to be made (a cold build).
    pub cold: bool,
}

impl Image {
    /// Builds the `from-host` image from this build's binaries.
    ///
    /// # Panics
    /// When a step fails or takes longer than its bound (the base: 15 min; the build: 5 min).
    pub fn build() -> Image {
        sweep();
        let bin = repo().join("target/npud-image/bin");
        std::fs::create_dir_all(&bin).expect("target/npud-image/bin");
        let (base_took, cold) = base();
        let t = Instant::now();
        for b in ["npud", "npuctl", "npud-device-plugin"] {
            let from = if b == "npuctl" {
                crate::npuctl_binary()
            } else if b == "npud-device-plugin" {
                crate::package_binary("npud-device-plugin", b)
            } else {
                crate::binary(b)
            };
            check(
                Command::new("objcopy")
                    .arg("--strip-debug")
                    .arg(&from)
                    .arg(bin.join(b)),
                Duration::from_secs(120),
            );
        }
        let name = format!("localhost/npud-e2e:{}", std::process::id());
        check(
            podman()
                .arg("build")
                .args(runtime_flags())
                .args(["--build-arg", &format!("BASE={BASE}")])
                .args(["--target", "from-host", "-t", &name, "-f"])
                .arg(repo().join("Containerfile"))
                .arg(repo()),
            Duration::from_secs(300),
        );
        Image {
            name,
            base_took,
            build_took: t.elapsed(),
            cold,
        }
    }
}

/// The Debian bookworm base (minbase, with [`INCLUDE`]'s packages) in podman's storage
/// as [`BASE`]: made with mmdebstrap the first time (its tarball kept in `target/npud-base/`),
/// imported when podman lacks it. Concurrent callers wait on a lock file for one build. Returns
/// how long it took and whether the tarball had to be made.
///
/// # Panics
/// When a step fails or takes longer than its bound (mmdebstrap: 15 min; the import: 5 min).
pub fn base() -> (Duration, bool) {
    // Outside the build context (target/npud-image/ is in it).
    let dir = repo().join("target/npud-base");
    std::fs::create_dir_all(&dir).expect("target/npud-base");
    let lock = std::fs::File::create(dir.join("lock")).expect("target/npud-base/lock");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .expect("the base image's lock");
    let t = Instant::now();
    let tar = dir.join("base-bookworm-systemd-procps.tar");
    let cold = !tar.exists();
    if cold {
        let part = dir.join(format!(
            "base-bookworm-systemd-procps.tar.{}",
            std::process::id()
        ));
        check(
            Command::new("mmdebstrap")
                .args([
                    "--variant=minbase",
                    "--mode=root",
                    "--format=tar",
                    INCLUDE,
                    "bookworm",
                ])
                .arg(&part),
            Duration::from_secs(900),
        );
        std::fs::rename(&part, &tar).expect("the base tarball");
    }
    let imported = run_within(
        podman().args(["image", "exists", BASE]),
        Duration::from_secs(60),
    );
    if cold || !imported.status.success() {
        check(
            podman().arg("import").arg(&tar).arg(BASE),
            Duration::from_secs(300),
        );
    }
    (t.elapsed(), cold)
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = run_within(
            podman().args(["rmi", "-f", &self.name]),
            Duration::from_secs(60),
        );
    }
}

/// A container started with `podman run -d`, removed on drop.
#[derive(Debug)]
pub struct Pod {
    pub name: String,
}

impl Pod {
    /// `podman run -d --name <unique> <args> <image> <command>`.
    ///
    /// # Panics
    /// When podman refuses.
    pub fn start(role: &str, args: &[String], image: &str, command: &[&str]) -> Pod {
        let name = format!("npud-e2e-{}-{role}", std::process::id());
        Pod::start_named(name, args, image, command)
    }

    /// [`Pod::start`] with a name of the caller's.
    ///
    /// # Panics
    /// When podman refuses.
    pub fn start_named(name: String, args: &[String], image: &str, command: &[&str]) -> Pod {
        check(
            podman()
                .args(["run", "-d", "--name", &name])
                .args(["--label", &format!("{LABEL}={}", std::process::id())])
                .args(runtime_flags())
                .args(args)
                .arg(image)
                .args(command),
            Duration::from_secs(120),
        );
        Pod { name }
    }

    /// Whether it still runs.
    pub fn running(&self) -> bool {
        let out = run_within(
            podman().args(["inspect", "--format", "{{.State.Running}}", &self.name]),
            Duration::from_secs(60),
        );
        String::from_utf8_lossy(&out.stdout).trim() == "true"
    }

    /// What it logged.
    pub fn logs(&self) -> String {
        let out = run_within(podman().args(["logs", &self.name]), Duration::from_secs(60));
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `podman exec` in it.
    pub fn exec(&self, command: &[&str]) -> Output {
        self.exec_within(command, Duration::from_secs(60))
    }

    /// `podman exec` in it, bounded by `limit`.
    pub fn exec_within(&self, command: &[&str], limit: Duration) -> Output {
        run_within(podman().arg("exec").arg(&self.name).args(command), limit)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = run_within(
            podman().args(["rm", "-f", "-t", "5", &self.name]),
            Duration::from_secs(60),
        );
    }
}

/// A one-shot container (`podman run --rm`), its output.
pub fn run_once(args: &[String], image: &str, command: &[&str], limit: Duration) -> Output {
    run_within(
        podman()
            .args(["run", "--rm"])
            .args(["--label", &format!("{LABEL}={}", std::process::id())])
            .args(runtime_flags())
            .args(args)
            .arg(image)
            .args(command),
        limit,
    )
}

/// Removes the containers of earlier runs whose process is gone.
fn sweep() {
    let out = run_within(
        podman().args([
            "ps",
            "-a",
            "--filter",
            &format!("label={LABEL}"),
            "--format",
            &format!("{{{{.Names}}}} {{{{index .Labels \"{LABEL}\"}}}}"),
        ]),
        Duration::from_secs(60),
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut w = line.split_whitespace();
        let (Some(name), Some(pid)) = (w.next(), w.next()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run_within(
                podman().args(["rm", "-f", "-t", "0", name]),
                Duration::from_secs(60),
            );
        }
    }
}

//! The tests' own Python environment: a virtual environment under `target/`, made on first use
//! from `tests/python/requirements.txt` (every package pinned) and reused while that file is
//! unchanged.
//!
//! A fresh machine needs only a Python 3.11 or newer with its `venv` module (Debian: packages
//! `python3` and `python3-venv`) and a reachable package index the first time; nothing is
//! installed into the system's Python. The tests that use it run in parallel processes, so
//! making and updating the environment is serialized by a lock file beside it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The interpreter the tests start from: `$PYTHON`, else `python3`.
pub fn system_python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The pinned requirements file.
pub fn requirements() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/requirements.txt")
}

/// The environment's interpreter, made or brought up to date first.
///
/// # Panics
/// When the environment cannot be made (no `venv` module, no package index the first time),
/// naming the step that failed, its output, and what to do.
pub fn venv_python() -> PathBuf {
    let (profile, _) = crate::profile_dir();
    let target = profile
        .parent()
        .expect("the profile directory is in target/");
    let venv = target.join("npud-test-python");
    std::fs::create_dir_all(target).expect("target/ can be written");
    let lock = File::create(target.join("npud-test-python.lock")).expect("a lock file in target/");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .expect("the Python environment's lock");
    let wanted = std::fs::read_to_string(requirements()).expect("tests/python/requirements.txt");
    let stamp = venv.join("npud-requirements.txt");
    let python = venv.join("bin/python");
    let current = python.is_file()
        && std::fs::read_to_string(&stamp).is_ok_and(|have| have == wanted)
        && Command::new(&python)
            .args(["-c", "pass"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if current {
        return python;
    }
    let system = system_python();
    if !python.is_file() {
        let _ = std::fs::remove_dir_all(&venv);
        run_or_explain(
            "making the tests' Python environment",
            Command::new(&system).args(["-m", "venv"]).arg(&venv),
            Duration::from_secs(180),
            &format!(
                "{system} needs its venv module (Debian: `apt-get install python3-venv`); or set \
                 $PYTHON to a Python 3.11 or newer that has it"
            ),
        );
    }
    run_or_explain(
        "installing tests/python/requirements.txt",
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
            ])
            .arg(requirements()),
        Duration::from_secs(900),
        "the first run needs the package index (PyPI, or the one pip is configured for); \
         delete target/npud-test-python to start over",
    );
    std::fs::write(&stamp, wanted).expect("the environment's requirements stamp");
    python
}

/// Runs `cmd` to completion within `limit`, returning its combined output.
///
/// # Panics
/// On failure or timeout, naming `what`, the output and `hint`.
pub fn run_or_explain(what: &str, cmd: &mut Command, limit: Duration, hint: &str) -> String {
    let out_file = tempfile::NamedTempFile::new().expect("a temporary file for the output");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out_file.reopen().expect("the output file"))
        .stderr(out_file.reopen().expect("the output file"))
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}. {hint}"));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("the child can be waited for") {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let out = std::fs::read_to_string(out_file.path()).unwrap_or_default();
            panic!("{what} did not finish within {limit:?}:\n{out}\n{hint}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = std::fs::read_to_string(out_file.path()).unwrap_or_default();
    assert!(status.success(), "{what} failed ({status}):\n{out}\n{hint}");
    eprintln!("{what}: {:.1} s", t0.elapsed().as_secs_f64());
    out
}

//! The `npud` Python package (crates/npu-python): builds it with maturin into a virtual
//! environment beside the build, installs it, and runs its pytest suite against this build's
//! npud (and the pure-Python example client's tests with it).
//!
//! Needs Python 3.11 or newer with maturin, numpy, pytest and grpcio importable (`.ci/run`
//! installs them); without a Python the test is reported as ignored. Every pytest test must
//! run: a skipped one fails this test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use npud_e2e::binary;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// `target/<profile>` of this build, and whether it is a release build.
fn profile_dir() -> (PathBuf, bool) {
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

/// Runs `cmd` to completion within `limit`, returning its combined output; panics naming
/// `what` on failure or timeout.
fn run(what: &str, cmd: &mut Command, limit: Duration) -> String {
    let out_file = tempfile::NamedTempFile::new().unwrap();
    let err = out_file.reopen().unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out_file.reopen().unwrap())
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let out = std::fs::read_to_string(out_file.path()).unwrap_or_default();
            panic!("{what} did not finish within {limit:?}:\n{out}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = std::fs::read_to_string(out_file.path()).unwrap_or_default();
    assert!(status.success(), "{what} failed ({status}):\n{out}");
    eprintln!("{what}: {:.1} s", t0.elapsed().as_secs_f64());
    out
}

#[test]
#[cfg_attr(
    not(has_python),
    ignore = "no Python 3.11 or newer (python3, or $PYTHON): the npud package is not tested"
)]
fn the_python_package_passes_its_suite() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let (profile, release) = profile_dir();
    let target = profile
        .parent()
        .expect("the profile directory is in target/");
    let venv = target.join("npud-python-venv");
    let vpy = venv.join("bin/python");
    if !vpy.is_file() {
        // The system site packages bring maturin, numpy, pytest and grpcio as .ci/run installs
        // them; the package itself goes into the environment.
        run(
            "creating the virtual environment",
            Command::new(&python)
                .args(["-m", "venv", "--system-site-packages"])
                .arg(&venv),
            Duration::from_secs(120),
        );
    }
    let missing = run(
        "looking for the suite's modules",
        Command::new(&vpy).args([
            "-c",
            "import importlib.util as u; print(' '.join(m for m in \
             ('maturin', 'numpy', 'pytest', 'grpc') if u.find_spec(m) is None))",
        ]),
        Duration::from_secs(60),
    );
    assert!(
        missing.trim().is_empty(),
        "{python} lacks {}: `{python} -m pip install maturin numpy pytest grpcio` (.ci/run does)",
        missing.trim()
    );
    let wheels = target.join("npud-python-wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    // The same target directory and profile as this build: only pyo3 and the package itself
    // are compiled again (with maturin's interpreter configuration).
    run(
        "maturin build",
        Command::new(&python)
            .args(["-m", "maturin", "build", "--quiet", "--profile"])
            .arg(if release { "release" } else { "dev" })
            .arg("--interpreter")
            .arg(&vpy)
            .arg("--out")
            .arg(&wheels)
            .current_dir(repo().join("crates/npu-python"))
            .env("CARGO_TARGET_DIR", target),
        Duration::from_secs(900),
    );
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("maturin left a wheel");
    run(
        "installing the wheel",
        Command::new(&vpy)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--force-reinstall",
            ])
            .arg(&wheel),
        Duration::from_secs(120),
    );
    let pki = tempfile::tempdir().expect("a directory for the TLS test's certificates");
    make_pki(pki.path());
    let out = run(
        "pytest",
        Command::new(&vpy)
            .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
            .arg(repo().join("crates/npu-python/tests"))
            .env("NPUD_BIN", binary("npud"))
            .env("NPUD_TEST_PKI", pki.path())
            .env_remove("NPUD_ADDR")
            .current_dir(repo()),
        Duration::from_secs(300),
    );
    eprintln!("{out}");
    let summary = out
        .lines()
        .rev()
        .find(|l| l.contains(" passed"))
        .unwrap_or_else(|| panic!("no pytest summary in:\n{out}"));
    assert!(
        !summary.contains("skipped") && !summary.contains("failed"),
        "every Python test must run and pass: {summary}"
    );
}

/// The certificates test_tls.py uses: a CA (ca.pem), a server certificate for localhost and
/// 127.0.0.1 (server.crt, server.key), a client certificate for python-client.example
/// (client.crt, client.key).
fn make_pki(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "npud python test CA");
    let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("ca.pem written");
    let issuer = Issuer::new(ca, ca_key);
    for (name, sans, usage) in [
        (
            "server",
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        (
            "client",
            vec!["python-client.example".to_owned()],
            ExtendedKeyUsagePurpose::ClientAuth,
        ),
    ] {
        let key = KeyPair::generate().expect("a key");
        let mut p = CertificateParams::new(sans).expect("leaf parameters");
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &issuer).expect("a leaf certificate");
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).expect("cert written");
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).expect("key written");
    }
}

//! The `npud` Python package (crates/npu-python): builds it with maturin into a virtual
//! environment beside the build, installs it, and runs its pytest suite against this build's
//! npud (and the pure-Python example client's tests with it).
//!
//! Needs a Python 3.11 or newer with its venv module: the packages come from the tests' own
//! environment (`npud_e2e::python`, pinned in tests/python/requirements.txt); without a Python
//! the test is reported as ignored. Every pytest test must
//! run: a skipped one fails this test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use npud_e2e::python::{run_or_explain, venv_python};
use npud_e2e::{binary, profile_dir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// Runs `cmd` to completion within `limit`, returning its combined output; panics naming
/// `what` on failure or timeout.
fn run(what: &str, cmd: &mut Command, limit: Duration) -> String {
    run_or_explain(what, cmd, limit, "")
}

#[test]
#[cfg_attr(
    not(has_python),
    ignore = "no Python 3.11 or newer (python3, or $PYTHON): the npud package is not tested"
)]
fn the_python_package_passes_its_suite() {
    let (profile, release) = profile_dir();
    let target = profile
        .parent()
        .expect("the profile directory is in target/");
    let vpy = venv_python();
    let wheels = target.join("npud-python-wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    // The same target directory and profile as this build: only pyo3 and the package itself
    // are compiled again (with maturin's interpreter configuration).
    run(
        "maturin build",
        Command::new(&vpy)
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
            .env("NPUCTL_BIN", npud_e2e::npuctl_binary())
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

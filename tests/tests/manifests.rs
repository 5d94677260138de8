//! deploy/kubernetes/ checked against the Kubernetes API schemas and against itself:
//! `tests/kubernetes/test_manifests.py`, run with pytest and kubernetes-validate (which ships
//! the API's JSON schemas, so nothing is fetched), with `npud-device-plugin --print-config`
//! resolving the plugin's side of the cross-references.
//!
//! kubernetes-validate, pytest and PyYAML come from the tests' own Python environment
//! (`npud_e2e::python`); without a Python 3.11 or newer the test is reported as ignored
//! (tests/build.rs looks for it).

#![forbid(unsafe_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use npud_e2e::package_binary;

#[test]
#[cfg_attr(
    not(has_python),
    ignore = "no Python 3.11 or newer (python3): the manifests are not checked"
)]
fn the_kubernetes_manifests_match_the_api_schemas_and_each_other() {
    let python = npud_e2e::python::venv_python();
    let plugin = package_binary("npud-device-plugin", "npud-device-plugin");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/kubernetes/test_manifests.py");
    let mut child = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", script])
        .env("NPUD_DEVICE_PLUGIN_BIN", &plugin)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("pytest starts");
    let until = Instant::now() + Duration::from_secs(120);
    while child
        .try_wait()
        .expect("pytest can be waited for")
        .is_none()
    {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("pytest did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("pytest's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every schema check and cross-reference ran: none was skipped or deselected.
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains(" passed") && !summary.contains("skipped"),
        "{stdout}"
    );
}

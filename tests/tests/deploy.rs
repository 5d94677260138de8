//! The files a host installs: the example configuration is one the daemon accepts, and the
//! systemd units pass `systemd-analyze verify`.

use std::path::{Path, PathBuf};
use std::process::Command;

use npud_e2e::{Daemon, Options, binary};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_example_configuration_is_accepted_by_the_daemon() {
    // The file's own socket paths are under /run and its backend is hsa; the flags win.
    let config = repo().join("deploy/npud.toml");
    let d = Daemon::start(Options {
        args: vec!["--config".into(), config.display().to_string()],
        ..Options::default()
    });
    assert!(
        d.stderr().contains("npud listening on unix:"),
        "{}",
        d.stderr()
    );
}

#[test]
#[cfg_attr(
    not(has_systemd_analyze),
    ignore = "systemd-analyze is not installed (apt-get install systemd)"
)]
fn the_systemd_units_verify() {
    let dir = tempfile::tempdir().unwrap();
    for unit in ["npud.service", "npud.socket", "npud-fd.socket"] {
        let text = std::fs::read_to_string(repo().join("systemd").join(unit)).unwrap();
        // verify checks that ExecStart= names an existing executable.
        let text = text.replace("/usr/bin/npud", &binary("npud").display().to_string());
        std::fs::write(dir.path().join(unit), text).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(["npud.service", "npud.socket", "npud-fd.socket"].map(|u| dir.path().join(u)))
        .output()
        .expect("systemd-analyze runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // verify reports unknown keys and bad values on stderr but still exits 0.
    let complaints: Vec<&str> = stderr.lines().filter(|l| l.contains("npud")).collect();
    assert!(complaints.is_empty(), "{complaints:#?}");
}

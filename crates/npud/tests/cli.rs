//! The binary's command line and configuration errors (the daemon itself is tested end to end
//! in the workspace's `tests/`).

use std::process::Command;

#[test]
fn a_missing_config_file_is_an_error_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_npud"))
        .args(["--config", "/nonexistent/npud.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/npud.toml"), "{err}");
}

#[test]
fn a_bad_environment_value_names_the_key() {
    let out = Command::new(env!("CARGO_BIN_EXE_npud"))
        .env("NPUD_LIMITS__MAX_CACHED_PROGRAMS", "64")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("limits.max_cached_programs"), "{err}");
}

#[test]
fn an_unusable_state_directory_is_a_start_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-directory");
    std::fs::write(&file, b"").unwrap();
    let state = file.join("state");
    let out = Command::new(env!("CARGO_BIN_EXE_npud"))
        .args(["--backend", "emulator", "--config", "/dev/null"])
        .arg("--state-dir")
        .arg(&state)
        .arg("--socket")
        .arg(tmp.path().join("s"))
        .arg("--fd-socket")
        .arg(tmp.path().join("f"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("state directory: creating {}: ", state.display())),
        "{err}"
    );
    assert!(err.contains("Not a directory (os error 20)"), "{err}");
    // Nothing was served.
    assert!(!tmp.path().join("s").exists());
}

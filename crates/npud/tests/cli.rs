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

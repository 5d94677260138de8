//! The examples, run as processes against a real daemon: each prints `PASS!`.

mod common;

use std::process::Command;

use common::{Daemon, profile_dir};

fn run_example(name: &str, d: &Daemon, args: &[&str]) -> String {
    let exe = profile_dir().join("examples").join(name);
    assert!(
        exe.is_file(),
        "no {} (cargo test and cargo nextest build the examples; or run `cargo build -p npu-client --examples`)",
        exe.display()
    );
    let o = Command::new(&exe)
        .args(args)
        .env("NPUD_ADDR", d.unix())
        .output()
        .expect("the example runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{name}: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("\nPASS!\n"), "{name}: {out}");
    out
}

#[test]
fn examples_print_pass() {
    let d = Daemon::start();
    let out = run_example("vector_scalar_add", &d, &[]);
    assert!(out.contains("fd-shared"), "{out}");
    run_example("chain", &d, &[]);
    let out = run_example("multi_process", &d, &["3"]);
    assert_eq!(out.matches(", all right").count(), 3, "{out}");
}

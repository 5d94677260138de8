//! The README's commands that need no NPU run as written: the quick start (`npuctl demo`, the
//! daemon on the emulator and `npuctl status` against it) and every `npuctl` command it names
//! that a single local daemon answers (`status`, `status --json`, `programs`, `sessions`,
//! `health`). They are read from `README.md` itself, so an edit that breaks one breaks this
//! test.
//!
//! `cargo run --release -p PACKAGE --bin BIN --` stands for the binary this build made (the
//! test does not rebuild in release). The daemon runs with the README's arguments and, after
//! them, a private socket, fd socket and state directory (so that a test run as root does not
//! take `/run/npud`); the `npuctl` commands reach it through `NPUD_ADDR`, which the README
//! documents. Not run here: `npuctl bench` (its own smoke test, `crates/npu-bench/tests`),
//! `npuctl top` (a terminal, `top.rs`), the fleet commands (`fleet.rs`), commands with
//! placeholders (`DIR`, `HASH`), TLS hosts, and grpcurl (not packaged for CI's Debian).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CARGO_NPUCTL: &str = "cargo run --release -p npu-client --bin npuctl -- ";
const CARGO_NPUD: &str = "cargo run --release -p npud -- ";
/// The npuctl subcommands one local daemon answers without anything else set up.
const RUNNABLE: &[&str] = &["status", "programs", "sessions", "health", "demo"];

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every command the README shows: inline code spans (joined across line breaks) and the lines
/// of its `sh` blocks, without their `# comments`.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut prose = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_sh = !in_sh && line.trim_start().starts_with("```sh");
            continue;
        }
        if in_sh {
            let cmd = line.split(" #").next().unwrap_or("").trim();
            if !cmd.is_empty() {
                out.push(cmd.to_owned());
            }
        } else {
            prose.push_str(line);
            prose.push(' ');
        }
    }
    for (i, span) in prose.split('`').enumerate() {
        if i % 2 == 1 {
            out.push(span.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    out
}

/// A README command as (binary, arguments), when it is one this test runs.
fn runnable(cmd: &str) -> Option<(&'static str, Vec<String>)> {
    let (bin, rest) = if let Some(r) = cmd.strip_prefix(CARGO_NPUCTL) {
        ("npuctl", r)
    } else if let Some(r) = cmd.strip_prefix(CARGO_NPUD) {
        ("npud", r)
    } else if let Some(r) = cmd.strip_prefix("npuctl ") {
        ("npuctl", r)
    } else {
        return None;
    };
    let args: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
    let placeholder = args
        .iter()
        .any(|a| a.len() > 1 && a.chars().all(|c| c.is_ascii_uppercase() || c == '.'));
    let ok = match bin {
        "npud" => args == ["--backend", "emulator"],
        _ => {
            !placeholder
                && args.first().is_some_and(|a| RUNNABLE.contains(&a.as_str()))
                && !args
                    .iter()
                    .any(|a| a.contains("fleet") || a.contains("://"))
        }
    };
    ok.then_some((bin, args))
}

fn built(name: &str) -> PathBuf {
    match name {
        "npuctl" => npud_e2e::npuctl_binary(),
        _ => npud_e2e::binary(name),
    }
}

#[test]
fn the_readme_commands_run_as_written() {
    let all = commands(&readme());
    let mut run: Vec<(&'static str, Vec<String>)> = Vec::new();
    for c in &all {
        if let Some(r) = runnable(c)
            && !run.contains(&r)
        {
            run.push(r);
        }
    }
    let shown: Vec<String> = run
        .iter()
        .map(|(b, a)| format!("{b} {}", a.join(" ")))
        .collect();
    eprintln!("the README's commands run here: {shown:?}");
    // The quick start is there to run.
    for want in ["npuctl demo", "npud --backend emulator", "npuctl status"] {
        assert!(
            shown.iter().any(|s| s == want),
            "{want:?} not in the README: {shown:?}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let sock = dir.path().join("npud.sock");
    let ready = dir.path().join("ready");
    let log = dir.path().join("npud.log");
    let clean = |c: &mut Command| {
        for (k, _) in std::env::vars() {
            if k.starts_with("NPUD_") || k.starts_with("HSA_SIM_") {
                c.env_remove(&k);
            }
        }
        c.env("XDG_RUNTIME_DIR", &runtime)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
    };

    // The daemon, as the README starts it.
    let (_, npud_args) = run.iter().find(|(b, _)| *b == "npud").unwrap().clone();
    let mut daemon = Command::new(built("npud"));
    daemon
        .args(&npud_args)
        .arg("--socket")
        .arg(&sock)
        .arg("--fd-socket")
        .arg(dir.path().join("npud.fd.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    clean(&mut daemon);
    let mut daemon = Daemon(daemon.spawn().unwrap());
    let until = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(
            Instant::now() < until,
            "npud not ready: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(daemon.0.try_wait().unwrap().is_none(), "npud exited");
        std::thread::sleep(Duration::from_millis(20));
    }

    for (bin, args) in run.iter().filter(|(b, _)| *b == "npuctl") {
        let mut c = Command::new(built(bin));
        c.args(args);
        clean(&mut c);
        c.env("NPUD_ADDR", format!("unix:{}", sock.display()));
        let out = bounded(c, Duration::from_secs(120));
        assert!(
            out.status.success(),
            "`{bin} {}` failed ({}):\n{}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if args.first().is_some_and(|a| a == "demo") {
            assert!(String::from_utf8_lossy(&out.stdout).contains("PASS!"));
        }
    }
    assert!(daemon.0.try_wait().unwrap().is_none(), "npud exited");
}

/// Runs `c` to its end, killing it after `limit`.
fn bounded(mut c: Command, limit: Duration) -> std::process::Output {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            if let Some(pid) = rustix::process::Pid::from_raw(i32::try_from(id).unwrap_or(0)) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            panic!("did not finish within {limit:?}");
        }
    }
}

/// The daemon, stopped on drop.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_extraction_sees_inline_commands_across_line_breaks() {
    let text = "run `cargo run --release -p npu-client --bin npuctl --\nstatus`, then\n\
                ```sh\nnpuctl sessions   # yours\nnpuctl run DIR\n```\n`npuctl bench`";
    let got: Vec<_> = commands(text).iter().filter_map(|c| runnable(c)).collect();
    assert_eq!(
        got,
        [
            ("npuctl", vec!["sessions".to_owned()]),
            ("npuctl", vec!["status".to_owned()])
        ]
    );
}

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

/// Every fenced block of `lang` in `text`, each as the lines between its fences, with the
/// heading (`## ...`) it sits under.
fn blocks(text: &str, lang: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut cur: Option<Vec<String>> = None;
    // The fence's indentation (a block inside a list item), taken off each of its lines.
    let mut indent = 0;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("## ") && cur.is_none() {
            heading = t.trim_start_matches('#').trim().to_owned();
        }
        if t.starts_with("```") {
            match cur.take() {
                Some(b) => out.push((heading.clone(), b)),
                None if t == format!("```{lang}") => {
                    indent = line.len() - t.len();
                    cur = Some(Vec::new());
                }
                None => {}
            }
            continue;
        }
        if let Some(b) = cur.as_mut() {
            let cut = line.len() - line.trim_start().len();
            b.push(line[cut.min(indent)..].to_owned());
        }
    }
    out
}

/// Every `sh` block of the README, the test that runs it, or why none can. A block this list
/// does not name fails the check below: a new walkthrough gets a test (or a stated reason).
const SH_BLOCKS: &[(&str, &str)] = &[
    (
        "The two commands",
        "this file: the_readme_commands_run_as_written",
    ),
    (
        "What is verified, and where",
        "reliability.rs (its soak mode, by hand)",
    ),
    (
        "Exposing npud on a network",
        "this file: the_readme_walkthroughs_run_as_written (steps 1, 2, 3); step 4 is grpcurl, not packaged for CI's Debian",
    ),
    (
        "The API",
        "not run: grpcurl is not packaged for CI's Debian",
    ),
    (
        "Using it from Rust",
        "this file: the_readme_walkthroughs_run_as_written",
    ),
    (
        "Many hosts: the fleet client",
        "fleet.rs and fleet_netns.rs (the --fleet commands)",
    ),
    (
        "Using it from Python",
        "python.rs (builds and installs the package as the README says)",
    ),
    ("Metrics", "metrics.rs"),
    ("Running as a systemd service", "systemd_real.rs"),
    ("Running a real NPU", "not run: needs an NPU"),
    ("Running on a real NPU", "not run: needs an NPU"),
    (
        "Benchmarks",
        "crates/npu-bench/tests (npuctl bench --quick)",
    ),
];

#[test]
fn every_sh_block_of_the_readme_is_run_by_a_test_or_says_why_not() {
    let text = readme();
    let mut unlisted = Vec::new();
    for (heading, lines) in blocks(&text, "sh") {
        let first = heading.split(':').next().unwrap_or_default().to_owned();
        if !SH_BLOCKS
            .iter()
            .any(|(h, _)| heading.starts_with(h) || first == *h)
        {
            unlisted.push(format!("{heading}: {}", lines.join(" / ")));
        }
    }
    assert!(
        unlisted.is_empty(),
        "README sh blocks no test runs (add one, or a reason to SH_BLOCKS): {unlisted:#?}"
    );
}

/// The README's text from the heading `section` to the next `## ` heading.
fn section(text: &str, heading: &str) -> String {
    text.split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("no section {heading:?}"))
        .to_owned()
}

/// `bash -ec SCRIPT` in `dir` with this build's binaries first on PATH; its output.
fn bash(dir: &Path, script: &str, env: &[(&str, String)]) -> std::process::Output {
    let bin = built("npud").parent().expect("a directory").to_path_buf();
    let mut c = Command::new("bash");
    c.args(["-ec", script]).current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("NPUD_") {
            c.env_remove(&k);
        }
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    c.env("PATH", path).env("NO_COLOR", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    bounded(c, Duration::from_secs(120))
}

fn ok(what: &str, out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts this build's npud with `args`, a private socket and state, waiting until it serves.
fn start(dir: &Path, args: &[&str]) -> (Daemon, PathBuf) {
    let sock = dir.join("npud.sock");
    let ready = dir.join("ready");
    let mut c = Command::new(built("npud"));
    c.args(args)
        .arg("--socket")
        .arg(&sock)
        .args(["--state-dir", ""])
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("npud.log")).unwrap())
        .env("NO_COLOR", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("NPUD_") {
            c.env_remove(&k);
        }
    }
    let mut d = Daemon(c.spawn().unwrap());
    let until = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(
            d.0.try_wait().unwrap().is_none() && Instant::now() < until,
            "npud did not start: {}",
            std::fs::read_to_string(dir.join("npud.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (d, sock)
}

/// The walkthroughs as written: the emulated `vector_scalar_add` the Rust and Python examples
/// load, and "Exposing npud on a network" steps 1 to 3 (OpenSSL, the configuration, a token,
/// npuctl with certificates and with the token). Where the README names a host's own places,
/// the test moves them: `/etc/npud/` to a temporary directory, `-o npud` to this user, the
/// daemon's address (`npu-host.example`, `10.0.0.5`, `0.0.0.0`, port 50051) to loopback and a
/// free port; the certificate already names `localhost` and `127.0.0.1` (step 1).
#[test]
fn the_readme_walkthroughs_run_as_written() {
    let text = readme();
    let dir = tempfile::tempdir().unwrap();

    // The design directory the examples load, and npuctl running it.
    let rust = section(&text, "Using it from Rust");
    let (_, how) = blocks(&rust, "sh")
        .into_iter()
        .find(|(_, b)| b.iter().any(|l| l.contains("emu-design vector_scalar_add")))
        .expect("the README shows how to make vector_scalar_add");
    let (daemon, sock) = start(dir.path(), &["--backend", "emulator"]);
    let env = [("NPUD_ADDR", format!("unix:{}", sock.display()))];
    ok(
        "making vector_scalar_add",
        &bash(dir.path(), &how.join("\n"), &env),
    );
    let out = std::fs::read(dir.path().join("out.bin")).unwrap();
    assert_eq!(
        &out[..8],
        &[1, 0, 0, 0, 1, 0, 0, 0],
        "vector_scalar_add adds 1"
    );
    drop(daemon);

    // "Exposing npud on a network", steps 1 to 3.
    let net = section(&text, "Exposing npud on a network");
    let sh = blocks(&net, "sh");
    let toml = blocks(&net, "toml");
    assert!(sh.len() >= 4 && !toml.is_empty(), "{sh:#?}");
    let tls = dir.path().join("tls");
    std::fs::create_dir_all(tls.join("etc/npud/tls")).unwrap();
    // Step 1: the CA and the certificates.
    ok("step 1 (openssl)", &bash(&tls, &sh[0].1.join("\n"), &[]));
    // Step 2: the files where the configuration names them, and the token.
    for f in ["server.crt", "server.key", "ca.pem"] {
        std::fs::copy(tls.join(f), tls.join("etc/npud/tls").join(f)).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let me = rustix::process::getuid().as_raw().to_string();
    let here = |s: &str| {
        s.replace("/etc/npud/", &format!("{}/etc/npud/", tls.display()))
            .replace("-o npud", &format!("-o {me}"))
            .replace("0.0.0.0:50051", &format!("127.0.0.1:{port}"))
            .replace("npu-host.example:50051", &format!("localhost:{port}"))
            .replace("10.0.0.5:50051", &format!("127.0.0.1:{port}"))
    };
    let config = tls.join("etc/npud/npud.toml");
    std::fs::write(&config, here(&toml[0].1.join("\n"))).unwrap();
    ok(
        "step 2 (the token)",
        &bash(&tls, &here(&sh[1].1.join("\n")), &[]),
    );
    let (daemon, _) = start(&tls, &["--config", &config.display().to_string()]);
    let log = std::fs::read_to_string(tls.join("npud.log")).unwrap();
    assert!(
        log.contains("security=\"mtls-optional\""),
        "the log line step 2 names: {log}"
    );
    // Step 3: npuctl with a certificate, with the environment, with the token.
    let step3: Vec<String> = sh[2].1.iter().map(|l| here(l)).collect();
    assert_eq!(step3.len(), 4, "{step3:#?}");
    let cert = ok("step 3, a certificate", &bash(&tls, &step3[0], &[]));
    assert!(
        cert.contains("you are:") && cert.contains("cert:dns:client-a.example"),
        "{cert}"
    );
    ok(
        "step 3, the environment",
        &bash(&tls, &step3[1..3].join("\n"), &[]),
    );
    let token = ok("step 3, the token", &bash(&tls, &step3[3], &[]));
    assert!(token.contains("token:client-b@"), "{token}");
    // Step 5, with the npud package of the tests' Python environment (python.rs builds and
    // installs it; before it has, this step is said to be left out).
    let py = npud_e2e::python::venv_python();
    let has_npud = Command::new(&py)
        .args(["-c", "import npud"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has_npud {
        let (_, step5) = blocks(&net, "python")
            .into_iter()
            .next()
            .expect("step 5's Python");
        let script = here(&step5.join("\n"));
        let mut c = Command::new(&py);
        c.args(["-c", &script]).current_dir(&tls);
        let out = ok("step 5 (Python)", &bounded(c, Duration::from_secs(120)));
        assert!(
            out.contains("cert:dns:client-a.example") && out.contains("token:client-b@"),
            "{out}"
        );
    } else {
        eprintln!(
            "step 5 (Python) left out: {} has no npud package yet (python.rs installs it)",
            py.display()
        );
    }
    drop(daemon);
}

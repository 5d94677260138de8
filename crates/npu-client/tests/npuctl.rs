//! The `npuctl` binary, run as a process against a real daemon.

mod common;

use std::process::{Command, Output};

use common::Daemon;
use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::{Operator, Program, blocking};
use serde_json::Value;

fn npuctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_npuctl"))
        .args(args)
        .env_remove("NPUD_ADDR")
        .output()
        .expect("npuctl runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json_of(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "npuctl failed: {}\n{}",
        stdout(o),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("npuctl --json prints JSON")
}

#[test]
fn status_json_matches_what_the_daemon_reports() {
    let d = Daemon::start();
    // Some state to report: a session with a program, tensors and dispatches.
    let client = blocking::Client::connect(Some(&d.unix())).expect("connect");
    let p = Program::emulated(
        &EmuDesign::vector_scalar_add(256, DType::I32, 1),
        client.generation(),
    )
    .expect("program");
    let a = client.tensor_from(&[1_i32; 256]).expect("a");
    let mut b = client.alloc::<i32>(256).expect("b");
    for _ in 0..3 {
        client.dispatch(&p, &[&a], &mut [&mut b]).expect("dispatch");
    }

    let v = json_of(&npuctl(&["status", "--json", "--addr", &d.unix()]));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (info, stats) = rt.block_on(async {
        let op = Operator::connect(Some(&d.unix())).await.expect("operator");
        (
            op.device_info().await.expect("info"),
            op.statistics().await.expect("statistics"),
        )
    });
    let dev = &v["device"];
    assert_eq!(dev["generation"], info.generation.as_str());
    assert_eq!(dev["agent_name"], info.agent_name.as_str());
    assert_eq!(dev["product_name"], info.product_name.as_str());
    assert_eq!(dev["backend"], info.backend.as_str());
    assert_eq!(dev["runtime_library"], info.runtime_library.as_str());
    assert_eq!(dev["runtime_version"], info.runtime_version.as_str());
    assert_eq!(dev["packet_abi"], info.packet_abi.as_str());
    assert_eq!(dev["heap_size_bytes"], info.heap_size_bytes);
    assert_eq!(dev["heap_used_bytes"], info.heap_used_bytes);
    assert_eq!(dev["programs_loaded"], info.programs_loaded);
    assert_eq!(dev["fd_export"], info.fd_export);
    assert_eq!(dev["daemon_version"], info.daemon_version.as_str());
    assert_eq!(dev["session_grace_ms"], info.session_grace_ms);
    assert_eq!(dev["sessions"], info.sessions);
    assert_eq!(dev["serving"], info.serving);
    assert_eq!(dev["recoveries"], info.recoveries);
    assert_eq!(dev["last_recovery_unix_ms"], info.last_recovery_unix_ms);
    let limits = info.limits.expect("limits");
    assert_eq!(dev["limits"]["max_sessions"], limits.max_sessions);
    assert_eq!(dev["limits"]["max_chain_links"], limits.max_chain_links);
    assert_eq!(dev["limits"]["max_message_bytes"], limits.max_message_bytes);
    assert_eq!(dev["io_threads"], info.io_threads);
    assert!(info.io_threads >= 1);
    assert_eq!(dev["executor_spin_us"], info.executor_spin_us);

    let st = &v["statistics"];
    assert_eq!(st["sessions_opened"], stats.sessions_opened);
    assert_eq!(st["sessions_ended"], stats.sessions_ended);
    assert_eq!(st["device_faults"], stats.device_faults);
    assert!(st["uptime_ms"].as_u64().expect("uptime") <= stats.uptime_ms);
    let sessions = st["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), stats.sessions.len());
    for (j, s) in sessions.iter().zip(&stats.sessions) {
        assert_eq!(j["session_id"], s.session_id);
        assert_eq!(j["client_name"], s.client_name.as_str());
        assert_eq!(j["tensors"], s.tensors);
        assert_eq!(j["tensor_bytes"], s.tensor_bytes);
        assert_eq!(j["programs"], s.programs);
        assert_eq!(j["device_faults"], s.device_faults);
        let ok = s
            .dispatches
            .as_ref()
            .and_then(|x| x.success.as_ref())
            .map_or(0, |x| x.count);
        assert_eq!(j["dispatches"]["success"]["count"], ok);
    }
    let programs = st["programs"].as_array().expect("programs");
    assert_eq!(programs.len(), stats.programs.len());
    assert_eq!(programs.len(), 1);
    for (j, p) in programs.iter().zip(&stats.programs) {
        assert_eq!(j["program_id"], p.program_id);
        assert_eq!(j["name"], p.name.as_str());
        assert_eq!(j["content_hash"], p.content_hash.as_str());
        assert_eq!(j["loads"], p.loads);
        assert_eq!(j["dispatches"]["success"]["count"], 3);
    }
    assert_eq!(v["address"], format!("unix:{}", d.unix()));

    // The tables for people name the same things.
    let text = stdout(&npuctl(&["status", "--addr", &d.unix()]));
    assert!(text.contains("npu2") || text.contains("npu1"), "{text}");
    assert!(text.contains("3 ok, 0 failed"), "{text}");
    let text = stdout(&npuctl(&["programs", "--addr", &d.unix()]));
    assert!(text.contains("vector_scalar_add"), "{text}");
    let text = stdout(&npuctl(&["sessions", "--addr", &d.unix()]));
    assert!(text.contains(&client.session_id().to_string()), "{text}");
    let v = json_of(&npuctl(&["sessions", "--json", "--addr", &d.unix()]));
    assert_eq!(v.as_array().map(Vec::len), Some(1));
}

#[test]
fn emu_design_inspect_and_run_round_trip() {
    let d = Daemon::start();
    let dir = d.dir().join("vsa");
    let dir_s = dir.display().to_string();
    let o = npuctl(&[
        "emu-design",
        "vector_scalar_add",
        "--out",
        &dir_s,
        "--n",
        "64",
        "--scalar",
        "3",
        "--addr",
        &d.unix(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout(&o).contains("the daemon's device"), "{}", stdout(&o));

    let v = json_of(&npuctl(&["inspect", &dir_s, "--json"]));
    assert_eq!(v["pdi"]["kind"], "emulated");
    assert_eq!(v["insts"]["arg_count"], 2);
    assert_eq!(v["insts"]["min_arg_bytes"], serde_json::json!([256, 256]));
    assert!(v["listing"].as_array().is_some_and(|l| l.len() > 3));

    let input = d.dir().join("in.bin");
    let output = d.dir().join("out.bin");
    let values: Vec<i32> = (0..64).collect();
    std::fs::write(&input, bytemuck::cast_slice(&values)).expect("input");
    for addr in [d.unix(), d.http()] {
        // Each run must write its own output.
        let _ = std::fs::remove_file(&output);
        let o = npuctl(&[
            "run",
            &dir_s,
            "--input",
            &input.display().to_string(),
            "--output",
            &output.display().to_string(),
            "--addr",
            &addr,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got = std::fs::read(&output).expect("output");
        let got: Vec<i32> = got
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, (3..67).collect::<Vec<i32>>(), "{addr}");
    }

    // The same design as an hsaco file (the daemon's default runtime speaks G2, so it runs
    // the kernel's PDI and instructions).
    let hsaco = d.dir().join("vsa.hsaco").display().to_string();
    let o = npuctl(&[
        "emu-design",
        "vector_scalar_add",
        "--format",
        "hsaco",
        "--out",
        &hsaco,
        "--n",
        "64",
        "--scalar",
        "4",
        "--generation",
        "npu2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_file(&output);
    let o = npuctl(&[
        "run",
        &hsaco,
        "--kernel",
        "vector_scalar_add",
        "--input",
        &input.display().to_string(),
        "--output",
        &output.display().to_string(),
        "--addr",
        &d.unix(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = std::fs::read(&output).expect("output");
    assert_eq!(
        got,
        bytemuck::cast_slice::<i32, u8>(&(4..68).collect::<Vec<i32>>())
    );
    // A kernel the file lacks, and --kernel with a design directory.
    let o = npuctl(&["run", &hsaco, "--kernel", "relu", "--addr", &d.unix()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no kernel \"relu\""), "{err}");
    let o = npuctl(&["run", &dir_s, "--kernel", "x", "--addr", &d.unix()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is a design directory"), "{err}");
}

#[test]
fn errors_a_user_reads() {
    let tmp = tempfile::tempdir().expect("tmp");
    let o = npuctl(&["inspect", &tmp.path().display().to_string()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("looked for:") && err.contains("insts.bin"),
        "{err}"
    );

    let o = npuctl(&[
        "status",
        "--addr",
        &tmp.path().join("none.sock").display().to_string(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot reach npud at unix:"), "{err}");
}

#[test]
fn demo_runs_everything_and_passes() {
    // The demo finds npud beside npuctl.
    common::npud_binary();
    let cwd = tempfile::tempdir().expect("tmp");
    let o = Command::new(env!("CARGO_BIN_EXE_npuctl"))
        .args(["demo", "--clients", "3", "--dispatches", "4"])
        .current_dir(cwd.path())
        .env_remove("NPUD_ADDR")
        .output()
        .expect("npuctl demo runs");
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("\nPASS!\n"), "{out}");
    for needle in [
        "[1/7] started npud",
        "tensors shared by fd",
        "identical to the fd-shared results",
        "3 client processes at once",
        "client 3 (pid",
        "stopped npud with SIGTERM: exited with exit status: 0",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}

#[test]
fn bench_runs_the_benchmark_binary_with_the_arguments_passed_through() {
    let o = npuctl(&["bench", "--", "--help"]);
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("--quick"), "npuctl-bench's own help: {out}");
    let o = npuctl(&["bench", "--bench-bin", "/nonexistent/npuctl-bench"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("--bench-bin /nonexistent/npuctl-bench: no such file"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn hsaco_pack_inspect_and_emu_design_formats() {
    let tmp = tempfile::tempdir().expect("tmp");
    let p = |name: &str| tmp.path().join(name).display().to_string();
    let ok = |o: Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o
    };
    // Inputs: an emulated design directory for npu1, and an emulated full ELF.
    ok(npuctl(&[
        "emu-design",
        "vector_scalar_add",
        "--out",
        &p("vsa"),
        "--n",
        "64",
        "--generation",
        "npu1",
    ]));
    let o = ok(npuctl(&[
        "emu-design",
        "matmul",
        "--n",
        "8",
        "--format",
        "full-elf",
        "--out",
        &p("mm.elf"),
    ]));
    assert!(stdout(&o).contains("full-elf"), "{}", stdout(&o));

    // Two PdiInsts kernels (the arch from insts.bin's TXN header) and the full ELF.
    let v = json_of(&npuctl(&[
        "pack",
        "--json",
        "--out",
        &p("all.hsaco"),
        "--name",
        "a",
        "--pdi",
        &p("vsa/main.pdi"),
        "--insts",
        &p("vsa/insts.bin"),
        "--name",
        "b",
        "--pdi",
        &p("vsa/main.pdi"),
        "--insts",
        &p("vsa/insts.bin"),
        "--num-cols",
        "4",
        "--elf",
        &p("mm.elf"),
    ]));
    assert_eq!(
        v["kernels"],
        serde_json::json!([
            {"arch": "aie2", "name": "a"},
            {"arch": "aie2", "name": "b"},
            {"arch": "aie2p", "name": "main:sequence"},
        ])
    );

    let v = json_of(&npuctl(&["inspect", &p("all.hsaco"), "--json"]));
    let s = &v["sections"];
    assert_eq!(s[0]["arch"], "aie2");
    assert_eq!(s[0]["kernels"][1]["name"], "b");
    assert_eq!(s[0]["kernels"][1]["kind"], "PdiInsts");
    assert_eq!(s[0]["kernels"][1]["num_cols"], 4);
    assert_eq!(s[0]["kernels"][1]["kernarg_size"], 32);
    assert_eq!(s[0]["kernels"][1]["pdi"]["bytes"], 80);
    assert_eq!(
        s[0]["kernels"][0]["insts"], s[0]["kernels"][1]["insts"],
        "one copy of identical blobs"
    );
    let k = &s[1]["kernels"][0];
    assert_eq!(
        (k["kind"].as_str(), k["num_cols"].as_u64()),
        (Some("FullElf"), Some(1))
    );
    assert_eq!(k["full_elf"]["arg_count"], 3);
    assert_eq!(k["full_elf"]["pdis"][0]["name"], ".pdi");
    assert_eq!(k["full_elf"]["sites"][0]["pdi"], ".pdi");
    let text = stdout(&ok(npuctl(&["inspect", &p("all.hsaco")])));
    assert!(
        text.contains("section aie2p")
            && text.contains("main:sequence")
            && text.contains("FullElf"),
        "{text}"
    );

    // emu-design straight to an hsaco, both kinds.
    ok(npuctl(&[
        "emu-design",
        "relu",
        "--n",
        "16",
        "--format",
        "hsaco",
        "--generation",
        "npu2",
        "--out",
        &p("relu.hsaco"),
    ]));
    let v = json_of(&npuctl(&["inspect", &p("relu.hsaco"), "--json"]));
    assert_eq!(v["sections"][0]["arch"], "aie2p");
    assert_eq!(v["sections"][0]["kernels"][0]["name"], "relu");
    ok(npuctl(&[
        "emu-design",
        "noop",
        "--n",
        "16",
        "--format",
        "hsaco-full-elf",
        "--out",
        &p("noop.hsaco"),
    ]));
    let v = json_of(&npuctl(&["inspect", &p("noop.hsaco"), "--json"]));
    // Named as aiecc names a full ELF's kernel: its device is `main`.
    assert_eq!(v["sections"][0]["kernels"][0]["name"], "main:sequence");
    let o = npuctl(&[
        "emu-design",
        "noop",
        "--format",
        "full-elf",
        "--generation",
        "npu1",
        "--out",
        &p("x.elf"),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("full ELF exists for npu2 (aie2p) only"));
}

#[test]
fn hsaco_errors_a_user_reads() {
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("bad.hsaco");
    let mut bytes = EmuDesign::relu(16, DType::I32)
        .to_hsaco(npu_client::NpuGen::Npu2)
        .expect("hsaco");
    // version_major of the aie2p section, which starts right after `.shstrtab`'s 17 bytes.
    bytes[64 + 17 + 4] = 2;
    std::fs::write(&path, &bytes).expect("write");
    let o = npuctl(&["inspect", &path.display().to_string()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.hsaco: hsaco section aie2p: rule \"version_major == 1\" broken at section offset 0x4 (file offset 0x55)"),
        "{err}"
    );
    let o = npuctl(&[
        "pack",
        "--out",
        &tmp.path().join("x.hsaco").display().to_string(),
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to pack"));
    let o = npuctl(&[
        "pack",
        "--out",
        &tmp.path().join("x.hsaco").display().to_string(),
        "--name",
        "a",
        "--pdi",
        &path.display().to_string(),
        "--insts",
        &path.display().to_string(),
        "--num-cols",
        "1",
    ]);
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("is not a TXN stream this tool reads; give --arch")
    );
}

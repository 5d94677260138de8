//! A gRPC C-core client (Python's grpcio) against the real daemon on its Unix socket:
//! `tests/grpcio/client.py`, with grpcio and protobuf from the tests' own Python environment
//! (`npud_e2e::python`).
//!
//! Without a Python 3.11 or newer the test is reported as ignored (tests/build.rs looks for it).

#![forbid(unsafe_code)]

use std::process::Command;

use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};
use npud_e2e::{Daemon, Options};

const N: u32 = 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_python),
    ignore = "no Python 3.11 or newer (python3): the grpcio client is not run"
)]
async fn grpcio_calls_npud_on_the_unix_socket_with_default_authority_set_and_gets_a_hint_without() {
    let python = npud_e2e::python::venv_python();
    let d = Daemon::start(Options::default());
    let dir = tempfile::tempdir().unwrap();
    let descriptors = dir.path().join("npud.desc");
    std::fs::write(&descriptors, npu_proto::FILE_DESCRIPTOR_SET).unwrap();
    let design = EmuDesign::vector_scalar_add(N, DType::I32, 1);
    let (pdi, insts) = (dir.path().join("main.pdi"), dir.path().join("insts.bin"));
    std::fs::write(&pdi, design.to_pdi()).unwrap();
    // The daemon's default emulator models npu2.
    std::fs::write(&insts, design.insts(NpuGen::Npu2)).unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/grpcio/client.py");
    let out = tokio::task::spawn_blocking({
        let args = [
            script.to_owned(),
            d.socket.display().to_string(),
            descriptors.display().to_string(),
            pdi.display().to_string(),
            insts.display().to_string(),
        ];
        move || Command::new(python).args(args).output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client.py: {stdout}\n{stderr}");
    let seen: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("client.py printed no JSON ({e}): {stdout}\n{stderr}"));

    // Defaults: refused by the HTTP/2 layer, and the daemon says what to set.
    assert_eq!(seen["default_authority_refused"], true, "{seen}");
    let log = d.stderr();
    let hints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("grpc.default_authority"))
        .collect();
    assert_eq!(hints.len(), 1, "one hint, logged once: {log}");
    assert!(hints[0].contains("WARN"), "{}", hints[0]);
    assert!(
        hints[0].contains("grpcurl: -authority localhost"),
        "the hint names grpcurl's flag too: {}",
        hints[0]
    );
    assert!(
        hints[0].contains("%2F"),
        "the refused authority: {}",
        hints[0]
    );

    // With grpc.default_authority: every call as documented.
    assert_eq!(seen["health"], "0801", "SERVING: {seen}");
    assert_eq!(seen["backend"], "emulator", "{seen}");
    assert_eq!(seen["generation"], "npu2", "{seen}");
    assert_eq!(seen["no_session"], "UNAUTHENTICATED", "{seen}");
    assert_eq!(seen["bytes_written"], u64::from(N) * 4, "{seen}");
    assert_eq!(seen["verified"], N, "{seen}");
    assert_eq!(seen["unknown_tensor"], "NOT_FOUND", "{seen}");
    assert_eq!(seen["dispatches"], 1, "{seen}");
}

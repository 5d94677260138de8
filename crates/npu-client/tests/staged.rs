//! Runtimes that export no tensor memory (every emulator profile but the newest, as the
//! runtimes they model): the client's local tensors still share memory by fd, staged by the
//! daemon around each dispatch, and `npuctl status` says so.

mod common;

use std::process::Command;

use common::Daemon;
use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::{Program, blocking};

fn status(d: &Daemon, json: bool) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_npuctl"));
    cmd.args(["status", "--addr", &d.unix()])
        .env_remove("NPUD_ADDR");
    if json {
        cmd.arg("--json");
    }
    let o = cmd.output().expect("npuctl runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn local_tensors_work(profile: &str, args: &[&str], sharing: &str) {
    let mut all = vec!["--emulator-profile", profile];
    all.extend_from_slice(args);
    let d = Daemon::start_with_args(10_000, &all);
    let client = blocking::Client::connect(Some(&d.unix())).expect("connect");
    assert!(
        client.is_local(),
        "a Unix-socket client shares tensors by fd"
    );
    assert_eq!(client.as_async().device().tensor_sharing, sharing);
    let p = Program::emulated(
        &EmuDesign::vector_scalar_add(1024, DType::I32, 5),
        client.generation(),
    )
    .expect("program");
    let mut a = client.alloc::<i32>(1024).expect("a");
    let mut b = client.alloc::<i32>(1024).expect("b");
    for (x, v) in a.as_mut_slice().iter_mut().zip(0..) {
        *x = v;
    }
    for _ in 0..3 {
        client.dispatch(&p, &[&a], &mut [&mut b]).expect("dispatch");
    }
    let want: Vec<i32> = (5..1029).collect();
    assert_eq!(b.as_slice(), &want[..], "{profile}");

    let plain = status(&d, false);
    let json: serde_json::Value = serde_json::from_str(&status(&d, true)).expect("JSON");
    assert_eq!(json["device"]["tensor_sharing"], sharing, "{json}");
    assert_eq!(json["device"]["emulator_profile"], profile, "{json}");
    if sharing == "staged" {
        assert!(
            plain.contains("staged: local clients get a memfd"),
            "{plain}"
        );
        assert!(plain.contains("no export works"), "{plain}");
    } else {
        assert!(plain.contains("in place (vmem-export)"), "{plain}");
    }
    assert!(
        plain.contains(&format!("emulator profile {profile}")),
        "{plain}"
    );
}

#[test]
fn local_tensors_are_staged_where_the_runtime_exports_none() {
    // `packet_abi = "auto"` cannot tell late 2025's packet form: its users name it.
    local_tensors_work("rocr-late-2025", &["--packet-abi", "g1b"], "staged");
    local_tensors_work("rocr-g2-2026-05", &[], "staged");
    local_tensors_work("rocm-7.0", &["--generation", "npu2"], "staged");
}

#[test]
fn local_tensors_are_shared_in_place_on_the_newest_runtime() {
    local_tensors_work("rocr-newest", &[], "vmem-export");
}

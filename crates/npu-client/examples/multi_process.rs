//! Several processes sharing one daemon. The example starts copies of itself; each opens its own
//! session with the blocking client, allocates its own tensors (shared by fd on the Unix socket),
//! runs vector_scalar_add a number of times with its own inputs and checks every output. The
//! daemon serializes their work on the one device queue, serving the sessions round-robin.
//!
//! ```text
//! cargo run -p npu-client --example multi_process [PROCESSES]   # default 4
//! ```
//!
//! Prints `PASS!` when every process got every output right.

use std::process::{Command, ExitCode, Stdio};

use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::{ClientError, Program, blocking::Client};

const N: u32 = 4096;
const ROUNDS: i32 = 32;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let id: i32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
        return match child(id) {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("process {id}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let n: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("cannot find this executable");
        return ExitCode::FAILURE;
    };
    let children: Vec<_> = (1..=n)
        .filter_map(|id| {
            Command::new(&exe)
                .args(["--child", &id.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| eprintln!("starting process {id}: {e}"))
                .ok()
        })
        .collect();
    let mut ok = children.len() == n as usize;
    for c in children {
        match c.wait_with_output() {
            Ok(out) => {
                print!("{}", String::from_utf8_lossy(&out.stdout));
                ok &= out.status.success();
            }
            Err(e) => {
                eprintln!("waiting for a process: {e}");
                ok = false;
            }
        }
    }
    if ok {
        println!("\nPASS!\n");
        ExitCode::SUCCESS
    } else {
        println!("failed.");
        ExitCode::FAILURE
    }
}

fn child(id: i32) -> Result<String, ClientError> {
    let client = Client::connect(None)?;
    let program = Program::emulated(
        &EmuDesign::vector_scalar_add(N, DType::I32, 1),
        client.generation(),
    )?;
    let mut input = client.alloc::<i32>(N as usize)?;
    let mut output = client.alloc::<i32>(N as usize)?;
    let mut device = std::time::Duration::ZERO;
    for round in 0..ROUNDS {
        for (x, i) in input.as_mut_slice().iter_mut().zip(0..) {
            *x = id * 1_000_000 + round * 10_000 + i;
        }
        device += client
            .dispatch(&program, &[&input], &mut [&mut output])?
            .device;
        if input
            .as_slice()
            .iter()
            .zip(output.as_slice())
            .any(|(x, y)| *y != x + 1)
        {
            return Err(ClientError::Invalid(format!(
                "round {round}: a wrong output"
            )));
        }
    }
    let line = format!(
        "process {id} (pid {}, session {}): {ROUNDS} dispatches, tensors {}, device {device:?}, all right",
        std::process::id(),
        client.session_id(),
        if input.is_shared() {
            "shared by fd"
        } else {
            "staged"
        },
    );
    drop((input, output));
    client.close()?;
    Ok(line)
}

//! IRON's vector_scalar_add through npud: `out[i] = in[i] + 1` over 1024 int32 elements.
//!
//! ```text
//! npud --backend emulator &                     # or a daemon on an NPU
//! cargo run -p npu-client --example vector_scalar_add [DESIGN_DIR]
//! ```
//!
//! With no DESIGN_DIR it writes an emulated design for the daemon's device into a temporary
//! directory. `NPUD_ADDR` selects the daemon (default: its default socket). Prints `PASS!` and
//! exits 0 when every element is right, as IRON's test.cpp does, and `failed.` with exit 1
//! otherwise.

use std::process::ExitCode;

use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ClientError, Program};

const N: u32 = 1024;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => {
            println!("\nPASS!\n");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("failed.");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("vector_scalar_add: {e}");
            println!("failed.");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, ClientError> {
    let client = Client::connect(None).await?;
    let scratch = tempfile::tempdir().map_err(|source| ClientError::Io {
        path: std::env::temp_dir(),
        source,
    })?;
    let dir = match std::env::args_os().nth(1) {
        Some(d) => d.into(),
        None => {
            EmuDesign::vector_scalar_add(N, DType::I32, 1)
                .write_dir(scratch.path(), client.generation())?;
            scratch.path().to_path_buf()
        }
    };
    let program = Program::from_dir(&dir)?;

    let mut input = client.alloc::<i32>(N as usize).await?;
    let mut output = client.alloc::<i32>(N as usize).await?;
    for (x, v) in input.as_mut_slice().iter_mut().zip(1..) {
        *x = v;
    }
    let t = client
        .dispatch(&program, &[&input], &mut [&mut output])
        .await?;
    println!(
        "vector_scalar_add: {N} x i32 on {} ({} tensors), queue {:?}, device {:?}",
        client.address(),
        if input.is_shared() {
            "fd-shared"
        } else {
            "staged"
        },
        t.queue,
        t.device
    );

    let mut errors = 0;
    for (i, (&a, &b)) in input.as_slice().iter().zip(output.as_slice()).enumerate() {
        if b != a + 1 {
            if errors < 10 {
                eprintln!("error: out[{i}] = {b}, expected {}", a + 1);
            }
            errors += 1;
        }
    }
    client.close().await?;
    Ok(errors == 0)
}

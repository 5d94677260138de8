//! A chain, as IRON's runlist test: run0 computes out0 = in + 1, run1 computes out1 = out0 + 1,
//! submitted together and run back to back on the device.
//!
//! ```text
//! cargo run -p npu-client --example chain        # NPUD_ADDR selects the daemon
//! ```
//!
//! Prints `PASS!` when out0[i] = i + 2 and out1[i] = i + 3 for in = arange(1, N + 1).

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
            eprintln!("chain: {e}");
            println!("failed.");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, ClientError> {
    let client = Client::connect(None).await?;
    let add_one = Program::emulated(
        &EmuDesign::vector_scalar_add(N, DType::I32, 1),
        client.generation(),
    )?;
    let input: Vec<i32> = (1..).take(N as usize).collect();
    let a = client.tensor_from(&input).await?;
    let mut out0 = client.alloc::<i32>(N as usize).await?;
    let mut out1 = client.alloc::<i32>(N as usize).await?;

    // Each tensor joins the chain once: `read` for what no link writes, `write` for what a
    // link may write (out0 is written by link 0 and read by link 1).
    let mut chain = client.chain();
    let (i, o0, o1) = (
        chain.read(&a),
        chain.write(&mut out0),
        chain.write(&mut out1),
    );
    chain.then(&add_one, &[i, o0]).then(&add_one, &[o0, o1]);
    let r = chain.run().await?.ok()?;
    println!(
        "chain: {} links on {} doorbell ring(s), queue {:?}, device {:?}",
        r.completed, r.doorbells, r.queue, r.device
    );
    let ok = input
        .iter()
        .zip(out0.as_slice().iter().zip(out1.as_slice()))
        .all(|(i, (o0, o1))| *o0 == i + 1 && *o1 == i + 2);
    client.close().await?;
    Ok(ok)
}

//! `npuctl __demo-worker`: one of the demo's concurrent client processes. It opens its own
//! session, allocates its tensors (shared by fd on the Unix socket), runs a design a number of
//! times with its own inputs, checks every output, prints one line and exits 0 or 1.

use std::path::PathBuf;

use npu_client::{Client, ClientError, Program};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The daemon's socket.
    #[arg(long)]
    socket: String,
    /// A vector_scalar_add design (out = in + scalar).
    #[arg(long)]
    design: PathBuf,
    /// The worker's number, used in its inputs.
    #[arg(long)]
    id: u32,
    /// Dispatches to run.
    #[arg(long, default_value_t = 16)]
    dispatches: u32,
}

pub async fn run(a: &Args) -> crate::CmdResult {
    match work(a).await {
        Ok(line) => {
            println!("{line}");
            Ok(())
        }
        Err(e) => {
            println!("client {} (pid {}): FAILED: {e}", a.id, std::process::id());
            Err(e)
        }
    }
}

async fn work(a: &Args) -> Result<String, String> {
    let e = |e: ClientError| e.to_string();
    let program = Program::from_dir(&a.design).map_err(e)?;
    let d = program
        .emulated_design()
        .cloned()
        .ok_or("the worker needs an emulated vector_scalar_add design")?;
    let scalar = i32::try_from(d.scalar).map_err(|x| x.to_string())?;
    let len = usize::try_from(d.n).map_err(|x| x.to_string())?;
    let client = Client::connect(Some(&a.socket)).await.map_err(e)?;
    let mut input = client.alloc::<i32>(len).await.map_err(e)?;
    let mut output = client.alloc::<i32>(len).await.map_err(e)?;
    let base = i32::try_from(a.id).map_err(|x| x.to_string())? * 1_000_000;
    let mut device = std::time::Duration::ZERO;
    for round in 0..a.dispatches {
        let round = i32::try_from(round).map_err(|x| x.to_string())?;
        for (x, i) in input.as_mut_slice().iter_mut().zip(0..) {
            *x = base + round * 1000 + i;
        }
        device += client
            .dispatch(&program, &[&input], &mut [&mut output])
            .await
            .map_err(e)?
            .device;
        if let Some((i, (x, y))) = input
            .as_slice()
            .iter()
            .zip(output.as_slice())
            .enumerate()
            .find(|(_, (x, y))| **y != **x + scalar)
        {
            return Err(format!(
                "dispatch {round}: out[{i}] = {y}, expected {}",
                x + scalar
            ));
        }
    }
    let line = format!(
        "client {} (pid {}, session {}): {} dispatches of {}, tensors {}, device time {:?}, all {} outputs right",
        a.id,
        std::process::id(),
        client.session_id(),
        a.dispatches,
        program.name(),
        if input.is_shared() {
            "shared by fd"
        } else {
            "staged"
        },
        device,
        a.dispatches
    );
    drop((input, output));
    client.close().await.map_err(e)?;
    Ok(line)
}

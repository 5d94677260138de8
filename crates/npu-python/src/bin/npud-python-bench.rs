//! `npud-python-bench`: the Rust client's side of the Python benchmark (`bench/bench.py`).
//!
//! Against a running daemon, measures unary dispatch through npu-client (per-call latency
//! percentiles) and pipelined dispatch (time per dispatch over a `Submit` stream), with the
//! same design and tensors the Python side uses, and prints one JSON object.

use std::time::Instant;

use npu_artifacts::emu::EmuDesign;
use npu_client::{Client, Program, TensorArg};

fn usage() -> ! {
    eprintln!(
        "usage: npud-python-bench ADDR ITERATIONS PIPELINED DEPTH\n  \
         ADDR: the daemon's address (unix:PATH); ITERATIONS: unary dispatches measured;\n  \
         PIPELINED: dispatches in the pipelined row; DEPTH: dispatches in flight"
    );
    std::process::exit(2)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round();
    // The index is in range: p is in [0, 1] and the slice is not empty.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    sorted[i as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), npu_client::ClientError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 4 {
        usage();
    }
    let n: usize = args[1].parse().unwrap_or_else(|_| usage());
    let piped: usize = args[2].parse().unwrap_or_else(|_| usage());
    let depth: usize = args[3].parse().unwrap_or_else(|_| usage());
    let client = Client::connect(Some(&args[0])).await?;
    let design = EmuDesign::by_name("noop", 4096, None)?;
    let program = Program::emulated(&design, client.generation())?;
    let t: Vec<_> = vec![
        client.alloc::<u8>(4096).await?,
        client.alloc::<u8>(4096).await?,
        client.alloc::<u8>(4096).await?,
    ];
    // `noop` only reads its arguments, so every tensor goes in as read.
    let refs: Vec<&dyn TensorArg> = t.iter().map(|x| x as &dyn TensorArg).collect();
    for _ in 0..n / 10 + 10 {
        client.dispatch(&program, &refs, &mut []).await?;
    }
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        client.dispatch(&program, &refs, &mut []).await?;
        lat.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    lat.sort_unstable();
    let mut p = client.pipeline(depth).await?;
    for _ in 0..depth * 2 {
        p.submit(&program, &refs, Vec::new()).await?;
    }
    while p.next_completion().await?.is_some() {}
    let t0 = Instant::now();
    for _ in 0..piped {
        p.submit(&program, &refs, Vec::new()).await?;
    }
    let done = p.finish().await?;
    let total = t0.elapsed();
    if let Some(bad) = done.into_iter().find_map(|c| c.result.err()) {
        return Err(bad);
    }
    let per = total / u32::try_from(piped.max(1)).unwrap_or(u32::MAX);
    println!(
        "{}",
        serde_json::json!({
            "unary_p50_ns": percentile(&lat, 0.5),
            "unary_p90_ns": percentile(&lat, 0.9),
            "unary_p99_ns": percentile(&lat, 0.99),
            "pipelined_ns_per_dispatch": u64::try_from(per.as_nanos()).unwrap_or(u64::MAX),
            "pipelined_total_s": total.as_secs_f64(),
        })
    );
    Ok(())
}

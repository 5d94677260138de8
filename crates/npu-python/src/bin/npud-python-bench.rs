//! `npud-python-bench`: the Rust client's side of the Python benchmark (`bench/bench.py`).
//!
//! Connects to a running daemon once, then answers one command a line on stdin with one JSON
//! object a line on stdout, so the benchmark can interleave Rust and Python rows slice by slice
//! against the same daemon (this machine's speed moves between minutes):
//!
//! - `unary N`: N unary dispatches through npu-client (after N/10 + 10 warm-up calls); per-call
//!   latency percentiles.
//! - `pipelined N`: N dispatches through one `Submit` stream kept open across commands; time
//!   per dispatch.
//!
//! Both use the same design and tensors the Python side uses.

use std::io::{BufRead, Write};
use std::time::Instant;

use npu_artifacts::emu::EmuDesign;
use npu_client::{Client, ClientError, Pipeline, Program, TensorArg};

fn usage() -> ! {
    eprintln!(
        "usage: npud-python-bench ADDR DEPTH\n  \
         ADDR: the daemon's address (unix:PATH); DEPTH: dispatches in flight when pipelined.\n  \
         Then one command a line on stdin: `unary N` or `pipelined N`; one JSON line each."
    );
    std::process::exit(2)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round();
    // The index is in range: p is in [0, 1] and the slice is not empty.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    sorted[i as usize]
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn unary(
    client: &Client,
    program: &Program,
    refs: &[&dyn TensorArg],
    n: usize,
) -> Result<serde_json::Value, ClientError> {
    for _ in 0..n / 10 + 10 {
        client.dispatch(program, refs, &mut []).await?;
    }
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        client.dispatch(program, refs, &mut []).await?;
        lat.push(nanos(t0.elapsed()));
    }
    lat.sort_unstable();
    Ok(serde_json::json!({
        "unary_p50_ns": percentile(&lat, 0.5),
        "unary_p90_ns": percentile(&lat, 0.9),
        "unary_p99_ns": percentile(&lat, 0.99),
    }))
}

async fn pipelined<'a>(
    p: &mut Pipeline<'a>,
    program: &Program,
    refs: &[&'a dyn TensorArg],
    n: usize,
) -> Result<serde_json::Value, ClientError> {
    let t0 = Instant::now();
    for _ in 0..n {
        p.submit(program, refs, Vec::new()).await?;
    }
    while let Some(c) = p.next_completion().await? {
        c.result?;
    }
    let total = t0.elapsed();
    let per = total / u32::try_from(n.max(1)).unwrap_or(u32::MAX);
    Ok(serde_json::json!({
        "pipelined_ns_per_dispatch": nanos(per),
        "pipelined_total_s": total.as_secs_f64(),
    }))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), ClientError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 2 {
        usage();
    }
    let depth: usize = args[1].parse().unwrap_or_else(|_| usage());
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
    let mut pipe = client.pipeline(depth).await?;
    pipelined(&mut pipe, &program, &refs, depth * 2).await?;
    let mut lines = std::io::stdin().lock().lines();
    while let Some(Ok(line)) = lines.next() {
        let mut words = line.split_whitespace();
        let (cmd, n) = (words.next(), words.next().and_then(|w| w.parse().ok()));
        let out = match (cmd, n) {
            (Some("unary"), Some(n)) => unary(&client, &program, &refs, n).await?,
            (Some("pipelined"), Some(n)) => pipelined(&mut pipe, &program, &refs, n).await?,
            _ => usage(),
        };
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{out}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            break;
        }
    }
    drop(pipe.finish().await?);
    Ok(())
}

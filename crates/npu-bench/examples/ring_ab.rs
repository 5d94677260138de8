//! Two (or more) running daemons side by side: one client process attaches a dispatch ring to
//! each and alternates batches of unary fast-path dispatches between them, round after round,
//! then prints each daemon's median of its batches' p50s. Rounds that alternate within seconds
//! see the machine alike, so a difference between two builds of npud shows where separate
//! `npuctl bench` runs (whose rows swing by tens of percent between minutes) cannot tell.
//!
//! ```text
//! npud --backend emulator --socket /tmp/a.sock --fd-socket /tmp/a.fd --state-dir /tmp/a &
//! /other/build/npud --backend emulator --socket /tmp/b.sock --fd-socket /tmp/b.fd --state-dir /tmp/b &
//! cargo run --release -p npu-bench --example ring_ab -- 10 /tmp/a.sock /tmp/b.sock
//! ```

use std::path::Path;

use npu_bench::client::{Iters, Session, connect_unix};
use npu_bench::fastpath::BenchRing;
use npu_bench::rows::Ready;

/// Dispatches measured per batch (after [`WARMUP`]).
const BATCH: usize = 50_000;
const WARMUP: usize = 2_000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args
        .next()
        .ok_or("usage: ring_ab ROUNDS SOCKET...")?
        .parse()?;
    let sockets: Vec<String> = args.collect();
    if sockets.is_empty() {
        return Err("usage: ring_ab ROUNDS SOCKET...".into());
    }
    let mut sides = Vec::new();
    for s in &sockets {
        let ready = Ready::new(
            Session::open(connect_unix(Path::new(s)).await?, "ring-ab").await?,
            true,
        )
        .await?;
        let ring = BenchRing::attach(&mut ready.session.clone()).await?;
        sides.push((ready, ring, Vec::new()));
    }
    let it = Iters {
        warmup: WARMUP,
        measured: BATCH,
    };
    for _ in 0..rounds {
        for (ready, ring, p50s) in &mut sides {
            let (mut ns, _) = ring.unary(&ready.request, it)?;
            ns.sort_unstable();
            p50s.push(ns[ns.len() / 2]);
        }
    }
    for (s, (_, _, p50s)) in sockets.iter().zip(&sides) {
        let mut sorted = p50s.clone();
        sorted.sort_unstable();
        println!(
            "{s}: median of batch p50s {} ns (min {} ns); by round {p50s:?}",
            sorted[sorted.len() / 2],
            sorted[0]
        );
    }
    Ok(())
}

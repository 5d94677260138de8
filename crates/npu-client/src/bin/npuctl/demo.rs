//! `npuctl demo`: the whole job in one command.
//!
//! Starts `npud --backend emulator` on private sockets, writes emulated designs, runs
//! vector_scalar_add, vector_vector_add and a matmul over the Unix socket (tensors shared by fd),
//! a chain, the same over TCP (tensors staged through the API) with identical results, several
//! client processes at once (npuctl itself, re-executed), shows the daemon's statistics, stops
//! the daemon with SIGTERM and prints `PASS!`. The daemon runs with `emulator.timing = "model"`:
//! the device times it reports are hsa-sim's timing model's, not measured on an NPU. Any failure prints `FAIL!` and exits non-zero.
//!
//! The `npud` binary is taken from `--npud`, beside this executable (where cargo puts both),
//! `$NPUD_BIN`, or `PATH`; when none has it and a cargo workspace is above the current
//! directory, it is built with `cargo build -p npud` for this executable's profile.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::local::{LocalDaemon, LocalOptions};
use npu_client::{Client, ClientError, NpuGen, Program};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Concurrent client processes.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Dispatches each client process runs.
    #[arg(long, default_value_t = 16)]
    dispatches: u32,
    /// The npud binary (default: beside npuctl, $NPUD_BIN, PATH, or built with cargo).
    #[arg(long)]
    npud: Option<PathBuf>,
    /// Keep the demo's directory (designs and the daemon's log) instead of removing it.
    #[arg(long)]
    keep: bool,
}

const STEPS: u32 = 7;

pub async fn run(a: &Args) -> crate::CmdResult {
    let npud = find_npud(a.npud.as_deref())?;
    let spinner = ProgressBar::new_spinner();
    spinner.set_message(format!("starting {}", npud.display()));
    spinner.enable_steady_tick(Duration::from_millis(100));
    // The device's time as hsa-sim's timing model gives it, so the device times shown are an
    // NPU's (modelled), not the emulator's microseconds of CPU.
    let mut opts = LocalOptions::new(&npud);
    opts.env
        .push(("NPUD_EMULATOR__TIMING".into(), "model".into()));
    let started = LocalDaemon::start(opts);
    spinner.finish_and_clear();
    let mut daemon = started.map_err(|e| e.to_string())?;
    let dir = daemon.dir().to_path_buf();
    let result = steps(a, &mut daemon, &npud, &dir).await;
    match result {
        Ok(()) => {
            println!("\nPASS!\n");
            if a.keep {
                println!("kept {}", daemon.keep_dir().display());
            }
            Ok(())
        }
        Err(e) => {
            daemon.kill();
            let log = daemon.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!("npud's last log lines:");
            for l in tail.iter().rev() {
                eprintln!("  {l}");
            }
            println!("\nFAIL! {e}\n");
            if a.keep {
                println!("kept {}", daemon.keep_dir().display());
            }
            Err("the demo failed".into())
        }
    }
}

async fn steps(a: &Args, daemon: &mut LocalDaemon, npud: &Path, dir: &Path) -> Result<(), String> {
    let e = |e: ClientError| e.to_string();
    let sock = daemon.socket().display().to_string();
    let tcp = daemon
        .http_url()
        .ok_or("the demo's daemon has no TCP port")?;

    let client = Client::connect(Some(&sock)).await.map_err(e)?;
    let info = client.device();
    step(
        1,
        &format!(
            "started npud {} ({}): {} device ({}, device time modelled: emulator.timing = \
             model) on unix:{}, also on {tcp}, in {:?}",
            info.daemon_version,
            npud_display(npud),
            info.generation,
            info.backend,
            sock,
            daemon.startup_time()
        ),
    );

    let g = client.generation();
    let designs = write_designs(dir, g)?;
    step(
        2,
        &format!(
            "wrote emulated designs for {g} in {}: vector_scalar_add (1024 x i32, +1), \
             vector_vector_add (1024 x i32), matmul (64x64x64, i16 -> i32)",
            dir.join("designs").display()
        ),
    );

    let local = examples(&client, &designs).await?;
    step(
        3,
        &format!(
            "over the Unix socket, tensors shared by fd: {}",
            local.summary
        ),
    );
    for l in &local.lines {
        println!("      {l}");
    }

    let vsa = Program::from_dir(&designs[0]).map_err(e)?;
    let input: Vec<i32> = (1..=1024).collect();
    let a0 = client.tensor_from(&input).await.map_err(e)?;
    let (mut o0, mut o1) = (
        client.alloc::<i32>(1024).await.map_err(e)?,
        client.alloc::<i32>(1024).await.map_err(e)?,
    );
    let mut chain = client.chain();
    let (i, c0, c1) = (chain.read(&a0), chain.write(&mut o0), chain.write(&mut o1));
    chain.then(&vsa, &[i, c0]).then(&vsa, &[c0, c1]);
    let r = chain.run().await.map_err(e)?.ok().map_err(e)?;
    let chain_ok = o0.as_slice().iter().zip(&input).all(|(o, i)| *o == i + 1)
        && o1.as_slice().iter().zip(&input).all(|(o, i)| *o == i + 2);
    if !chain_ok {
        return Err("the chain's outputs are wrong".into());
    }
    step(
        4,
        &format!(
            "chain of {} links (IRON's runlist: out0 = in + 1, out1 = out0 + 1) on {} doorbell \
             ring(s), modelled device time {:?}: outputs right",
            r.completed, r.doorbells, r.device
        ),
    );

    let remote_client = Client::connect(Some(&tcp)).await.map_err(e)?;
    let remote = examples(&remote_client, &designs).await?;
    if remote.outputs != local.outputs {
        return Err("TCP (staged) and Unix-socket (fd-shared) results differ".into());
    }
    step(
        5,
        &format!(
            "over TCP, tensors staged through the API: {}; identical to the fd-shared results",
            remote.summary
        ),
    );
    remote_client.close().await.map_err(e)?;

    let lines = workers(a, &sock, &designs[0]).await?;
    step(
        6,
        &format!(
            "{} client processes at once on one daemon, {} dispatches each:",
            a.clients, a.dispatches
        ),
    );
    for l in &lines {
        println!("      {l}");
    }

    println!("\ndaemon statistics (this demo's session still open):");
    crate::status::run(Some(&sock), false).await?;
    crate::programs::run(&crate::programs::Args::default(), Some(&sock), false).await?;
    crate::sessions::run(Some(&sock), false).await?;
    println!();
    drop((a0, o0, o1));
    client.close().await.map_err(e)?;

    let stopped = daemon.stop(Duration::from_secs(30)).map_err(e)?;
    let how = format!(
        "exited with {} after {:?}{}{}",
        stopped.status,
        stopped.elapsed,
        if stopped.sockets_removed {
            ", sockets removed"
        } else {
            ", sockets left behind"
        },
        if stopped.killed {
            " (killed after 30 s)"
        } else {
            ""
        }
    );
    if !stopped.clean() {
        return Err(format!("npud did not stop cleanly: {how}"));
    }
    step(7, &format!("stopped npud with SIGTERM: {how}"));
    Ok(())
}

fn step(n: u32, text: &str) {
    println!("[{n}/{STEPS}] {text}");
}

fn npud_display(p: &Path) -> String {
    p.display().to_string()
}

fn write_designs(dir: &Path, g: NpuGen) -> Result<Vec<PathBuf>, String> {
    let designs = [
        (
            "vector_scalar_add",
            EmuDesign::vector_scalar_add(1024, DType::I32, 1),
        ),
        (
            "vector_vector_add",
            EmuDesign::vector_vector_add(1024, DType::I32),
        ),
        (
            "matmul",
            EmuDesign::matmul(64, 64, 64, DType::I16, DType::I32),
        ),
    ];
    let mut out = Vec::new();
    for (name, d) in designs {
        let p = dir.join("designs").join(name);
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        d.write_dir(&p, g).map_err(|e| e.to_string())?;
        out.push(p);
    }
    Ok(out)
}

struct Examples {
    summary: String,
    lines: Vec<String>,
    outputs: Vec<Vec<u8>>,
}

/// vector_scalar_add, vector_vector_add and matmul, each checked against the host.
async fn examples(client: &Client, designs: &[PathBuf]) -> Result<Examples, String> {
    let e = |e: ClientError| e.to_string();
    let (vsa, vva, mm) = (
        Program::from_dir(&designs[0]).map_err(e)?,
        Program::from_dir(&designs[1]).map_err(e)?,
        Program::from_dir(&designs[2]).map_err(e)?,
    );
    let mut lines = Vec::new();
    let mut outputs = Vec::new();

    let input: Vec<i32> = (1..=1024).collect();
    let a = client.tensor_from(&input).await.map_err(e)?;
    let mut b = client.alloc::<i32>(1024).await.map_err(e)?;
    let r = client
        .dispatch(&vsa, &[&a], &mut [&mut b])
        .await
        .map_err(e)?;
    check(
        b.as_slice().iter().zip(&input).all(|(o, i)| *o == i + 1),
        "vector_scalar_add",
    )?;
    lines.push(format!(
        "vector_scalar_add: out[i] = in[i] + 1 for 1024 elements: right (queue {:?}, modelled device time {:?})",
        r.queue, r.device
    ));
    outputs.push(bytes(b.as_slice()));

    let x: Vec<i32> = (0..1024).map(|i| (i * 7919) % 100).collect();
    let y: Vec<i32> = (0..1024).map(|i| (i * 104_729) % 100).collect();
    let (tx, ty, mut tz) = (
        client.tensor_from(&x).await.map_err(e)?,
        client.tensor_from(&y).await.map_err(e)?,
        client.alloc::<i32>(1024).await.map_err(e)?,
    );
    let r = client
        .dispatch(&vva, &[&tx, &ty], &mut [&mut tz])
        .await
        .map_err(e)?;
    check(
        tz.as_slice()
            .iter()
            .zip(x.iter().zip(&y))
            .all(|(c, (p, q))| *c == p + q),
        "vector_vector_add",
    )?;
    lines.push(format!(
        "vector_vector_add: c = a + b for 1024 elements: right (modelled device time {:?})",
        r.device
    ));
    outputs.push(bytes(tz.as_slice()));

    let n = 64_usize;
    let ma: Vec<i16> = (0..n * n)
        .map(|i| i16::try_from(i % 31).unwrap_or(0) - 15)
        .collect();
    let mb: Vec<i16> = (0..n * n)
        .map(|i| i16::try_from(i % 23).unwrap_or(0) - 11)
        .collect();
    let (ta, tb, mut tc) = (
        client.tensor_from(&ma).await.map_err(e)?,
        client.tensor_from(&mb).await.map_err(e)?,
        client.alloc::<i32>(n * n).await.map_err(e)?,
    );
    let r = client
        .dispatch(&mm, &[&ta, &tb], &mut [&mut tc])
        .await
        .map_err(e)?;
    let mut want = vec![0_i32; n * n];
    for row in 0..n {
        for col in 0..n {
            want[row * n + col] = (0..n)
                .map(|k| i32::from(ma[row * n + k]) * i32::from(mb[k * n + col]))
                .sum();
        }
    }
    check(tc.as_slice() == want.as_slice(), "matmul")?;
    lines.push(format!(
        "matmul: C = A @ B, 64x64x64, i16 -> i32: right (modelled device time {:?})",
        r.device
    ));
    outputs.push(bytes(tc.as_slice()));
    Ok(Examples {
        summary: "3 designs, every output right".into(),
        lines,
        outputs,
    })
}

fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: the outputs are wrong"))
    }
}

/// Runs the client processes at once and returns their lines.
async fn workers(a: &Args, sock: &str, design: &Path) -> Result<Vec<String>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding npuctl itself: {e}"))?;
    let bar = ProgressBar::new(u64::from(a.clients));
    bar.set_style(
        ProgressStyle::with_template("      {spinner} client processes {pos}/{len} [{bar:30}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut running = Vec::new();
    for id in 1..=a.clients {
        let child = tokio::process::Command::new(&exe)
            .arg("__demo-worker")
            .arg("--socket")
            .arg(sock)
            .arg("--design")
            .arg(design)
            .arg("--id")
            .arg(id.to_string())
            .arg("--dispatches")
            .arg(a.dispatches.to_string())
            .env_remove("NPUD_ADDR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting client process {id}: {e}"))?;
        running.push((id, child));
    }
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for (id, child) in running {
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .map_err(|_| format!("client process {id} did not finish in 120 s"))?
            .map_err(|e| format!("client process {id}: {e}"))?;
        bar.inc(1);
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() {
            failed.push(format!(
                "client {id} exited with {}: {text} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        lines.push(text);
    }
    bar.finish_and_clear();
    if failed.is_empty() {
        Ok(lines)
    } else {
        Err(failed.join("; "))
    }
}

/// Finds the npud binary, building it when it is nowhere and a cargo workspace is at hand.
fn find_npud(explicit: Option<&Path>) -> Result<PathBuf, String> {
    npu_client::binaries::find_binary(&npu_client::binaries::NPUD, explicit)
        .map_err(|e| e.to_string())
}

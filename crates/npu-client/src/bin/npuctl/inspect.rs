//! `npuctl inspect DESIGN_DIR`: what a design's files are, and its instruction stream op by op.
//! `npuctl inspect FILE.hsaco` goes to [`crate::inspect_hsaco`].

use std::path::PathBuf;

use npu_client::artifacts::design::{self, Design};
use npu_client::artifacts::pdi::PdiKind;
use npu_client::artifacts::txn;
use serde_json::{Value, json};

use crate::output::{self, kv_table};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The design directory (main.pdi + insts.bin, or the same under build/), or an .hsaco file.
    dir: PathBuf,
    /// Print only the summary, not the op listing.
    #[arg(long)]
    summary: bool,
}

pub fn run(a: &Args, json: bool) -> crate::CmdResult {
    if crate::inspect_hsaco::is_hsaco_file(&a.dir) {
        return crate::inspect_hsaco::run(&a.dir, json);
    }
    let d = match Design::open(&a.dir) {
        Ok(d) => d,
        Err(e) => {
            // Explain a malformed stream as far as it decodes.
            for dir in [a.dir.clone(), a.dir.join("build")] {
                if let Ok(bytes) = std::fs::read(dir.join(design::INSTS_NAME)) {
                    eprintln!("{}:", dir.join(design::INSTS_NAME).display());
                    eprint!("{}", txn::explain(&bytes));
                    break;
                }
            }
            return Err(e.to_string());
        }
    };
    let p = &d.program;
    let listing = txn::listing(&d.insts).map_err(|e| e.to_string())?;
    let (kind, pdi_detail) = describe_pdi(&d.kind);
    if json {
        output::print_json(&json!({
            "dir": d.files.dir.display().to_string(),
            "pdi": {
                "path": d.files.pdi_path.display().to_string(),
                "bytes": d.pdi.len(),
                "kind": kind,
                "detail": pdi_detail,
            },
            "insts": {
                "path": d.files.insts_path.display().to_string(),
                "bytes": d.insts.len(),
                "version": format!("{}.{}", p.version.0, p.version.1),
                "generation": p.generation.to_string(),
                "rows": p.rows,
                "columns": p.cols,
                "mem_tile_rows": p.mem_tile_rows,
                "op_count": p.op_count,
                "arg_count": p.arg_count(),
                "min_arg_bytes": p.min_arg_sizes(),
            },
            "listing": if a.summary { Value::Null } else {
                Value::Array(listing.lines().map(|l| json!(l)).collect())
            },
        }));
        return Ok(());
    }
    let args: Vec<String> = p
        .min_arg_sizes()
        .iter()
        .enumerate()
        .map(|(i, b)| format!("arg {i} >= {b} B"))
        .collect();
    let t = kv_table(vec![
        ("design", d.files.dir.display().to_string()),
        (
            "main.pdi",
            format!("{} bytes, {kind}: {pdi_detail}", d.pdi.len()),
        ),
        (
            "insts.bin",
            format!(
                "{} bytes, TXN {}.{} for {}, {} ops, {} columns",
                d.insts.len(),
                p.version.0,
                p.version.1,
                p.generation,
                p.op_count,
                p.cols
            ),
        ),
        ("buffers", args.join(", ")),
    ]);
    println!("{t}");
    if !a.summary {
        println!();
        print!("{listing}");
    }
    Ok(())
}

fn describe_pdi(kind: &PdiKind) -> (&'static str, String) {
    match kind {
        PdiKind::Emulated(e) => {
            let params = if e.kernel == npu_client::artifacts::emu::EmuKernel::Matmul {
                format!("m={} k={} n={}", e.m, e.k, e.n)
            } else {
                format!("n={}", e.n)
            };
            let scalar = if e.scalar == 0 {
                String::new()
            } else {
                format!(" scalar={}", e.scalar)
            };
            (
                "emulated",
                format!(
                    "kernel {} {}->{} {params}{scalar}, {} buffers",
                    e.kernel, e.dtype_in, e.dtype_out, e.num_args
                ),
            )
        }
        PdiKind::Partial(s) => (
            "partial PDI",
            format!(
                "{} images, {} partitions, IDCODE {:#010x}, checksums {} (needs the NPU)",
                s.images.len(),
                s.partitions.len(),
                s.idcode,
                if s.all_checksums_ok() { "ok" } else { "BAD" }
            ),
        ),
        PdiKind::Xclbin(_) => ("xclbin", "the HSA path needs main.pdi".into()),
    }
}

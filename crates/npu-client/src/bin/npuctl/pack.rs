//! `npuctl pack --out FILE.hsaco`: write an AIE hsaco from PDI + insts.bin kernels and full ELFs.

use std::path::{Path, PathBuf};

use npu_client::NpuGen;
use npu_client::artifacts::hsaco::{Hsaco, HsacoBuilder, PdiInstsKernel};
use npu_client::artifacts::txn::TxnProgram;
use serde_json::json;

use crate::output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The hsaco to write.
    #[arg(long)]
    out: PathBuf,
    /// Kernel name (repeat once per PdiInsts kernel; --pdi and --insts pair with it by position).
    #[arg(long = "name")]
    names: Vec<String>,
    /// The kernel's main.pdi (one per --name).
    #[arg(long = "pdi")]
    pdis: Vec<PathBuf>,
    /// The kernel's insts.bin (one per --name).
    #[arg(long = "insts")]
    insts: Vec<PathBuf>,
    /// aie2 (npu1) or aie2p (npu2): once for all kernels or once per --name (default: the
    /// generation in insts.bin's TXN header).
    #[arg(long = "arch")]
    arches: Vec<String>,
    /// Partition column count: once for all or once per --name (required for PdiInsts kernels;
    /// the PDI and insts.bin do not record it). For --elf, a cross-check of its note.
    #[arg(long = "num-cols")]
    num_cols: Vec<u32>,
    /// kernarg size in bytes: once for all or once per --name (default: 16 × the buffer
    /// arguments insts.bin patches).
    #[arg(long = "kernarg-size")]
    kernarg_sizes: Vec<u32>,
    /// A full ELF (aiecc --get-full-elf): every kernel in it becomes a FullElf kernel in the aie2p
    /// section, with the column count from its .note.xrt.configuration. Repeatable.
    #[arg(long = "elf")]
    elves: Vec<PathBuf>,
}

fn read(p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// The i-th value of an option given once for all or once per kernel.
fn nth<'a, T>(v: &'a [T], i: usize, n: usize, flag: &str) -> Result<Option<&'a T>, String> {
    match v.len() {
        0 => Ok(None),
        1 => Ok(v.first()),
        len if len == n => Ok(v.get(i)),
        len => Err(format!(
            "{flag} is given {len} times; expected once or once per --name ({n})"
        )),
    }
}

pub fn run(a: &Args, json: bool) -> crate::CmdResult {
    let n = a.names.len();
    if a.pdis.len() != n || a.insts.len() != n {
        return Err(format!(
            "{n} --name, {} --pdi and {} --insts; expected one --pdi and one --insts per --name",
            a.pdis.len(),
            a.insts.len()
        ));
    }
    if n == 0 && a.elves.is_empty() {
        return Err("nothing to pack: give --name/--pdi/--insts or --elf".into());
    }
    let mut b = HsacoBuilder::new();
    for i in 0..n {
        let name = &a.names[i];
        let insts = read(&a.insts[i])?;
        let txn = TxnProgram::parse(&insts).ok();
        let arch = match nth(&a.arches, i, n, "--arch")? {
            Some(s) => parse_arch(s)?,
            None => txn.as_ref().map(|p| p.generation).ok_or_else(|| {
                format!(
                    "kernel {name:?}: {} is not a TXN stream this tool reads; give --arch",
                    a.insts[i].display()
                )
            })?,
        };
        let num_cols = *nth(&a.num_cols, i, n, "--num-cols")?.ok_or_else(|| {
            format!("kernel {name:?}: give --num-cols (the partition's column count)")
        })?;
        let kernarg_size = match nth(&a.kernarg_sizes, i, n, "--kernarg-size")? {
            Some(k) => *k,
            None => txn
                .as_ref()
                .and_then(|p| u32::try_from(p.arg_count() * 16).ok())
                .ok_or_else(|| format!("kernel {name:?}: give --kernarg-size"))?,
        };
        b.pdi_insts(
            arch,
            PdiInstsKernel {
                name: name.clone(),
                pdi: read(&a.pdis[i])?,
                insts,
                num_cols,
                kernarg_size,
            },
        )
        .map_err(|e| e.to_string())?;
    }
    for elf in &a.elves {
        let cols = if n == 0 {
            a.num_cols.first().copied()
        } else {
            None
        };
        b.full_elf(&read(elf)?, cols)
            .map_err(|e| format!("{}: {e}", elf.display()))?;
    }
    let bytes = b.build().map_err(|e| e.to_string())?;
    // What was written must read back.
    let h = Hsaco::parse(&bytes).map_err(|e| format!("the packed hsaco does not parse: {e}"))?;
    std::fs::write(&a.out, &bytes).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let kernels: Vec<(String, String)> = h
        .sections
        .iter()
        .flat_map(|s| {
            s.kernels
                .iter()
                .map(|k| (s.arch.agent_name().to_owned(), k.name.to_owned()))
        })
        .collect();
    if json {
        output::print_json(&json!({
            "out": a.out.display().to_string(),
            "bytes": bytes.len(),
            "kernels": kernels.iter().map(|(arch, name)| json!({"arch": arch, "name": name})).collect::<Vec<_>>(),
        }));
    } else {
        let list: Vec<String> = kernels.iter().map(|(a, k)| format!("{a}:{k}")).collect();
        println!(
            "wrote {} ({} bytes): {}",
            a.out.display(),
            bytes.len(),
            list.join(", ")
        );
    }
    Ok(())
}

fn parse_arch(s: &str) -> Result<NpuGen, String> {
    match s {
        "aie2" | "npu1" => Ok(NpuGen::Npu1),
        "aie2p" | "npu2" => Ok(NpuGen::Npu2),
        _ => Err(format!("--arch {s:?}: expected aie2 or aie2p")),
    }
}

//! `npuctl emu-design KERNEL --out DIR`: write an emulated design for the emulator; with
//! `--format hsaco` (or `hsaco-full-elf`, `full-elf`) `--out` is the file to write.

use std::path::PathBuf;
use std::time::Duration;

use npu_client::artifacts::emu::{DType, EmuDesign, EmuKernel};
use npu_client::{ConnectOptions, NpuGen, Operator};
use serde_json::json;

use crate::output;

/// The device name aiecc gives every design, the first half of a full-ELF kernel's name.
const AIECC_DEVICE: &str = "main";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// passthrough, vector_scalar_add, vector_scalar_add_inplace (inout),
    /// vector_scalar_add_unused (in, unused, out), vector_scalar_mul, vector_scale (in, out, i32 factor),
    /// vector_scale_mid (in, i32 factor, out), vector_vector_add, vector_mul, relu, matmul,
    /// noop, fault or hang.
    kernel: String,
    /// Directory to write main.pdi and insts.bin into (created if missing); for the other formats,
    /// the file to write.
    #[arg(long)]
    out: PathBuf,
    /// dir (main.pdi + insts.bin), hsaco (a PdiInsts kernel in the generation's section),
    /// hsaco-full-elf (a FullElf kernel, aie2p) or full-elf (the nested ELF alone, aie2p).
    #[arg(long, value_enum, default_value_t = Format::Dir)]
    format: Format,
    /// Elements (elementwise kernels), the matrix size n×n×n (matmul), or bytes per buffer
    /// (passthrough, noop, fault, hang). Default: 1024; 64 for matmul; 4096 for byte kernels.
    #[arg(long)]
    n: Option<u32>,
    /// Element type: u8, i8, i16, i32, u32, f32, bf16 (default i32; matmul: i16->i32, bf16 gives
    /// bf16->f32).
    #[arg(long)]
    dtype: Option<String>,
    /// The vector_scalar_add kernels' addend (default 1), vector_scalar_mul's factor (default 3).
    #[arg(long)]
    scalar: Option<i64>,
    /// npu1 or npu2 (default: the daemon's, or npu2 when no daemon answers).
    #[arg(long)]
    generation: Option<String>,
}

/// What `emu-design` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// main.pdi + insts.bin in a directory.
    Dir,
    /// An hsaco with one PdiInsts kernel.
    Hsaco,
    /// An hsaco with one FullElf kernel (aie2p).
    HsacoFullElf,
    /// The full ELF alone (aie2p), for `npuctl pack --elf`.
    FullElf,
}

pub async fn run(a: &Args, addr: Option<&str>, json: bool) -> crate::CmdResult {
    let kernel: EmuKernel = a.kernel.parse().map_err(|e| format!("{e}"))?;
    let dtype = a
        .dtype
        .as_deref()
        .map(str::parse::<DType>)
        .transpose()
        .map_err(|e| e.to_string())?;
    let n = a.n.unwrap_or(match kernel {
        EmuKernel::Matmul => 64,
        EmuKernel::Passthrough | EmuKernel::Noop | EmuKernel::Fault | EmuKernel::Hang => 4096,
        _ => 1024,
    });
    let mut design = EmuDesign::by_name(kernel.name(), n, dtype).map_err(|e| e.to_string())?;
    if let Some(s) = a.scalar {
        design.scalar = s;
        design.validate().map_err(|e| e.to_string())?;
    }
    if a.format != Format::Dir {
        return write_file(a, &design, addr, json).await;
    }
    let (generation, why) = generation(a.generation.as_deref(), addr).await?;
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let files = design
        .write_dir(&a.out, generation)
        .map_err(|e| e.to_string())?;
    if json {
        output::print_json(&json!({
            "kernel": kernel.name(),
            "dtype_in": design.dtype_in.name(),
            "dtype_out": design.dtype_out.name(),
            "m": design.m, "k": design.k, "n": design.n, "scalar": design.scalar,
            "generation": match generation { NpuGen::Npu1 => "npu1", NpuGen::Npu2 => "npu2" },
            "arg_bytes": design.arg_sizes(),
            "pdi": files.pdi_path.display().to_string(),
            "insts": files.insts_path.display().to_string(),
        }));
        return Ok(());
    }
    println!(
        "wrote {} ({}->{}, buffers of {:?} bytes) for {generation} ({why}):\n  {}\n  {}",
        kernel,
        design.dtype_in,
        design.dtype_out,
        design.arg_sizes(),
        files.pdi_path.display(),
        files.insts_path.display()
    );
    Ok(())
}

/// `--format hsaco`, `hsaco-full-elf`, `full-elf`: one file.
async fn write_file(
    a: &Args,
    design: &EmuDesign,
    addr: Option<&str>,
    json: bool,
) -> crate::CmdResult {
    let (generation, why) = match a.format {
        Format::Hsaco => generation(a.generation.as_deref(), addr).await?,
        _ => match a.generation.as_deref() {
            None | Some("npu2") => (NpuGen::Npu2, "full ELF exists for aie2p only".to_owned()),
            Some(g) => {
                return Err(format!(
                    "--generation {g}: full ELF exists for npu2 (aie2p) only"
                ));
            }
        },
    };
    // A full ELF's kernel is named as aiecc names it, main:sequence (aiecc calls every
    // design's device `main`), so that scripts written for aiecc's files find it.
    let bytes = match a.format {
        Format::Hsaco => design.to_hsaco(generation),
        Format::HsacoFullElf => design.to_full_elf_as(AIECC_DEVICE, 0).and_then(|elf| {
            npu_client::artifacts::hsaco::HsacoBuilder::new()
                .full_elf(&elf, None)?
                .build()
        }),
        _ => design.to_full_elf_as(AIECC_DEVICE, 0),
    }
    .map_err(|e| e.to_string())?;
    std::fs::write(&a.out, &bytes).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let format = match a.format {
        Format::Hsaco => "hsaco",
        Format::HsacoFullElf => "hsaco-full-elf",
        _ => "full-elf",
    };
    if json {
        output::print_json(&json!({
            "kernel": design.kernel.name(),
            "format": format,
            "arch": generation.agent_name(),
            "arg_bytes": design.arg_sizes(),
            "out": a.out.display().to_string(),
            "bytes": bytes.len(),
        }));
    } else {
        println!(
            "wrote {} ({format}, {} bytes, buffers of {:?} bytes) for {generation} ({why}):\n  {}",
            design.kernel,
            bytes.len(),
            design.arg_sizes(),
            a.out.display()
        );
    }
    Ok(())
}

/// The generation to write for, and why.
async fn generation(
    explicit: Option<&str>,
    addr: Option<&str>,
) -> Result<(NpuGen, String), String> {
    if let Some(g) = explicit {
        return match g {
            "npu1" => Ok((NpuGen::Npu1, "--generation".into())),
            "npu2" => Ok((NpuGen::Npu2, "--generation".into())),
            _ => Err(format!("--generation {g:?}: expected npu1 or npu2")),
        };
    }
    let opts = ConnectOptions {
        connect_timeout: Duration::from_secs(1),
        call_timeout: Duration::from_secs(2),
        ..crate::connect_options()
    };
    match Operator::connect_with(addr, opts).await {
        Ok(op) => match op.device_info().await {
            Ok(info) if info.generation == "npu1" => Ok((
                NpuGen::Npu1,
                format!("the daemon's device at {}", op.address()),
            )),
            Ok(_) => Ok((
                NpuGen::Npu2,
                format!("the daemon's device at {}", op.address()),
            )),
            Err(_) => Ok((
                NpuGen::Npu2,
                "no daemon answered; the emulator's default".into(),
            )),
        },
        Err(_) => Ok((
            NpuGen::Npu2,
            "no daemon answered; the emulator's default".into(),
        )),
    }
}

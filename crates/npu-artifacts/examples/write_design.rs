//! Writes an emulated design directory, then opens it again and prints its TXN listing.
//!
//! ```text
//! cargo run -p npu-artifacts --example write_design -- DIR [KERNEL] [N] [npu1|npu2]
//! ```

use npu_artifacts::NpuGen;
use npu_artifacts::design::Design;
use npu_artifacts::emu::EmuDesign;
use npu_artifacts::txn;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().map(PathBuf::from) else {
        eprintln!("usage: write_design DIR [KERNEL] [N] [npu1|npu2]");
        return ExitCode::from(2);
    };
    let kernel = args.get(1).map_or("vector_scalar_add", String::as_str);
    let n = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let generation = args
        .get(3)
        .and_then(|s| NpuGen::from_agent_name(s))
        .unwrap_or(NpuGen::Npu1);
    let result = EmuDesign::by_name(kernel, n, None)
        .and_then(|d| {
            std::fs::create_dir_all(&dir).map_err(|source| npu_artifacts::ArtifactError::Io {
                path: dir.clone(),
                source,
            })?;
            d.write_dir(&dir, generation)
        })
        .and_then(|_| Design::open(&dir))
        .and_then(|design| txn::listing(&design.insts));
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

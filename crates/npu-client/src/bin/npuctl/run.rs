//! `npuctl run DESIGN_DIR|FILE.hsaco [--kernel NAME] --input FILE... --output FILE...
//! [--class batch|interactive] [--deadline-us N]`: run a design over files, in a session of
//! that class. An `.hsaco` file runs the kernel `--kernel` names (or its only kernel).
//!
//! Buffers are passed in the design's argument order: the inputs (each as big as its file), then
//! the outputs (each as big as the design's instruction stream needs that argument to be, or
//! `--output-bytes`). Arguments the design patches beyond those (IRON's trace slot) get scratch
//! buffers of their minimum size.

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use npu_client::{Program, SessionClass, Tensor};
use serde_json::json;

use crate::output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The design directory, or an AIE hsaco file (`*.hsaco`).
    dir: PathBuf,
    /// The hsaco kernel to run (default: the file's only kernel).
    #[arg(long, default_value = "")]
    kernel: String,
    /// Input files, raw bytes, in argument order.
    #[arg(long = "input", num_args = 1..)]
    inputs: Vec<PathBuf>,
    /// Output files to write, in argument order after the inputs.
    #[arg(long = "output", num_args = 1..)]
    outputs: Vec<PathBuf>,
    /// Size of each output in bytes (default: what the design needs).
    #[arg(long)]
    output_bytes: Option<u64>,
    /// Run this many times (the outputs of the last run are written).
    #[arg(long, default_value_t = 1)]
    iterations: u32,
    #[command(flatten)]
    session: crate::SessionArgs,
}

pub async fn run(
    a: &Args,
    addr: Option<&str>,
    fleet: Option<&str>,
    json: bool,
) -> crate::CmdResult {
    let program = if a.dir.is_file() {
        Program::from_hsaco(&a.dir, &a.kernel)
    } else if a.kernel.is_empty() {
        Program::from_dir(&a.dir)
    } else {
        return Err(format!(
            "--kernel {}: {} is a design directory; --kernel names a kernel of an .hsaco file",
            a.kernel,
            a.dir.display()
        ));
    }
    .map_err(|e| e.to_string())?;
    let need = program.min_arg_sizes();
    files_fit(need.len(), a.inputs.len(), a.outputs.len(), program.name())?;
    let client = crate::session(addr, fleet, &a.session).await?;
    let mut tensors: Vec<Tensor<u8>> = Vec::new();
    for path in &a.inputs {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let t = client
            .tensor_from(&bytes)
            .await
            .map_err(|e| format!("{}: {e}", path.display()))?;
        tensors.push(t);
    }
    let mut extra = Vec::new();
    let first_out = tensors.len();
    for i in first_out..need.len().max(first_out + a.outputs.len()) {
        let size = match (i - first_out < a.outputs.len(), a.output_bytes) {
            (true, Some(b)) => b,
            _ => need.get(i).copied().unwrap_or(4),
        };
        let len = usize::try_from(size).map_err(|e| e.to_string())?;
        tensors.push(client.alloc::<u8>(len).await.map_err(|e| e.to_string())?);
        if i - first_out >= a.outputs.len() {
            extra.push(i);
        }
    }
    let bar = if a.iterations > 1 && !json {
        let b = ProgressBar::new(u64::from(a.iterations));
        b.set_style(
            ProgressStyle::with_template("{spinner} {msg} {pos}/{len} [{bar:30}] {per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(program.name().to_owned());
        b
    } else {
        ProgressBar::hidden()
    };
    // Inputs the design is known only to read are lent as such; everything else may be
    // written (for a real design, every argument: see Program::read_only_args).
    let split = program.read_only_args().min(first_out);
    let (mut queue, mut device) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..a.iterations {
        let (reads, writes) = tensors.split_at_mut(split);
        let reads: Vec<&dyn npu_client::TensorArg> = reads
            .iter()
            .map(|t| t as &dyn npu_client::TensorArg)
            .collect();
        let mut writes: Vec<&mut dyn npu_client::TensorArg> = writes
            .iter_mut()
            .map(|t| t as &mut dyn npu_client::TensorArg)
            .collect();
        let r = client
            .dispatch(&program, &reads, &mut writes)
            .await
            .map_err(|e| e.to_string())?;
        queue += r.queue;
        device += r.device;
        bar.inc(1);
    }
    bar.finish_and_clear();
    for (path, t) in a.outputs.iter().zip(&tensors[first_out..]) {
        std::fs::write(path, t.as_slice()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let n = a.iterations.max(1);
    if json {
        output::print_json(&json!({
            "program": program.name(),
            "address": client.address().to_string(),
            "iterations": a.iterations,
            "shared": client.is_local(),
            "session_class": client.session_class().as_str(),
            "deadline_us": client.deadline().map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            "queue_ns_mean": u64::try_from((queue / n).as_nanos()).unwrap_or(u64::MAX),
            "device_ns_mean": u64::try_from((device / n).as_nanos()).unwrap_or(u64::MAX),
            "outputs": a.outputs.iter().zip(&tensors[first_out..]).map(|(p, t)| json!({
                "path": p.display().to_string(), "bytes": t.size_bytes(),
            })).collect::<Vec<_>>(),
            "scratch_args": extra,
        }));
    } else {
        println!(
            "ran {} {}x on {} ({}, {}): mean queue {:?}, mean device {:?}",
            program.name(),
            a.iterations,
            client.address(),
            if client.is_local() {
                "fd-shared tensors"
            } else {
                "staged tensors"
            },
            session_words(client.session_class(), client.deadline()),
            queue / n,
            device / n
        );
        for (p, t) in a.outputs.iter().zip(&tensors[first_out..]) {
            println!("  wrote {} ({} bytes)", p.display(), t.size_bytes());
        }
        if !extra.is_empty() {
            println!("  scratch buffers for args {extra:?}");
        }
    }
    drop(tensors);
    client.close().await.map_err(|e| e.to_string())
}

/// The session as a run's line names it: `batch session`, `interactive session, deadline 2ms`.
fn session_words(class: SessionClass, deadline: Option<Duration>) -> String {
    match deadline {
        Some(d) => format!("{class} session, deadline {d:?}"),
        None => format!("{class} session"),
    }
}

/// Whether the files given fit the design's buffer arguments (as many as its instruction
/// stream patches DDR addresses): the inputs first, then the outputs, in argument order, and
/// arguments left over (IRON's trace slot) get scratch buffers. More files than arguments, or
/// outputs without inputs (they would take the design's first arguments, its inputs), are
/// refused, naming the counts.
fn files_fit(args: usize, inputs: usize, outputs: usize, design: &str) -> Result<(), String> {
    if inputs + outputs > args {
        return Err(format!(
            "{design} takes {args} buffer argument{}; {inputs} --input and {outputs} --output \
             file{} are {}: give the inputs, then the outputs, in the design's argument order \
             (`npuctl inspect` lists its arguments)",
            if args == 1 { "" } else { "s" },
            if inputs + outputs == 1 { "" } else { "s" },
            inputs + outputs
        ));
    }
    if inputs == 0 && outputs > 0 {
        return Err(format!(
            "--output without --input: the outputs follow the inputs in {design}'s argument \
             order, so alone they would be its first arguments, the ones it reads; give the \
             input files with --input"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_and_deadline_are_options_of_run() {
        use clap::Parser;
        let run = |args: &[&str]| match crate::Cli::try_parse_from(args) {
            Ok(crate::Cli {
                command: crate::Command::Run(a),
                ..
            }) => Ok(a.session.options()),
            Ok(other) => panic!("not run: {other:?}"),
            Err(e) => Err(e.to_string()),
        };
        let o = run(&["npuctl", "run", "d", "--input", "i"]).unwrap();
        assert_eq!((o.session_class, o.deadline), (SessionClass::Batch, None));
        let o = run(&[
            "npuctl",
            "run",
            "d",
            "--class",
            "interactive",
            "--deadline-us",
            "2500",
        ])
        .unwrap();
        assert_eq!(o.session_class, SessionClass::Interactive);
        assert_eq!(o.deadline, Some(Duration::from_micros(2500)));
        let e = run(&["npuctl", "run", "d", "--class", "urgent"]).unwrap_err();
        assert!(
            e.contains("unknown session class \"urgent\": expected \"batch\" or \"interactive\""),
            "{e}"
        );
    }

    #[test]
    fn a_run_names_its_session_class_and_deadline() {
        assert_eq!(session_words(SessionClass::Batch, None), "batch session");
        assert_eq!(
            session_words(SessionClass::Interactive, Some(Duration::from_millis(2))),
            "interactive session, deadline 2ms"
        );
    }

    #[test]
    fn more_files_than_arguments_and_outputs_alone_are_refused() {
        files_fit(2, 1, 1, "d").unwrap();
        files_fit(3, 1, 1, "d").unwrap(); // the trace slot: scratch
        files_fit(2, 1, 0, "d").unwrap();
        let e = files_fit(2, 2, 1, "d").unwrap_err();
        assert!(
            e.starts_with("d takes 2 buffer arguments; 2 --input and 1 --output files are 3"),
            "{e}"
        );
        let e = files_fit(2, 0, 1, "d").unwrap_err();
        assert!(e.starts_with("--output without --input"), "{e}");
    }
}

//! [`listing`]: a readable, one-op-per-line explanation of a TXN stream (`npuctl inspect`).

use super::walk::{self, col_of, row_of};
use super::{TxnOp, TxnProgram, opcode};
use crate::ArtifactError;
use std::fmt::Write as _;

/// Data words shown per BLOCKWRITE before eliding the rest.
const SHOWN_WORDS: usize = 8;

/// Explains a valid TXN stream: a header line, then one line per op with its index, byte offset,
/// opcode name and decoded fields (register addresses as column/row/offset), then the buffer
/// arguments the DDR patches use and their minimum sizes.
///
/// # Cost
///
/// [`TxnProgram::parse`]'s, then the text: one line per op, at most 12 bytes of text per input
/// byte (a 4-byte NOOP gets the longest line for its size; a BLOCKWRITE shows at most 8 data
/// words), and up to twice that allocated while the text grows.
///
/// # Errors
///
/// The same errors as [`TxnProgram::parse`]; a malformed stream is not listed.
pub fn listing(bytes: &[u8]) -> Result<String, ArtifactError> {
    let program = TxnProgram::parse(bytes)?;
    let mut out = String::new();
    let (major, minor) = program.version;
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "TXN {major}.{minor} for {}: {} rows ({} memory-tile), {} columns, {} ops, {} bytes",
        program.generation,
        program.rows,
        program.mem_tile_rows,
        program.cols,
        program.op_count,
        program.size_bytes
    );
    walk::walk(bytes, |_, l| {
        let name = opcode_name(&l.op);
        let _ = writeln!(
            out,
            "{:>5}  @{:#06x}  {name:<13} {}",
            l.index,
            l.offset,
            fields(&l.op)
        );
        Ok(())
    })?;
    if program.args.is_empty() {
        let _ = writeln!(out, "no buffer arguments are patched");
    }
    for arg in &program.args {
        let index = arg.index as usize;
        let _ = writeln!(
            out,
            "arg {index}: {} patch(es), needs at least {} bytes",
            arg.patches.len(),
            program.min_arg_size(index)
        );
        for p in &arg.patches {
            let _ = writeln!(
                out,
                "    op {} -> {}: offset {}{}, BD length {} bytes",
                p.op_index,
                reg(p.reg_addr),
                p.offset,
                if p.folded { " (folded)" } else { "" },
                p.bd_len_bytes,
            );
        }
    }
    Ok(out)
}

/// Like [`listing`], but never fails: for a malformed stream it lists the header (when it
/// decodes) and every op up to the first one that does not, then a line `error: ...` saying what
/// is wrong. For `npuctl inspect` on a file the daemon refused.
///
/// # Cost
///
/// As [`listing`]: at most 12 bytes of text per input byte, twice that while it grows.
#[must_use]
pub fn explain(bytes: &[u8]) -> String {
    let err = match listing(bytes) {
        Ok(text) => return text,
        Err(e) => e,
    };
    let mut out = String::new();
    if let Ok(h) = walk::header(bytes) {
        let _ = writeln!(
            out,
            "TXN {}.{} for {}: {} rows ({} memory-tile), {} columns, {} ops declared, {} bytes",
            h.major,
            h.minor,
            h.generation,
            h.rows,
            h.mem_tile_rows,
            h.cols,
            h.op_count,
            h.size_bytes
        );
    }
    // The walk stops at the first op it cannot decode; the error below says why.
    let _ = walk::walk(bytes, |_, l| {
        let name = opcode_name(&l.op);
        let _ = writeln!(
            out,
            "{:>5}  @{:#06x}  {name:<13} {}",
            l.index,
            l.offset,
            fields(&l.op)
        );
        Ok(())
    });
    let _ = writeln!(out, "error: {err}");
    out
}

fn opcode_name(op: &TxnOp) -> &'static str {
    let code = match op {
        TxnOp::Write { .. } => opcode::WRITE,
        TxnOp::MaskWrite { .. } => opcode::MASKWRITE,
        TxnOp::MaskPoll { busy: false, .. } => opcode::MASKPOLL,
        TxnOp::MaskPoll { busy: true, .. } => opcode::MASKPOLL_BUSY,
        TxnOp::BlockWrite { .. } => opcode::BLOCKWRITE,
        TxnOp::Noop => opcode::NOOP,
        TxnOp::Preempt { .. } => opcode::PREEMPT,
        TxnOp::LoadPdi { .. } => opcode::LOADPDI,
        TxnOp::LoadPmStart { .. } => opcode::LOAD_PM_START,
        TxnOp::Sync { .. } => opcode::TCT,
        TxnOp::DdrPatch { .. } => opcode::DDR_PATCH,
        TxnOp::RecordTimer { .. } => opcode::RECORD_TIMER,
        TxnOp::Custom { opcode, .. } => *opcode,
    };
    opcode::name(code).unwrap_or("?")
}

/// `0x0001d004 (col 0 row 0 +0x1d004)`.
fn reg(addr: u32) -> String {
    format!(
        "{addr:#010x} (col {} row {} +{:#x})",
        col_of(addr),
        row_of(addr),
        addr & 0xF_FFFF
    )
}

fn fields(op: &TxnOp) -> String {
    match op {
        TxnOp::Write { addr, value } => format!("{} = {value:#010x}", reg(*addr)),
        TxnOp::MaskWrite { addr, value, mask } => {
            format!("{} = {value:#010x} mask {mask:#010x}", reg(*addr))
        }
        TxnOp::MaskPoll {
            addr, value, mask, ..
        } => format!("until {} & {mask:#010x} == {value:#010x}", reg(*addr)),
        TxnOp::BlockWrite {
            col,
            row,
            addr,
            data,
        } => {
            let shown: Vec<String> = data
                .iter()
                .take(SHOWN_WORDS)
                .map(|w| format!("{w:08x}"))
                .collect();
            let more = if data.len() > SHOWN_WORDS { " ..." } else { "" };
            format!(
                "tile ({col},{row}) {} {} words: {}{more}",
                reg(*addr),
                data.len(),
                shown.join(" ")
            )
        }
        TxnOp::Noop => String::new(),
        TxnOp::Preempt { level } => format!("level {level}"),
        TxnOp::LoadPdi { id, size, addr } => format!("id {id} size {size} from {addr:#x}"),
        TxnOp::LoadPmStart {
            sequence_count,
            pm_id,
        } => format!("pm id {pm_id} sequence count {sequence_count}"),
        TxnOp::Sync {
            dir,
            row,
            col,
            row_num,
            col_num,
            channel,
        } => {
            let d = match dir {
                0 => "S2MM",
                1 => "MM2S",
                _ => "dir?",
            };
            format!("col {col} row {row} {d} channel {channel} over {col_num}x{row_num} tiles")
        }
        TxnOp::DdrPatch {
            reg_addr,
            arg_idx,
            arg_plus,
        } => format!("{} <- arg {arg_idx} + {arg_plus:#x}", reg(*reg_addr)),
        TxnOp::RecordTimer { id } => format!("id {id}"),
        TxnOp::Custom { payload, .. } => format!("{} payload words", payload.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NpuGen;
    use crate::txn::TxnBuilder;

    #[test]
    fn lists_one_line_per_op_with_offsets_and_arguments() {
        let mut b = TxnBuilder::new(NpuGen::Npu1);
        b.shim_buffer(0, 1, 0, 4096).sync(0, 0, 0, 0);
        let text = listing(&b.finish()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "TXN 0.1 for npu1 (aie2): 6 rows (1 memory-tile), 5 columns, 3 ops, 128 bytes"
        );
        assert!(
            lines[1].starts_with("    0  @0x0010  BLOCKWRITE"),
            "{}",
            lines[1]
        );
        assert!(lines[1].contains("0x0001d020 (col 0 row 0 +0x1d020) 8 words: 00000400"));
        assert!(
            lines[2].starts_with("    1  @0x0040  DDR_PATCH"),
            "{}",
            lines[2]
        );
        assert!(lines[2].contains("<- arg 0 + 0x0"));
        assert!(lines[3].starts_with("    2  @0x0070  TCT"), "{}", lines[3]);
        assert_eq!(lines[4], "arg 0: 1 patch(es), needs at least 4096 bytes");
        assert!(lines[5].contains("BD length 4096 bytes"));
    }

    #[test]
    fn malformed_stream_is_an_error_not_a_listing() {
        assert!(listing(&[0u8; 8]).is_err());
    }

    #[test]
    fn explain_lists_up_to_the_first_bad_op() {
        let mut b = TxnBuilder::new(NpuGen::Npu1);
        b.noop().noop().write(TxnBuilder::reg(0, 0, 0x10), 1);
        let mut bytes = b.finish();
        bytes[24] = 0x42; // op 2's opcode
        let text = explain(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("TXN 0.1 for npu1 (aie2)"));
        assert!(lines[1].contains("NOOP"));
        assert!(lines[2].contains("NOOP"));
        assert_eq!(
            lines[3],
            "error: TXN op 2 at byte offset 24 has unknown opcode 0x42 (word 0x00000042)"
        );
        assert_eq!(
            explain(&[1, 2]),
            "error: insts.bin is 2 bytes; expected at least 16 (the TXN header is 4 words)\n"
        );
        let good = TxnBuilder::new(NpuGen::Npu1).finish();
        assert_eq!(explain(&good), listing(&good).unwrap());
    }
}

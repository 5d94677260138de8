//! `npuctl inspect FILE.hsaco`: the AIE sections of an hsaco, their kernels, kinds, column
//! counts and sizes; for full-ELF kernels the control code, PDIs and patch sites.

use std::path::Path;

use npu_client::artifacts::hsaco::{AieSection, Hsaco, Kernel, SiteTarget};
use serde_json::{Value, json};

use crate::output::{self, kv_table, table};

/// Whether `path` should be read as an hsaco: a file named `*.hsaco`, or any file holding an
/// ELF64 with an AIE section.
pub fn is_hsaco_file(path: &Path) -> bool {
    path.is_file()
        && (path.extension().is_some_and(|e| e == "hsaco")
            || std::fs::read(path).is_ok_and(|b| npu_client::artifacts::hsaco::is_hsaco(&b)))
}

pub fn run(path: &Path, json: bool) -> crate::CmdResult {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let h = Hsaco::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if json {
        output::print_json(&json!({
            "file": path.display().to_string(),
            "bytes": bytes.len(),
            "e_type": h.container.e_type,
            "e_machine": h.container.e_machine,
            "sections": h.sections.iter().map(section_json).collect::<Vec<_>>(),
            "ignored_sections": h.ignored.iter().map(|n| n.shown()).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    println!(
        "{}",
        kv_table(vec![
            ("hsaco", path.display().to_string()),
            (
                "container",
                format!(
                    "{} bytes, ELF64 e_type {} e_machine {}, {} sections",
                    bytes.len(),
                    h.container.e_type,
                    h.container.e_machine,
                    h.container.sections.len()
                ),
            ),
        ])
    );
    for s in &h.sections {
        println!(
            "\nsection {} (index {}, file offset {:#x}, {} bytes, format {}.{}, {} kernels)",
            s.arch.agent_name(),
            s.section_index,
            s.file_offset,
            s.bytes.len(),
            s.version.0,
            s.version.1,
            s.kernels.len()
        );
        let mut t = table(&[
            "kernel",
            "kind",
            "cols",
            "kernarg",
            "insts/ELF",
            "PDI",
            "detail",
        ]);
        for k in &s.kernels {
            t.add_row(vec![
                k.name.to_owned(),
                k.kind.to_string(),
                k.num_cols.to_string(),
                k.effective_kernarg_size().to_string(),
                format!("{} B @ {:#x}", k.insts.bytes.len(), k.insts.offset),
                k.pdi.map_or("-".into(), |p| {
                    format!("{} B @ {:#x}", p.bytes.len(), p.offset)
                }),
                detail(k),
            ]);
        }
        println!("{t}");
    }
    if !h.ignored.is_empty() {
        let names: Vec<String> = h.ignored.iter().map(|n| n.shown()).collect();
        println!("\nignored AIE sections: {}", names.join(", "));
    }
    Ok(())
}

fn detail(k: &Kernel<'_>) -> String {
    match &k.full_elf {
        None => String::new(),
        Some(e) => {
            let pdis: Vec<String> = e
                .pdis
                .iter()
                .map(|p| format!("{} ({} B)", p.name, p.bytes.len()))
                .collect();
            format!(
                "control code {} B, {} args, {} sites, PDIs {}",
                e.ctrl_code.len(),
                e.arg_count,
                e.sites.len(),
                pdis.join(", ")
            )
        }
    }
}

fn section_json(s: &AieSection<'_>) -> Value {
    json!({
        "arch": s.arch.agent_name(),
        "section_index": s.section_index,
        "file_offset": s.file_offset,
        "bytes": s.bytes.len(),
        "version": format!("{}.{}", s.version.0, s.version.1),
        "header_size": s.header_size,
        "kernel_entry_size": s.kernel_entry_size,
        "string_table_offset": s.string_table_offset,
        "string_table_size": s.string_table_size,
        "blob_pool_offset": s.blob_pool_offset,
        "kernels": s.kernels.iter().map(kernel_json).collect::<Vec<_>>(),
    })
}

fn kernel_json(k: &Kernel<'_>) -> Value {
    json!({
        "name": k.name,
        "kind": k.kind.name(),
        "num_cols": k.num_cols,
        "kernarg_size": k.kernarg_size,
        "effective_kernarg_size": k.effective_kernarg_size(),
        "insts": { "offset": k.insts.offset, "bytes": k.insts.bytes.len() },
        "pdi": k.pdi.map(|p| json!({ "offset": p.offset, "bytes": p.bytes.len() })),
        "full_elf": k.full_elf.as_ref().map(|e| json!({
            "ctrl_code_bytes": e.ctrl_code.len(),
            "ctrl_section": e.ctrl_section,
            "arg_count": e.arg_count,
            "pdis": e.pdis.iter().map(|p| json!({ "name": p.name, "bytes": p.bytes.len() })).collect::<Vec<_>>(),
            "sites": e.sites.iter().map(|s| json!({
                "scheme": s.scheme.0,
                "offset": s.offset,
                "addend": s.addend,
                "arg": match &s.target { SiteTarget::Arg(a) => json!(a), SiteTarget::Pdi(_) => Value::Null },
                "pdi": match &s.target { SiteTarget::Pdi(p) => json!(p), SiteTarget::Arg(_) => Value::Null },
            })).collect::<Vec<_>>(),
        })),
    })
}

//! `npuctl programs`: every stored program and its counters, then every quarantined program
//! (by content hash, stored or not); `--clear-quarantine HASH` removes one quarantine record.

use npu_client::proto as pb;
use serde_json::{Value, json};

use crate::output::{self, count, mean, summary_json, table};

/// `npuctl programs [--clear-quarantine HASH]`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// Remove the quarantine record of the program with this content hash (as listed), so that
    /// its bytes may be registered and run again. Root or the daemon's own user only.
    #[arg(long, value_name = "HASH")]
    clear_quarantine: Option<String>,
}

pub async fn run(a: &Args, addr: Option<&str>, json: bool) -> crate::CmdResult {
    let op = crate::operator(addr).await?;
    if let Some(hash) = &a.clear_quarantine {
        return clear(&op, hash, json).await;
    }
    let listing = op.program_listing().await.map_err(|e| e.to_string())?;
    let stats = op.statistics().await.map_err(|e| e.to_string())?;
    let list = &listing.programs;
    let quarantine = &listing.quarantine;
    let stat = |id: u64| stats.programs.iter().find(|p| p.program_id == id);
    let record = |hash: &str| quarantine.iter().find(|r| r.content_hash == hash);
    if json {
        let v: Vec<Value> = list
            .iter()
            .map(|p| {
                let s = stat(p.program_id);
                json!({
                    "program_id": p.program_id,
                    "name": p.name,
                    "content_hash": p.content_hash,
                    "references": p.references,
                    "loaded": p.loaded,
                    "quarantined": p.quarantined,
                    "quarantine": record(&p.content_hash).map(record_json),
                    "summary": summary_json(p.summary.as_ref()),
                    "loads": s.map_or(0, |s| s.loads),
                    "dispatches": output::dispatches_json(s.and_then(|s| s.dispatches.as_ref())),
                })
            })
            .collect();
        output::print_json(&json!({
            "programs": v,
            "quarantine": quarantine.iter().map(record_json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    if list.is_empty() {
        println!("no stored programs");
    } else {
        let mut t = table(&[
            "id",
            "name",
            "hash",
            "form",
            "kind",
            "gen",
            "args",
            "refs",
            "loaded",
            "loads",
            "ok",
            "failed",
            "mean device",
        ]);
        for p in list {
            let s = p.summary.clone().unwrap_or_default();
            let st = stat(p.program_id);
            let d = st.and_then(|s| s.dispatches.clone()).unwrap_or_default();
            let state = if p.quarantined {
                "quarantined"
            } else if p.loaded {
                "yes"
            } else {
                "no"
            };
            t.add_row(vec![
                p.program_id.to_string(),
                p.name.clone(),
                p.content_hash.chars().take(12).collect(),
                if s.kernel_name.is_empty() {
                    s.form
                } else {
                    format!("{} {} ({})", s.form, s.kernel_name, s.kernel_kind)
                },
                s.kind,
                s.generation,
                s.arg_count.to_string(),
                p.references.to_string(),
                state.into(),
                st.map_or(0, |s| s.loads).to_string(),
                count(d.success.as_ref()).to_string(),
                count(d.fail.as_ref()).to_string(),
                mean(d.execute.as_ref()),
            ]);
        }
        println!("{t}");
    }
    if !quarantine.is_empty() {
        println!(
            "\nquarantined (refused until cleared with `npuctl programs --clear-quarantine HASH`):"
        );
        let mut t = table(&["hash", "name", "id", "faulted at", "reason"]);
        for r in quarantine {
            t.add_row(vec![
                r.content_hash.clone(),
                r.name.clone(),
                if r.program_id == 0 {
                    "-".into()
                } else {
                    r.program_id.to_string()
                },
                r.faulted_at.clone(),
                r.reason.clone(),
            ]);
        }
        println!("{t}");
    }
    Ok(())
}

async fn clear(op: &npu_client::Operator, hash: &str, json: bool) -> crate::CmdResult {
    let r = op.clear_quarantine(hash).await.map_err(|e| e.to_string())?;
    if json {
        output::print_json(&json!({
            "content_hash": hash,
            "removed": r.removed,
            "record": r.record.as_ref().map(record_json),
        }));
    } else if r.removed {
        let rec = r.record.unwrap_or_default();
        let name = if rec.name.is_empty() {
            String::new()
        } else {
            format!(" ({})", rec.name)
        };
        println!(
            "cleared the quarantine of {hash}{name}, quarantined since {}: {}; its bytes may be \
             registered and run again",
            rec.faulted_at, rec.reason
        );
    } else {
        println!("{hash} was not quarantined; nothing to clear");
    }
    Ok(())
}

/// A `QuarantineRecord`, every field, with the proto's field names.
fn record_json(r: &pb::QuarantineRecord) -> Value {
    json!({
        "content_hash": r.content_hash,
        "name": r.name,
        "faulted_unix_s": r.faulted_unix_s,
        "faulted_at": r.faulted_at,
        "reason": r.reason,
        "program_id": r.program_id,
    })
}

//! `npuctl programs`: every stored program and its counters.

use serde_json::{Value, json};

use crate::output::{self, count, mean, summary_json, table};

pub async fn run(addr: Option<&str>, json: bool) -> crate::CmdResult {
    let op = crate::operator(addr).await?;
    let list = op.programs().await.map_err(|e| e.to_string())?;
    let stats = op.statistics().await.map_err(|e| e.to_string())?;
    let stat = |id: u64| stats.programs.iter().find(|p| p.program_id == id);
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
                    "summary": summary_json(p.summary.as_ref()),
                    "loads": s.map_or(0, |s| s.loads),
                    "dispatches": output::dispatches_json(s.and_then(|s| s.dispatches.as_ref())),
                })
            })
            .collect();
        output::print_json(&Value::Array(v));
        return Ok(());
    }
    if list.is_empty() {
        println!("no stored programs");
        return Ok(());
    }
    let mut t = table(&[
        "id",
        "name",
        "hash",
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
    for p in &list {
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
    Ok(())
}

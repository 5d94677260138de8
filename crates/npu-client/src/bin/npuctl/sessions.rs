//! `npuctl sessions`: open sessions and their counters.

use serde_json::Value;

use crate::output::{self, bytes, count, mean, session_json, table};

pub async fn run(addr: Option<&str>, json: bool) -> crate::CmdResult {
    let op = crate::operator(addr).await?;
    let stats = op.statistics().await.map_err(|e| e.to_string())?;
    if json {
        output::print_json(&Value::Array(
            stats.sessions.iter().map(session_json).collect(),
        ));
        return Ok(());
    }
    if stats.sessions.is_empty() {
        println!("no open sessions");
        return Ok(());
    }
    let mut t = table(&[
        "id",
        "client",
        "identity",
        "connected",
        "tensors",
        "bytes",
        "programs",
        "ok",
        "failed",
        "faults",
        "mean queue",
        "mean device",
    ]);
    for s in &stats.sessions {
        let d = s.dispatches.clone().unwrap_or_default();
        t.add_row(vec![
            s.session_id.to_string(),
            s.client_name.clone(),
            s.identity.clone(),
            if s.connected { "yes" } else { "no" }.into(),
            s.tensors.to_string(),
            bytes(s.tensor_bytes),
            s.programs.to_string(),
            count(d.success.as_ref()).to_string(),
            count(d.fail.as_ref()).to_string(),
            s.device_faults.to_string(),
            mean(d.queue.as_ref()),
            mean(d.execute.as_ref()),
        ]);
    }
    println!("{t}");
    Ok(())
}

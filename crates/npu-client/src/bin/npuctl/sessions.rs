//! `npuctl sessions`: open sessions, their class and their counters.

use std::time::Duration;

use npu_client::SessionClass;
use npu_client::proto as pb;
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
        "class",
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
            class_cell(s),
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

/// A session's class, with its deadline when it has one: `batch`, `interactive (2ms)`.
fn class_cell(s: &pb::SessionStatistics) -> String {
    let class = SessionClass::proto_name(s.session_class);
    match s.deadline_us {
        0 => class,
        us => format!("{class} ({:?})", Duration::from_micros(us)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_column_shows_the_deadline_when_there_is_one() {
        let s = |session_class: pb::SessionClass, deadline_us| pb::SessionStatistics {
            session_class: session_class.into(),
            deadline_us,
            ..Default::default()
        };
        assert_eq!(class_cell(&s(pb::SessionClass::Unspecified, 0)), "batch");
        assert_eq!(class_cell(&s(pb::SessionClass::Batch, 0)), "batch");
        assert_eq!(
            class_cell(&s(pb::SessionClass::Interactive, 0)),
            "interactive"
        );
        assert_eq!(
            class_cell(&s(pb::SessionClass::Interactive, 2_500)),
            "interactive (2.5ms)"
        );
    }
}

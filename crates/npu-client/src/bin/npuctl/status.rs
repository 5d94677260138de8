//! `npuctl status`: device, backend, sessions, programs, heap use and counters.

use npu_client::SessionClass;
use npu_client::proto as pb;
use serde_json::json;

use crate::output::{self, bytes, count, device_json, kv_table, ns, statistics_json};

/// Device information answers every caller that can connect; statistics only callers the
/// policy serves. A caller refused them (no token where `auth.require_token` asks for one, an
/// anonymous caller) still sees the device, and the refusal in place of the counters.
pub async fn run(addr: Option<&str>, json: bool) -> crate::CmdResult {
    let op = crate::operator(addr).await?;
    let info = op.device_info().await.map_err(|e| e.to_string())?;
    let stats = op.statistics().await;
    if json {
        output::print_json(&match &stats {
            Ok(stats) => json!({
                "address": op.address().to_string(),
                "device": device_json(&info),
                "statistics": statistics_json(stats),
            }),
            Err(e) => json!({
                "address": op.address().to_string(),
                "device": device_json(&info),
                "statistics": null,
                "statistics_refused": e.to_string(),
            }),
        });
        return Ok(());
    }
    let refused = stats.as_ref().err().map(ToString::to_string);
    let stats = stats.unwrap_or_default();
    let (ok, failed, queue_ns, device_ns) = output::totals(&stats);
    let product = if info.product_name.is_empty() {
        String::new()
    } else {
        format!(", {}", info.product_name)
    };
    let heap_pct = if info.heap_size_bytes > 0 {
        format!(
            " ({:.1}%)",
            100.0 * info.heap_used_bytes as f64 / info.heap_size_bytes as f64
        )
    } else {
        String::new()
    };
    let mut rows: Vec<(&str, String)> = vec![
        (
            "daemon",
            format!("npud {} at {}", info.daemon_version, op.address()),
        ),
        (
            "device",
            format!(
                "{} ({}{product}); generation from {}",
                info.generation, info.agent_name, info.generation_source
            ),
        ),
        (
            "backend",
            if info.emulator_profile.is_empty() {
                format!("{}, packet ABI {}", info.backend, info.packet_abi)
            } else {
                format!(
                    "{}, packet ABI {}, emulator profile {}",
                    info.backend, info.packet_abi, info.emulator_profile
                )
            },
        ),
        ("packet ABI", info.packet_abi_source.clone()),
        (
            "runtime",
            if info.runtime_version.is_empty() {
                info.runtime_library.clone()
            } else {
                format!("{} ({})", info.runtime_library, info.runtime_version)
            },
        ),
        (
            "serving",
            if info.serving {
                "yes"
            } else {
                "no (recovering)"
            }
            .into(),
        ),
        (
            "recoveries",
            recoveries(info.recoveries, info.last_recovery_unix_ms),
        ),
        (
            "sessions",
            format!(
                "{} open ({} opened, {} ended since start; grace {} ms)",
                info.sessions, stats.sessions_opened, stats.sessions_ended, info.session_grace_ms
            ),
        ),
        (
            "pending",
            format!("{} dispatches", stats.pending_dispatches),
        ),
        (
            "programs",
            format!(
                "{} stored, {} loaded",
                stats.programs.len(),
                info.programs_loaded
            ),
        ),
        (
            "heap",
            format!(
                "{} of {}{heap_pct}",
                bytes(info.heap_used_bytes),
                bytes(info.heap_size_bytes)
            ),
        ),
        (
            "tensors",
            match info.tensor_sharing.as_str() {
                "staged" => format!(
                    "staged: local clients get a memfd copied to and from the device around \
                     each dispatch ({})",
                    info.tensor_sharing_reason
                ),
                "" => "shared by fd with local clients".into(),
                mode => format!("shared by fd with local clients, in place ({mode})"),
            },
        ),
        (
            "dispatches",
            format!(
                "{ok} ok, {failed} failed; queue {} total, device {} total",
                ns(queue_ns),
                ns(device_ns)
            ),
        ),
        ("device faults", stats.device_faults.to_string()),
        (
            "metrics",
            if info.metrics_address.is_empty() {
                "off (metrics.listen)".to_owned()
            } else {
                format!("http://{}/metrics", info.metrics_address)
            },
        ),
        (
            "threads",
            format!(
                "{} I/O; executor {}",
                info.io_threads,
                if info.executor_spin_us == 0 {
                    "sleeps between dispatches".to_owned()
                } else {
                    format!(
                        "polls up to {} µs between dispatches",
                        info.executor_spin_us
                    )
                }
            ),
        ),
        (
            "uptime",
            format!("{:?}", std::time::Duration::from_millis(stats.uptime_ms)),
        ),
        (
            "tcp",
            if info.tcp_address.is_empty() {
                "off".to_owned()
            } else {
                format!("{} ({})", info.tcp_address, info.tcp_security)
            },
        ),
        (
            "you are",
            format!(
                "{}{}",
                info.caller_identity,
                if info.caller_admin { " (admin)" } else { "" }
            ),
        ),
    ];
    if let Some(classes) = classes(&stats) {
        let at = rows
            .iter()
            .position(|(k, _)| *k == "pending")
            .map_or(0, |i| i + 1);
        rows.insert(at, ("classes", classes));
    }
    if !info.runtime_notes.is_empty() {
        // Beside the packet ABI rows, where a reader looks for what the runtime is.
        rows.insert(4, ("runtime notes", info.runtime_notes.clone()));
    }
    if info.device_time_modelled {
        rows.insert(
            4,
            (
                "device time",
                "modelled (emulator.timing = model): hsa-sim's timing model, not measured".into(),
            ),
        );
    }
    if let Some(why) = refused {
        // Without statistics: the rows they fill go, the device's own counts stay.
        const FROM_STATISTICS: [&str; 5] = [
            "pending",
            "dispatches",
            "device faults",
            "uptime",
            "programs",
        ];
        rows.retain(|(k, _)| !FROM_STATISTICS.contains(k));
        for (k, v) in &mut rows {
            if *k == "sessions" {
                *v = format!("{} open", info.sessions);
            }
        }
        rows.push(("programs", format!("{} loaded", info.programs_loaded)));
        rows.push(("statistics", format!("not shown: {why}")));
    }
    println!("{}", kv_table(rows));
    Ok(())
}

/// Each session class since the daemon started: open sessions, dispatches, its share of the
/// device's time, and deadlines missed; `None` from a daemon older than classes.
fn classes(s: &pb::Statistics) -> Option<String> {
    if s.classes.is_empty() {
        return None;
    }
    let device = |c: &pb::ClassStatistics| {
        c.dispatches
            .as_ref()
            .and_then(|d| d.execute.as_ref())
            .map_or(0, |e| e.ns)
    };
    let all: u64 = s.classes.iter().map(device).sum();
    let each = s.classes.iter().map(|c| {
        let d = c.dispatches.clone().unwrap_or_default();
        let mut t = format!(
            "{} {} open, {} dispatches",
            SessionClass::proto_name(c.session_class),
            c.open_sessions,
            count(d.success.as_ref()) + count(d.fail.as_ref()),
        );
        if all > 0 {
            t.push_str(&format!(
                ", {:.0}% of device time",
                100.0 * device(c) as f64 / all as f64
            ));
        }
        if c.deadline_missed > 0 {
            t.push_str(&format!(", {} past their deadline", c.deadline_missed));
        }
        t
    });
    Some(each.collect::<Vec<_>>().join("; "))
}

/// How many device recoveries there were, and how long ago the last one started.
fn recoveries(count: u64, last_unix_ms: u64) -> String {
    if count == 0 {
        return "none".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let ago = now.saturating_sub(last_unix_ms) / 1000;
    format!("{count} (the last started {ago} s ago, at {last_unix_ms} ms since the Unix epoch)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classes_row_sums_up_each_class_and_is_absent_without_them() {
        assert_eq!(classes(&pb::Statistics::default()), None);
        let class = |c: pb::SessionClass, open, n, device_ns, missed| pb::ClassStatistics {
            session_class: c.into(),
            open_sessions: open,
            dispatches: Some(pb::DispatchStatistics {
                success: Some(pb::Duration { count: n, ns: 0 }),
                execute: Some(pb::Duration {
                    count: n,
                    ns: device_ns,
                }),
                ..Default::default()
            }),
            deadline_missed: missed,
        };
        let s = pb::Statistics {
            classes: vec![
                class(pb::SessionClass::Batch, 2, 30, 600, 0),
                class(pb::SessionClass::Interactive, 1, 10, 200, 4),
            ],
            ..Default::default()
        };
        assert_eq!(
            classes(&s).unwrap(),
            "batch 2 open, 30 dispatches, 75% of device time; interactive 1 open, 10 \
             dispatches, 25% of device time, 4 past their deadline"
        );
    }
}

//! The daemon's messages as JSON, with the proto's field names: what `npuctl --json` prints and
//! what the Python package hands back as dicts, so both show every field the same way. A
//! session class is its name (`batch`, `interactive`), as `npuctl --class` and Python's
//! `session_class=` take it. A [`crate::Fleet`]'s view of its hosts too.

use serde_json::{Value, json};

use crate::class::SessionClass;
use crate::fleet::{Fleet, HostHealth};
use crate::proto as pb;

/// A `Duration` (count, ns).
pub fn duration_json(d: Option<&pb::Duration>) -> Value {
    let d = d.cloned().unwrap_or_default();
    json!({ "count": d.count, "ns": d.ns })
}

/// `Limits`, every field.
pub fn limits_json(l: Option<&pb::Limits>) -> Value {
    let l = l.cloned().unwrap_or_default();
    json!({
        "max_sessions": l.max_sessions,
        "max_tensors_per_session": l.max_tensors_per_session,
        "max_tensor_bytes_per_session": l.max_tensor_bytes_per_session,
        "max_chain_links": l.max_chain_links,
        "max_pending_per_session": l.max_pending_per_session,
        "max_cached_programs": l.max_cached_programs,
        "max_message_bytes": l.max_message_bytes,
    })
}

/// `DeviceInfo`, every field, with the proto's field names.
pub fn device_json(d: &pb::DeviceInfo) -> Value {
    json!({
        "generation": d.generation,
        "agent_name": d.agent_name,
        "product_name": d.product_name,
        "backend": d.backend,
        "runtime_library": d.runtime_library,
        "runtime_version": d.runtime_version,
        "packet_abi": d.packet_abi,
        "packet_abi_source": d.packet_abi_source,
        "heap_size_bytes": d.heap_size_bytes,
        "heap_used_bytes": d.heap_used_bytes,
        "programs_loaded": d.programs_loaded,
        "fd_export": d.fd_export,
        "daemon_version": d.daemon_version,
        "session_grace_ms": d.session_grace_ms,
        "sessions": d.sessions,
        "serving": d.serving,
        "recoveries": d.recoveries,
        "last_recovery_unix_ms": d.last_recovery_unix_ms,
        "limits": limits_json(d.limits.as_ref()),
        "io_threads": d.io_threads,
        "executor_spin_us": d.executor_spin_us,
        "generation_source": d.generation_source,
        "tensor_sharing": d.tensor_sharing,
        "tensor_sharing_reason": d.tensor_sharing_reason,
        "emulator_profile": d.emulator_profile,
        "tcp_address": d.tcp_address,
        "tcp_security": d.tcp_security,
        "caller_identity": d.caller_identity,
        "caller_admin": d.caller_admin,
        "metrics_address": d.metrics_address,
        "runtime_notes": d.runtime_notes,
        "device_time_modelled": d.device_time_modelled,
    })
}

/// `DispatchStatistics`, every field.
pub fn dispatches_json(d: Option<&pb::DispatchStatistics>) -> Value {
    let d = d.cloned().unwrap_or_default();
    let mut errors: Vec<_> = d.errors.iter().collect();
    errors.sort();
    json!({
        "success": duration_json(d.success.as_ref()),
        "fail": duration_json(d.fail.as_ref()),
        "queue": duration_json(d.queue.as_ref()),
        "execute": duration_json(d.execute.as_ref()),
        "errors": errors.into_iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "last_dispatch_unix_ms": d.last_dispatch_unix_ms,
    })
}

/// `SessionStatistics`, every field.
pub fn session_json(s: &pb::SessionStatistics) -> Value {
    json!({
        "session_id": s.session_id,
        "client_name": s.client_name,
        "uid": s.uid,
        "identity": s.identity,
        "connected": s.connected,
        "tensors": s.tensors,
        "tensor_bytes": s.tensor_bytes,
        "programs": s.programs,
        "device_faults": s.device_faults,
        "dispatches": dispatches_json(s.dispatches.as_ref()),
        "session_class": SessionClass::proto_name(s.session_class),
        "deadline_us": s.deadline_us,
    })
}

/// `ClassStatistics`, every field; the class by name (`batch`, `interactive`).
pub fn class_stats_json(c: &pb::ClassStatistics) -> Value {
    json!({
        "session_class": SessionClass::proto_name(c.session_class),
        "open_sessions": c.open_sessions,
        "dispatches": dispatches_json(c.dispatches.as_ref()),
        "deadline_missed": c.deadline_missed,
    })
}

/// `ProgramSummary`, every field.
pub fn summary_json(s: Option<&pb::ProgramSummary>) -> Value {
    let s = s.cloned().unwrap_or_default();
    json!({
        "generation": s.generation,
        "arg_count": s.arg_count,
        "min_arg_bytes": s.min_arg_bytes,
        "kind": s.kind,
        "insts_bytes": s.insts_bytes,
        "pdi_bytes": s.pdi_bytes,
        "columns": s.columns,
        "op_count": s.op_count,
        "form": s.form,
        "kernel_name": s.kernel_name,
        "kernel_kind": s.kernel_kind,
    })
}

/// `ProgramStatistics`, every field.
pub fn program_stats_json(p: &pb::ProgramStatistics) -> Value {
    json!({
        "program_id": p.program_id,
        "name": p.name,
        "content_hash": p.content_hash,
        "form": p.form,
        "kernel_name": p.kernel_name,
        "kernel_kind": p.kernel_kind,
        "references": p.references,
        "loaded": p.loaded,
        "quarantined": p.quarantined,
        "loads": p.loads,
        "dispatches": dispatches_json(p.dispatches.as_ref()),
    })
}

/// `Statistics`, every field, with the proto's field names.
pub fn statistics_json(s: &pb::Statistics) -> Value {
    json!({
        "sessions": s.sessions.iter().map(session_json).collect::<Vec<_>>(),
        "programs": s.programs.iter().map(program_stats_json).collect::<Vec<_>>(),
        "sessions_opened": s.sessions_opened,
        "sessions_ended": s.sessions_ended,
        "device_faults": s.device_faults,
        "uptime_ms": s.uptime_ms,
        "pending_dispatches": s.pending_dispatches,
        "open_sessions": s.open_sessions,
        "classes": s.classes.iter().map(class_stats_json).collect::<Vec<_>>(),
    })
}

/// A fleet's health word (`serving`, `not_serving`, `down`, `unknown`) and its reason.
#[must_use]
pub fn host_health(h: &HostHealth) -> (&'static str, Option<&str>) {
    match h {
        HostHealth::Unknown => ("unknown", None),
        HostHealth::Serving => ("serving", None),
        HostHealth::NotServing(why) => ("not_serving", Some(why)),
        HostHealth::Down(why) => ("down", Some(why)),
    }
}

/// What a [`Fleet`] knows of its hosts: `fleet`, `resolve_error`, `next` (the address the next
/// session would go to, or null) and `hosts` (address, health, reason, sessions,
/// pending_dispatches, next, checked_ms_ago, retry_in_ms).
#[must_use]
pub fn fleet_json(fleet: &Fleet) -> Value {
    let ms = |d: Option<std::time::Duration>| {
        d.map_or(Value::Null, |d| {
            json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
    };
    let hosts = fleet.hosts();
    json!({
        "fleet": fleet.spec().to_string(),
        "resolve_error": fleet.resolve_error(),
        "next": hosts.iter().find(|h| h.next).map(|h| h.address.to_string()),
        "hosts": hosts.iter().map(|h| {
            let (word, reason) = host_health(&h.health);
            json!({
                "address": h.address.to_string(),
                "health": word,
                "reason": reason,
                "sessions": h.sessions,
                "pending_dispatches": h.pending_dispatches,
                "next": h.next,
                "checked_ms_ago": ms(h.checked_ago),
                "retry_in_ms": ms(h.retry_in),
            })
        }).collect::<Vec<_>>(),
    })
}

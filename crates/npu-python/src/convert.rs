//! The daemon's `DeviceInfo` and `Statistics` as JSON text with the proto's field names, which
//! the Python half loads into dicts.

use npu_client::proto as pb;
use serde_json::{Value, json};

fn duration(d: Option<&pb::Duration>) -> Value {
    let d = d.cloned().unwrap_or_default();
    json!({ "count": d.count, "ns": d.ns })
}

fn limits(l: Option<&pb::Limits>) -> Value {
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

/// Every field of `DeviceInfo`.
pub(crate) fn device_json(d: &pb::DeviceInfo) -> String {
    json!({
        "generation": d.generation,
        "agent_name": d.agent_name,
        "product_name": d.product_name,
        "backend": d.backend,
        "runtime_library": d.runtime_library,
        "runtime_version": d.runtime_version,
        "packet_abi": d.packet_abi,
        "heap_size_bytes": d.heap_size_bytes,
        "heap_used_bytes": d.heap_used_bytes,
        "programs_loaded": d.programs_loaded,
        "fd_export": d.fd_export,
        "daemon_version": d.daemon_version,
        "session_grace_ms": d.session_grace_ms,
        "sessions": d.sessions,
        "serving": d.serving,
        "limits": limits(d.limits.as_ref()),
        "io_threads": d.io_threads,
        "executor_spin_us": d.executor_spin_us,
        "generation_source": d.generation_source,
        "tensor_sharing": d.tensor_sharing,
        "tensor_sharing_reason": d.tensor_sharing_reason,
        "emulator_profile": d.emulator_profile,
    })
    .to_string()
}

fn dispatches(d: Option<&pb::DispatchStatistics>) -> Value {
    let d = d.cloned().unwrap_or_default();
    json!({
        "success": duration(d.success.as_ref()),
        "fail": duration(d.fail.as_ref()),
        "queue": duration(d.queue.as_ref()),
        "execute": duration(d.execute.as_ref()),
        "errors": d.errors,
        "last_dispatch_unix_ms": d.last_dispatch_unix_ms,
    })
}

/// Every field of `Statistics`.
pub(crate) fn statistics_json(s: &pb::Statistics) -> String {
    let sessions: Vec<Value> = s
        .sessions
        .iter()
        .map(|s| {
            json!({
                "session_id": s.session_id,
                "client_name": s.client_name,
                "uid": s.uid,
                "connected": s.connected,
                "tensors": s.tensors,
                "tensor_bytes": s.tensor_bytes,
                "programs": s.programs,
                "dispatches": dispatches(s.dispatches.as_ref()),
            })
        })
        .collect();
    let programs: Vec<Value> = s
        .programs
        .iter()
        .map(|p| {
            json!({
                "program_id": p.program_id,
                "name": p.name,
                "content_hash": p.content_hash,
                "references": p.references,
                "loaded": p.loaded,
                "quarantined": p.quarantined,
                "loads": p.loads,
                "dispatches": dispatches(p.dispatches.as_ref()),
            })
        })
        .collect();
    json!({
        "sessions": sessions,
        "programs": programs,
        "sessions_opened": s.sessions_opened,
        "sessions_ended": s.sessions_ended,
        "device_faults": s.device_faults,
        "uptime_ms": s.uptime_ms,
    })
    .to_string()
}

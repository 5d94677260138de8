//! GetStatistics.

use npu_proto::v1 as pb;

use tonic::Request;

use super::NpudService;
use crate::error::NpudError;
use crate::programs::Page;

impl NpudService {
    /// Device-wide counters for any caller the policy allows; per-session and per-program
    /// details of the caller's own sessions, or of all of them for an admin. Programs come a
    /// page at a time ([`Page`]); a page after the first carries only programs.
    pub(super) async fn statistics(
        &self,
        req: Request<pb::GetStatisticsRequest>,
    ) -> Result<pb::Statistics, NpudError> {
        let (who, _) = self.allowed(&req)?;
        let admin = self.state.policy.is_admin(&who);
        let scope = self.visible_sessions(&who);
        let s = &self.state;
        let r = req.get_ref();
        let page = Page::asked(r.programs_after, r.max_programs);
        let (programs, next_programs_after) = s.programs.statistics(scope.as_deref(), page);
        if !page.first() {
            return Ok(pb::Statistics {
                programs,
                next_programs_after,
                ..Default::default()
            });
        }
        let snap = s.exec.snapshot().await;
        let sessions = s
            .sessions
            .snapshot()
            .into_iter()
            .filter(|x| admin || x.owner == who)
            .map(|x| {
                let (tensors, tensor_bytes) = snap.usage.get(&x.id).copied().unwrap_or_default();
                pb::SessionStatistics {
                    session_id: x.id,
                    client_name: x.client_name,
                    uid: x.uid,
                    connected: x.connected,
                    tensors,
                    tensor_bytes,
                    programs: s.programs.count_for(x.id),
                    dispatches: Some(x.stats.to_proto()),
                    device_faults: s.exec.fault_budget().session_faults(x.id),
                    identity: x.owner.to_string(),
                    session_class: super::sessions::class_to_pb(x.priority.class).into(),
                    deadline_us: x.priority.deadline_us(),
                }
            })
            .collect();
        let (sessions_opened, sessions_ended) = s.sessions.totals();
        let open_sessions = u32::try_from(s.sessions.count()).unwrap_or(u32::MAX);
        Ok(pb::Statistics {
            sessions,
            programs,
            next_programs_after,
            sessions_opened,
            sessions_ended,
            device_faults: s.exec.faults(),
            uptime_ms: u64::try_from(s.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            pending_dispatches: s.pending.get(),
            open_sessions,
            classes: s
                .sessions
                .classes()
                .into_iter()
                .map(|c| pb::ClassStatistics {
                    session_class: super::sessions::class_to_pb(c.class).into(),
                    open_sessions: u32::try_from(c.open).unwrap_or(u32::MAX),
                    dispatches: Some(c.stats.to_proto()),
                    deadline_missed: c.deadline_missed,
                })
                .collect(),
        })
    }
}

//! RegisterProgram, UnregisterProgram, ListPrograms, ClearQuarantine.

use npu_proto::v1 as pb;
use tonic::Request;

use super::NpudService;
use crate::conn::ConnInfo;
use crate::error::NpudError;
use crate::executor::Command;
use crate::programs::record_proto;

impl NpudService {
    pub(super) fn register_program(
        &self,
        req: Request<pb::RegisterProgramRequest>,
    ) -> Result<pb::RegisterProgramResponse, NpudError> {
        let caller = self.caller(&req)?;
        self.state.exec.fault_budget().check(
            self.state.sessions.uid(caller.session),
            "register programs",
            std::time::Instant::now(),
        )?;
        let r = req.into_inner();
        let programs = &self.state.programs;
        let reg = match (r.hsaco.is_empty(), r.pdi.is_empty() && r.insts.is_empty()) {
            (true, _) => programs.register(caller.session, r.pdi, r.insts, r.name)?,
            (false, true) => programs.register_hsaco(caller.session, r.hsaco, r.kernel, r.name)?,
            (false, false) => {
                return Err(NpudError::InvalidArgument(
                    "hsaco: set either pdi and insts, or hsaco (and kernel), not both".into(),
                ));
            }
        };
        Ok(pb::RegisterProgramResponse {
            program_id: reg.program.id,
            content_hash: reg.program.hash.clone(),
            newly_stored: reg.newly_stored,
            summary: Some(reg.program.summary.clone()),
        })
    }

    pub(super) async fn unregister_program(
        &self,
        req: Request<pb::UnregisterProgramRequest>,
    ) -> Result<pb::UnregisterProgramResponse, NpudError> {
        let caller = self.caller(&req)?;
        let id = req.get_ref().program_id;
        if let Some(dropped) = self.state.programs.unregister(caller.session, id)? {
            self.state
                .exec
                .send(Command::Unload { program: dropped })
                .await?;
        }
        Ok(pb::UnregisterProgramResponse {})
    }

    pub(super) fn list_programs(
        &self,
        req: Request<pb::ListProgramsRequest>,
    ) -> Result<pb::ListProgramsResponse, NpudError> {
        let session = self.maybe_caller(&req)?.map(|c| c.session);
        Ok(pb::ListProgramsResponse {
            programs: self.state.programs.list(session),
            quarantine: self.state.programs.quarantine_records(session),
        })
    }

    pub(super) fn clear_quarantine(
        &self,
        req: Request<pb::ClearQuarantineRequest>,
    ) -> Result<pb::ClearQuarantineResponse, NpudError> {
        let conn = req.extensions().get::<ConnInfo>();
        may_clear_quarantine(conn, rustix::process::geteuid().as_raw())?;
        let hash = &req.get_ref().content_hash;
        let removed = self.state.programs.clear_quarantine(hash)?;
        if let Some(r) = &removed {
            tracing::warn!(
                hash = %r.content_hash,
                name = %r.name,
                uid = ?conn.and_then(|c| c.uid),
                pid = ?conn.and_then(|c| c.pid),
                "quarantine cleared: these bytes may be registered and run again"
            );
        }
        Ok(pb::ClearQuarantineResponse {
            removed: removed.is_some(),
            record: removed.as_ref().map(|r| record_proto(r, 0)),
        })
    }
}

/// Who may clear a quarantine, until the configuration has an admin policy: a peer on the Unix
/// socket whose uid is root's or the daemon's own (an operator, or the service account). A
/// quarantined program may abort the daemon when it runs again, so no other user may let it
/// back in, and no TCP peer (whose uid the daemon cannot know).
///
/// # Errors
/// PERMISSION_DENIED naming the rule.
fn may_clear_quarantine(conn: Option<&ConnInfo>, daemon_uid: u32) -> Result<(), NpudError> {
    let rule = format!(
        "ClearQuarantine is allowed only over the Unix socket, to root and to the daemon's own \
         uid ({daemon_uid})"
    );
    match conn.and_then(|c| c.uid) {
        Some(uid) if uid == 0 || uid == daemon_uid => Ok(()),
        Some(uid) => Err(NpudError::PermissionDenied(format!(
            "{rule}; this peer is uid {uid}"
        ))),
        None => Err(NpudError::PermissionDenied(format!(
            "{rule}; this peer came over TCP"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(uid: u32) -> ConnInfo {
        ConnInfo {
            id: 1,
            uid: Some(uid),
            pid: Some(7),
            addr: None,
            refused: None,
        }
    }

    #[test]
    fn root_and_the_daemons_uid_may_clear_a_quarantine_nobody_else() {
        may_clear_quarantine(Some(&unix(0)), 990).unwrap();
        may_clear_quarantine(Some(&unix(990)), 990).unwrap();
        let e = may_clear_quarantine(Some(&unix(1000)), 990).unwrap_err();
        assert!(matches!(e, NpudError::PermissionDenied(_)));
        assert_eq!(
            e.message(),
            "ClearQuarantine is allowed only over the Unix socket, to root and to the daemon's \
             own uid (990); this peer is uid 1000"
        );
        let tcp = ConnInfo {
            id: 2,
            uid: None,
            pid: None,
            addr: "127.0.0.1:5".parse().ok(),
            refused: None,
        };
        let e = may_clear_quarantine(Some(&tcp), 0).unwrap_err();
        assert!(e.message().ends_with("this peer came over TCP"), "{e}");
        assert!(may_clear_quarantine(None, 0).is_err());
    }
}

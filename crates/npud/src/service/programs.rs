//! RegisterProgram, UnregisterProgram, ListPrograms, ClearQuarantine.
//!
//! Registration parses, validates and hashes up to `limits.max_program_bytes` of untrusted bytes
//! per call: milliseconds to tens of milliseconds of CPU and a few times the bytes in memory
//! (npu-artifacts' parsers are linear, see their `# Cost`). That runs as bulk work
//! ([`crate::bulk`]: threads of its own, below the priority of the I/O threads and the executor),
//! never on a runtime worker, so a flood of registrations cannot stall other calls' handlers or
//! the connections they share a worker with, nor take their CPU; at most
//! [`crate::bulk::PARSERS`] run at once, so the memory they hold together stays a small multiple
//! of the program size limit.

use npu_proto::v1 as pb;
use tokio::sync::Semaphore;
use tonic::Request;

use super::NpudService;
use crate::error::NpudError;
use crate::executor::Command;
use crate::peer::ConnInfo;
use crate::programs::{Page, record_proto};

static PARSING: Semaphore = Semaphore::const_new(crate::bulk::PARSERS);

impl NpudService {
    pub(super) async fn register_program(
        &self,
        req: Request<pb::RegisterProgramRequest>,
    ) -> Result<pb::RegisterProgramResponse, NpudError> {
        let caller = self.caller(&req)?;
        self.state.exec.fault_budget().check(
            &self.state.sessions.charged(caller.session),
            "register programs",
            std::time::Instant::now(),
        )?;
        let r = req.into_inner();
        // A rule's lower program-byte quota; `limits.max_program_bytes_per_session` is the
        // store's own check.
        if let Some((grant, _)) = self.state.sessions.grant(caller.session) {
            let q = &grant.quotas.program_bytes;
            let bytes = [r.pdi.len(), r.insts.len(), r.hsaco.len()]
                .iter()
                .map(|n| *n as u64)
                .sum::<u64>();
            let held = self.state.programs.bytes_for(caller.session);
            if q.max < self.state.limits.max_program_bytes_per_session
                && held.saturating_add(bytes) > q.max
            {
                return Err(NpudError::ResourceExhausted(format!(
                    "this session's programs hold {held} bytes; {bytes} more would pass {} \
                     ({}): unregister programs it no longer uses",
                    q.max, q.key
                )));
            }
        }
        if !r.hsaco.is_empty() && (!r.pdi.is_empty() || !r.insts.is_empty()) {
            return Err(NpudError::InvalidArgument(
                "hsaco: set either pdi and insts, or hsaco (and kernel), not both".into(),
            ));
        }
        // The semaphore is never closed, so acquiring fails only if it were. The permit moves
        // into each bulk job: a caller that goes away does not free its turn while one runs.
        let turn = PARSING
            .acquire()
            .await
            .map_err(|e| NpudError::Internal(format!("program parser queue: {e}")))?;
        let programs = std::sync::Arc::clone(&self.state.programs);
        let session = caller.session;
        let lost = |e: crate::bulk::Lost| {
            NpudError::Internal(format!("registering the program failed: {e}"))
        };
        // Hashing and parsing are bulk work, below the priority of the threads that serve
        // every caller; the steps that take the store's lock (which the executor takes for
        // every dispatch) run here, never on a thread of lower priority.
        let (turn, candidate) = crate::bulk::run({
            let programs = programs.clone();
            move || {
                let c = if r.hsaco.is_empty() {
                    programs.candidate(r.pdi, r.insts, r.name)
                } else {
                    programs.hsaco_candidate(r.hsaco, r.kernel, r.name)
                };
                (turn, c)
            }
        })
        .await
        .map_err(lost)?;
        let candidate = candidate?;
        let reg = match programs.admit(session, &candidate) {
            Some(done) => done?,
            None => {
                let validated = crate::bulk::run({
                    let programs = programs.clone();
                    move || {
                        let _turn = turn;
                        programs.validate(candidate)
                    }
                })
                .await
                .map_err(lost)??;
                programs.insert(session, validated)?
            }
        };
        // Whether the bytes were stored before is told only as far as the caller may see: an
        // admin learns whether anyone stored them, anyone else whether its own sessions had.
        let owner = self
            .state
            .sessions
            .snapshot()
            .into_iter()
            .find(|x| x.id == session)
            .map(|x| x.owner);
        let newly_stored = reg.newly_stored
            || owner
                .and_then(|who| self.visible_sessions(&who))
                .is_some_and(|own| !reg.referenced_by.iter().any(|s| own.contains(s)));
        Ok(pb::RegisterProgramResponse {
            program_id: reg.program.id,
            content_hash: reg.program.hash.clone(),
            newly_stored,
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
        // With a session, its programs; without, every program for an admin and the programs
        // of the caller's own sessions for anyone else (names, hashes and quarantine reasons of
        // other tenants' programs are theirs).
        let scope: Option<Vec<u64>> = match self.maybe_caller(&req)? {
            Some(c) => Some(vec![c.session]),
            None => self.visible_sessions(&self.allowed(&req)?.0),
        };
        let r = req.get_ref();
        let store = &self.state.programs;
        // A page of quarantine records alone, after the first.
        if !r.quarantine_after.is_empty() {
            let (quarantine, next_quarantine_after) =
                store.quarantine_records(scope.as_deref(), &r.quarantine_after, Page::MAX);
            return Ok(pb::ListProgramsResponse {
                quarantine,
                next_quarantine_after,
                ..Default::default()
            });
        }
        let page = Page::asked(r.after_program_id, r.max_programs);
        let (programs, next_after_program_id) = store.list(scope.as_deref(), page);
        let (quarantine, next_quarantine_after) = if page.first() {
            store.quarantine_records(scope.as_deref(), "", Page::MAX)
        } else {
            (Vec::new(), String::new())
        };
        Ok(pb::ListProgramsResponse {
            programs,
            quarantine,
            next_after_program_id,
            next_quarantine_after,
        })
    }

    pub(super) fn clear_quarantine(
        &self,
        req: Request<pb::ClearQuarantineRequest>,
    ) -> Result<pb::ClearQuarantineResponse, NpudError> {
        let conn = req.extensions().get::<ConnInfo>();
        // A quarantined program may abort the daemon when it runs again: only an admin may let
        // it back in.
        let who = self.identity(&req)?;
        self.state.policy.require_admin(&who, "ClearQuarantine")?;
        let hash = &req.get_ref().content_hash;
        let removed = self.state.programs.clear_quarantine(hash)?;
        if let Some(r) = &removed {
            tracing::warn!(
                hash = %r.content_hash,
                name = %crate::auth::escape_controls(&r.name),
                identity = %who,
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

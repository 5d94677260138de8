//! RegisterProgram, UnregisterProgram, ListPrograms.

use npu_proto::v1 as pb;
use tonic::Request;

use super::NpudService;
use crate::error::NpudError;
use crate::executor::Command;

impl NpudService {
    pub(super) fn register_program(
        &self,
        req: Request<pb::RegisterProgramRequest>,
    ) -> Result<pb::RegisterProgramResponse, NpudError> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let reg = self
            .state
            .programs
            .register(caller.session, r.pdi, r.insts, r.name)?;
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
        let caller = self.maybe_caller(&req)?;
        Ok(pb::ListProgramsResponse {
            programs: self.state.programs.list(caller.map(|c| c.session)),
        })
    }
}

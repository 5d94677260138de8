//! GetDeviceInfo, OpenSession, ResumeSession, CloseSession.

use npu_proto::v1 as pb;
use tonic::Request;

use super::NpudService;
use crate::error::NpudError;
use crate::peer::ConnInfo;
use crate::priority::{Class, Priority};

impl NpudService {
    pub(super) async fn device_info(
        &self,
        req: Request<pb::GetDeviceInfoRequest>,
    ) -> Result<pb::DeviceInfo, NpudError> {
        // Answers a caller without the token auth.require_token asks for, too.
        let who = self.presented(&req)?;
        let s = &self.state;
        let snap = s.exec.snapshot().await;
        let device = *s.device.borrow();
        let info = &s.facts.info;
        let l = &s.limits;
        Ok(pb::DeviceInfo {
            generation: info.generation.as_str().to_owned(),
            agent_name: info.agent_name.clone(),
            product_name: info.product_name.clone().unwrap_or_default(),
            backend: s.facts.backend.as_str().to_owned(),
            runtime_library: info.library.clone(),
            runtime_version: info.runtime_version.clone().unwrap_or_default(),
            packet_abi: info.packet_abi.as_str().to_owned(),
            heap_size_bytes: info.heap_size as u64,
            heap_used_bytes: snap.heap_used,
            programs_loaded: snap.programs_loaded,
            fd_export: true,
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            session_grace_ms: u64::try_from(s.sessions.grace().as_millis()).unwrap_or(u64::MAX),
            sessions: u32::try_from(s.sessions.count()).unwrap_or(u32::MAX),
            serving: device.serving,
            recoveries: device.recoveries,
            last_recovery_unix_ms: device.last_recovery.map_or(0, |r| r.unix_ms()),
            limits: Some(pb::Limits {
                max_sessions: l.max_sessions,
                max_tensors_per_session: l.max_tensors_per_session,
                max_tensor_bytes_per_session: l.max_tensor_bytes_per_session,
                max_chain_links: l.max_chain_links,
                max_pending_per_session: l.max_pending_per_session,
                max_cached_programs: l.max_cached_programs,
                max_message_bytes: l.max_message_bytes,
            }),
            io_threads: s.io_threads,
            executor_spin_us: s.executor_spin_us,
            generation_source: info.generation_source.clone(),
            tensor_sharing: match info.tensor_sharing {
                hsa_core::TensorSharing::None => "staged".to_owned(),
                other => other.as_str().to_owned(),
            },
            tensor_sharing_reason: info.tensor_sharing_reason.clone(),
            emulator_profile: s.facts.emulator_profile.clone().unwrap_or_default(),
            packet_abi_source: info.packet_abi_source.clone(),
            runtime_notes: crate::executor::runtime_notes(info),
            device_time_modelled: s.facts.device_time_modelled,
            metrics_address: s.metrics_address.clone(),
            tcp_address: s.tcp_address.clone(),
            tcp_security: s.tcp_security.to_owned(),
            caller_admin: s.policy.is_admin(&who),
            caller_identity: who.to_string(),
        })
    }

    pub(super) fn open_session(
        &self,
        req: Request<pb::OpenSessionRequest>,
    ) -> Result<pb::OpenSessionResponse, NpudError> {
        let conn = req.extensions().get::<ConnInfo>().cloned();
        let (who, grant) = self.allowed(&req)?;
        // One principal: the identities this connection also proves are charged too.
        let also = conn.as_ref().map_or_else(Vec::new, |c| {
            let proven: Vec<&crate::auth::Identity> = std::iter::once(&c.identity)
                .chain(c.local.as_ref())
                .collect();
            self.state.policy.charged(&who, &proven)
        });
        let r = req.get_ref();
        let name = &r.client_name;
        let class = match pb::SessionClass::try_from(r.session_class) {
            Ok(pb::SessionClass::Unspecified | pb::SessionClass::Batch) => Class::Batch,
            Ok(pb::SessionClass::Interactive) => Class::Interactive,
            Err(_) => {
                return Err(NpudError::InvalidArgument(format!(
                    "session_class: {} is no SessionClass (BATCH or INTERACTIVE)",
                    r.session_class
                )));
            }
        };
        let priority = Priority::asked(class, r.deadline_us, self.state.interactive_deadline)
            .map_err(NpudError::InvalidArgument)?;
        let (session_id, token) =
            self.state
                .sessions
                .open(name, conn.as_ref(), &who, &grant, &also, priority)?;
        self.state
            .lifecycle
            .open_session(session_id, self.state.sessions.charged(session_id).names());
        tracing::info!(
            session = session_id,
            // A newline in a client's name must not forge a log line.
            client = %crate::auth::escape_controls(name),
            identity = %who,
            also = ?also.iter().map(|(w, _)| w.to_string()).collect::<Vec<_>>(),
            rule = %grant.rule,
            class = %priority.class,
            deadline_us = priority.deadline_us(),
            uid = ?conn.as_ref().and_then(|c| c.uid),
            pid = ?conn.as_ref().and_then(|c| c.pid),
            peer = ?conn.as_ref().and_then(|c| c.addr),
            "session opened"
        );
        Ok(pb::OpenSessionResponse {
            session_id,
            token,
            grace_ms: u64::try_from(self.state.sessions.grace().as_millis()).unwrap_or(u64::MAX),
            session_class: class_to_pb(priority.class).into(),
            deadline_us: priority.deadline_us(),
        })
    }

    pub(super) async fn resume_session(
        &self,
        req: Request<pb::ResumeSessionRequest>,
    ) -> Result<pb::ResumeSessionResponse, NpudError> {
        let conn = req.extensions().get::<ConnInfo>().cloned();
        let who = self.identity(&req)?;
        let r = req.get_ref();
        let id = self
            .state
            .sessions
            .attach(r.session_id, &r.token, conn.as_ref(), &who)?;
        let snap = self.state.exec.snapshot().await;
        let (tensors, _) = snap.usage.get(&id).copied().unwrap_or_default();
        Ok(pb::ResumeSessionResponse {
            session_id: id,
            tensors,
            programs: self.state.programs.count_for(id),
        })
    }

    pub(super) async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Result<pb::CloseSessionResponse, NpudError> {
        let caller = self.caller(&req)?;
        if self.state.sessions.close(caller.session) {
            let why = NpudError::Unauthenticated(format!(
                "session {} was closed (CloseSession): open a new one",
                caller.session
            ));
            Self::end_session(&self.state, caller.session, why).await;
        }
        Ok(pb::CloseSessionResponse {})
    }
}

/// A class as the API names it.
pub(super) fn class_to_pb(c: Class) -> pb::SessionClass {
    match c {
        Class::Batch => pb::SessionClass::Batch,
        Class::Interactive => pb::SessionClass::Interactive,
    }
}

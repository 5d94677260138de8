//! The program store: validated programs kept once by content hash, with the sessions that
//! reference them, their quarantine flag, their cache state and their statistics.
//!
//! Quarantine is kept by content hash, apart from the programs stored: a program that faulted
//! the device gets a [`QuarantineRecord`] (written to the state directory when there is one, and
//! read back at start), and while the record exists its bytes are refused at registration and
//! at dispatch with FAILED_PRECONDITION, whether or not a session still holds them. Only
//! [`Programs::clear_quarantine`] (the ClearQuarantine call) removes a record.
//!
//! Programs are validated with npu-artifacts when registered ([`validate`]): malformed bytes are
//! INVALID_ARGUMENT with the artifact's own message, a program for another generation or
//! another backend is FAILED_PRECONDITION. A program is dropped when its last session lets go;
//! the caller then tells the executor to unload it. The store holds plain data behind a
//! `std::sync::Mutex`; device state (what is loaded) lives in the executor, which reports it
//! back through [`Programs::set_loaded`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use npu_artifacts::NpuGen;
use npu_artifacts::pdi::PdiKind;
use npu_proto::v1 as pb;

use crate::config::Backend;
use crate::error::NpudError;
use crate::sessions::MAX_NAME_BYTES;
use crate::state_dir::quarantine::is_hash;
use crate::state_dir::{QuarantineDir, QuarantineRecord};
use crate::stats::{DispatchStats, Outcome};

/// A stored program: its bytes and what the daemon needs to know to check a dispatch.
#[derive(Debug)]
pub struct Program {
    pub id: u64,
    /// blake3 of the PDI followed by the instruction stream, hex.
    pub hash: String,
    pub name: String,
    pub pdi: Vec<u8>,
    pub insts: Vec<u8>,
    pub summary: pb::ProgramSummary,
}

impl Program {
    /// Refuses arguments that are fewer or smaller than the program's DDR patches require.
    /// `sizes` are the byte lengths of the arguments; `field` names them (`args`,
    /// `links[2].args`).
    ///
    /// # Errors
    /// INVALID_ARGUMENT naming the argument.
    pub fn check_args(
        &self,
        sizes: &[u64],
        field: impl std::fmt::Display,
    ) -> Result<(), NpudError> {
        let need = &self.summary.min_arg_bytes;
        if sizes.len() < need.len() {
            return Err(NpudError::InvalidArgument(format!(
                "{field}: program {} ({}) takes {} buffer arguments; {} given",
                self.id,
                self.display_name(),
                need.len(),
                sizes.len()
            )));
        }
        for (i, (&have, &min)) in sizes.iter().zip(need).enumerate() {
            if have < min {
                return Err(NpudError::InvalidArgument(format!(
                    "{field}[{i}]: {have} bytes, but program {} ({}) needs at least {min} \
                     (its instruction stream patches that many)",
                    self.id,
                    self.display_name()
                )));
            }
        }
        Ok(())
    }

    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            &self.summary.kind
        } else {
            &self.name
        }
    }
}

/// The content hash of a program's bytes.
pub fn content_hash(pdi: &[u8], insts: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(pdi);
    h.update(insts);
    h.finalize().to_hex().to_string()
}

/// Checks uploaded bytes before they are stored.
///
/// # Errors
/// RESOURCE_EXHAUSTED above `max_bytes`; INVALID_ARGUMENT with the artifact error for malformed
/// bytes; FAILED_PRECONDITION for another generation, or a design the backend cannot run.
pub fn validate(
    pdi: &[u8],
    insts: &[u8],
    max_bytes: u64,
    device: NpuGen,
    backend: Backend,
) -> Result<pb::ProgramSummary, NpudError> {
    let total = (pdi.len() as u64).saturating_add(insts.len() as u64);
    if total > max_bytes {
        return Err(NpudError::ResourceExhausted(format!(
            "pdi and insts: {total} bytes together; at most {max_bytes} (limits.max_program_bytes)"
        )));
    }
    if pdi.is_empty() {
        return Err(NpudError::InvalidArgument("pdi: empty".into()));
    }
    if insts.is_empty() {
        return Err(NpudError::InvalidArgument("insts: empty".into()));
    }
    let (kind, txn) = npu_artifacts::design::check_pair(pdi, insts)
        .map_err(|e| NpudError::InvalidArgument(format!("invalid program: {e}")))?;
    txn.check_generation(device)
        .map_err(|e| NpudError::FailedPrecondition(format!("insts: {e}")))?;
    let kind_name = match (&kind, backend) {
        (PdiKind::Emulated(d), Backend::Emulator) => d.kernel.name().to_owned(),
        (PdiKind::Partial(_), Backend::Hsa) => "pdi".to_owned(),
        (PdiKind::Partial(_), Backend::Emulator) => {
            return Err(NpudError::FailedPrecondition(
                "pdi: a real partial PDI (PPDI): real designs need an NPU; this daemon runs the \
                 emulator (--backend emulator), which runs emulated designs only"
                    .into(),
            ));
        }
        (PdiKind::Emulated(d), Backend::Hsa) => {
            return Err(NpudError::FailedPrecondition(format!(
                "pdi: an emulated design ({}) runs only on the emulator; this daemon drives an \
                 NPU (--backend hsa)",
                d.kernel.name()
            )));
        }
        (PdiKind::Xclbin(_), _) => {
            return Err(NpudError::InvalidArgument(
                "pdi: an xclbin, not a PDI; the HSA path needs main.pdi from aiecc --get-pdi"
                    .into(),
            ));
        }
    };
    Ok(pb::ProgramSummary {
        generation: gen_name(txn.generation).to_owned(),
        arg_count: u32::try_from(txn.arg_count()).unwrap_or(u32::MAX),
        min_arg_bytes: txn.min_arg_sizes(),
        kind: kind_name,
        insts_bytes: u32::try_from(insts.len()).unwrap_or(u32::MAX),
        pdi_bytes: u32::try_from(pdi.len()).unwrap_or(u32::MAX),
        columns: u32::from(txn.cols),
        op_count: txn.op_count,
    })
}

#[derive(Debug)]
struct Entry {
    program: Arc<Program>,
    refs: HashSet<u64>,
    quarantined: bool,
    loaded: bool,
    loads: u64,
    stats: DispatchStats,
}

#[derive(Debug, Default)]
struct Store {
    by_hash: HashMap<String, u64>,
    entries: BTreeMap<u64, Entry>,
    next_id: u64,
    /// Quarantine records by content hash, stored programs or not.
    quarantine: HashMap<String, QuarantineRecord>,
}

/// Every stored program, and every quarantine record.
#[derive(Debug)]
pub struct Programs {
    inner: Mutex<Store>,
    max_bytes: u64,
    device: NpuGen,
    backend: Backend,
    /// Where records are kept across restarts; `None` when `state_dir` is empty.
    records: Option<QuarantineDir>,
}

/// The result of a registration.
#[derive(Debug)]
pub struct Registered {
    pub program: Arc<Program>,
    pub newly_stored: bool,
}

/// What [`Programs::runnable`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runnable {
    Yes,
    /// Unregistered by every session that held it.
    Gone,
    /// It faulted the device.
    Quarantined,
}

impl Programs {
    /// A store that refuses the programs `quarantined` names, and writes new records to
    /// `records` (when persistence is on).
    pub fn new(
        max_bytes: u64,
        device: NpuGen,
        backend: Backend,
        records: Option<QuarantineDir>,
        quarantined: Vec<QuarantineRecord>,
    ) -> Self {
        Self {
            inner: Mutex::new(Store {
                next_id: 1,
                quarantine: quarantined
                    .into_iter()
                    .map(|r| (r.content_hash.clone(), r))
                    .collect(),
                ..Store::default()
            }),
            max_bytes,
            device,
            backend,
            records,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores a program (or finds the stored one with the same bytes) and adds `session`'s
    /// reference.
    ///
    /// # Errors
    /// As [`validate`]; INVALID_ARGUMENT for a name over 128 bytes; FAILED_PRECONDITION for
    /// bytes with a quarantine record (naming the hash, when and why, and how to clear it).
    pub fn register(
        &self,
        session: u64,
        pdi: Vec<u8>,
        insts: Vec<u8>,
        name: String,
    ) -> Result<Registered, NpudError> {
        if name.len() > MAX_NAME_BYTES {
            return Err(NpudError::InvalidArgument(format!(
                "name: {} bytes; at most {MAX_NAME_BYTES}",
                name.len()
            )));
        }
        let hash = content_hash(&pdi, &insts);
        {
            let mut g = self.lock();
            if let Some(r) = g.quarantine.get(&hash) {
                return Err(refused_at_registration(r));
            }
            if let Some(id) = g.by_hash.get(&hash).copied()
                && let Some(e) = g.entries.get_mut(&id)
            {
                e.refs.insert(session);
                return Ok(Registered {
                    program: e.program.clone(),
                    newly_stored: false,
                });
            }
        }
        let summary = validate(&pdi, &insts, self.max_bytes, self.device, self.backend)?;
        let mut g = self.lock();
        if let Some(r) = g.quarantine.get(&hash) {
            return Err(refused_at_registration(r));
        }
        // Another session may have stored the same bytes while this one validated.
        if let Some(id) = g.by_hash.get(&hash).copied()
            && let Some(e) = g.entries.get_mut(&id)
        {
            e.refs.insert(session);
            return Ok(Registered {
                program: e.program.clone(),
                newly_stored: false,
            });
        }
        let id = g.next_id;
        g.next_id += 1;
        let program = Arc::new(Program {
            id,
            hash: hash.clone(),
            name,
            pdi,
            insts,
            summary,
        });
        g.by_hash.insert(hash, id);
        g.entries.insert(
            id,
            Entry {
                program: program.clone(),
                refs: HashSet::from([session]),
                quarantined: false,
                loaded: false,
                loads: 0,
                stats: DispatchStats::default(),
            },
        );
        tracing::info!(program = id, session, "stored a program");
        Ok(Registered {
            program,
            newly_stored: true,
        })
    }

    /// Drops `session`'s reference. Returns the id if that was the last reference and the
    /// program was dropped (the executor must unload it).
    ///
    /// # Errors
    /// NOT_FOUND when the session holds no reference to `id`.
    pub fn unregister(&self, session: u64, id: u64) -> Result<Option<u64>, NpudError> {
        let mut g = self.lock();
        let e = g
            .entries
            .get_mut(&id)
            .filter(|e| e.refs.contains(&session))
            .ok_or_else(|| not_found("program_id", id))?;
        e.refs.remove(&session);
        Ok(drop_if_unused(&mut g, id))
    }

    /// Drops every reference of an ended session; returns the programs dropped.
    pub fn release_session(&self, session: u64) -> Vec<u64> {
        let mut g = self.lock();
        let ids: Vec<u64> = g
            .entries
            .iter_mut()
            .filter_map(|(id, e)| e.refs.remove(&session).then_some(*id))
            .collect();
        ids.into_iter()
            .filter_map(|id| drop_if_unused(&mut g, id))
            .collect()
    }

    /// The program `id` for a dispatch by `session`; `field` names the request field.
    ///
    /// # Errors
    /// NOT_FOUND when the session holds no reference; FAILED_PRECONDITION when quarantined.
    pub fn for_dispatch(
        &self,
        session: u64,
        id: u64,
        field: impl std::fmt::Display,
    ) -> Result<Arc<Program>, NpudError> {
        let mut g = self.lock();
        let Store {
            entries,
            quarantine,
            ..
        } = &mut *g;
        let e = entries
            .get_mut(&id)
            .filter(|e| e.refs.contains(&session))
            .ok_or_else(|| not_found(&field, id))?;
        if e.quarantined {
            let why = quarantine
                .get(&e.program.hash)
                .map_or_else(|| "it faulted the device".to_owned(), explain);
            let err = NpudError::FailedPrecondition(format!(
                "{field}: program {id} ({}, hash {}) is quarantined {why}",
                e.program.display_name(),
                e.program.hash,
            ));
            e.stats.record(1, Outcome::Fail(err.code_name()), 0, 0);
            return Err(err);
        }
        Ok(e.program.clone())
    }

    /// Whether work naming program `id` may still run, in one lookup: the store drops a
    /// program (and ids are never reused) before the executor is told to unload it.
    pub fn runnable(&self, id: u64) -> Runnable {
        match self.lock().entries.get(&id) {
            None => Runnable::Gone,
            Some(e) if e.quarantined => Runnable::Quarantined,
            Some(_) => Runnable::Yes,
        }
    }

    /// Quarantines program `id` for `reason`: flags it, keeps a record of its hash, and writes
    /// the record durably to the state directory (a failure there is logged: the program then
    /// stays quarantined only until the daemon stops). Returns the record.
    pub fn quarantine(&self, id: u64, reason: &str) -> Option<QuarantineRecord> {
        let record = {
            let mut g = self.lock();
            let e = g.entries.get_mut(&id)?;
            e.quarantined = true;
            let r = QuarantineRecord::now(&e.program.hash, &e.program.name, reason);
            g.quarantine.insert(r.content_hash.clone(), r.clone());
            r
        };
        if let Some(dir) = &self.records
            && let Err(e) = dir.write(&record)
        {
            tracing::error!(
                program = id,
                hash = %record.content_hash,
                error = %e,
                "the quarantine record could not be written; the program is quarantined only \
                 until the daemon stops"
            );
        }
        Some(record)
    }

    /// Removes the quarantine record of `hash` (on disk first, then in memory) and lets a stored
    /// program with those bytes run again. Returns the record removed; `None` when there was
    /// none.
    ///
    /// # Errors
    /// INVALID_ARGUMENT when `hash` is not a content hash; INTERNAL when the record's file
    /// cannot be removed (nothing changes then).
    pub fn clear_quarantine(&self, hash: &str) -> Result<Option<QuarantineRecord>, NpudError> {
        let hash = hash.trim().to_ascii_lowercase();
        if !is_hash(&hash) {
            return Err(NpudError::InvalidArgument(format!(
                "content_hash: {hash:?} is not a content hash (64 hex characters, as `npuctl \
                 programs` and RegisterProgram show it)"
            )));
        }
        let on_disk = match &self.records {
            Some(dir) => dir.remove(&hash).map_err(|e| {
                NpudError::Internal(format!("clearing the quarantine of {hash}: {e}"))
            })?,
            None => false,
        };
        let mut g = self.lock();
        let removed = g.quarantine.remove(&hash);
        if let Some(id) = g.by_hash.get(&hash).copied()
            && let Some(e) = g.entries.get_mut(&id)
        {
            e.quarantined = false;
        }
        Ok(match removed {
            Some(r) => Some(r),
            // A file this daemon had not read (written by hand, or by another daemon since).
            None if on_disk => Some(QuarantineRecord {
                content_hash: hash,
                name: String::new(),
                faulted_unix_s: 0,
                reason: String::new(),
            }),
            None => None,
        })
    }

    /// Quarantine records: every one (`None`), or those of `session`'s programs.
    pub fn quarantine_records(&self, session: Option<u64>) -> Vec<pb::QuarantineRecord> {
        let g = self.lock();
        let stored = |hash: &str| {
            g.by_hash
                .get(hash)
                .and_then(|id| g.entries.get(id))
                .map(|e| (e.program.id, e.refs.clone()))
        };
        let mut v: Vec<pb::QuarantineRecord> = g
            .quarantine
            .values()
            .filter_map(|r| {
                let program = stored(&r.content_hash);
                match (session, &program) {
                    (None, _) => {}
                    (Some(s), Some((_, refs))) if refs.contains(&s) => {}
                    _ => return None,
                }
                Some(record_proto(r, program.map_or(0, |(id, _)| id)))
            })
            .collect();
        v.sort_by(|a, b| a.content_hash.cmp(&b.content_hash));
        v
    }

    /// The executor loaded (`true`, counted as a load) or unloaded a program.
    pub fn set_loaded(&self, id: u64, loaded: bool) {
        if let Some(e) = self.lock().entries.get_mut(&id) {
            e.loaded = loaded;
            if loaded {
                e.loads += 1;
            }
        }
    }

    pub fn record(&self, id: u64, links: u64, outcome: Outcome, queue_ns: u64, device_ns: u64) {
        if let Some(e) = self.lock().entries.get_mut(&id) {
            e.stats.record(links, outcome, queue_ns, device_ns);
        }
    }

    /// Programs `session` references (every program with `None`).
    pub fn list(&self, session: Option<u64>) -> Vec<pb::ProgramListing> {
        let g = self.lock();
        g.entries
            .values()
            .filter(|e| session.is_none_or(|s| e.refs.contains(&s)))
            .map(|e| pb::ProgramListing {
                program_id: e.program.id,
                name: e.program.name.clone(),
                content_hash: e.program.hash.clone(),
                references: refs(e),
                loaded: e.loaded,
                quarantined: e.quarantined,
                summary: Some(e.program.summary.clone()),
            })
            .collect()
    }

    pub fn statistics(&self) -> Vec<pb::ProgramStatistics> {
        let g = self.lock();
        g.entries
            .values()
            .map(|e| pb::ProgramStatistics {
                program_id: e.program.id,
                name: e.program.name.clone(),
                content_hash: e.program.hash.clone(),
                references: refs(e),
                loaded: e.loaded,
                quarantined: e.quarantined,
                loads: e.loads,
                dispatches: Some(e.stats.to_proto()),
            })
            .collect()
    }

    /// How many programs `session` references.
    pub fn count_for(&self, session: u64) -> u32 {
        let n = self
            .lock()
            .entries
            .values()
            .filter(|e| e.refs.contains(&session))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// `npu1` or `npu2`.
pub fn gen_name(g: NpuGen) -> &'static str {
    match g {
        NpuGen::Npu1 => "npu1",
        NpuGen::Npu2 => "npu2",
    }
}

fn refs(e: &Entry) -> u32 {
    u32::try_from(e.refs.len()).unwrap_or(u32::MAX)
}

fn drop_if_unused(g: &mut Store, id: u64) -> Option<u64> {
    let unused = g.entries.get(&id).is_some_and(|e| e.refs.is_empty());
    if !unused {
        return None;
    }
    if let Some(e) = g.entries.remove(&id) {
        g.by_hash.remove(&e.program.hash);
        tracing::info!(program = id, "dropped a program no session references");
    }
    Some(id)
}

/// `since T: reason; to run it again, ...`: when and why a program was quarantined, and how to
/// clear it.
fn explain(r: &QuarantineRecord) -> String {
    format!(
        "since {}: {}; once the design is fixed (or to try it again), clear it with `npuctl \
         programs --clear-quarantine {}`",
        r.faulted_at(),
        r.reason,
        r.content_hash
    )
}

fn refused_at_registration(r: &QuarantineRecord) -> NpudError {
    let name = if r.name.is_empty() {
        String::new()
    } else {
        format!(" ({})", r.name)
    };
    NpudError::FailedPrecondition(format!(
        "program {}{name} is quarantined {}",
        r.content_hash,
        explain(r)
    ))
}

/// A record as the API shows it; `program_id` is the stored program with its bytes, or 0.
pub fn record_proto(r: &QuarantineRecord, program_id: u64) -> pb::QuarantineRecord {
    pb::QuarantineRecord {
        content_hash: r.content_hash.clone(),
        name: r.name.clone(),
        faulted_unix_s: r.faulted_unix_s,
        faulted_at: r.faulted_at(),
        reason: r.reason.clone(),
        program_id,
    }
}

fn not_found(field: impl std::fmt::Display, id: u64) -> NpudError {
    NpudError::NotFound(format!(
        "{field}: no program {id} in this session (register it first)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use npu_artifacts::emu::{DType, EmuDesign};

    fn vsa(scalar: i64) -> (Vec<u8>, Vec<u8>) {
        let d = EmuDesign::vector_scalar_add(1024, DType::I32, scalar);
        (d.to_pdi(), d.insts(NpuGen::Npu2))
    }

    fn store() -> Programs {
        Programs::new(8 << 20, NpuGen::Npu2, Backend::Emulator, None, Vec::new())
    }

    #[test]
    fn same_bytes_from_two_sessions_are_one_program() {
        let p = store();
        let (pdi, insts) = vsa(1);
        let a = p
            .register(1, pdi.clone(), insts.clone(), "a".into())
            .unwrap();
        let b = p.register(2, pdi, insts, "b".into()).unwrap();
        assert!(a.newly_stored);
        assert!(!b.newly_stored);
        assert_eq!(a.program.id, b.program.id);
        assert_eq!(p.list(None)[0].references, 2);
        assert_eq!(a.program.summary.min_arg_bytes, vec![4096, 4096]);
        assert_eq!(p.unregister(1, a.program.id).unwrap(), None);
        assert!(p.for_dispatch(1, a.program.id, "program_id").is_err());
        assert_eq!(p.release_session(2), vec![a.program.id]);
        assert!(p.list(None).is_empty());
    }

    #[test]
    fn foreign_programs_are_not_found() {
        let p = store();
        let (pdi, insts) = vsa(1);
        let a = p.register(1, pdi, insts, String::new()).unwrap();
        let e = p.for_dispatch(2, a.program.id, "program_id").unwrap_err();
        assert!(matches!(e, NpudError::NotFound(_)));
        assert!(e.message().starts_with("program_id: "), "{e}");
    }

    #[test]
    fn malformed_and_mismatched_programs_are_refused() {
        let (pdi, insts) = vsa(1);
        let e = validate(
            &pdi,
            &insts[..insts.len() - 4],
            1 << 20,
            NpuGen::Npu2,
            Backend::Emulator,
        )
        .unwrap_err();
        assert!(matches!(e, NpudError::InvalidArgument(_)), "{e}");
        assert!(e.message().contains("insts.bin"), "{e}");
        let e = validate(&pdi, &insts, 1 << 20, NpuGen::Npu1, Backend::Emulator).unwrap_err();
        assert!(matches!(e, NpudError::FailedPrecondition(_)), "{e}");
        let e = validate(&pdi, &insts, 16, NpuGen::Npu2, Backend::Emulator).unwrap_err();
        assert!(matches!(e, NpudError::ResourceExhausted(_)), "{e}");
    }

    #[test]
    fn too_few_or_too_small_args_name_the_argument() {
        let p = store();
        let (pdi, insts) = vsa(1);
        let r = p.register(1, pdi, insts, String::new()).unwrap();
        let e = r.program.check_args(&[4096], "args").unwrap_err();
        assert!(e.message().starts_with("args: "), "{e}");
        let e = r
            .program
            .check_args(&[4096, 100], "links[3].args")
            .unwrap_err();
        assert!(
            e.message().starts_with("links[3].args[1]: 100 bytes"),
            "{e}"
        );
        r.program.check_args(&[4096, 4096, 4], "args").unwrap();
    }

    #[test]
    fn a_quarantined_hash_is_refused_at_registration_and_dispatch_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = QuarantineDir::open(dir.path()).unwrap();
        let p = Programs::new(
            8 << 20,
            NpuGen::Npu2,
            Backend::Emulator,
            Some(records),
            Vec::new(),
        );
        let (pdi, insts) = vsa(1);
        let a = p
            .register(1, pdi.clone(), insts.clone(), "vsa".into())
            .unwrap();
        let hash = a.program.hash.clone();
        let r = p
            .quarantine(a.program.id, "it faulted the device: boom")
            .unwrap();
        assert_eq!(r.name, "vsa");
        let e = p.for_dispatch(1, a.program.id, "program_id").unwrap_err();
        assert!(matches!(e, NpudError::FailedPrecondition(_)), "{e}");
        for needle in [
            "program_id: program 1 (vsa, hash ",
            "is quarantined since ",
            "boom",
            &format!("npuctl programs --clear-quarantine {hash}"),
        ] {
            assert!(e.message().contains(needle), "{needle:?} in {e}");
        }
        // Dropped by every session, its bytes are still refused: the record is by hash.
        assert_eq!(p.release_session(1), vec![a.program.id]);
        let e = p
            .register(2, pdi.clone(), insts.clone(), String::new())
            .unwrap_err();
        assert!(matches!(e, NpudError::FailedPrecondition(_)), "{e}");
        assert!(
            e.message()
                .starts_with(&format!("program {hash} (vsa) is quarantined since ")),
            "{e}"
        );
        assert_eq!(p.quarantine_records(None).len(), 1);
        assert!(p.quarantine_records(Some(2)).is_empty());

        // A restarted store reads the record back.
        let (records, back) = QuarantineDir::open(dir.path()).unwrap();
        assert_eq!(back, vec![r.clone()]);
        let p = Programs::new(
            8 << 20,
            NpuGen::Npu2,
            Backend::Emulator,
            Some(records),
            back,
        );
        assert!(
            p.register(3, pdi.clone(), insts.clone(), String::new())
                .is_err()
        );
        let e = p.clear_quarantine("not a hash").unwrap_err();
        assert!(matches!(e, NpudError::InvalidArgument(_)), "{e}");
        assert_eq!(p.clear_quarantine(&hash.to_uppercase()).unwrap(), Some(r));
        assert_eq!(p.clear_quarantine(&hash).unwrap(), None);
        p.register(3, pdi, insts, String::new()).unwrap();
        assert!(QuarantineDir::open(dir.path()).unwrap().1.is_empty());
    }
}

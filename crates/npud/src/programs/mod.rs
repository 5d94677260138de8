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
//! INVALID_ARGUMENT with the artifact's own message, a program for another generation, or a
//! real design on the emulator (or an emulated one on an NPU), is FAILED_PRECONDITION. A program is dropped when its last session lets go;
//! the caller then tells the executor to unload it. The store holds plain data behind a
//! `std::sync::Mutex`; device state (what is loaded) lives in the executor, which reports it
//! back through [`Programs::set_loaded`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use npu_artifacts::NpuGen;
use npu_proto::v1 as pb;

use crate::error::NpudError;
use crate::sessions::MAX_NAME_BYTES;
use crate::state_dir::{QuarantineDir, QuarantineRecord};

mod quarantine;
mod validate;

use crate::stats::{DispatchStats, Tally};
pub use quarantine::record_proto;
use quarantine::{explain, refused_at_registration};
pub use validate::{validate, validate_hsaco};

mod program;
pub use program::{Code, FORM_HSACO, FORM_PDI_INSTS, Program, content_hash, hsaco_hash};

#[derive(Debug)]
struct Entry {
    program: Arc<Program>,
    refs: crate::IdSet<u64>,
    quarantined: bool,
    loaded: bool,
    loads: u64,
    stats: DispatchStats,
}

#[derive(Debug, Default)]
struct Store {
    by_hash: HashMap<String, u64>,
    entries: BTreeMap<u64, Entry>,
    /// What each session references, kept as references come and go, so that no operation
    /// under the store's lock walks every program: the executor takes this lock for every
    /// dispatch, and a caller's registrations or listings must not hold it for a time that
    /// grows with what other sessions stored.
    held: HashMap<u64, Held>,
    /// Bytes of every stored program.
    total_bytes: u64,
    next_id: u64,
    /// Quarantine records by content hash, stored programs or not; in hash order, so that a
    /// listing pages through them.
    quarantine: BTreeMap<String, QuarantineRecord>,
    /// Loads into the device heap, and evictions from it, since start.
    loads: u64,
    evictions: u64,
}

/// The programs one session references, and their bytes (each distinct content once).
#[derive(Debug, Default)]
struct Held {
    ids: std::collections::BTreeSet<u64>,
    bytes: u64,
    /// The content hashes of those that are quarantined, so that a session's page of
    /// quarantine records is a range here, not a walk over every record.
    quarantined: std::collections::BTreeSet<String>,
}

impl Store {
    /// Adds `session`'s reference to entry `id` (which it did not hold).
    fn add_ref(&mut self, session: u64, id: u64) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if e.refs.insert(session) {
            let h = self.held.entry(session).or_default();
            h.ids.insert(id);
            h.bytes = h.bytes.saturating_add(e.program.byte_len());
            if e.quarantined {
                h.quarantined.insert(e.program.hash.clone());
            }
        }
    }

    /// Flags entry `id` quarantined or not, in the entry and in what each session holding it
    /// holds. Returns the entry.
    fn set_quarantined(&mut self, id: u64, on: bool) -> Option<&Entry> {
        let e = self.entries.get_mut(&id)?;
        e.quarantined = on;
        for s in e.refs.iter() {
            if let Some(h) = self.held.get_mut(s) {
                if on {
                    h.quarantined.insert(e.program.hash.clone());
                } else {
                    h.quarantined.remove(&e.program.hash);
                }
            }
        }
        Some(e)
    }

    /// Drops `session`'s reference to entry `id`; whether it held one.
    fn remove_ref(&mut self, session: u64, id: u64) -> bool {
        let Some(e) = self.entries.get_mut(&id) else {
            return false;
        };
        if !e.refs.remove(&session) {
            return false;
        }
        let len = e.program.byte_len();
        if let Some(h) = self.held.get_mut(&session) {
            h.ids.remove(&id);
            h.bytes = h.bytes.saturating_sub(len);
            if e.quarantined {
                h.quarantined.remove(&e.program.hash);
            }
            if h.ids.is_empty() {
                self.held.remove(&session);
            }
        }
        true
    }

    /// One page of the entries any of `sessions` references (every entry with `None`), in id
    /// order, and the id the next page starts after (0 when none follows). Its cost grows with
    /// the page and the number of sessions, never with what the store holds.
    fn visible<'a>(&'a self, sessions: Option<&[u64]>, page: Page) -> (Vec<&'a Entry>, u64) {
        use std::ops::Bound::{Excluded, Unbounded};
        let above = (Excluded(page.after), Unbounded);
        // One more than the page, to tell whether another page follows.
        let want = page.max + 1;
        let mut entries: Vec<&Entry> = match sessions {
            None => self
                .entries
                .range(above)
                .take(want)
                .map(|(_, e)| e)
                .collect(),
            Some(ss) => {
                // The first `want` ids above `after` of each session hold the first `want` of
                // their union.
                let ids: std::collections::BTreeSet<u64> = ss
                    .iter()
                    .filter_map(|s| self.held.get(s))
                    .flat_map(|h| h.ids.range(above).take(want).copied())
                    .collect();
                ids.iter()
                    .take(want)
                    .filter_map(|id| self.entries.get(id))
                    .collect()
            }
        };
        if entries.len() > page.max {
            entries.truncate(page.max);
            let next = entries.last().map_or(0, |e| e.program.id);
            (entries, next)
        } else {
            (entries, 0)
        }
    }
}

/// One page of a program listing: the programs with ids above `after`, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub after: u64,
    pub max: usize,
}

impl Page {
    /// The most programs one page holds. A page is built and encoded in one piece on the
    /// thread that serves every gRPC call, so its size bounds how long one listing holds up
    /// the others: 256 entries are some 50 KB of answer, where an admin's whole view (up to
    /// `limits.max_sessions` x `limits.max_programs_per_session` programs) was megabytes.
    pub const MAX: usize = 256;

    /// The page a request asks for: `max` 0, or over [`Page::MAX`], is [`Page::MAX`].
    pub fn asked(after: u64, max: u32) -> Page {
        let max = usize::try_from(max).unwrap_or(Page::MAX);
        Page {
            after,
            max: if max == 0 {
                Page::MAX
            } else {
                max.min(Page::MAX)
            },
        }
    }

    /// Whether this is the first page.
    pub fn first(&self) -> bool {
        self.after == 0
    }
}

/// A stored program as a listing shows it ([`Programs::seen`]).
struct Seen {
    program: Arc<Program>,
    references: u32,
    loaded: bool,
    quarantined: bool,
    loads: u64,
    stats: Option<DispatchStats>,
}

pub use crate::config::DEFAULT_MAX_PROGRAMS_PER_SESSION;

/// Store-wide counts, as metrics report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramCounts {
    pub stored: u64,
    pub quarantined: u64,
    pub loads: u64,
    pub evictions: u64,
}

/// Every stored program, and every quarantine record.
#[derive(Debug)]
pub struct Programs {
    inner: Mutex<Store>,
    max_bytes: u64,
    /// Bytes of distinct programs one session may reference (`limits.max_program_bytes_per_session`).
    max_session_bytes: u64,
    /// Distinct programs one session may reference (`limits.max_programs_per_session`): each
    /// costs the daemon its bookkeeping beside its bytes, and listings walk them.
    max_session_programs: u32,
    device: NpuGen,
    runs: Runs,
    /// Where records are kept across restarts; `None` when `state_dir` is empty.
    records: Option<QuarantineDir>,
    /// The packet ABI the device speaks: whether it loads code objects decides which hsaco
    /// kernels can run.
    abi: hsa_core::PacketAbi,
    /// Whether FullElf kernels run as G2 full-ELF packets, or why not.
    g2_full_elf: Result<(), String>,
    /// The daemon-wide budget's program part (`limits.max_total_program_bytes`), checked where
    /// programs are stored; `None`: no daemon-wide limit.
    budget: Option<crate::budget::MemoryBudget>,
}

/// What kind of design the device runs: decided by the runtime that was opened, not by how
/// it was linked, so hsa-sim loaded at run time as `libhsa-runtime64.so` runs emulated
/// designs as the built-in emulator does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// hsa-sim: emulated designs (reference kernels); a real partial PDI cannot run.
    EmulatedDesigns,
    /// An NPU through ROCR: real partial PDIs.
    RealDesigns,
}

impl Runs {
    /// From the runtime's build version (`HSA_AMD_SYSTEM_INFO_BUILD_VERSION`): hsa-sim names
    /// itself there.
    pub fn of_runtime(build_version: Option<&str>) -> Self {
        match build_version {
            Some(v) if v.starts_with("hsa-sim") => Self::EmulatedDesigns,
            _ => Self::RealDesigns,
        }
    }
}

/// The result of a registration.
/// A registration's bytes, hashed ([`Programs::candidate`]).
#[derive(Debug)]
pub struct Candidate {
    hash: String,
    bytes: u64,
    name: String,
    input: Input,
}

#[derive(Debug)]
enum Input {
    PdiInsts { pdi: Vec<u8>, insts: Vec<u8> },
    Hsaco { bytes: Vec<u8>, kernel: String },
}

/// New bytes, validated ([`Programs::validate`]).
#[derive(Debug)]
pub struct Validated {
    hash: String,
    bytes: u64,
    name: String,
    code: Code,
    summary: pb::ProgramSummary,
}

/// INVALID_ARGUMENT for a program name over [`MAX_NAME_BYTES`].
fn check_name(name: &str) -> Result<(), NpudError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(NpudError::InvalidArgument(format!(
            "name: {} bytes; at most {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    Ok(())
}

#[derive(Debug)]
pub struct Registered {
    pub program: Arc<Program>,
    pub newly_stored: bool,
    /// The sessions that referenced the program before this registration.
    pub referenced_by: Vec<u64>,
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
        max_session_bytes: u64,
        device: NpuGen,
        runs: Runs,
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
            max_session_bytes,
            max_session_programs: DEFAULT_MAX_PROGRAMS_PER_SESSION,
            device,
            runs,
            records,
            abi: hsa_core::PacketAbi::G2,
            g2_full_elf: Err("not configured".into()),
            budget: None,
        }
    }

    /// Lets one session reference at most `n` distinct programs.
    #[must_use]
    pub fn with_max_programs_per_session(mut self, n: u32) -> Self {
        self.max_session_programs = n;
        self
    }

    /// Stores programs only while all of them together fit `budget`'s program part.
    #[must_use]
    pub fn with_budget(mut self, budget: crate::budget::MemoryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Whether the G2 runtime takes full-ELF packets (`Err` says why not): FullElf kernels
    /// then run on G2 too.
    #[must_use]
    pub fn with_g2_full_elf(mut self, g2_full_elf: Result<(), String>) -> Self {
        self.g2_full_elf = g2_full_elf;
        self
    }

    /// Refuses `bytes` more stored bytes past the daemon-wide budget (bytes already stored
    /// are found by [`Self::known`] first and cost nothing).
    fn check_total(&self, g: &Store, bytes: u64) -> Result<(), NpudError> {
        let Some(b) = &self.budget else {
            return Ok(());
        };
        b.check_program(g.total_bytes, bytes)
    }

    /// The packet ABI the device speaks (G2 unless set).
    #[must_use]
    pub fn with_packet_abi(mut self, abi: hsa_core::PacketAbi) -> Self {
        self.abi = abi;
        self
    }

    /// Refuses a program of `bytes` bytes for `session` when the distinct programs it already
    /// references plus these would pass `limit`, or when it references
    /// `max_programs` already. Bytes the session already references are never counted twice,
    /// so registering the same content again always succeeds.
    fn check_quota(
        g: &Store,
        session: u64,
        bytes: u64,
        limit: u64,
        max_programs: u32,
    ) -> Result<(), NpudError> {
        let (held, count) = g
            .held
            .get(&session)
            .map_or((0, 0), |h| (h.bytes, h.ids.len()));
        if count >= max_programs as usize {
            return Err(NpudError::ResourceExhausted(format!(
                "this session references {count} programs, the most it may \
                 (limits.max_programs_per_session): unregister programs it no longer uses"
            )));
        }
        if held.saturating_add(bytes) > limit {
            return Err(NpudError::ResourceExhausted(format!(
                "this session's programs hold {held} bytes; {bytes} more would pass {limit} \
                 (limits.max_program_bytes_per_session): unregister programs it no longer uses"
            )));
        }
        Ok(())
    }

    /// What registering `hash` for `session` comes to when the bytes are already known: a
    /// refusal while they are quarantined, or the stored program (now referenced by
    /// `session`); `None` for new bytes.
    fn known(
        g: &mut Store,
        session: u64,
        hash: &str,
        limit: u64,
        max_programs: u32,
    ) -> Option<Result<Registered, NpudError>> {
        if let Some(r) = g.quarantine.get(hash) {
            return Some(Err(refused_at_registration(r)));
        }
        let id = g.by_hash.get(hash).copied()?;
        let e = g.entries.get(&id)?;
        let program = e.program.clone();
        let referenced_by = e.refs.iter().copied().collect();
        if !e.refs.contains(&session) {
            let bytes = e.program.byte_len();
            if let Err(err) = Self::check_quota(g, session, bytes, limit, max_programs) {
                return Some(Err(err));
            }
            g.add_ref(session, id);
        }
        Some(Ok(Registered {
            program,
            newly_stored: false,
            referenced_by,
        }))
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
        self.store(session, self.candidate(pdi, insts, name)?)
    }

    /// Stores kernel `kernel` of an AIE hsaco (the only kernel of the device's section when
    /// `kernel` is empty), or finds the stored one with the same bytes and kernel, and adds
    /// `session`'s reference.
    ///
    /// # Errors
    /// As [`validate_hsaco`], and as [`Programs::register`].
    pub fn register_hsaco(
        &self,
        session: u64,
        hsaco: Vec<u8>,
        kernel: String,
        name: String,
    ) -> Result<Registered, NpudError> {
        self.store(session, self.hsaco_candidate(hsaco, kernel, name)?)
    }

    /// A registration's bytes, hashed: the first step of a registration, which takes no lock
    /// (registration runs it, and [`Programs::validate`], as bulk work, and the steps that take
    /// the store's lock on the caller's thread, so that a thread of lower priority never holds
    /// the lock the executor takes for every dispatch).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a name over 128 bytes.
    pub fn candidate(
        &self,
        pdi: Vec<u8>,
        insts: Vec<u8>,
        name: String,
    ) -> Result<Candidate, NpudError> {
        check_name(&name)?;
        Ok(Candidate {
            hash: content_hash(&pdi, &insts),
            bytes: (pdi.len() as u64).saturating_add(insts.len() as u64),
            name,
            input: Input::PdiInsts { pdi, insts },
        })
    }

    /// [`Programs::candidate`] for an hsaco. The kernel is resolved before hashing, so that
    /// naming the only kernel and leaving the name empty are the same program.
    ///
    /// # Errors
    /// As [`validate_hsaco`] for its size and kernel, and as [`Programs::candidate`].
    pub fn hsaco_candidate(
        &self,
        hsaco: Vec<u8>,
        kernel: String,
        name: String,
    ) -> Result<Candidate, NpudError> {
        check_name(&name)?;
        validate::check_size("hsaco", hsaco.len() as u64, self.max_bytes)?;
        let kernel = validate::resolve_kernel(&hsaco, &kernel, self.device)?;
        Ok(Candidate {
            hash: hsaco_hash(&hsaco, &kernel),
            bytes: hsaco.len() as u64,
            name,
            input: Input::Hsaco {
                bytes: hsaco,
                kernel,
            },
        })
    }

    /// What registering `c` comes to before validation, under the store's lock: the stored
    /// program (now referenced by `session`) when the bytes are known, a refusal (quarantined
    /// bytes, the session's quotas, the daemon's budget), or `None` for new bytes to validate,
    /// so that a session at its quota (or a daemon at its budget) costs no parsing.
    pub fn admit(&self, session: u64, c: &Candidate) -> Option<Result<Registered, NpudError>> {
        let (limit, most) = (self.max_session_bytes, self.max_session_programs);
        let mut g = self.lock();
        if let Some(known) = Self::known(&mut g, session, &c.hash, limit, most) {
            return Some(known);
        }
        if let Err(e) = Self::check_quota(&g, session, c.bytes, limit, most) {
            return Some(Err(e));
        }
        self.check_total(&g, c.bytes).err().map(Err)
    }

    /// Parses and validates new bytes. Takes no lock.
    ///
    /// # Errors
    /// As [`validate`] or [`validate_hsaco`].
    pub fn validate(&self, c: Candidate) -> Result<Validated, NpudError> {
        let (max, device, runs, abi) = (self.max_bytes, self.device, self.runs, self.abi);
        let (code, summary) = match c.input {
            Input::PdiInsts { pdi, insts } => {
                let summary = validate(&pdi, &insts, max, device, runs)?;
                (Code::PdiInsts { pdi, insts }, summary)
            }
            Input::Hsaco { bytes, kernel } => {
                let full_elf = match &self.g2_full_elf {
                    Ok(()) => Ok(()),
                    Err(why) => Err(why.as_str()),
                };
                let summary = validate_hsaco(&bytes, &kernel, max, device, runs, abi, full_elf)?;
                (Code::Hsaco { bytes, kernel }, summary)
            }
        };
        Ok(Validated {
            hash: c.hash,
            bytes: c.bytes,
            name: c.name,
            code,
            summary,
        })
    }

    /// Stores validated bytes for `session`, under the store's lock. Another session may have
    /// stored the same bytes (or a fault quarantined them) since [`Programs::admit`], and this
    /// session and others may have registered others: the checks are made again.
    ///
    /// # Errors
    /// As [`Programs::admit`]'s refusals.
    pub fn insert(&self, session: u64, v: Validated) -> Result<Registered, NpudError> {
        let (limit, most) = (self.max_session_bytes, self.max_session_programs);
        let mut g = self.lock();
        if let Some(known) = Self::known(&mut g, session, &v.hash, limit, most) {
            return known;
        }
        Self::check_quota(&g, session, v.bytes, limit, most)?;
        self.check_total(&g, v.bytes)?;
        let id = g.next_id;
        g.next_id += 1;
        let program = Arc::new(Program {
            id,
            hash: v.hash.clone(),
            name: v.name,
            code: v.code,
            summary: v.summary,
        });
        g.by_hash.insert(v.hash, id);
        g.total_bytes = g.total_bytes.saturating_add(program.byte_len());
        g.entries.insert(
            id,
            Entry {
                program: program.clone(),
                refs: crate::IdSet::default(),
                quarantined: false,
                loaded: false,
                loads: 0,
                stats: DispatchStats::default(),
            },
        );
        g.add_ref(session, id);
        tracing::info!(program = id, session, "stored a program");
        Ok(Registered {
            program,
            newly_stored: true,
            referenced_by: Vec::new(),
        })
    }

    /// The steps of a registration in turn, on the caller's thread.
    fn store(&self, session: u64, c: Candidate) -> Result<Registered, NpudError> {
        if let Some(done) = self.admit(session, &c) {
            return done;
        }
        self.insert(session, self.validate(c)?)
    }

    /// Drops `session`'s reference. Returns the id if that was the last reference and the
    /// program was dropped (the executor must unload it).
    ///
    /// # Errors
    /// NOT_FOUND when the session holds no reference to `id`.
    pub fn unregister(&self, session: u64, id: u64) -> Result<Option<u64>, NpudError> {
        let mut g = self.lock();
        if !g.remove_ref(session, id) {
            return Err(not_found("program_id", id));
        }
        Ok(drop_if_unused(&mut g, id))
    }

    /// Drops every reference of an ended session; returns the programs dropped.
    pub fn release_session(&self, session: u64) -> Vec<u64> {
        let mut g = self.lock();
        let ids: Vec<u64> = g
            .held
            .get(&session)
            .map(|h| h.ids.iter().copied().collect())
            .unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| {
                g.remove_ref(session, id);
                drop_if_unused(&mut g, id)
            })
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
            e.stats.record(Tally::refused(1, err.code_name()));
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

    /// The executor loaded (`true`, counted as a load) or unloaded a program.
    pub fn set_loaded(&self, id: u64, loaded: bool) {
        let mut g = self.lock();
        if loaded {
            g.loads += 1;
        }
        if let Some(e) = g.entries.get_mut(&id) {
            e.loaded = loaded;
            if loaded {
                e.loads += 1;
            }
        }
    }

    /// The executor evicted a program to make room for another.
    pub fn evicted(&self) {
        self.lock().evictions += 1;
    }

    /// Programs stored, quarantine records, loads and evictions since start.
    pub fn counts(&self) -> ProgramCounts {
        let g = self.lock();
        ProgramCounts {
            stored: g.entries.len() as u64,
            quarantined: g.quarantine.len() as u64,
            loads: g.loads,
            evictions: g.evictions,
        }
    }

    /// What metrics call program `id`: its name, or when it has none the first 12 hex digits
    /// of its content hash; `None` when it is not stored.
    pub fn label_of(&self, id: u64) -> Option<String> {
        let g = self.lock();
        let p = &g.entries.get(&id)?.program;
        Some(if p.name.is_empty() {
            p.hash.chars().take(12).collect()
        } else {
            p.name.clone()
        })
    }

    /// Counts finished links of program `id`.
    pub fn record(&self, id: u64, t: Tally) {
        if let Some(e) = self.lock().entries.get_mut(&id) {
            e.stats.record(t);
        }
    }

    /// A page of the stored programs that any of `sessions` references (`None`: every one, an
    /// admin's view), and where the next page starts (0: none follows).
    pub fn list(&self, sessions: Option<&[u64]>, page: Page) -> (Vec<pb::ProgramListing>, u64) {
        let (seen, next) = self.seen(sessions, page, false);
        let listed = seen
            .into_iter()
            .map(|v| pb::ProgramListing {
                program_id: v.program.id,
                name: v.program.name.clone(),
                content_hash: v.program.hash.clone(),
                references: v.references,
                loaded: v.loaded,
                quarantined: v.quarantined,
                summary: Some(v.program.summary.clone()),
            })
            .collect();
        (listed, next)
    }

    /// A page of the statistics of the programs any of `sessions` references (`None`: every
    /// one), and where the next page starts (0: none follows).
    pub fn statistics(
        &self,
        sessions: Option<&[u64]>,
        page: Page,
    ) -> (Vec<pb::ProgramStatistics>, u64) {
        let (seen, next) = self.seen(sessions, page, true);
        let listed = seen
            .into_iter()
            .map(|v| pb::ProgramStatistics {
                program_id: v.program.id,
                name: v.program.name.clone(),
                content_hash: v.program.hash.clone(),
                references: v.references,
                loaded: v.loaded,
                quarantined: v.quarantined,
                loads: v.loads,
                dispatches: Some(v.stats.map(|s| s.to_proto()).unwrap_or_default()),
                form: v.program.summary.form.clone(),
                kernel_name: v.program.summary.kernel_name.clone(),
                kernel_kind: v.program.summary.kernel_kind.clone(),
            })
            .collect();
        (listed, next)
    }

    /// What a listing's page shows of the programs any of `sessions` references, copied out
    /// under the lock (a reference and a few numbers each); the answer's strings are made after
    /// it is let go, so a listing holds the lock the executor takes for every dispatch no
    /// longer than it takes to copy that.
    fn seen(&self, sessions: Option<&[u64]>, page: Page, with_stats: bool) -> (Vec<Seen>, u64) {
        let g = self.lock();
        let (entries, next) = g.visible(sessions, page);
        let seen = entries
            .into_iter()
            .map(|e| Seen {
                program: e.program.clone(),
                references: refs(e),
                loaded: e.loaded,
                quarantined: e.quarantined,
                loads: e.loads,
                stats: with_stats.then(|| e.stats.clone()),
            })
            .collect();
        (seen, next)
    }

    /// Bytes of the distinct programs `session` references.
    pub fn bytes_for(&self, session: u64) -> u64 {
        self.lock().held.get(&session).map_or(0, |h| h.bytes)
    }

    /// How many programs `session` references.
    pub fn count_for(&self, session: u64) -> u32 {
        let n = self.lock().held.get(&session).map_or(0, |h| h.ids.len());
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
        g.total_bytes = g.total_bytes.saturating_sub(e.program.byte_len());
        tracing::info!(program = id, "dropped a program no session references");
    }
    Some(id)
}

fn not_found(field: impl std::fmt::Display, id: u64) -> NpudError {
    NpudError::NotFound(format!(
        "{field}: no program {id} in this session (register it first)"
    ))
}

#[cfg(test)]
mod tests {
    /// The first page, as a request that names none gets it.
    const FIRST: Page = Page {
        after: 0,
        max: Page::MAX,
    };

    use super::*;
    use npu_artifacts::emu::{DType, EmuDesign};

    fn vsa(scalar: i64) -> (Vec<u8>, Vec<u8>) {
        let d = EmuDesign::vector_scalar_add(1024, DType::I32, scalar);
        (d.to_pdi(), d.insts(NpuGen::Npu2))
    }

    fn store() -> Programs {
        store_with_quota(64 << 20)
    }

    fn store_with_quota(per_session: u64) -> Programs {
        Programs::new(
            8 << 20,
            per_session,
            NpuGen::Npu2,
            Runs::EmulatedDesigns,
            None,
            Vec::new(),
        )
    }

    #[test]
    fn a_session_s_program_bytes_are_counted_once_per_content_against_its_quota() {
        let (pdi, insts) = vsa(1);
        let one = (pdi.len() + insts.len()) as u64;
        let p = store_with_quota(2 * one);
        p.register(1, pdi.clone(), insts.clone(), "a".into())
            .unwrap();
        // The same bytes again are not counted again.
        p.register(1, pdi.clone(), insts.clone(), "a again".into())
            .unwrap();
        let (pdi2, insts2) = vsa(2);
        p.register(1, pdi2, insts2, "b".into()).unwrap();
        let (pdi3, insts3) = vsa(3);
        let e = p
            .register(1, pdi3.clone(), insts3.clone(), "c".into())
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(
            e.message()
                .contains("(limits.max_program_bytes_per_session)"),
            "{e}"
        );
        // Another session has its own quota, and a program stored by another session counts
        // against the session that references it.
        p.register(2, pdi3.clone(), insts3.clone(), "c".into())
            .unwrap();
        let e = p.register(1, pdi3, insts3, "c".into()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    }

    #[test]
    fn a_session_references_at_most_its_program_count_and_the_counts_follow_every_reference() {
        let p = store().with_max_programs_per_session(3);
        let ids: Vec<u64> = (1..=3)
            .map(|k| {
                let (pdi, insts) = vsa(k);
                p.register(1, pdi, insts, String::new()).unwrap().program.id
            })
            .collect();
        let (pdi4, insts4) = vsa(4);
        let e = p
            .register(1, pdi4.clone(), insts4.clone(), String::new())
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            e.message(),
            "this session references 3 programs, the most it may \
             (limits.max_programs_per_session): unregister programs it no longer uses"
        );
        // Bytes it holds already cost nothing, even at the limit.
        let (pdi1, insts1) = vsa(1);
        let one = (pdi1.len() + insts1.len()) as u64;
        p.register(1, pdi1.clone(), insts1.clone(), String::new())
            .unwrap();
        // Another session's count is its own; a program it shares counts for both.
        p.register(2, pdi1, insts1, String::new()).unwrap();
        p.register(2, pdi4.clone(), insts4.clone(), String::new())
            .unwrap();
        assert_eq!((p.count_for(1), p.bytes_for(1)), (3, 3 * one));
        assert_eq!((p.count_for(2), p.bytes_for(2)), (2, 2 * one));
        assert_eq!(p.list(Some(&[2]), FIRST).0.len(), 2);
        assert_eq!(p.list(Some(&[1, 2]), FIRST).0.len(), 4);
        assert_eq!(p.statistics(Some(&[1]), FIRST).0.len(), 3);
        // Unregistering makes room.
        assert_eq!(p.unregister(1, ids[1]).unwrap(), Some(ids[1]));
        p.register(1, pdi4, insts4, String::new()).unwrap();
        assert_eq!(p.count_for(1), 3);
        // A session's end drops its references; programs another session holds stay.
        let dropped = p.release_session(1);
        assert_eq!(dropped, vec![ids[2]]);
        assert_eq!((p.count_for(1), p.bytes_for(1)), (0, 0));
        assert!(p.list(Some(&[1]), FIRST).0.is_empty());
        assert_eq!(p.list(None, FIRST).0.len(), 2);
        assert_eq!(p.release_session(2).len(), 2);
        assert!(p.list(None, FIRST).0.is_empty());
        assert_eq!(p.lock().total_bytes, 0);
        assert!(p.lock().held.is_empty());
    }

    #[test]
    fn listings_come_in_pages_in_id_order_and_the_last_page_says_none_follows() {
        let p = store();
        // Session 1 holds programs 1..=5, session 2 holds 4..=7 (4 and 5 shared), session 3 none.
        let ids: Vec<u64> = (1..=7)
            .map(|k| {
                let (pdi, insts) = vsa(k);
                let s = if k <= 3 { 1 } else { 2 };
                let id = p
                    .register(s, pdi.clone(), insts.clone(), String::new())
                    .unwrap();
                if k == 4 || k == 5 {
                    p.register(1, pdi, insts, String::new()).unwrap();
                }
                id.program.id
            })
            .collect();
        let page = |after, max| Page::asked(after, max);
        let walk = |sessions: Option<&[u64]>, max| {
            let (mut seen, mut after, mut pages) = (Vec::new(), 0, 0);
            loop {
                let (got, next) = p.list(sessions, page(after, max));
                assert!(
                    got.len() <= max as usize,
                    "{} over a page of {max}",
                    got.len()
                );
                let stats = p.statistics(sessions, page(after, max));
                assert_eq!(
                    stats.0.iter().map(|s| s.program_id).collect::<Vec<_>>(),
                    got.iter().map(|l| l.program_id).collect::<Vec<_>>()
                );
                assert_eq!(stats.1, next);
                seen.extend(got.iter().map(|l| l.program_id));
                pages += 1;
                if next == 0 {
                    return (seen, pages);
                }
                assert_eq!(Some(&next), seen.last(), "the cursor is the page's last id");
                after = next;
            }
        };
        assert_eq!(walk(None, 3), (ids.clone(), 3));
        // A page that holds exactly the rest says that none follow.
        assert_eq!(walk(None, 7), (ids.clone(), 1));
        assert_eq!(walk(Some(&[1]), 2), (ids[..5].to_vec(), 3));
        assert_eq!(walk(Some(&[2]), 2), (ids[3..].to_vec(), 2));
        assert_eq!(walk(Some(&[1, 2, 3]), 2), (ids.clone(), 4));
        assert_eq!(walk(Some(&[3]), 2), (vec![], 1));
        // Past the last id, and from the largest cursor there is: empty, and no next page.
        assert_eq!(p.list(None, page(ids[6], 2)).0.len(), 0);
        assert_eq!(p.list(None, page(u64::MAX, 2)), (vec![], 0));
        // 0 asks for a whole page; more than a page is a page.
        assert_eq!(page(0, 0).max, Page::MAX);
        assert_eq!(page(0, u32::MAX).max, Page::MAX);
        assert_eq!(page(5, 10), Page { after: 5, max: 10 });
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
        assert_eq!(p.list(None, FIRST).0[0].references, 2);
        assert_eq!(a.program.summary.min_arg_bytes, vec![4096, 4096]);
        assert_eq!(p.unregister(1, a.program.id).unwrap(), None);
        assert!(p.for_dispatch(1, a.program.id, "program_id").is_err());
        assert_eq!(p.release_session(2), vec![a.program.id]);
        assert!(p.list(None, FIRST).0.is_empty());
    }

    #[test]
    fn the_runtime_not_the_linking_decides_which_designs_run() {
        let sim = Some("hsa-sim 0.1.0 (software AIE agent, profile rocm-7.0)");
        assert_eq!(Runs::of_runtime(sim), Runs::EmulatedDesigns);
        assert_eq!(Runs::of_runtime(Some("1.18.0")), Runs::RealDesigns);
        assert_eq!(Runs::of_runtime(None), Runs::RealDesigns);
        let (pdi, insts) = vsa(1);
        let e = validate(&pdi, &insts, 1 << 20, NpuGen::Npu2, Runs::RealDesigns).unwrap_err();
        assert!(matches!(e, NpudError::FailedPrecondition(_)), "{e}");
        assert!(e.message().contains("runs only on the emulator"), "{e}");
    }

    #[test]
    fn an_hsaco_kernel_is_stored_once_and_full_elf_needs_code_objects_or_g2_full_elf() {
        let d = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
        let hsaco = d.to_hsaco(NpuGen::Npu2).unwrap();
        let p = store();
        let a = p
            .register_hsaco(1, hsaco.clone(), String::new(), "a".into())
            .unwrap();
        let b = p
            .register_hsaco(2, hsaco.clone(), "vector_scalar_add".into(), "b".into())
            .unwrap();
        assert!(a.newly_stored && !b.newly_stored);
        assert_eq!(a.program.id, b.program.id);
        let s = &a.program.summary;
        assert_eq!(
            (
                s.form.as_str(),
                s.kernel_name.as_str(),
                s.kernel_kind.as_str()
            ),
            (FORM_HSACO, "vector_scalar_add", "PdiInsts")
        );
        assert_eq!(s.min_arg_bytes, vec![4096, 4096]);
        assert_eq!(a.program.byte_len(), hsaco.len() as u64);
        // The same design as PDI+insts is another program (its own form and hash).
        let (pdi, insts) = vsa(1);
        let c = p.register(1, pdi, insts, "c".into()).unwrap();
        assert_ne!(c.program.id, a.program.id);
        assert_eq!(c.program.summary.form, FORM_PDI_INSTS);

        let full = d.to_full_elf_hsaco().unwrap();
        let e = p
            .register_hsaco(1, full.clone(), String::new(), String::new())
            .unwrap_err();
        assert!(matches!(e, NpudError::FailedPrecondition(_)), "{e}");
        assert!(
            e.message()
                .contains("neither loads code objects nor takes G2 full-ELF packets"),
            "{e}"
        );
        // A G2 runtime with full ELF takes it.
        let g2 = store().with_g2_full_elf(Ok(()));
        let r = g2
            .register_hsaco(1, full.clone(), String::new(), String::new())
            .unwrap();
        assert_eq!(r.program.summary.kernel_kind, "FullElf");
        let ko = store().with_packet_abi(hsa_core::PacketAbi::KernelObject);
        let r = ko
            .register_hsaco(1, full, String::new(), String::new())
            .unwrap();
        assert_eq!(r.program.summary.kernel_kind, "FullElf");
        assert_eq!(r.program.summary.kind, "vector_scalar_add");
        assert_eq!(r.program.summary.arg_count, 2);
    }

    /// A FullElf kernel takes exactly its ELF's argument count: the runtime refuses a packet
    /// with one more (`INVALID_PACKET_FORMAT`), so admission does, where a PdiInsts kernel
    /// ignores what its instruction stream does not patch.
    #[test]
    fn a_full_elf_kernel_takes_exactly_its_argument_count() {
        let d = EmuDesign::vector_scalar_add(1024, DType::I32, 1);
        let ko = store().with_packet_abi(hsa_core::PacketAbi::KernelObject);
        let r = ko
            .register_hsaco(1, d.to_full_elf_hsaco().unwrap(), String::new(), "f".into())
            .unwrap();
        assert!(r.program.is_full_elf());
        r.program.check_args(&[4096, 4096], "args").unwrap();
        for sizes in [&[4096, 4096, 4096][..], &[4096][..]] {
            let e = r.program.check_args(sizes, "links[1].args").unwrap_err();
            assert!(matches!(e, NpudError::InvalidArgument(_)), "{e}");
            assert_eq!(
                e.message(),
                format!(
                    "links[1].args: program {} (f) is a FullElf kernel that takes exactly 2 \
                     buffer arguments; {} given",
                    r.program.id,
                    sizes.len()
                )
            );
        }
        let pdi_insts = ko
            .register_hsaco(
                1,
                d.to_hsaco(NpuGen::Npu2).unwrap(),
                String::new(),
                "p".into(),
            )
            .unwrap();
        assert!(!pdi_insts.program.is_full_elf());
        pdi_insts
            .program
            .check_args(&[4096, 4096, 4], "args")
            .unwrap();
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
            Runs::EmulatedDesigns,
        )
        .unwrap_err();
        assert!(matches!(e, NpudError::InvalidArgument(_)), "{e}");
        assert!(e.message().contains("insts.bin"), "{e}");
        let e = validate(&pdi, &insts, 1 << 20, NpuGen::Npu1, Runs::EmulatedDesigns).unwrap_err();
        assert!(matches!(e, NpudError::FailedPrecondition(_)), "{e}");
        let e = validate(&pdi, &insts, 16, NpuGen::Npu2, Runs::EmulatedDesigns).unwrap_err();
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
}

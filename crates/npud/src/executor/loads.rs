//! Loading programs into the device heap, a bounded step per turn.
//!
//! A load is costly on some runtimes (a kernel-object ROCR parses and loads the whole hsaco
//! each time), and a work item may name up to `limits.max_cached_programs` programs. So a turn
//! loads at most one program and evicts at most [`MAX_EVICTIONS_PER_TURN`]; an item that needs
//! more gives its turn up and goes on at its next one. Evictions happen in the turn of the
//! session whose load needs the room, so they count against that session's turn, never
//! against the turn of the session whose program is evicted; the log names the session.
//!
//! Loading across turns needs care: between two turns of one item other sessions run, and if
//! they could evict too, each could evict what the other had just loaded for its coming batch,
//! and neither would ever run. So one item at a time evicts: the session that holds the
//! *loader* loads and evicts, protecting every program its coming batch needs; the others load
//! only into free room and otherwise wait for it (a turn that only finds the loader taken costs
//! nothing), and work whose programs are all loaded runs meanwhile. The loader is given back
//! when the item's programs are loaded, when the item ends (every reply goes through
//! [`Worker::loader_done`]), or when the session is released.
//!
//! On a kernel-object runtime a FullElf command also takes device heap while its batch runs:
//! its control code, copied into a fresh buffer of `ctrl_size + 16 KiB` at the heap's 32 KiB
//! alignment (`reference/rocr-aie-hsaco.md`, FullElf path), freed when the batch returns.
//! Before such a batch rings, [`Worker::full_elf_room`] makes that much room in the heap by
//! evicting programs the batch does not use, with the loader, as a load does; a batch that
//! cannot fit even then is cut to the commands that fit, and a command that cannot fit alone is
//! refused with RESOURCE_EXHAUSTED naming the sizes, instead of failing on the device. The
//! heap can be fragmented, so the room counted here is a lower bound of what the runtime
//! needs; when it still runs out the runtime refuses the packet, which the executor reports
//! as a refusal, not a device fault.

use hsa_core::sys::DEVICE_HEAP_ALIGNMENT;
use hsa_core::{HsaError, ProgramId};

use super::worker::Worker;
use crate::error::NpudError;
use crate::programs::{Code, Program};

/// The most programs one turn evicts.
pub(super) const MAX_EVICTIONS_PER_TURN: u32 = 4;

/// Device heap a FullElf command's control code takes while its batch runs, beside the code.
const FULL_ELF_CTRL_SLACK: usize = 16 << 10;

/// What a loading step left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Everything asked for is in place.
    Ready,
    /// Another turn is needed: this one's loads or evictions are spent, or another item holds
    /// the loader.
    Wait,
}

/// What one turn of loading has spent.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct TurnLoads {
    loads: u32,
    evictions: u32,
}

impl Worker {
    /// Makes every program of `programs` loaded, within this turn's bounds: at most one load and
    /// [`MAX_EVICTIONS_PER_TURN`] evictions, never of a program in `protect` (which holds at
    /// least `programs`). `Ready` when all are loaded.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED when the programs cannot all be loaded at once (more than the cache
    /// holds, or more than the device heap holds); the load's error otherwise.
    pub(super) fn load_step(
        &mut self,
        session: u64,
        programs: &[&Program],
        protect: &[u64],
    ) -> Result<Step, NpudError> {
        loop {
            let Some(p) = programs.iter().find(|p| self.cache.touch(p.id).is_none()) else {
                self.loader_done(session);
                return Ok(Step::Ready);
            };
            let holder = self.take_loader(session);
            if self.turn.loads >= 1 || (!holder && self.cache.is_full()) {
                return Ok(Step::Wait);
            }
            if self.load_one(session, p, protect, holder)? == Step::Wait {
                return Ok(Step::Wait);
            }
        }
    }

    /// The device id of a loaded program (marking it used), or the program's refusal when it
    /// was unloaded since [`Worker::load_step`].
    pub(super) fn loaded_id(&mut self, p: &Program) -> Result<ProgramId, NpudError> {
        self.cache.touch(p.id).ok_or_else(|| {
            NpudError::Internal(format!("program {} is not loaded as planned", p.id))
        })
    }

    /// Whether `session` holds the loader (taking it when it is free).
    fn take_loader(&mut self, session: u64) -> bool {
        match self.loader {
            Some(s) => s == session,
            None => {
                self.loader = Some(session);
                true
            }
        }
    }

    /// Gives the loader back if `session` holds it.
    pub(super) fn loader_done(&mut self, session: u64) {
        if self.loader == Some(session) {
            self.loader = None;
        }
    }

    /// Evicts the least-recently-used program not in `protect`, within this turn's bound:
    /// `Ok(true)` when one was evicted, `Ok(false)` when the bound is spent.
    ///
    /// # Errors
    /// `none` when every loaded program is protected.
    fn evict_one(
        &mut self,
        session: u64,
        protect: &[u64],
        none: impl FnOnce() -> NpudError,
    ) -> Result<bool, NpudError> {
        if self.turn.evictions >= MAX_EVICTIONS_PER_TURN {
            return Ok(false);
        }
        let Some(v) = self.cache.victim(protect) else {
            return Err(none());
        };
        tracing::debug!(
            session,
            program = v,
            "evicting a program for this session's work"
        );
        self.unload(v);
        self.programs.evicted();
        self.turn.evictions += 1;
        Ok(true)
    }

    /// Loads `p`, evicting least-recently-used programs not in `protect` while the cache or
    /// the heap is full (within the turn's bound) when `may_evict` (the session holds the
    /// loader); `Wait` when that is not enough.
    fn load_one(
        &mut self,
        session: u64,
        p: &Program,
        protect: &[u64],
        may_evict: bool,
    ) -> Result<Step, NpudError> {
        while self.cache.is_full() {
            if !may_evict {
                return Ok(Step::Wait);
            }
            let evicted = self.evict_one(session, protect, || {
                NpudError::ResourceExhausted(
                    "this work uses more distinct programs than limits.max_cached_programs".into(),
                )
            })?;
            if !evicted {
                return Ok(Step::Wait);
            }
        }
        let loaded = match &p.code {
            Code::PdiInsts { pdi, insts } => self.dev.load_program(pdi, insts),
            Code::Hsaco { bytes, kernel } => self.dev.load_hsaco(bytes, kernel),
        };
        self.turn.loads += 1;
        match loaded {
            Ok(d) => {
                self.cache.insert(p.id, d);
                self.programs.set_loaded(p.id, true);
                tracing::debug!(session, program = p.id, "loaded a program");
                Ok(Step::Ready)
            }
            Err(HsaError::HeapFull { .. }) if !may_evict => Ok(Step::Wait),
            Err(e @ HsaError::HeapFull { .. }) => {
                // The failed attempt is this turn's load: make the room it needs (within the
                // turn's evictions), and the next turn tries again.
                let needed = match &e {
                    HsaError::HeapFull { needed, .. } => *needed,
                    _ => 0,
                };
                let msg = format!("the device heap cannot hold program {}: {e}", p.id);
                // At least one eviction, as the heap may be fragmented.
                let mut evicted = false;
                while !evicted
                    || self
                        .dev
                        .info()
                        .heap_size
                        .saturating_sub(self.dev.heap_used())
                        < needed
                {
                    let refused = || NpudError::ResourceExhausted(msg.clone());
                    if !self.evict_one(session, protect, refused)? {
                        break;
                    }
                    evicted = true;
                }
                Ok(Step::Wait)
            }
            Err(e @ HsaError::InvalidArgument(_)) => {
                Err(NpudError::InvalidArgument(format!("program {}: {e}", p.id)))
            }
            Err(e) => Err(NpudError::from(e)),
        }
    }

    /// Device-heap room for the FullElf commands of `links` while their batch runs, on a
    /// kernel-object runtime (nothing to do elsewhere or without FullElf links): evicts
    /// programs not in `protect` until the heap has it. Returns how many of `links`, from the
    /// first, fit (all of them unless the heap cannot hold them all even with every other
    /// program evicted), or `Wait`.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED when the first link's command alone does not fit.
    pub(super) fn full_elf_room(
        &mut self,
        session: u64,
        links: &[&Program],
        protect: &[u64],
    ) -> Result<Result<usize, Step>, NpudError> {
        if !self.dev.info().packet_abi.loads_code_objects()
            || !links.iter().any(|p| p.is_full_elf())
        {
            return Ok(Ok(links.len()));
        }
        loop {
            let free = self
                .dev
                .info()
                .heap_size
                .saturating_sub(self.dev.heap_used());
            let mut need = 0usize;
            let mut fit = 0;
            for p in links {
                let n = full_elf_heap(p);
                if need + n > free {
                    break;
                }
                need += n;
                fit += 1;
            }
            if fit == links.len() {
                self.loader_done(session);
                return Ok(Ok(fit));
            }
            if !self.take_loader(session) {
                return Ok(Err(Step::Wait));
            }
            if self.cache.victim(protect).is_none() {
                self.loader_done(session);
                if fit == 0 {
                    let first = links[0];
                    return Err(NpudError::ResourceExhausted(format!(
                        "program {} ({}) is a FullElf kernel whose command needs {} bytes of \
                         device heap while it runs (its {}-byte control code and {} bytes the \
                         runtime adds); the heap has {free} of {} bytes free with every program \
                         this work does not use evicted",
                        first.id,
                        first.display_name(),
                        full_elf_heap(first),
                        first.summary.insts_bytes,
                        FULL_ELF_CTRL_SLACK,
                        self.dev.info().heap_size
                    )));
                }
                return Ok(Ok(fit));
            }
            if !self.evict_one(session, protect, || {
                NpudError::Internal("no program to evict".into())
            })? {
                return Ok(Err(Step::Wait));
            }
        }
    }
}

/// The device heap one FullElf command of `p` takes while its batch runs (0 for other
/// programs).
fn full_elf_heap(p: &Program) -> usize {
    if !p.is_full_elf() {
        return 0;
    }
    let ctrl = p.summary.insts_bytes as usize + FULL_ELF_CTRL_SLACK;
    ctrl.div_ceil(DEVICE_HEAP_ALIGNMENT) * DEVICE_HEAP_ALIGNMENT
}

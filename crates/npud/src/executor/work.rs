//! Running one work item on the device: the deadline check, argument checks against the
//! program's DDR patches, loading programs (evicting least-recently-used ones), staging client
//! memfds, the chain itself, and what a device fault does (quarantine, queue recovery).
//!
//! Around the doorbell the executor keeps the state directory's in-flight record: every distinct
//! program of the work item (one dispatch, or every link of a chain, whatever batches hsa-core
//! rings it in) is recorded before `run_chain` and cleared after it returns, so that a runtime
//! that aborts the process on a device fault leaves behind which programs to quarantine.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hsa_core::{ChainError, Dispatch, HsaError, ProgramId};

use super::sched::may_start;
use super::{WorkItem, Worker};
use crate::error::NpudError;
use crate::programs::{Code, Program, Runnable};

/// A link that failed on the device after earlier links completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFailure {
    pub index: usize,
    pub error: NpudError,
}

/// What a work item did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkDone {
    /// Admission to the start of the device batch.
    pub queue_ns: u64,
    /// Doorbell to completion (or failure).
    pub device_ns: u64,
    pub doorbells: u32,
    /// Links that completed.
    pub completed: usize,
    pub failure: Option<LinkFailure>,
}

impl Worker {
    pub(super) fn run_item(&mut self, item: WorkItem) {
        let now = Instant::now();
        let result = if may_start(item.deadline, now) {
            self.execute(&item)
        } else {
            Err(NpudError::DeadlineExceeded(format!(
                "the deadline passed after {:?} in the queue; the work did not run",
                now.duration_since(item.admitted)
            )))
        };
        match &result {
            Ok(done) => tracing::debug!(
                session = item.session,
                links = item.links.len(),
                completed = done.completed,
                queue_ns = done.queue_ns,
                device_ns = done.device_ns,
                "work done"
            ),
            Err(e) => {
                tracing::debug!(session = item.session, code = e.code_name(), error = %e, "work refused")
            }
        }
        let _ = item.reply.send(result);
    }

    fn execute(&mut self, item: &WorkItem) -> Result<WorkDone, NpudError> {
        // Check every link before anything runs; field names are formatted only on failure.
        let mut staged: Vec<u64> = Vec::new();
        let mut resolved = Vec::with_capacity(item.links.len());
        for (k, link) in item.links.iter().enumerate() {
            let p = LinkPrefix {
                chain: item.chain,
                k,
            };
            match self.programs.runnable(link.program.id) {
                Runnable::Yes => {}
                Runnable::Gone => {
                    return Err(NpudError::NotFound(format!(
                        "{p}program_id: program {} was unregistered",
                        link.program.id
                    )));
                }
                Runnable::Quarantined => {
                    return Err(NpudError::FailedPrecondition(format!(
                        "{p}program_id: program {} ({}) is quarantined: it faulted the device \
                         while this work was queued",
                        link.program.id,
                        link.program.display_name()
                    )));
                }
            }
            let mut args = Vec::with_capacity(link.args.len());
            let mut sizes = Vec::with_capacity(link.args.len());
            for (i, a) in link.args.iter().enumerate() {
                let r = self
                    .tensors
                    .resolve(item.session, a, format_args!("{p}args[{i}]"))?;
                if let Some(id) = r.staged
                    && !staged.contains(&id)
                {
                    staged.push(id);
                }
                sizes.push(r.len);
                args.push(r.arg);
            }
            link.program.check_args(&sizes, format_args!("{p}args"))?;
            resolved.push(args);
        }
        let protect: HashSet<u64> = if item.links.len() == 1 {
            HashSet::from([item.links[0].program.id])
        } else {
            item.links.iter().map(|l| l.program.id).collect()
        };
        let mut dispatches = Vec::with_capacity(item.links.len());
        for (link, args) in item.links.iter().zip(resolved) {
            let program = self.ensure_loaded(&link.program, &protect)?;
            dispatches.push(Dispatch { program, args });
        }
        self.tensors.stage_in(&mut self.dev, &staged)?;
        let start = Instant::now();
        let queue_ns = nanos(start.duration_since(item.admitted));
        self.record_in_flight(item);
        let result = self.dev.run_chain(&dispatches);
        if !matches!(
            &result,
            Err(ChainError {
                error: HsaError::Device { .. } | HsaError::Timeout { .. },
                ..
            })
        ) {
            // A device fault keeps the record until its program's quarantine is on disk.
            self.clear_in_flight();
        }
        if let Err(e) = self.tensors.stage_out(&self.dev, &staged) {
            tracing::error!(error = %e, "copying results back to a client memfd failed");
        }
        match result {
            Ok(report) => {
                // A dispatch ran, so the device serves again even if recover() had failed.
                self.serving.recovered();
                Ok(WorkDone {
                    queue_ns,
                    device_ns: nanos(report.device_time),
                    doorbells: report.doorbells,
                    completed: dispatches.len(),
                    failure: None,
                })
            }
            Err(ChainError {
                index,
                error,
                report,
            }) => {
                let link = item.links.get(index).map(|l| l.program.as_ref());
                match error {
                    HsaError::Device { .. } | HsaError::Timeout { .. } => {
                        let error = self.device_fault(link, &error);
                        Ok(WorkDone {
                            queue_ns,
                            device_ns: nanos(report.device_time),
                            doorbells: report.doorbells,
                            completed: index,
                            failure: Some(LinkFailure { index, error }),
                        })
                    }
                    other => {
                        let e = NpudError::from(other);
                        Err(if item.chain {
                            e.within(&format!("links[{index}]"))
                        } else {
                            e
                        })
                    }
                }
            }
        }
    }

    /// Records the distinct programs of `item` as on the device (nothing without a state
    /// directory).
    fn record_in_flight(&mut self, item: &WorkItem) {
        let Some(r) = self.inflight.as_mut() else {
            return;
        };
        let mut seen: Vec<u64> = Vec::new();
        r.begin(
            item.links
                .iter()
                .filter(|l| {
                    let new = !seen.contains(&l.program.id);
                    if new {
                        seen.push(l.program.id);
                    }
                    new
                })
                .map(|l| (l.program.hash.as_str(), l.program.name.as_str())),
        );
    }

    fn clear_in_flight(&mut self) {
        if let Some(r) = self.inflight.as_mut() {
            r.end();
        }
    }

    /// A program faulted the device: quarantine it (durably, before the in-flight record that
    /// would otherwise quarantine every program of the item at the next start is cleared), count
    /// the fault, and report the service NOT_SERVING while the queue is recreated.
    fn device_fault(&mut self, program: Option<&Program>, error: &HsaError) -> NpudError {
        self.faults.fetch_add(1, Ordering::Relaxed);
        // Written before NOT_SERVING: the record's fsyncs are not recovery, and clients that
        // submit meanwhile are queued rather than told to retry.
        if let Some(p) = program {
            self.programs
                .quarantine(p.id, &format!("it faulted the device: {error}"));
        }
        self.clear_in_flight();
        self.serving.recovering();
        let msg = match program {
            Some(p) => {
                tracing::error!(program = p.id, error = %error, "a program faulted the device; quarantined it");
                format!(
                    "the device failed program {} ({}): {error}; the program is quarantined",
                    p.id,
                    p.display_name()
                )
            }
            None => format!("the device failed: {error}"),
        };
        // NOT_SERVING covers the queue's recreation (a hardware-context rebuild on an NPU).
        match self.dev.recover() {
            Ok(_) => self.serving.recovered(),
            Err(e) => tracing::error!(
                error = %e,
                "recreating the queue after the fault failed; the next dispatch retries"
            ),
        }
        NpudError::Internal(msg)
    }

    /// The device id of a program, loading it (and evicting least-recently-used programs not
    /// in `protect`) when needed.
    fn ensure_loaded(
        &mut self,
        p: &Program,
        protect: &HashSet<u64>,
    ) -> Result<ProgramId, NpudError> {
        if let Some(d) = self.cache.touch(p.id) {
            return Ok(d);
        }
        while self.cache.is_full() {
            let Some(v) = self.cache.victim(protect) else {
                return Err(NpudError::ResourceExhausted(
                    "this work uses more distinct programs than limits.max_cached_programs".into(),
                ));
            };
            self.unload(v);
        }
        loop {
            let loaded = match &p.code {
                Code::PdiInsts { pdi, insts } => self.dev.load_program(pdi, insts),
                Code::Hsaco { bytes, kernel } => self.dev.load_hsaco(bytes, kernel),
            };
            match loaded {
                Ok(d) => {
                    self.cache.insert(p.id, d);
                    self.programs.set_loaded(p.id, true);
                    tracing::debug!(program = p.id, "loaded a program");
                    return Ok(d);
                }
                Err(e @ HsaError::HeapFull { .. }) => match self.cache.victim(protect) {
                    Some(v) => {
                        tracing::debug!(program = v, error = %e, "device heap full; evicting");
                        self.unload(v);
                    }
                    None => {
                        return Err(NpudError::ResourceExhausted(format!(
                            "the device heap cannot hold program {}: {e}",
                            p.id
                        )));
                    }
                },
                Err(e @ HsaError::InvalidArgument(_)) => {
                    return Err(NpudError::InvalidArgument(format!("program {}: {e}", p.id)));
                }
                Err(e) => return Err(NpudError::from(e)),
            }
        }
    }
}

/// `links[k].` in a chain's messages; nothing for a single dispatch.
#[derive(Debug, Clone, Copy)]
pub struct LinkPrefix {
    pub chain: bool,
    pub k: usize,
}

impl std::fmt::Display for LinkPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.chain {
            write!(f, "links[{}].", self.k)
        } else {
            Ok(())
        }
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

//! The daemon-wide memory budget: what all callers together may make npud hold, whatever each
//! one's own quotas allow, so that the daemon stays within its memory limit (the Kubernetes
//! DaemonSet gives it 1 GiB).
//!
//! Three parts, each a `limits.*` key, each refused with RESOURCE_EXHAUSTED naming its key:
//! - tensors (`limits.max_total_tensor_bytes`, allocated and imported: the daemon maps both):
//!   checked by the executor's tensor table as it admits each allocation or import, where
//!   every tensor is counted, so concurrent requests cannot pass it together;
//! - programs (`limits.max_total_program_bytes`): checked by the program store under its lock,
//!   after deduplication (bytes already stored cost nothing), before validation and again
//!   before storing;
//! - request messages received and not yet answered (`limits.max_queued_request_bytes`):
//!   every call's messages, streams included, charged by the intake (`intake`) before
//!   their bytes are gathered and again once scanned (bytes plus estimated decoded size), and
//!   given back when the handler is done with each (see `intake::ledger`).
//!
//! What is freed goes back to the kernel: the daemon's allocator is mimalloc (see `main.rs`),
//! which returns freed pages once the threads that own them collect (`main.rs` makes idle I/O
//! threads collect at most once a second; without that they kept ~200 MiB after a load), where
//! glibc's malloc kept the peak of a
//! load (its heap is trimmed only from the top, and its mmap threshold rises after the first
//! large frees), so RSS returns near its baseline once work ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::Limits;
use crate::error::NpudError;

/// The budget's limits and what requests hold now.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    tensor_bytes: u64,
    program_bytes: u64,
    queued_bytes: u64,
    queued: Arc<AtomicU64>,
}

/// Request bytes reserved by one call, given back when it drops.
#[derive(Debug)]
pub struct Queued {
    held: u64,
    queued: Arc<AtomicU64>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.queued.fetch_sub(self.held, Ordering::AcqRel);
    }
}

impl Queued {
    /// Bytes this call holds.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Gives `n` of the held bytes back (at most all of them).
    pub fn release(&mut self, n: u64) {
        let n = n.min(self.held);
        self.held -= n;
        self.queued.fetch_sub(n, Ordering::AcqRel);
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20))
}

impl MemoryBudget {
    pub fn new(l: &Limits) -> Self {
        Self {
            tensor_bytes: l.max_total_tensor_bytes,
            program_bytes: l.max_total_program_bytes,
            queued_bytes: l.max_queued_request_bytes,
            queued: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether `more` tensor bytes fit beside the `held` ones.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming `limits.max_total_tensor_bytes`.
    pub fn check_tensor(&self, held: u64, more: u64) -> Result<(), NpudError> {
        if held.saturating_add(more) > self.tensor_bytes {
            return Err(NpudError::ResourceExhausted(format!(
                "the daemon's tensors hold {} of limits.max_total_tensor_bytes ({}); {} more \
                 would pass it (the limit is daemon-wide: free tensors, or wait for other \
                 sessions to free theirs)",
                mib(held),
                mib(self.tensor_bytes),
                mib(more)
            )));
        }
        Ok(())
    }

    /// Whether `more` program bytes fit beside the `held` ones.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming `limits.max_total_program_bytes`.
    pub fn check_program(&self, held: u64, more: u64) -> Result<(), NpudError> {
        if held.saturating_add(more) > self.program_bytes {
            return Err(NpudError::ResourceExhausted(format!(
                "the daemon's programs hold {} of limits.max_total_program_bytes ({}); {} more \
                 would pass it (the limit is daemon-wide: unregister programs no session uses)",
                mib(held),
                mib(self.program_bytes),
                mib(more)
            )));
        }
        Ok(())
    }

    /// A reservation of no bytes, to [`MemoryBudget::reserve`] into.
    pub fn queued(&self) -> Queued {
        Queued {
            held: 0,
            queued: self.queued.clone(),
        }
    }

    /// Adds `more` bytes to a call's reservation.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming `limits.max_queued_request_bytes`, with nothing reserved.
    pub fn reserve(&self, q: &mut Queued, more: u64) -> Result<(), NpudError> {
        let mut now = self.queued.load(Ordering::Acquire);
        loop {
            let next = now.saturating_add(more);
            if next > self.queued_bytes {
                return Err(NpudError::ResourceExhausted(format!(
                    "requests received and not yet answered hold {} of \
                     limits.max_queued_request_bytes ({}); this one's {} more would pass it \
                     (the limit is daemon-wide: retry when queued work has been answered)",
                    mib(now),
                    mib(self.queued_bytes),
                    mib(q.held.saturating_add(more))
                )));
            }
            match self
                .queued
                .compare_exchange_weak(now, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    q.held = q.held.saturating_add(more);
                    return Ok(());
                }
                Err(actual) => now = actual,
            }
        }
    }

    /// Request bytes held by calls now.
    pub fn queued_now(&self) -> u64 {
        self.queued.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_refuses_past_its_limit_naming_its_key() {
        let b = MemoryBudget::new(&Limits {
            max_total_tensor_bytes: 100,
            max_total_program_bytes: 50,
            max_queued_request_bytes: 10,
            ..Limits::default()
        });
        b.check_tensor(60, 40).unwrap();
        let e = b.check_tensor(61, 40).unwrap_err();
        assert_eq!(e.code_name(), "RESOURCE_EXHAUSTED");
        assert!(e.message().contains("limits.max_total_tensor_bytes"), "{e}");
        b.check_program(0, 50).unwrap();
        assert!(
            b.check_program(1, 50)
                .unwrap_err()
                .message()
                .contains("limits.max_total_program_bytes")
        );
        let mut q = b.queued();
        b.reserve(&mut q, 6).unwrap();
        let mut r = b.queued();
        let e = b.reserve(&mut r, 5).unwrap_err();
        assert!(
            e.message().contains("limits.max_queued_request_bytes"),
            "{e}"
        );
        assert_eq!((b.queued_now(), r.held()), (6, 0));
        q.release(2);
        assert_eq!((b.queued_now(), q.held()), (4, 4));
        drop(q);
        b.reserve(&mut r, 10).unwrap();
        drop(r);
        assert_eq!(b.queued_now(), 0);
    }
}

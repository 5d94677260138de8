//! ROCm 7.0's hardware-context handling, as observed over a model of the amdxdna driver
//! (`reference/rocm70-observed.md`, "Where it fails" items 4 and 1).
//!
//! **One context per doorbell.** ROCm 7.0 creates no hardware context in `hsa_queue_create`;
//! each doorbell looks the batch's PDIs up in an agent-wide cache keyed by the queue's
//! *previous* context handle. With the driver's cyclic context ids that key never matches
//! the live context, so every doorbell destroys, recreates and reconfigures the context, even
//! for the same PDI, and stores the batch's PDIs under the handle it just replaced
//! (`hw_context_builds` counts them: one per doorbell).
//!
//! **The stale entry survives the queue.** A queue's first doorbell stores its PDIs under
//! key 0 (no context yet). The entry outlives `hsa_queue_destroy`: a later queue whose first
//! doorbell uses only PDI buffers in that entry "hits" it, creates no context, and its batch
//! is silently dropped (the read index advances; nothing runs). Only re-initialising the
//! runtime (`hsa_shut_down`, then `hsa_init`) clears the cache: it lives in the [`Runtime`].
//!
//! What is modelled from the observation and what is inferred: the key (the previous context
//! handle), the one-context-per-doorbell cost, the survival across queues and the drop are
//! observed; that a hit needs *every* PDI of the batch in the entry, that a miss under key 0
//! replaces the key-0 entry, and that cache keys are PDI addresses rather than BO handles
//! (the emulator has no BO handles; a freed and reused address plays a reused handle) are
//! inferred.

use std::collections::HashMap;

use hsa_core::sys::Status;

use crate::counters::{Counter, bump};
use crate::queue::QueueState;
use crate::status::SimError;

/// The agent-wide PDI cache and the driver's context ids.
#[derive(Debug, Default)]
pub(crate) struct AgentContexts {
    /// PDI addresses configured on a context, keyed by the handle of the context that was live
    /// before it (0: none).
    cache: HashMap<u64, Vec<u64>>,
    /// The driver's last context id (ids are never reused within the emulator's lifetime).
    last_id: u64,
}

impl AgentContexts {
    /// The context step of one doorbell whose packets name `pdis`: builds a context, or finds
    /// a stale entry and drops the batch.
    ///
    /// # Errors
    /// The silent drop, as `ERROR` with a sentence naming the stale entry (ROCm 7.0 reports
    /// nothing; the detail goes to the emulator's last error and log only).
    pub(crate) fn doorbell(
        &mut self,
        queue: &mut QueueState,
        pdis: &[u64],
    ) -> Result<(), SimError> {
        let key = queue.rocm70_context;
        if let Some(cached) = self.cache.get(&key)
            && !pdis.is_empty()
            && pdis.iter().all(|p| cached.contains(p))
        {
            if key == 0 {
                return Err(SimError::new(
                    Status::ERROR,
                    format!(
                        "ROCm 7.0's agent-wide PDI cache has PDIs {pdis:#x?} under key 0, left by an \
                         earlier queue's first doorbell: no hardware context was created and the \
                         batch was dropped (read index advanced, nothing ran)"
                    ),
                ));
            }
            return Ok(());
        }
        self.last_id += 1;
        bump(Counter::HwContextBuilds);
        self.cache.insert(key, pdis.to_vec());
        queue.rocm70_context = self.last_id;
        Ok(())
    }
}

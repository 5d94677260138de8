//! Counts of the objects the emulator created and destroyed, so tests can check that a client
//! releases everything it made.
//!
//! Counts are process-wide and never reset. A test compares a snapshot taken before its work
//! with one taken after ([`Counters::since`]). Only explicit releases count as destroyed: the
//! implicit teardown of the last `hsa_shut_down` does not, so a leak stays visible.

use std::sync::atomic::{AtomicU64, Ordering};

use hsa_core::sys::Status;

/// A snapshot of the object counters. `#[repr(C)]`: `hsa_sim_counters` writes one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub inits: u64,
    pub shutdowns: u64,
    pub queues_created: u64,
    pub queues_destroyed: u64,
    pub signals_created: u64,
    pub signals_destroyed: u64,
    /// `hsa_amd_memory_pool_allocate` successes.
    pub allocations_created: u64,
    /// `hsa_amd_memory_pool_free` successes.
    pub allocations_freed: u64,
    pub vmem_handles_created: u64,
    pub vmem_handles_released: u64,
    pub reservations_created: u64,
    pub reservations_freed: u64,
    pub mappings_created: u64,
    pub mappings_destroyed: u64,
    /// `hsa_amd_portable_export_dmabuf` successes: always 0, since every profile refuses to
    /// export AIE memory that way (the field keeps the C layout).
    pub dmabufs_exported: u64,
    /// Fds closed by `hsa_amd_portable_close_dmabuf` (vmem exports, which ROCR closes there
    /// too; a negative fd closes nothing and is not counted).
    pub dmabufs_closed: u64,
    /// `hsa_amd_vmem_export_shareable_handle` successes. The caller closes these with
    /// `close(2)`, which the emulator cannot see, so they have no "destroyed" pair.
    pub shareable_handles_exported: u64,
    /// Doorbell rings that found work.
    pub doorbells: u64,
    /// Packets that ran to completion.
    pub packets_completed: u64,
    /// Doorbell batches that failed (however the profile reports them).
    pub packets_failed: u64,
    /// Command chains started: one per doorbell batch, or more where the profile splits a
    /// batch to fit the driver's 4 KiB chain buffer (`rocr-newest`).
    pub chain_submissions: u64,
    /// `hsa_code_object_reader_create_from_memory` successes.
    pub code_object_readers_created: u64,
    /// `hsa_code_object_reader_destroy` successes.
    pub code_object_readers_destroyed: u64,
    /// `hsa_executable_create_alt` successes.
    pub executables_created: u64,
    /// `hsa_executable_destroy` successes.
    pub executables_destroyed: u64,
    /// Code blobs (PDIs, instruction sequences) a load placed in the device heap.
    pub code_blobs_placed: u64,
    /// Code blobs freed: by `hsa_executable_destroy`, or by a load that failed after placing.
    pub code_blobs_freed: u64,
    /// Hardware contexts built (`kernel-object`: created or rebuilt for a doorbell batch).
    pub hw_context_builds: u64,
    /// Of those builds, the ones caused by a change of kernel kind between batches.
    pub hw_context_mode_switches: u64,
    /// The sum of the column counts of every context built: a test reads the width of one
    /// build as the difference across it.
    pub hw_context_columns: u64,
    /// ROCm 7.0: doorbells whose PDI handles were all in the cache entry of the queue's
    /// current context id, so that nothing was configured (a stale entry: key 0 of a later
    /// queue, or a context id that came back after 255).
    pub rocm70_cache_hits: u64,
    /// Nanoseconds of device time the timing model charged to doorbells (`crate::timing`;
    /// 0 with `HSA_SIM_TIMING` off).
    pub modelled_device_ns: u64,
}

impl Counters {
    /// The created/destroyed pairs, by name.
    pub fn pairs(&self) -> [(&'static str, u64, u64); 11] {
        [
            ("init/shut_down", self.inits, self.shutdowns),
            ("queues", self.queues_created, self.queues_destroyed),
            ("signals", self.signals_created, self.signals_destroyed),
            (
                "pool allocations",
                self.allocations_created,
                self.allocations_freed,
            ),
            (
                "vmem handles",
                self.vmem_handles_created,
                self.vmem_handles_released,
            ),
            (
                "address reservations",
                self.reservations_created,
                self.reservations_freed,
            ),
            (
                "vmem mappings",
                self.mappings_created,
                self.mappings_destroyed,
            ),
            (
                "exported dmabufs",
                self.dmabufs_exported,
                self.dmabufs_closed,
            ),
            (
                "code object readers",
                self.code_object_readers_created,
                self.code_object_readers_destroyed,
            ),
            (
                "executables",
                self.executables_created,
                self.executables_destroyed,
            ),
            ("code blobs", self.code_blobs_placed, self.code_blobs_freed),
        ]
    }

    /// The pairs whose counts differ, as "name: created N, destroyed M".
    pub fn unbalanced(&self) -> Vec<String> {
        self.pairs()
            .into_iter()
            .filter(|(_, c, d)| c != d)
            .map(|(n, c, d)| format!("{n}: created {c}, destroyed {d}"))
            .collect()
    }

    /// True when every object created was destroyed.
    pub fn balanced(&self) -> bool {
        self.unbalanced().is_empty()
    }

    /// What happened between `earlier` and `self` (field by field).
    pub fn since(&self, earlier: &Counters) -> Counters {
        let a = self.as_array();
        let b = earlier.as_array();
        let mut out = [0u64; N_FIELDS];
        for i in 0..N_FIELDS {
            out[i] = a[i].wrapping_sub(b[i]);
        }
        Self::from_array(out)
    }

    fn as_array(&self) -> [u64; N_FIELDS] {
        [
            self.inits,
            self.shutdowns,
            self.queues_created,
            self.queues_destroyed,
            self.signals_created,
            self.signals_destroyed,
            self.allocations_created,
            self.allocations_freed,
            self.vmem_handles_created,
            self.vmem_handles_released,
            self.reservations_created,
            self.reservations_freed,
            self.mappings_created,
            self.mappings_destroyed,
            self.dmabufs_exported,
            self.dmabufs_closed,
            self.shareable_handles_exported,
            self.doorbells,
            self.packets_completed,
            self.packets_failed,
            self.chain_submissions,
            self.code_object_readers_created,
            self.code_object_readers_destroyed,
            self.executables_created,
            self.executables_destroyed,
            self.code_blobs_placed,
            self.code_blobs_freed,
            self.hw_context_builds,
            self.hw_context_mode_switches,
            self.hw_context_columns,
            self.rocm70_cache_hits,
            self.modelled_device_ns,
        ]
    }

    fn from_array(a: [u64; N_FIELDS]) -> Self {
        Self {
            inits: a[0],
            shutdowns: a[1],
            queues_created: a[2],
            queues_destroyed: a[3],
            signals_created: a[4],
            signals_destroyed: a[5],
            allocations_created: a[6],
            allocations_freed: a[7],
            vmem_handles_created: a[8],
            vmem_handles_released: a[9],
            reservations_created: a[10],
            reservations_freed: a[11],
            mappings_created: a[12],
            mappings_destroyed: a[13],
            dmabufs_exported: a[14],
            dmabufs_closed: a[15],
            shareable_handles_exported: a[16],
            doorbells: a[17],
            packets_completed: a[18],
            packets_failed: a[19],
            chain_submissions: a[20],
            code_object_readers_created: a[21],
            code_object_readers_destroyed: a[22],
            executables_created: a[23],
            executables_destroyed: a[24],
            code_blobs_placed: a[25],
            code_blobs_freed: a[26],
            hw_context_builds: a[27],
            hw_context_mode_switches: a[28],
            hw_context_columns: a[29],
            rocm70_cache_hits: a[30],
            modelled_device_ns: a[31],
        }
    }
}

const N_FIELDS: usize = 32;

/// Indexes into the live counters; the order is [`Counters::as_array`]'s.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    Inits = 0,
    Shutdowns,
    QueuesCreated,
    QueuesDestroyed,
    SignalsCreated,
    SignalsDestroyed,
    AllocationsCreated,
    AllocationsFreed,
    VmemHandlesCreated,
    VmemHandlesReleased,
    ReservationsCreated,
    ReservationsFreed,
    MappingsCreated,
    MappingsDestroyed,
    // 14 is `dmabufs_exported`, which stays 0: no profile exports AIE memory through
    // `hsa_amd_portable_export_dmabuf`.
    DmabufsClosed = 15,
    ShareableHandlesExported,
    Doorbells,
    PacketsCompleted,
    PacketsFailed,
    ChainSubmissions,
    CodeObjectReadersCreated,
    CodeObjectReadersDestroyed,
    ExecutablesCreated,
    ExecutablesDestroyed,
    CodeBlobsPlaced,
    CodeBlobsFreed,
    HwContextBuilds,
    HwContextModeSwitches,
    HwContextColumns,
    Rocm70CacheHits,
    ModelledDeviceNs,
}

static LIVE: [AtomicU64; N_FIELDS] = [const { AtomicU64::new(0) }; N_FIELDS];

/// Adds one to a counter.
pub(crate) fn bump(c: Counter) {
    bump_by(c, 1);
}

/// Adds `n` to a counter.
pub(crate) fn bump_by(c: Counter, n: u64) {
    LIVE[c as usize].fetch_add(n, Ordering::Relaxed);
}

/// A snapshot of every counter.
pub fn counters() -> Counters {
    let mut a = [0u64; N_FIELDS];
    for (slot, live) in a.iter_mut().zip(LIVE.iter()) {
        *slot = live.load(Ordering::Relaxed);
    }
    Counters::from_array(a)
}

/// Writes a snapshot of the counters (a [`Counters`]) to `out`. Works without `hsa_init`.
///
/// # Safety
/// `out` is null (the call then returns `HSA_STATUS_ERROR_INVALID_ARGUMENT`) or points to
/// writable memory for one `Counters`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hsa_sim_counters(out: *mut Counters) -> Status {
    if out.is_null() {
        return Status::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: `out` is non-null and, by this function's contract, valid for one write.
    unsafe { out.write_unaligned(counters()) };
    Status::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_round_trip_covers_every_field() {
        let mut a = [0u64; N_FIELDS];
        for (i, v) in a.iter_mut().enumerate() {
            *v = i as u64 + 1;
        }
        let c = Counters::from_array(a);
        assert_eq!(c.as_array(), a);
        assert_eq!(c.chain_submissions, 21);
        assert_eq!(Counter::ChainSubmissions as usize, 20);
        assert_eq!(c.rocm70_cache_hits, N_FIELDS as u64 - 1);
        assert_eq!(Counter::Rocm70CacheHits as usize, N_FIELDS - 2);
        assert_eq!(c.modelled_device_ns, N_FIELDS as u64);
        assert_eq!(Counter::ModelledDeviceNs as usize, N_FIELDS - 1);
        assert_eq!(std::mem::size_of::<Counters>(), N_FIELDS * 8);
    }

    #[test]
    fn unbalanced_names_the_pair() {
        let c = Counters {
            queues_created: 2,
            queues_destroyed: 1,
            ..Default::default()
        };
        assert!(!c.balanced());
        assert_eq!(
            c.unbalanced(),
            vec!["queues: created 2, destroyed 1".to_string()]
        );
        assert!(c.since(&c).balanced());
    }
}

//! Which form a runtime with the AIE loader reads: kernel objects, or still G2.
//!
//! Loading an AIE hsaco does not prove that packets name kernel objects. ROCR's July 2026
//! development tree (the G2-era AIE suite, `rocrtst/suites/aie/dispatch.cc` @ `07ee4564`)
//! already loads `PdiInsts` hsacos through the executable API and publishes a `KERNEL_OBJECT`
//! after freeze, while its driver still reads words 20/24 as an instruction stream and word 48
//! as the PDI (`BuildPdiInstsCommand` in that tree's `amd_xdna_driver.cpp`). Reading the
//! descriptor's version word does not tell the two apart: every stored `amd_aie_section.h`,
//! from the first, sets `kAieKernelDescriptorVersion` to 1, and both runtimes' loaders publish
//! such a descriptor.
//!
//! So the probe asks the driver. It writes one packet of the kernel-object form that both
//! runtimes refuse before anything reaches the device, at different checks:
//!
//! - words 20/24 the probe kernel's `KERNEL_OBJECT`, word 48 (G2's `pdi_addr`) 0, word 56 0,
//!   `num_kernargs` 1 with a NULL `kernarg_address`, no completion signal;
//! - a kernel-object runtime accepts the descriptor (version 1, a kernel it loaded) and refuses
//!   the NULL kernargs: `INVALID_PACKET_FORMAT` (`rocr-aie-hsaco.md` §4, its per-packet table);
//! - a G2 runtime resolves the PDI first and finds no allocation at address 0:
//!   `INVALID_ALLOCATION` (`ResolveBOHandle` before `AddKernargBOs`).
//!
//! Both runtimes report a refused batch through the queue's error callback and suspend the
//! queue, which is then destroyed; the probe's queue is its own, created and destroyed here
//! before the device's queue exists. The runtimes that abort on a refused batch (late 2025, the
//! first G2 release) have no AIE loader, so they never get this far.

use std::sync::Arc;

use super::resource::{ErrorSlot, QueueOwner};
use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{
    AIE_DISPATCH_COUNT, AIE_DISPATCH_HEADER, AIE_PACKET_OPCODE_KMQ, AIE_QUEUE_SIZE, Agent,
    AieKernelObjectPacket, Status,
};

/// What the probe packet showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Words 20/24 are a kernel object.
    KernelObjects,
    /// Words 20/24 are an instruction stream and word 48 the PDI (G2).
    G2,
}

/// The packet the probe rings: see the module documentation.
pub(crate) fn probe_packet(kernel_object: u64) -> AieKernelObjectPacket {
    let mut p = AieKernelObjectPacket {
        header: AIE_DISPATCH_HEADER,
        opcode: AIE_PACKET_OPCODE_KMQ,
        count: AIE_DISPATCH_COUNT,
        num_kernargs: 1,
        ..AieKernelObjectPacket::default()
    };
    p.set_kernel_object(kernel_object);
    p
}

/// The form the runtime reads, from the status it refused the probe packet with.
pub(crate) fn classify(status: Option<Status>) -> Result<Reads, String> {
    match status {
        Some(Status::ERROR_INVALID_PACKET_FORMAT) => Ok(Reads::KernelObjects),
        Some(Status::ERROR_INVALID_ALLOCATION) => Ok(Reads::G2),
        Some(s) => Err(format!(
            "the probe packet was refused with {:#x}, neither the kernel-object runtime's \
             INVALID_PACKET_FORMAT (0x1009) nor G2's INVALID_ALLOCATION (0x1003)",
            s.0
        )),
        None => Err("the probe packet (NULL kernargs for one argument) was not refused".into()),
    }
}

/// Rings the probe packet naming `kernel_object` on a queue of its own and classifies the
/// refusal.
///
/// # Errors
/// The queue's creation failing; [`HsaError::PacketAbiUnknown`] when the refusal is neither
/// form's.
pub(crate) fn run(api: &Arc<HsaApi>, aie: Agent, kernel_object: u64) -> Result<Reads, HsaError> {
    let f = api.fns();
    let errors = Arc::new(ErrorSlot::default());
    let q = QueueOwner::new(api, aie, AIE_QUEUE_SIZE, errors.clone())?;
    let raw = q.raw();
    let ring = q.info().base_address.cast::<u8>();
    let size = u64::from(q.info().size);
    let doorbell = q.info().doorbell_signal;
    // SAFETY: `raw` is the live queue just created; reserving one slot of an empty ring.
    let wr = unsafe { (f.queue_add_write_index_relaxed)(raw, 1) };
    let slot = usize::try_from(wr % size).unwrap_or(0);
    // SAFETY: the slot is 64 bytes inside the runtime's 64-byte-aligned ring (checked by
    // `QueueOwner::new`), reserved above and not yet handed to the runtime.
    unsafe { std::ptr::write_volatile(ring.add(slot * 64).cast(), probe_packet(kernel_object)) };
    // SAFETY: the doorbell belongs to this queue; the store returns once the batch was refused
    // (or ran).
    unsafe { (f.signal_store_screlease)(doorbell, i64::try_from(wr).unwrap_or(i64::MAX)) };
    let status = errors.take();
    drop(q);
    classify(status).map_err(|evidence| HsaError::PacketAbiUnknown {
        evidence: format!(
            "the runtime loaded a built-in AIE code object, but {evidence}; set packet_abi to \
             kernel-object or g2"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_packet_names_the_kernel_object_and_one_argument_without_kernargs() {
        let p = probe_packet(0x1234_5678_9abc_def0);
        assert_eq!(p.kernel_object(), 0x1234_5678_9abc_def0);
        assert_eq!((p.num_kernargs, p.kernarg_address), (1, 0));
        assert_eq!((p.reserved_pdi_addr, p.reserved4), (0, 0));
        assert_eq!(p.completion_signal.handle, 0);
    }

    #[test]
    fn only_the_two_refusals_name_a_form() {
        assert_eq!(
            classify(Some(Status::ERROR_INVALID_PACKET_FORMAT)),
            Ok(Reads::KernelObjects)
        );
        assert_eq!(
            classify(Some(Status::ERROR_INVALID_ALLOCATION)),
            Ok(Reads::G2)
        );
        assert!(classify(Some(Status::ERROR)).is_err());
        assert!(classify(None).is_err());
    }
}

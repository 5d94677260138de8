//! RAII owners of single runtime objects. Each frees its object in `Drop` and logs (never
//! swallows silently, never panics on) a failure there.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::api::HsaApi;
use crate::error::HsaError;
use crate::sys::{
    AccessDesc, AccessPermission, Agent, MemoryPool, MemoryType, Queue, QueueType, Signal,
    SignalValue, Status, VMEM_ADDRESS_NO_REGISTER, VmemHandle,
};

/// One `hsa_init` reference; `Drop` gives it back with `hsa_shut_down`.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) api: Arc<HsaApi>,
}

impl Runtime {
    pub(crate) fn init(api: Arc<HsaApi>) -> Result<Self, HsaError> {
        // SAFETY: hsa_init takes no arguments and is reference counted by the runtime.
        let st = unsafe { (api.fns().init)() };
        if !st.is_ok() {
            return Err(HsaError::Init {
                library: api.source().to_string(),
                status: st,
                message: api.status_string(st),
            });
        }
        Ok(Self { api })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // SAFETY: this value holds exactly one successful hsa_init reference.
        let st = unsafe { (self.api.fns().shut_down)() };
        if let Err(e) = self.api.check("hsa_shut_down", st) {
            tracing::warn!(error = %e, "releasing the HSA runtime failed");
        }
    }
}

/// Memory from `hsa_amd_memory_pool_allocate`.
#[derive(Debug)]
pub(crate) struct PoolAlloc {
    api: Arc<HsaApi>,
    ptr: NonNull<u8>,
}

impl PoolAlloc {
    pub(crate) fn new(api: &Arc<HsaApi>, pool: MemoryPool, size: usize) -> Result<Self, HsaError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; flags 0 is the only documented value.
        let st = unsafe { (api.fns().memory_pool_allocate)(pool, size, 0, &mut p) };
        api.check("hsa_amd_memory_pool_allocate", st)?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| HsaError::Call {
            call: "hsa_amd_memory_pool_allocate",
            status: Status::ERROR_OUT_OF_RESOURCES,
            message: "the runtime reported success but returned a null pointer".into(),
        })?;
        Ok(Self {
            api: api.clone(),
            ptr,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
}

impl Drop for PoolAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from hsa_amd_memory_pool_allocate and is freed exactly once.
        let st = unsafe { (self.api.fns().memory_pool_free)(self.ptr.as_ptr().cast()) };
        if let Err(e) = self.api.check("hsa_amd_memory_pool_free", st) {
            tracing::warn!(error = %e, addr = self.addr(), "freeing device memory failed");
        }
    }
}

/// A vmem allocation: a physical handle mapped at a reserved range, readable and writable by
/// the CPU and the AIE agent (the sequence ROCm's own host runtime uses).
#[derive(Debug)]
pub(crate) struct VmemAlloc {
    api: Arc<HsaApi>,
    handle: VmemHandle,
    va: NonNull<u8>,
    size: usize,
    agents: [Agent; 2],
}

/// Names the optional symbol `$field` for an [`HsaError::Unsupported`] error.
macro_rules! optional {
    ($api:expr, $field:ident, $sym:literal, $op:literal) => {
        $api.fns().$field.ok_or(HsaError::Unsupported {
            operation: $op,
            symbol: $sym,
        })?
    };
}

impl VmemAlloc {
    /// `size` must already be rounded to the pool's allocation granule.
    pub(crate) fn new(
        api: &Arc<HsaApi>,
        pool: MemoryPool,
        size: usize,
        cpu: Agent,
        aie: Agent,
    ) -> Result<Self, HsaError> {
        let create = optional!(
            api,
            vmem_handle_create,
            "hsa_amd_vmem_handle_create",
            "vmem allocation"
        );
        let release = optional!(
            api,
            vmem_handle_release,
            "hsa_amd_vmem_handle_release",
            "vmem allocation"
        );
        let reserve = optional!(
            api,
            vmem_address_reserve_align,
            "hsa_amd_vmem_address_reserve_align",
            "vmem allocation"
        );
        let free = optional!(
            api,
            vmem_address_free,
            "hsa_amd_vmem_address_free",
            "vmem allocation"
        );
        let map = optional!(api, vmem_map, "hsa_amd_vmem_map", "vmem allocation");
        let unmap = optional!(api, vmem_unmap, "hsa_amd_vmem_unmap", "vmem allocation");
        let set_access = optional!(
            api,
            vmem_set_access,
            "hsa_amd_vmem_set_access",
            "vmem allocation"
        );

        let mut handle = VmemHandle::default();
        // SAFETY: `handle` is a valid out-pointer; PINNED with flags 0 as ROCR documents.
        let st = unsafe { create(pool, size, MemoryType::PINNED, 0, &mut handle) };
        api.check("hsa_amd_vmem_handle_create", st)?;
        let release_handle = || {
            // SAFETY: `handle` was created above and is released once, on this error path.
            unsafe { release(handle) };
        };
        let mut va: *mut c_void = std::ptr::null_mut();
        // SAFETY: `va` is a valid out-pointer; NO_REGISTER asks for a plain reservation.
        let st = unsafe { reserve(&mut va, size, 0, 0, VMEM_ADDRESS_NO_REGISTER) };
        if let Err(e) = api.check("hsa_amd_vmem_address_reserve_align", st) {
            release_handle();
            return Err(e);
        }
        // SAFETY: `va` is the reservation of `size` bytes just made; the handle has `size` bytes.
        let st = unsafe { map(va, size, 0, handle, 0) };
        if let Err(e) = api.check("hsa_amd_vmem_map", st) {
            // SAFETY: the reservation is released once, on this error path.
            unsafe { free(va, size) };
            release_handle();
            return Err(e);
        }
        let desc = [
            AccessDesc {
                permissions: AccessPermission::RW,
                agent_handle: cpu,
            },
            AccessDesc {
                permissions: AccessPermission::RW,
                agent_handle: aie,
            },
        ];
        // SAFETY: `va..va+size` is mapped; `desc` holds two valid descriptors.
        let st = unsafe { set_access(va, size, desc.as_ptr(), desc.len()) };
        if let Err(e) = api.check("hsa_amd_vmem_set_access", st) {
            // SAFETY: undo the map and reservation made above, once each.
            unsafe {
                unmap(va, size);
                free(va, size);
            }
            release_handle();
            return Err(e);
        }
        let va = NonNull::new(va.cast::<u8>()).ok_or_else(|| HsaError::Call {
            call: "hsa_amd_vmem_address_reserve_align",
            status: Status::ERROR_OUT_OF_RESOURCES,
            message: "the runtime reported success but returned a null address".into(),
        })?;
        Ok(Self {
            api: api.clone(),
            handle,
            va,
            size,
            agents: [cpu, aie],
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.va.as_ptr()
    }

    pub(crate) fn handle(&self) -> VmemHandle {
        self.handle
    }
}

impl Drop for VmemAlloc {
    fn drop(&mut self) {
        let f = self.api.fns();
        let va = self.va.as_ptr().cast::<c_void>();
        let mut steps: Vec<(&'static str, Status)> = Vec::new();
        // Access is revoked before unmapping, in IRON's order; ROCR's unmap would also remove
        // it itself (`VMemoryHandleUnmap`), so this is belt and braces, not a requirement.
        if let Some(set_access) = f.vmem_set_access {
            let desc = self.agents.map(|a| AccessDesc {
                permissions: AccessPermission::NONE,
                agent_handle: a,
            });
            // SAFETY: the range is still mapped; `desc` holds two valid descriptors.
            steps.push(("hsa_amd_vmem_set_access", unsafe {
                set_access(va, self.size, desc.as_ptr(), 2)
            }));
        }
        // SAFETY: each teardown call runs once, in the order the runtime requires, on objects
        // this value created; the functions exist because `new` succeeded with them.
        unsafe {
            if let Some(unmap) = f.vmem_unmap {
                steps.push(("hsa_amd_vmem_unmap", unmap(va, self.size)));
            }
            if let Some(free) = f.vmem_address_free {
                steps.push(("hsa_amd_vmem_address_free", free(va, self.size)));
            }
            if let Some(release) = f.vmem_handle_release {
                steps.push(("hsa_amd_vmem_handle_release", release(self.handle)));
            }
        }
        for (call, st) in steps {
            if let Err(e) = self.api.check(call, st) {
                tracing::warn!(error = %e, "releasing a vmem allocation failed");
            }
        }
    }
}

/// A signal from `hsa_signal_create`.
#[derive(Debug)]
pub(crate) struct SignalOwner {
    api: Arc<HsaApi>,
    pub(crate) signal: Signal,
}

impl SignalOwner {
    pub(crate) fn new(api: &Arc<HsaApi>, initial: SignalValue) -> Result<Self, HsaError> {
        let mut signal = Signal::default();
        // SAFETY: no consumer list (0, null); `signal` is a valid out-pointer.
        let st = unsafe { (api.fns().signal_create)(initial, 0, std::ptr::null(), &mut signal) };
        api.check("hsa_signal_create", st)?;
        Ok(Self {
            api: api.clone(),
            signal,
        })
    }
}

impl Drop for SignalOwner {
    fn drop(&mut self) {
        // SAFETY: the signal was created by this value and is destroyed once.
        let st = unsafe { (self.api.fns().signal_destroy)(self.signal) };
        if let Err(e) = self.api.check("hsa_signal_destroy", st) {
            tracing::warn!(error = %e, "destroying a signal failed");
        }
    }
}

/// What the queue's error callback recorded. ROCR calls the callback when a doorbell batch
/// fails (its default callback would abort the process).
#[derive(Debug, Default)]
pub(crate) struct ErrorSlot {
    status: AtomicU32,
    hits: AtomicU32,
}

impl ErrorSlot {
    /// The recorded failure, clearing it.
    pub(crate) fn take(&self) -> Option<Status> {
        if self.hits.swap(0, Ordering::AcqRel) == 0 {
            None
        } else {
            Some(Status(self.status.load(Ordering::Acquire)))
        }
    }
}

/// The queue error callback: records the status in the [`ErrorSlot`] passed as `data`.
///
/// # Safety
/// `data` must point at an `ErrorSlot` that outlives the queue.
unsafe extern "C" fn record_queue_error(status: Status, _queue: *mut Queue, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: `QueueOwner` passes a pointer into an `Arc<ErrorSlot>` it keeps alive for as long
    // as the queue exists.
    let slot = unsafe { &*data.cast::<ErrorSlot>() };
    slot.status.store(status.0, Ordering::Release);
    slot.hits.fetch_add(1, Ordering::AcqRel);
}

/// The AIE queue: `hsa_queue_create` with a real error callback.
#[derive(Debug)]
pub(crate) struct QueueOwner {
    api: Arc<HsaApi>,
    queue: NonNull<Queue>,
    /// Keeps the callback's target alive for the queue's life.
    _errors: Arc<ErrorSlot>,
}

impl QueueOwner {
    pub(crate) fn new(
        api: &Arc<HsaApi>,
        aie: Agent,
        size: u32,
        errors: Arc<ErrorSlot>,
    ) -> Result<Self, HsaError> {
        let mut q: *mut Queue = std::ptr::null_mut();
        let data = Arc::as_ptr(&errors).cast_mut().cast::<c_void>();
        // SAFETY: `q` is a valid out-pointer; the callback's `data` stays valid while `errors`
        // is held by the returned owner, which destroys the queue before releasing it.
        let st = unsafe {
            (api.fns().queue_create)(
                aie,
                size,
                QueueType::SINGLE,
                Some(record_queue_error),
                data,
                0,
                0,
                &mut q,
            )
        };
        api.check("hsa_queue_create", st)?;
        let queue = NonNull::new(q).ok_or_else(|| HsaError::Contract {
            call: "hsa_queue_create",
            detail: "success but no queue".into(),
        })?;
        let owner = Self {
            api: api.clone(),
            queue,
            _errors: errors,
        };
        // The ring, the side buffers (one slot per ring slot) and the doorbell are used
        // through what the runtime returned: check it before anything is written there.
        // Dropping `owner` on failure destroys the queue.
        let info = owner.info();
        let problem = if info.size != size {
            Some(format!(
                "a queue of {} packets where {size} were asked for (the side buffers hold {size})",
                info.size
            ))
        } else if info.base_address.is_null() {
            Some("a queue whose ring (base_address) is null".into())
        } else if !(info.base_address as usize).is_multiple_of(64) {
            Some(format!(
                "a queue whose ring {:p} is not 64-byte aligned",
                info.base_address
            ))
        } else if info.doorbell_signal.handle == 0 {
            Some("a queue whose doorbell signal is null".into())
        } else {
            None
        };
        match problem {
            Some(detail) => Err(HsaError::Contract {
                call: "hsa_queue_create",
                detail,
            }),
            None => Ok(owner),
        }
    }

    pub(crate) fn raw(&self) -> *mut Queue {
        self.queue.as_ptr()
    }

    /// The runtime's `hsa_queue_t` (its fields never change after creation).
    pub(crate) fn info(&self) -> &Queue {
        // SAFETY: the runtime owns the struct and keeps it valid until hsa_queue_destroy, which
        // only `Drop` calls (after this borrow of `self` ends), and writes none of its fields
        // after hsa_queue_create returns (the ring indices live outside `hsa_queue_t`), so a
        // shared reference sees no change while it lives.
        unsafe { self.queue.as_ref() }
    }
}

impl Drop for QueueOwner {
    fn drop(&mut self) {
        // SAFETY: the queue was created by this value and is destroyed once.
        let st = unsafe { (self.api.fns().queue_destroy)(self.queue.as_ptr()) };
        if let Err(e) = self.api.check("hsa_queue_destroy", st) {
            tracing::warn!(error = %e, "destroying the queue failed");
        }
    }
}

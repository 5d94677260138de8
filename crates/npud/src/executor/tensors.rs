//! The tensor table: every tensor's owner, size and storage, the per-session quotas, and the
//! staging copies around dispatches that use a client's memfd.
//!
//! Storage kinds (the API's `TensorStorage`):
//! - device memory, reached through WriteTensor/ReadTensor, or exported to the client as a file
//!   descriptor (then dispatches use the client's mapping in place);
//! - a client memfd, mapped by the daemon and copied into a same-size device tensor before each
//!   dispatch that uses it and back after (ROCR cannot take foreign memory as an argument);
//! - a memfd the daemon made for a local client because the runtime exports no tensor memory
//!   (`DeviceInfo.tensor_sharing` "none"): staged the same way, so the client shares memory by
//!   fd exactly as it would with an exported tensor;
//! - an import whose memfd has not arrived yet (dispatches refuse it).
//!
//! Every memfd the daemon maps is sealed against shrinking and growing (the client's, checked
//! on import; the daemon's own, sealed at creation), so a client cannot truncate a mapping
//! under the daemon; and the daemon copies to and from such shared memory only through raw
//! pointers ([`Mapping::copy_to_slice`], [`Mapping::copy_from_slice`]), never through a Rust
//! reference, since the client may write it at any time.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};

use hsa_core::{Arg, Device, TensorId};
use npu_fd::Mapping;
use npu_proto::v1 as pb;

use crate::auth::Quota;
use crate::budget::MemoryBudget;
use crate::error::NpudError;
use crate::sessions::MAX_NAME_BYTES;

#[derive(Debug)]
enum Storage {
    Device {
        shared: bool,
    },
    /// `fd` is the daemon's own memfd, handed to the client on export; `None` for a client's.
    Staged {
        mapping: Mapping,
        fd: Option<OwnedFd>,
    },
    Awaiting,
}

#[derive(Debug)]
struct Tensor {
    session: u64,
    size: u64,
    name: String,
    /// The device memory dispatches use (the staging copy for a memfd); `None` while awaiting.
    device: Option<TensorId>,
    storage: Storage,
}

/// Tensors of every session.
#[derive(Debug)]
pub struct Tensors {
    map: crate::IdMap<u64, Tensor>,
    next_id: u64,
    /// (tensors, bytes) per session.
    usage: HashMap<u64, (u32, u64)>,
    max_count: u32,
    max_bytes: u64,
    /// The daemon-wide tensor budget, checked here where every allocation and import is
    /// counted, so concurrent requests cannot pass it together.
    budget: MemoryBudget,
}

/// A resolved dispatch argument.
#[derive(Debug, Clone, Copy)]
pub struct Resolved {
    pub arg: Arg,
    pub len: u64,
    /// The store id, when the tensor is a staged memfd.
    pub staged: Option<u64>,
}

impl Tensors {
    pub fn new(max_count: u32, max_bytes: u64, budget: MemoryBudget) -> Self {
        Self {
            map: crate::IdMap::default(),
            next_id: 1,
            usage: HashMap::new(),
            max_count,
            max_bytes,
            budget,
        }
    }

    fn admit(
        &self,
        session: u64,
        size: u64,
        name: &str,
        cap: Option<Quota<u64>>,
    ) -> Result<(), NpudError> {
        if size == 0 {
            return Err(NpudError::InvalidArgument(
                "size_bytes: must be at least 1".into(),
            ));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(NpudError::InvalidArgument(format!(
                "name: {} bytes; at most {MAX_NAME_BYTES}",
                name.len()
            )));
        }
        let (count, bytes) = self.usage(session);
        if count >= self.max_count {
            return Err(NpudError::ResourceExhausted(format!(
                "the session already has {count} tensors (limits.max_tensors_per_session)"
            )));
        }
        let (max, key) = match &cap {
            Some(q) if q.max < self.max_bytes => (q.max, q.key.as_str()),
            _ => (self.max_bytes, "limits.max_tensor_bytes_per_session"),
        };
        if bytes.saturating_add(size) > max {
            return Err(NpudError::ResourceExhausted(format!(
                "size_bytes: {size} more bytes would bring the session to {} bytes; at most \
                 {max} ({key})",
                bytes.saturating_add(size),
            )));
        }
        let held = self.usage.values().map(|u| u.1).sum::<u64>();
        self.budget.check_tensor(held, size)
    }

    fn insert(&mut self, t: Tensor) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let u = self.usage.entry(t.session).or_default();
        u.0 += 1;
        u.1 = u.1.saturating_add(t.size);
        self.map.insert(id, t);
        id
    }

    /// (tensors, bytes) a session holds.
    pub fn usage(&self, session: u64) -> (u32, u64) {
        self.usage.get(&session).copied().unwrap_or_default()
    }

    /// (tensors, bytes) of every session that holds any.
    pub fn all_usage(&self) -> HashMap<u64, (u32, u64)> {
        self.usage.clone()
    }

    /// Allocates device memory for a tensor.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for size 0 or a long name; RESOURCE_EXHAUSTED over a quota or when the
    /// device is out of memory.
    pub fn allocate(
        &mut self,
        dev: &mut Device,
        session: u64,
        size: u64,
        name: String,
        cap: Option<Quota<u64>>,
        local: bool,
    ) -> Result<u64, NpudError> {
        self.admit(session, size, &name, cap)?;
        let len = to_usize(size, "size_bytes")?;
        let storage = if local && !dev.info().fd_export {
            // Sealed against shrinking and growing, then against any further seal, before the
            // client sees it: it can neither truncate the daemon's mapping nor seal it read-only.
            let fd = npu_fd::memfd::create("npud-tensor", size)
                .and_then(|fd| npu_fd::memfd::freeze_seals(fd.as_fd()).map(|()| fd))
                .map_err(|e| {
                    NpudError::ResourceExhausted(match crate::fds::fd_exhaustion() {
                        Some(why) => format!("creating the tensor's memfd: {why} ({e})"),
                        None => format!("creating the tensor's memfd: {e}"),
                    })
                })?;
            let mapping = Mapping::new(fd.as_fd(), 0, len)
                .map_err(|e| NpudError::Internal(format!("mapping the tensor's memfd: {e}")))?;
            Storage::Staged {
                mapping,
                fd: Some(fd),
            }
        } else {
            Storage::Device { shared: false }
        };
        let device = dev.alloc_tensor(len)?;
        Ok(self.insert(Tensor {
            session,
            size,
            name,
            device: Some(device),
            storage,
        }))
    }

    /// Declares a tensor whose memfd the client will send.
    ///
    /// # Errors
    /// As [`Tensors::allocate`].
    pub fn declare_import(
        &mut self,
        session: u64,
        size: u64,
        name: String,
        cap: Option<Quota<u64>>,
    ) -> Result<u64, NpudError> {
        self.admit(session, size, &name, cap)?;
        to_usize(size, "size_bytes")?;
        Ok(self.insert(Tensor {
            session,
            size,
            name,
            device: None,
            storage: Storage::Awaiting,
        }))
    }

    fn owned(&self, session: u64, id: u64, field: &str) -> Result<&Tensor, NpudError> {
        self.map
            .get(&id)
            .filter(|t| t.session == session)
            .ok_or_else(|| not_found(field, id))
    }

    fn owned_mut(&mut self, session: u64, id: u64, field: &str) -> Result<&mut Tensor, NpudError> {
        self.map
            .get_mut(&id)
            .filter(|t| t.session == session)
            .ok_or_else(|| not_found(field, id))
    }

    /// Maps a client's checked memfd and allocates its staging copy.
    ///
    /// # Errors
    /// NOT_FOUND for an unknown tensor; FAILED_PRECONDITION when it is not awaiting an import;
    /// the mapping's or the allocation's error.
    pub fn attach_import(
        &mut self,
        dev: &mut Device,
        session: u64,
        id: u64,
        fd: OwnedFd,
    ) -> Result<(), NpudError> {
        let t = self.owned(session, id, "tensor_id")?;
        if !matches!(t.storage, Storage::Awaiting) {
            return Err(NpudError::FailedPrecondition(format!(
                "tensor {id} is not awaiting an import"
            )));
        }
        let size = to_usize(t.size, "size_bytes")?;
        let mapping = Mapping::new(fd.as_fd(), 0, size)
            .map_err(|e| NpudError::FailedPrecondition(format!("mapping the memfd: {e}")))?;
        let staging = dev.alloc_tensor(size)?;
        let t = self.owned_mut(session, id, "tensor_id")?;
        t.device = Some(staging);
        t.storage = Storage::Staged { mapping, fd: None };
        Ok(())
    }

    /// Exports a device tensor as a file descriptor: (fd, offset of the tensor in it, size).
    ///
    /// # Errors
    /// NOT_FOUND; FAILED_PRECONDITION for an imported tensor or a runtime that cannot export.
    pub fn export(
        &mut self,
        dev: &mut Device,
        session: u64,
        id: u64,
    ) -> Result<(OwnedFd, u64, u64), NpudError> {
        let t = self.owned_mut(session, id, "tensor_id")?;
        match (&mut t.storage, t.device) {
            (Storage::Device { shared }, Some(device)) => {
                let (fd, offset) = dev.export_tensor(device)?;
                *shared = true;
                Ok((fd, offset, t.size))
            }
            (Storage::Staged { fd: Some(fd), .. }, _) => {
                let fd = fd.try_clone().map_err(|e| {
                    NpudError::ResourceExhausted(format!("duplicating the tensor's memfd: {e}"))
                })?;
                Ok((fd, 0, t.size))
            }
            _ => Err(NpudError::FailedPrecondition(format!(
                "tensor {id} is a client memfd; only daemon-allocated tensors are exported"
            ))),
        }
    }

    /// Frees a tensor.
    ///
    /// # Errors
    /// NOT_FOUND.
    pub fn free(&mut self, dev: &mut Device, session: u64, id: u64) -> Result<(), NpudError> {
        self.owned(session, id, "tensor_id")?;
        self.remove(dev, id);
        Ok(())
    }

    fn remove(&mut self, dev: &mut Device, id: u64) {
        let Some(t) = self.map.remove(&id) else {
            return;
        };
        if let Some(u) = self.usage.get_mut(&t.session) {
            u.0 = u.0.saturating_sub(1);
            u.1 = u.1.saturating_sub(t.size);
            if u.0 == 0 {
                self.usage.remove(&t.session);
            }
        }
        if let Some(d) = t.device
            && let Err(e) = dev.free_tensor(d)
        {
            tracing::warn!(tensor = id, error = %e, "freeing device memory failed");
        }
    }

    /// Frees tensors of a session, oldest first, until `budget` bytes are freed (at least one
    /// tensor); returns how many were freed and whether the session has none left.
    pub fn release_some(&mut self, dev: &mut Device, session: u64, budget: u64) -> (usize, bool) {
        let mut ids: Vec<(u64, u64)> = self
            .map
            .iter()
            .filter(|(_, t)| t.session == session)
            .map(|(id, t)| (*id, t.size))
            .collect();
        ids.sort_unstable();
        let mut bytes = 0u64;
        let mut freed = 0;
        for &(id, size) in &ids {
            if freed > 0 && bytes.saturating_add(size) > budget {
                return (freed, false);
            }
            self.remove(dev, id);
            bytes = bytes.saturating_add(size);
            freed += 1;
        }
        (freed, true)
    }

    /// Frees everything (shutdown).
    pub fn clear(&mut self, dev: &mut Device) {
        let ids: Vec<u64> = self.map.keys().copied().collect();
        for id in ids {
            self.remove(dev, id);
        }
    }

    pub fn info(&self, session: u64, id: u64) -> Result<pb::TensorInfo, NpudError> {
        let t = self.owned(session, id, "tensor_id")?;
        let (storage, in_place) = match t.storage {
            Storage::Device { shared: true } => (pb::TensorStorage::DeviceShared, true),
            Storage::Device { shared: false } => (pb::TensorStorage::Device, false),
            Storage::Staged { fd: None, .. } => (pb::TensorStorage::ClientMemfdStaged, false),
            Storage::Staged { fd: Some(_), .. } => (pb::TensorStorage::DaemonMemfdStaged, false),
            Storage::Awaiting => (pb::TensorStorage::AwaitingImport, false),
        };
        Ok(pb::TensorInfo {
            tensor_id: id,
            size_bytes: t.size,
            storage: storage.into(),
            in_place,
            name: t.name.clone(),
        })
    }

    /// The size of a tensor, checking ownership.
    pub fn size(&self, session: u64, id: u64, field: &str) -> Result<u64, NpudError> {
        Ok(self.owned(session, id, field)?.size)
    }

    /// Copies bytes into a tensor (into the client's mapping for a memfd).
    ///
    /// # Errors
    /// NOT_FOUND; FAILED_PRECONDITION while awaiting an import; OUT_OF_RANGE as INVALID_ARGUMENT.
    pub fn write(
        &mut self,
        dev: &mut Device,
        session: u64,
        id: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(), NpudError> {
        let t = self.owned_mut(session, id, "tensor_id")?;
        let start = check_range(t.size, offset, data.len() as u64, id)?;
        match (&mut t.storage, t.device) {
            (Storage::Staged { mapping, .. }, _) => mapping
                .copy_from_slice(start, data)
                .map_err(|e| NpudError::Internal(e.to_string())),
            (Storage::Device { .. }, Some(d)) => Ok(dev.write_tensor(d, start, data)?),
            _ => Err(awaiting(id)),
        }
    }

    /// Copies `len` bytes out of a tensor.
    ///
    /// # Errors
    /// As [`Tensors::write`].
    pub fn read(
        &self,
        dev: &Device,
        session: u64,
        id: u64,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, NpudError> {
        let t = self.owned(session, id, "tensor_id")?;
        let start = check_range(t.size, offset, len, id)?;
        let len = to_usize(len, "length")?;
        match (&t.storage, t.device) {
            (Storage::Staged { mapping, .. }, _) => {
                let mut out = vec![0u8; len];
                mapping
                    .copy_to_slice(start, &mut out)
                    .map_err(|e| NpudError::Internal(e.to_string()))?;
                Ok(out)
            }
            (Storage::Device { .. }, Some(d)) => {
                let mut out = vec![0u8; len];
                dev.read_tensor(d, start, &mut out)?;
                Ok(out)
            }
            _ => Err(awaiting(id)),
        }
    }

    /// Resolves a dispatch argument of `session`; `field` names it (`args[1]`).
    ///
    /// # Errors
    /// NOT_FOUND for an unknown or foreign tensor; FAILED_PRECONDITION while awaiting an
    /// import; INVALID_ARGUMENT for a range outside the tensor.
    pub fn resolve(
        &self,
        session: u64,
        a: &pb::TensorArg,
        field: impl std::fmt::Display,
    ) -> Result<Resolved, NpudError> {
        let t = self
            .map
            .get(&a.tensor_id)
            .filter(|t| t.session == session)
            .ok_or_else(|| not_found(format_args!("{field}.tensor_id"), a.tensor_id))?;
        let Some(device) = t.device else {
            return Err(NpudError::FailedPrecondition(format!(
                "{field}.tensor_id: tensor {} awaits its memfd: send it on the fd socket with \
                 the ticket ImportTensor returned",
                a.tensor_id
            )));
        };
        let len = if a.length == 0 {
            t.size.saturating_sub(a.offset)
        } else {
            a.length
        };
        if a.offset >= t.size || a.offset.checked_add(len).is_none_or(|end| end > t.size) {
            return Err(NpudError::InvalidArgument(format!(
                "{field}: bytes {}..{} are outside tensor {} of {} bytes",
                a.offset,
                a.offset.saturating_add(len),
                a.tensor_id,
                t.size
            )));
        }
        Ok(Resolved {
            arg: Arg {
                tensor: device,
                offset: a.offset,
                len: Some(len),
            },
            len,
            staged: matches!(t.storage, Storage::Staged { .. }).then_some(a.tensor_id),
        })
    }

    /// Copies bytes `offset..offset + len` of a staged memfd into its device tensor before a
    /// dispatch (the executor copies a big tensor in several turns).
    pub fn stage_in(
        &self,
        dev: &mut Device,
        id: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), NpudError> {
        if let Some(Tensor {
            storage: Storage::Staged { mapping, .. },
            device: Some(d),
            ..
        }) = self.map.get(&id)
        {
            let (start, len) = (to_usize(offset, "offset")?, to_usize(len, "length")?);
            let err =
                |e: npu_fd::FdError| NpudError::Internal(format!("staging tensor {id} in: {e}"));
            match dev.with_tensor_mut(*d, start, len, |dst| mapping.copy_to_slice(start, dst)) {
                Ok(copied) => copied.map_err(err)?,
                // No slice of device memory while a failed dispatch may still write it:
                // bounce through a buffer, raw copies on both sides.
                Err(_) => {
                    dev.write_tensor(*d, start, &mapping.read_vec::<u8>(start, len).map_err(err)?)?
                }
            }
        }
        Ok(())
    }

    /// Copies bytes `offset..offset + len` of a device tensor back into its staged memfd after
    /// a dispatch.
    pub fn stage_out(
        &mut self,
        dev: &Device,
        id: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), NpudError> {
        if let Some(Tensor {
            storage: Storage::Staged { mapping, .. },
            device: Some(d),
            ..
        }) = self.map.get_mut(&id)
        {
            let (start, len) = (to_usize(offset, "offset")?, to_usize(len, "length")?);
            let err =
                |e: npu_fd::FdError| NpudError::Internal(format!("staging tensor {id} out: {e}"));
            match dev.with_tensor(*d, start, len, |src| mapping.copy_from_slice(start, src)) {
                Ok(copied) => copied.map_err(err)?,
                // As in `stage_in`: after a failed dispatch, copy without a slice.
                Err(_) => {
                    let mut buf = vec![0u8; len];
                    dev.read_tensor(*d, start, &mut buf)?;
                    mapping.copy_from_slice(start, &buf).map_err(err)?;
                }
            }
        }
        Ok(())
    }
}

fn check_range(size: u64, offset: u64, len: u64, id: u64) -> Result<usize, NpudError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => to_usize(offset, "offset"),
        _ => Err(NpudError::InvalidArgument(format!(
            "offset: bytes {offset}..{} are outside tensor {id} of {size} bytes",
            offset.saturating_add(len)
        ))),
    }
}

fn to_usize(v: u64, field: &str) -> Result<usize, NpudError> {
    usize::try_from(v)
        .map_err(|_| NpudError::InvalidArgument(format!("{field}: {v} does not fit in memory")))
}

fn awaiting(id: u64) -> NpudError {
    NpudError::FailedPrecondition(format!(
        "tensor {id} awaits its memfd: send it on the fd socket with the ticket ImportTensor \
         returned"
    ))
}

fn not_found(field: impl std::fmt::Display, id: u64) -> NpudError {
    NpudError::NotFound(format!("{field}: no tensor {id} in this session"))
}

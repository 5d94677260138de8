//! Shared mappings of tensor memory.
//!
//! A [`Mapping`] is a `MAP_SHARED` `mmap` of `len` bytes at `offset` of an fd, unmapped when it
//! is dropped. The fd may be closed once the mapping exists; the mapping keeps the memory alive.
//!
//! # The sharing contract
//!
//! The memory is shared with another process (the daemon, or a client) that may write it at any
//! time, and possibly with other mappings of the same fd in this process. Rust's `&[u8]` promises
//! that nothing changes the bytes while the slice lives, and `&mut [u8]` that nothing else reads
//! or writes them; no type can make the other process keep those promises. The views
//! ([`Mapping::as_slice`], [`Mapping::as_mut_slice`] and the typed ones) are therefore sound only
//! while nothing else writes the bytes (and, for the mutable views, nothing else reads them).
//! npud's protocol provides that: the daemon touches a tensor's memory only while a dispatch
//! that names the tensor runs, and the client that owns the tensor waits for that dispatch
//! before touching the memory again. Code outside that protocol (two clients sharing one
//! tensor, a client writing while its own dispatch runs) breaks the contract; the damage is then
//! torn or surprising data in that tensor, since the bytes are plain integers, but the compiler
//! may also have assumed they did not change.
//!
//! What the type does guarantee:
//! - the mapped range lies inside the fd when the mapping is made ([`FdError::OutOfRange`]
//!   otherwise). Only a size-sealed fd (see [`crate::memfd::check_import`]) keeps it that way:
//!   if an unsealed file is truncated later, touching the vanished pages raises `SIGBUS`.
//! - the views never outlive the mapping, and a read-only mapping hands out no mutable view.
//!
//! `mmap` offsets must be multiples of the page size. Any offset is accepted: the mapping starts
//! at the page boundary below it and the views start at the requested byte.

use std::ffi::c_void;
use std::fmt;
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};

use bytemuck::{Pod, PodCastError};
use rustix::mm::{MapFlags, ProtFlags};

use crate::FdError;

/// A shared memory mapping of part of a file descriptor, unmapped on drop.
///
/// See the [module documentation](self) for when the slice views are sound.
pub struct Mapping {
    /// Page-aligned start of the kernel mapping, as `mmap` returned it.
    base: NonNull<c_void>,
    /// Length of the kernel mapping: `head + len`.
    map_len: usize,
    /// Bytes between `base` and the first byte asked for (`offset % page_size`).
    head: usize,
    /// Bytes asked for.
    len: usize,
    /// Offset asked for, kept for `Debug`.
    offset: u64,
    writable: bool,
}

// SAFETY: a Mapping exclusively owns its address range (nothing else in this process unmaps
// it), and the kernel mapping is not tied to the thread that created it, so moving it to another
// thread, which then drops it, is fine.
unsafe impl Send for Mapping {}

// SAFETY: `&Mapping` only hands out `&[u8]`/`&[T: Pod]` views and the pointer; sharing those
// between threads is no different from sharing them within one thread (the cross-process
// contract in the module docs applies either way). Mutable views need `&mut Mapping`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes at `offset` of `fd` for reading and writing.
    ///
    /// The fd must be open read-write (memfds are).
    ///
    /// # Errors
    ///
    /// [`FdError::ZeroLength`] for `len == 0`, [`FdError::OutOfRange`] when the range reaches
    /// past the fd's size, [`FdError::Sys`] when `fstat` or `mmap` fails (`EACCES` for an fd
    /// not open read-write, `ENODEV` for a file that cannot be mapped).
    #[doc(alias = "mmap")]
    pub fn new(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Self, FdError> {
        Self::map(fd, offset, len, true)
    }

    /// Maps `len` bytes at `offset` of `fd` for reading only.
    ///
    /// # Errors
    ///
    /// As [`Mapping::new`].
    pub fn new_read_only(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Self, FdError> {
        Self::map(fd, offset, len, false)
    }

    fn map(fd: BorrowedFd<'_>, offset: u64, len: usize, writable: bool) -> Result<Self, FdError> {
        if len == 0 {
            return Err(FdError::ZeroLength);
        }
        let stat = rustix::fs::fstat(fd).map_err(FdError::sys("fstat"))?;
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        let len_u64 = len as u64;
        let out_of_range = FdError::OutOfRange {
            offset,
            len: len_u64,
            size,
        };
        match offset.checked_add(len_u64) {
            Some(end) if end <= size => {}
            _ => return Err(out_of_range),
        }
        let page = rustix::param::page_size() as u64;
        let head = usize::try_from(offset % page).expect("a remainder of the page size fits usize");
        let Some(map_len) = head.checked_add(len) else {
            return Err(out_of_range);
        };
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a null address hint lets the kernel choose a range that overlaps no existing
        // mapping, so no memory any Rust object owns is replaced. The file offset is page
        // aligned (`offset - head`), and the range lies inside the file (checked above).
        let base = unsafe {
            rustix::mm::mmap(
                ptr::null_mut(),
                map_len,
                prot,
                MapFlags::SHARED,
                fd,
                offset - offset % page,
            )
        }
        .map_err(FdError::sys("mmap"))?;
        let Some(base) = NonNull::new(base) else {
            // Only MAP_FIXED at address 0 can return null; refuse rather than reason about it.
            return Err(FdError::Sys {
                call: "mmap",
                source: std::io::Error::other("the kernel returned a mapping at address 0"),
            });
        };
        Ok(Mapping {
            base,
            map_len,
            head,
            len,
            offset,
            writable,
        })
    }

    /// Pointer to the first byte asked for (`offset` of the fd).
    pub fn as_ptr(&self) -> *const u8 {
        self.data().as_ptr().cast_const()
    }

    /// Mutable pointer to the first byte asked for.
    ///
    /// Writing through it is only allowed for a mapping made with [`Mapping::new`].
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data().as_ptr()
    }

    /// Length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a mapping of zero bytes cannot be made.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The offset inside the fd where the mapping starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the mapping was made read-write.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The mapped bytes.
    ///
    /// Sound while no other mapping writes them; see the [module documentation](self).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `data()..data()+len` lies inside the live mapping (created with this length,
        // unmapped only by Drop, which cannot run while `self` is borrowed). Shared file pages
        // are always initialized (bytes never written read as 0). Aliasing with other writers
        // is the sharing contract of the module docs.
        unsafe { std::slice::from_raw_parts(self.data().as_ptr(), self.len) }
    }

    /// The mapped bytes, writable.
    ///
    /// Sound while nothing else reads or writes them; see the [module documentation](self).
    ///
    /// # Errors
    ///
    /// [`FdError::ReadOnlyMapping`] for a mapping made with [`Mapping::new_read_only`].
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], FdError> {
        if !self.writable {
            return Err(FdError::ReadOnlyMapping);
        }
        // SAFETY: as in `as_slice`, and the pages are mapped PROT_WRITE (checked above);
        // `&mut self` rules out any other view from this Mapping while this one lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data().as_ptr(), self.len) })
    }

    /// The mapped bytes as a slice of `T`.
    ///
    /// # Errors
    ///
    /// [`FdError::BadView`] when the first byte is not aligned for `T` or the length is not a
    /// multiple of `size_of::<T>()`.
    pub fn as_slice_of<T: Pod>(&self) -> Result<&[T], FdError> {
        bytemuck::try_cast_slice(self.as_slice())
            .map_err(|e| bad_view::<T>(e, self.as_ptr(), self.len))
    }

    /// The mapped bytes as a mutable slice of `T`.
    ///
    /// # Errors
    ///
    /// [`FdError::ReadOnlyMapping`], or [`FdError::BadView`] as for [`Mapping::as_slice_of`].
    pub fn as_mut_slice_of<T: Pod>(&mut self) -> Result<&mut [T], FdError> {
        let (ptr, len) = (self.as_ptr(), self.len);
        bytemuck::try_cast_slice_mut(self.as_mut_slice()?).map_err(|e| bad_view::<T>(e, ptr, len))
    }

    /// Copies `out.len()` bytes at `offset` of the mapping into `out`, through raw pointers:
    /// no reference to the shared bytes is formed, so another process writing them meanwhile
    /// makes the copy torn, never unsound. This is how a process that does not trust the other
    /// side of the mapping reads it.
    ///
    /// # Errors
    ///
    /// [`FdError::RangeOutsideMapping`] when `offset + out.len()` passes the mapping's end.
    pub fn copy_to_slice(&self, offset: usize, out: &mut [u8]) -> Result<(), FdError> {
        self.check_range(offset, out.len())?;
        // SAFETY: the range lies inside the live mapping (checked above); `out` is private
        // memory of the caller, so the two do not overlap; a byte copy has no alignment needs.
        unsafe {
            ptr::copy_nonoverlapping(
                self.data().as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Copies `data` into the mapping at `offset`, through raw pointers (see
    /// [`Mapping::copy_to_slice`]).
    ///
    /// # Errors
    ///
    /// [`FdError::ReadOnlyMapping`], or [`FdError::RangeOutsideMapping`] when
    /// `offset + data.len()` passes the mapping's end.
    pub fn copy_from_slice(&self, offset: usize, data: &[u8]) -> Result<(), FdError> {
        if !self.writable {
            return Err(FdError::ReadOnlyMapping);
        }
        self.check_range(offset, data.len())?;
        // SAFETY: the range lies inside the live mapping, which is PROT_WRITE (both checked
        // above); `data` is the caller's memory and no reference to the mapped bytes exists
        // here, so writing them while another process reads is a race on plain bytes only.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.data().as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<(), FdError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(FdError::RangeOutsideMapping {
                offset,
                len,
                mapped: self.len,
            }),
        }
    }

    fn data(&self) -> NonNull<u8> {
        // SAFETY: `head < page size <= map_len`, so the result stays inside the mapping.
        unsafe { self.base.cast::<u8>().add(self.head) }
    }
}

fn bad_view<T>(error: PodCastError, first: *const u8, len: usize) -> FdError {
    let size = size_of::<T>();
    let align = align_of::<T>();
    let reason = match error {
        PodCastError::TargetAlignmentGreaterAndInputNotAligned
        | PodCastError::AlignmentMismatch => {
            format!(
                "the first byte is at {first:p}, which is not a multiple of the {align}-byte \
                 alignment; map from an offset that is a multiple of {align}"
            )
        }
        PodCastError::OutputSliceWouldHaveSlop => {
            format!("{len} is not a multiple of the {size}-byte element size")
        }
        PodCastError::SizeMismatch => "the element type has size 0".to_owned(),
    };
    FdError::BadView {
        ty: std::any::type_name::<T>(),
        len,
        reason,
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` and `map_len` are exactly what mmap returned, nothing else unmaps this
        // range, and every view borrows `self`, so none outlives this call.
        if let Err(errno) = unsafe { rustix::mm::munmap(self.base.as_ptr(), self.map_len) } {
            tracing::error!(
                address = ?self.base,
                len = self.map_len,
                %errno,
                "munmap failed; the range stays mapped until the process exits"
            );
        }
    }
}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("ptr", &self.as_ptr())
            .field("len", &self.len)
            .field("offset", &self.offset)
            .field("writable", &self.writable)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::memfd;

    #[test]
    fn zero_length_is_an_error() {
        let fd = memfd::create("npu-fd-map", 4096).expect("memfd");
        let err = Mapping::new(fd.as_fd(), 0, 0).expect_err("zero length");
        assert_eq!(
            err.to_string(),
            "cannot map 0 bytes: a mapping needs a length of at least 1"
        );
    }

    #[test]
    fn range_past_the_end_is_an_error() {
        let fd = memfd::create("npu-fd-map", 4096).expect("memfd");
        let err = Mapping::new(fd.as_fd(), 4000, 97).expect_err("past end");
        assert!(
            err.to_string()
                .starts_with("cannot map 97 bytes at offset 4000: the fd is only 4096 bytes"),
            "{err}"
        );
        assert!(Mapping::new(fd.as_fd(), u64::MAX, 2).is_err());
        assert!(Mapping::new(fd.as_fd(), 4000, 96).is_ok());
    }

    #[test]
    fn read_only_mapping_has_no_mutable_view() {
        let fd = memfd::create("npu-fd-map", 4096).expect("memfd");
        let mut map = Mapping::new_read_only(fd.as_fd(), 0, 4096).expect("map");
        assert!(!map.is_writable());
        assert_eq!(map.as_slice().len(), 4096);
        assert!(matches!(map.as_mut_slice(), Err(FdError::ReadOnlyMapping)));
        assert!(matches!(
            map.as_mut_slice_of::<u32>(),
            Err(FdError::ReadOnlyMapping)
        ));
    }

    #[test]
    fn raw_copies_see_another_mappings_writes_and_stay_in_range() {
        let fd = memfd::create("npu-fd-map", 8192).expect("memfd");
        let a = Mapping::new(fd.as_fd(), 4096, 4096).expect("map a");
        let b = Mapping::new(fd.as_fd(), 0, 8192).expect("map b");
        a.copy_from_slice(10, &[1, 2, 3]).expect("write");
        let mut out = [0u8; 5];
        b.copy_to_slice(4096 + 9, &mut out).expect("read");
        assert_eq!(out, [0, 1, 2, 3, 0]);
        let e = a.copy_to_slice(4094, &mut out).expect_err("past the end");
        assert_eq!(
            e.to_string(),
            "bytes 4094..4099 are outside the 4096-byte mapping"
        );
        assert!(a.copy_from_slice(usize::MAX, &[1]).is_err());
        let ro = Mapping::new_read_only(fd.as_fd(), 0, 4096).expect("map ro");
        assert!(matches!(
            ro.copy_from_slice(0, &[1]),
            Err(FdError::ReadOnlyMapping)
        ));
    }

    #[test]
    fn fresh_memfd_reads_as_zeros() {
        let fd = memfd::create("npu-fd-map", 8192).expect("memfd");
        let map = Mapping::new(fd.as_fd(), 100, 8000).expect("map");
        assert!(map.as_slice().iter().all(|&b| b == 0));
        assert_eq!(map.offset(), 100);
    }
}

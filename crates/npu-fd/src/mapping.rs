//! Shared mappings of tensor memory.
//!
//! A [`Mapping`] is a `MAP_SHARED` `mmap` of `len` bytes at `offset` of an fd, unmapped when it
//! is dropped. The fd may be closed once the mapping exists; the mapping keeps the memory alive.
//!
//! # Shared memory is not a slice
//!
//! The memory is shared with whatever else maps the fd: another process (the daemon, or a
//! client), the device, other mappings of the same fd in this process. Rust's `&[u8]` promises
//! that nothing changes the bytes while the slice lives, and `&mut [u8]` that nothing else reads
//! or writes them; no type can make another process keep those promises. So:
//!
//! - the copies ([`Mapping::copy_to_slice`], [`Mapping::copy_from_slice`] and the typed
//!   [`Mapping::read_into`], [`Mapping::read_vec`], [`Mapping::write_from`]) are safe. They go
//!   through raw pointers and form no reference to the shared bytes, so a writer on the other
//!   side makes a copy torn (some old bytes, some new), never unsound. Code that does not trust
//!   the other side (the daemon, reading a client's memfd) uses only these.
//! - the views ([`Mapping::as_slice`], [`Mapping::as_mut_slice`] and the typed ones) are
//!   `unsafe`: the caller promises that, while a view lives, nothing else writes the bytes (and,
//!   for a mutable view, nothing else reads them either), in this process or any other. memmap2
//!   draws the same line.
//!
//! [`crate::ClientMemory`] wraps a mapping in the one situation where that promise can be kept
//! by construction: a client's own tensor memory, which no other mapping in the process shares
//! and which the daemon writes only while the client has lent it.
//!
//! What the type guarantees:
//! - the mapped range lies inside the fd when the mapping is made ([`FdError::OutOfRange`]
//!   otherwise). Only a size-sealed fd (see [`crate::memfd::check_import`]) keeps it that way:
//!   if an unsealed file is truncated later, touching the vanished pages raises `SIGBUS`.
//! - copies stay inside the mapping, writes need a mapping made with [`Mapping::new`] and
//!   `&mut self` (so two threads of this process never write one mapping at once), and no
//!   view or copy outlives the mapping.
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
/// See the [module documentation](self): copies are safe, views are `unsafe`.
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

// SAFETY: through `&Mapping` this process can only read the bytes (`copy_to_slice` and the
// typed reads, the unsafe shared views) and take the const pointer; every write (the copies
// into the mapping, the mutable views, `as_mut_ptr`) needs `&mut Mapping`. So sharing `&Mapping`
// between threads lets them read concurrently, never write while another reads.
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

    /// The mapped bytes, as a slice.
    ///
    /// Prefer [`Mapping::copy_to_slice`] or [`Mapping::read_vec`], which are safe.
    ///
    /// # Safety
    ///
    /// While the returned slice lives, nothing may write the mapped bytes: no other process,
    /// no device, no other mapping of the same memory in this process (the borrow of `self`
    /// already excludes writes through this one). Bytes that change under a `&[u8]` are
    /// undefined behaviour even when the change is only torn data.
    ///
    /// Safe code cannot take a view:
    ///
    /// ```compile_fail,E0133
    /// use std::os::fd::AsFd;
    /// let fd = npu_fd::memfd::create("view", 4096)?;
    /// let map = npu_fd::Mapping::new(fd.as_fd(), 0, 4096)?;
    /// let first: u8 = map.as_slice()[0];
    /// # Ok::<(), npu_fd::FdError>(())
    /// ```
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `data()..data()+len` lies inside the live mapping (created with this length,
        // unmapped only by Drop, which cannot run while `self` is borrowed). Shared file pages
        // are always initialized (bytes never written read as 0). That nothing writes them
        // while the slice lives is the caller's promise (this function's contract).
        unsafe { std::slice::from_raw_parts(self.data().as_ptr(), self.len) }
    }

    /// The mapped bytes, as a writable slice.
    ///
    /// Prefer [`Mapping::copy_from_slice`] or [`Mapping::write_from`], which are safe.
    ///
    /// # Safety
    ///
    /// While the returned slice lives, nothing else may read or write the mapped bytes: no
    /// other process, no device, no other mapping of the same memory in this process.
    ///
    /// # Errors
    ///
    /// [`FdError::ReadOnlyMapping`] for a mapping made with [`Mapping::new_read_only`].
    pub unsafe fn as_mut_slice(&mut self) -> Result<&mut [u8], FdError> {
        if !self.writable {
            return Err(FdError::ReadOnlyMapping);
        }
        // SAFETY: as in `as_slice`, and the pages are mapped PROT_WRITE (checked above);
        // `&mut self` rules out any other view or copy through this Mapping while this one
        // lives, and the caller promises that nothing else touches the bytes meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data().as_ptr(), self.len) })
    }

    /// The mapped bytes as a slice of `T`.
    ///
    /// # Safety
    ///
    /// As [`Mapping::as_slice`].
    ///
    /// # Errors
    ///
    /// [`FdError::BadView`] when the first byte is not aligned for `T` or the length is not a
    /// multiple of `size_of::<T>()`.
    pub unsafe fn as_slice_of<T: Pod>(&self) -> Result<&[T], FdError> {
        // SAFETY: the caller keeps `as_slice`'s contract for as long as the cast view lives,
        // which is as long as the byte view it is made from.
        let bytes = unsafe { self.as_slice() };
        bytemuck::try_cast_slice(bytes).map_err(|e| bad_view::<T>(e, self.as_ptr(), self.len))
    }

    /// The mapped bytes as a mutable slice of `T`.
    ///
    /// # Safety
    ///
    /// As [`Mapping::as_mut_slice`].
    ///
    /// # Errors
    ///
    /// [`FdError::ReadOnlyMapping`], or [`FdError::BadView`] as for [`Mapping::as_slice_of`].
    pub unsafe fn as_mut_slice_of<T: Pod>(&mut self) -> Result<&mut [T], FdError> {
        let (ptr, len) = (self.as_ptr(), self.len);
        // SAFETY: the caller keeps `as_mut_slice`'s contract for as long as the cast view
        // lives, which is as long as the byte view it is made from.
        let bytes = unsafe { self.as_mut_slice()? };
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| bad_view::<T>(e, ptr, len))
    }

    /// Copies `out.len()` elements starting at byte `offset` of the mapping into `out` (see
    /// [`Mapping::copy_to_slice`]). `offset` needs no alignment: the copy is bytewise.
    ///
    /// # Errors
    ///
    /// [`FdError::RangeOutsideMapping`] when the elements reach past the mapping's end.
    pub fn read_into<T: Pod>(&self, offset: usize, out: &mut [T]) -> Result<(), FdError> {
        self.copy_to_slice(offset, bytemuck::cast_slice_mut(out))
    }

    /// Copies `count` elements starting at byte `offset` of the mapping into a new `Vec` (see
    /// [`Mapping::copy_to_slice`]).
    ///
    /// # Errors
    ///
    /// [`FdError::RangeOutsideMapping`] when the elements reach past the mapping's end (also
    /// when `count * size_of::<T>()` overflows).
    pub fn read_vec<T: Pod>(&self, offset: usize, count: usize) -> Result<Vec<T>, FdError> {
        let bytes = count
            .checked_mul(size_of::<T>())
            .ok_or(FdError::RangeOutsideMapping {
                offset,
                len: usize::MAX,
                mapped: self.len,
            })?;
        self.check_range(offset, bytes)?;
        let mut out = vec![T::zeroed(); count];
        self.read_into(offset, &mut out)?;
        Ok(out)
    }

    /// Copies `data` into the mapping starting at byte `offset` (see
    /// [`Mapping::copy_from_slice`]).
    ///
    /// # Errors
    ///
    /// As [`Mapping::copy_from_slice`].
    pub fn write_from<T: Pod>(&mut self, offset: usize, data: &[T]) -> Result<(), FdError> {
        self.copy_from_slice(offset, bytemuck::cast_slice(data))
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
        // SAFETY: the range lies inside the live mapping (checked above). `out` is a `&mut`
        // the caller holds, so it is not a view of this mapping (views borrow `self`, and an
        // unsafe view's contract forbids writes meanwhile), and the two do not overlap. A byte
        // copy has no alignment needs; a writer elsewhere makes the copy torn, no reference to
        // the shared bytes is formed.
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
    /// [`Mapping::copy_to_slice`]). It takes `&mut self` so that no other thread of this
    /// process copies out of or into this mapping meanwhile.
    ///
    /// # Errors
    ///
    /// [`FdError::ReadOnlyMapping`], or [`FdError::RangeOutsideMapping`] when
    /// `offset + data.len()` passes the mapping's end.
    pub fn copy_from_slice(&mut self, offset: usize, data: &[u8]) -> Result<(), FdError> {
        if !self.writable {
            return Err(FdError::ReadOnlyMapping);
        }
        self.check_range(offset, data.len())?;
        // SAFETY: the range lies inside the live mapping, which is PROT_WRITE (both checked
        // above); `data` is the caller's memory (a view of this mapping would need a borrow of
        // `self`, which `&mut self` excludes), so the two do not overlap. No reference to the
        // mapped bytes is formed, so another process reading them meanwhile sees torn bytes,
        // and `&mut self` keeps this process's other threads off this mapping.
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
        assert_eq!(map.read_vec::<u8>(0, 4096).expect("read").len(), 4096);
        // SAFETY: the memfd is this test's alone and nothing writes it.
        unsafe {
            assert_eq!(map.as_slice().len(), 4096);
            assert!(matches!(map.as_mut_slice(), Err(FdError::ReadOnlyMapping)));
            assert!(matches!(
                map.as_mut_slice_of::<u32>(),
                Err(FdError::ReadOnlyMapping)
            ));
        }
        assert!(matches!(
            map.write_from(0, &[1u32]),
            Err(FdError::ReadOnlyMapping)
        ));
    }

    #[test]
    fn raw_copies_see_another_mappings_writes_and_stay_in_range() {
        let fd = memfd::create("npu-fd-map", 8192).expect("memfd");
        let mut a = Mapping::new(fd.as_fd(), 4096, 4096).expect("map a");
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
        let mut ro = Mapping::new_read_only(fd.as_fd(), 0, 4096).expect("map ro");
        assert!(matches!(
            ro.copy_from_slice(0, &[1]),
            Err(FdError::ReadOnlyMapping)
        ));
    }

    #[test]
    fn fresh_memfd_reads_as_zeros() {
        let fd = memfd::create("npu-fd-map", 8192).expect("memfd");
        let map = Mapping::new(fd.as_fd(), 100, 8000).expect("map");
        assert!(
            map.read_vec::<u8>(0, 8000)
                .expect("read")
                .iter()
                .all(|&b| b == 0)
        );
        assert_eq!(map.offset(), 100);
    }

    #[test]
    fn typed_copies_are_bytewise_and_stay_in_range() {
        let fd = memfd::create("npu-fd-map", 4096).expect("memfd");
        let mut map = Mapping::new(fd.as_fd(), 0, 4096).expect("map");
        // An odd byte offset: typed copies need no alignment, unlike views.
        map.write_from(1, &[0x0403_0201u32, 0x0807_0605])
            .expect("write");
        assert_eq!(
            map.read_vec::<u8>(0, 10).expect("bytes"),
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 0]
        );
        assert_eq!(
            map.read_vec::<u32>(1, 2).expect("u32s"),
            [0x0403_0201, 0x0807_0605]
        );
        let mut two = [0u16; 2];
        map.read_into(2, &mut two).expect("u16s");
        assert_eq!(two, [0x0302, 0x0504]);
        assert!(map.read_vec::<u32>(4093, 1).is_err());
        assert!(map.read_vec::<u64>(0, usize::MAX).is_err());
        assert!(map.write_from(4095, &[1u16]).is_err());
    }
}

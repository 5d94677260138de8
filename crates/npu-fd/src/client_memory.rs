//! [`ClientMemory`]: a client's own tensor memory, with safe views.
//!
//! A [`Mapping`]'s views are `unsafe` because anything else that maps the fd may write the
//! bytes. A client of npud is in a position to rule that out, and this type is where it does:
//!
//! - **No other mapping in this process.** A `ClientMemory` maps the fd it is made from and
//!   closes it; the fd never reaches the caller. It comes from a private memfd this type
//!   creates ([`ClientMemory::private`], a staging copy nobody else has) or from one redemption
//!   of an export ticket ([`ClientMemory::redeem_export`]): npud issues one export ticket per
//!   tensor, and a ticket is redeemed once.
//! - **The daemon writes only while the memory is lent.** npud writes an exported tensor's
//!   memory only while a call from the client that names the tensor as written is in flight (a
//!   dispatch, a chain link, a pipelined dispatch). The client marks the memory lent
//!   ([`ClientMemory::lend`], which needs `&mut self`, so no view is alive) before it sends such
//!   a call, and takes it back ([`ClientMemory::reclaim`]) once the daemon has answered. While
//!   the memory is lent every view and copy is refused with [`FdError::Lent`]. A call that is
//!   abandoned (its future dropped, a pipeline dropped with the dispatch in flight) leaves the
//!   memory lent for good: the daemon may still write it, and nothing says when it stops.
//! - **Writes in this process need `&mut self`**, so a view never sees this process change it.
//!
//! The second point is a promise about npud's behaviour and about the code that talks to it
//! (npu-client lends before every call that lets the daemon write, and reclaims only on the
//! answer); it is the contract of [`ClientMemory::lend`] and [`ClientMemory::reclaim`]. The
//! daemon also reads the memory during calls that name it as read; a read elsewhere does not
//! change what a view here sees, so those calls need no lending.
//!
//! A device or daemon that breaks the protocol, or another process of the same user that
//! reaches the memory anyway (through `/proc/PID/map_files` or `/proc/PID/mem`, or by redeeming
//! a leaked ticket: tickets are bearer tokens), is outside what any type can guard.

use std::fmt;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use bytemuck::Pod;

use crate::wire::{Ticket, client as wire_client};
use crate::{FdError, Mapping, memfd};

/// A client's own tensor memory: a mapping no other object in this process shares, written by
/// the daemon only while lent. See the [module documentation](self).
///
/// ```
/// let mut m = npu_fd::ClientMemory::private("doc", 64)?;
/// m.view_mut::<u32>()?.fill(3);
/// assert_eq!(m.view::<u32>()?[15], 3);
/// # Ok::<(), npu_fd::FdError>(())
/// ```
///
/// A view cannot be held while the memory is lent:
///
/// ```compile_fail,E0502
/// let mut m = npu_fd::ClientMemory::private("doc", 64)?;
/// let v = m.view::<u32>()?;
/// m.lend(); // the daemon may write from here on
/// assert_eq!(v[0], 0);
/// # Ok::<(), npu_fd::FdError>(())
/// ```
pub struct ClientMemory {
    map: Mapping,
    lent: bool,
}

impl ClientMemory {
    /// `len` bytes of a new memfd (sealed against shrinking and growing) that only this
    /// process maps: a staging copy.
    ///
    /// # Errors
    ///
    /// As [`memfd::create`] and [`Mapping::new`].
    pub fn private(name: &str, len: usize) -> Result<Self, FdError> {
        let fd = memfd::create(name, len as u64)?;
        let map = Mapping::new(fd.as_fd(), 0, len)?;
        Ok(Self { map, lent: false })
    }

    /// Redeems an export ticket on the daemon's fd socket and maps the tensor it names, which
    /// must be `len` bytes. The received fd is closed once mapped.
    ///
    /// # Errors
    ///
    /// As [`wire_client::redeem_export`] and [`Mapping::new`]; [`FdError::Malformed`] when the
    /// daemon reports another size than `len`.
    pub fn redeem_export(
        stream: &UnixStream,
        ticket: &Ticket,
        len: usize,
    ) -> Result<Self, FdError> {
        let (fd, offset, size) = wire_client::redeem_export(stream, ticket)?;
        if size != len as u64 {
            return Err(FdError::Malformed(format!(
                "the daemon exported the tensor as {size} bytes; {len} were allocated"
            )));
        }
        let map = Mapping::new(fd.as_fd(), offset, len)?;
        Ok(Self { map, lent: false })
    }

    /// Length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always `false`: a mapping of zero bytes cannot be made.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the memory is lent to the daemon (views and copies are refused).
    pub fn is_lent(&self) -> bool {
        self.lent
    }

    /// Marks the memory lent: from now until [`ClientMemory::reclaim`], the daemon may write it
    /// and every view and copy is refused. Call it before sending a call that names this
    /// memory as written.
    pub fn lend(&mut self) {
        self.lent = true;
    }

    /// Takes lent memory back. Call it only once the daemon has answered every call this
    /// memory was lent for: afterwards views are handed out again, and they would alias the
    /// daemon's writes if one were still running.
    pub fn reclaim(&mut self) {
        self.lent = false;
    }

    /// The first byte of the memory as a raw pointer, for foreign code that reaches memory only
    /// through pointers (a numpy array over a tensor, say). Obtaining it is safe; using it is
    /// the caller's promise: no Rust reference may be formed from it, and while foreign code
    /// writes through it no view of this memory may be alive (views assume only `&mut self`
    /// writes). The pointer is valid for [`ClientMemory::len`] bytes while `self` lives.
    #[must_use]
    pub fn as_foreign_ptr(&self) -> *mut u8 {
        self.map.as_ptr().cast_mut()
    }

    /// Copies `out.len()` elements from byte `offset` of the memory into `out`, through raw
    /// pointers: no Rust reference to the memory is formed, so the copy stays sound while
    /// foreign code writes it through [`ClientMemory::as_foreign_ptr`] (the copy then holds
    /// some mix of old and new bytes, as any copy racing a writer does).
    ///
    /// # Errors
    ///
    /// [`FdError::Lent`] while lent; [`FdError::RangeOutsideMapping`] for a range past the end.
    pub fn read_into<T: Pod>(&self, offset: usize, out: &mut [T]) -> Result<(), FdError> {
        self.check_not_lent()?;
        self.map.read_into(offset, out)
    }

    /// The memory as a slice of `T`.
    ///
    /// # Errors
    ///
    /// [`FdError::Lent`] while lent; [`FdError::BadView`] when the memory is not aligned for
    /// `T` or its length is not a multiple of `size_of::<T>()`.
    pub fn view<T: Pod>(&self) -> Result<&[T], FdError> {
        self.check_not_lent()?;
        // SAFETY: nothing else writes the bytes while the view lives: no other mapping of
        // them exists in this process (the fd was closed after this one mapping was made, see
        // the module docs), this process writes them only through `&mut self`, which the view's
        // borrow of `self` excludes, and the daemon writes them only while they are lent,
        // which was checked above and cannot start while `self` is borrowed (`lend` needs
        // `&mut self`).
        unsafe { self.map.as_slice_of::<T>() }
    }

    /// The memory as a mutable slice of `T`.
    ///
    /// # Errors
    ///
    /// As [`ClientMemory::view`].
    pub fn view_mut<T: Pod>(&mut self) -> Result<&mut [T], FdError> {
        self.check_not_lent()?;
        // SAFETY: as in `view`; `&mut self` also excludes every other view and copy through
        // this object, and the daemon does not read or write the memory on its own: it reads
        // it during calls the client makes, and no call can be made through this object while
        // the view holds `&mut self`. A daemon reading it during an earlier read-only call
        // still in flight does not change what this process observes.
        unsafe { self.map.as_mut_slice_of::<T>() }
    }

    /// Copies `data` into the memory at byte `offset`.
    ///
    /// # Errors
    ///
    /// [`FdError::Lent`] while lent; [`FdError::RangeOutsideMapping`] for a range past the end.
    pub fn write_from<T: Pod>(&mut self, offset: usize, data: &[T]) -> Result<(), FdError> {
        self.check_not_lent()?;
        self.map.write_from(offset, data)
    }

    fn check_not_lent(&self) -> Result<(), FdError> {
        if self.lent {
            return Err(FdError::Lent);
        }
        Ok(())
    }
}

impl fmt::Debug for ClientMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientMemory")
            .field("map", &self.map)
            .field("lent", &self.lent)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_memory_refuses_views_and_copies_until_reclaimed() {
        let mut m = ClientMemory::private("npu-fd-client", 64).expect("private");
        m.write_from(0, &[7u32; 16]).expect("write");
        m.lend();
        assert!(m.is_lent());
        assert!(matches!(m.view::<u32>(), Err(FdError::Lent)));
        assert!(matches!(m.view_mut::<u32>(), Err(FdError::Lent)));
        assert!(matches!(m.write_from(0, &[1u8]), Err(FdError::Lent)));
        assert_eq!(
            FdError::Lent.to_string(),
            "the memory is lent to the daemon for a call that may still write it"
        );
        m.reclaim();
        assert_eq!(m.view::<u32>().expect("view"), &[7u32; 16]);
        m.view_mut::<u32>().expect("view")[3] = 9;
        assert_eq!(m.view::<u32>().expect("view")[3], 9);
    }
}

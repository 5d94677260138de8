//! The dispatch ring: a submission ring and a completion ring in one sealed memfd that a local
//! client shares with npud (the layout and rules are `proto/npud/v1/ring.md`).
//!
//! [`RingMemory`] maps the memfd and gives the two things both sides do with it, all through
//! atomics so that whatever the other process writes meanwhile is never undefined behaviour here:
//!
//! - [`RingMemory::load`] / [`RingMemory::store`] the header's `u32` words ([`Word`]), and
//!   [`RingMemory::ring`] / [`RingMemory::wait`] the futex doorbells.
//! - Copy a slot in or out word by word ([`RingMemory::read_submission`],
//!   [`RingMemory::write_submission`], [`RingMemory::read_completion`],
//!   [`RingMemory::write_completion`]). A slot the other side rewrites while it is copied comes
//!   out torn, never as anything a [`Submission`] or [`Completion`] cannot hold: decoding checks
//!   the private copy.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::{FdError, Mapping, memfd};

/// Slots per ring (version 1).
pub const SLOTS: u32 = 64;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 4096;
/// Bytes of a submission slot.
pub const SUBMISSION_BYTES: usize = 512;
/// Bytes of a completion slot.
pub const COMPLETION_BYTES: usize = 1024;
/// Bytes of the ring's memfd.
pub const RING_BYTES: usize = HEADER_BYTES + SLOTS as usize * (SUBMISSION_BYTES + COMPLETION_BYTES);
/// Most arguments a submission carries.
pub const MAX_ARGS: usize = 15;
/// Longest message a completion carries, in bytes.
pub const MAX_MESSAGE: usize = COMPLETION_BYTES - 32;

const SUB_WORDS: usize = SUBMISSION_BYTES / 8;
const COMP_WORDS: usize = COMPLETION_BYTES / 8;
/// Words before a submission's arguments, and per argument.
const SUB_HEADER_WORDS: usize = 4;
const ARG_WORDS: usize = 4;
/// Words before a completion's message.
const COMP_HEADER_WORDS: usize = 4;

/// A submission slot as copied out of the ring, before any check.
pub type RawSubmission = [u64; SUB_WORDS];
/// A completion slot as copied out of the ring.
pub type RawCompletion = [u64; COMP_WORDS];

/// A `u32` of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    /// Submissions published (client).
    SqTail,
    /// Submissions copied out (daemon).
    SqHead,
    /// The daemon's futex word.
    SqBell,
    /// 1 while the daemon sleeps or is about to.
    SqSleeping,
    /// Completions published (daemon).
    CqTail,
    /// Completions consumed (client).
    CqHead,
    /// The client's futex word.
    CqBell,
    /// 1 while the client sleeps or is about to.
    CqSleeping,
    /// 0 open, [`STATE_CLOSED`], [`STATE_BROKEN`] (daemon).
    State,
    /// With [`STATE_BROKEN`]: [`BROKEN_SQ_TAIL`], [`BROKEN_CQ_HEAD`] or [`BROKEN_LIFELINE`]
    /// (daemon).
    Broken,
}

/// `state`: the daemon tore the ring down (session ended, lifeline closed, daemon stopping).
pub const STATE_CLOSED: u32 = 1;
/// `state`: the client broke a rule of the ring; `broken` says which.
pub const STATE_BROKEN: u32 = 2;
/// `broken`: `sq_tail` was more than [`SLOTS`] ahead of what the daemon copied.
pub const BROKEN_SQ_TAIL: u32 = 1;
/// `broken`: `cq_head` was ahead of `cq_tail`, or more than [`SLOTS`] behind it.
pub const BROKEN_CQ_HEAD: u32 = 2;
/// `broken`: the client sent bytes or fds on the ring's lifeline, which carries none.
pub const BROKEN_LIFELINE: u32 = 3;

impl Word {
    const fn offset(self) -> usize {
        match self {
            Word::SqTail => 0,
            Word::SqHead => 64,
            Word::SqBell => 128,
            Word::SqSleeping => 132,
            Word::CqTail => 192,
            Word::CqHead => 256,
            Word::CqBell => 320,
            Word::CqSleeping => 324,
            Word::State => 384,
            Word::Broken => 388,
        }
    }
}

/// The ring's memory, mapped read-write; every access is atomic.
#[derive(Debug)]
pub struct RingMemory {
    /// Keeps the mapping alive; never read or written through its own methods.
    _map: Mapping,
    /// First byte of the mapping (page aligned).
    base: NonNull<u8>,
}

// SAFETY: the mapping is owned (unmapped only on drop) and not tied to a thread; every access
// through `base` is an atomic load, store or read-modify-write, so any number of threads (and
// the other process) may access it at once.
unsafe impl Send for RingMemory {}
// SAFETY: as for Send: `&RingMemory` only allows atomic accesses.
unsafe impl Sync for RingMemory {}

impl RingMemory {
    /// Creates a ring's memfd ([`RING_BYTES`], sealed against shrinking and growing, zeroed)
    /// and maps it: the client's side.
    ///
    /// # Errors
    ///
    /// [`FdError::Sys`] when `memfd_create`, `ftruncate`, sealing or `mmap` fails.
    pub fn create() -> Result<(OwnedFd, RingMemory), FdError> {
        let fd = memfd::create("npud-ring", RING_BYTES as u64)?;
        let ring = RingMemory::map(fd.as_fd())?;
        Ok((fd, ring))
    }

    /// Maps a ring's fd, which must be at least [`RING_BYTES`] long (the daemon checks it
    /// with [`memfd::check_import`] first, so that it cannot shrink under the mapping).
    ///
    /// # Errors
    ///
    /// As [`Mapping::new`].
    pub fn map(fd: BorrowedFd<'_>) -> Result<RingMemory, FdError> {
        let mut map = Mapping::new(fd, 0, RING_BYTES)?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or_else(|| FdError::Sys {
            call: "mmap",
            source: std::io::Error::other("the mapping starts at address 0"),
        })?;
        // Offset 0 maps at a page boundary: every u32 and u64 of the layout is aligned.
        debug_assert_eq!(base.as_ptr().align_offset(4096), 0);
        Ok(RingMemory { _map: map, base })
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= RING_BYTES);
        // SAFETY: `offset` is inside the mapping and 4-aligned (asserted; the base is page
        // aligned), the mapping is read-write and lives as long as `self`, and the memory is
        // only ever accessed atomically in this process (see the Sync impl).
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast::<u32>()) }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= RING_BYTES);
        // SAFETY: as in `u32_at`, with 8-byte alignment.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast::<u64>()) }
    }

    /// Reads a header word (sequentially consistent, as the doorbell protocol needs).
    pub fn load(&self, w: Word) -> u32 {
        self.u32_at(w.offset()).load(Ordering::SeqCst)
    }

    /// Writes a header word (sequentially consistent).
    pub fn store(&self, w: Word, v: u32) {
        self.u32_at(w.offset()).store(v, Ordering::SeqCst);
    }

    /// Rings a doorbell: adds 1 to `bell` and wakes every thread sleeping on it.
    pub fn ring(&self, bell: Word) {
        let word = self.u32_at(bell.offset());
        word.fetch_add(1, Ordering::SeqCst);
        // Not FUTEX_PRIVATE_FLAG: the sleeper may be another process. A failure can only be
        // EFAULT or EINVAL, which the layout excludes; a wake lost to it is bounded by the
        // sleeper's timeout.
        let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), u32::MAX);
    }

    /// Sleeps on `bell` while it holds `seen`, for at most `timeout` (returns at once when it
    /// holds something else; a signal or a spurious wake returns early too).
    pub fn wait(&self, bell: Word, seen: u32, timeout: Duration) {
        let ts = rustix::thread::futex::Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let word = self.u32_at(bell.offset());
        let _ = rustix::thread::futex::wait(
            word,
            rustix::thread::futex::Flags::empty(),
            seen,
            Some(&ts),
        );
    }

    fn submission_at(index: u32) -> usize {
        HEADER_BYTES + (index % SLOTS) as usize * SUBMISSION_BYTES
    }

    fn completion_at(index: u32) -> usize {
        HEADER_BYTES
            + SLOTS as usize * SUBMISSION_BYTES
            + (index % SLOTS) as usize * COMPLETION_BYTES
    }

    fn copy_in(&self, at: usize, words: &[u64]) {
        for (i, w) in words.iter().enumerate() {
            self.u64_at(at + 8 * i).store(*w, Ordering::Relaxed);
        }
    }

    /// Copies words `from..to` of the slot at `at` into `out`.
    fn copy_words(&self, at: usize, out: &mut [u64], from: usize, to: usize) {
        for (i, w) in out.iter_mut().enumerate().take(to).skip(from) {
            *w = self.u64_at(at + 8 * i).load(Ordering::Relaxed);
        }
    }

    /// Copies submission slot `index mod SLOTS` out: its header, then the arguments the copied
    /// count names (at most [`MAX_ARGS`]; the other words stay zero). Every word is read once,
    /// so what is checked is the copy. Publish or consume with an acquire (the
    /// [`RingMemory::load`] of `sq_tail` before this).
    pub fn read_submission(&self, index: u32) -> RawSubmission {
        let at = Self::submission_at(index);
        let mut w = [0_u64; SUB_WORDS];
        self.copy_words(at, &mut w, 0, SUB_HEADER_WORDS);
        let n = usize::try_from(w[3] & 0xffff_ffff).map_or(MAX_ARGS, |n| n.min(MAX_ARGS));
        self.copy_words(
            at,
            &mut w,
            SUB_HEADER_WORDS,
            SUB_HEADER_WORDS + ARG_WORDS * n,
        );
        w
    }

    /// Writes submission slot `index mod SLOTS` (its header and arguments: the rest of the
    /// slot is not read); publish it with a store of `sq_tail` after.
    pub fn write_submission(&self, index: u32, s: &Submission) {
        let w = s.encode();
        self.copy_in(Self::submission_at(index), &w[..s.words()]);
    }

    /// Submits `s` as the client does: writes slot `tail mod SLOTS`, publishes it with a
    /// store of `sq_tail = tail + 1`, and rings the bell when the daemon sleeps. Returns the
    /// new tail. The caller has checked that the ring has room (`tail − sq_head < SLOTS`).
    pub fn submit(&self, tail: u32, s: &Submission) -> u32 {
        self.write_submission(tail, s);
        let next = tail.wrapping_add(1);
        self.store(Word::SqTail, next);
        if self.load(Word::SqSleeping) != 0 {
            self.ring(Word::SqBell);
        }
        next
    }

    /// Writes raw words into submission slot `index mod SLOTS`, whatever they say (tests of a
    /// hostile client use it).
    pub fn write_raw_submission(&self, index: u32, words: &[u64]) {
        let n = words.len().min(SUB_WORDS);
        self.copy_in(Self::submission_at(index), &words[..n]);
    }

    /// Copies completion slot `index mod SLOTS` out: its header, then the message's words
    /// (the length read is cut to [`MAX_MESSAGE`]; the other words stay zero).
    pub fn read_completion(&self, index: u32) -> RawCompletion {
        let at = Self::completion_at(index);
        let mut w = [0_u64; COMP_WORDS];
        self.copy_words(at, &mut w, 0, COMP_HEADER_WORDS);
        let m = usize::try_from(w[1] >> 32).map_or(MAX_MESSAGE, |m| m.min(MAX_MESSAGE));
        self.copy_words(
            at,
            &mut w,
            COMP_HEADER_WORDS,
            COMP_HEADER_WORDS + m.div_ceil(8),
        );
        w
    }

    /// Writes completion slot `index mod SLOTS` (its header and message: the rest of the slot
    /// is not read); publish it with a store of `cq_tail` after.
    pub fn write_completion(&self, index: u32, c: &Completion) {
        let w = c.encode();
        let m = usize::try_from(w[1] >> 32).unwrap_or(MAX_MESSAGE);
        self.copy_in(
            Self::completion_at(index),
            &w[..COMP_HEADER_WORDS + m.div_ceil(8)],
        );
    }
}

/// One buffer argument of a submission, as `TensorArg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingArg {
    /// Tensor id.
    pub tensor: u64,
    /// Byte offset into the tensor.
    pub offset: u64,
    /// Bytes from `offset`; 0 to the end.
    pub length: u64,
    /// The program only reads it.
    pub read_only: bool,
}

/// A dispatch as a submission slot carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The client's id, copied into the completion.
    pub request_id: u64,
    /// The program to run.
    pub program: u64,
    /// Milliseconds the work may wait before it starts; 0 for no limit.
    pub timeout_ms: u64,
    /// At most [`MAX_ARGS`].
    pub args: Vec<RingArg>,
    /// Queued as an item of a `Submit` stream rather than admitted as a `Dispatch` call:
    /// counted in the session's pending work but not refused past its limit, the daemon
    /// reading no further slot while the ring has a `Submit` stream's window of them
    /// unanswered (slot flag [`QUEUED`]; only for a daemon whose `AttachRingResponse`
    /// offers it in `slot_flags`).
    pub queued: bool,
}

/// Why a submission slot was refused: its request id (as read) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSubmission {
    /// The slot's request id, to answer it.
    pub request_id: u64,
    /// What the slot broke.
    pub why: String,
}

const READ_ONLY: u64 = 1;

/// Submission-slot flag: the slot is queued as a `Submit` stream's item (see
/// [`Submission::queued`]).
pub const QUEUED: u32 = 1;

impl Submission {
    /// The slot's words. More than [`MAX_ARGS`] arguments are not representable: callers send
    /// such a dispatch through gRPC; here the extra ones are dropped.
    pub fn encode(&self) -> RawSubmission {
        let mut w = [0_u64; SUB_WORDS];
        w[0] = self.request_id;
        w[1] = self.program;
        w[2] = self.timeout_ms;
        let n = self.args.len().min(MAX_ARGS);
        // Argument count (low 32 bits), flags (high 32 bits).
        w[3] = n as u64 | u64::from(if self.queued { QUEUED } else { 0 }) << 32;
        for (k, a) in self.args.iter().take(n).enumerate() {
            let at = 4 + 4 * k;
            w[at] = a.tensor;
            w[at + 1] = a.offset;
            w[at + 2] = a.length;
            w[at + 3] = if a.read_only { READ_ONLY } else { 0 };
        }
        w
    }

    /// Words of the slot [`Submission::encode`] fills: the header and the arguments.
    #[must_use]
    pub fn words(&self) -> usize {
        SUB_HEADER_WORDS + ARG_WORDS * self.args.len().min(MAX_ARGS)
    }

    /// Checks a slot copied out of the ring.
    ///
    /// # Errors
    ///
    /// [`BadSubmission`] for flags, argument flags or an argument count version 1 does not
    /// allow (of the slot's flags, only [`QUEUED`]).
    pub fn decode(w: &RawSubmission) -> Result<Submission, BadSubmission> {
        let request_id = w[0];
        let bad = |why: String| BadSubmission { request_id, why };
        let count = w[3] & 0xffff_ffff;
        let flags = w[3] >> 32;
        if flags & !u64::from(QUEUED) != 0 {
            return Err(bad(format!(
                "ring slot: flags {flags:#x}; version 1 defines bit 0 (queued) only"
            )));
        }
        if count > MAX_ARGS as u64 {
            return Err(bad(format!(
                "ring slot: {count} arguments; a ring slot holds at most {MAX_ARGS}"
            )));
        }
        let mut args = Vec::with_capacity(count as usize);
        for k in 0..count as usize {
            let at = 4 + 4 * k;
            let f = w[at + 3];
            if f & !READ_ONLY != 0 {
                return Err(bad(format!(
                    "ring slot: args[{k}] flags {f:#x}; version 1 defines bit 0 (read-only) only"
                )));
            }
            args.push(RingArg {
                tensor: w[at],
                offset: w[at + 1],
                length: w[at + 2],
                read_only: f & READ_ONLY != 0,
            });
        }
        Ok(Submission {
            request_id,
            program: w[1],
            timeout_ms: w[2],
            args,
            queued: flags & u64::from(QUEUED) != 0,
        })
    }
}

/// A completion slot: a dispatch's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// As submitted.
    pub request_id: u64,
    /// A `google.rpc.Code` value, 0 for OK.
    pub code: u32,
    /// The status message; cut at [`MAX_MESSAGE`] bytes, on a character boundary.
    pub message: String,
    /// As `DispatchResponse.queue_ns`.
    pub queue_ns: u64,
    /// As `DispatchResponse.device_ns`.
    pub device_ns: u64,
}

impl Completion {
    /// The slot's words.
    pub fn encode(&self) -> RawCompletion {
        let mut w = [0_u64; COMP_WORDS];
        let mut end = self.message.len().min(MAX_MESSAGE);
        while !self.message.is_char_boundary(end) {
            end -= 1;
        }
        let msg = &self.message.as_bytes()[..end];
        w[0] = self.request_id;
        w[1] = u64::from(self.code) | ((end as u64) << 32);
        w[2] = self.queue_ns;
        w[3] = self.device_ns;
        for (i, chunk) in msg.chunks(8).enumerate() {
            let mut b = [0_u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            w[4 + i] = u64::from_le_bytes(b);
        }
        w
    }

    /// Reads a slot copied out of the ring (a message longer than the slot is cut; bytes that
    /// are not UTF-8 are replaced).
    pub fn decode(w: &RawCompletion) -> Completion {
        let len = ((w[1] >> 32) as usize).min(MAX_MESSAGE);
        // Only the words the length covers: a success has no message, and copying the whole
        // slot's 992 bytes into a growing buffer cost a completion more than its own fields.
        let message = if len == 0 {
            String::new()
        } else {
            let mut bytes = Vec::with_capacity(len.next_multiple_of(8));
            for word in &w[COMP_HEADER_WORDS..COMP_HEADER_WORDS + len.div_ceil(8)] {
                bytes.extend_from_slice(&word.to_le_bytes());
            }
            bytes.truncate(len);
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Completion {
            request_id: w[0],
            code: (w[1] & 0xffff_ffff) as u32,
            message,
            queue_ns: w[2],
            device_ns: w[3],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_fits_its_memfd_and_words_do_not_share_cache_lines_across_sides() {
        assert_eq!(RING_BYTES, 102_400);
        assert_eq!(
            RingMemory::completion_at(SLOTS - 1) + COMPLETION_BYTES,
            RING_BYTES
        );
        assert_eq!(RingMemory::submission_at(SLOTS), HEADER_BYTES);
        assert_ne!(Word::SqTail.offset() / 64, Word::SqHead.offset() / 64);
        const { assert!(4 + 4 * MAX_ARGS <= SUB_WORDS) };
    }

    #[test]
    fn submissions_and_completions_round_trip() {
        let s = Submission {
            request_id: 7,
            program: 9,
            timeout_ms: 100,
            args: vec![
                RingArg {
                    tensor: 1,
                    offset: 8,
                    length: 16,
                    read_only: true,
                },
                RingArg {
                    tensor: 2,
                    offset: 0,
                    length: 0,
                    read_only: false,
                },
            ],
            queued: true,
        };
        assert_eq!(Submission::decode(&s.encode()).unwrap(), s);
        assert_eq!(s.encode()[3], 2 | u64::from(QUEUED) << 32);
        let c = Completion {
            request_id: 7,
            code: 3,
            message: "args[0]: é".repeat(200),
            queue_ns: 5,
            device_ns: 6,
        };
        let back = Completion::decode(&c.encode());
        assert!(back.message.len() <= MAX_MESSAGE);
        assert!(c.message.starts_with(&back.message));
        assert_eq!((back.code, back.queue_ns, back.device_ns), (3, 5, 6));
    }

    #[test]
    fn a_completion_message_of_any_length_comes_back_whole() {
        for len in (0..=24).chain([MAX_MESSAGE - 1, MAX_MESSAGE]) {
            let c = Completion {
                request_id: len as u64,
                code: 9,
                message: "m".repeat(len),
                queue_ns: 1,
                device_ns: 2,
            };
            assert_eq!(Completion::decode(&c.encode()), c, "length {len}");
        }
    }

    #[test]
    fn hostile_slots_are_refused_with_their_request_id() {
        let mut w = [0_u64; SUB_WORDS];
        w[0] = 42;
        w[3] = 16;
        assert_eq!(Submission::decode(&w).unwrap_err().request_id, 42);
        w[3] = 2 << 32;
        assert!(Submission::decode(&w).unwrap_err().why.contains("flags"));
        w[3] = 1;
        w[7] = 2;
        assert!(Submission::decode(&w).unwrap_err().why.contains("args[0]"));
        let mut c = [u64::MAX; COMP_WORDS];
        c[1] = u64::MAX;
        assert!(Completion::decode(&c).message.len() <= 3 * MAX_MESSAGE);
    }

    #[test]
    fn only_the_words_a_slot_names_are_written_and_copied() {
        let (_fd, m) = RingMemory::create().unwrap();
        // A slot left full of an earlier writer's bytes.
        m.write_raw_submission(3, &[0xAAAA_AAAA_AAAA_AAAA; SUB_WORDS]);
        let s = Submission {
            request_id: 1,
            program: 2,
            timeout_ms: 0,
            args: vec![RingArg {
                tensor: 4,
                offset: 0,
                length: 0,
                read_only: true,
            }],
            queued: false,
        };
        assert_eq!(s.words(), 8);
        m.write_submission(3, &s);
        let copy = m.read_submission(3);
        assert_eq!(Submission::decode(&copy).unwrap(), s);
        assert!(
            copy[8..].iter().all(|w| *w == 0),
            "the words after the arguments are not read"
        );
        // A count past the limit copies the limit's worth, and is refused on the copy.
        let mut w = [7_u64; SUB_WORDS];
        w[3] = u64::from(u32::MAX);
        m.write_raw_submission(4, &w);
        let copy = m.read_submission(4);
        assert!(
            Submission::decode(&copy)
                .unwrap_err()
                .why
                .contains("arguments")
        );
        // A short message after a long one in the same slot reads as itself.
        let long = Completion {
            request_id: 1,
            code: 3,
            message: "x".repeat(MAX_MESSAGE),
            queue_ns: 0,
            device_ns: 0,
        };
        m.write_completion(9, &long);
        let short = Completion {
            request_id: 2,
            code: 5,
            message: "gone".into(),
            queue_ns: 0,
            device_ns: 0,
        };
        m.write_completion(9, &short);
        let copy = m.read_completion(9);
        assert_eq!(Completion::decode(&copy), short);
        assert!(copy[5..].iter().all(|w| *w == 0));
        assert_eq!(Completion::decode(&m.read_completion(9 + SLOTS)), short);
    }

    #[test]
    fn two_mappings_of_one_ring_see_each_others_words_and_slots() {
        let (fd, a) = RingMemory::create().unwrap();
        let b = RingMemory::map(fd.as_fd()).unwrap();
        a.store(Word::SqTail, 3);
        assert_eq!(b.load(Word::SqTail), 3);
        let s = Submission {
            request_id: 1,
            program: 2,
            timeout_ms: 0,
            args: vec![],
            queued: false,
        };
        a.write_submission(SLOTS + 5, &s);
        assert_eq!(Submission::decode(&b.read_submission(5)).unwrap(), s);
        // A wait on a bell that already moved returns at once; one that did not times out.
        b.ring(Word::CqBell);
        a.wait(Word::CqBell, 0, Duration::from_secs(5));
        a.wait(Word::CqBell, 1, Duration::from_millis(20));
        assert_eq!(a.load(Word::CqBell), 1);
    }

    #[test]
    fn a_sleeper_is_woken_by_the_other_mapping() {
        let (fd, a) = RingMemory::create().unwrap();
        let b = RingMemory::map(fd.as_fd()).unwrap();
        let t = std::thread::spawn(move || {
            let seen = a.load(Word::SqBell);
            a.wait(Word::SqBell, seen, Duration::from_secs(30));
            a.load(Word::SqBell)
        });
        std::thread::sleep(Duration::from_millis(50));
        b.ring(Word::SqBell);
        assert_eq!(t.join().unwrap(), 1);
    }
}

//! A test's own side of a session's dispatch ring (`proto/npud/v1/ring.md`), written from the
//! spec with `npu_fd::ring`'s memory accessors only: one dispatch at a time, spinning then
//! sleeping on the completion bell. [`crate::Session`] uses it for `dispatch` when
//! [`rings_on`] says so, so that every probe written against `Session` runs on the fast path
//! too.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use npu_fd::ring::{self, Completion, RingMemory, Word};
use npu_fd::wire::{Ticket, client};
use npu_proto::v1 as pb;
use tonic::{Code, Status};

/// Set by [`dispatch_through_rings`] or the environment variable `NPUD_E2E_RING=1` (which child
/// test clients inherit).
static RINGS: AtomicBool = AtomicBool::new(false);

/// Makes every [`crate::Session`] opened from now on in this process dispatch through a ring.
pub fn dispatch_through_rings() {
    RINGS.store(true, Ordering::SeqCst);
}

/// Whether sessions dispatch through rings.
pub fn rings_on() -> bool {
    RINGS.load(Ordering::SeqCst) || std::env::var("NPUD_E2E_RING").is_ok_and(|v| v == "1")
}

/// A ring attached to a session.
#[derive(Debug)]
pub struct TestRing {
    pub mem: Arc<RingMemory>,
    /// The lifeline; dropping the ring closes it.
    pub lifeline: UnixStream,
    state: Mutex<(u32, u32)>, // (sq_tail, cq_head)
    next_id: Mutex<u64>,
}

impl TestRing {
    /// Creates a ring and attaches it with `AttachRing`'s answer.
    ///
    /// # Errors
    /// What went wrong, as text.
    pub fn attach(r: &pb::AttachRingResponse) -> Result<TestRing, String> {
        let ticket = Ticket::from_slice(&r.fd_ticket).map_err(|e| e.to_string())?;
        let (fd, mem) = RingMemory::create().map_err(|e| e.to_string())?;
        let sock = UnixStream::connect(&r.fd_socket).map_err(|e| e.to_string())?;
        let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
        client::attach_ring(&sock, &ticket, fd.as_fd()).map_err(|e| e.to_string())?;
        Ok(TestRing {
            mem: Arc::new(mem),
            lifeline: sock,
            state: Mutex::new((0, 0)),
            next_id: Mutex::new(1),
        })
    }

    /// Runs one dispatch through the ring and waits for its completion (at most `limit`).
    ///
    /// # Errors
    /// The completion's code and message as a status; UNAVAILABLE when the ring closed or the
    /// wait ran out.
    pub fn dispatch(
        &self,
        d: &pb::DispatchRequest,
        limit: Duration,
    ) -> Result<pb::DispatchResponse, Status> {
        self.try_dispatch(d, limit).unwrap_or_else(|| {
            Err(Status::unavailable(format!(
                "the dispatch ring closed (state {}) before the daemon took the submission",
                self.mem.load(Word::State)
            )))
        })
    }

    /// As [`TestRing::dispatch`], but `None` when the ring closed before the daemon took the
    /// submission (at or past `sq_head`): the spec lets the client send it through gRPC.
    pub fn try_dispatch(
        &self,
        d: &pb::DispatchRequest,
        limit: Duration,
    ) -> Option<Result<pb::DispatchResponse, Status>> {
        let mut g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let id = {
            let mut n = self.next_id.lock().unwrap_or_else(PoisonError::into_inner);
            *n += 1;
            *n
        };
        let s = npu_client::fastpath::submission(id, d, None);
        let m = &self.mem;
        let (tail, head) = *g;
        if m.load(Word::State) != 0 {
            return None;
        }
        g.0 = m.submit(tail, &s);
        let until = Instant::now() + limit;
        let spin_until = Instant::now() + Duration::from_micros(50);
        loop {
            if m.load(Word::CqTail) != head {
                let c = Completion::decode(&m.read_completion(head));
                g.1 = head.wrapping_add(1);
                m.store(Word::CqHead, g.1);
                assert_eq!(c.request_id, id, "completions come in submission order");
                return Some(completion_result(c));
            }
            if m.load(Word::State) != 0 {
                if m.load(Word::CqTail) != head {
                    // Answered just before the close: read it on the next turn.
                    continue;
                }
                let taken = m.load(Word::SqHead).wrapping_sub(tail.wrapping_add(1)) < ring::SLOTS;
                if !taken {
                    return None;
                }
                return Some(Err(Status::unavailable(format!(
                    "the dispatch ring closed (state {}, broken {})",
                    m.load(Word::State),
                    m.load(Word::Broken)
                ))));
            }
            let now = Instant::now();
            if now > until {
                return Some(Err(Status::unavailable(
                    "no completion within the test's limit",
                )));
            }
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            m.store(Word::CqSleeping, 1);
            let seen = m.load(Word::CqBell);
            if m.load(Word::CqTail) == head && m.load(Word::State) == 0 {
                m.wait(Word::CqBell, seen, Duration::from_millis(20));
            }
            m.store(Word::CqSleeping, 0);
        }
    }
}

/// A completion as the status `Dispatch` would have given.
///
/// # Errors
/// A non-zero code.
pub fn completion_result(c: Completion) -> Result<pb::DispatchResponse, Status> {
    if c.code == 0 {
        return Ok(pb::DispatchResponse {
            queue_ns: c.queue_ns,
            device_ns: c.device_ns,
        });
    }
    Err(Status::new(
        Code::from_i32(i32::try_from(c.code).unwrap_or(2)),
        c.message,
    ))
}

/// Slots per ring, for tests that fill one.
pub const SLOTS: u32 = ring::SLOTS;

//! Rows 15: the fast path (`proto/npud/v1/ring.md`) beside what it is compared to, measured in
//! turn over rounds: in-process dispatch (row 2's), a shared-memory ping-pong between this
//! process and a child that both spin (the physical floor of a cross-process submission), and
//! fast-path dispatches, unary and pipelined; then the daemon's CPU with 64 idle rings.
//!
//! The ring client here is the protocol as `npu-client` speaks it (spin, then sleep on the
//! completion bell), driven synchronously on the client thread.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use npu_fd::ring::{self, Completion, RingMemory, Word};
use npu_fd::wire::{Ticket, client as fdclient};
use npu_proto::v1 as pb;

use crate::client::{Iters, Pipelined, Session};
use crate::stats::{Summary, nanos, summarize};
use crate::{BenchError, Result};

// Tuned latencies: `npu_fd::latency` says why each has its value and what measured it.
const SPIN: Duration = npu_fd::latency::CLIENT_SPIN;

/// A session's ring, client side.
#[derive(Debug)]
pub struct BenchRing {
    mem: RingMemory,
    _lifeline: StdUnixStream,
    tail: u32,
    head: u32,
    next: u64,
}

impl BenchRing {
    /// Attaches a ring to `s`.
    ///
    /// # Errors
    /// The daemon's refusal.
    pub async fn attach(s: &mut Session) -> Result<BenchRing> {
        let r = s
            .client
            .attach_ring(s.req(pb::AttachRingRequest {}))
            .await?
            .into_inner();
        let err = BenchError::ctx("attaching a ring");
        let ticket = Ticket::from_slice(&r.fd_ticket).map_err(|e| err(&e))?;
        let (fd, mem) = RingMemory::create().map_err(|e| err(&e))?;
        let sock = StdUnixStream::connect(&r.fd_socket).map_err(|e| err(&e))?;
        fdclient::attach_ring(&sock, &ticket, fd.as_fd()).map_err(|e| err(&e))?;
        Ok(BenchRing {
            mem,
            _lifeline: sock,
            tail: 0,
            head: 0,
            next: 1,
        })
    }

    fn submit(&mut self, d: &pb::DispatchRequest) {
        let s = npu_client::fastpath::submission(self.next, d, None);
        self.next += 1;
        self.tail = self.mem.submit(self.tail, &s);
    }

    /// Waits for the next completion: one the daemon refused or that failed is an error.
    fn complete(&mut self) -> Result<Completion> {
        let c = self.next_completion()?;
        if c.code != 0 {
            return Err(BenchError(format!("fast-path dispatch: {}", c.message)));
        }
        Ok(c)
    }

    /// One dispatch, and its completion whatever its code: a caller that expects some
    /// dispatches to fail reads why.
    ///
    /// # Errors
    /// The ring closed.
    pub fn dispatch_once(&mut self, d: &pb::DispatchRequest) -> Result<Completion> {
        self.submit(d);
        self.next_completion()
    }

    /// Waits for the next completion: spins, then sleeps on the bell.
    fn next_completion(&mut self) -> Result<Completion> {
        let m = &self.mem;
        let start = Instant::now();
        let mut looks = 0u32;
        loop {
            if m.load(Word::CqTail) != self.head {
                let c = Completion::decode(&m.read_completion(self.head));
                self.head = self.head.wrapping_add(1);
                m.store(Word::CqHead, self.head);
                return Ok(c);
            }
            if m.load(Word::State) != 0 {
                return Err(BenchError("the dispatch ring closed".into()));
            }
            // The clock is read every 64 looks: a spinning look is a load and a pause.
            looks = looks.wrapping_add(1);
            if !looks.is_multiple_of(64) || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            m.store(Word::CqSleeping, 1);
            let seen = m.load(Word::CqBell);
            if m.load(Word::CqTail) == self.head {
                m.wait(Word::CqBell, seen, Duration::from_millis(100));
            }
            m.store(Word::CqSleeping, 0);
        }
    }

    /// One dispatch at a time: (samples ns, wall) of the measured ones.
    ///
    /// # Errors
    /// A refused dispatch.
    pub fn unary(&mut self, d: &pb::DispatchRequest, it: Iters) -> Result<(Vec<u64>, Duration)> {
        for _ in 0..it.warmup {
            self.submit(d);
            self.complete()?;
        }
        let mut ns = Vec::with_capacity(it.measured);
        let start = Instant::now();
        for _ in 0..it.measured {
            let t = Instant::now();
            self.submit(d);
            self.complete()?;
            ns.push(nanos(t.elapsed()));
        }
        Ok((ns, start.elapsed()))
    }

    /// Up to `depth` in flight, a new one as each completes: per dispatch over windows of
    /// `depth` completions, and submit-to-completion latency (as row 9).
    ///
    /// # Errors
    /// A refused dispatch.
    pub fn pipelined(
        &mut self,
        d: &pb::DispatchRequest,
        depth: usize,
        it: Iters,
    ) -> Result<(Vec<u64>, Vec<u64>, Duration)> {
        let total = it.warmup + it.measured;
        let mut sent_at = std::collections::VecDeque::new();
        let (mut sent, mut done) = (0, 0);
        let mut lat = Vec::with_capacity(it.measured);
        let mut per = Vec::new();
        let mut window_start = Instant::now();
        let mut start = Instant::now();
        while done < total {
            while sent < total && sent - done < depth {
                sent_at.push_back(Instant::now());
                self.submit(d);
                sent += 1;
            }
            self.complete()?;
            let t0 = sent_at.pop_front().unwrap_or_else(Instant::now);
            done += 1;
            if done == it.warmup {
                start = Instant::now();
                window_start = start;
            }
            if done > it.warmup {
                lat.push(nanos(t0.elapsed()));
                if (done - it.warmup).is_multiple_of(depth) {
                    per.push(nanos(window_start.elapsed()) / depth as u64);
                    window_start = Instant::now();
                }
            }
        }
        Ok((per, lat, start.elapsed()))
    }
}

/// Row 15's pipelined figures, summarised as row 9's.
#[must_use]
pub fn pipelined_summary(per: Vec<u64>, lat: Vec<u64>, wall: Duration) -> Pipelined {
    let n = lat.len() as u64;
    Pipelined {
        per_op: summarize(per, n, wall),
        latency: summarize(lat, n, wall),
    }
}

/// The ping-pong's child process and the shared file.
#[derive(Debug)]
pub struct PingPong {
    mem: RingMemory,
    child: Child,
    _file: File,
    path: PathBuf,
    count: u32,
}

impl PingPong {
    /// Starts the child (`npuctl-bench --serve-pingpong FILE`) on a file in `dir`.
    ///
    /// # Errors
    /// The file or the child could not be made.
    pub fn start(dir: &Path) -> Result<PingPong> {
        let err = BenchError::ctx("the ping-pong");
        let path = dir.join("pingpong");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| err(&e))?;
        file.set_len(ring::RING_BYTES as u64).map_err(|e| err(&e))?;
        let mem = RingMemory::map(file.as_fd()).map_err(|e| err(&e))?;
        let exe = std::env::current_exe().map_err(|e| err(&e))?;
        let child = Command::new(exe)
            .arg("--serve-pingpong")
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| err(&e))?;
        Ok(PingPong {
            mem,
            child,
            _file: file,
            path,
            count: 0,
        })
    }

    /// The child's process id.
    pub fn child_pid(&self) -> u32 {
        self.child.id()
    }

    /// One round trip: this side publishes a count, the child echoes it, both spinning (the
    /// child sleeps on its bell after [`SPIN`] without work, so that it leaves the CPU to the
    /// rows measured after it).
    fn once(&mut self) {
        let m = &self.mem;
        self.count = self.count.wrapping_add(1);
        m.store(Word::SqTail, self.count);
        if m.load(Word::SqSleeping) != 0 {
            m.ring(Word::SqBell);
        }
        while m.load(Word::CqTail) != self.count {
            std::hint::spin_loop();
        }
    }

    /// Measured round trips.
    pub fn measure(&mut self, it: Iters) -> (Vec<u64>, Duration) {
        for _ in 0..it.warmup {
            self.once();
        }
        let mut ns = Vec::with_capacity(it.measured);
        let start = Instant::now();
        for _ in 0..it.measured {
            let t = Instant::now();
            self.once();
            ns.push(nanos(t.elapsed()));
        }
        (ns, start.elapsed())
    }

    /// Stops the child.
    pub fn stop(mut self) {
        self.mem.store(Word::State, 1);
        self.mem.ring(Word::SqBell);
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The ping-pong's child: echoes `sq_tail` into `cq_tail`, spinning; sleeps on `sq_bell`
/// after [`SPIN`] without work (a round's pings follow each other at once); ends when `state`
/// is set.
///
/// # Errors
/// The file cannot be mapped.
pub fn serve_pingpong(path: &Path) -> Result<()> {
    let err = BenchError::ctx("serving the ping-pong");
    let file = File::options()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| err(&e))?;
    let m = RingMemory::map(file.as_fd()).map_err(|e| err(&e))?;
    // The file starts zeroed: a count the parent published before this child mapped the
    // file is still new to it (reading the current count here would swallow it, and the
    // parent would spin for ever).
    let mut seen = 0;
    let mut last = Instant::now();
    while m.load(Word::State) == 0 {
        let now = m.load(Word::SqTail);
        if now != seen {
            seen = now;
            m.store(Word::CqTail, now);
            last = Instant::now();
            continue;
        }
        if last.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        m.store(Word::SqSleeping, 1);
        let bell = m.load(Word::SqBell);
        if m.load(Word::SqTail) == seen && m.load(Word::State) == 0 {
            m.wait(Word::SqBell, bell, Duration::from_secs(1));
        }
        m.store(Word::SqSleeping, 0);
        last = Instant::now();
    }
    Ok(())
}

/// A summary of samples, one operation each.
#[must_use]
pub fn summary(ns: Vec<u64>, wall: Duration) -> Summary {
    let n = ns.len() as u64;
    summarize(ns, n, wall)
}

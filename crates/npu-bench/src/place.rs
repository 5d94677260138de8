//! Where rows 15 run: npud's executor thread and the in-process row on one CPU, the ring's
//! client on another.
//!
//! The fast-path goals compare rows measured in turn, round by round, so that the machine's
//! load falls on them alike. That cancels a slower minute, not a slower CPU: on the 2-vCPU VM
//! one virtual CPU runs up to 1.5× slower than the other for stretches of 0.1–1 s, either one
//! (a fixed loop timed on each in turn, best of 50, read 0.75–1.54× between them). Unpinned,
//! the in-process row runs wherever the bench's thread is and the daemon's work wherever the
//! executor is, so a round could time the floor on the fast CPU and npud on the slow one. Here
//! the executor and the in-process row share a CPU, and so do the ping-pong's child and the
//! executor: each round times the device work of both rows on the same CPU at the same minute.

use std::time::{Duration, Instant};

use rustix::process::Pid;
use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// The executor's thread name (`npud::executor`).
const EXECUTOR: &str = "npud-executor";

/// How long [`Placement::on_daemon_cpu`] waits for the executor to stop polling: npud's
/// longest `executor.spin_us` is 10 ms.
const SETTLE: Duration = Duration::from_millis(50);

/// Rows 15's CPUs, pinned while it lives; dropping it restores both threads' CPU sets.
#[derive(Debug)]
pub struct Placement {
    pid: u32,
    daemon_cpu: usize,
    client_cpu: usize,
    executor: Pid,
    executor_was: CpuSet,
    bench_was: CpuSet,
}

fn only(cpu: usize) -> CpuSet {
    let mut s = CpuSet::new();
    s.set(cpu);
    s
}

/// The `state` letter of `/proc/<pid>/task/<tid>/stat` (`R` running, `S` sleeping...).
fn state(pid: u32, tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    crate::daemon::after_comm(&stat)?.chars().next()
}

impl Placement {
    /// Pins npud's executor (of process `pid`) to the first CPU this process may use; the
    /// bench's thread then moves between it and the second.
    ///
    /// # Errors
    /// Why nothing was pinned: fewer than two CPUs, no process id, no executor thread, or the
    /// kernel refused.
    pub fn pin(pid: Option<u32>) -> Result<Placement, String> {
        let pid = pid.ok_or("no process id for the daemon (--pid)")?;
        let bench_was = sched_getaffinity(None).map_err(|e| format!("sched_getaffinity: {e}"))?;
        let mut cpus = (0..CpuSet::MAX_CPU).filter(|&c| bench_was.is_set(c));
        let (Some(daemon_cpu), Some(client_cpu)) = (cpus.next(), cpus.next()) else {
            return Err("fewer than two CPUs".into());
        };
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| format!("/proc/{pid}/task: {e}"))?;
        let tid = tasks
            .flatten()
            .filter_map(|t| t.file_name().to_str()?.parse::<i32>().ok())
            .find(|tid| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                    .is_ok_and(|c| c.trim_end() == EXECUTOR)
            })
            .ok_or_else(|| format!("process {pid} has no thread named {EXECUTOR}"))?;
        let executor = Pid::from_raw(tid).ok_or("thread id 0")?;
        let executor_was =
            sched_getaffinity(Some(executor)).map_err(|e| format!("sched_getaffinity: {e}"))?;
        sched_setaffinity(Some(executor), &only(daemon_cpu))
            .map_err(|e| format!("pinning thread {tid} of process {pid}: {e}"))?;
        Ok(Placement {
            pid,
            daemon_cpu,
            client_cpu,
            executor,
            executor_was,
            bench_was,
        })
    }

    /// Moves the calling thread to the executor's CPU once the executor sleeps, so that its
    /// polling does not share the CPU with what is measured there; `false` when it still ran
    /// after [`SETTLE`] (the thread moves all the same, and the caller says so).
    pub fn on_daemon_cpu(&self) -> bool {
        let until = Instant::now() + SETTLE;
        let running = || state(self.pid, self.executor.as_raw_nonzero().get()) == Some('R');
        while running() && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(200));
        }
        let settled = !running();
        let _ = sched_setaffinity(None, &only(self.daemon_cpu));
        settled
    }

    /// Moves the calling thread to the client's CPU.
    pub fn on_client_cpu(&self) {
        let _ = sched_setaffinity(None, &only(self.client_cpu));
    }

    /// Pins another process (the ping-pong's child) to the executor's CPU.
    pub fn with_daemon(&self, pid: u32) {
        if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
            let _ = sched_setaffinity(Some(p), &only(self.daemon_cpu));
        }
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        let _ = sched_setaffinity(Some(self.executor), &self.executor_was);
        let _ = sched_setaffinity(None, &self.bench_was);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_thread_reads_as_running_and_a_missing_one_as_none() {
        let pid = std::process::id();
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        assert_eq!(state(pid, tid), Some('R'));
        assert_eq!(state(pid, i32::MAX), None);
    }

    #[test]
    fn nothing_is_pinned_without_a_daemon_or_its_executor() {
        assert!(Placement::pin(None).unwrap_err().contains("--pid"));
        // This test process has no executor thread (or only one CPU): refused either way,
        // and the calling thread keeps its CPUs.
        let before = sched_getaffinity(None).unwrap();
        assert!(Placement::pin(Some(std::process::id())).is_err());
        assert_eq!(sched_getaffinity(None).unwrap(), before);
    }
}

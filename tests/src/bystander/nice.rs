//! The attacker pays for its own CPU. An attack's client runs in this test process, a debug
//! build, and its own work (encoding 1,024-link chains, decoding listings of thousands of
//! programs) can take both cores of a 2-core machine: the bystander and the daemon then wait
//! for a CPU, and the bystander's p99 measures the test's client instead of the daemon (in the
//! program-store attack the test process used 1.3–1.5 cores beside the daemon's 0.4). A real
//! attacker is another process that the host's scheduler (its cgroup's `cpu.weight`) keeps from
//! the other tenants' CPU, which no daemon can do. So while an attack runs, every thread of this
//! process but the one reading the bystander's reports (the bystander is a process of its own)
//! runs at `SCHED_IDLE` (and nice 19): it still gets every CPU cycle nobody else wants, so the
//! attack presses on the daemon as hard as it can, but not at the bystander's or the daemon's
//! expense. The daemon keeps the priority it started with.
//!
//! Nice 19 alone is not enough on the EEVDF scheduler (Linux 6.6 and later): a running thread
//! keeps its CPU until its slice is used up whatever its nice value, and a nice-0 thread that
//! wakes meanwhile waits. Seen with `perf sched timehist` on a 2-core 6.18 kernel during the
//! chain and code-object attacks: the attack's nice-19 threads ran 2-5 ms at a time while the
//! bystander's thread, the daemon's I/O thread and its executor waited for the CPU, so the
//! bystander's p99 measured the test's own client. A `SCHED_IDLE` thread is preempted as soon
//! as a normal one wakes on its CPU (one that is already runnable and has run past its share
//! may still wait for it until the next tick: so the attacks also keep their own CPU small,
//! encoding a long request once rather than per call). `chrt` (util-linux, on every Debian system) sets the policy of each
//! thread by its id, which no safe Rust interface here does.

use rustix::process::{Pid, setpriority_process};

/// The nice value of the attack's threads.
pub const ATTACKER_NICE: i32 = 19;

/// `SCHED_IDLE`, as `/proc/<tid>/stat` shows a thread's policy.
pub const SCHED_IDLE: u32 = 5;

/// Every thread of this process but one at `SCHED_IDLE` and [`ATTACKER_NICE`] (threads started
/// meanwhile inherit both from the thread that starts them), until dropped: then every thread
/// but that one back at `SCHED_OTHER` and nice 0.
#[derive(Debug)]
pub struct Lowered {
    keep: Pid,
}

impl Lowered {
    /// Lowers every thread but `keep`.
    pub fn all_but(keep: Pid) -> Lowered {
        set_all_but(keep, ATTACKER_NICE);
        Lowered { keep }
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        set_all_but(self.keep, 0);
    }
}

/// Sets the nice value of every thread of this process but `keep`, and its policy:
/// `SCHED_IDLE` for a positive `nice`, else `SCHED_OTHER`. A thread that ended meanwhile is
/// skipped; root may raise a priority again (`CAP_SYS_NICE`), and a thread that took another
/// uid (the lockout attacks' callers) is still this process's to renice.
fn set_all_but(keep: Pid, nice: i32) {
    let policy = if nice > 0 { "--idle" } else { "--other" };
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for task in tasks.flatten() {
        let tid = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
            .and_then(Pid::from_raw);
        if let Some(tid) = tid
            && tid != keep
        {
            let _ = setpriority_process(Some(tid), nice);
            let _ = std::process::Command::new("chrt")
                .args([policy, "--pid", "0", &tid.as_raw_nonzero().to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of(tid: Pid) -> i32 {
        rustix::process::getpriority_process(Some(tid)).expect("a thread's priority")
    }

    /// The scheduling policy of thread `tid` (field 41 of its stat; the command name, field
    /// 2, may hold spaces but ends at the last parenthesis).
    fn policy_of(tid: Pid) -> u32 {
        let stat =
            std::fs::read_to_string(format!("/proc/self/task/{}/stat", tid.as_raw_nonzero()))
                .expect("a thread's stat");
        let after = &stat[stat.rfind(')').expect("the command name") + 2..];
        after
            .split(' ')
            .nth(41 - 3)
            .and_then(|f| f.parse().ok())
            .expect("the policy field")
    }

    #[test]
    fn every_thread_but_the_kept_one_is_lowered_and_then_restored() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            tid_tx.send(rustix::thread::gettid()).unwrap();
            let _ = stop_rx.recv();
        });
        let other_tid = tid_rx.recv().unwrap();
        let me = rustix::thread::gettid();
        {
            let _lowered = Lowered::all_but(me);
            assert_eq!(nice_of(other_tid), ATTACKER_NICE);
            assert_eq!(policy_of(other_tid), SCHED_IDLE);
            assert_eq!(nice_of(me), 0, "the kept thread keeps its priority");
            assert_eq!(policy_of(me), 0, "and its policy");
        }
        assert_eq!(nice_of(other_tid), 0);
        assert_eq!(policy_of(other_tid), 0);
        stop_tx.send(()).unwrap();
        other.join().unwrap();
    }
}

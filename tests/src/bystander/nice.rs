//! The attacker pays for its own CPU. An attack's client runs in this test process, a debug
//! build, and its own work (encoding 1,024-link chains, decoding listings of thousands of
//! programs) can take both cores of a 2-core machine: the bystander's thread and the daemon then
//! wait for a CPU, and the bystander's p99 measures the test's client instead of the daemon (in
//! the program-store attack the test process used 1.3–1.5 cores beside the daemon's 0.4). A real
//! attacker is another process that the host's scheduler (its cgroup's `cpu.weight`) keeps from
//! the other tenants' CPU, which no daemon can do. So while an attack runs, every thread of this
//! process but the bystander's runs at nice 19: it still gets every CPU cycle nobody else wants,
//! so the attack presses on the daemon as hard as it can, but not at the bystander's or the
//! daemon's expense. The daemon keeps the priority it started with.

use rustix::process::{Pid, setpriority_process};

/// The nice value of the attack's threads.
pub const ATTACKER_NICE: i32 = 19;

/// Every thread of this process but one at [`ATTACKER_NICE`] (threads started meanwhile
/// inherit it from the thread that starts them), until dropped: then every thread but that
/// one back at nice 0.
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

/// Sets the nice value of every thread of this process but `keep`. A thread that ended
/// meanwhile is skipped; root may raise a priority again (`CAP_SYS_NICE`), and a thread that
/// took another uid (the lockout attacks' callers) is still this process's to renice.
fn set_all_but(keep: Pid, nice: i32) {
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of(tid: Pid) -> i32 {
        rustix::process::getpriority_process(Some(tid)).expect("a thread's priority")
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
            assert_eq!(nice_of(me), 0, "the kept thread keeps its priority");
        }
        assert_eq!(nice_of(other_tid), 0);
        stop_tx.send(()).unwrap();
        other.join().unwrap();
    }
}

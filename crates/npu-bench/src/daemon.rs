//! The daemon under test: npud on the emulator, started here on private sockets (npu-client's
//! [`LocalDaemon`]), or one given by address.
//!
//! The `npud` binary is found as `npuctl demo` finds it ([`npu_client::binaries`]): beside this
//! executable (cargo builds both into `target/<profile>/`), else at `$NPUD_BIN`, else on `PATH`,
//! else built with cargo when a workspace is above the current directory.

use std::path::PathBuf;
use std::time::Duration;

use npu_client::binaries::{NPUD, find_binary};
use npu_client::local::{LocalDaemon, LocalOptions};

use crate::{BenchError, Result};

/// Sessions and tensors the daemon must allow: row 8 holds 64 sessions of 16 tensors while the
/// other rows' sessions are open too.
const MAX_SESSIONS: u32 = 512;

/// A running npud, stopped with SIGTERM on drop.
#[derive(Debug)]
pub struct Daemon {
    inner: LocalDaemon,
    pub binary: PathBuf,
    pub socket: PathBuf,
    pub tcp: String,
}

impl Daemon {
    /// Starts `npud --backend emulator` on sockets in a private directory under /tmp, with TCP
    /// on a free loopback port, logging warnings only, and waits until it serves.
    ///
    /// # Errors
    /// When npud cannot be found or built, or does not become ready within 30 s (with its log).
    pub fn start() -> Result<Daemon> {
        Daemon::start_with(None, &[])
    }

    /// [`Daemon::start`] with the emulator behaving as the ROCR release `profile`
    /// (`--emulator-profile`; the packet ABI is found as on an NPU, `auto`) and more
    /// command-line arguments (`--executor-spin-us 0`).
    ///
    /// # Errors
    /// As [`Daemon::start`].
    pub fn start_with(profile: Option<&str>, args: &[&str]) -> Result<Daemon> {
        Daemon::start_env(profile, args, &[])
    }

    /// [`Daemon::start_with`] with more environment (`NPUD_EMULATOR__TIMING=model`).
    ///
    /// # Errors
    /// As [`Daemon::start`].
    pub fn start_env(profile: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Result<Daemon> {
        let binary = find_binary(&NPUD, None).map_err(|e| BenchError(e.to_string()))?;
        let mut opts = LocalOptions::new(&binary);
        opts.args = vec!["--log-level".into(), "warn".into()];
        if let Some(p) = profile {
            opts.args.extend(["--emulator-profile".into(), p.into()]);
        }
        opts.args.extend(args.iter().map(|a| (*a).into()));
        opts.env = vec![
            (
                "NPUD_LIMITS__MAX_SESSIONS".into(),
                MAX_SESSIONS.to_string().into(),
            ),
            // Every bench client runs as this uid: the per-uid cap must not be the one measured.
            (
                "NPUD_LIMITS__MAX_SESSIONS_PER_UID".into(),
                MAX_SESSIONS.to_string().into(),
            ),
            ("NPUD_LIMITS__MAX_PENDING_PER_SESSION".into(), "1024".into()),
        ];
        opts.env
            .extend(env.iter().map(|(k, v)| ((*k).into(), (*v).into())));
        let inner = LocalDaemon::start(opts).map_err(|e| BenchError(e.to_string()))?;
        let tcp = inner
            .tcp()
            .ok_or_else(|| BenchError("the daemon started without a TCP port".into()))?
            .to_string();
        Ok(Daemon {
            socket: inner.socket().to_path_buf(),
            tcp,
            binary,
            inner,
        })
    }

    /// The daemon's process id.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.inner.pid()
    }

    /// What npud logged so far.
    #[must_use]
    pub fn log(&self) -> String {
        self.inner.log()
    }

    /// SIGTERM, then waits (SIGKILL after 20 s). Returns how it ended.
    pub fn stop(&mut self) -> Option<String> {
        let s = self.inner.stop(Duration::from_secs(20)).ok()?;
        Some(if s.killed {
            format!("killed after 20 s ({})", s.status)
        } else {
            s.status.to_string()
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// CPU time all of a process's threads have used so far, in ns: [`cpu_ns_by_thread`] summed.
/// A thread that ended takes its time with it. `None` when the process is gone or the kernel
/// keeps no schedstat.
#[must_use]
pub fn cpu_ns(pid: u32) -> Option<u64> {
    cpu_ns_by_thread(pid).map(|by| by.values().sum())
}

/// CPU time each of a process's threads has used so far, in ns, by thread name (`comm`; threads
/// of one name are summed): the first field of each `/proc/<pid>/task/*/schedstat`. `None` when
/// the process is gone or the kernel keeps no schedstat.
#[must_use]
pub fn cpu_ns_by_thread(pid: u32) -> Option<std::collections::BTreeMap<String, u64>> {
    let mut by = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        let (Ok(name), Ok(s)) = (
            std::fs::read_to_string(task.path().join("comm")),
            std::fs::read_to_string(task.path().join("schedstat")),
        ) else {
            continue;
        };
        let ns = s.split_whitespace().next()?.parse::<u64>().ok()?;
        *by.entry(name.trim_end().to_owned()).or_insert(0) += ns;
    }
    Some(by)
}

/// User plus system CPU time of a process so far, in clock ticks: fields 14 and 15 of
/// `/proc/<pid>/stat` (every thread's, ended ones included). `None` when the process is gone.
#[must_use]
pub fn stat_cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = after_comm(&stat)?.split(' ').collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The fields of a `/proc/.../stat` line after the command name, from the state on: the name
/// (which may hold spaces and parentheses) ends at the line's last `)`.
pub(crate) fn after_comm(stat: &str) -> Option<&str> {
    stat.get(stat.rfind(')')? + 2..)
}

/// Microseconds in one clock tick of [`stat_cpu_ticks`] (10 000 at the usual 100 Hz).
#[must_use]
pub fn us_per_tick() -> f64 {
    1e6 / crate::stats::f64_of(rustix::param::clock_ticks_per_second().max(1))
}

/// The daemon's CPU time over a stretch of work, per operation.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuMeter {
    pid: Option<u32>,
    ns: u64,
    ops: u64,
    failed: bool,
}

impl CpuMeter {
    #[must_use]
    pub fn new(pid: Option<u32>) -> CpuMeter {
        CpuMeter {
            pid,
            ..CpuMeter::default()
        }
    }

    /// Runs `work` (which performs `ops` operations, warm-up included) and adds the daemon's
    /// CPU time over it.
    ///
    /// # Errors
    /// `work`'s.
    pub async fn measure<T, F>(&mut self, ops: usize, work: F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let before = self.pid.and_then(cpu_ns);
        let r = work.await?;
        match (before, self.pid.and_then(cpu_ns)) {
            (Some(a), Some(b)) => {
                self.ns += b.saturating_sub(a);
                self.ops += ops as u64;
            }
            _ => self.failed = true,
        }
        Ok(r)
    }

    /// Mean daemon CPU per operation, µs.
    #[must_use]
    pub fn per_op_us(&self) -> Option<f64> {
        if self.failed || self.ops == 0 {
            return None;
        }
        Some(crate::stats::f64_of(self.ns) / crate::stats::f64_of(self.ops) / 1000.0)
    }
}

/// VmRSS of a process, KiB.
///
/// # Errors
/// When /proc/<pid>/status cannot be read or has no VmRSS line.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| BenchError(format!("/proc/{pid}/status has no VmRSS")))
}

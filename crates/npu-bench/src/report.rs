//! The report: rows, memory, and the ratios the goals are stated in, as a table for people and
//! as JSON (the same content).

use comfy_table::{CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

use crate::stats::Summary;

/// Keys of the rows the ratios use.
pub mod keys {
    pub const FAST_INPROC: &str = "fastpath_inproc_dispatch";
    pub const SHM_PINGPONG: &str = "shm_pingpong";
    pub const FAST_UNARY: &str = "fastpath_unary";
    pub const FAST_PIPELINED: &str = "fastpath_pipelined_per_dispatch";
    pub const CPU_NPUD_FASTPATH: &str = "cpu_npud_fastpath";
    pub const CPU_IDLE_RINGS: &str = "cpu_idle_64_rings";
    pub const RAW_ECHO: &str = "raw_echo";
    pub const TONIC_ECHO: &str = "tonic_echo";
    pub const NPUD_UNIX: &str = "npud_unix";
    pub const CHAIN32_LINK: &str = "chain32_per_link";
    pub const PIPELINED: &str = "pipelined_per_dispatch";
    pub const FD_4K: &str = "fd_4KiB";
    pub const FD_64M: &str = "fd_64MiB";
    pub const CLIENTS_1: &str = "clients_1";
    pub const CLIENTS_16: &str = "clients_16";
    pub const RSS_IDLE: &str = "rss_idle";
    pub const CPU_TONIC_ECHO: &str = "cpu_tonic_echo";
    pub const CPU_TONIC_ECHO_HOP: &str = "cpu_tonic_echo_hop";
    pub const CPU_NPUD_POLLING: &str = "cpu_npud_polling";
    pub const CPU_NPUD_SLEEPING: &str = "cpu_npud_sleeping";
    pub const STALL_ALLOC: &str = "stall_alloc_1GiB";
    pub const STALL_CHAIN: &str = "stall_chain1024";
    pub const TCP_PLAIN: &str = "tcp_plain";
    pub const TCP_TLS: &str = "tcp_tls";
}

/// One timed row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The row's number in the issue ("1", "1b", "5", ...).
    pub row: String,
    /// A unique key (`npud_unix`, `chain32_per_link`, `inline_16MiB`, ...).
    pub key: String,
    /// What it measures.
    pub name: String,
    /// Encoded request size in bytes, where the row sends one message per operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clients: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub links: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor_bytes: Option<u64>,
    /// Row 12: the big requests the other client completed meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hog_requests: Option<usize>,
    #[serde(flatten)]
    pub summary: Summary,
    /// The daemon's own mean queue time (admission to device start) over these dispatches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_queue_us: Option<f64>,
    /// Row 12: the daemon's own mean queue time over the dispatches at or above the p99: how
    /// much of the tail the executor's turns explain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail_queue_us: Option<f64>,
    /// The daemon's own mean device time over these dispatches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_device_us: Option<f64>,
    /// The daemon's CPU time (all its threads) per operation, setup and warm-up included, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_cpu_us: Option<f64>,
    /// Rows 16: Jain's fairness index of the clients' dispatch counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness: Option<f64>,
    /// Rows 16 (priorities): the batch sessions' share of the device's time in these windows,
    /// from the daemon's per-class statistics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_share: Option<f64>,
    /// Row 16 (faults): the device faults the faulting client caused in these windows, as the
    /// daemon counted them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_faults: Option<u64>,
}

impl Row {
    #[must_use]
    pub fn new(row: &str, key: &str, name: &str, summary: Summary) -> Row {
        Row {
            row: row.to_owned(),
            key: key.to_owned(),
            name: name.to_owned(),
            message_bytes: None,
            clients: None,
            links: None,
            tensor_bytes: None,
            hog_requests: None,
            summary,
            daemon_queue_us: None,
            tail_queue_us: None,
            daemon_device_us: None,
            daemon_cpu_us: None,
            fairness: None,
            batch_share: None,
            device_faults: None,
        }
    }
}

/// The daemon's resident memory at one point.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    pub row: String,
    pub key: String,
    pub name: String,
    /// VmRSS from /proc/<pid>/status, KiB.
    pub rss_kib: u64,
    pub sessions: usize,
    pub tensors_per_session: usize,
    pub tensor_bytes: u64,
}

/// A server process's CPU time per call of one client calling back to back (row 10).
#[derive(Debug, Clone, Serialize)]
pub struct CpuRow {
    pub row: String,
    pub key: String,
    pub name: String,
    /// Calls measured (warm-up excluded).
    pub calls: u64,
    /// User plus system time of the server process (`/proc/<pid>/stat`, all threads) over the
    /// measured calls, divided by them, µs.
    pub cpu_us_per_call: f64,
    /// The clock ticks that was measured from (one tick is 10 ms at 100 Hz).
    pub cpu_ticks: u64,
    /// Wall time over the same calls, divided by them, µs.
    pub wall_us_per_call: f64,
    /// The same CPU time by the server's threads (by name, `/proc/<pid>/task/*/schedstat`) over
    /// every call warm-up included, divided by them, µs: where a server's time per call goes
    /// (npud's I/O thread `npud`, its `npud-executor`). Empty where the kernel keeps no
    /// schedstat.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub threads_us_per_call: std::collections::BTreeMap<String, f64>,
}

/// A goal, stated as a ratio (or a bound) between rows of this run.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub name: String,
    /// How the value is computed, in row keys.
    pub formula: String,
    pub value: f64,
    /// "<=" or ">=" (value against target), "within" (|value - 1| against target), or
    /// "report" (no goal: a figure said beside the goals; always met).
    pub goal: String,
    pub target: f64,
    pub met: bool,
}

/// Where the run happened.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    /// /proc/loadavg when the run started and when it ended.
    pub loadavg_start: String,
    pub loadavg_end: String,
    /// "release" or "debug": how this tool was built.
    pub build: String,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub quick: bool,
    pub machine: Machine,
    /// The daemon measured: its address (and where it came from).
    pub daemon: String,
    /// The daemon's request threads and its executor's poll (µs), from its device info.
    pub daemon_threads: Option<(u32, u64)>,
    pub rows: Vec<Row>,
    pub memory: Vec<MemoryRow>,
    /// Row 10: CPU per call of the tonic echo (alone and through a second thread) and of npud,
    /// polling and sleeping.
    pub cpu: Vec<CpuRow>,
    pub ratios: Vec<Ratio>,
    /// Rows that could not run, with the reason (e.g. no TCP address for a given daemon).
    pub skipped: Vec<String>,
    /// How rows ran where it departs from their description (e.g. rows 15 unpinned).
    pub notes: Vec<String>,
}

impl Report {
    fn row(&self, key: &str) -> Option<&Summary> {
        self.rows.iter().find(|r| r.key == key).map(|r| &r.summary)
    }

    /// Computes the ratios the goals are stated in, from the rows present.
    pub fn compute_ratios(&mut self) {
        let mut out = Vec::new();
        let p50 = |k: &str| self.row(k).map(|s| s.p50_us);
        let mut push = |name: &str, formula: &str, value: Option<f64>, goal: &str, target: f64| {
            if let Some(value) = value.filter(|v| v.is_finite()) {
                let met = match goal {
                    "<=" => value <= target,
                    ">=" => value >= target,
                    "report" => true,
                    // "within": |value - 1| <= target.
                    _ => (value - 1.0).abs() <= target,
                };
                out.push(Ratio {
                    name: name.to_owned(),
                    formula: formula.to_owned(),
                    value,
                    goal: goal.to_owned(),
                    target,
                    met,
                });
            }
        };
        let div = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        push(
            "npud unary dispatch over the bare tonic echo",
            "p50(npud_unix) / p50(tonic_echo)",
            div(p50(keys::NPUD_UNIX), p50(keys::TONIC_ECHO)),
            "<=",
            1.25,
        );
        push(
            "pipelined dispatch over the raw echo",
            "p50(pipelined_per_dispatch) / p50(raw_echo)",
            div(p50(keys::PIPELINED), p50(keys::RAW_ECHO)),
            "<=",
            3.0,
        );
        push(
            "chain-32 link over a single dispatch",
            "p50(chain32_per_link) / p50(npud_unix)",
            div(p50(keys::CHAIN32_LINK), p50(keys::NPUD_UNIX)),
            "<=",
            0.125,
        );
        push(
            "64 MiB over 4 KiB, shared by fd",
            "p50(fd_64MiB) / p50(fd_4KiB)",
            div(p50(keys::FD_64M), p50(keys::FD_4K)),
            "within",
            0.10,
        );
        let thr = |k: &str| self.row(k).map(|s| s.throughput_per_s);
        let p99 = |k: &str| self.row(k).map(|s| s.p99_us);
        push(
            "16 clients' throughput over 1 client's",
            "throughput(clients_16) / throughput(clients_1)",
            div(thr(keys::CLIENTS_16), thr(keys::CLIENTS_1)),
            ">=",
            1.5,
        );
        push(
            "16 clients' p99 over 1 client's",
            "p99(clients_16) / p99(clients_1)",
            div(p99(keys::CLIENTS_16), p99(keys::CLIENTS_1)),
            "<=",
            4.0,
        );
        // Rows 15: the fast path against in-process dispatch and the ping-pong floor.
        push(
            "fast-path unary over in-process dispatch",
            "p50(fastpath_unary) / p50(fastpath_inproc_dispatch)",
            div(p50(keys::FAST_UNARY), p50(keys::FAST_INPROC)),
            "<=",
            3.0,
        );
        push(
            "fast-path unary over the ping-pong plus in-process dispatch",
            "p50(fastpath_unary) / (p50(shm_pingpong) + p50(fastpath_inproc_dispatch))",
            div(
                p50(keys::FAST_UNARY),
                p50(keys::SHM_PINGPONG)
                    .zip(p50(keys::FAST_INPROC))
                    .map(|(a, b)| a + b),
            ),
            "<=",
            2.0,
        );
        push(
            "fast-path pipelined per dispatch over in-process dispatch",
            "p50(fastpath_pipelined_per_dispatch) / p50(fastpath_inproc_dispatch)",
            div(p50(keys::FAST_PIPELINED), p50(keys::FAST_INPROC)),
            "<=",
            1.5,
        );
        let cpu = |k: &str| {
            self.cpu
                .iter()
                .find(|r| r.key == k)
                .map(|r| r.cpu_us_per_call)
        };
        // The gRPC path, which remote and non-Rust callers use: as the daemon runs by default
        // (its executor polling between one client's dispatches) and sleeping.
        push(
            "npud CPU per gRPC dispatch (executor polling) over the tonic echo's per call",
            "cpu(cpu_npud_polling) / cpu(cpu_tonic_echo)",
            div(cpu(keys::CPU_NPUD_POLLING), cpu(keys::CPU_TONIC_ECHO)),
            "<=",
            2.0,
        );
        push(
            "npud CPU per gRPC dispatch (executor sleeping) over the tonic echo's per call",
            "cpu(cpu_npud_sleeping) / cpu(cpu_tonic_echo)",
            div(cpu(keys::CPU_NPUD_SLEEPING), cpu(keys::CPU_TONIC_ECHO)),
            "<=",
            2.0,
        );
        // What one hand-off to a device thread and back costs by itself, and what npud adds to
        // it: a design with one owner for the device pays the first on every gRPC dispatch.
        push(
            "tonic echo through a second thread: CPU per call over the tonic echo's",
            "cpu(cpu_tonic_echo_hop) / cpu(cpu_tonic_echo)",
            div(cpu(keys::CPU_TONIC_ECHO_HOP), cpu(keys::CPU_TONIC_ECHO)),
            "report",
            0.0,
        );
        push(
            "npud CPU per gRPC dispatch (executor sleeping) over the echo through a second thread",
            "cpu(cpu_npud_sleeping) / cpu(cpu_tonic_echo_hop)",
            div(cpu(keys::CPU_NPUD_SLEEPING), cpu(keys::CPU_TONIC_ECHO_HOP)),
            "report",
            0.0,
        );
        push(
            "npud CPU per fast-path dispatch over the tonic echo's per call",
            "cpu(cpu_npud_fastpath) / cpu(cpu_tonic_echo)",
            div(cpu(keys::CPU_NPUD_FASTPATH), cpu(keys::CPU_TONIC_ECHO)),
            "<=",
            1.0,
        );
        push(
            "npud idle CPU with 64 idle fast-path sessions, % of a core",
            "cpu(cpu_idle_64_rings) / 10000",
            cpu(keys::CPU_IDLE_RINGS).map(|v| v / 10_000.0),
            "<=",
            1.0,
        );
        // Rows 11: every profile's dispatch and chain link over the first profile's.
        let profile_rows: Vec<&str> = self
            .rows
            .iter()
            .filter(|r| r.row == "11" && r.key.ends_with("_dispatch"))
            .map(|r| r.key.trim_end_matches("_dispatch"))
            .collect();
        if let Some((base, rest)) = profile_rows.split_first() {
            for other in rest {
                for (what, name) in [("dispatch", "dispatch"), ("chain32_link", "chain-32 link")] {
                    let (a, b) = (format!("{other}_{what}"), format!("{base}_{what}"));
                    push(
                        &format!("{name}: {other} over {base}"),
                        &format!("p50({a}) / p50({b})"),
                        div(p50(&a), p50(&b)),
                        "<=",
                        1.25,
                    );
                }
            }
        }
        push(
            "another client's p99 while one allocates 1 GiB, over row 3's",
            "p99(stall_alloc_1GiB) / p99(npud_unix)",
            div(p99(keys::STALL_ALLOC), p99(keys::NPUD_UNIX)),
            "<=",
            4.0,
        );
        push(
            "another client's p99 while one runs 1,024-link chains, over row 3's",
            "p99(stall_chain1024) / p99(npud_unix)",
            div(p99(keys::STALL_CHAIN), p99(keys::NPUD_UNIX)),
            "<=",
            4.0,
        );
        push(
            "TLS unary dispatch over plaintext TCP",
            "p50(tcp_tls) / p50(tcp_plain)",
            div(p50(keys::TCP_TLS), p50(keys::TCP_PLAIN)),
            "<=",
            1.25,
        );
        {
            use crate::device::keys;
            push(
                "16 clients' throughput on the modelled device, batching across sessions over not",
                "throughput(device_16_batched) / throughput(device_16_unbatched)",
                div(thr(keys::MANY_BATCHED), thr(keys::MANY_UNBATCHED)),
                ">=",
                1.8,
            );
            // The mean: a lone fast-path round trip's p50 on a small VM is bimodal (its two
            // threads on one vCPU or on two), and two daemons side by side can sit in
            // different modes for a round.
            let mean = |k: &str| self.row(k).map(|s| s.mean_us);
            push(
                "a lone client's latency on the modelled device, batching across sessions over not",
                "mean(device_lone_batched) / mean(device_lone_unbatched)",
                div(mean(keys::LONE_BATCHED), mean(keys::LONE_UNBATCHED)),
                "<=",
                1.05,
            );
            let fair = self
                .rows
                .iter()
                .find(|r| r.key == keys::MANY_BATCHED)
                .and_then(|r| r.fairness);
            push(
                "Jain's index over 16 equal sessions on the modelled device",
                "fairness(device_16_batched)",
                fair,
                ">=",
                0.95,
            );
        }
        {
            use crate::faulting::keys;
            push(
                "15 healthy sessions' throughput on the modelled device, one faulting every tenth dispatch over none",
                "throughput(faults_15_healthy_one_faulting) / throughput(faults_15_healthy_fault_free)",
                div(thr(keys::ONE_FAULTING), thr(keys::FAULT_FREE)),
                ">=",
                0.90,
            );
        }
        {
            use crate::interactive::keys;
            push(
                "an interactive session's p99 on the modelled device, beside 15 batch sessions over alone",
                "p99(device_interactive_loaded) / p99(device_interactive_alone)",
                div(p99(keys::LOADED), p99(keys::ALONE)),
                "<=",
                2.0,
            );
            let share = self
                .rows
                .iter()
                .find(|r| r.key == keys::BATCH_BESIDE)
                .and_then(|r| r.batch_share);
            push(
                "15 batch sessions' share of the modelled device beside an interactive one",
                "batch_share(device_batch15_beside_interactive)",
                share,
                ">=",
                0.90,
            );
            // Not goals: what an interactive session costs batch work, and what asking for the
            // shortest wait changes, said beside the goals.
            push(
                "15 batch sessions' throughput beside an interactive one over alone",
                "throughput(device_batch15_beside_interactive) / throughput(device_batch15_alone)",
                div(thr(keys::BATCH_BESIDE), thr(keys::BATCH_ALONE)),
                "report",
                0.0,
            );
            push(
                "an interactive session's p99 asking the shortest wait, beside 15 batch sessions over alone",
                "p99(device_interactive_shortest) / p99(device_interactive_alone)",
                div(p99(keys::SHORTEST), p99(keys::ALONE)),
                "report",
                0.0,
            );
            push(
                "15 batch sessions' throughput beside an interactive one asking the shortest wait over alone",
                "throughput(device_batch15_beside_shortest) / throughput(device_batch15_alone)",
                div(thr(keys::BATCH_BESIDE_SHORTEST), thr(keys::BATCH_ALONE)),
                "report",
                0.0,
            );
        }
        let idle = self
            .memory
            .iter()
            .find(|m| m.key == keys::RSS_IDLE)
            .map(|m| crate::stats::f64_of(m.rss_kib) / 1024.0);
        push(
            "idle resident memory, MiB",
            "rss_kib(rss_idle) / 1024",
            idle,
            "<=",
            30.0,
        );
        self.ratios = out;
    }

    /// The report as aligned tables.
    #[must_use]
    pub fn to_table(&self) -> String {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header([
                "row", "key", "measures", "p50 µs", "p99 µs", "mean µs", "max µs", "ops/s", "n",
            ]);
        for r in &self.rows {
            let s = &r.summary;
            t.add_row([
                r.row.clone(),
                r.key.clone(),
                r.name.clone(),
                format!("{:.1}", s.p50_us),
                format!("{:.1}", s.p99_us),
                format!("{:.1}", s.mean_us),
                format!("{:.1}", s.max_us),
                format!("{:.0}", s.throughput_per_s),
                s.samples.to_string(),
            ]);
            let mut notes = Vec::new();
            if let (Some(q), Some(d)) = (r.daemon_queue_us, r.daemon_device_us) {
                notes.push(format!("queue {q:.1} µs, device {d:.1} µs"));
            }
            if let (Some(q), Some(t)) = (r.daemon_queue_us, r.tail_queue_us) {
                notes.push(format!(
                    "queue {q:.1} µs, {t:.1} µs over the slowest 1% (the rest of their time is                      outside the executor)"
                ));
            }
            if let Some(c) = r.daemon_cpu_us {
                notes.push(format!("CPU {c:.1} µs per operation"));
            }
            if let Some(j) = r.fairness {
                notes.push(format!("Jain's index over the clients {j:.3}"));
            }
            if let Some(s) = r.batch_share {
                notes.push(format!("batch sessions' device share {:.1} %", s * 100.0));
            }
            if let Some(f) = r.device_faults {
                notes.push(format!("{f} device faults of the faulting client"));
            }
            if !notes.is_empty() {
                t.add_row([
                    String::new(),
                    String::new(),
                    format!("  the daemon's own: {}", notes.join("; ")),
                ]);
            }
        }
        for c in 3..9 {
            if let Some(col) = t.column_mut(c) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        let mut m = Table::new();
        m.load_preset(UTF8_FULL_CONDENSED)
            .set_header(["row", "key", "measures", "VmRSS MiB"]);
        for r in &self.memory {
            m.add_row([
                r.row.clone(),
                r.key.clone(),
                r.name.clone(),
                format!("{:.1}", crate::stats::f64_of(r.rss_kib) / 1024.0),
            ]);
        }
        let mut c = Table::new();
        c.load_preset(UTF8_FULL_CONDENSED).set_header([
            "row",
            "key",
            "measures",
            "server CPU µs per call",
            "wall µs per call",
            "calls",
            "by thread, µs per call",
        ]);
        for r in &self.cpu {
            let mut threads: Vec<_> = r
                .threads_us_per_call
                .iter()
                .filter(|(_, us)| **us >= 0.05)
                .collect();
            threads.sort_by(|a, b| b.1.total_cmp(a.1));
            c.add_row([
                r.row.clone(),
                r.key.clone(),
                r.name.clone(),
                format!("{:.1}", r.cpu_us_per_call),
                format!("{:.1}", r.wall_us_per_call),
                r.calls.to_string(),
                threads
                    .iter()
                    .map(|(name, us)| format!("{name} {us:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ]);
        }
        for col in 3..6 {
            if let Some(col) = c.column_mut(col) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        let cpu = if self.cpu.is_empty() {
            String::new()
        } else {
            format!("{c}\n")
        };
        let mut g = Table::new();
        g.load_preset(UTF8_FULL_CONDENSED)
            .set_header(["goal", "formula", "value", "target", "met"]);
        for r in &self.ratios {
            g.add_row([
                r.name.clone(),
                r.formula.clone(),
                format!("{:.3}", r.value),
                match r.goal.as_str() {
                    "within" => format!("1 ± {}", r.target),
                    "report" => "(none)".to_owned(),
                    _ => format!("{} {}", r.goal, r.target),
                },
                match (r.goal.as_str(), r.met) {
                    ("report", _) => "-",
                    (_, true) => "yes",
                    (_, false) => "NO",
                }
                .to_owned(),
            ]);
        }
        let threads = match self.daemon_threads {
            Some((io, 0)) => format!("; {io} I/O threads, executor sleeps when idle"),
            Some((io, spin)) => format!("; {io} I/O threads, executor polls {spin} µs when idle"),
            None => String::new(),
        };
        let mut s = format!(
            "npuctl bench{}: {}{threads} ({} build, {} cores; load {} -> {})\n{t}\n{m}\n{cpu}{g}\n",
            if self.quick { " --quick" } else { "" },
            self.daemon,
            self.machine.build,
            self.machine.cores,
            self.machine.loadavg_start,
            self.machine.loadavg_end,
        );
        for k in &self.skipped {
            s.push_str(&format!("skipped: {k}\n"));
        }
        for k in &self.notes {
            s.push_str(&format!("note: {k}\n"));
        }
        s
    }
}

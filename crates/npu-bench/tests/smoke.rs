//! The CI smoke test: `npuctl-bench --quick --json`, run as a process against the npud it
//! starts itself, reports every row with sane fields. No timing is asserted.

use std::process::Command;

use serde_json::Value;

fn field<'a>(v: &'a Value, k: &str) -> &'a Value {
    v.get(k).unwrap_or_else(|| panic!("no {k:?} in {v}"))
}

fn number(v: &Value, k: &str) -> f64 {
    field(v, k)
        .as_f64()
        .unwrap_or_else(|| panic!("{k:?} is not a number in {v}"))
}

#[test]
fn quick_json_has_every_row_with_sane_fields() {
    let out = Command::new(env!("CARGO_BIN_EXE_npuctl-bench"))
        .args(["--quick", "--json", "--iterations", "64"])
        .output()
        .expect("npuctl-bench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "npuctl-bench failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(field(&report, "quick"), &Value::Bool(true));
    assert!(number(field(&report, "machine"), "cores") >= 1.0);

    let rows = field(&report, "rows").as_array().expect("rows is a list");
    let keys: Vec<&str> = rows
        .iter()
        .map(|r| field(r, "key").as_str().expect("key is text"))
        .collect();
    let mut expected = vec![
        "raw_echo",
        "tonic_echo",
        "tonic_stream_per_message",
        "inproc_dispatch",
        "inproc_chain32_per_link",
        "npud_unix",
        "npud_tcp",
        "chain8_per_chain",
        "chain8_per_link",
        "chain32_per_chain",
        "chain32_per_link",
        "pipelined_per_dispatch",
        "pipelined_latency",
        "stall_alloc_1GiB",
        "stall_chain1024",
        "tcp_plain",
        "tcp_tls",
        "fastpath_inproc_dispatch",
        "shm_pingpong",
        "fastpath_unary",
        "fastpath_pipelined_per_dispatch",
        "fastpath_pipelined_latency",
        "device_16_batched",
        "device_16_unbatched",
        "device_lone_batched",
        "device_lone_unbatched",
        "faults_15_healthy_fault_free",
        "faults_15_healthy_one_faulting",
        "faults_device_faults",
        "device_batch15_alone",
        "device_batch15_beside_interactive",
        "device_batch15_beside_shortest",
        "device_interactive_alone",
        "device_interactive_loaded",
        "device_interactive_shortest",
    ];
    let sized: Vec<String> = ["fd", "inline"]
        .iter()
        .flat_map(|w| {
            ["4KiB", "1MiB", "16MiB", "64MiB"]
                .iter()
                .map(move |s| format!("{w}_{s}"))
        })
        .chain([1, 4, 16, 64].iter().map(|n| format!("clients_{n}")))
        // Rows 10: G2 beside kernel objects, which run PDI+insts and hsacos.
        .chain(
            [
                "rocr-newest_pdi_insts",
                "kernel-object_pdi_insts",
                "kernel-object_hsaco",
            ]
            .iter()
            .flat_map(|p| {
                ["dispatch", "chain32_link"]
                    .iter()
                    .map(move |w| format!("profile_{p}_{w}"))
            }),
        )
        .collect();
    expected.extend(sized.iter().map(String::as_str));
    for k in &expected {
        assert!(keys.contains(k), "row {k} missing; rows: {keys:?}");
    }
    let rows_of_issue: Vec<&str> = rows
        .iter()
        .map(|r| field(r, "row").as_str().expect("row is text"))
        .collect();
    for n in [
        "1", "1b", "2", "3", "4", "5", "6", "7", "9", "11", "12", "13", "15", "16",
    ] {
        assert!(rows_of_issue.contains(&n), "no row numbered {n}");
    }
    for r in rows {
        let samples = number(r, "samples");
        assert!(samples >= 1.0, "no samples in {r}");
        let (p50, p99, mean) = (
            number(r, "p50_us"),
            number(r, "p99_us"),
            number(r, "mean_us"),
        );
        assert!(p50 > 0.0 && p50.is_finite(), "p50 in {r}");
        assert!(p99 >= p50, "p99 below p50 in {r}");
        assert!(mean > 0.0 && mean.is_finite(), "mean in {r}");
        assert!(number(r, "throughput_per_s") > 0.0, "throughput in {r}");
    }

    // The daemon's CPU per operation where the bench knows its process (it started it), and
    // the threads it reported.
    for r in rows {
        let key = field(r, "key").as_str().expect("key is text");
        if key == "npud_unix"
            || key == "pipelined_per_dispatch"
            || key.starts_with("clients_")
            || key.starts_with("fastpath_unary")
        {
            let cpu = number(r, "daemon_cpu_us");
            assert!(cpu > 0.0 && cpu.is_finite(), "daemon CPU in {r}");
        }
    }
    let threads = field(&report, "daemon_threads")
        .as_array()
        .expect("daemon_threads is [io_threads, executor_spin_us]");
    assert!(threads[0].as_u64().is_some_and(|n| n >= 1), "{threads:?}");
    assert_eq!(
        threads[1].as_u64(),
        Some(200),
        "the default executor.spin_us"
    );

    let memory = field(&report, "memory")
        .as_array()
        .expect("memory is a list");
    let mem_keys: Vec<&str> = memory
        .iter()
        .map(|m| field(m, "key").as_str().expect("key is text"))
        .collect();
    assert_eq!(mem_keys, ["rss_idle", "rss_64_sessions_16_tensors"]);
    for m in memory {
        assert!(number(m, "rss_kib") > 0.0, "rss in {m}");
    }

    // Row 10: CPU per call of the tonic echo's server (alone and through a second thread) and
    // of npud polling and sleeping. A
    // count of clock ticks may be 0 on a fast machine; the calls and wall time are not.
    let cpu = field(&report, "cpu").as_array().expect("cpu is a list");
    let cpu_keys: Vec<&str> = cpu
        .iter()
        .map(|c| field(c, "key").as_str().expect("key is text"))
        .collect();
    assert_eq!(
        cpu_keys,
        [
            "cpu_idle_64_rings",
            "cpu_tonic_echo",
            "cpu_tonic_echo_hop",
            "cpu_npud_polling",
            "cpu_npud_sleeping",
            "cpu_npud_fastpath"
        ]
    );
    // Row 15's idle reading: seconds measured, CPU per second.
    let idle = &cpu[0];
    assert_eq!(field(idle, "row").as_str(), Some("15"), "{idle}");
    assert!(number(idle, "calls") >= 1.0, "seconds in {idle}");
    assert!(number(idle, "cpu_us_per_call").is_finite(), "CPU in {idle}");
    for c in &cpu[1..] {
        assert_eq!(field(c, "row").as_str(), Some("10"), "{c}");
        assert!(number(c, "calls") >= 5000.0, "calls in {c}");
        let per_call = number(c, "cpu_us_per_call");
        assert!(per_call >= 0.0 && per_call.is_finite(), "CPU in {c}");
        assert!(number(c, "wall_us_per_call") > 0.0, "wall time in {c}");
    }
    // The same CPU by thread: npud's calls run on its I/O thread and its executor, whose
    // names the table keys them by (schedstat is kept on every kernel the tests run on).
    for c in &cpu[3..5] {
        let threads = field(c, "threads_us_per_call")
            .as_object()
            .expect("threads_us_per_call is a map");
        for name in ["npud", "npud-executor"] {
            let us = threads.get(name).and_then(serde_json::Value::as_f64);
            assert!(us.is_some_and(|us| us > 0.0), "{name} in {c}");
        }
    }

    let ratios = field(&report, "ratios")
        .as_array()
        .expect("ratios is a list");
    // Twenty-three goals, five figures said beside them, and each kernel-object row's dispatch
    // and chain link over G2's.
    assert_eq!(ratios.len(), 32, "ratios: {ratios:?}");
    assert!(
        ratios.iter().any(|r| field(r, "formula").as_str()
            == Some("cpu(cpu_npud_sleeping) / cpu(cpu_tonic_echo)")),
        "{ratios:?}"
    );
    assert!(
        ratios.iter().any(|r| field(r, "formula").as_str()
            == Some("throughput(device_16_batched) / throughput(device_16_unbatched)")),
        "{ratios:?}"
    );
    // Rows 16's Jain's index, of both daemons' clients.
    for r in rows {
        let key = field(r, "key").as_str().expect("key is text");
        if key.starts_with("device_16_") {
            let j = number(r, "fairness");
            assert!(j > 0.0 && j <= 1.0 + 1e-9, "Jain's index in {r}");
        }
    }
    // Rows 16 (priorities): the batch sessions' device share, from the daemon's per-class
    // statistics, beside each interactive client.
    for key in [
        "device_batch15_beside_interactive",
        "device_batch15_beside_shortest",
    ] {
        let r = rows
            .iter()
            .find(|r| field(r, "key").as_str() == Some(key))
            .expect("the batch rows");
        let share = number(r, "batch_share");
        assert!(share > 0.0 && share < 1.0, "{r}");
    }
    assert!(
        ratios.iter().any(|r| field(r, "formula").as_str()
            == Some("p99(device_interactive_loaded) / p99(device_interactive_alone)")),
        "{ratios:?}"
    );
    // Row 16 (faults): the faulting client's faults reached the device (the bench checked
    // them against the daemon's count, and every healthy output).
    assert!(
        ratios.iter().any(|r| field(r, "formula").as_str()
            == Some("throughput(faults_15_healthy_one_faulting) / throughput(faults_15_healthy_fault_free)")),
        "{ratios:?}"
    );
    let faulting = rows
        .iter()
        .find(|r| field(r, "key").as_str() == Some("faults_15_healthy_one_faulting"))
        .expect("the faulting row");
    assert!(number(faulting, "device_faults") >= 1.0, "{faulting}");
    assert!(
        ratios
            .iter()
            .any(|r| field(r, "formula").as_str() == Some("p50(tcp_tls) / p50(tcp_plain)")),
        "{ratios:?}"
    );
    assert!(
        ratios.iter().any(|r| field(r, "formula").as_str()
            == Some("p50(profile_kernel-object_hsaco_dispatch) / p50(profile_rocr-newest_pdi_insts_dispatch)")),
        "{ratios:?}"
    );
    for r in ratios {
        assert!(number(r, "value").is_finite(), "ratio value in {r}");
        assert!(field(r, "met").is_boolean(), "met in {r}");
    }
    assert!(
        field(&report, "skipped")
            .as_array()
            .is_some_and(Vec::is_empty),
        "nothing is skipped against a daemon started here"
    );
    // Rows 15 pin the daemon started here (its process id is known) wherever two CPUs are.
    let notes = field(&report, "notes").as_array().expect("notes is a list");
    if std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2) {
        assert!(
            !notes
                .iter()
                .any(|n| n.as_str().is_some_and(|n| n.contains("unpinned"))),
            "{notes:?}"
        );
    }
}

#[test]
fn the_table_names_the_goals() {
    let out = Command::new(env!("CARGO_BIN_EXE_npuctl-bench"))
        .args(["--quick", "--iterations", "32"])
        .output()
        .expect("npuctl-bench runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "raw_echo",
        "tonic_echo",
        "npud_unix",
        "clients_64",
        "rss_idle",
        "p50(npud_unix) / p50(tonic_echo)",
    ] {
        assert!(table.contains(needle), "{needle} not in:\n{table}");
    }
}

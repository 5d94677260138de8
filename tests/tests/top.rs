//! `npuctl top` against a real daemon: under a pseudo-terminal it shows a session that
//! dispatches in a loop, with a nonzero dispatch count, and ends with status 0 on `q`; with
//! `--once` (or without a terminal) it prints one frame. An interactive session that
//! npu-client opened with a deadline is granted both, and shows its class in `npuctl sessions`
//! and in top's class lines.

#![forbid(unsafe_code)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ConnectOptions, Program, SessionClass};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session, npuctl_binary};
use rexpect::process::WaitStatus;

/// A session named `name` that dispatches until `stop` is set; returns its id once it has
/// dispatched at least once.
async fn dispatching(d: &Daemon, name: &str, stop: Arc<AtomicBool>) -> u64 {
    let mut s = Session::open(d.connect().await, name).await.unwrap();
    let id = s
        .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let mut t = Vec::new();
    for _ in 0..2 {
        let req = s.req(pb::AllocateTensorRequest {
            size_bytes: 4096,
            name: String::new(),
        });
        t.push(
            s.client
                .allocate_tensor(req)
                .await
                .unwrap()
                .into_inner()
                .tensor_id,
        );
    }
    s.dispatch(id, &t).await.unwrap();
    let session = s.id;
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            s.dispatch(id, &t).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_a_dispatching_session_and_quits_on_q() {
    let d = Daemon::start(Options::default());
    let stop = Arc::new(AtomicBool::new(false));
    let session = dispatching(&d, "top-loop", stop.clone()).await;
    let socket = d.socket.clone();
    let result = tokio::task::spawn_blocking(move || -> Result<(), String> {
        let mut cmd = Command::new(npuctl_binary());
        cmd.args(["top", "--interval", "0.2"])
            .env("NPUD_ADDR", format!("unix:{}", socket.display()))
            .env("TERM", "xterm-256color");
        let mut p =
            rexpect::session::spawn_command(cmd, Some(15_000)).map_err(|e| e.to_string())?;
        // The session's row: id, name, and a dispatch count that is not zero.
        let row = format!(r"{session} +top-loop +[0-9]+ +yes +[1-9][0-9]*");
        p.exp_regex(&row)
            .map_err(|e| format!("the session never showed with dispatches: {e}"))?;
        p.send("q").map_err(|e| e.to_string())?;
        p.flush().map_err(|e| e.to_string())?;
        // It leaves the alternate screen and shows the cursor again on its way out.
        let rest = p
            .exp_eof()
            .map_err(|e| format!("npuctl top did not end on q: {e}"))?;
        if !(rest.contains("\u{1b}[?1049l") && rest.contains("\u{1b}[?25h")) {
            return Err(format!("the terminal was not restored: {rest:?}"));
        }
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match p.process().status() {
                Some(WaitStatus::Exited(_, code)) => {
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(format!("npuctl top exited with {code}"))
                    };
                }
                Some(WaitStatus::StillAlive) | None => {}
                Some(other) => return Err(format!("npuctl top ended with {other:?}")),
            }
            if Instant::now() > until {
                let _ = p.process_mut().kill(rexpect::process::Signal::SIGKILL);
                return Err("npuctl top did not exit within 5 s of q".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    result.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_once_prints_one_frame_for_scripts() {
    let d = Daemon::start(Options::default());
    let stop = Arc::new(AtomicBool::new(false));
    let session = dispatching(&d, "once-loop", stop.clone()).await;
    let socket = d.socket.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(npuctl_binary())
            .args(["top", "--once", "--interval", "0.3"])
            .env("NPUD_ADDR", format!("unix:{}", socket.display()))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No terminal control sequences in a frame for scripts.
    assert!(!text.contains('\u{1b}'), "{text:?}");
    let row = text
        .lines()
        .find(|l| l.contains("once-loop"))
        .unwrap_or_else(|| panic!("no row for the session:\n{text}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[0], session.to_string(), "{row}");
    let dispatched: u64 = cols[4].parse().unwrap();
    let per_second: f64 = cols[5].parse().unwrap();
    assert!(dispatched > 0 && per_second > 0.0, "{row}");
    assert!(text.contains("vector_scalar_add"), "{text}");
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with("npud ") && first.contains("serving"),
        "{text}"
    );

    let bad = Command::new(npuctl_binary())
        .args(["top", "--once", "--interval", "0"])
        .env("NPUD_ADDR", format!("unix:{}", d.socket.display()))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("--interval 0: expected at least 0.1 seconds"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// `npuctl ARGS` against `d`; its standard output, after checking that it succeeded.
fn npuctl(d: &Daemon, args: &[&str]) -> String {
    let out = Command::new(npuctl_binary())
        .args(args)
        .env("NPUD_ADDR", format!("unix:{}", d.socket.display()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "npuctl {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_session_shows_its_class_in_sessions_and_top() {
    let d = Daemon::start(Options::default());
    let addr = format!("unix:{}", d.socket.display());
    let opts = ConnectOptions {
        session_class: SessionClass::Interactive,
        deadline: Some(Duration::from_millis(5)),
        ..ConnectOptions::default()
    };
    let client = Client::connect_with(Some(&addr), opts).await.unwrap();
    assert_eq!(client.session_class(), SessionClass::Interactive);
    assert_eq!(client.deadline(), Some(Duration::from_millis(5)));
    let batch = Client::connect(Some(&addr)).await.unwrap();
    assert_eq!(
        (batch.session_class(), batch.deadline()),
        (SessionClass::Batch, None)
    );

    let sessions: serde_json::Value =
        serde_json::from_str(&npuctl(&d, &["sessions", "--json"])).unwrap();
    let class_of = |id: u64| {
        let s = sessions
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["session_id"] == id)
            .unwrap_or_else(|| panic!("no session {id} in {sessions}"));
        (s["session_class"].clone(), s["deadline_us"].clone())
    };
    assert_eq!(
        class_of(client.session_id()),
        (serde_json::json!("interactive"), serde_json::json!(5000))
    );
    assert_eq!(
        class_of(batch.session_id()),
        (serde_json::json!("batch"), serde_json::json!(0))
    );
    let table = npuctl(&d, &["sessions"]);
    assert!(table.contains("interactive (5ms)"), "{table}");

    // The interactive session dispatches while top samples; the batch one does not, so the
    // interactive class has the device's whole time over the interval.
    let program = Program::emulated(
        &EmuDesign::vector_scalar_add(1024, DType::I32, 1),
        client.generation(),
    )
    .unwrap();
    let input = client.alloc::<i32>(1024).await.unwrap();
    let mut output = client.alloc::<i32>(1024).await.unwrap();
    client
        .dispatch(&program, &[&input], &mut [&mut output])
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let looping = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                client
                    .dispatch(&program, &[&input], &mut [&mut output])
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let top = {
        let d = &d;
        tokio::task::block_in_place(|| npuctl(d, &["top", "--once", "--interval", "0.5"]))
    };
    stop.store(true, Ordering::Relaxed);
    looping.await.unwrap();
    let line = |name: &str| -> Vec<String> {
        top.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} line:\n{top}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    // CLASS SESSIONS DISP/s QUEUE SHARE MISSED
    let interactive = line("interactive");
    assert_eq!(interactive[1], "1", "{top}");
    assert!(interactive[2].parse::<f64>().unwrap() > 0.0, "{top}");
    assert_eq!(interactive[4], "100%", "{top}");
    let b = line("batch");
    assert_eq!((b[1].as_str(), b[2].as_str()), ("1", "0.0"), "{top}");

    let status: serde_json::Value =
        serde_json::from_str(&npuctl(&d, &["status", "--json"])).unwrap();
    let classes = status["statistics"]["classes"].as_array().unwrap();
    let names: Vec<_> = classes.iter().map(|c| &c["session_class"]).collect();
    assert_eq!(names, ["batch", "interactive"], "{status}");
    assert!(
        classes[1]["dispatches"]["success"]["count"]
            .as_u64()
            .unwrap()
            > 1,
        "{status}"
    );
    client.close().await.unwrap();
    batch.close().await.unwrap();
}

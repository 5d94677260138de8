//! `npuctl top` against a real daemon: under a pseudo-terminal it shows a session that
//! dispatches in a loop, with a nonzero dispatch count, and ends with status 0 on `q`; with
//! `--once` (or without a terminal) it prints one frame.

#![forbid(unsafe_code)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
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

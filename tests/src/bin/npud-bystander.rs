//! The standing hostile bystander's client, a process of its own (`npud_e2e::bystander`): built
//! in release beside the daemon, so that what it measures is the daemon and not its own CPU, and
//! out of the test process, whose threads run at the lowest priority while an attack runs.
//!
//! `npud-bystander SOCKET` opens a session on the daemon's Unix socket, registers a 1024-element
//! vector_scalar_add and allocates its two tensors, then calls `GetDeviceInfo` and `Dispatch` in
//! turn, one at a time, on one connection, until its standard input closes. It writes one line
//! per event on its standard output, times in ns of `CLOCK_MONOTONIC`:
//!
//! - `ready` after its first 200 calls, or `setup-failed REASON`;
//! - `begin START` as a call starts;
//! - `end START TOOK KIND [ERROR]` as it ends (`KIND` 1 for `Dispatch`, 0 for `GetDeviceInfo`);
//! - `paused` once the call under way has ended after a `pause` line on its input; `resume`
//!   calls again.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use npud_e2e::bystander::{CALL_LIMIT, ELEMENTS, monotonic_ns};
use npud_e2e::{Session, connect_unix, dispatch_request};
use tokio::sync::Notify;

#[derive(Default)]
struct Control {
    stop: AtomicBool,
    paused: AtomicBool,
    changed: Notify,
}

fn main() {
    let Some(socket) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: npud-bystander SOCKET");
        std::process::exit(2);
    };
    let control = Arc::new(Control::default());
    // Its input: `pause`, `resume`; its end stops the bystander.
    std::thread::spawn({
        let control = control.clone();
        move || {
            for line in std::io::stdin().lock().lines() {
                match line.as_deref().map(str::trim) {
                    Ok("pause") => control.paused.store(true, Ordering::SeqCst),
                    Ok("resume") => control.paused.store(false, Ordering::SeqCst),
                    Ok(_) => {}
                    Err(_) => break,
                }
                control.changed.notify_one();
            }
            control.stop.store(true, Ordering::SeqCst);
            control.changed.notify_one();
        }
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(run(socket, &control));
}

/// One line on standard output, written at once.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // A harness that stopped reading has ended the test: nothing to tell it.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn run(socket: PathBuf, control: &Control) {
    let setup = async {
        let client = NpudClient::new(connect_unix(&socket).await);
        let mut s = Session::open(client, "bystander")
            .await
            .map_err(|e| format!("OpenSession: {e}"))?;
        let design = npu_artifacts::emu::EmuDesign::vector_scalar_add(
            ELEMENTS,
            npu_artifacts::emu::DType::I32,
            1,
        );
        let program = s
            .register(&design)
            .await
            .map_err(|e| format!("RegisterProgram: {e}"))?
            .program_id;
        let bytes = u64::from(ELEMENTS) * 4;
        let a = s.alloc_mapped(bytes).await?;
        let b = s.alloc_mapped(bytes).await?;
        Ok::<_, String>((s, program, a, b))
    };
    let (s, program, a, b) = match setup.await {
        Ok(v) => v,
        Err(e) => {
            say(&format!("setup-failed {}", e.replace('\n', " ")));
            return;
        }
    };
    let mut client = s.client.clone();
    let mut n: u64 = 0;
    let mut told_paused = false;
    while !control.stop.load(Ordering::SeqCst) {
        if control.paused.load(Ordering::SeqCst) {
            if !told_paused {
                say("paused");
                told_paused = true;
            }
            let _ =
                tokio::time::timeout(Duration::from_millis(50), control.changed.notified()).await;
            continue;
        }
        told_paused = false;
        let start = monotonic_ns();
        say(&format!("begin {start}"));
        let dispatch = !n.is_multiple_of(2);
        let r = if dispatch {
            tokio::time::timeout(
                CALL_LIMIT,
                client.dispatch(s.req(dispatch_request(program, &[a.id, b.id]))),
            )
            .await
            .map(|r| r.map(|_| ()))
        } else {
            tokio::time::timeout(
                CALL_LIMIT,
                client.get_device_info(pb::GetDeviceInfoRequest {}),
            )
            .await
            .map(|r| r.map(|_| ()))
        };
        let took = monotonic_ns().saturating_sub(start);
        let error = match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!(
                "{} {:?}: {}",
                if dispatch {
                    "Dispatch"
                } else {
                    "GetDeviceInfo"
                },
                e.code(),
                e.message()
            )),
            Err(_) => Some(format!("no answer within {CALL_LIMIT:?}")),
        };
        let failed = error.is_some();
        say(&format!(
            "end {start} {took} {} {}",
            u8::from(dispatch),
            error.unwrap_or_default().replace('\n', " ")
        ));
        n += 1;
        if n == 200 {
            say("ready");
        }
        if failed {
            // A dead daemon fails every call at once: no need to spin on it.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    drop((a, b));
}

//! Starts a program the way systemd's socket activation does, for the tests of npud's systemd
//! support: binds Unix listening sockets, passes them as fds 3, 4, ... with `LISTEN_FDS`,
//! `LISTEN_FDNAMES` and `LISTEN_PID`, and execs the program in its own process (so the pid
//! in `LISTEN_PID` is the program's).
//!
//! `npud-socket-activate --listen PATH [--listen PATH ...] [--names a:b] -- PROGRAM ARGS...`

#![forbid(unsafe_code)]

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    match run() {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("npud-socket-activate: {e}");
            ExitCode::FAILURE
        }
    }
}

enum Never {}

fn run() -> Result<Never, String> {
    let mut args = std::env::args().skip(1);
    let mut paths = Vec::new();
    let mut names = None;
    loop {
        match args.next().as_deref() {
            Some("--listen") => paths.push(args.next().ok_or("--listen needs a path")?),
            Some("--names") => names = Some(args.next().ok_or("--names needs a value")?),
            Some("--") => break,
            Some(other) => return Err(format!("unknown argument {other:?}")),
            None => return Err("no program after --".into()),
        }
    }
    let program = args.next().ok_or("no program after --")?;
    let mut listeners = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let _ = std::fs::remove_file(p);
        let l = UnixListener::bind(p).map_err(|e| format!("binding {p}: {e}"))?;
        let want = 3 + i32::try_from(i).map_err(|_| "too many sockets")?;
        if l.as_raw_fd() != want {
            return Err(format!(
                "socket {p} got fd {} instead of {want}: fds from 3 up must be free",
                l.as_raw_fd()
            ));
        }
        // Inherited across exec, as systemd passes them.
        rustix::io::fcntl_setfd(&l, rustix::io::FdFlags::empty())
            .map_err(|e| format!("clearing FD_CLOEXEC on {p}: {e}"))?;
        listeners.push(l);
    }
    let mut cmd = Command::new(&program);
    cmd.args(args)
        .env("LISTEN_FDS", listeners.len().to_string())
        .env("LISTEN_PID", std::process::id().to_string());
    if let Some(n) = names {
        cmd.env("LISTEN_FDNAMES", n);
    }
    let err = cmd.exec();
    drop(listeners);
    Err(format!("exec {program}: {err}"))
}

//! `npuctl top`: a live view of the daemon, refreshed every `--interval`: the device, its
//! session classes, sessions and programs, throughput (dispatches per second, from the
//! difference between two refreshes) and the mean queue and device time over the last
//! interval; per class, its share of the device's time over the interval too.
//!
//! On a terminal it draws on the alternate screen and ends on `q`, `Esc`, Ctrl-C, SIGTERM or
//! SIGHUP, restoring the terminal (also when it fails). With `--once`, or when standard output is not a
//! terminal, it samples twice an interval apart and prints one frame.
//!
//! Reading other sessions' details may be refused (`PERMISSION_DENIED` from a daemon whose
//! policy keeps them for admins); the view then says so in place of the table and goes on.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::{cursor, execute, queue, style, terminal};
use npu_client::proto as pb;
use npu_client::{ClientError, Operator, SessionClass};

use crate::output::{bytes, ns};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Seconds between refreshes (at least 0.1).
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print one frame (two samples an interval apart) and exit; the default when standard
    /// output is not a terminal.
    #[arg(long)]
    once: bool,
}

/// One refresh: what the daemon answered, or why it did not.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    info: Result<pb::DeviceInfo, String>,
    stats: Result<pb::Statistics, Refusal>,
    programs: Result<Vec<pb::ProgramListing>, Refusal>,
}

/// Why a part of the view is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    /// The daemon keeps it for admins.
    Denied(String),
    Failed(String),
}

impl Refusal {
    fn of(e: &ClientError) -> Refusal {
        match e.code() {
            Some(tonic::Code::PermissionDenied) => Refusal::Denied(e.to_string()),
            _ => Refusal::Failed(e.to_string()),
        }
    }

    fn line(&self, what: &str) -> String {
        match self {
            Refusal::Denied(m) => format!(
                "  {what}: not shown: the daemon keeps them for its admins (PERMISSION_DENIED: {m})"
            ),
            Refusal::Failed(m) => format!("  {what}: not available: {m}"),
        }
    }
}

async fn sample(op: &Operator) -> Sample {
    let (info, stats, programs) = tokio::join!(op.device_info(), op.statistics(), op.programs());
    Sample {
        at: Instant::now(),
        info: info.map_err(|e| e.to_string()),
        stats: stats.map_err(|e| Refusal::of(&e)),
        programs: programs.map_err(|e| Refusal::of(&e)),
    }
}

fn dispatches(d: Option<&pb::DispatchStatistics>) -> (u64, u64, u64, u64, u64) {
    let c = |x: Option<&pb::Duration>| x.map_or((0, 0), |x| (x.count, x.ns));
    d.map_or((0, 0, 0, 0, 0), |d| {
        let (ok, _) = c(d.success.as_ref());
        let (failed, _) = c(d.fail.as_ref());
        let (queued, queue_ns) = c(d.queue.as_ref());
        let (_, device_ns) = c(d.execute.as_ref());
        (ok + failed, failed, queued, queue_ns, device_ns)
    })
}

/// Per second over `secs`, and the mean queue and device time per dispatch, between two
/// counter readings (`None` for the first).
fn rates(
    now: (u64, u64, u64, u64, u64),
    before: Option<(u64, u64, u64, u64, u64)>,
    secs: f64,
) -> (String, String, String) {
    let Some(b) = before else {
        return ("-".into(), "-".into(), "-".into());
    };
    let done = now.0.saturating_sub(b.0);
    let timed = now.2.saturating_sub(b.2);
    let rate = if secs > 0.0 {
        format!("{:.1}", done as f64 / secs)
    } else {
        "-".into()
    };
    let per = |ns_now: u64, ns_before: u64| {
        ns_now
            .saturating_sub(ns_before)
            .checked_div(timed)
            .map_or_else(|| "-".into(), ns)
    };
    (rate, per(now.3, b.3), per(now.4, b.4))
}

/// One line per session class (a daemon older than classes sends none, and gets no lines):
/// its open sessions, and over the interval its dispatches per second, mean queue time and
/// share of the device (its device time over every class's); deadline misses since start.
fn classes(now: &pb::Statistics, before: Option<&pb::Statistics>, secs: f64) -> Vec<String> {
    if now.classes.is_empty() {
        return Vec::new();
    }
    let old = |c: &pb::ClassStatistics| {
        before
            .and_then(|b| {
                b.classes
                    .iter()
                    .find(|o| o.session_class == c.session_class)
            })
            .map(|o| dispatches(o.dispatches.as_ref()))
    };
    // Device time over the interval, per class and in all.
    let device = |c: &pb::ClassStatistics| {
        before.map(|_| {
            dispatches(c.dispatches.as_ref())
                .4
                .saturating_sub(old(c).map_or(0, |o| o.4))
        })
    };
    let all: u64 = now.classes.iter().filter_map(device).sum();
    let mut out = vec![format!(
        "{:<12} {:>8} {:>9} {:>10} {:>6} {:>7}",
        "CLASS", "SESSIONS", "DISP/s", "QUEUE", "SHARE", "MISSED"
    )];
    for c in &now.classes {
        let (rate, queue, _) = rates(dispatches(c.dispatches.as_ref()), old(c), secs);
        let share = match device(c) {
            Some(d) if all > 0 => format!("{:.0}%", 100.0 * d as f64 / all as f64),
            _ => "-".into(),
        };
        out.push(format!(
            "{:<12} {:>8} {:>9} {:>10} {:>6} {:>7}",
            SessionClass::proto_name(c.session_class),
            c.open_sessions,
            rate,
            queue,
            share,
            c.deadline_missed,
        ));
    }
    out
}

fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn uptime(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s / 60) % 60),
    }
}

/// The frame for `now`, with rates against `before`, as lines of text.
fn frame(addr: &str, interval: f64, now: &Sample, before: Option<&Sample>) -> Vec<String> {
    let mut out = Vec::new();
    let secs = before.map_or(0.0, |b| now.at.duration_since(b.at).as_secs_f64());
    match &now.info {
        Ok(i) => {
            out.push(format!(
                "npud {} at {addr}   {} {} {}{}   {}   refresh {interval}s",
                i.daemon_version,
                i.backend,
                i.generation,
                i.packet_abi,
                if i.emulator_profile.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", i.emulator_profile)
                },
                if i.serving { "serving" } else { "RECOVERING" },
            ));
            let pct = if i.heap_size_bytes > 0 {
                100.0 * i.heap_used_bytes as f64 / i.heap_size_bytes as f64
            } else {
                0.0
            };
            out.push(format!(
                "heap {} / {} ({pct:.0}%)   programs loaded {}   sessions {}   recoveries {}",
                bytes(i.heap_used_bytes),
                bytes(i.heap_size_bytes),
                i.programs_loaded,
                i.sessions,
                i.recoveries,
            ));
        }
        Err(e) => out.push(format!(
            "npud at {addr}: device information not available: {e}"
        )),
    }
    let old_stats = before.and_then(|b| b.stats.as_ref().ok());
    match &now.stats {
        Ok(s) => {
            let total = |st: &pb::Statistics| {
                st.programs.iter().fold((0, 0, 0, 0, 0), |a, p| {
                    let d = dispatches(p.dispatches.as_ref());
                    (a.0 + d.0, a.1 + d.1, a.2 + d.2, a.3 + d.3, a.4 + d.4)
                })
            };
            let (rate, queue, device) = rates(total(s), old_stats.map(total), secs);
            out.push(format!(
                "dispatches/s {rate}   mean queue {queue}   mean device {device}   device faults {}   uptime {}",
                s.device_faults,
                uptime(s.uptime_ms),
            ));
            out.push(String::new());
            let by_class = classes(s, old_stats, secs);
            if !by_class.is_empty() {
                out.extend(by_class);
                out.push(String::new());
            }
            out.push(format!(
                "{:>7} {:<20} {:>6} {:>4} {:>11} {:>9} {:>10} {:>10} {:>7} {:>10}",
                "SESSION",
                "CLIENT",
                "UID",
                "CONN",
                "DISPATCHES",
                "DISP/s",
                "QUEUE",
                "DEVICE",
                "TENSORS",
                "BYTES"
            ));
            if s.sessions.is_empty() {
                out.push("  no open sessions".into());
            }
            for x in &s.sessions {
                let d = dispatches(x.dispatches.as_ref());
                let old = old_stats
                    .and_then(|o| o.sessions.iter().find(|y| y.session_id == x.session_id))
                    .map(|y| dispatches(y.dispatches.as_ref()));
                let (rate, queue, device) = rates(d, old, secs);
                out.push(format!(
                    "{:>7} {:<20} {:>6} {:>4} {:>11} {:>9} {:>10} {:>10} {:>7} {:>10}",
                    x.session_id,
                    cut(&x.client_name, 20),
                    x.uid.map_or_else(|| "tcp".into(), |u| u.to_string()),
                    if x.connected { "yes" } else { "no" },
                    d.0,
                    rate,
                    queue,
                    device,
                    x.tensors,
                    bytes(x.tensor_bytes),
                ));
            }
        }
        Err(r) => out.push(r.line("sessions")),
    }
    out.push(String::new());
    match (&now.programs, &now.stats) {
        (Ok(list), stats) => {
            out.push(format!(
                "{:>7} {:<24} {:<12} {:>6} {:>4} {:>11} {:>9} {:>10} {:>10}",
                "PROGRAM",
                "NAME",
                "HASH",
                "LOADED",
                "REFS",
                "DISPATCHES",
                "DISP/s",
                "QUEUE",
                "DEVICE"
            ));
            if list.is_empty() {
                out.push("  no programs".into());
            }
            let find = |st: &pb::Statistics, id: u64| {
                st.programs
                    .iter()
                    .find(|p| p.program_id == id)
                    .map(|p| dispatches(p.dispatches.as_ref()))
            };
            for p in list {
                let d = stats.as_ref().ok().and_then(|s| find(s, p.program_id));
                let old = old_stats.and_then(|s| find(s, p.program_id));
                let (rate, queue, device) = match d {
                    Some(d) => rates(d, old, secs),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                out.push(format!(
                    "{:>7} {:<24} {:<12} {:>6} {:>4} {:>11} {:>9} {:>10} {:>10}{}",
                    p.program_id,
                    cut(&p.name, 24),
                    cut(&p.content_hash, 12),
                    if p.loaded { "yes" } else { "no" },
                    p.references,
                    d.map_or_else(|| "-".into(), |d| d.0.to_string()),
                    rate,
                    queue,
                    device,
                    if p.quarantined { "  QUARANTINED" } else { "" },
                ));
            }
        }
        (Err(r), _) => out.push(r.line("programs")),
    }
    out
}

/// Puts the terminal back as it was when dropped, however the view ends.
#[derive(Debug)]
struct Screen;

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let s = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(s)
    }

    fn draw(&self, lines: &[String]) -> std::io::Result<()> {
        // A terminal that reports no size (a bare pseudo-terminal) gets a wide default.
        let (cols, rows) = match terminal::size() {
            Ok((c, r)) if c > 0 && r > 0 => (c, r),
            _ => (160, 50),
        };
        let mut out = std::io::stdout().lock();
        queue!(out, cursor::MoveTo(0, 0))?;
        let body = usize::from(rows).saturating_sub(1);
        for (i, line) in lines.iter().take(body).enumerate() {
            let row = u16::try_from(i).unwrap_or(u16::MAX);
            queue!(
                out,
                cursor::MoveTo(0, row),
                style::Print(cut(line, usize::from(cols))),
                terminal::Clear(terminal::ClearType::UntilNewLine)
            )?;
        }
        let shown = u16::try_from(lines.len().min(body)).unwrap_or(u16::MAX);
        queue!(
            out,
            cursor::MoveTo(0, shown),
            terminal::Clear(terminal::ClearType::FromCursorDown),
            cursor::MoveTo(0, rows.saturating_sub(1)),
            style::Print(cut("q: quit", usize::from(cols)))
        )?;
        out.flush()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

fn quits(k: &KeyEvent) -> bool {
    k.kind != KeyEventKind::Release
        && (matches!(k.code, KeyCode::Char('q' | 'Q') | KeyCode::Esc)
            || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL)))
}

/// Reads keys on a thread of its own (crossterm's reads block) and says when to quit; it ends
/// when the receiver is gone.
fn key_reader() -> tokio::sync::mpsc::Receiver<Result<(), String>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    std::thread::spawn(move || {
        loop {
            match event::poll(Duration::from_millis(100)) {
                Ok(true) => match event::read() {
                    Ok(Event::Key(k)) if quits(&k) => {
                        let _ = tx.blocking_send(Ok(()));
                        return;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.blocking_send(Err(format!("reading the terminal: {e}")));
                        return;
                    }
                },
                Ok(false) => {}
                Err(e) => {
                    let _ = tx.blocking_send(Err(format!("reading the terminal: {e}")));
                    return;
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

pub async fn run(a: &Args, addr: Option<&str>) -> crate::CmdResult {
    if !(a.interval.is_finite() && a.interval >= 0.1) {
        return Err(format!(
            "--interval {}: expected at least 0.1 seconds",
            a.interval
        ));
    }
    let interval = Duration::from_secs_f64(a.interval);
    let op = crate::operator(addr).await?;
    let shown = op.address().to_string();
    if a.once || !std::io::stdout().is_terminal() {
        let first = sample(&op).await;
        tokio::time::sleep(interval).await;
        let now = sample(&op).await;
        if let Err(e) = &now.info {
            return Err(format!("npud at {shown}: {e}"));
        }
        for line in frame(&shown, a.interval, &now, Some(&first)) {
            println!("{line}");
        }
        return Ok(());
    }

    // SIGTERM and SIGHUP (the terminal closed) end the view as q does, restoring the terminal.
    let signal = |kind| {
        tokio::signal::unix::signal(kind).map_err(|e| format!("installing a signal handler: {e}"))
    };
    let mut term = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut hangup = signal(tokio::signal::unix::SignalKind::hangup())?;
    let screen = Screen::enter().map_err(|e| format!("setting up the terminal: {e}"))?;
    let mut keys = key_reader();
    let mut before: Option<Sample> = None;
    loop {
        let now = sample(&op).await;
        screen
            .draw(&frame(&shown, a.interval, &now, before.as_ref()))
            .map_err(|e| format!("drawing: {e}"))?;
        before = Some(now);
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            k = keys.recv() => return k.unwrap_or(Ok(())),
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
            _ = hangup.recv() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dispatched` successful dispatches that waited `queue_ns` and ran `device_ns` in all.
    fn dispatches(dispatched: u64, queue_ns: u64, device_ns: u64) -> pb::DispatchStatistics {
        let d = |ns| {
            Some(pb::Duration {
                count: dispatched,
                ns,
            })
        };
        pb::DispatchStatistics {
            success: d(0),
            queue: d(queue_ns),
            execute: d(device_ns),
            ..Default::default()
        }
    }

    fn stats(dispatched: u64, queue_ns: u64) -> pb::Statistics {
        let d = dispatches(dispatched, queue_ns, queue_ns / 2);
        pb::Statistics {
            sessions: vec![pb::SessionStatistics {
                session_id: 7,
                client_name: "worker".into(),
                uid: Some(1000),
                connected: true,
                dispatches: Some(d.clone()),
                ..Default::default()
            }],
            programs: vec![pb::ProgramStatistics {
                program_id: 3,
                name: "add".into(),
                dispatches: Some(d),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn at(s: Result<pb::Statistics, Refusal>, at: Instant) -> Sample {
        Sample {
            at,
            info: Ok(pb::DeviceInfo::default()),
            stats: s,
            programs: Ok(vec![pb::ProgramListing {
                program_id: 3,
                name: "add".into(),
                ..Default::default()
            }]),
        }
    }

    #[test]
    fn rates_come_from_the_difference_between_two_refreshes() {
        let t0 = Instant::now();
        let before = at(Ok(stats(100, 1_000)), t0);
        let now = at(Ok(stats(300, 201_000)), t0 + Duration::from_secs(2));
        let text = frame("unix:/x", 2.0, &now, Some(&before)).join("\n");
        // 200 dispatches in 2 s; 200 µs of queue time over 200 dispatches.
        assert!(text.contains("dispatches/s 100.0"), "{text}");
        assert!(text.contains("mean queue 1µs"), "{text}");
        let row = text.lines().find(|l| l.contains("worker")).unwrap();
        assert!(row.contains(" 300 ") && row.contains(" 100.0 "), "{row}");
        let prog = text.lines().find(|l| l.contains(" add ")).unwrap();
        assert!(prog.contains(" 300 ") && prog.contains(" 100.0 "), "{prog}");
    }

    fn class(
        class: pb::SessionClass,
        open: u32,
        dispatched: u64,
        queue_ns: u64,
        device_ns: u64,
        missed: u64,
    ) -> pb::ClassStatistics {
        pb::ClassStatistics {
            session_class: class.into(),
            open_sessions: open,
            dispatches: Some(dispatches(dispatched, queue_ns, device_ns)),
            deadline_missed: missed,
        }
    }

    #[test]
    fn class_lines_come_from_the_difference_between_two_refreshes() {
        use pb::SessionClass::{Batch, Interactive};
        let t0 = Instant::now();
        let mut before = stats(100, 1_000);
        before.classes = vec![
            class(Batch, 3, 1_000, 5_000_000, 9_000_000, 0),
            class(Interactive, 1, 50, 10_000, 1_000_000, 2),
        ];
        let mut now = stats(300, 201_000);
        // Over 2 s: batch 400 dispatches, 4 ms queued, 3 ms on the device; interactive 100
        // dispatches, 200 µs queued, 1 ms on the device: a quarter of the device's time.
        now.classes = vec![
            class(Batch, 3, 1_400, 9_000_000, 12_000_000, 0),
            class(Interactive, 1, 150, 210_000, 2_000_000, 5),
        ];
        let text = frame(
            "unix:/x",
            2.0,
            &at(Ok(now), t0 + Duration::from_secs(2)),
            Some(&at(Ok(before), t0)),
        )
        .join("\n");
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} line:\n{text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert!(text.contains("CLASS"), "{text}");
        assert_eq!(
            line("batch "),
            ["batch", "3", "200.0", "10µs", "75%", "0"],
            "{text}"
        );
        assert_eq!(
            line("interactive "),
            ["interactive", "1", "50.0", "2µs", "25%", "5"],
            "{text}"
        );
        // The first frame has no interval: counts only.
        let mut first = stats(1, 1);
        first.classes = vec![class(Interactive, 1, 1, 1, 1, 0)];
        let text = frame("unix:/x", 1.0, &at(Ok(first), t0), None).join("\n");
        let row = text.lines().find(|l| l.starts_with("interactive")).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["interactive", "1", "-", "-", "-", "0"]
        );
    }

    #[test]
    fn a_daemon_without_classes_gets_no_class_lines() {
        let t0 = Instant::now();
        let text = frame(
            "unix:/x",
            1.0,
            &at(Ok(stats(2, 2)), t0 + Duration::from_secs(1)),
            Some(&at(Ok(stats(1, 1)), t0)),
        )
        .join("\n");
        assert!(!text.contains("CLASS"), "{text}");
        assert!(text.contains("SESSION"), "{text}");
    }

    #[test]
    fn a_refused_session_table_is_explained_and_the_rest_is_shown() {
        let t0 = Instant::now();
        let denied =
            Refusal::Denied("GetStatistics failed (PERMISSION_DENIED): admins only".into());
        let now = at(Err(denied), t0);
        let text = frame("unix:/x", 1.0, &now, None).join("\n");
        assert!(
            text.contains("sessions: not shown: the daemon keeps them for its admins"),
            "{text}"
        );
        assert!(text.contains("PROGRAM"), "{text}");
        assert!(text.contains(" add "), "{text}");
    }
}

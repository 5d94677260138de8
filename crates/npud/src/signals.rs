//! Signals from the first instant: [`catch_early`] is the first thing `main` does, so that a
//! SIGHUP, SIGTERM or SIGINT that arrives while the configuration loads or the device opens
//! never takes the default action (which for all three ends the process).
//!
//! The handlers only set flags. Once the server runs, it installs tokio's handlers beside them
//! (both are kept: signal-hook's registry chains them) and asks [`terminate_requested`] whether
//! a SIGTERM or SIGINT came before it listened, in which case it shuts down at once. A SIGHUP
//! that came early is dropped: the TLS files it would reload are read after it anyway.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Set by the early handlers.
#[derive(Debug, Default)]
struct Early {
    terminate: Arc<AtomicBool>,
    hangup: Arc<AtomicBool>,
}

static EARLY: OnceLock<Early> = OnceLock::new();

/// Installs the flag-setting handlers for SIGHUP, SIGTERM and SIGINT (idempotent).
///
/// # Errors
/// The `sigaction` error, which the kernel gives only for an invalid signal number.
pub fn catch_early() -> std::io::Result<()> {
    if EARLY.get().is_some() {
        return Ok(());
    }
    let early = Early::default();
    signal_hook::flag::register(SIGHUP, early.hangup.clone())?;
    signal_hook::flag::register(SIGTERM, early.terminate.clone())?;
    signal_hook::flag::register(SIGINT, early.terminate.clone())?;
    let _ = EARLY.set(early);
    Ok(())
}

/// Whether a SIGTERM or SIGINT arrived since [`catch_early`].
pub fn terminate_requested() -> bool {
    EARLY
        .get()
        .is_some_and(|e| e.terminate.load(Ordering::SeqCst))
}

/// Whether a SIGHUP arrived since [`catch_early`].
pub fn hangup_seen() -> bool {
    EARLY.get().is_some_and(|e| e.hangup.load(Ordering::SeqCst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_early_sighup_sets_a_flag_and_the_process_lives() {
        catch_early().unwrap();
        catch_early().unwrap();
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::HUP)
            .unwrap();
        // Delivery to this process is asynchronous only across threads; wait for the flag.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !hangup_seen() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(hangup_seen());
        assert!(!terminate_requested());
    }
}

//! Rows 11: the same dispatch and chain through daemons whose emulator plays different ROCR
//! releases, side by side in one run (`npuctl bench --profile rocr-newest,kernel-object`).
//!
//! Each profile gets its own daemon (the emulator's profile is fixed for a process), with the
//! packet ABI found as on an NPU (`packet_abi = "auto"`). The rows alternate over rounds so that
//! a change in the machine's load falls on every profile alike. On a runtime that loads code
//! objects the noop design is measured twice: registered as PDI+insts (packed into an hsaco by
//! the daemon) and as an hsaco.

use crate::client::{Iters, Session, connect_unix};
use crate::daemon::Daemon;
use crate::report::{Report, Row};
use crate::rows::{MIN_ROUND_WARMUP, Ready};
use crate::stats::Acc;
use crate::{BenchError, Result};

/// Profiles compared when `--profile` is not given.
pub const DEFAULT: [&str; 2] = ["rocr-newest", "kernel-object"];

/// Links per chain in these rows.
const LINKS: usize = 32;

/// The key of a profile's row: `profile_<profile>_<what>`.
#[must_use]
pub fn key(profile: &str, what: &str) -> String {
    format!("profile_{profile}_{what}")
}

struct Contender {
    label: String,
    key: String,
    ready: Ready,
    one: Acc,
    link: Acc,
}

/// Runs the rows for `profiles`, `rounds` rounds of `it` split between them.
///
/// # Errors
/// When a daemon cannot be started or a dispatch fails.
pub async fn rows(
    report: &mut Report,
    profiles: &[String],
    it: Iters,
    rounds: usize,
) -> Result<()> {
    let mut daemons = Vec::new();
    let mut all = Vec::new();
    for p in profiles {
        let d = Daemon::start_with(Some(p), &[]).map_err(|e| BenchError(format!("{p}: {e}")))?;
        let session = Session::open(connect_unix(&d.socket).await?, "bench-profile").await?;
        let abi = session_abi(&session).await?;
        let forms: &[bool] = if abi == "kernel-object" {
            &[false, true]
        } else {
            &[false]
        };
        for &hsaco in forms {
            let session = Session::open(connect_unix(&d.socket).await?, "bench-profile").await?;
            let (label, what) = if hsaco {
                (format!("{p} ({abi}), hsaco"), "hsaco")
            } else {
                (format!("{p} ({abi})"), "pdi_insts")
            };
            all.push(Contender {
                label,
                key: key(p, what),
                ready: Ready::with_form(session, true, hsaco).await?,
                one: Acc::default(),
                link: Acc::default(),
            });
        }
        daemons.push(d);
    }
    let round = Iters {
        warmup: (it.warmup / rounds).max(MIN_ROUND_WARMUP),
        measured: (it.measured / rounds).max(1),
    };
    let chain_round = round.scaled_down(8);
    for _ in 0..rounds {
        for c in &mut all {
            c.one.add(c.ready.dispatches(round).await?);
            c.link
                .add(c.ready.chain_link_samples(LINKS, chain_round).await?);
        }
    }
    for c in all {
        report.rows.push(Row::new(
            "11",
            &format!("{}_dispatch", c.key),
            &format!("npud dispatch over a Unix socket on {}", c.label),
            c.one.summary(),
        ));
        let mut r = Row::new(
            "11",
            &format!("{}_chain32_link", c.key),
            &format!("npud chain of {LINKS} on {}: per link", c.label),
            c.link.summary_of(LINKS as u64),
        );
        r.links = Some(LINKS);
        report.rows.push(r);
    }
    for mut d in daemons {
        d.stop();
    }
    Ok(())
}

async fn session_abi(s: &Session) -> Result<String> {
    let mut c = s.client.clone();
    Ok(c.get_device_info(npu_proto::v1::GetDeviceInfoRequest {})
        .await?
        .into_inner()
        .packet_abi)
}

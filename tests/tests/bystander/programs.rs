//! The program store: sessions that register as many distinct programs as they may and then
//! list and count them without pause. Each program is a 304-byte emulated design, so the byte
//! quota alone would let one session store some 220,000 (each costing the daemon its
//! bookkeeping beside its bytes), and every registration, listing and session end walked every
//! stored program under the store's lock, which the executor takes for each dispatch.
//! `limits.max_programs_per_session` bounds what one session holds, and the store keeps what
//! each session references, so no operation under its lock walks other sessions' programs.

use std::time::Instant;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::bystander::{Stand, status_bytes};
use npud_e2e::{Options, Session};
use tonic::Code;

use crate::last_round::FLOOD;

/// `limits.max_programs_per_session`'s default.
const MOST: usize = 1024;
/// Sessions filling the store.
const SESSIONS: usize = 4;

/// A design of its own bytes for each `k`: the scalar is part of the PDI.
fn design(k: usize) -> EmuDesign {
    EmuDesign::vector_scalar_add(1024, DType::I32, 1_000 + k as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_holding_all_the_programs_they_may_list_them_without_pause() {
    let stand = Stand::start(Options::default()).await;
    let pid = stand.pid();
    let before = status_bytes(pid, "VmRSS").unwrap_or(0);
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let mut s = Session::open(stand.daemon.connect().await, &format!("programs-{i}"))
            .await
            .unwrap();
        // Up to the limit, and one past it: refused with the key named.
        for k in 0..MOST {
            s.register(&design(i * 10_000 + k))
                .await
                .unwrap_or_else(|e| panic!("session {i}, program {k}: {e}"));
        }
        let e = s.register(&design(i * 10_000 + MOST)).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message().contains("limits.max_programs_per_session"),
            "{e:?}"
        );
        sessions.push(s);
    }
    let after = status_bytes(pid, "VmRSS").unwrap_or(0);
    let stored = (SESSIONS * MOST) as u64;
    let per_program = after.saturating_sub(before) / stored;
    eprintln!(
        "programs: {stored} stored; the daemon's RSS {} -> {} KiB, {per_program} bytes a program",
        before >> 10,
        after >> 10
    );
    // Its bytes, its hash, its summary and the store's maps: a few hundred bytes beside the
    // program's own, never the many kilobytes that would make the count limit moot.
    assert!(
        per_program <= 4096,
        "each stored program costs the daemon {per_program} bytes of memory"
    );

    let attack = async {
        let started = Instant::now();
        let tasks: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    let mut round = 0;
                    while started.elapsed() < FLOOD {
                        round += 1;
                        let listed = every_listed(&mut s).await;
                        let counted = every_counted(&mut s).await;
                        // One more, and bytes it holds already (costing nothing).
                        let more = s.register(&design(i * 10_000 + MOST + round)).await;
                        let again = s.register(&design(i * 10_000 + round % MOST)).await;
                        answers.push((
                            listed,
                            counted,
                            more.map(|_| ())
                                .map_err(|e| (e.code(), e.message().to_owned())),
                            again
                                .map(|_| ())
                                .map_err(|e| (e.code(), e.message().to_owned())),
                        ));
                    }
                    answers
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.extend(t.await.expect("an attacker"));
        }
        out
    };
    stand
        .attack(
            "4 sessions at 1,024 programs each listing (every page, asking for all at once), \
             counting and registering without pause",
            attack,
        )
        .await
        .expect(
            "answers (listings of 1,024 in pages of at most 256; one more RESOURCE_EXHAUSTED \
             naming the limit; held bytes OK)",
            |answers| {
                for (listed, counted, more, again) in answers {
                    // The statistics hold every program the caller's identity may see (for an
                    // admin, every stored one): at least the session's own.
                    if *listed != Ok(MOST) || !counted.as_ref().is_ok_and(|n| *n >= MOST) {
                        return Err(format!("listed {listed:?}, counted {counted:?}"));
                    }
                    match more {
                        Err((Code::ResourceExhausted, m))
                            if m.contains("limits.max_programs_per_session") => {}
                        other => return Err(format!("one more program: {other:?}")),
                    }
                    if let Err(e) = again {
                        return Err(format!("bytes it holds again: {e:?}"));
                    }
                }
                Ok(format!("{} rounds", answers.len()))
            },
        )
        .finish();
}

/// The most programs one page of a listing holds (`Page::MAX` in npud).
const PAGE: usize = 256;

/// A call's failure as the answers keep it.
type Failed = (Code, String);

/// Walks the pages `page(after)` gives (its programs, and the cursor of the next page, 0 on the
/// last): how many programs they held, or the first page that held more than [`PAGE`].
async fn every_page<F, Fut>(mut page: F) -> Result<usize, Failed>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(usize, u64), tonic::Status>>,
{
    let (mut n, mut after) = (0, 0);
    loop {
        let (held, next) = page(after)
            .await
            .map_err(|e| (e.code(), e.message().to_owned()))?;
        if held > PAGE {
            return Err((Code::Ok, format!("a page of {held}")));
        }
        n += held;
        if next == 0 {
            return Ok(n);
        }
        after = next;
    }
}

/// Every page of the session's listing, each asked for whole (`max_programs` at its largest).
async fn every_listed(s: &mut Session) -> Result<usize, Failed> {
    every_page(|after| {
        let (mut c, req) = (
            s.client.clone(),
            s.req(pb::ListProgramsRequest {
                after_program_id: after,
                max_programs: u32::MAX,
                ..Default::default()
            }),
        );
        async move {
            let p = c.list_programs(req).await?.into_inner();
            Ok((p.programs.len(), p.next_after_program_id))
        }
    })
    .await
}

/// Every page of the statistics' programs, each asked for whole.
async fn every_counted(s: &mut Session) -> Result<usize, Failed> {
    every_page(|after| {
        let (mut c, req) = (
            s.client.clone(),
            s.req(pb::GetStatisticsRequest {
                programs_after: after,
                max_programs: u32::MAX,
            }),
        );
        async move {
            let p = c.get_statistics(req).await?.into_inner();
            Ok((p.programs.len(), p.next_programs_after))
        }
    })
    .await
}

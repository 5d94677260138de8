//! Last round's hostile findings (issues 19 and 20) that still apply, beside the bystander: an
//! 8 MiB hsaco built to make the parser's cost explode (issue 19, 1), a client allocating and
//! freeing tensors as fast as it can (19, 8), and chains queued from several sessions at once
//! (19, 10: RSS grew to 2.5 GiB). Strangers holding connections (20, 1) are in `lockouts.rs`, an
//! fd whose close blocks on the fd socket (19, 9) in `lifeline.rs`.

use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npu_proto::v1::npud_client::NpudClient;
use npud_e2e::bystander::Stand;
use npud_e2e::{Options, Session, raw_unary};
use prost::Message;
use tonic::Code;

/// The chain method's path, for calls whose request is encoded once.
const CHAIN: &str = "/npud.v1.Npud/Chain";

/// How long the attackers keep going.
pub(crate) const FLOOD: Duration = Duration::from_secs(3);

/// The file from issue 19 (as `hostile.rs` builds it): exactly 8 MiB, an ELF64 whose 65535
/// section headers all name one string of almost 4 MiB; with `aie` the headers are also AIE
/// sections (one shared 48-byte `AIEK` header).
fn issue_19_hsaco(aie: bool) -> Vec<u8> {
    const TOTAL: usize = 8 << 20;
    let count = usize::from(u16::MAX);
    let shoff = TOTAL - count * 64;
    let stub_at = shoff - 48;
    let names = stub_at - 64;
    let mut f = vec![0u8; TOTAL];
    let put = |f: &mut [u8], at: usize, v: &[u8]| f[at..at + v.len()].copy_from_slice(v);
    put(&mut f, 0, b"\x7fELF\x02\x01\x01");
    put(&mut f, 16, &1u16.to_le_bytes());
    put(&mut f, 18, &224u16.to_le_bytes());
    put(&mut f, 40, &(shoff as u64).to_le_bytes());
    put(&mut f, 52, &64u16.to_le_bytes());
    put(&mut f, 58, &64u16.to_le_bytes());
    put(&mut f, 60, &u16::MAX.to_le_bytes());
    put(&mut f, 62, &0u16.to_le_bytes());
    f[64..64 + names - 1].fill(b'A');
    put(&mut f, stub_at, b"AIEK\x01\x00\x00\x00\x30\x00\x00\x00");
    put(&mut f, stub_at + 16, &44u32.to_le_bytes());
    for i in 0..count {
        let h = shoff + i * 64;
        let (ty, off, size) = match (i, aie) {
            (0, _) => (3u32, 64usize, names),
            (_, true) => (1, stub_at, 48),
            (_, false) => (1, 64, names),
        };
        put(&mut f, h + 4, &ty.to_le_bytes());
        put(&mut f, h + 24, &(off as u64).to_le_bytes());
        put(&mut f, h + 32, &(size as u64).to_le_bytes());
    }
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hsacos_built_to_explode_the_parsers_cost() {
    let stand = Stand::start(Options::default()).await;
    let mut attackers = Vec::new();
    for i in 0..2 {
        attackers.push(
            Session::open(stand.daemon.connect().await, &format!("hsaco-{i}"))
                .await
                .unwrap(),
        );
    }
    let attack = async {
        let started = Instant::now();
        let tasks: Vec<_> = attackers
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                tokio::spawn(async move {
                    let file = issue_19_hsaco(i % 2 == 1);
                    let mut codes = Vec::new();
                    while started.elapsed() < FLOOD {
                        let r = s.register_hsaco(file.clone(), "", "issue-19").await;
                        codes.push(match r {
                            Ok(_) => (Code::Ok, String::new()),
                            Err(e) => (e.code(), e.message().to_owned()),
                        });
                    }
                    (i % 2 == 1, codes)
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("an attacker"));
        }
        out
    };
    stand
        .attack(
            "8 MiB hsacos of 65,535 headers sharing a 4 MiB name",
            attack,
        )
        .await
        .expect(
            "answers (INVALID_ARGUMENT; FAILED_PRECONDITION with AIE sections)",
            |attackers| {
                let mut seen = Vec::new();
                for (aie, codes) in attackers {
                    let want = if *aie {
                        Code::FailedPrecondition
                    } else {
                        Code::InvalidArgument
                    };
                    seen.push(format!("{} x {:?}", codes.len(), want));
                    if let Some((c, m)) = codes
                        .iter()
                        .find(|(c, m)| *c != want || !m.contains("hsaco container"))
                    {
                        return Err(format!(
                            "expected {want:?} naming the hsaco container, got {c:?}: {m}"
                        ));
                    }
                }
                Ok(seen.join(", "))
            },
        )
        .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_allocating_and_freeing_tensors_without_pause() {
    let stand = Stand::start(Options::default()).await;
    let mut s = Session::open(stand.daemon.connect().await, "churn")
        .await
        .unwrap();
    // Half of limits.max_total_tensor_bytes, the largest the budgets let it take twice.
    let size = stand.budgets.max_total_tensor_bytes / 2;
    let attack = async {
        let started = Instant::now();
        let mut answers = Vec::new();
        while started.elapsed() < FLOOD {
            let r = s
                .client
                .allocate_tensor(s.req(pb::AllocateTensorRequest {
                    size_bytes: size,
                    name: String::new(),
                }))
                .await;
            match r {
                Ok(t) => {
                    let id = t.into_inner().tensor_id;
                    let f = s
                        .client
                        .free_tensor(s.req(pb::FreeTensorRequest { tensor_id: id }))
                        .await;
                    answers.push(
                        f.map(|_| ())
                            .map_err(|e| (e.code(), e.message().to_owned())),
                    );
                }
                Err(e) => answers.push(Err((e.code(), e.message().to_owned()))),
            }
        }
        answers
    };
    stand
        .attack(
            "allocating and freeing 32 MiB tensors without pause",
            attack,
        )
        .await
        .expect("answers (OK)", |answers| {
            let failed: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
            let seen = format!(
                "{} allocations and frees, {} refused",
                answers.len(),
                failed.len()
            );
            match failed.first() {
                None => Ok(seen),
                Some((c, m)) => Err(format!("{seen}, the first {c:?}: {m}")),
            }
        })
        .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_of_1024_links_of_64_arguments_queued_from_four_sessions() {
    let stand = Stand::start(Options::default()).await;
    let mut sessions = Vec::new();
    for i in 0..4 {
        let channel = stand.daemon.channel().await;
        let mut s = Session::open(NpudClient::new(channel.clone()), &format!("chains-{i}"))
            .await
            .unwrap();
        let p = s
            .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 3))
            .await
            .unwrap()
            .program_id;
        let a = s.alloc_mapped(4096).await.unwrap();
        let b = s.alloc_mapped(4096).await.unwrap();
        sessions.push((s, channel, p, a, b));
    }
    let attack = async {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for (s, channel, p, a, b) in &sessions {
            // 64 arguments (the most a dispatch may pass; the program reads the first two).
            let args: Vec<u64> = (0..64)
                .map(|k| if k % 2 == 0 { a.id } else { b.id })
                .collect();
            let link = npud_e2e::dispatch_request(*p, &args);
            // Encoded once: building and encoding 1,024 links took this (debug) client about
            // 20 ms of CPU a chain, two of the machine's cores between the attackers, and on a
            // VM two busy vCPUs are what the host preempts (its slices stalled the daemon's and
            // the bystander's threads 2-4 ms at a time).
            let chain = pb::ChainRequest {
                links: vec![link; 1024],
            }
            .encode_to_vec();
            for _ in 0..16 {
                let (s, channel, chain) = (s.clone(), channel.clone(), chain.clone());
                tasks.push(tokio::spawn(async move {
                    let mut answers = Vec::new();
                    while started.elapsed() < FLOOD {
                        let r = raw_unary(channel.clone(), CHAIN, s.req(chain.clone())).await;
                        answers.push(match r.map(|b| pb::ChainResponse::decode(&*b)) {
                            Ok(Ok(c)) if c.failure.is_none() => (Code::Ok, String::new()),
                            Ok(Ok(c)) => (Code::Internal, format!("{:?}", c.failure)),
                            Ok(Err(e)) => (Code::Internal, format!("an undecodable answer: {e}")),
                            Err(e) => (e.code(), e.message().to_owned()),
                        });
                    }
                    answers
                }));
            }
        }
        let mut out = Vec::new();
        for t in tasks {
            out.extend(t.await.expect("an attacker"));
        }
        out
    };
    stand
        .attack("4 sessions x 16 chains of 1024 links x 64 args", attack)
        .await
        .expect(
            "answers (OK, or RESOURCE_EXHAUSTED naming a limit)",
            |answers| {
                let ok = answers.iter().filter(|(c, _)| *c == Code::Ok).count();
                let refused: Vec<_> = answers.iter().filter(|(c, _)| *c != Code::Ok).collect();
                let seen = format!("{ok} chains ran, {} refused", refused.len());
                match refused
                    .iter()
                    .find(|(c, m)| *c != Code::ResourceExhausted || !m.contains("limits."))
                {
                    None => Ok(format!(
                        "{seen}{}",
                        refused
                            .first()
                            .map(|(_, m)| format!(", the first: {m}"))
                            .unwrap_or_default()
                    )),
                    Some((c, m)) => Err(format!("{seen}; {c:?}: {m}")),
                }
            },
        )
        .finish();
}

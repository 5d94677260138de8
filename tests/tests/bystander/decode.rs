//! Bounded before allocation: gzip messages of millions of empty repeated fields, about 32 KB
//! on the wire, that decode into hundreds of MiB of structs (a `Chain` of 16.7 M empty links, a
//! `Dispatch` of 16.7 M empty `TensorArg`s), from a caller nobody authenticated (plaintext
//! loopback TCP, as a user the Unix socket's mode keeps out: `anonymous`, no certificate, no
//! token) and from a session on the Unix socket; and a `Submit` stream of four such messages
//! against `limits.max_queued_request_bytes`. Four attackers at a time, each sending again as
//! soon as it is answered, for 3 s.

use std::future::Future;
use std::time::{Duration, Instant};

use npu_proto::v1 as pb;
use npud_e2e::bystander::creds::{Caller, tokio_tcp};
use npud_e2e::bystander::wire::{
    Answer, chain_of_empty_links, dispatch_of_empty_args, fitting, grpc_frame, h2_call,
    submit_of_empty_args,
};
use npud_e2e::bystander::{Budgets, Stand, Verdict, mib};
use npud_e2e::{Options, Session};
use tonic::Code;

use crate::{CALL_LIMIT, session_headers};

/// Attackers sending at once.
const ATTACKERS: usize = 4;
/// How long they keep sending.
const FLOOD: Duration = Duration::from_secs(3);
/// The uid of the unauthenticated caller: one the Unix socket's mode (0660, root's) keeps out,
/// so over loopback TCP it is `anonymous`.
const STRANGER: u32 = 65534;

/// The largest message the transport takes (twice `limits.max_message_bytes`).
fn transport_limit() -> u64 {
    2 * Budgets::default().max_message_bytes
}

/// Runs `ATTACKERS` loops of `one` for `FLOOD`, each call after the last one's answer.
async fn flood<F, Fut>(one: F) -> Vec<Answer>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Answer> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..ATTACKERS)
        .map(|_| {
            let one = one.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while started.elapsed() < FLOOD {
                    let a = one().await;
                    let dead = a.code.is_none();
                    answers.push(a);
                    if dead {
                        // No status: the daemon is gone or refuses to talk. Once more at most.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        answers.push(one().await);
                        break;
                    }
                }
                answers
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("an attacker"));
    }
    all
}

/// Every answer has `code`, and its message contains `text` (when given).
fn all_answered(answers: &[Answer], code: Code, text: &[&str]) -> Result<String, String> {
    let seen = format!(
        "{} answers, the first {}",
        answers.len(),
        answers[0].describe()
    );
    for a in answers {
        let text_ok = text.is_empty() || text.iter().any(|t| a.message.contains(t));
        if a.tonic_code() != Some(code) || !text_ok {
            return Err(format!(
                "{seen}; expected {code:?}{} for every one, got {}",
                if text.is_empty() {
                    String::new()
                } else {
                    format!(" naming {text:?}")
                },
                a.describe()
            ));
        }
    }
    Ok(seen)
}

/// A daemon with plaintext loopback TCP.
async fn stand() -> Stand {
    Stand::start(Options {
        tcp: true,
        ..Options::default()
    })
    .await
}

/// An uncompressed message of exactly `len` bytes that decodes to an empty request: one
/// unknown length-delimited field (15) of zeros.
fn plain_of_len(len: usize) -> Vec<u8> {
    let varint = |mut n: usize| {
        let mut v = Vec::new();
        while n >= 0x80 {
            v.push(u8::try_from(n & 0x7f).expect("7 bits") | 0x80);
            n >>= 7;
        }
        v.push(u8::try_from(n).expect("under 0x80"));
        v
    };
    let mut payload = len.saturating_sub(2);
    while 1 + varint(payload).len() + payload > len {
        payload -= 1;
    }
    let mut m = vec![(15 << 3) | 2];
    m.extend(varint(payload));
    m.resize(m.len() + payload, 0);
    m
}

/// One call from the stranger over loopback TCP, with `message` gzip-compressed (`gzip`) or
/// as it is.
fn from_stranger(
    stand: &Stand,
    path: &'static str,
    message: Vec<u8>,
    gzip: bool,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Answer> + Send>> + Clone + Send + 'static {
    let addr = stand.daemon.tcp.expect("TCP");
    let frame = std::sync::Arc::new(grpc_frame(&message, gzip));
    let headers = if gzip {
        vec![("grpc-encoding", "gzip".to_owned())]
    } else {
        Vec::new()
    };
    move || {
        let (frame, headers) = (frame.clone(), headers.clone());
        Box::pin(async move {
            let conn = tokio::task::spawn_blocking(move || {
                Caller::user(STRANGER)
                    .tcp(None, addr, 1)
                    .pop()
                    .expect("one")
            })
            .await
            .expect("connecting");
            match conn {
                Ok(s) => h2_call(tokio_tcp(s), path, &headers, frame.to_vec(), CALL_LIMIT).await,
                Err(e) => Answer {
                    error: Some(format!("connect: {e}")),
                    ..Answer::default()
                },
            }
        })
    }
}

/// One call in session `s` on the Unix socket whose request body is `body`: gzip-compressed
/// [`grpc_frame`]s.
fn in_session(
    stand: &Stand,
    s: &Session,
    path: &'static str,
    body: Vec<u8>,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Answer> + Send>> + Clone + Send + 'static {
    let socket = stand.daemon.socket.clone();
    let mut headers = session_headers(s);
    headers.push(("grpc-encoding", "gzip".to_owned()));
    let frame = std::sync::Arc::new(body);
    move || {
        let (frame, headers, socket) = (frame.clone(), headers.clone(), socket.clone());
        Box::pin(async move {
            match tokio::net::UnixStream::connect(&socket).await {
                Ok(s) => h2_call(s, path, &headers, frame.to_vec(), CALL_LIMIT).await,
                Err(e) => Answer {
                    error: Some(format!("connect: {e}")),
                    ..Answer::default()
                },
            }
        })
    }
}

/// The same flood as `call`'s from the stranger with an uncompressed message of the same wire
/// size, on the same daemon: what connecting, being refused and the bystander's own traffic
/// cost in the daemon's peak RSS, which [`unauthenticated_cost`] sets its bound above. On a
/// loaded machine the connections closed but not yet reaped make that vary by a few hundred
/// KiB between runs, so the control itself is held to twice the bound; the decoders' own cost
/// per message is measured exactly, in process, by `crates/npud/tests/decode_cost.rs`.
async fn control_cost(stand: &Stand, path: &'static str, wire: usize) -> u64 {
    let call = from_stranger(stand, path, plain_of_len(wire), false);
    let v = stand
        .attack("the same size uncompressed, anonymous TCP", flood(call))
        .await;
    let cost = v.peak_rss.saturating_sub(v.idle_rss);
    let bound = 2 * ATTACKERS as u64 * (wire as u64 * 8 + (1 << 20));
    v.expect("memory the uncompressed requests cost", |_| {
        let seen = format!(
            "peak - idle {} for {ATTACKERS} requests of {wire} bytes at once (at most {})",
            mib(cost),
            mib(bound)
        );
        if cost <= bound { Ok(seen) } else { Err(seen) }
    })
    .expect("answer (a status)", |a| {
        match a.iter().find(|a| a.tonic_code().is_none()) {
            None => Ok(format!(
                "{} answers, the first {}",
                a.len(),
                a[0].describe()
            )),
            Some(a) => Err(a.describe()),
        }
    })
    .finish();
    cost
}

/// The bound for a caller nobody authenticated: at most its wire size x 8 + 1 MiB, for
/// each of the attackers' requests in flight at once, above `control` (what the same traffic
/// uncompressed cost, [`control_cost`]).
fn unauthenticated_cost(
    v: Verdict<Vec<Answer>>,
    wire: usize,
    control: u64,
) -> Verdict<Vec<Answer>> {
    let cost = v.peak_rss.saturating_sub(v.idle_rss);
    let per_requests = ATTACKERS as u64 * (wire as u64 * 8 + (1 << 20));
    let bound = control + per_requests;
    v.expect("memory an unauthenticated request costs", |_| {
        let seen = format!(
            "peak - idle {} for {ATTACKERS} requests of {wire} bytes at once (at most {} above \
             the uncompressed run's {})",
            mib(cost),
            mib(per_requests),
            mib(control)
        );
        if cost <= bound { Ok(seen) } else { Err(seen) }
    })
}

#[cfg_attr(
    not(as_root),
    ignore = "needs root to be a user the Unix socket's mode keeps out"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_chain_of_16m_empty_links_from_an_unauthenticated_tcp_caller() {
    let stand = stand().await;
    let body = chain_of_empty_links(fitting(transport_limit(), 16));
    let wire = body.len();
    let control = control_cost(&stand, "/npud.v1.Npud/Chain", wire).await;
    let call = from_stranger(&stand, "/npud.v1.Npud/Chain", body, true);
    let v = stand
        .attack("gzip Chain, 16.7 M links, anonymous TCP", flood(call))
        .await;
    unauthenticated_cost(v, wire, control)
        .expect("answer (UNAUTHENTICATED)", |a| {
            all_answered(a, Code::Unauthenticated, &[])
        })
        .finish();
}

#[cfg_attr(
    not(as_root),
    ignore = "needs root to be a user the Unix socket's mode keeps out"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_dispatch_of_16m_empty_args_from_an_unauthenticated_tcp_caller() {
    let stand = stand().await;
    let body = dispatch_of_empty_args(fitting(transport_limit(), 16));
    let wire = body.len();
    let control = control_cost(&stand, "/npud.v1.Npud/Dispatch", wire).await;
    let call = from_stranger(&stand, "/npud.v1.Npud/Dispatch", body, true);
    let v = stand
        .attack("gzip Dispatch, 16.7 M args, anonymous TCP", flood(call))
        .await;
    unauthenticated_cost(v, wire, control)
        .expect("answer (UNAUTHENTICATED)", |a| {
            all_answered(a, Code::Unauthenticated, &[])
        })
        .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_chain_of_16m_empty_links_from_a_unix_session() {
    let stand = stand().await;
    let s = Session::open(stand.daemon.connect().await, "attacker")
        .await
        .unwrap();
    let body = grpc_frame(&chain_of_empty_links(fitting(transport_limit(), 16)), true);
    let call = in_session(&stand, &s, "/npud.v1.Npud/Chain", body);
    stand
        .attack("gzip Chain, 16.7 M links, Unix session", flood(call))
        .await
        .expect(
            "answer (RESOURCE_EXHAUSTED naming the inflate bound)",
            |a| all_answered(a, Code::ResourceExhausted, &["may inflate to at most"]),
        )
        .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_dispatch_of_16m_empty_args_from_a_unix_session() {
    let stand = stand().await;
    let s = Session::open(stand.daemon.connect().await, "attacker")
        .await
        .unwrap();
    let body = grpc_frame(
        &dispatch_of_empty_args(fitting(transport_limit(), 16)),
        true,
    );
    let call = in_session(&stand, &s, "/npud.v1.Npud/Dispatch", body);
    stand
        .attack("gzip Dispatch, 16.7 M args, Unix session", flood(call))
        .await
        .expect(
            "answer (RESOURCE_EXHAUSTED naming the inflate bound)",
            |a| all_answered(a, Code::ResourceExhausted, &["may inflate to at most"]),
        )
        .finish();
}

/// A Submit stream's items and end, as (request id, code, message) and the stream's status.
fn submit_outcome(a: &Answer) -> (Vec<(u64, i32, String)>, String) {
    let items = a
        .messages
        .iter()
        .filter_map(|m| prost::Message::decode(&m[..]).ok())
        .map(|r: pb::SubmitResponse| (r.request_id, r.code, r.message))
        .collect();
    (items, a.describe())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_stream_of_four_gzip_messages_of_16m_args_is_held_to_the_queued_bytes_budget() {
    let stand = stand().await;
    let s = Session::open(stand.daemon.connect().await, "attacker")
        .await
        .unwrap();
    let args = fitting(transport_limit(), 16);
    let mut body = Vec::new();
    for id in 1..=4 {
        body.extend(grpc_frame(&submit_of_empty_args(id, args), true));
    }
    let call = in_session(&stand, &s, "/npud.v1.Npud/Submit", body);
    stand
        .attack(
            "Submit stream of 4 gzip messages, 16.7 M args each",
            flood(call),
        )
        .await
        .expect(
            "answers (each item or the stream refused, naming the limit)",
            |answers| {
                let first = submit_outcome(&answers[0]);
                let seen = format!(
                    "{} streams, the first: items {:?}, ended {}",
                    answers.len(),
                    first
                        .0
                        .iter()
                        .map(|(id, c, m)| format!("{id}: {:?} {m}", Code::from_i32(*c)))
                        .collect::<Vec<_>>(),
                    first.1
                );
                for a in answers {
                    let (items, _) = submit_outcome(a);
                    // The stream ends with a status; a refused message ends it with
                    // RESOURCE_EXHAUSTED or INVALID_ARGUMENT naming its index, and a refused
                    // item is answered INVALID_ARGUMENT naming its args.
                    let end_ok = match a.tonic_code() {
                        Some(Code::Ok) => true,
                        Some(Code::ResourceExhausted | Code::InvalidArgument) => {
                            a.message.contains("message ")
                                && (a.message.contains("limits.") || a.message.contains("args"))
                        }
                        _ => false,
                    };
                    let items_ok = items.iter().all(|(_, c, m)| {
                        let c = Code::from_i32(*c);
                        (c == Code::InvalidArgument && m.contains("args"))
                            || (c == Code::ResourceExhausted && m.contains("limits."))
                    });
                    if !end_ok || !items_ok || (items.len() < 4 && a.tonic_code() == Some(Code::Ok))
                    {
                        return Err(seen);
                    }
                }
                Ok(seen)
            },
        )
        .finish();
}

//! Revocation reaches every transport: a token identity (`auth.token_dir`) keeps submitting
//! work through its dispatch ring, a `Submit` stream, or unary `Dispatch` calls (eight in
//! flight at a time), and its token file is removed. The README: "A removed or rewritten file
//! stops working within one interval: new calls are `UNAUTHENTICATED`, and calls still open
//! with it ... end `UNAUTHENTICATED`". Each test asserts that no work of the identity is
//! answered OK later than one `auth.token_poll_ms` (250 ms) after the removal, plus 100 ms for
//! the test's own observation of it, and that its work is then refused `UNAUTHENTICATED` (a
//! ring may instead be closed, which also ends it; a new call with the removed secret may wait
//! for the next directory read before it is refused).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::bystander::Stand;
use npud_e2e::tokens::{TokenDir, secret};
use npud_e2e::{Mapped, Options, Session, dispatch_request};
use tonic::Code;

const POLL: Duration = Duration::from_millis(250);
/// What the test adds to the poll interval: its own wake-up after the daemon's answer.
const SLACK: Duration = Duration::from_millis(100);
/// How long the identity keeps trying after the removal.
const AFTER: Duration = Duration::from_millis(1500);
const POD: &str = "pod";

/// One answer to the identity's work.
#[derive(Debug, Clone)]
struct Answered {
    at: Instant,
    code: Code,
    message: String,
}

#[derive(Debug, Default)]
struct Record {
    answers: Mutex<Vec<Answered>>,
    stop: AtomicBool,
}

impl Record {
    fn push(&self, code: Code, message: String) {
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Answered {
                at: Instant::now(),
                code,
                message,
            });
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// A daemon with a token directory holding `POD`'s file, polled every 250 ms.
async fn stand() -> (Stand, TokenDir) {
    let tokens = TokenDir::new(&[POD]);
    let stand = Stand::start(
        Options::default()
            .env("NPUD_AUTH__TOKEN_DIR", &tokens.path().display().to_string())
            .env("NPUD_AUTH__TOKEN_POLL_MS", &POLL.as_millis().to_string()),
    )
    .await;
    (stand, tokens)
}

/// The token identity's session, with a program and two tensors.
async fn pod(stand: &Stand) -> (Session, u64, Mapped, Mapped) {
    let mut s = Session::open_as(stand.daemon.connect().await, POD, Some(&secret(POD)))
        .await
        .unwrap();
    let program = s
        .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let a = s.alloc_mapped(4096).await.unwrap();
    let b = s.alloc_mapped(4096).await.unwrap();
    (s, program, a, b)
}

/// Removes the token file, lets the identity go on for `AFTER`, stops it; returns when the
/// file was removed.
async fn revoke(tokens: &TokenDir, record: &Record) -> Instant {
    // Its work is under way: answers are coming.
    let until = Instant::now() + Duration::from_secs(10);
    while record
        .answers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .len()
        < 10
    {
        assert!(
            Instant::now() < until,
            "the identity's work is not answered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let removed = Instant::now();
    std::fs::remove_file(tokens.path().join(POD)).expect("remove the token file");
    tokio::time::sleep(AFTER).await;
    record.stop.store(true, Ordering::SeqCst);
    removed
}

/// Whether the identity's work ended within the poll interval: nothing answered OK after it,
/// and a refusal with an accepted code.
fn ended(record: &Record, removed: Instant, accepted: &[Code]) -> Result<String, String> {
    let answers = record
        .answers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let deadline = removed + POLL + SLACK;
    let ms = |t: Instant| -> i128 {
        if t >= removed {
            (t - removed).as_millis() as i128
        } else {
            -((removed - t).as_millis() as i128)
        }
    };
    let last_ok = answers
        .iter()
        .filter(|a| a.code == Code::Ok)
        .map(|a| a.at)
        .max();
    let late_ok = answers
        .iter()
        .filter(|a| a.code == Code::Ok && a.at > deadline)
        .count();
    let first_refusal = answers
        .iter()
        .find(|a| a.code != Code::Ok && a.at >= removed);
    let seen = format!(
        "{} answers; the last OK at {} ms after the removal, {late_ok} OK later than {} ms; the \
         first refusal {}",
        answers.len(),
        last_ok.map_or("-".into(), |t| ms(t).to_string()),
        (POLL + SLACK).as_millis(),
        first_refusal.map_or("none".into(), |a| format!(
            "at {} ms: {:?} {}",
            ms(a.at),
            a.code,
            a.message
        ))
    );
    // A call the daemon no longer admits may still wait for its refusal (an unknown secret
    // waits for the next directory read); what must end within the interval is admitted work.
    let refused_ok = first_refusal.is_some_and(|a| accepted.contains(&a.code));
    if late_ok == 0 && refused_ok {
        Ok(seen)
    } else {
        Err(seen)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_ends_its_dispatch_ring() {
    let (stand, tokens) = stand().await;
    let (mut s, program, a, b) = pod(&stand).await;
    s.attach_ring().await.unwrap();
    let ring = s.ring.clone().expect("a ring");
    let record = Arc::new(Record::default());
    let pump = {
        let record = record.clone();
        let d = dispatch_request(program, &[a.id, b.id]);
        std::thread::spawn(move || {
            while !record.stopped() {
                match ring.dispatch(&d, Duration::from_secs(5)) {
                    Ok(_) => record.push(Code::Ok, String::new()),
                    Err(e) => {
                        record.push(e.code(), e.message().to_owned());
                        if e.message().contains("ring closed") {
                            break;
                        }
                    }
                }
            }
        })
    };
    let attack = async {
        let removed = revoke(&tokens, &record).await;
        tokio::task::spawn_blocking(move || pump.join())
            .await
            .expect("joining")
            .expect("the ring's client");
        removed
    };
    stand
        .attack("a revoked token's dispatch ring", attack)
        .await
        .expect("ended within one poll interval", |removed| {
            // The ring's client reports a closed ring as UNAVAILABLE.
            ended(
                &record,
                *removed,
                &[Code::Unauthenticated, Code::Unavailable],
            )
        })
        .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_ends_its_submit_stream() {
    let (stand, tokens) = stand().await;
    let (s, program, a, b) = pod(&stand).await;
    let record = Arc::new(Record::default());
    // Eight items in flight at a time; each answer lets the next one go.
    let window = Arc::new(tokio::sync::Semaphore::new(8));
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::SubmitRequest>(8);
    let mut stream = s
        .client
        .clone()
        .submit(s.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    let sender = {
        let (record, window) = (record.clone(), window.clone());
        let d = dispatch_request(program, &[a.id, b.id]);
        tokio::spawn(async move {
            let mut id = 0;
            while !record.stopped() {
                let Ok(permit) = window.acquire().await else {
                    break;
                };
                permit.forget();
                id += 1;
                let item = pb::SubmitRequest {
                    request_id: id,
                    work: Some(pb::submit_request::Work::Dispatch(d.clone())),
                    timeout_ms: 0,
                };
                if tx.send(item).await.is_err() {
                    break;
                }
            }
        })
    };
    let reader = {
        let (record, window) = (record.clone(), window.clone());
        tokio::spawn(async move {
            loop {
                match stream.message().await {
                    Ok(Some(r)) => {
                        record.push(Code::from_i32(r.code), r.message);
                        window.add_permits(1);
                    }
                    Ok(None) => {
                        record.push(Code::Ok, "the stream ended OK".into());
                        break;
                    }
                    Err(e) => {
                        record.push(e.code(), e.message().to_owned());
                        break;
                    }
                }
            }
            window.close();
        })
    };
    let attack = async {
        let removed = revoke(&tokens, &record).await;
        window.close();
        sender.abort();
        let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        removed
    };
    stand
        .attack("a revoked token's Submit stream", attack)
        .await
        .expect("ended within one poll interval", |removed| {
            ended(&record, *removed, &[Code::Unauthenticated])
        })
        .finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_ends_its_unary_calls_in_flight() {
    let (stand, tokens) = stand().await;
    let (s, program, a, b) = pod(&stand).await;
    let record = Arc::new(Record::default());
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (record, s) = (record.clone(), s.clone());
            let d = dispatch_request(program, &[a.id, b.id]);
            tokio::spawn(async move {
                let mut client = s.client.clone();
                while !record.stopped() {
                    match client.dispatch(s.req(d.clone())).await {
                        Ok(_) => record.push(Code::Ok, String::new()),
                        Err(e) => {
                            record.push(e.code(), e.message().to_owned());
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            })
        })
        .collect();
    let attack = async {
        let removed = revoke(&tokens, &record).await;
        for c in callers {
            let _ = tokio::time::timeout(Duration::from_secs(5), c).await;
        }
        removed
    };
    stand
        .attack("a revoked token's unary calls", attack)
        .await
        .expect("ended within one poll interval", |removed| {
            ended(&record, *removed, &[Code::Unauthenticated])
        })
        .finish();
}

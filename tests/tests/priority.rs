//! Session classes against the real daemon: the policy grants them, and whatever transport
//! admits a session's work (unary Dispatch, Chain, the Submit stream, the dispatch ring), the
//! daemon counts it in its session's class.

#![forbid(unsafe_code)]

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session, dispatch_request};
use std::io::{Read, Write};

use tokio_stream::StreamExt;
use tonic::Code;

fn open_req(name: &str, class: pb::SessionClass, deadline_us: u64) -> pb::OpenSessionRequest {
    pb::OpenSessionRequest {
        client_name: name.to_owned(),
        session_class: class.into(),
        deadline_us,
    }
}

async fn open(
    d: &Daemon,
    class: pb::SessionClass,
    deadline_us: u64,
) -> Result<Session, tonic::Status> {
    Session::open_with(
        d.connect().await,
        open_req("priority", class, deadline_us),
        None,
    )
    .await
}

#[tokio::test]
async fn the_policy_grants_a_class_and_refuses_what_a_rule_does_not_allow() {
    // The default rules: a local user may open an interactive session, with a deadline.
    let d = Daemon::start(Options::default());
    let mut c = d.connect().await;
    let r = c
        .open_session(open_req("ui", pb::SessionClass::Interactive, 2000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.session_class(), r.deadline_us),
        (pb::SessionClass::Interactive, 2000)
    );
    let r = c
        .open_session(open_req("job", pb::SessionClass::Unspecified, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.session_class(),
        pb::SessionClass::Batch,
        "unspecified is batch"
    );
    assert_eq!(r.deadline_us, 0, "a batch session has no deadline");
    let r = c
        .open_session(open_req("ui", pb::SessionClass::Interactive, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.deadline_us, 1000, "executor.interactive_deadline_us");
    let e = c
        .open_session(open_req("job", pb::SessionClass::Batch, 2000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .contains("only interactive sessions have a deadline"),
        "{e:?}"
    );
    let e = c
        .open_session(pb::OpenSessionRequest {
            session_class: 7,
            ..open_req("odd", pb::SessionClass::Batch, 0)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = c
        .open_session(open_req("slow", pb::SessionClass::Interactive, 10_000_001))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    drop(d);

    // A rule without `classes` allows batch sessions only, and says so.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("npud.toml");
    std::fs::write(
        &cfg,
        "[auth]\n[[auth.rules]]\nname = \"workers\"\nmatch = [\"uid:*\"]\n",
    )
    .unwrap();
    let d = Daemon::start(
        Options::default()
            .arg("--config")
            .arg(&cfg.display().to_string()),
    );
    let e = open(&d, pb::SessionClass::Interactive, 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(
        e.message(),
        "session_class: rule \"workers\" allows batch sessions only, not interactive \
         (auth.rules[\"workers\"].classes)"
    );
    open(&d, pb::SessionClass::Batch, 0).await.unwrap();
    let mut stats = open(&d, pb::SessionClass::Batch, 0).await.unwrap();
    let s = stats.statistics().await.unwrap();
    assert_eq!(s.open_sessions, 2, "the refused session was not opened");
}

/// (open sessions, successful dispatches) of `class` in `s`.
fn of_class(s: &pb::Statistics, class: pb::SessionClass) -> (u32, u64) {
    let c = s
        .classes
        .iter()
        .find(|c| c.session_class() == class)
        .unwrap_or_else(|| panic!("no {class:?} in {:?}", s.classes));
    let ok = c
        .dispatches
        .as_ref()
        .and_then(|d| d.success.as_ref())
        .map_or(0, |d| d.count);
    (c.open_sessions, ok)
}

#[tokio::test]
async fn every_transport_counts_an_interactive_sessions_work_as_interactive() {
    let d = Daemon::start(
        Options::default()
            .arg("--metrics-listen")
            .arg("127.0.0.1:0"),
    );
    let mut s = open(&d, pb::SessionClass::Interactive, 5000).await.unwrap();
    let add = s
        .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
        .await
        .unwrap()
        .program_id;
    let x = s.alloc_mapped(4096).await.unwrap();
    let y = s.alloc_mapped(4096).await.unwrap();
    let args = [x.id, y.id];

    // Unary Dispatch and Chain.
    let req = s.req(dispatch_request(add, &args));
    s.client.dispatch(req).await.unwrap();
    s.chain(vec![dispatch_request(add, &args); 3])
        .await
        .unwrap();
    // The Submit stream.
    let items: Vec<pb::SubmitRequest> = (1..=2)
        .map(|id| pb::SubmitRequest {
            request_id: id,
            work: Some(pb::submit_request::Work::Dispatch(dispatch_request(
                add, &args,
            ))),
            timeout_ms: 0,
        })
        .collect();
    let req = s.req(tokio_stream::iter(items));
    let answers: Vec<_> = s
        .client
        .submit(req)
        .await
        .unwrap()
        .into_inner()
        .collect::<Result<Vec<_>, _>>()
        .await
        .unwrap();
    assert_eq!(answers.len(), 2);
    // The dispatch ring.
    s.attach_ring().await.unwrap();
    for _ in 0..4 {
        s.dispatch(add, &args).await.unwrap();
    }

    let stats = s.statistics().await.unwrap();
    assert_eq!(
        of_class(&stats, pb::SessionClass::Interactive),
        (1, 1 + 3 + 2 + 4)
    );
    assert_eq!(of_class(&stats, pb::SessionClass::Batch), (0, 0));
    let mine = &stats.sessions[0];
    assert_eq!(
        (mine.session_class(), mine.deadline_us),
        (pb::SessionClass::Interactive, 5000)
    );
    // And in the metrics, by class.
    let addr = d
        .ready_value("metrics")
        .expect("a metrics= line in the ready file");
    let text = tokio::task::spawn_blocking(move || scrape(&addr))
        .await
        .unwrap();
    // Both kinds' series of the class (dispatch and chain), summed.
    let count = |class: &str| {
        let label = format!("class=\"{class}\"");
        let series: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with("npud_device_time_seconds_count{") && l.contains(&label))
            .map(|l| l.rsplit(' ').next().unwrap().trim().parse::<u64>().unwrap())
            .collect();
        assert_eq!(series.len(), 2, "{class}'s two kinds in\n{text}");
        series.iter().sum::<u64>()
    };
    // A chain is one observation.
    assert_eq!((count("interactive"), count("batch")), (1 + 1 + 2 + 4, 0));
}

/// The body of `GET /metrics` at `addr`.
fn scrape(addr: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(
        c,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

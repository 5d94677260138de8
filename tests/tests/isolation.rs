//! Sessions: foreign handles, tokens, and a client killed while holding tensors.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, I32Copies, Options, Session, binary, dispatch_request, with_session};

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;

fn vsa() -> EmuDesign {
    EmuDesign::vector_scalar_add(N, DType::I32, 1)
}

async fn another_sessions_handles_are_not_found_probe() {
    let d = Daemon::start(Options::default());
    let mut a = Session::open(d.connect().await, "a").await.unwrap();
    let mut b = Session::open(d.connect().await, "b").await.unwrap();
    let pa = a.register(&vsa()).await.unwrap().program_id;
    let ta = a.alloc_mapped(BYTES).await.unwrap();
    let ta2 = a.alloc_mapped(BYTES).await.unwrap();
    let tb = b.alloc_mapped(BYTES).await.unwrap();
    let tb2 = b.alloc_mapped(BYTES).await.unwrap();

    // b has not registered the program: a's id is not b's.
    let e = b.dispatch(pa, &[tb.id, tb2.id]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert_eq!(
        e.message(),
        format!("program_id: no program {pa} in this session (register it first)")
    );
    let e = b
        .client
        .unregister_program(b.req(pb::UnregisterProgramRequest { program_id: pa }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);

    // Once b registers the same bytes it gets the same program, but a's tensors stay a's.
    let pb_ = b.register(&vsa()).await.unwrap();
    assert_eq!(pb_.program_id, pa);
    assert!(!pb_.newly_stored);
    let e = b.dispatch(pa, &[ta.id, tb2.id]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert_eq!(
        e.message(),
        format!("args[0].tensor_id: no tensor {} in this session", ta.id)
    );
    let e = b
        .chain(vec![
            dispatch_request(pa, &[tb.id, tb2.id]),
            dispatch_request(pa, &[tb.id, ta2.id]),
        ])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(
        e.message().starts_with("links[1].args[1].tensor_id: "),
        "{e:?}"
    );
    for e in [
        b.client
            .get_tensor_info(b.req(pb::GetTensorInfoRequest { tensor_id: ta.id }))
            .await
            .map(|_| ())
            .unwrap_err(),
        b.client
            .free_tensor(b.req(pb::FreeTensorRequest { tensor_id: ta.id }))
            .await
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    }
    // a is unaffected.
    a.dispatch(pa, &[ta.id, ta2.id]).await.unwrap();
    let listed = b
        .client
        .list_programs(b.req(pb::ListProgramsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.programs.len(), 1);
    assert_eq!(listed.programs[0].references, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_or_with_a_wrong_token_are_refused() {
    let d = Daemon::start(Options::default());
    let mut client = d.connect().await;
    let s = Session::open(client.clone(), "t").await.unwrap();
    let e = client
        .allocate_tensor(pb::AllocateTensorRequest {
            size_bytes: 16,
            name: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert_eq!(
        e.message(),
        "missing npud-session metadata: call OpenSession first"
    );
    let wrong = "0123456789abcdef0123456789abcdef";
    assert_ne!(s.token, wrong);
    let e = client
        .allocate_tensor(with_session(
            pb::AllocateTensorRequest {
                size_bytes: 16,
                name: String::new(),
            },
            s.id,
            wrong,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("wrong token"), "{e:?}");
    let e = client
        .resume_session(pb::ResumeSessionRequest {
            session_id: s.id,
            token: wrong.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    // The right token resumes it.
    let r = client
        .resume_session(pb::ResumeSessionRequest {
            session_id: s.id,
            token: s.token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.session_id, s.id);
    // A closed session's token no longer works.
    client
        .close_session(s.req(pb::CloseSessionRequest {}))
        .await
        .unwrap();
    let e = client
        .allocate_tensor(s.req(pb::AllocateTensorRequest {
            size_bytes: 16,
            name: String::new(),
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
}

async fn a_killed_client_loses_its_tensors_and_program_references_after_the_grace_period_probe() {
    let d = Daemon::start(Options {
        grace_ms: 1500,
        ..Options::default()
    });
    let mut other = Session::open(d.connect().await, "survivor").await.unwrap();
    let p = other.register(&vsa()).await.unwrap().program_id;
    let mut x = other.alloc_mapped(BYTES).await.unwrap();
    let y = other.alloc_mapped(BYTES).await.unwrap();

    let mut child = Command::new(binary("npud-test-client"));
    if npud_e2e::ring::rings_on() {
        child.env("NPUD_E2E_RING", "1");
    }
    let mut child = child
        .arg("hold")
        .arg(&d.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let held: serde_json::Value = serde_json::from_str(line.trim()).expect("a JSON line");
    assert_eq!(held["held"], true, "{line}");
    let session = held["session"].as_u64().unwrap();
    assert_eq!(held["program"].as_u64(), Some(p));

    let st = other.statistics().await.unwrap();
    let s = st
        .sessions
        .iter()
        .find(|s| s.session_id == session)
        .unwrap();
    assert_eq!(s.tensors, 2);
    assert_eq!(s.tensor_bytes, 2 * BYTES);
    assert_eq!(s.programs, 1);
    assert!(s.connected);
    assert_eq!(st.programs[0].references, 2);

    npud_e2e::signal(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    let killed = Instant::now();

    // Within the grace period the session is still there, disconnected, with its tensors and
    // its program reference.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let st = other.statistics().await.unwrap();
        let s = st
            .sessions
            .iter()
            .find(|s| s.session_id == session)
            .expect("the session outlives its client within the 1500 ms grace period");
        assert_eq!((s.tensors, s.tensor_bytes, s.programs), (2, 2 * BYTES, 1));
        assert_eq!(st.programs[0].references, 2);
        if !s.connected {
            break;
        }
        assert!(
            Instant::now() < until,
            "the dead client still counts as connected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let st = loop {
        let st = other.statistics().await.unwrap();
        // The reaper takes the session out of the list, then releases what it held (its
        // program reference goes with its tensors): wait for both.
        if st.sessions.iter().all(|s| s.session_id != session)
            && st.programs.first().is_some_and(|p| p.references == 1)
        {
            break st;
        }
        assert!(
            Instant::now() < until,
            "the session outlived its grace period: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        killed.elapsed() >= Duration::from_millis(1500),
        "the session ended {:?} after its client died, before the 1500 ms grace period",
        killed.elapsed()
    );
    assert_eq!(st.sessions_ended, 1);
    assert_eq!(st.sessions.len(), 1);
    assert_eq!(st.programs.len(), 1);
    assert_eq!(
        st.programs[0].references, 1,
        "only the survivor's reference"
    );

    // The survivor keeps working.
    x.map.fill_i32(99).unwrap();
    other.dispatch(p, &[x.id, y.id]).await.unwrap();
    assert!(y.map.i32s().unwrap().iter().all(|v| *v == 100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumes_on_a_new_connection_within_the_grace_period() {
    let d = Daemon::start(Options {
        grace_ms: 3000,
        ..Options::default()
    });
    let (id, token, tensor) = {
        let mut s = Session::open(d.connect().await, "first").await.unwrap();
        let t = s.alloc_mapped(BYTES).await.unwrap();
        s.register(&vsa()).await.unwrap();
        (s.id, s.token.clone(), t.id)
    };
    // The first connection is gone; a new one resumes the session and finds its handles.
    let mut client = d.connect().await;
    let r = client
        .resume_session(pb::ResumeSessionRequest {
            session_id: id,
            token: token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.session_id, r.tensors, r.programs), (id, 1, 1));
    let info = client
        .get_tensor_info(with_session(
            pb::GetTensorInfoRequest { tensor_id: tensor },
            id,
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.size_bytes, BYTES);
    let st = client
        .get_statistics(pb::GetStatisticsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        st.sessions
            .iter()
            .any(|s| s.session_id == id && s.connected)
    );
    assert_eq!(st.sessions_ended, 0);
}

#[cfg_attr(not(as_root), ignore = "needs root to run a client under another uid")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_session_and_its_tickets_are_bound_to_the_peers_uid() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    assert!(
        rustix::process::getuid().is_root(),
        "built as root (tests/build.rs) but run as another user: rebuild as this user"
    );
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "root").await.unwrap();
    let r = s
        .client
        .allocate_tensor(s.req(pb::AllocateTensorRequest {
            size_bytes: 64,
            name: String::new(),
        }))
        .await
        .unwrap()
        .into_inner();
    let ticket = npu_fd::wire::Ticket::from_slice(&r.fd_ticket).unwrap();
    // Let another user reach the sockets.
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for p in [&d.socket, &d.fd_socket] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let out = Command::new(binary("npud-test-client"))
        .arg("foreign")
        .arg(&d.socket)
        .arg(&d.fd_socket)
        .arg(s.id.to_string())
        .arg(&s.token)
        .arg(ticket.to_string())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["code"], "PermissionDenied", "{v}");
    assert_eq!(
        v["message"],
        format!(
            "session {} belongs to uid:0; this caller is uid:65534",
            s.id
        )
    );
    let redeem = v["redeem"].as_str().unwrap();
    assert!(
        redeem.contains("the ticket was issued to uid 0; this peer is uid 65534"),
        "{redeem}"
    );
    // The owner can still redeem it: a refused attempt does not consume the ticket.
    let sock = std::os::unix::net::UnixStream::connect(&d.fd_socket).unwrap();
    npu_fd::wire::client::redeem_export(&sock, &ticket).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The same probes on fast-path sessions: every `Session` of the test (and of the client
// processes it starts) dispatches through its dispatch ring (`npud_e2e::ring`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_handles_are_not_found() {
    another_sessions_handles_are_not_found_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_handles_are_not_found_on_the_fast_path() {
    npud_e2e::ring::dispatch_through_rings();
    another_sessions_handles_are_not_found_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_loses_its_tensors_and_program_references_after_the_grace_period() {
    a_killed_client_loses_its_tensors_and_program_references_after_the_grace_period_probe().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_loses_its_tensors_and_program_references_after_the_grace_period_on_the_fast_path()
 {
    npud_e2e::ring::dispatch_through_rings();
    a_killed_client_loses_its_tensors_and_program_references_after_the_grace_period_probe().await;
}

//! Who a caller is, as the logs and statistics show it: names a client chooses cannot forge
//! log lines (issue 20, finding 8).

#![forbid(unsafe_code)]

use npud_e2e::{Daemon, Options, Session};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newline_in_a_client_name_forges_no_log_line_and_is_shown_escaped() {
    let d = Daemon::start(Options::default());
    let forged = "app\nFORGED INFO npud: session closed\x1b[2K";
    let mut s = Session::open(d.connect().await, forged).await.unwrap();
    let stats = s.statistics().await.unwrap();
    let mine = stats
        .sessions
        .iter()
        .find(|x| x.session_id == s.id)
        .expect("the caller's own session");
    assert_eq!(
        mine.client_name,
        "app\\nFORGED INFO npud: session closed\\u{1b}[2K"
    );
    let log = d.stderr();
    assert!(log.contains("session opened"), "{log}");
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED")),
        "a client's name began a log line: {log}"
    );
    assert!(
        !log.contains('\x1b'),
        "an escape sequence reached the log: {log}"
    );
}

/// Issue 20, finding 8: a caller who is not an admin sees, in ListPrograms and GetStatistics,
/// only the programs of its own sessions, not other tenants' names, hashes and counts; and
/// RegisterProgram's `newly_stored` does not tell it whether another tenant stored the bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_admins_see_only_their_own_sessions_programs() {
    use npu_artifacts::emu::{DType, EmuDesign};
    use npu_proto::v1 as pb;

    let tokens = npud_e2e::tokens::TokenDir::new(&["stranger"]);
    let d = Daemon::start(
        Options::default().env("NPUD_AUTH__TOKEN_DIR", &tokens.path().display().to_string()),
    );
    // The test runs as root: on the Unix socket it is uid:0, an admin by default.
    let mut admin = Session::open(d.connect().await, "admin").await.unwrap();
    let theirs = admin
        .register(&EmuDesign::vector_scalar_add(256, DType::I32, 7))
        .await
        .unwrap();
    // A caller with a token is the token's identity, no admin.
    let secret = npud_e2e::tokens::secret("stranger");
    let as_stranger = |m| npud_e2e::with_identity_token(m, Some(&secret));
    let mut stranger = d.connect().await;
    let seen = |l: &pb::ListProgramsResponse| {
        l.programs
            .iter()
            .map(|p| p.content_hash.clone())
            .collect::<Vec<_>>()
    };
    let list = stranger
        .list_programs(as_stranger(pb::ListProgramsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(seen(&list).is_empty(), "another tenant's program: {list:?}");
    let mut own = Session::open_as(d.connect().await, "stranger", Some(&secret))
        .await
        .unwrap();
    let mine = own
        .register(&EmuDesign::vector_scalar_add(256, DType::I32, 9))
        .await
        .unwrap();
    let list = stranger
        .list_programs(as_stranger(pb::ListProgramsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seen(&list), std::slice::from_ref(&mine.content_hash));
    let stats = own.statistics().await.unwrap();
    let hashes: Vec<_> = stats.programs.iter().map(|p| &p.content_hash).collect();
    assert_eq!(
        hashes,
        [&mine.content_hash],
        "statistics of others' programs"
    );
    // The admin sees both.
    let all = admin.statistics().await.unwrap();
    let mut hashes: Vec<_> = all
        .programs
        .iter()
        .map(|p| p.content_hash.clone())
        .collect();
    hashes.sort();
    let mut want = vec![theirs.content_hash.clone(), mine.content_hash];
    want.sort();
    assert_eq!(hashes, want);
    // Registering bytes another tenant stored does not tell that someone had: newly stored, as
    // far as this caller can know; again from its own session, not.
    let same = own
        .register(&EmuDesign::vector_scalar_add(256, DType::I32, 7))
        .await
        .unwrap();
    assert_eq!(same.content_hash, theirs.content_hash);
    assert!(
        same.newly_stored,
        "newly_stored told of another tenant's registration"
    );
    let again = own
        .register(&EmuDesign::vector_scalar_add(256, DType::I32, 7))
        .await
        .unwrap();
    assert!(!again.newly_stored);
}

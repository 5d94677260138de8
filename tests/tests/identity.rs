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

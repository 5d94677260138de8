//! What npuctl says when it cannot talk to npud: the cause and the next step, not the
//! transport's symptom. Each case is one a new user meets: no daemon (`os error 2` before),
//! a socket file left by a daemon that stopped, `http://` to a TLS port (`h2 protocol error`),
//! gRPC to the fd socket, a TLS port that requires a client certificate and gets none
//! (`transport error`), a CA npuctl does not trust (`UnknownIssuer`), and a second local user
//! over loopback TCP whom the Unix socket's mode keeps out (the refusal named no remedy).
//! `npuctl health` honours the global TLS options as every other subcommand does.

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::{Command, Output};

use npud_e2e::certs::Ca;
use npud_e2e::{Daemon, Options, npuctl_binary};

/// `npuctl ARGS` with the environment's `NPUD_*` removed.
fn npuctl(args: &[&str]) -> Output {
    let mut c = Command::new(npuctl_binary());
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("NPUD_") {
            c.env_remove(&k);
        }
    }
    c.output().expect("npuctl runs")
}

/// Its stderr, after checking that it failed.
fn failed(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "npuctl succeeded: {err}");
    err
}

/// A daemon whose TCP port speaks TLS with a certificate `ca` signed; `extra` adds to `[tls]`.
fn tls_daemon(dir: &Path, ca: &Ca, extra: &str) -> Daemon {
    let (cert, key) = ca.server("server");
    let cfg = dir.join("npud.toml");
    std::fs::write(
        &cfg,
        format!(
            "[tls]\ncert = {:?}\nkey = {:?}\n{extra}",
            cert.display().to_string(),
            key.display().to_string()
        ),
    )
    .unwrap();
    Daemon::start(
        Options {
            tcp: true,
            ..Options::default()
        }
        .arg("--config")
        .arg(&cfg.display().to_string()),
    )
}

#[test]
fn no_daemon_and_a_stale_socket_file_say_npud_is_not_running_and_how_to_start_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("npud.sock");
    let addr = format!("unix:{}", sock.display());
    let err = failed(&npuctl(&["--addr", &addr, "status"]));
    assert!(
        err.contains(&format!(
            "no socket at {}: npud is not running there",
            sock.display()
        )) && err.contains("npud --backend emulator")
            && err.contains("systemctl start npud.socket"),
        "{err}"
    );
    // The file a daemon that died leaves behind: nothing listens on it.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let err = failed(&npuctl(&["--addr", &addr, "health"]));
    assert!(
        err.contains("the file is left from a daemon that stopped"),
        "{err}"
    );
}

#[test]
fn http_to_a_tls_port_says_to_use_https() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let d = tls_daemon(dir.path(), &ca, "");
    let port = d.tcp.expect("a TCP port").port();
    for cmd in ["status", "health"] {
        let err = failed(&npuctl(&[
            "--addr",
            &format!("http://127.0.0.1:{port}"),
            cmd,
        ]));
        assert!(
            err.contains(&format!(
                "127.0.0.1:{port} speaks TLS (npud's [tls] is set for its TCP listener): use \
                 https://127.0.0.1:{port}"
            )),
            "{cmd}: {err}"
        );
    }
}

#[test]
fn grpc_to_the_fd_socket_names_the_grpc_socket_beside_it() {
    let d = Daemon::start(Options::default());
    let err = failed(&npuctl(&[
        "--addr",
        &format!("unix:{}", d.fd_socket.display()),
        "status",
    ]));
    assert!(
        err.contains(&format!(
            "{} is npud's fd socket (it answers the fd-socket protocol), which carries tensor \
             file descriptors only; give the gRPC socket beside it",
            d.fd_socket.display()
        )),
        "{err}"
    );
}

#[test]
fn tls_failures_name_the_option_that_fixes_them_and_health_takes_the_tls_options() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let d = tls_daemon(
        dir.path(),
        &ca,
        &format!(
            "client_ca = {:?}\nclient_auth = \"required\"\n",
            ca.path().display().to_string()
        ),
    );
    let https = format!("https://localhost:{}", d.tcp.expect("a TCP port").port());
    let ca_path = ca.path().display().to_string();
    // A CA npuctl does not trust.
    let err = failed(&npuctl(&["--addr", &https, "status"]));
    assert!(
        err.contains(
            "is not signed by a CA this client trusts: give the CA that signed it with --ca"
        ),
        "{err}"
    );
    // mTLS required, and no client certificate (a token alone, as the README's walkthrough
    // once had it).
    let err = failed(&npuctl(&["--addr", &https, "--ca", &ca_path, "status"]));
    // TLS 1.3 refuses after the client's side of the handshake: npuctl sees the alert, or
    // only the close it comes with; either way it names the remedy.
    assert!(
        err.contains("the daemon requires a client certificate (its tls.client_auth is \"required\"): give yours with --cert and --key")
            || err.contains("as npud does for a client without a certificate where its tls.client_auth is \"required\": give yours with --cert and --key"),
        "{err}"
    );
    // health honours --ca, --cert and --key (it ignored them, and failed with UnknownIssuer).
    let (cert, key) = ca.leaf("client", &["client.example"], "client", false);
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let out = npuctl(&[
        "--addr", &https, "--ca", &ca_path, "--cert", &cert, "--key", &key, "health",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SERVING\n");
    let err = failed(&npuctl(&["--addr", &https, "--ca", &ca_path, "health"]));
    assert!(err.contains("give yours with --cert and --key"), "{err}");
}

#[test]
#[cfg_attr(not(as_root), ignore = "needs root to run npuctl under another uid")]
fn a_local_user_the_socket_keeps_out_is_told_why_over_loopback_and_on_the_socket() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let d = Daemon::start(Options {
        tcp: true,
        ..Options::default()
    });
    // uid 65534 reaches npuctl and the daemon's directory, not its 0660 socket.
    let bin = d.dir.path().join("npuctl");
    std::fs::copy(npuctl_binary(), &bin).unwrap();
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = |args: &[&str]| {
        let mut c = Command::new(&bin);
        // std drops the supplementary groups when root sets a uid.
        c.args(args).uid(65534).gid(65534);
        for (k, _) in std::env::vars() {
            if k.starts_with("NPUD_") {
                c.env_remove(&k);
            }
        }
        c.output().expect("npuctl runs")
    };
    let port = d.tcp.expect("a TCP port").port();
    let err = failed(&nobody(&[
        "--addr",
        &format!("http://127.0.0.1:{port}"),
        "sessions",
    ]));
    assert!(
        err.contains("UNAUTHENTICATED")
            && err.contains("this one is uid 65534")
            && err.contains("only if that user may connect to its Unix socket")
            && err.contains("add uid 65534 to the socket's group"),
        "{err}"
    );
    let err = failed(&nobody(&[
        "--addr",
        &format!("unix:{}", d.socket.display()),
        "status",
    ]));
    assert!(
        err.contains(&format!(
            "uid 65534 may not connect to {} (mode 0660",
            d.socket.display()
        )) && err.contains("ask the daemon's operator to add you to"),
        "{err}"
    );
}

#[test]
fn run_refuses_files_that_do_not_fit_the_designs_arguments() {
    let d = Daemon::start(Options::default());
    let addr = format!("unix:{}", d.socket.display());
    let dir = tempfile::tempdir().unwrap();
    let design = dir.path().join("vector_scalar_add");
    let design_s = design.display().to_string();
    let out = npuctl(&[
        "--addr",
        &addr,
        "emu-design",
        "vector_scalar_add",
        "--out",
        &design_s,
    ]);
    assert!(out.status.success(), "{out:?}");
    let input = dir.path().join("in.bin");
    let bytes: Vec<u8> = (1..=1024i32).flat_map(i32::to_le_bytes).collect();
    std::fs::write(&input, &bytes).unwrap();
    let (input, output) = (
        input.display().to_string(),
        dir.path().join("out.bin").display().to_string(),
    );
    // Three files for two arguments: it ran and wrote 4-byte outputs, exit 0.
    let err = failed(&npuctl(&[
        "--addr", &addr, "run", &design_s, "--input", &input, &input, "--output", &output,
    ]));
    assert!(
        err.contains(
            "vector_scalar_add takes 2 buffer arguments; 2 --input and 1 --output files are 3"
        ),
        "{err}"
    );
    // --output alone: it became argument 0, the input.
    let err = failed(&npuctl(&[
        "--addr", &addr, "run", &design_s, "--output", &output,
    ]));
    assert!(err.contains("--output without --input"), "{err}");
    assert!(!Path::new(&output).exists(), "nothing ran");
    // As the design takes them: the input, then the output.
    let out = npuctl(&[
        "--addr", &addr, "run", &design_s, "--input", &input, "--output", &output,
    ]);
    assert!(out.status.success(), "{out:?}");
    let got = std::fs::read(&output).unwrap();
    let want: Vec<u8> = (2..=1025i32).flat_map(i32::to_le_bytes).collect();
    assert!(got == want, "vector_scalar_add wrote {} bytes", got.len());
}

#[test]
fn options_a_subcommand_cannot_honour_are_refused_not_ignored() {
    let err = failed(&npuctl(&["demo", "--addr", "unix:/x.sock"]));
    assert!(
        err.contains("--addr does not apply to npuctl demo: it starts a daemon of its own"),
        "{err}"
    );
    let err = failed(&npuctl(&["--token-file", "/t", "bench", "--quick"]));
    assert!(
        err.contains("--token-file does not apply to npuctl bench"),
        "{err}"
    );
    let err = failed(&npuctl(&["bench", "--addr", "https://localhost:1"]));
    assert!(err.contains("is not one"), "{err}");
}

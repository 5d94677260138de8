//! npud under systemd: readiness and stopping notifications, watchdog pings while the executor
//! answers, and socket activation (the daemon serves on sockets it was handed and leaves their
//! files to the service manager).

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npud_e2e::{Daemon, Options, Session, bytes_i32, i32_bytes};

/// A datagram socket standing in for systemd's notify socket.
struct Notify {
    sock: UnixDatagram,
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl Notify {
    fn new() -> Notify {
        let dir = tempfile::Builder::new()
            .prefix("npudn")
            .tempdir_in("/tmp")
            .unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Notify {
            sock,
            _dir: dir,
            path,
        }
    }

    /// Messages received until `until` holds for the collected text, or 20 s pass.
    fn wait_for(&self, until: impl Fn(&str) -> bool) -> String {
        let mut text = String::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 4096];
        while !until(&text) {
            assert!(Instant::now() < deadline, "notifications so far: {text:?}");
            if let Ok(n) = self.sock.recv(&mut buf) {
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
        text
    }
}

#[test]
fn the_daemon_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let notify = Notify::new();
    let mut d =
        Daemon::start(Options::default().env("NOTIFY_SOCKET", notify.path.to_str().unwrap()));
    let text = notify.wait_for(|t| t.contains("READY=1"));
    assert!(
        text.contains(&format!("STATUS=serving on unix:{}", d.socket.display())),
        "{text:?}"
    );
    let status = d.terminate().expect("npud exits");
    assert!(status.success(), "{status}");
    notify.wait_for(|t| t.contains("STOPPING=1"));
}

#[test]
fn the_watchdog_is_pinged_while_the_executor_answers() {
    let notify = Notify::new();
    let _d = Daemon::start(
        Options::default()
            .env("NOTIFY_SOCKET", notify.path.to_str().unwrap())
            .env("WATCHDOG_USEC", "100000"),
    );
    let text = notify.wait_for(|t| t.matches("WATCHDOG=1").count() >= 3);
    assert!(text.contains("READY=1"), "{text:?}");
}

#[test]
fn a_socket_activated_daemon_serves_on_the_sockets_it_was_given_and_leaves_their_files() {
    let mut d = Daemon::start(Options {
        socket_activated: true,
        ..Options::default()
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut s = Session::open(d.connect().await, "activated")
            .await
            .expect("session");
        let reg = s
            .register(&EmuDesign::vector_scalar_add(1024, DType::I32, 1))
            .await
            .expect("register");
        // Tensors by fd: the fd socket systemd passed works too.
        let mut a = s.alloc_mapped(4096).await.expect("tensor a by fd");
        let b = s.alloc_mapped(4096).await.expect("tensor b by fd");
        let input: Vec<i32> = (1..=1024).collect();
        a.map.copy_from_slice(0, &i32_bytes(&input)).unwrap();
        s.dispatch(reg.program_id, &[a.id, b.id])
            .await
            .expect("dispatch");
        let out = bytes_i32(&b.map.read_vec::<u8>(0, 4096).unwrap());
        assert_eq!(out, input.iter().map(|x| x + 1).collect::<Vec<_>>());
    });
    assert!(
        d.stderr()
            .contains(&format!("npud listening on unix:{}", d.socket.display()))
    );
    let status = d.terminate().expect("npud exits");
    assert!(status.success(), "{status}\n{}", d.stderr());
    // systemd owns the socket files: they stay for the next start.
    assert!(d.socket.exists(), "the gRPC socket file is still there");
    assert!(d.fd_socket.exists(), "the fd socket file is still there");
}

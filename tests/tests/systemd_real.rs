//! npud's systemd units under a real systemd: Debian bookworm's, booted as PID 1 in a podman
//! container from the Debian base the container test uses (made with mmdebstrap, with
//! `systemd` and `systemd-sysv`; see `npud_e2e::container::base`).
//!
//! The README's install steps ("Running as a systemd service") run in it as written, in the
//! repository's layout: this build's `npud` and `npuctl` (debug sections stripped) stand in for
//! `target/release/`, beside the repository's `systemd/` and `deploy/`. Then, under systemd:
//! socket activation (the service is not running until the first connection, which it
//! answers), `READY=1` (the unit is active with the daemon's status text), the journal (fields,
//! no escapes), a member of `npu` connecting, the watchdog (pings at a 2 s `WatchdogSec=`; a
//! device thread stuck in an emulated hanging kernel gets the daemon killed by systemd and
//! restarted), `systemctl reload` (SIGHUP, same process), and clients connecting in a loop
//! through `systemctl restart` twice and a stop and start: every connection answered, and the
//! socket files keep their inodes (systemd's sockets, never removed).
//!
//! Needs root, podman, runc, mmdebstrap and objcopy (CI installs them); otherwise reported as
//! ignored (tests/build.rs). Its figures are printed (`--no-capture`).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use npud_e2e::container::{self, Pod};

/// Every wait for a state.
const BOUND: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The README's `sh` blocks of the section titled `section`, each as its lines (comments
/// dropped).
fn readme_blocks(section: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let body: String = text
        .split("\n## ")
        .find(|s| s.starts_with(section))
        .unwrap_or_else(|| panic!("no section {section:?} in README.md"))
        .to_owned();
    let mut blocks = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for line in body.lines() {
        let t = line.trim_start();
        if t.starts_with("```") {
            match cur.take() {
                Some(b) => blocks.push(b),
                None if t.starts_with("```sh") => cur = Some(Vec::new()),
                None => {}
            }
            continue;
        }
        if let Some(b) = cur.as_mut() {
            let cmd = line.split(" #").next().unwrap_or("").trim();
            if !cmd.is_empty() {
                b.push(cmd.to_owned());
            }
        }
    }
    blocks
}

/// A systemd container and the checks made in it.
struct Host {
    pod: Pod,
}

impl Host {
    /// `bash -ec SCRIPT` in the container, as root, in /src.
    fn sh(&self, script: &str) -> Output {
        self.pod.exec_within(
            &["bash", "-ec", &format!("cd /src\n{script}")],
            Duration::from_secs(120),
        )
    }

    /// [`Host::sh`] that must succeed; its stdout.
    fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "{script}\n{}\n{}{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.journal()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The unit's journal, for failure messages.
    fn journal(&self) -> String {
        let out = self.sh(
            "journalctl -u npud -u npud.socket -u npud-fd.socket --no-pager -o cat | tail -n 40",
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A property of `npud.service`.
    fn prop(&self, name: &str) -> String {
        self.ok(&format!("systemctl show -P {name} npud.service"))
            .trim()
            .to_owned()
    }

    /// Waits until `f` holds, within [`BOUND`].
    fn until(&self, what: &str, f: impl Fn(&Host) -> bool) {
        let until = Instant::now() + BOUND;
        while !f(self) {
            assert!(
                Instant::now() < until,
                "not within {BOUND:?}: {what}\n{}",
                self.journal()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// This build's binary `name`, debug sections stripped, into `dir`.
fn stage_binary(from: &Path, dir: &Path) {
    let name = from.file_name().expect("a binary");
    container::check(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(from)
            .arg(dir.join(name)),
        Duration::from_secs(120),
    );
}

#[test]
#[cfg_attr(
    not(has_podman),
    ignore = "needs root, podman, runc, mmdebstrap and objcopy (apt-get install podman runc mmdebstrap binutils)"
)]
fn the_units_run_under_systemd_as_the_readme_installs_them() {
    let t0 = Instant::now();
    let (base_took, cold) = container::base();
    // The repository's layout, as the README's steps read it.
    let stage = tempfile::Builder::new()
        .prefix("npud-systemd")
        .tempdir_in(repo().join("target"))
        .unwrap();
    let release = stage.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    stage_binary(&npud_e2e::binary("npud"), &release);
    stage_binary(&npud_e2e::npuctl_binary(), &release);
    for dir in ["systemd", "deploy"] {
        container::check(
            Command::new("cp")
                .arg("-r")
                .arg(repo().join(dir))
                .arg(stage.path()),
            Duration::from_secs(60),
        );
    }
    let mut args = vec![
        "--systemd=always".to_owned(),
        "-v".to_owned(),
        format!("{}:/src:ro", stage.path().display()),
    ];
    args.extend(["--hostname".to_owned(), "npu-host".to_owned()]);
    let pod = Pod::start_named(
        format!("npud-e2e-{}-systemd", std::process::id()),
        &args,
        container::BASE,
        &["/sbin/init"],
    );
    let host = Host { pod };
    host.until("systemd has booted", |h| {
        let out = h.sh("systemctl is-system-running");
        let s = String::from_utf8_lossy(&out.stdout);
        s.trim() == "running" || s.trim() == "degraded"
    });
    let booted = t0.elapsed();
    host.ok("useradd --create-home alice");

    // The README's three blocks, as written.
    let blocks = readme_blocks("Running as a systemd service");
    assert_eq!(blocks.len(), 3, "{blocks:#?}");
    let install = blocks[0].join("\n");
    assert!(
        install.contains("systemctl enable --now npud.socket npud-fd.socket"),
        "{install}"
    );
    host.ok(&install);
    // Socket activation: systemd listens, the daemon does not run yet.
    assert_eq!(host.prop("ActiveState"), "inactive");
    let files = host.ok("stat -c '%U %G %a %F' /run/npud/npud.sock /run/npud/npud.fd.sock");
    assert_eq!(
        files, "npud npu 660 socket\nnpud npu 660 socket\n",
        "the socket units' files"
    );
    host.ok(&blocks[1].join("\n"));
    let status = host.ok(&blocks[2].join("\n"));
    // The first connection started it, on the backend the configuration file names.
    assert!(
        status.contains("backend:") && status.contains("emulator"),
        "{status}"
    );
    assert_eq!(host.prop("ActiveState"), "active");
    // Type=notify: active only after READY=1; the STATUS= text is the daemon's.
    assert_eq!(
        host.prop("StatusText"),
        "serving on unix:/run/npud/npud.sock"
    );
    // A member of npu reaches the 0660 sockets (tensors through the fd socket too).
    host.ok(
        "runuser -u alice -- npuctl emu-design vector_scalar_add --out /tmp/vsa\n\
         runuser -u alice -- sh -c 'head -c 4096 /dev/zero > /tmp/in.bin'\n\
         runuser -u alice -- npuctl run /tmp/vsa --input /tmp/in.bin --output /tmp/out.bin",
    );
    assert_eq!(
        host.ok("od -An -tx1 -N4 /tmp/out.bin").trim(),
        "01 00 00 00",
        "vector_scalar_add over zeros"
    );
    // The journal: fields, and no escapes.
    let verbose = host.ok("journalctl -u npud -o verbose --no-pager");
    for want in ["NPUD_ABI=g2", "SYSLOG_IDENTIFIER=npud", "PRIORITY=6"] {
        assert!(
            verbose.contains(want),
            "{want} not in the journal:\n{verbose}"
        );
    }
    let text = host.ok("journalctl -u npud -o cat --no-pager");
    assert!(text.contains("chose the packet ABI abi="), "{text}");
    assert!(!text.contains('\x1b'), "escapes in the journal: {text:?}");

    // The watchdog at 2 s, and a daemon whose device thread hangs past it.
    host.ok("mkdir -p /etc/systemd/system/npud.service.d\n\
         printf '[Service]\\nWatchdogSec=2s\\nEnvironment=NPUD_EMULATOR__TIMEOUT_MS=30000\\n' \
           > /etc/systemd/system/npud.service.d/test.conf\n\
         systemctl daemon-reload\nsystemctl restart npud");
    let pid = host.prop("MainPID");
    let pinged = host.prop("WatchdogTimestampMonotonic");
    host.until("a later watchdog ping", |h| {
        let now = h.prop("WatchdogTimestampMonotonic");
        now != pinged && !now.is_empty()
    });
    // Several periods pass with the same process: the pings keep it.
    let since = Instant::now();
    host.until("three watchdog periods", |h| {
        since.elapsed() > Duration::from_secs(6) && h.prop("MainPID") == pid
    });
    assert_eq!(host.prop("MainPID"), pid, "restarted while pinging");
    // Hang the device thread (the emulated kernel blocks for 30 s): the pings stop, systemd
    // kills the daemon at 2 s and Restart=on-failure starts another.
    let _ = host.sh("npuctl emu-design hang --out /tmp/hang\n\
         (timeout 60 npuctl run /tmp/hang --input /tmp/in.bin >/tmp/hang.out 2>&1 &)");
    host.until("a watchdog timeout and a restart", |h| {
        let log = h.sh("journalctl -u npud -o cat --no-pager | grep -c 'Watchdog timeout' || true");
        String::from_utf8_lossy(&log.stdout).trim() != "0"
            && h.prop("ActiveState") == "active"
            && h.prop("MainPID") != pid
    });
    host.ok("rm /etc/systemd/system/npud.service.d/test.conf\nsystemctl daemon-reload");

    // Reload: SIGHUP to the same process.
    let pid = host.prop("MainPID");
    host.ok("systemctl reload npud");
    host.until("the daemon logs the reload", |h| {
        let out = h.sh("journalctl -u npud -o cat --no-pager | grep -c 'SIGHUP: no \\[tls\\] to reload' || true");
        String::from_utf8_lossy(&out.stdout).trim() != "0"
    });
    assert_eq!(host.prop("MainPID"), pid, "reload kept the process");
    assert_eq!(host.prop("ActiveState"), "active");

    // Clients connect in a loop while the daemon restarts twice and is stopped and started:
    // systemd holds the sockets, so every connection is answered.
    let inodes = || host.ok("stat -c %i /run/npud/npud.sock /run/npud/npud.fd.sock");
    let before = inodes();
    host.ok("rm -f /tmp/loop.*\n\
         (n=0; while [ ! -e /tmp/loop.stop ]; do n=$((n+1)); \
            if npuctl status --json > /tmp/loop.last 2>&1; then echo ok >> /tmp/loop.log; \
            else echo \"FAILED $n: $(cat /tmp/loop.last)\" >> /tmp/loop.log; fi; done; \
          touch /tmp/loop.done) > /dev/null 2>&1 &");
    let count = |h: &Host| {
        h.ok("cat /tmp/loop.log 2>/dev/null | wc -l")
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    host.until("the client loop runs", |h| count(h) >= 3);
    let mut pids = vec![host.prop("MainPID")];
    for step in [
        "systemctl restart npud",
        "systemctl restart npud",
        "systemctl stop npud",
        "systemctl start npud",
    ] {
        let n = count(&host);
        host.ok(step);
        // The loop goes on connecting after each step.
        host.until("connections after the step", |h| count(h) >= n + 3);
        if step != "systemctl stop npud" {
            pids.push(host.prop("MainPID"));
        }
    }
    host.ok("touch /tmp/loop.stop");
    host.until("the client loop ends", |h| {
        h.sh("test -e /tmp/loop.done").status.success()
    });
    let log = host.ok("cat /tmp/loop.log");
    let failed: Vec<&str> = log.lines().filter(|l| l.starts_with("FAILED")).collect();
    assert!(
        failed.is_empty(),
        "connections failed across restarts: {failed:#?}\n{}",
        host.journal()
    );
    pids.dedup();
    assert_eq!(pids.len(), 4, "four daemons served the loop: {pids:?}");
    assert_eq!(inodes(), before, "the socket files were replaced");
    eprintln!(
        "systemd test: base {base_took:?} ({}), booted after {booted:?}, {} connections across \
         3 restarts, {:?} in all",
        if cold { "made" } else { "kept" },
        log.lines().count(),
        t0.elapsed()
    );
}

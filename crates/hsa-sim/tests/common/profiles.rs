//! Failing dispatches under each profile, each failure checked the way that profile reports
//! it: the queue's error callback (`rocr-newest`), silence (`rocm-7.0`), or the death of the
//! process (`rocr-late-2025`, `rocr-g2-2026-05`, and `rocr-newest` without a callback),
//! which is checked in a child process: this test binary run again with `--exact <test>` and
//! [`CHILD`] naming the profile and the case.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hsa_core::sys::Status;
use hsa_sim::profile::FailureReport;
use hsa_sim::{Profile, counters, last_error, last_error_status};

use super::{Sim, TestQueue};

/// Every profile whose packets name a PDI and an instruction buffer (all but `kernel-object`,
/// whose packets name a kernel object; its rules are in `kernel_object.rs`).
pub const ALL: [Profile; 4] = [
    Profile::Rocm70,
    Profile::RocrLate2025,
    Profile::RocrG2May2026,
    Profile::RocrNewest,
];
pub const G1: [Profile; 2] = [Profile::Rocm70, Profile::RocrLate2025];
pub const G2: [Profile; 2] = [Profile::RocrG2May2026, Profile::RocrNewest];

/// Set in a child process: `<test>/<profile>/<case index>`.
pub const CHILD: &str = "HSA_SIM_TEST_CHILD";

/// How long a child may take to abort.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

type Packets = Box<dyn Fn(&Sim) -> Vec<[u8; 64]>>;

/// One way to break a rule: the packets of one doorbell batch, the status the runtime gives
/// and words its detail must contain.
pub struct Case {
    pub name: &'static str,
    pub want: Status,
    pub detail: Vec<&'static str>,
    /// The read index a suspended queue is left at (the packets before it retired).
    pub failing_at: u64,
    pub callback: bool,
    pub packets: Packets,
    /// The status under a given profile, where the releases differ.
    pub want_on: Option<fn(Profile) -> Status>,
}

impl Case {
    pub fn new(
        name: &'static str,
        want: Status,
        detail: &[&'static str],
        packets: impl Fn(&Sim) -> Vec<[u8; 64]> + 'static,
    ) -> Self {
        Self {
            name,
            want,
            detail: detail.to_vec(),
            failing_at: 0,
            callback: true,
            packets: Box::new(packets),
            want_on: None,
        }
    }

    /// A case of one packet.
    pub fn one(
        name: &'static str,
        want: Status,
        detail: &[&'static str],
        packet: impl Fn(&Sim) -> [u8; 64] + 'static,
    ) -> Self {
        Self::new(name, want, detail, move |sim| vec![packet(sim)])
    }

    /// The status differs by profile: `f` gives it.
    pub fn want_on(mut self, f: fn(Profile) -> Status) -> Self {
        self.want_on = Some(f);
        self
    }

    fn want(&self, p: Profile) -> Status {
        self.want_on.map_or(self.want, |f| f(p))
    }

    pub fn failing_at(mut self, index: u64) -> Self {
        self.failing_at = index;
        self
    }

    /// Submits on a queue created without an error callback.
    pub fn without_callback(mut self) -> Self {
        self.callback = false;
        self
    }

    fn aborts(&self, profile: Profile) -> bool {
        match profile.failure_report() {
            FailureReport::Abort => true,
            FailureReport::Callback => !self.callback,
            FailureReport::Silent => false,
        }
    }
}

/// Checks, on a queue just rung, a failure reported to the caller (callback or silence), and
/// returns its detail.
pub fn check_in_process(sim: &Sim, q: &TestQueue, want: Status, failing_at: u64) -> String {
    let p = sim.profile;
    match p.failure_report() {
        FailureReport::Callback => {
            assert_eq!(q.errors(), vec![want], "{p}: {:?}", last_error());
            assert!(q.suspended(), "{p}: a failed queue is suspended");
            assert_eq!(q.read_index(), failing_at, "{p}: read index at the failure");
        }
        FailureReport::Silent => {
            assert_eq!(q.errors(), vec![], "{p}: no callback");
            assert!(!q.suspended(), "{p}: no suspension");
            assert_eq!(
                q.read_index(),
                q.write_index(),
                "{p}: the read index moves to the write index as if the batch ran"
            );
            assert_eq!(last_error_status(), Some(want), "{p}: {:?}", last_error());
        }
        FailureReport::Abort => panic!("{p} aborts on a failure: check it with fails_on"),
    }
    last_error().expect("a failure leaves its detail")
}

/// The C name of a status, as the abort line prints it.
fn status_name(st: Status) -> String {
    let mut p = std::ptr::null();
    // SAFETY: `p` is a valid out-pointer; on success it points at a static C string.
    let text = unsafe {
        assert_eq!(hsa_sim::hsa_status_string(st, &mut p), Status::SUCCESS);
        std::ffi::CStr::from_ptr(p)
    };
    let text = text.to_str().unwrap();
    text.split(':').next().unwrap().to_owned()
}

/// Checks every case under every profile: in this process where the profile reports failures
/// to the caller, in a child process where it aborts. Call it once per test, first: a child
/// runs the test from the top.
pub fn fails_on(test: &str, profiles: &[Profile], cases: &[Case]) {
    if let Ok(spec) = std::env::var(CHILD) {
        run_child(test, &spec, cases);
    }
    for &profile in profiles {
        for (i, case) in cases.iter().enumerate() {
            if case.aborts(profile) {
                check_abort(test, profile, i, case);
                continue;
            }
            let sim = Sim::new(profile);
            let q = sim.queue_with(case.callback);
            let before = counters();
            q.submit(&(case.packets)(&sim));
            let detail = check_in_process(&sim, &q, case.want(profile), case.failing_at);
            assert_eq!(counters().since(&before).packets_failed, 1, "{profile}");
            for d in &case.detail {
                assert!(detail.contains(d), "{profile}, {}: {detail}", case.name);
            }
        }
    }
}

/// In a child: rings the case's batch, which must abort the process.
fn run_child(test: &str, spec: &str, cases: &[Case]) -> ! {
    let mut parts = spec.splitn(3, '/');
    let (t, profile, index) = (parts.next(), parts.next(), parts.next());
    assert_eq!(t, Some(test), "child spec {spec}");
    let profile: Profile = profile.unwrap_or_default().parse().unwrap();
    let case = &cases[index.unwrap_or_default().parse::<usize>().unwrap()];
    let sim = Sim::new(profile);
    let q = sim.queue_with(case.callback);
    q.submit(&(case.packets)(&sim));
    eprintln!("child: {profile}, {} did not abort", case.name);
    std::process::exit(3)
}

fn check_abort(test: &str, profile: Profile, index: usize, case: &Case) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{test}/{profile}/{index}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the test binary runs again");
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > CHILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{profile}, {}: the child did not finish", case.name);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = reader.join().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGABRT),
        "{profile}, {}: the child should die of SIGABRT ({status:?}); its stderr:\n{stderr}",
        case.name
    );
    let line = stderr
        .lines()
        .find(|l| l.starts_with("hsa-sim (profile "))
        .unwrap_or_else(|| panic!("{profile}, {}: no abort line in\n{stderr}", case.name));
    assert!(line.contains(&format!("profile {profile})")), "{line}");
    assert!(line.contains(&status_name(case.want(profile))), "{line}");
    for d in &case.detail {
        assert!(line.contains(d), "{profile}, {}: {line}", case.name);
    }
}

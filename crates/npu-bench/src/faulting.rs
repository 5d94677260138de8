//! Row 16 (`--only faults`): what fifteen healthy sessions get of the modelled device while a
//! sixteenth faults it every tenth dispatch, against a sixteenth of the same identity
//! dispatching only the good design (the same load, no fault). One daemon on hsa-sim's timing model
//! (`emulator.timing = "model"`: modelled from published measurements, not measured on an
//! NPU); the two configurations alternate over rounds, so a change in the machine's load falls
//! on both alike.
//!
//! Every client is a fast-path client on a thread of its own, dispatching one at a time
//! `vector_scalar_add` over fd-shared tensors: before each dispatch it writes an input no
//! earlier dispatch had, and after it checks every output element. A wrong output, or a healthy
//! dispatch the daemon fails, ends the run with an error naming the client and the element: it
//! is no row.
//!
//! **The faulting client.** In the faulting windows every tenth of the sixteenth client's
//! dispatches runs the emulator's `fault` design, which fails on the device (command state
//! ERROR). npud quarantines a faulting program by its bytes, so each fault is a program never
//! registered before (`fault` over a different byte count), registered just before it is
//! dispatched and unregistered after. npud charges each fault to the identity that opened the
//! session (`limits.fault_budget`, 3 in a minute by default, then a cool-down): the row asks
//! what a fault costs the others, so the daemon runs with a budget the run cannot spend, and
//! every tenth dispatch reaches the device. (With the default budget the faulting identity
//! would be cooled down after its third fault, and the healthy sessions would lose at most
//! three faults' cost a minute.) The faulting client is an identity of its own all the same: the
//! clients present identity tokens (`auth.token_dir`, one file for the healthy sessions, one for
//! the faulting one) on a daemon that requires them on the Unix socket (`auth.require_token`),
//! so that the uid they share is not charged, as on a Kubernetes node. A cool-down of the
//! faulting identity would then stop it alone.
//!
//! The faults that reached the device are counted (the `faults_device_faults` row: each fault's
//! round trip) and checked against the daemon's own count (`SessionStatistics.device_faults`):
//! the faulting session's equals them and every healthy session's is 0. The windows before each
//! measured one are fault-free, so a fault's queue recovery never falls on the next window.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;

use crate::client::{Iters, Mapped, Session, connect_unix, dispatch_request};
use crate::daemon::Daemon;
use crate::fastpath::BenchRing;
use crate::interactive::device_time;
use crate::report::{Report, Row};
use crate::stats::{nanos, summarize};
use crate::{BenchError, Result};

/// Healthy clients.
pub const HEALTHY: usize = 15;
/// The faulting client's dispatches per fault.
pub const FAULT_EVERY: u64 = 10;
/// Elements (i32) of the good design.
const N: u32 = 1024;
/// The good design's addend.
const SCALAR: i32 = 7;
/// Bytes of each of the faulting client's tensors: every multiple of 4 up to it (a shim DMA
/// counts 32-bit words) is a fault design of its own, a fresh program for each fault.
const FAULT_BYTES: u32 = 64 << 10;
/// The fault-free window before each measured one.
const WARM: Duration = Duration::from_millis(40);

/// The keys of the rows.
pub mod keys {
    pub const FAULT_FREE: &str = "faults_15_healthy_fault_free";
    pub const ONE_FAULTING: &str = "faults_15_healthy_one_faulting";
    pub const FAULTS: &str = "faults_device_faults";
}

/// The measured window of each configuration: long enough for several faults in a full run, a
/// fraction of a second with few iterations. A fault costs the model two context builds
/// (70 ms), and the faulting session, being charged them, waits about a second for its next
/// turn: in windows of a second, whether one fault or two fell in a window moved the ratio
/// between 0.90 and 0.97 from run to run.
#[must_use]
pub fn window_for(it: Iters) -> Duration {
    if it.measured >= 20_000 {
        Duration::from_secs(2)
    } else {
        Duration::from_millis(150)
    }
}

/// A fast-path client dispatching the good design, checking every output.
struct Checked {
    name: String,
    session: Session,
    ring: BenchRing,
    input: Mapped,
    output: Mapped,
    request: pb::DispatchRequest,
    values: Vec<i32>,
    got: Vec<i32>,
    /// Dispatches so far: each writes an input of its own.
    count: u64,
}

impl Checked {
    async fn new(socket: &Path, name: &str, identity: &str, bytes: u32) -> Result<Checked> {
        let mut session =
            Session::open_as(connect_unix(socket).await?, name, Some(identity)).await?;
        let program = session
            .register(&EmuDesign::vector_scalar_add(
                N,
                DType::I32,
                i64::from(SCALAR),
            ))
            .await?;
        let input = session.alloc_mapped(u64::from(bytes)).await?;
        let output = session.alloc_mapped(u64::from(bytes)).await?;
        let ring = BenchRing::attach(&mut session).await?;
        Ok(Checked {
            name: name.to_owned(),
            request: dispatch_request(program, &[input.id, output.id]),
            session,
            ring,
            input,
            output,
            values: vec![0; N as usize],
            got: vec![0; N as usize],
            count: 0,
        })
    }

    /// One dispatch of the good design over an input no earlier one had; its output checked.
    fn dispatch(&mut self) -> Result<()> {
        self.count += 1;
        // Distinct in every dispatch and element, and far from overflowing with the addend.
        let base = (self.count % (1 << 16)) << 12;
        for (i, v) in (0u64..).zip(self.values.iter_mut()) {
            *v = i32::try_from(base + i).unwrap_or(0);
        }
        self.input.map.write_from(0, &self.values)?;
        let c = self.ring.dispatch_once(&self.request)?;
        if c.code != 0 {
            return Err(BenchError(format!(
                "{}: good dispatch {} failed with code {}: {}",
                self.name, self.count, c.code, c.message
            )));
        }
        self.output.map.read_into(0, &mut self.got)?;
        let wrong = self
            .values
            .iter()
            .zip(&self.got)
            .position(|(v, g)| v.wrapping_add(SCALAR) != *g);
        if let Some(i) = wrong {
            return Err(BenchError(format!(
                "{}: dispatch {}: output[{i}] = {}, expected {} (input {} + {SCALAR})",
                self.name,
                self.count,
                self.got[i],
                self.values[i].wrapping_add(SCALAR),
                self.values[i]
            )));
        }
        Ok(())
    }
}

/// The sixteenth client and what its faults did.
struct Faulter {
    /// The faulting session: it dispatches in the faulting windows only.
    client: Checked,
    /// The sixteenth session of the fault-free windows, of the same identity, dispatching the
    /// good design only. A session of its own, so that the faulting session's charge for its
    /// last faults (which holds it back until the others have used as much of the device) is
    /// not repaid in the fault-free windows, where it would hand the healthy sessions its share.
    stand_in: Checked,
    socket: std::path::PathBuf,
    /// Its dispatches in faulting windows: every [`FAULT_EVERY`]th is a fault.
    dispatches: u64,
    /// The next fault design's byte count.
    next_bytes: u32,
    /// Each fault that reached the device: its round trip, ns.
    faults: Vec<u64>,
    /// Fault dispatches the daemon refused instead of running (a cool-down, a quarantine).
    refused: Vec<String>,
}

impl Faulter {
    /// Dispatches until `end`: the good design, or (when `faulting`) a fresh fault design every
    /// [`FAULT_EVERY`]th time, registered through `session` on this thread's runtime `rt`.
    fn run(
        &mut self,
        end: Instant,
        faulting: Option<(&tokio::runtime::Runtime, &mut Session)>,
    ) -> Result<()> {
        let Some((rt, session)) = faulting else {
            while Instant::now() < end {
                self.stand_in.dispatch()?;
            }
            return Ok(());
        };
        while Instant::now() < end {
            self.dispatches += 1;
            if !self.dispatches.is_multiple_of(FAULT_EVERY) {
                self.client.dispatch()?;
                continue;
            }
            let bytes = self.next_bytes;
            if bytes > FAULT_BYTES {
                return Err(BenchError(format!(
                    "the faulting client ran out of fresh fault designs after {}",
                    FAULT_BYTES / 4
                )));
            }
            self.next_bytes += 4;
            let program = rt.block_on(session.register(&EmuDesign::fault(bytes)))?;
            let d = dispatch_request(program, &[self.client.input.id, self.client.output.id]);
            let t = Instant::now();
            let c = self.client.ring.dispatch_once(&d)?;
            let took = nanos(t.elapsed());
            if c.code == 0 {
                return Err(BenchError(format!(
                    "the fault design over {bytes} bytes completed without a fault"
                )));
            }
            if c.message.contains("the device failed") {
                self.faults.push(took);
            } else {
                self.refused.push(c.message);
            }
            let req = session.req(pb::UnregisterProgramRequest {
                program_id: program,
            });
            rt.block_on(session.client.unregister_program(req))?;
        }
        Ok(())
    }
}

/// A secret for `auth.token_dir`: 48 hexadecimal digits from the kernel's random source.
fn secret() -> Result<String> {
    let mut b = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Writes the token file `name` (mode 0600) in `dir`; returns its secret.
fn token(dir: &Path, name: &str) -> Result<String> {
    let s = secret()?;
    let mut f = std::fs::File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(name))?;
    std::io::Write::write_all(&mut f, format!("{s}\n").as_bytes())?;
    Ok(s)
}

/// Every client dispatches until `each` has passed, all starting together (the sixteenth
/// faulting when `faulting`): each healthy client's latencies, and the window's wall time.
fn window(
    healthy: &mut [Checked],
    sixteenth: &mut Faulter,
    faulting: bool,
    each: Duration,
) -> Result<(Vec<Vec<u64>>, Duration)> {
    let start = Barrier::new(healthy.len() + 2);
    let start = &start;
    std::thread::scope(|scope| {
        let handles: Vec<_> = healthy
            .iter_mut()
            .map(|c| {
                scope.spawn(move || {
                    start.wait();
                    let end = Instant::now() + each;
                    let mut ns = Vec::new();
                    while Instant::now() < end {
                        let t = Instant::now();
                        c.dispatch()?;
                        ns.push(nanos(t.elapsed()));
                    }
                    Ok::<_, BenchError>(ns)
                })
            })
            .collect();
        let faulter = scope.spawn(move || {
            // Its own runtime and connection for its registrations: this process's runtime
            // waits for the window.
            let setup = || -> Result<_> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let channel = rt.block_on(connect_unix(&sixteenth.socket))?;
                let session = sixteenth.client.session.on(channel);
                Ok((rt, session))
            };
            let mut own = if faulting { Some(setup()) } else { None };
            start.wait();
            let end = Instant::now() + each;
            match own.as_mut() {
                Some(Ok((rt, session))) => sixteenth.run(end, Some((rt, session))),
                Some(Err(e)) => Err(BenchError(e.to_string())),
                None => sixteenth.run(end, None),
            }
        });
        start.wait();
        let t = Instant::now();
        let per = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| BenchError("a healthy client panicked".into()))?
            })
            .collect::<Result<Vec<_>>>();
        let sixteenth = faulter
            .join()
            .map_err(|_| BenchError("the faulting client panicked".into()))?;
        let wall = t.elapsed();
        sixteenth?;
        Ok((per?, wall))
    })
}

/// What one configuration measured over the rounds.
#[derive(Default)]
struct Side {
    ns: Vec<u64>,
    wall: Duration,
    counts: Vec<u64>,
    /// The modelled device's time over the windows, every session's.
    device: Duration,
}

impl Side {
    fn add(&mut self, (per, wall): (Vec<Vec<u64>>, Duration)) {
        self.counts.resize(per.len(), 0);
        for (c, ns) in self.counts.iter_mut().zip(&per) {
            *c += ns.len() as u64;
        }
        self.ns.extend(per.into_iter().flatten());
        self.wall += wall;
    }
}

/// The daemon's fault count of each of `sessions`, read through `s` (whose identity opened
/// them).
async fn faults_of(s: &Session, sessions: &[u64]) -> Result<Vec<u64>> {
    let mut s = s.clone();
    let st = s
        .client
        .get_statistics(s.req(pb::GetStatisticsRequest::default()))
        .await?
        .into_inner();
    sessions
        .iter()
        .map(|id| {
            st.sessions
                .iter()
                .find(|x| x.session_id == *id)
                .map(|x| x.device_faults)
                .ok_or_else(|| BenchError(format!("no statistics of session {id}")))
        })
        .collect()
}

/// Runs row 16 (faults): `rounds` rounds of a fault-free and a faulting window of
/// [`window_for`]`(it)` each, in alternating order.
///
/// # Errors
/// When the daemon cannot be started, a healthy dispatch fails or gives a wrong output, the
/// fault design completes, or the daemon's fault counts differ from the faults seen.
pub async fn rows(report: &mut Report, it: Iters, rounds: usize) -> Result<()> {
    let each = window_for(it);
    let tokens = tempfile::Builder::new()
        .prefix("npubtok")
        .tempdir_in("/tmp")?;
    // npud reads tokens only from a directory nobody else may enter.
    std::fs::set_permissions(tokens.path(), std::fs::Permissions::from_mode(0o700))?;
    let healthy_token = token(tokens.path(), "healthy")?;
    let faulty_token = token(tokens.path(), "faulty")?;
    let dir = tokens.path().display().to_string();
    let env = [
        ("NPUD_EMULATOR__TIMING", "model"),
        ("NPUD_AUTH__TOKEN_DIR", dir.as_str()),
        ("NPUD_AUTH__REQUIRE_TOKEN", "[\"unix\"]"),
        ("NPUD_LIMITS__FAULT_BUDGET", "1000000"),
    ];
    let daemon = Daemon::start_env(None, &[], &env)?;
    let socket = daemon.socket.clone();
    let mut healthy = Vec::with_capacity(HEALTHY);
    for i in 0..HEALTHY {
        let name = format!("bench-healthy-{i}");
        healthy.push(Checked::new(&socket, &name, &healthy_token, N * 4).await?);
    }
    let mut sixteenth = Faulter {
        client: Checked::new(&socket, "bench-faulting", &faulty_token, FAULT_BYTES).await?,
        stand_in: Checked::new(&socket, "bench-sixteenth", &faulty_token, N * 4).await?,
        socket: socket.clone(),
        dispatches: 0,
        next_bytes: 4,
        faults: Vec::new(),
        refused: Vec::new(),
    };
    let (mut free, mut faulty) = (Side::default(), Side::default());
    let mut stats = healthy[0].session.clone();
    for round in 0..rounds.max(1) {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for faulting in order {
            // Fault-free: the rings awake, and the last fault's recovery paid.
            let _ = window(&mut healthy, &mut sixteenth, false, WARM)?;
            let before = device_time(&mut stats).await?;
            let w = window(&mut healthy, &mut sixteenth, faulting, each)?;
            let after = device_time(&mut stats).await?;
            let side = if faulting { &mut faulty } else { &mut free };
            side.add(w);
            side.device += (after[0] + after[1]).saturating_sub(before[0] + before[1]);
        }
    }
    let faulting_wall = faulty.wall;
    let busy = |s: &Side| 100.0 * s.device.as_secs_f64() / s.wall.as_secs_f64().max(1e-9);
    report.notes.push(format!(
        "row 16 (faults): the answered dispatches' modelled device time was {:.0} % of the \
         fault-free windows' wall time and {:.0} % of the faulting ones' (a fault's is not \
         counted)",
        busy(&free),
        busy(&faulty)
    ));
    let ids: Vec<u64> = healthy.iter().map(|c| c.session.id).collect();
    let mut healthy_faults = faults_of(&healthy[0].session, &ids).await?;
    let stand_in = &sixteenth.stand_in.session;
    healthy_faults.extend(faults_of(stand_in, &[stand_in.id]).await?);
    let faulter_faults = faults_of(&sixteenth.client.session, &[sixteenth.client.session.id])
        .await?
        .iter()
        .sum::<u64>();
    let seen = sixteenth.faults.len() as u64;
    if healthy_faults.iter().any(|&f| f != 0) || faulter_faults != seen {
        return Err(BenchError(format!(
            "the daemon counted {faulter_faults} device faults of the faulting session (the \
             client saw {seen}) and {healthy_faults:?} of the healthy ones and the fault-free sixteenth (expected none)"
        )));
    }
    for (side, key, which) in [
        (
            free,
            keys::FAULT_FREE,
            "a 16th dispatching the same good design",
        ),
        (
            faulty,
            keys::ONE_FAULTING,
            "a 16th faulting the device every tenth dispatch",
        ),
    ] {
        let ops = side.ns.len() as u64;
        let mut r = Row::new(
            "16",
            key,
            &format!(
                "{HEALTHY} healthy fast-path clients, modelled device time, {which}: aggregate"
            ),
            summarize(side.ns, ops, side.wall),
        );
        r.clients = Some(HEALTHY);
        r.fairness = Some(crate::device::jain(&side.counts));
        if key == keys::ONE_FAULTING {
            r.device_faults = Some(seen);
        }
        report.rows.push(r);
    }
    if seen > 0 {
        report.rows.push(Row::new(
            "16",
            keys::FAULTS,
            "the 16th client's faulting dispatches, each a device fault: round trip (ops/s: \
             faults a second)",
            summarize(std::mem::take(&mut sixteenth.faults), seen, faulting_wall),
        ));
    }
    if let Some(first) = sixteenth.refused.first() {
        report.notes.push(format!(
            "row 16 (faults): the daemon refused {} of the faulting client's fault dispatches \
             instead of running them, the first: {first}",
            sixteenth.refused.len()
        ));
    }
    drop(healthy);
    drop(sixteenth);
    drop(daemon);
    Ok(())
}

//! The executor's turns, in process on the emulator: commands are queued before the executor
//! starts serving (it waits for [`Opened::run`]), so the order it finds them in is known, and
//! what the test checks is which reply comes first, never how long anything took.

use std::sync::Arc;
use std::time::Instant;

use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use tokio::sync::oneshot::{self, error::TryRecvError};

use super::*;
use crate::priority::Priority;
use crate::programs::Runs;

const A: u64 = 1;
const B: u64 = 2;
const C: u64 = 3;

struct Fixture {
    handle: ExecutorHandle,
    generation: npu_artifacts::NpuGen,
    opened: Option<Opened>,
    programs: Arc<Programs>,
    _serving: tokio::sync::watch::Receiver<crate::health::Condition>,
}

fn fixture(slice_bytes: u64) -> Fixture {
    fixture_with(Config {
        executor: crate::config::ExecutorConfig {
            spin_us: 0,
            slice_bytes,
            ..crate::config::ExecutorConfig::default()
        },
        ..Config::default()
    })
}

fn fixture_with(cfg: Config) -> Fixture {
    let cfg = Config {
        backend: Backend::Emulator,
        ..cfg
    };
    let (tx, rx) = crate::health::DeviceHealth::new();
    let opened = Executor::start(&cfg, tx).expect("the emulator opens");
    let generation = match opened.facts.info.generation {
        hsa_core::Generation::Npu1 => npu_artifacts::NpuGen::Npu1,
        hsa_core::Generation::Npu2 => npu_artifacts::NpuGen::Npu2,
    };
    let programs = Arc::new(Programs::new(
        1 << 30,
        1 << 30,
        generation,
        Runs::EmulatedDesigns,
        None,
        Vec::new(),
    ));
    Fixture {
        handle: opened.handle.clone(),
        generation,
        opened: Some(opened),
        programs,
        _serving: rx,
    }
}

/// A fixture whose identities may fault the device `budget` times.
fn with_fault_budget(budget: u32) -> Fixture {
    fixture_with(fault_budget(budget))
}

/// The configuration of [`with_fault_budget`].
fn fault_budget(budget: u32) -> Config {
    Config {
        limits: crate::config::Limits {
            fault_budget: budget,
            ..crate::config::Limits::default()
        },
        ..Config::default()
    }
}

impl Fixture {
    /// Queues a command before the executor serves.
    fn queue(&self, cmd: Command) {
        self.handle.tx.try_send(cmd).expect("the channel has room");
    }

    fn allocate(&self, session: u64, size: u64) -> oneshot::Receiver<Result<u64, NpudError>> {
        let (reply, rx) = oneshot::channel();
        self.queue(Command::Allocate {
            session,
            size,
            name: String::new(),
            cap: None,
            local: false,
            reply,
        });
        rx
    }

    /// Two tensors of 4 KiB for each of `sessions`, in order (ids 1 and 2 for the first, 3
    /// and 4 for the second, ...).
    fn two_tensors_each(&self, sessions: &[u64]) -> Vec<oneshot::Receiver<Result<u64, NpudError>>> {
        sessions
            .iter()
            .flat_map(|&s| [s, s])
            .map(|s| self.allocate(s, 4096))
            .collect()
    }

    fn register(&self, session: u64, d: &EmuDesign) -> Arc<Program> {
        let reg = self
            .programs
            .register(
                session,
                d.to_pdi(),
                d.insts(self.generation),
                d.kernel.name().into(),
            )
            .expect("the design registers");
        reg.program
    }

    fn work(
        &self,
        session: u64,
        links: Vec<(Arc<Program>, [u64; 2])>,
    ) -> oneshot::Receiver<Result<WorkDone, NpudError>> {
        self.work_as(session, 1000, links)
    }

    fn work_as(
        &self,
        session: u64,
        uid: u32,
        links: Vec<(Arc<Program>, [u64; 2])>,
    ) -> oneshot::Receiver<Result<WorkDone, NpudError>> {
        self.work_with(session, uid, Priority::BATCH, links)
    }

    fn work_with(
        &self,
        session: u64,
        uid: u32,
        priority: Priority,
        links: Vec<(Arc<Program>, [u64; 2])>,
    ) -> oneshot::Receiver<Result<WorkDone, NpudError>> {
        let (reply, rx) = oneshot::channel();
        let chain = links.len() > 1;
        let links = links
            .into_iter()
            .map(|(program, t)| Link {
                program,
                args: t
                    .iter()
                    .map(|id| pb::TensorArg {
                        tensor_id: *id,
                        offset: 0,
                        length: 0,
                        read_only: false,
                    })
                    .collect(),
            })
            .collect();
        self.queue(Command::Work(WorkItem {
            session,
            who: format!("uid:{uid}").into(),
            priority,
            links,
            chain,
            admitted: Instant::now(),
            deadline: None,
            flow_controlled: false,
            reply,
        }));
        rx
    }

    /// A single dispatch whose deadline has already passed.
    fn late(
        &self,
        session: u64,
        program: Arc<Program>,
        t: [u64; 2],
    ) -> oneshot::Receiver<Result<WorkDone, NpudError>> {
        let (reply, rx) = oneshot::channel();
        let now = Instant::now();
        self.queue(Command::Work(WorkItem {
            session,
            who: String::from("uid:1000").into(),
            priority: Priority::BATCH,
            links: vec![Link {
                program,
                args: t
                    .iter()
                    .map(|id| pb::TensorArg {
                        tensor_id: *id,
                        offset: 0,
                        length: 0,
                        read_only: false,
                    })
                    .collect(),
            }],
            chain: false,
            admitted: now,
            deadline: Some(now),
            flow_controlled: false,
            reply,
        }));
        rx
    }

    /// Declares an import of `size` bytes for `session` and attaches a fresh memfd to it: a
    /// tensor staged around every dispatch that uses it.
    fn import(&self, session: u64, size: u64) -> oneshot::Receiver<Result<u64, NpudError>> {
        let (reply, rx) = oneshot::channel();
        self.queue(Command::DeclareImport {
            session,
            size,
            name: String::new(),
            cap: None,
            reply,
        });
        rx
    }

    fn attach(
        &self,
        session: u64,
        tensor: u64,
        size: u64,
    ) -> oneshot::Receiver<Result<(), NpudError>> {
        let fd = npu_fd::memfd::create("executor-test", size).expect("a memfd");
        let (reply, rx) = oneshot::channel();
        self.queue(Command::AttachImport {
            session,
            tensor,
            fd,
            reply,
        });
        rx
    }

    fn serve(&mut self) -> Executor {
        let opened = self.opened.take().expect("served once");
        opened.run(self.programs.clone(), None)
    }
}

#[test]
fn other_sessions_are_served_between_the_slices_of_a_big_write_and_the_batches_of_a_long_chain() {
    const BIG: usize = 64 << 20;
    const LINK: u32 = 64 << 10;
    // 4 KiB slices: the write is 16,384 turns, the chain 32 (one per doorbell batch).
    let mut f = fixture(4096);
    let copy = f.register(A, &EmuDesign::vector_scalar_add(LINK / 4, DType::I32, 1));
    let add = f.register(B, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let allocations = [
        f.allocate(A, BIG as u64),
        f.allocate(A, u64::from(LINK)),
        f.allocate(A, u64::from(LINK)),
        f.allocate(B, 4096),
        f.allocate(B, 4096),
    ];
    // A fresh executor gives tensor ids out from 1 in the order the allocations were queued
    // (checked below).
    let (big, a_in, a_out, b_in, b_out) = (1, 2, 3, 4, 5);
    // Queued before anything runs: A's write, B's dispatch, A's chain, B's dispatch.
    let (reply, mut write) = oneshot::channel();
    f.queue(Command::Write {
        session: A,
        tensor: big,
        offset: 0,
        data: vec![7u8; BIG],
        reply,
    });
    let b_first = f.work(B, vec![(add.clone(), [b_in, b_out])]);
    let mut chain = f.work(A, vec![(copy.clone(), [a_in, a_out]); 1024]);
    let b_second = f.work(B, vec![(add.clone(), [b_in, b_out])]);
    let exec = f.serve();
    let ids: Vec<u64> = allocations
        .into_iter()
        .map(|r| r.blocking_recv().unwrap().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);

    let done = b_first.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (1, None));
    assert!(
        matches!(write.try_recv(), Err(TryRecvError::Empty)),
        "B's dispatch waited for A's whole 64 MiB write"
    );
    write.blocking_recv().unwrap().unwrap();
    let done = b_second.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (1, None));
    assert!(
        matches!(chain.try_recv(), Err(TryRecvError::Empty)),
        "B's dispatch waited for A's whole 1,024-link chain"
    );
    let done = chain.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (1024, None));
    assert_eq!(done.doorbells, 32, "one doorbell per 32-link batch");

    // The written bytes arrived, read back in slices too.
    let (reply, read) = oneshot::channel();
    f.handle
        .tx
        .blocking_send(Command::Read {
            session: A,
            tensor: big,
            offset: BIG as u64 - 3 * 4096 - 5,
            len: 3 * 4096 + 5,
            reply,
        })
        .unwrap();
    let bytes = read.blocking_recv().unwrap().unwrap();
    assert_eq!(bytes.len(), 3 * 4096 + 5);
    assert!(bytes.iter().all(|b| *b == 7));
    shutdown(exec);
}

#[test]
fn a_chain_stops_at_its_next_batch_when_its_uid_spent_the_fault_budget_between_two() {
    let mut f = with_fault_budget(1);
    let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let fault = f.register(B, &EmuDesign::fault(4096));
    let other = f.register(3, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let allocations = [
        f.allocate(A, 4096),
        f.allocate(A, 4096),
        f.allocate(B, 4096),
        f.allocate(B, 4096),
        f.allocate(3, 4096),
        f.allocate(3, 4096),
    ];
    // Sessions A and B belong to uid 1000, session 3 to uid 1001. A's 64-link chain rings
    // twice; B's fault runs between the two batches and spends uid 1000's budget of one.
    let chain = f.work_as(A, 1000, vec![(add.clone(), [1, 2]); 64]);
    let faulted = f.work_as(B, 1000, vec![(fault, [3, 4])]);
    let unaffected = f.work_as(3, 1001, vec![(other, [5, 6])]);
    let exec = f.serve();
    for (k, r) in allocations.into_iter().enumerate() {
        assert_eq!(r.blocking_recv().unwrap().unwrap(), k as u64 + 1);
    }
    let done = faulted.blocking_recv().unwrap().unwrap();
    let failure = done.failure.expect("the fault design fails");
    assert_eq!(failure.error.code_name(), "INTERNAL");
    let done = chain.blocking_recv().unwrap().unwrap();
    assert_eq!(done.completed, 32, "{done:?}");
    assert_eq!(done.doorbells, 1);
    let failure = done.failure.expect("the second batch is refused");
    assert_eq!(failure.index, 32);
    assert_eq!(failure.error.code_name(), "RESOURCE_EXHAUSTED");
    assert!(
        failure
            .error
            .to_string()
            .starts_with("uid:1000 faulted the device once within"),
        "{failure:?}"
    );
    let done = unaffected.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (1, None));
    assert_eq!(f.handle.fault_budget().session_faults(B), 1);
    assert_eq!(f.handle.fault_budget().session_faults(A), 0);
    shutdown(exec);
}

/// A work item whose staging takes several turns: other sessions run between them. Here one
/// of them faults the device with the program the item is about to run, which quarantines it;
/// the item's first batch checks again and is refused, instead of faulting the device a second
/// time.
#[test]
fn an_item_whose_staging_took_several_turns_checks_its_programs_again_before_its_first_batch() {
    const STAGED: u32 = 64 << 10;
    // 4 KiB slices: staging A's two 64 KiB memfds in takes 32 turns.
    let mut f = fixture(4096);
    let fault_a = f.register(A, &EmuDesign::fault(STAGED));
    let fault_b = f.register(B, &EmuDesign::fault(STAGED));
    assert_eq!(
        fault_a.id, fault_b.id,
        "one program, shared by content hash"
    );
    let imports = [
        f.import(A, u64::from(STAGED)),
        f.import(A, u64::from(STAGED)),
    ];
    let attached = [
        f.attach(A, 1, u64::from(STAGED)),
        f.attach(A, 2, u64::from(STAGED)),
    ];
    let allocations = [
        f.allocate(B, u64::from(STAGED)),
        f.allocate(B, u64::from(STAGED)),
    ];
    // A (uid 1001) queues first and starts staging; B (uid 1000) faults the device meanwhile.
    let staged = f.work_as(A, 1001, vec![(fault_a, [1, 2])]);
    let faulted = f.work_as(B, 1000, vec![(fault_b, [3, 4])]);
    let exec = f.serve();
    for r in imports {
        r.blocking_recv().unwrap().unwrap();
    }
    for r in attached {
        r.blocking_recv().unwrap().unwrap();
    }
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    let done = faulted.blocking_recv().unwrap().unwrap();
    assert_eq!(
        done.failure
            .expect("the fault design fails")
            .error
            .code_name(),
        "INTERNAL"
    );
    let e = staged.blocking_recv().unwrap().unwrap_err();
    assert_eq!(e.code_name(), "FAILED_PRECONDITION", "{e}");
    assert!(
        e.to_string()
            .contains("is quarantined: it faulted the device while this work was queued"),
        "{e}"
    );
    assert_eq!(f.handle.faults(), 1, "the quarantined program ran again");
    assert_eq!(f.handle.fault_budget().session_faults(A), 0);
    shutdown(exec);
}

/// The same with the fault budget: the identity spent it while the item was staging.
#[test]
fn an_item_whose_staging_took_several_turns_checks_the_fault_budget_before_its_first_batch() {
    const STAGED: u32 = 64 << 10;
    let mut f = fixture_with(Config {
        executor: crate::config::ExecutorConfig {
            spin_us: 0,
            slice_bytes: 4096,
            ..crate::config::ExecutorConfig::default()
        },
        limits: crate::config::Limits {
            fault_budget: 1,
            ..crate::config::Limits::default()
        },
        ..Config::default()
    });
    let add = f.register(A, &EmuDesign::vector_scalar_add(STAGED / 4, DType::I32, 1));
    let fault = f.register(B, &EmuDesign::fault(4096));
    let imports = [
        f.import(A, u64::from(STAGED)),
        f.import(A, u64::from(STAGED)),
    ];
    let attached = [
        f.attach(A, 1, u64::from(STAGED)),
        f.attach(A, 2, u64::from(STAGED)),
    ];
    let allocations = [f.allocate(B, 4096), f.allocate(B, 4096)];
    let staged = f.work_as(A, 1000, vec![(add, [1, 2])]);
    let faulted = f.work_as(B, 1000, vec![(fault, [3, 4])]);
    let exec = f.serve();
    for r in imports {
        r.blocking_recv().unwrap().unwrap();
    }
    for r in attached {
        r.blocking_recv().unwrap().unwrap();
    }
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    faulted.blocking_recv().unwrap().unwrap();
    let e = staged.blocking_recv().unwrap().unwrap_err();
    assert_eq!(e.code_name(), "RESOURCE_EXHAUSTED", "{e}");
    assert!(
        e.to_string()
            .starts_with("uid:1000 faulted the device once within"),
        "{e}"
    );
    shutdown(exec);
}

/// A chain of sixteen programs that are not loaded yet loads one a turn: another session's
/// dispatch queued behind it is served between its loads, not after all sixteen.
#[test]
fn a_chain_of_programs_not_yet_loaded_loads_one_a_turn_and_others_run_between() {
    let mut f = fixture(1 << 20);
    let programs: Vec<Arc<Program>> = (1..=16)
        .map(|k| f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, k)))
        .collect();
    let add = f.register(B, &EmuDesign::vector_scalar_add(1024, DType::I32, 100));
    let hang = f.register(C, &EmuDesign::hang(4096));
    let allocations = f.two_tensors_each(&[A, B, C]);
    let mut chain = f.work(A, programs.iter().map(|p| (p.clone(), [1, 2])).collect());
    let dispatch = f.work(B, vec![(add, [3, 4])]);
    // C's turn after B's holds the device for the emulator's timeout (2 s), so that the check
    // below sees where A was when B was served.
    let held = f.work_as(C, 2000, vec![(hang, [5, 6])]);
    let exec = f.serve();
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    let done = dispatch.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (1, None));
    assert!(
        matches!(chain.try_recv(), Err(TryRecvError::Empty)),
        "B's dispatch waited for A's sixteen loads"
    );
    assert!(held.blocking_recv().unwrap().unwrap().failure.is_some());
    let done = chain.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (16, None));
    assert_eq!(f.programs.counts().loads, 18);
    shutdown(exec);
}

/// A long chain's links are checked a slice a turn: another session's dispatch queued behind
/// it runs before the last slice is checked, and a bad last link still refuses the whole chain
/// with nothing of it run.
#[test]
fn a_long_chain_is_checked_a_slice_a_turn_and_a_bad_last_link_refuses_it_whole() {
    let mut f = fixture(1 << 20);
    let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let other = f.register(B, &EmuDesign::vector_scalar_add(1024, DType::I32, 2));
    let hang = f.register(C, &EmuDesign::hang(4096));
    let allocations = f.two_tensors_each(&[A, B, C]);
    // The last link names B's tensor, which A cannot use.
    let mut links = vec![(add.clone(), [1, 2]); 1024];
    links[1023] = (add, [1, 3]);
    let mut chain = f.work(A, links);
    let dispatch = f.work(B, vec![(other, [3, 4])]);
    // C's turn after B's holds the device for the emulator's timeout (2 s), so that the check
    // below sees where A was when B was served.
    let held = f.work_as(C, 2000, vec![(hang, [5, 6])]);
    let exec = f.serve();
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    let done = dispatch.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (1, None));
    assert!(
        matches!(chain.try_recv(), Err(TryRecvError::Empty)),
        "B's dispatch waited for all 1,024 of A's links to be checked"
    );
    assert!(held.blocking_recv().unwrap().unwrap().failure.is_some());
    let e = chain.blocking_recv().unwrap().unwrap_err();
    assert_eq!(e.code_name(), "NOT_FOUND");
    assert!(
        e.message().starts_with("links[1023].args[1].tensor_id"),
        "{e}"
    );
    // Nothing of the chain ran: the only dispatches the device saw were B's and C's.
    assert_eq!(f.programs.counts().loads, 2);
    shutdown(exec);
}

/// Loads evict least-recently-used programs in the turn of the session that needs the room,
/// a few a turn, and never a program of the item that holds the loader: two chains that each
/// need the whole cache take turns at it and both run (neither evicts the other forever).
#[test]
fn loads_evict_in_the_loading_sessions_turns_and_never_the_loading_items_programs() {
    let mut f = fixture_with(Config {
        executor: crate::config::ExecutorConfig {
            spin_us: 0,
            slice_bytes: 1 << 20,
            ..crate::config::ExecutorConfig::default()
        },
        limits: crate::config::Limits {
            max_cached_programs: 8,
            ..crate::config::Limits::default()
        },
        ..Config::default()
    });
    let others: Vec<Arc<Program>> = (1..=8)
        .map(|k| f.register(B, &EmuDesign::vector_scalar_add(1024, DType::I32, 100 + k)))
        .collect();
    let mine: Vec<Arc<Program>> = (1..=8)
        .map(|k| f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, k)))
        .collect();
    let allocations = f.two_tensors_each(&[A, B]);
    let first = f.work(B, others.iter().map(|p| (p.clone(), [3, 4])).collect());
    let chain = f.work(A, mine.iter().map(|p| (p.clone(), [1, 2])).collect());
    let exec = f.serve();
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    let done = first.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (8, None));
    let done = chain.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (8, None));
    // Sixteen programs through a cache of eight: at least eight evictions, and what is loaded
    // at the end is a full cache. (B's loads may evict programs A loaded into free room while
    // B held the loader; A loads them again once B is done.)
    let counts = f.programs.counts();
    assert!(counts.evictions >= 8, "{counts:?}");
    assert_eq!(counts.loads - counts.evictions, 8, "{counts:?}");
    shutdown(exec);
}

/// Releasing a session frees its tensors `executor.slice_bytes` a turn: another session's
/// dispatch queued behind the release is served before the last of 600 tensors is
/// freed, and the release answers with the count once all are.
#[test]
fn a_session_release_frees_its_tensors_in_turns_and_others_run_between() {
    const TENSORS: usize = 600;
    let mut f = fixture_with(Config {
        executor: crate::config::ExecutorConfig {
            spin_us: 0,
            slice_bytes: 4096,
            ..crate::config::ExecutorConfig::default()
        },
        limits: crate::config::Limits {
            max_tensors_per_session: 1000,
            ..crate::config::Limits::default()
        },
        ..Config::default()
    });
    let add = f.register(B, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let hang = f.register(C, &EmuDesign::hang(4096));
    let b = [
        f.allocate(B, 4096),
        f.allocate(B, 4096),
        f.allocate(C, 4096),
        f.allocate(C, 4096),
    ];
    let a: Vec<_> = (0..TENSORS).map(|_| f.allocate(A, 4096)).collect();
    let (reply, mut released) = oneshot::channel();
    f.queue(Command::ReleaseSession { session: A, reply });
    let dispatch = f.work(B, vec![(add, [1, 2])]);
    // C's turn after B's holds the device for the emulator's timeout (2 s).
    let held = f.work_as(C, 2000, vec![(hang, [3, 4])]);
    let exec = f.serve();
    for r in b.into_iter().chain(a) {
        r.blocking_recv().unwrap().unwrap();
    }
    let done = dispatch.blocking_recv().unwrap().unwrap();
    assert_eq!((done.completed, done.failure), (1, None));
    assert!(
        matches!(released.try_recv(), Err(TryRecvError::Empty)),
        "B's dispatch waited for A's 600 frees"
    );
    assert!(held.blocking_recv().unwrap().unwrap().failure.is_some());
    assert_eq!(released.blocking_recv().unwrap(), TENSORS);
    let (reply, size) = oneshot::channel();
    f.handle
        .tx
        .blocking_send(Command::Size {
            session: A,
            tensor: 5,
            reply,
        })
        .unwrap();
    assert_eq!(
        size.blocking_recv().unwrap().unwrap_err().code_name(),
        "NOT_FOUND"
    );
    shutdown(exec);
}

type Answer = oneshot::Receiver<Result<WorkDone, NpudError>>;

/// Every answer, in the order the dispatches were queued.
fn answers(rxs: Vec<Answer>) -> Vec<Result<WorkDone, NpudError>> {
    rxs.into_iter()
        .map(|r| r.blocking_recv().unwrap())
        .collect()
}

/// (doorbells, completed, failure's code) of each answer: what a merged batch changes.
fn shapes(done: &[Result<WorkDone, NpudError>]) -> Vec<(u32, usize, Option<&'static str>)> {
    done.iter()
        .map(|r| match r {
            Ok(d) => (
                d.doorbells,
                d.completed,
                d.failure.as_ref().map(|f| f.error.code_name()),
            ),
            Err(e) => (0, 0, Some(e.code_name())),
        })
        .collect()
}

#[test]
fn one_sessions_queued_single_dispatches_ring_together_a_doorbell_batch_at_a_time() {
    let mut f = fixture(1 << 20);
    let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let allocations = [f.allocate(A, 4096), f.allocate(A, 4096)];
    // 40 single dispatches queued at once: a batch of 32 (the noop plan's doorbell) and one of 8.
    let rxs: Vec<Answer> = (0..40)
        .map(|_| f.work(A, vec![(add.clone(), [1, 2])]))
        .collect();
    let exec = f.serve();
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    let done = answers(rxs);
    let shapes = shapes(&done);
    assert!(
        shapes.iter().all(|(_, c, e)| (*c, *e) == (1, None)),
        "{shapes:?}"
    );
    let rang: Vec<usize> = (0..40).filter(|k| shapes[*k].0 == 1).collect();
    assert_eq!(
        rang,
        [0, 32],
        "one doorbell for the first 32, one for the last 8"
    );
    assert_eq!(shapes.iter().map(|s| s.0).sum::<u32>(), 2);
    // Each has its own queue time and a share of its batch's device time.
    for d in done.iter().flatten() {
        assert!(d.device_ns > 0, "{d:?}");
    }
    shutdown(exec);
}

/// 40 single dispatches of batch session A queued, then one of interactive session I with
/// `deadline`: (A's answers, I's answer) once all are done.
fn forty_batch_then_one_interactive(
    deadline: Option<std::time::Duration>,
) -> (Vec<Result<WorkDone, NpudError>>, WorkDone) {
    const I: u64 = 9;
    let mut f = fixture(1 << 20);
    let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let mine = f.register(I, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let allocations = [
        f.allocate(A, 4096),
        f.allocate(A, 4096),
        f.allocate(I, 4096),
        f.allocate(I, 4096),
    ];
    let a: Vec<Answer> = (0..40)
        .map(|_| f.work(A, vec![(add.clone(), [1, 2])]))
        .collect();
    let i = f.work_with(
        I,
        1001,
        Priority::interactive(deadline),
        vec![(mine, [3, 4])],
    );
    let exec = f.serve();
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    let mut i = i;
    let a = answers(a);
    let i = i.try_recv().expect("answered before A's last").unwrap();
    shutdown(exec);
    (a, i)
}

#[test]
fn an_interactive_dispatch_rings_first_and_then_batch_doorbells_hold_one_dispatch() {
    // A deadline of 1 µs: the shortest wait the device allows.
    let (a, i) = forty_batch_then_one_interactive(Some(std::time::Duration::from_micros(1)));
    // Queued last, it rang first, alone: no batch work joins an interactive doorbell.
    assert_eq!((i.doorbells, i.completed), (1, 1));
    let first_of_a = a[0].as_ref().unwrap();
    assert!(i.queue_ns < first_of_a.queue_ns, "{i:?} {first_of_a:?}");
    // Meanwhile the interactive session is active and its deadline is below two lone
    // doorbells: every doorbell of A is as short as a lone dispatch's.
    assert_eq!(shapes(&a), vec![(1, 1, None); 40]);
}

#[test]
fn an_interactive_deadline_lets_batch_doorbells_hold_what_fits_half_of_it() {
    // Ten seconds: half of it holds every batch.
    let (a, i) = forty_batch_then_one_interactive(Some(std::time::Duration::from_secs(10)));
    assert_eq!((i.doorbells, i.completed), (1, 1));
    let rang: Vec<usize> = (0..40).filter(|k| shapes(&a)[*k].0 == 1).collect();
    assert_eq!(
        rang,
        [0, 32],
        "A rings 32 and 8, as with no interactive session"
    );
}

/// Three dispatches of A and one of B, all queued before the executor serves, of one program
/// (the same bytes registered by both): A's answers, B's, and the running executor.
fn three_of_a_and_one_of_b(mut f: Fixture) -> (Vec<Answer>, Answer, Executor) {
    let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let other = f.register(B, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    assert_eq!(add.id, other.id);
    let allocations = f.two_tensors_each(&[A, B]);
    let a: Vec<Answer> = (0..3)
        .map(|_| f.work(A, vec![(add.clone(), [1, 2])]))
        .collect();
    let b = f.work(B, vec![(other, [3, 4])]);
    let exec = f.serve();
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    (a, b, exec)
}

#[test]
fn dispatches_of_several_sessions_ring_as_one_batch() {
    let (a, b, exec) = three_of_a_and_one_of_b(fixture(1 << 20));
    // One doorbell for all four, counted on the batch's first dispatch (A's first); each is
    // answered as if alone, with its share of the device's time.
    let done = answers(a);
    assert_eq!(shapes(&done), [(1, 1, None), (0, 1, None), (0, 1, None)]);
    let b = b.blocking_recv().unwrap().unwrap();
    assert_eq!((b.doorbells, b.completed), (0, 1));
    assert!(b.device_ns > 0, "{b:?}");
    shutdown(exec);
}

#[test]
fn without_batching_across_sessions_nothing_merges_while_another_session_waits() {
    let f = fixture_with(Config {
        executor: crate::config::ExecutorConfig {
            spin_us: 0,
            batch_across_sessions: false,
            ..crate::config::ExecutorConfig::default()
        },
        ..Config::default()
    });
    let (a, mut b, exec) = three_of_a_and_one_of_b(f);
    let done = answers(a);
    // B waited: A's first rang alone; B then had its turn, and A's last two rang together.
    assert_eq!(shapes(&done), [(1, 1, None), (1, 1, None), (0, 1, None)]);
    let done = b
        .try_recv()
        .expect("B was answered before A's second")
        .unwrap();
    assert_eq!((done.doorbells, done.completed), (1, 1));
    shutdown(exec);
}

/// Five dispatches, the third a fault whose program is not loaded yet: the first two ring
/// together; the fault loads its program at its turn and rings first in a batch with the last
/// two, is answered as alone (its program quarantined, the fault charged), and the last two,
/// not run with it, are checked again at their turn: they run while the budget allows, and
/// are refused once it is spent.
#[test]
fn a_fault_heading_a_merged_batch_gives_the_dispatches_after_it_back_unrun() {
    for budget in [3, 1] {
        let mut f = with_fault_budget(budget);
        let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
        let fault = f.register(A, &EmuDesign::fault(4096));
        let allocations = [f.allocate(A, 4096), f.allocate(A, 4096)];
        let rxs = vec![
            f.work(A, vec![(add.clone(), [1, 2])]),
            f.work(A, vec![(add.clone(), [1, 2])]),
            f.work(A, vec![(fault.clone(), [1, 2])]),
            f.work(A, vec![(add.clone(), [1, 2])]),
            f.work(A, vec![(add.clone(), [1, 2])]),
        ];
        let exec = f.serve();
        for r in allocations {
            r.blocking_recv().unwrap().unwrap();
        }
        let done = answers(rxs);
        let shapes = shapes(&done);
        assert_eq!(shapes[..2], [(1, 1, None), (0, 1, None)], "{shapes:?}");
        assert_eq!(shapes[2].1, 0);
        assert_eq!(shapes[2].2, Some("INTERNAL"), "{:?}", done[2]);
        let failure = done[2].as_ref().unwrap().failure.as_ref().unwrap();
        assert!(
            failure.error.to_string().contains("is quarantined"),
            "{failure:?}"
        );
        assert_eq!(
            f.programs.runnable(fault.id),
            crate::programs::Runnable::Quarantined
        );
        assert_eq!(f.handle.fault_budget().session_faults(A), 1);
        if budget == 1 {
            // The fault spent the identity's budget: what came after it is refused at its
            // turn instead of running.
            for r in &done[3..] {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.code_name(), "RESOURCE_EXHAUSTED", "{e}");
                assert!(
                    e.to_string()
                        .starts_with("uid:1000 faulted the device once"),
                    "{e}"
                );
            }
        } else {
            // Budget left: they ran after the fault, together.
            assert_eq!(shapes[3..], [(1, 1, None), (0, 1, None)], "{shapes:?}");
        }
        shutdown(exec);
    }
}

/// A fault in the middle of a merged batch, with the faulting program already loaded: the
/// dispatch before it completed, the fault is answered as alone, and the ones after it were
/// not run with it; their turn finds the identity's fault budget spent and refuses them.
///
/// Loading the fault program without running it: A's chain loads it at its first turn and is
/// refused at its second, its uid's budget spent meanwhile by B's fault (another program, rung
/// alone: C's first dispatch cannot join it, its program not loaded yet). C, another uid,
/// registered the same bytes (the same program) and finds it loaded: its batch is all five,
/// the fault second.
#[test]
fn a_fault_after_a_completed_dispatch_in_a_merged_batch_stops_the_batch_there() {
    let mut f = with_fault_budget(1);
    let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let fault = f.register(A, &EmuDesign::fault(4096));
    let other_fault = f.register(B, &EmuDesign::fault(8192));
    assert_eq!(f.register(C, &EmuDesign::fault(4096)).id, fault.id);
    assert_eq!(
        f.register(C, &EmuDesign::vector_scalar_add(1024, DType::I32, 1))
            .id,
        add.id
    );
    let allocations = [
        f.allocate(A, 4096),
        f.allocate(A, 4096),
        f.allocate(B, 8192),
        f.allocate(B, 8192),
        f.allocate(C, 4096),
        f.allocate(C, 4096),
    ];
    let chain = f.work_as(
        A,
        1000,
        vec![(fault.clone(), [1, 2]), (add.clone(), [1, 2])],
    );
    let spends = f.work_as(B, 1000, vec![(other_fault, [3, 4])]);
    let c: Vec<Answer> = [&add, &fault, &add, &add, &add]
        .into_iter()
        .map(|p| f.work_as(C, 1001, vec![(p.clone(), [5, 6])]))
        .collect();
    let exec = f.serve();
    for (k, r) in allocations.into_iter().enumerate() {
        assert_eq!(r.blocking_recv().unwrap().unwrap(), k as u64 + 1);
    }
    let done = spends.blocking_recv().unwrap().unwrap();
    assert_eq!(done.failure.unwrap().error.code_name(), "INTERNAL");
    let e = chain.blocking_recv().unwrap().unwrap_err();
    assert_eq!(e.code_name(), "RESOURCE_EXHAUSTED", "{e}");
    let done = answers(c);
    let shapes = shapes(&done);
    // One batch: the first completed and rang it, the second faulted, the last three did not
    // run with it and were refused at their turns.
    assert_eq!(
        shapes,
        [
            (1, 1, None),
            (0, 0, Some("INTERNAL")),
            (0, 0, Some("RESOURCE_EXHAUSTED")),
            (0, 0, Some("RESOURCE_EXHAUSTED")),
            (0, 0, Some("RESOURCE_EXHAUSTED")),
        ]
    );
    let failure = done[1].as_ref().unwrap().failure.as_ref().unwrap();
    assert!(
        failure.error.to_string().contains("is quarantined"),
        "{failure:?}"
    );
    for r in &done[2..] {
        let e = r.as_ref().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("uid:1001 faulted the device once"),
            "{e}"
        );
    }
    assert_eq!(f.handle.fault_budget().session_faults(C), 1);
    shutdown(exec);
}

/// On the timing model, a device fault's time is the faulting session's: its own doorbell
/// (its fresh program's context build, 35 ms, and the fault) and what the re-created queue's
/// first doorbell, rung in others' turn, takes beyond its estimate (the context rebuilt, 35 ms
/// more). The two sessions whose batch rang after the fault are charged only their own first
/// doorbell's share.
#[test]
fn a_fault_and_the_queues_rebuild_after_it_are_charged_to_the_faulting_session() {
    const MS: u64 = 1_000_000;
    let mut f = fixture_with(Config {
        emulator: crate::config::EmulatorConfig {
            timing: "model".into(),
            ..crate::config::EmulatorConfig::default()
        },
        ..fault_budget(10)
    });
    let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    assert_eq!(
        f.register(B, &EmuDesign::vector_scalar_add(1024, DType::I32, 1))
            .id,
        add.id
    );
    // A program of A and B that is not loaded at their first turn, so that their second
    // dispatches do not join the first batch.
    let later = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 2));
    assert_eq!(
        f.register(B, &EmuDesign::vector_scalar_add(1024, DType::I32, 2))
            .id,
        later.id
    );
    let fault = f.register(C, &EmuDesign::fault(4096));
    let allocations = f.two_tensors_each(&[A, B, C]);
    // A's first turn rings A and B together, building the queue's context; C's turn rings its
    // fault alone (A and B, charged half a context build each, are too far ahead to join it);
    // A's next turn rings A and B again, on the re-created queue, which builds the context
    // again.
    let rxs = vec![
        f.work(A, vec![(add.clone(), [1, 2])]),
        f.work(B, vec![(add, [3, 4])]),
        f.work_as(C, 1001, vec![(fault, [5, 6])]),
        f.work(A, vec![(later.clone(), [1, 2])]),
        f.work(B, vec![(later, [3, 4])]),
    ];
    let exec = f.serve();
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    let done = answers(rxs);
    let shapes = shapes(&done);
    // A and B ring together twice, in one doorbell each time.
    for pair in [&shapes[..2], &shapes[3..]] {
        assert!(
            pair.iter().all(|(_, c, e)| (*c, *e) == (1, None)),
            "{shapes:?}"
        );
        assert_eq!(pair[0].0 + pair[1].0, 1, "{shapes:?}");
    }
    assert_eq!(
        (shapes[2].1, shapes[2].2),
        (0, Some("INTERNAL")),
        "{shapes:?}"
    );
    let (reply, rx) = oneshot::channel();
    f.queue(Command::Charges {
        sessions: vec![A, B, C],
        reply,
    });
    let charged = rx.blocking_recv().unwrap();
    let [a, b, c] = charged[..] else {
        panic!("{charged:?}")
    };
    // Two context builds: the fault's own and the rebuild after it.
    assert!(c >= 65 * MS, "the faulting session was charged {c} ns");
    // Half of the first context build each, and nothing of the rebuild.
    for (who, x) in [("A", a), ("B", b)] {
        assert!(
            (15 * MS..30 * MS).contains(&x),
            "{who} was charged {x} ns (C {c} ns)"
        );
    }
    shutdown(exec);
}

/// A dispatch refused by its own checks (here its deadline passed in the queue) ends the
/// batch and is answered at its turn, after the ones before it and before the ones after it.
#[test]
fn a_dispatch_refused_by_its_checks_is_answered_in_its_place_between_merged_batches() {
    let mut f = fixture(1 << 20);
    let add = f.register(A, &EmuDesign::vector_scalar_add(1024, DType::I32, 1));
    let allocations = [f.allocate(A, 4096), f.allocate(A, 4096)];
    let first = vec![
        f.work(A, vec![(add.clone(), [1, 2])]),
        f.work(A, vec![(add.clone(), [1, 2])]),
    ];
    let mut late = f.late(A, add.clone(), [1, 2]);
    let after = vec![
        f.work(A, vec![(add.clone(), [1, 2])]),
        f.work(A, vec![(add.clone(), [1, 2])]),
    ];
    let exec = f.serve();
    for r in allocations {
        r.blocking_recv().unwrap().unwrap();
    }
    let done = answers(first);
    assert_eq!(shapes(&done), [(1, 1, None), (0, 1, None)]);
    let done = answers(after);
    assert_eq!(shapes(&done), [(1, 1, None), (0, 1, None)]);
    // Answered before the ones queued after it ran.
    let e = late.try_recv().unwrap().unwrap_err();
    assert_eq!(e.code_name(), "DEADLINE_EXCEEDED", "{e}");
    shutdown(exec);
}

fn shutdown(exec: Executor) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(exec.shutdown(std::time::Duration::from_secs(10)));
}

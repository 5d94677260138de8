//! Malformed programs, argument checks before the device, quotas and size limits.

#![forbid(unsafe_code)]

use npu_artifacts::NpuGen;
use npu_artifacts::emu::{DType, EmuDesign};
use npu_proto::v1 as pb;
use npud_e2e::{Daemon, Options, Session, dispatch_request};

const N: u32 = 1024;
const BYTES: u64 = N as u64 * 4;

fn vsa() -> EmuDesign {
    EmuDesign::vector_scalar_add(N, DType::I32, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_programs_are_refused_with_the_artifact_error() {
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "bad").await.unwrap();
    let design = vsa();
    let pdi = design.to_pdi();
    let insts = design.insts(NpuGen::Npu2);

    // A truncated instruction stream.
    let e = s
        .register_bytes(pdi.clone(), insts[..insts.len() - 4].to_vec(), "cut")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let want = npu_artifacts::design::check_pair(&pdi, &insts[..insts.len() - 4])
        .unwrap_err()
        .to_string();
    assert_eq!(e.message(), format!("invalid program: {want}"));
    assert!(e.message().contains("insts.bin"), "{e:?}");

    // Not a PDI at all.
    let e = s
        .register_bytes(vec![0x42; 80], insts.clone(), "junk")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().starts_with("invalid program: main.pdi: "),
        "{e:?}"
    );

    // A broken checksum in an emulated design.
    let mut bad = pdi.clone();
    bad[70] ^= 1;
    let e = s
        .register_bytes(bad, insts.clone(), "crc")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    // Built for the other generation.
    let e = s
        .register_bytes(pdi.clone(), design.insts(NpuGen::Npu1), "npu1")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("npu1") && e.message().contains("npu2"),
        "{e:?}"
    );

    // Empty fields name themselves.
    let e = s
        .register_bytes(Vec::new(), insts.clone(), "")
        .await
        .unwrap_err();
    assert_eq!(e.message(), "pdi: empty");

    // Nothing was stored.
    let st = s.statistics().await.unwrap();
    assert!(st.programs.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_or_too_small_arguments_are_refused_before_the_device() {
    let d = Daemon::start(Options::default());
    let mut s = Session::open(d.connect().await, "args").await.unwrap();
    let p = s.register(&vsa()).await.unwrap().program_id;
    let a = s.alloc_mapped(BYTES).await.unwrap();
    let small = s.alloc_mapped(BYTES / 2).await.unwrap();

    let e = s.dispatch(p, &[a.id]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .starts_with("args: program 1 (vector_scalar_add) takes 2 buffer arguments; 1 given"),
        "{e:?}"
    );
    let e = s.dispatch(p, &[a.id, small.id]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().starts_with(
            "args[1]: 2048 bytes, but program 1 (vector_scalar_add) needs at least 4096"
        ),
        "{e:?}"
    );
    let mut link = dispatch_request(p, &[a.id, a.id]);
    link.args[1].offset = 8;
    let e = s
        .chain(vec![dispatch_request(p, &[a.id, a.id]), link])
        .await
        .unwrap_err();
    assert!(
        e.message().starts_with("links[1].args[1]: 4088 bytes"),
        "{e:?}"
    );
    let mut link = dispatch_request(p, &[a.id, a.id]);
    link.args[0].length = BYTES + 4;
    let e = s.chain(vec![link]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .starts_with("links[0].args[0]: bytes 0..4100 are outside"),
        "{e:?}"
    );
    let e = s.chain(Vec::new()).await.unwrap_err();
    assert_eq!(e.message(), "links: a chain needs at least one link");
    // No refused dispatch reached the device.
    let st = s.statistics().await.unwrap();
    assert_eq!(st.programs[0].loads, 0);
    assert_eq!(st.device_faults, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_and_oversized_requests_are_resource_exhausted() {
    let d = Daemon::start(
        Options::default()
            .env("NPUD_LIMITS__MAX_TENSORS_PER_SESSION", "3")
            .env("NPUD_LIMITS__MAX_TENSOR_BYTES_PER_SESSION", "16384")
            .env("NPUD_LIMITS__MAX_CHAIN_LINKS", "8")
            .env("NPUD_LIMITS__MAX_PROGRAM_BYTES", "65536")
            .env("NPUD_LIMITS__MAX_SESSIONS", "2"),
    );
    let mut s = Session::open(d.connect().await, "quota").await.unwrap();
    let p = s.register(&vsa()).await.unwrap().program_id;

    let alloc = |size| pb::AllocateTensorRequest {
        size_bytes: size,
        name: String::new(),
    };
    let e = s
        .client
        .allocate_tensor(s.req(alloc(16385)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(
        e.message().contains("limits.max_tensor_bytes_per_session"),
        "{e:?}"
    );
    let a = s.alloc_mapped(BYTES).await.unwrap();
    let b = s.alloc_mapped(BYTES).await.unwrap();
    s.alloc_mapped(BYTES).await.unwrap();
    let e = s.client.allocate_tensor(s.req(alloc(4))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        e.message(),
        "the session already has 3 tensors (limits.max_tensors_per_session)"
    );
    let e = s.client.allocate_tensor(s.req(alloc(0))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    let links: Vec<_> = (0..9).map(|_| dispatch_request(p, &[a.id, b.id])).collect();
    let e = s.chain(links).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    // Counted before decoding (the intake), so the count past the limit is not known.
    assert_eq!(
        e.message(),
        "links: more than 8 links; at most 8 (limits.max_chain_links); refused before decoding"
    );

    let design = vsa();
    let e = s
        .register_bytes(vec![0; 70_000], design.insts(NpuGen::Npu2), "huge")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("limits.max_program_bytes"), "{e:?}");

    Session::open(d.connect().await, "second").await.unwrap();
    let e = Session::open(d.connect().await, "third").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("limits.max_sessions"), "{e:?}");
}

//! The same code over the Unix socket (tensors shared by fd) and over TCP (tensors staged through
//! the API) gives the same results, and the results IRON's examples expect.

mod common;

use common::Daemon;
use npu_client::artifacts::emu::{DType, EmuDesign};
use npu_client::{Client, ClientError, Program, bf16};

/// Inputs and outputs of one run of every case, as bytes.
async fn run_all(address: &str) -> Result<(bool, Vec<Vec<u8>>), ClientError> {
    let client = Client::connect(Some(address)).await?;
    let g = client.generation();
    let mut out = Vec::new();

    // vector_scalar_add: out = in + 1 over arange(1, 1025).
    let vsa = Program::emulated(&EmuDesign::vector_scalar_add(1024, DType::I32, 1), g)?;
    let input: Vec<i32> = (1..=1024).collect();
    let a = client.tensor_from(&input).await?;
    let mut b = client.alloc::<i32>(1024).await?;
    client.dispatch(&vsa, &[&a], &mut [&mut b]).await?;
    assert_eq!(b.as_slice(), (2..=1025).collect::<Vec<i32>>().as_slice());
    out.push(bytemuck::cast_slice(b.as_slice()).to_vec());

    // vector_vector_add: c = a + b.
    let vva = Program::emulated(&EmuDesign::vector_vector_add(256, DType::I32), g)?;
    let x: Vec<i32> = (0..256).map(|i| (i * 37) % 100).collect();
    let y: Vec<i32> = (0..256).map(|i| (i * 11) % 100).collect();
    let (tx, ty, mut tz) = (
        client.tensor_from(&x).await?,
        client.tensor_from(&y).await?,
        client.alloc::<i32>(256).await?,
    );
    client.dispatch(&vva, &[&tx, &ty], &mut [&mut tz]).await?;
    let want: Vec<i32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
    assert_eq!(tz.as_slice(), want.as_slice());
    out.push(bytemuck::cast_slice(tz.as_slice()).to_vec());

    // matmul i16 -> i32, 32x32x32, tensors of different element types in one call.
    let n = 32_usize;
    let mm = Program::emulated(&EmuDesign::matmul(32, 32, 32, DType::I16, DType::I32), g)?;
    let ma: Vec<i16> = (0..n * n)
        .map(|i| i16::try_from(i % 17).unwrap() - 8)
        .collect();
    let mb: Vec<i16> = (0..n * n)
        .map(|i| i16::try_from(i % 13).unwrap() - 6)
        .collect();
    let (ta, tb, mut tc) = (
        client.tensor_from(&ma).await?,
        client.tensor_from(&mb).await?,
        client.alloc::<i32>(n * n).await?,
    );
    client.dispatch(&mm, &[&ta, &tb], &mut [&mut tc]).await?;
    let mut want = vec![0_i32; n * n];
    for r in 0..n {
        for c in 0..n {
            want[r * n + c] = (0..n)
                .map(|k| i32::from(ma[r * n + k]) * i32::from(mb[k * n + c]))
                .sum();
        }
    }
    assert_eq!(tc.as_slice(), want.as_slice());
    out.push(bytemuck::cast_slice(tc.as_slice()).to_vec());

    // matmul bf16 -> f32, 16x16x16: IRON's tolerance (abs 0.5, rel 0.05).
    let m = 16_usize;
    let bmm = Program::emulated(&EmuDesign::matmul(16, 16, 16, DType::Bf16, DType::F32), g)?;
    let fa: Vec<f32> = (0..m * m)
        .map(|i| f32::from(u8::try_from(i % 16).unwrap()) / 4.0)
        .collect();
    let fb: Vec<f32> = (0..m * m)
        .map(|i| f32::from(u8::try_from(i % 7).unwrap()) / 2.0)
        .collect();
    let ba: Vec<bf16> = fa.iter().copied().map(bf16::from_f32).collect();
    let bb: Vec<bf16> = fb.iter().copied().map(bf16::from_f32).collect();
    let (t1, t2, mut t3) = (
        client.tensor_from(&ba).await?,
        client.tensor_from(&bb).await?,
        client.alloc::<f32>(m * m).await?,
    );
    client.dispatch(&bmm, &[&t1, &t2], &mut [&mut t3]).await?;
    for r in 0..m {
        for c in 0..m {
            let want: f32 = (0..m)
                .map(|k| ba[r * m + k].to_f32() * bb[k * m + c].to_f32())
                .sum();
            let got = t3.as_slice()[r * m + c];
            assert!(
                (got - want).abs() < 0.5_f32.max(0.05 * (got.abs() + want.abs())),
                "C[{r}][{c}] = {got}, expected {want}"
            );
        }
    }
    out.push(bytemuck::cast_slice(t3.as_slice()).to_vec());

    // relu over i8.
    let relu = Program::emulated(&EmuDesign::relu(64, DType::I8), g)?;
    let v: Vec<i8> = (0..64).map(|i| i8::try_from(i).unwrap() - 32).collect();
    let (r1, mut r2) = (client.tensor_from(&v).await?, client.alloc::<i8>(64).await?);
    client.dispatch(&relu, &[&r1], &mut [&mut r2]).await?;
    let want: Vec<i8> = v.iter().map(|x| (*x).max(0)).collect();
    assert_eq!(r2.as_slice(), want.as_slice());
    out.push(bytemuck::cast_slice(r2.as_slice()).to_vec());

    // A chain, IRON's runlist test: out0 = in + 1, out1 = out0 + 1.
    let mut cin = client.alloc::<i32>(1024).await?;
    cin.copy_from_slice(&input)?;
    let (mut c0, mut c1) = (
        client.alloc::<i32>(1024).await?,
        client.alloc::<i32>(1024).await?,
    );
    let mut chain = client.chain();
    let (i, o0, o1) = (chain.read(&cin), chain.write(&mut c0), chain.write(&mut c1));
    chain.then(&vsa, &[i, o0]).then(&vsa, &[o0, o1]);
    let r = chain.run().await?.ok()?;
    assert_eq!(r.completed, 2);
    assert_eq!(c0.as_slice()[0], 2);
    assert_eq!(c1.as_slice(), (3..=1026).collect::<Vec<i32>>().as_slice());
    out.push(bytemuck::cast_slice(c0.as_slice()).to_vec());
    out.push(bytemuck::cast_slice(c1.as_slice()).to_vec());

    // Writing an input again and dispatching again uses the new values.
    cin.as_mut_slice().fill(100);
    client.dispatch(&vsa, &[&cin], &mut [&mut c0]).await?;
    assert!(c0.as_slice().iter().all(|&v| v == 101));
    out.push(bytemuck::cast_slice(c0.as_slice()).to_vec());

    let shared = a.is_shared();
    client.close().await?;
    Ok((shared, out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_and_remote_give_identical_results() {
    let d = Daemon::start();
    let (local_shared, local) = run_all(&d.unix()).await.expect("local run");
    let (remote_shared, remote) = run_all(&d.http()).await.expect("remote run");
    assert!(local_shared, "tensors over the Unix socket are fd-shared");
    assert!(!remote_shared, "tensors over TCP are staged");
    assert_eq!(local.len(), remote.len());
    for (i, (l, r)) in local.iter().zip(&remote).enumerate() {
        assert_eq!(l, r, "case {i} differs between local and remote");
    }
}

#[test]
fn blocking_facade_runs_a_dispatch_and_a_chain() {
    let d = Daemon::start();
    for address in [d.unix(), d.http()] {
        let client = npu_client::blocking::Client::connect(Some(&address)).expect("connect");
        let p = Program::emulated(
            &EmuDesign::vector_scalar_add(64, DType::U32, 5),
            client.generation(),
        )
        .expect("program");
        let a = client.tensor_from(&[7_u32; 64]).expect("a");
        let mut b = client.alloc::<u32>(64).expect("b");
        let mut c = client.alloc::<u32>(64).expect("c");
        client.dispatch(&p, &[&a], &mut [&mut b]).expect("dispatch");
        assert!(b.as_slice().iter().all(|&v| v == 12), "{address}");
        let mut chain = client.chain();
        let (ta, tb, tc) = (chain.read(&a), chain.write(&mut b), chain.write(&mut c));
        chain.then(&p, &[ta, tb]).then(&p, &[tb, tc]);
        let r = chain.run().expect("chain");
        assert!(r.failure.is_none());
        assert!(c.as_slice().iter().all(|&v| v == 17), "{address}");
        client.close().expect("close");
    }
}

#[tokio::test]
async fn daemon_errors_keep_code_and_message() {
    let d = Daemon::start();
    let client = Client::connect(Some(&d.unix())).await.expect("connect");
    let p = Program::emulated(
        &EmuDesign::vector_vector_add(64, DType::I32),
        client.generation(),
    )
    .expect("program");
    let a = client.alloc::<i32>(64).await.expect("a");
    let mut small = client.alloc::<i32>(8).await.expect("small");
    let e = client
        .dispatch(&p, &[&a, &a], &mut [&mut small])
        .await
        .expect_err("a too-small output");
    assert_eq!(e.code(), Some(tonic::Code::InvalidArgument), "{e}");
    assert!(
        e.to_string()
            .starts_with("Dispatch failed (INVALID_ARGUMENT): "),
        "{e}"
    );
    assert!(
        e.daemon_message().is_some_and(|m| m.contains("args[2]")),
        "{e}"
    );

    let other = Client::connect(Some(&d.unix()))
        .await
        .expect("second session");
    let e = other
        .dispatch(&p, &[&a, &a], &mut [&mut small])
        .await
        .expect_err("a tensor of another session");
    assert!(e.to_string().contains("belongs to another session"), "{e}");
}

#[tokio::test]
async fn a_chain_failing_on_the_device_reports_the_link() {
    let d = Daemon::start();
    let client = Client::connect(Some(&d.http())).await.expect("connect");
    let g = client.generation();
    let ok = Program::emulated(&EmuDesign::passthrough(64), g).expect("passthrough");
    let bad = Program::emulated(&EmuDesign::fault(64), g).expect("fault");
    let a = client.tensor_from(&[3_u8; 64]).await.expect("a");
    let mut b = client.alloc::<u8>(64).await.expect("b");
    let mut t = client.alloc::<u8>(64).await.expect("trace");
    let mut chain = client.chain();
    let (ta, tb, tt) = (chain.read(&a), chain.write(&mut b), chain.write(&mut t));
    chain
        .then(&ok, &[ta, tb, tt])
        .then(&bad, &[ta, tb])
        .then(&ok, &[ta, tb, tt]);
    let r = chain.run().await.expect("the chain call itself succeeds");
    let f = r.failure.clone().expect("link 1 failed");
    assert_eq!((r.completed, f.index, f.not_run.clone()), (1, 1, vec![2]));
    assert_eq!(f.code, tonic::Code::Internal);
    assert!(
        b.as_slice().iter().all(|&v| v == 3),
        "link 0 ran and was downloaded"
    );
    let e = r.ok().expect_err("ok() turns the failure into an error");
    assert!(
        e.to_string()
            .starts_with("chain link 1 failed (INTERNAL): "),
        "{e}"
    );
}

#[tokio::test]
async fn a_written_argument_passed_as_read_is_refused_before_anything_is_sent() {
    let d = Daemon::start();
    let client = Client::connect(Some(&d.unix())).await.expect("connect");
    let g = client.generation();
    let vva = Program::emulated(&EmuDesign::vector_vector_add(64, DType::I32), g).expect("vva");
    assert_eq!(vva.read_only_args(), 2);
    let (a, b) = (
        client.alloc::<i32>(64).await.expect("a"),
        client.alloc::<i32>(64).await.expect("b"),
    );
    let mut c = client.alloc::<i32>(64).await.expect("c");
    let e = client
        .dispatch(&vva, &[&a, &b, &c], &mut [])
        .await
        .expect_err("c is written");
    assert_eq!(
        e.to_string(),
        "vector_vector_add gets 3 arguments to read, but it may write argument 2: it only reads \
         its first 2, pass the rest as written"
    );
    let mut chain = client.chain();
    let (ta, tb, tc) = (chain.read(&a), chain.read(&b), chain.read(&c));
    chain.then(&vva, &[ta, tb, tc]);
    let e = chain.run().await.expect_err("c is written");
    assert_eq!(
        e.to_string(),
        format!(
            "chain link 0: args[2] (tensor {}) was added with read, but vector_vector_add may \
             write it: it only reads its first 2, pass the rest as written",
            c.id()
        )
    );
    // A handle from another chain names the link.
    let mut other = client.chain();
    let foreign = other.write(&mut c);
    let mut chain = client.chain();
    let (ta, tb) = (chain.read(&a), chain.read(&b));
    chain.then(&vva, &[ta, tb, foreign]);
    let e = chain.run().await.expect_err("foreign handle");
    assert_eq!(
        e.to_string(),
        "chain link 0: args[2] was added to another chain"
    );
    let stats = client.statistics().await.expect("statistics");
    let mine = stats
        .sessions
        .iter()
        .find(|s| s.session_id == client.session_id())
        .expect("this session");
    assert_eq!(
        mine.dispatches
            .clone()
            .unwrap_or_default()
            .success
            .unwrap_or_default()
            .count,
        0,
        "nothing reached the device"
    );
}

#[tokio::test]
async fn a_dispatch_abandoned_in_flight_leaves_its_shared_outputs_lent_and_its_inputs_free() {
    let d = Daemon::start();
    // A hung program is quarantined, so each connection hangs a design of another size.
    for (address, bytes) in [(d.unix(), 256), (d.http(), 512)] {
        let client = Client::connect(Some(&address)).await.expect("connect");
        let hang = Program::emulated(&EmuDesign::hang(bytes), client.generation()).expect("hang");
        let len = bytes as usize / 4;
        let input = client.alloc::<i32>(len).await.expect("input");
        let mut output = client.alloc::<i32>(len).await.expect("output");
        // The device hangs until the daemon's watchdog fires; give up long before that.
        let gave_up = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            client.dispatch(&hang, &[&input], &mut [&mut output]),
        )
        .await;
        assert!(gave_up.is_err(), "the hang did not answer within 200 ms");
        assert!(!input.is_lent(), "inputs are only read, never lent");
        assert_eq!(input.as_slice()[0], 0);
        if output.is_shared() {
            assert!(output.is_lent(), "the daemon may still write the output");
            let view = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| output.to_vec()));
            assert!(view.is_err(), "a view of lent memory panics");
        } else {
            // A staged output is the client's private copy: the daemon never writes it.
            assert!(!output.is_lent(), "{address}");
            assert_eq!(output.as_slice()[0], 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_longer_than_a_page_come_whole_from_the_client() {
    // The daemon answers at most 256 programs a call; the client walks the pages.
    const PROGRAMS: usize = 2 * 256 + 9;
    let d = Daemon::start();
    let client = Client::connect(Some(&d.unix())).await.expect("connect");
    let g = client.generation();
    let mut ids = Vec::new();
    for k in 0..PROGRAMS {
        let p = Program::emulated(&EmuDesign::vector_scalar_add(64, DType::I32, k as i64), g)
            .expect("program");
        ids.push(client.register(&p).await.expect("register").id);
    }
    ids.sort_unstable();
    let listed: Vec<u64> = client
        .programs()
        .await
        .expect("programs")
        .iter()
        .map(|p| p.program_id)
        .collect();
    assert_eq!(listed, ids, "every program once, in id order");
    let counted: Vec<u64> = client
        .statistics()
        .await
        .expect("statistics")
        .programs
        .iter()
        .map(|p| p.program_id)
        .collect();
    assert_eq!(counted, ids);
    let op = npu_client::Operator::connect(Some(&d.unix()))
        .await
        .expect("operator");
    let all = op.program_listing().await.expect("listing");
    assert_eq!(all.programs.len(), PROGRAMS);
    assert_eq!(all.next_after_program_id, 0);
    client.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_records_longer_than_a_page_come_whole_from_the_client() {
    // 300 records in the state directory (the daemon reads them at start): more than the 256
    // a listing answers at once.
    const RECORDS: usize = 300;
    let state = tempfile::tempdir().expect("a state directory");
    let dir = state.path().join("quarantine");
    std::fs::create_dir_all(&dir).expect("its quarantine directory");
    let mut hashes: Vec<String> = (0..RECORDS).map(|k| format!("{k:064x}")).collect();
    for h in &hashes {
        let record = serde_json::json!({
            "version": 1,
            "content_hash": h,
            "name": "faulty",
            "faulted_unix_s": 1_700_000_000_u64,
            "reason": "it faulted the device",
        });
        std::fs::write(dir.join(format!("{h}.json")), record.to_string()).expect("a record");
    }
    hashes.sort();
    let d = Daemon::start_with_args(
        2000,
        &["--state-dir", state.path().to_str().expect("a UTF-8 path")],
    );
    let op = npu_client::Operator::connect(Some(&d.unix()))
        .await
        .expect("operator");
    let all = op.program_listing().await.expect("listing");
    let listed: Vec<String> = all
        .quarantine
        .iter()
        .map(|r| r.content_hash.clone())
        .collect();
    assert_eq!(listed, hashes, "every record once, in hash order");
    assert!(all.next_quarantine_after.is_empty());
}

//! The DaemonSet in containers: the runtime image (the Containerfile's `from-host` target,
//! built from this build's binaries), its init container, npud and the device plugin run by
//! podman as `deploy/kubernetes/daemonset.yaml` describes them (users, capabilities, read-only
//! root, the read-only socket directory in the plugin, the token directory), a stand-in
//! kubelet that takes the plugin's registration and asks it for an allocation, and workload
//! containers given exactly the mounts and environment `Allocate` returned, as a kubelet
//! would. A non-root pod with npud's group as its supplementary group runs a design through
//! the socket as its token's identity; a pod that drops its token, one that runs as root
//! without it, and one without the group are refused (`auth.require_token`: no uid is trusted
//! on the socket).
//!
//! The host directories stand in for the DaemonSet's host paths (`/run/npud`,
//! `/var/lib/npud/...`, the kubelet's device-plugins directory); the plugin is told them with
//! `--host-socket-dir` and `--host-token-dir`, since here they differ from the paths inside
//! its container. npud runs on the emulator (no device nodes, so not privileged).
//!
//! Needs root, podman, runc, mmdebstrap and objcopy; otherwise reported as ignored
//! (tests/build.rs). The image's figures are printed (`--no-capture`).

#![forbid(unsafe_code)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use npud_device_plugin::v1beta1 as api;
use npud_device_plugin::v1beta1::device_plugin_client::DevicePluginClient;
use npud_device_plugin::v1beta1::registration_server::{Registration, RegistrationServer};
use npud_e2e::certs::Ca;
use npud_e2e::configmap::shipped_npud_toml;
use npud_e2e::container::{Image, Pod, run_once};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Every wait.
const BOUND: Duration = Duration::from_secs(60);
/// npud's uid and gid in the image and the DaemonSet.
const NPUD_ID: u32 = 65532;

fn daemonset() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/daemonset.yaml"
    ))
    .expect("deploy/kubernetes/daemonset.yaml")
}

/// The init container's script, as the DaemonSet has it.
fn init_script() -> String {
    let yaml = daemonset();
    let script: String = yaml
        .lines()
        .skip_while(|l| l.trim() != "- |")
        .skip(1)
        .take_while(|l| l.starts_with("              "))
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    assert!(script.contains("install -d"), "{script}");
    script
}

/// The device plugin container's arguments, as the DaemonSet has them.
fn plugin_args() -> Vec<String> {
    let yaml = daemonset();
    let args: Vec<String> = yaml
        .lines()
        .skip_while(|l| l.trim() != "- npud-device-plugin")
        .skip(1)
        .map_while(|l| l.trim().strip_prefix("- --").map(|a| format!("--{a}")))
        .collect();
    assert!(
        args.iter().any(|a| a.starts_with("--token-dir=")),
        "{args:?}"
    );
    args
}

/// The stand-in kubelet's `Registration`: passes each request on.
#[derive(Debug)]
struct Kubelet(mpsc::UnboundedSender<api::RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(api::Empty {}))
    }
}

fn volume(host: &Path, container: &str, read_only: bool) -> [String; 2] {
    let ro = if read_only { ":ro" } else { "" };
    ["-v".into(), format!("{}:{container}{ro}", host.display())]
}

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn mode_and_owner(p: &Path) -> (u32, u32, u32) {
    let m = std::fs::metadata(p).expect("metadata");
    (m.permissions().mode() & 0o7777, m.uid(), m.gid())
}

/// A workload container: the allocation's mounts and environment, exactly, as the pod's
/// security context asks (uid, supplementary groups, read-only root, no capabilities).
fn pod_args(c: &api::ContainerAllocateResponse, user: &str, groups: &[u32]) -> Vec<String> {
    let mut a = words(&[
        "--network",
        "none",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--user",
        user,
    ]);
    for g in groups {
        a.extend(["--group-add".into(), g.to_string()]);
    }
    for m in &c.mounts {
        a.extend(volume(
            Path::new(&m.host_path),
            &m.container_path,
            m.read_only,
        ));
    }
    for (k, v) in &c.envs {
        a.extend(["-e".into(), format!("{k}={v}")]);
    }
    for d in &c.devices {
        a.extend([
            "--device".into(),
            format!("{}:{}", d.host_path, d.container_path),
        ]);
    }
    a
}

/// The demo pod's steps (deploy/kubernetes/example), with the result printed.
const WORKLOAD: &str = "id\n\
    npuctl health\n\
    npuctl emu-design vector_scalar_add --out /tmp/vsa\n\
    head -c 4096 /dev/zero > /tmp/in\n\
    npuctl --json run /tmp/vsa --input /tmp/in --output /tmp/out\n\
    echo \"out:$(od -An -td4 -N16 /tmp/out | tr -s ' ')\"\n\
    npuctl --json status | grep caller_identity\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_podman),
    ignore = "needs root, podman, runc, mmdebstrap and objcopy (Debian packages podman, runc, mmdebstrap, binutils)"
)]
async fn the_daemonset_runs_in_podman_and_a_pod_given_its_allocation_runs_a_design() {
    let image = Image::build();
    eprintln!(
        "figure image: base {} in {:.1} s, from-host build in {:.1} s",
        if image.cold {
            "made with mmdebstrap and imported"
        } else {
            "cached"
        },
        image.base_took.as_secs_f64(),
        image.build_took.as_secs_f64()
    );
    let root = tempfile::Builder::new()
        .prefix("npudc")
        .tempdir_in("/tmp")
        .expect("a temporary directory");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = |n: &str| -> PathBuf {
        let p = root.path().join(n);
        std::fs::create_dir_all(&p).expect("a host directory");
        p
    };
    let (run, state, tokens, plugins, etc) = (
        dir("run-npud"),
        dir("state"),
        dir("tokens"),
        dir("device-plugins"),
        dir("etc"),
    );
    let tls = dir("etc/tls");

    // The init container makes the host directories npud's, as in the DaemonSet.
    let mut a = words(&[
        "--network",
        "none",
        "--user",
        "0",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "CHOWN",
        "--cap-add",
        "FOWNER",
        "--security-opt",
        "no-new-privileges",
    ]);
    a.extend(volume(&run, "/run/npud", false));
    a.extend(volume(&state, "/var/lib/npud/state", false));
    a.extend(volume(&tokens, "/var/lib/npud/tokens", false));
    let out = run_once(&a, &image.name, &["sh", "-ec", &init_script()], BOUND);
    assert!(out.status.success(), "init-dirs: {out:?}");
    assert_eq!(mode_and_owner(&run), (0o755, NPUD_ID, NPUD_ID));
    assert_eq!(mode_and_owner(&state), (0o700, NPUD_ID, NPUD_ID));
    assert_eq!(mode_and_owner(&tokens), (0o700, NPUD_ID, NPUD_ID));

    // The ConfigMap's npud.toml (the emulator for the NPU) and the TLS Secret.
    let config = shipped_npud_toml().replace("backend = \"hsa\"", "backend = \"emulator\"");
    std::fs::write(etc.join("npud.toml"), config).expect("npud.toml");
    let ca = Ca::new(&tls, "ca");
    let (crt, key) = ca.server("server");
    std::fs::rename(ca.path(), tls.join("ca.crt")).expect("ca.crt");
    std::fs::rename(crt, tls.join("tls.crt")).expect("tls.crt");
    std::fs::rename(&key, tls.join("tls.key")).expect("tls.key");
    // The Secret's files are readable by npud's uid, as the kubelet's projection makes them.
    std::fs::set_permissions(tls.join("tls.key"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");

    let mut a = words(&[
        "--network",
        "none",
        "--user",
        &format!("{NPUD_ID}:{NPUD_ID}"),
        "--read-only",
        "-e",
        "ROCM_PATH=/opt/rocm",
    ]);
    a.extend(volume(&etc, "/etc/npud", true));
    a.extend(volume(&tls, "/etc/npud/tls", true));
    a.extend(volume(&run, "/run/npud", false));
    a.extend(volume(&state, "/var/lib/npud/state", false));
    a.extend(volume(&tokens, "/var/lib/npud/tokens", true));
    let npud = Pod::start(
        "npud",
        &a,
        &image.name,
        &["npud", "--config", "/etc/npud/npud.toml"],
    );
    // Its startup probe.
    let until = Instant::now() + BOUND;
    loop {
        let out = npud.exec(&["npuctl", "--addr", "unix:/run/npud/npud.sock", "health"]);
        if out.status.success() {
            break;
        }
        assert!(
            npud.running() && Instant::now() < until,
            "npud never became healthy:\n{}",
            npud.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The stand-in kubelet, then the plugin as the DaemonSet runs it.
    let kubelet_socket = plugins.join("kubelet.sock");
    let listener = UnixListener::bind(&kubelet_socket).expect("the kubelet's socket");
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let kubelet = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet(tx)))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let mut a = words(&[
        "--network",
        "none",
        "--user",
        "0",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "DAC_OVERRIDE",
        "--read-only",
        "--security-opt",
        "no-new-privileges",
    ]);
    a.extend(volume(&plugins, "/var/lib/kubelet/device-plugins", false));
    a.extend(volume(&run, "/run/npud", true));
    a.extend(volume(&tokens, "/var/lib/npud/tokens", false));
    let mut command = vec!["npud-device-plugin".to_owned()];
    command.extend(plugin_args());
    command.push(format!("--host-socket-dir={}", run.display()));
    command.push(format!("--host-token-dir={}", tokens.display()));
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let plugin = Pod::start("device-plugin", &a, &image.name, &command);
    let reg = tokio::time::timeout(BOUND, registrations.recv())
        .await
        .unwrap_or_else(|_| panic!("no registration:\n{}", plugin.logs()))
        .expect("the kubelet runs");
    assert_eq!(reg.resource_name, "amd.com/npu");
    let endpoint = plugins.join(&reg.endpoint);
    let mut dp = DevicePluginClient::new(npud_e2e::connect_unix(&endpoint).await);
    let mut lists = dp
        .list_and_watch(api::Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    let until = tokio::time::Instant::now() + BOUND;
    loop {
        let l = tokio::time::timeout_at(until, lists.message())
            .await
            .unwrap_or_else(|_| panic!("the shares never were healthy:\n{}", plugin.logs()))
            .expect("the stream")
            .expect("a list");
        if !l.devices.is_empty() && l.devices.iter().all(|d| d.health == "Healthy") {
            break;
        }
    }
    let r = dp
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["npu0-share-0".into()],
            }],
        })
        .await
        .expect("Allocate")
        .into_inner();
    let c = &r.container_responses[0];
    assert_eq!(c.envs["NPUD_ADDR"], "unix:/run/npud/npud.sock", "{c:?}");

    // A non-root pod with npud's group: runs the design as its token's identity.
    let out = run_once(
        &pod_args(c, "1000:1000", &[NPUD_ID]),
        &image.name,
        &["sh", "-ec", WORKLOAD],
        BOUND,
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}\nnpud:\n{}", npud.logs());
    assert!(
        text.contains("uid=1000") && text.contains(&NPUD_ID.to_string()),
        "{text}"
    );
    assert!(text.contains("SERVING"), "{text}");
    assert!(text.contains("out: 1 1 1 1"), "{text}");
    assert!(
        text.contains("\"caller_identity\": \"token:npu0-share-0@"),
        "{text}"
    );

    // Refused: a pod that drops its token, one that runs as root without it, one without
    // npud's group.
    let skip = "unset NPUD_TOKEN_FILE\nnpuctl emu-design vector_scalar_add --out /tmp/vsa\n\
                head -c 4096 /dev/zero > /tmp/in\nnpuctl run /tmp/vsa --input /tmp/in";
    for (what, user, groups, says) in [
        (
            "no token",
            "1000:1000",
            &[NPUD_ID][..],
            "auth.require_token",
        ),
        (
            "root without its token",
            "0:0",
            &[NPUD_ID][..],
            "auth.require_token",
        ),
        ("no group", "1000:1000", &[][..], "Permission denied"),
    ] {
        let out = run_once(
            &pod_args(c, user, groups),
            &image.name,
            &["sh", "-ec", skip],
            BOUND,
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{what}: {text}");
        assert!(text.contains(says), "{what}: {text}");
    }
    kubelet.abort();
    drop(plugin);
    drop(npud);
}

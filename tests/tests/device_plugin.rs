//! The device plugin against a stand-in kubelet and a real npud on the emulator: the kubelet's
//! side of the device-plugin API v1beta1 (its `Registration` server, a `DevicePlugin` client)
//! from the same proto, and the real `npud-device-plugin` binary in between.
//!
//! Registration (version, endpoint, resource, options); the advertised shares; the preferred
//! allocation; Allocate's mounts, environment and token file (mode, format, rotation, revocation);
//! shares Unhealthy while npud reports NOT_SERVING (a device recovery) or is down, and Healthy
//! when it serves again; registration again after
//! the kubelet restarts (its socket recreated, the plugin's removed); a refused registration
//! stopping the plugin; configuration errors naming the flag.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use npu_artifacts::emu::EmuDesign;
use npud_device_plugin::v1beta1 as api;
use npud_device_plugin::v1beta1::device_plugin_client::DevicePluginClient;
use npud_device_plugin::v1beta1::registration_server::{Registration, RegistrationServer};
use npud_e2e::{Daemon, Options, Session, connect_unix, package_binary, signal};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Every wait in these tests.
const BOUND: Duration = Duration::from_secs(15);
const SHARES: u32 = 3;

/// The stand-in kubelet's `Registration`: records each request, and accepts it or refuses it
/// with `refuse`.
#[derive(Debug)]
struct Recorder {
    seen: mpsc::UnboundedSender<api::RegisterRequest>,
    refuse: Option<String>,
}

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let _ = self.seen.send(request.get_ref().clone());
        match &self.refuse {
            Some(why) => Err(Status::invalid_argument(why.clone())),
            None => Ok(Response::new(api::Empty {})),
        }
    }
}

/// A stand-in kubelet serving `Registration` on `socket`.
struct Kubelet {
    socket: PathBuf,
    registrations: mpsc::UnboundedReceiver<api::RegisterRequest>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl Kubelet {
    fn start(socket: &Path, refuse: Option<&str>) -> Kubelet {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("the stand-in kubelet binds its socket");
        let (seen, registrations) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let recorder = Recorder {
            seen,
            refuse: refuse.map(str::to_owned),
        };
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(recorder))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("the stand-in kubelet serves");
        });
        Kubelet {
            socket: socket.to_owned(),
            registrations,
            stop: Some(stop),
            server: Some(server),
        }
    }

    async fn next_registration(&mut self) -> api::RegisterRequest {
        tokio::time::timeout(BOUND, self.registrations.recv())
            .await
            .expect("a registration within the bound")
            .expect("the recorder lives")
    }

    /// Stops serving and removes every socket in the directory, as a restarting kubelet does.
    async fn stop_and_clean(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.server.take() {
            tokio::time::timeout(BOUND, h)
                .await
                .expect("the stand-in kubelet stops")
                .unwrap();
        }
        let dir = self.socket.parent().unwrap();
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_socket() {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
    }
}

/// The plugin process, stopped with SIGTERM (then SIGKILL) on drop.
struct PluginProcess {
    child: Option<Child>,
    stderr: PathBuf,
}

impl PluginProcess {
    fn start(args: &[String], log_dir: &Path) -> PluginProcess {
        let stderr = log_dir.join("plugin.stderr");
        let file = std::fs::File::create(&stderr).unwrap();
        let mut cmd = Command::new(package_binary("npud-device-plugin", "npud-device-plugin"));
        cmd.args(args)
            .args(["--log-level", "npud_device_plugin=debug,info"])
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        for (k, _) in std::env::vars() {
            if k.starts_with("NPUD_PLUGIN_") {
                cmd.env_remove(k);
            }
        }
        PluginProcess {
            child: Some(cmd.spawn().expect("npud-device-plugin starts")),
            stderr,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits up to the bound for the process to exit on its own.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let until = Instant::now() + BOUND;
        let child = self.child.as_mut().expect("the plugin was started");
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                self.child = None;
                return s;
            }
            assert!(
                Instant::now() < until,
                "the plugin did not exit within the bound:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let child = self.child.as_ref()?;
        signal(child, rustix::process::Signal::TERM);
        let until = Instant::now() + BOUND;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                self.child = None;
                return Some(s);
            }
            if Instant::now() > until {
                let _ = child.kill();
                let s = child.wait().ok();
                self.child = None;
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// The plugin's flags for a kubelet directory, an npud socket and a token directory.
fn plugin_args(kubelet_socket: &Path, npud_socket: &Path, tokens: &Path) -> Vec<String> {
    [
        "--kubelet-socket",
        &kubelet_socket.display().to_string(),
        "--npud-socket",
        &npud_socket.display().to_string(),
        "--token-dir",
        &tokens.display().to_string(),
        "--shares",
        &SHARES.to_string(),
        "--watch-interval-ms",
        "100",
        "--max-backoff-ms",
        "200",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// (id, health) of each device in a list.
fn summary(list: &api::ListAndWatchResponse) -> Vec<(String, String)> {
    list.devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect()
}

/// Reads lists until every share has `health`, within the bound; the lists seen on the way.
async fn until_all(
    stream: &mut tonic::Streaming<api::ListAndWatchResponse>,
    health: &str,
) -> Vec<Vec<(String, String)>> {
    let mut seen = Vec::new();
    let until = tokio::time::Instant::now() + BOUND;
    loop {
        let list = tokio::time::timeout_at(until, stream.message())
            .await
            .unwrap_or_else(|_| panic!("no list with every share {health} in time: {seen:?}"))
            .expect("the ListAndWatch stream does not fail")
            .expect("the ListAndWatch stream does not end");
        let s = summary(&list);
        let ids: Vec<&str> = s.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["npu0-share-0", "npu0-share-1", "npu0-share-2"]);
        let done = s.iter().all(|(_, h)| h == health);
        seen.push(s);
        if done {
            return seen;
        }
    }
}

async fn plugin_client(socket: &Path) -> DevicePluginClient<Channel> {
    let until = Instant::now() + BOUND;
    while !socket.exists() {
        assert!(
            Instant::now() < until,
            "no plugin socket {}",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    DevicePluginClient::new(connect_unix(socket).await)
}

fn allocate_request(ids: &[&str]) -> api::AllocateRequest {
    api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        }],
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A token file's secret, checked against the contract: one line of 32 to 128 characters of
/// `[A-Za-z0-9_-]`, mode 0644.
fn secret(path: &Path) -> String {
    assert_eq!(mode(path), 0o644, "{}", path.display());
    let text = std::fs::read_to_string(path).unwrap();
    let line = text
        .strip_suffix('\n')
        .unwrap_or_else(|| panic!("{text:?} ends in a newline"));
    assert!((32..=128).contains(&line.len()), "{line:?}");
    assert!(
        line.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "{line:?}"
    );
    line.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_registers_lists_allocates_and_follows_npud_and_its_own_restart() {
    // A device recovery holds NOT_SERVING for a second, long enough to be seen.
    let mut npud = Daemon::start(Options::default().env("NPUD_HEALTH__MIN_NOT_SERVING_MS", "1000"));
    let root = tempfile::Builder::new()
        .prefix("dp")
        .tempdir_in("/tmp")
        .unwrap();
    let plugins_dir = root.path().join("dp");
    std::fs::create_dir(&plugins_dir).unwrap();
    let kubelet_socket = plugins_dir.join("kubelet.sock");
    let tokens = root.path().join("tokens");
    let mut kubelet = Kubelet::start(&kubelet_socket, None);
    let mut plugin = PluginProcess::start(
        &plugin_args(&kubelet_socket, &npud.socket, &tokens),
        root.path(),
    );

    // Registration.
    let reg = kubelet.next_registration().await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.resource_name, "amd.com/npu");
    assert_eq!(reg.endpoint, "npud-amd-npu.sock");
    let options = reg.options.expect("options are sent");
    assert!(options.get_preferred_allocation_available && !options.pre_start_required);
    let endpoint = plugins_dir.join(&reg.endpoint);
    let mut dp = plugin_client(&endpoint).await;
    let asked = dp
        .get_device_plugin_options(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(asked, options);
    assert_eq!(mode(&tokens), 0o700, "the token directory's mode");

    // The shares, healthy once the plugin sees npud SERVING.
    let mut lists = dp.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    until_all(&mut lists, "Healthy").await;

    // The preferred allocation: must-include first, then the lowest; a size beyond what is
    // offered is refused with the reason.
    let pref = dp
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec![
                    "npu0-share-2".into(),
                    "npu0-share-1".into(),
                    "npu0-share-0".into(),
                ],
                must_include_device_i_ds: vec!["npu0-share-2".into()],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        ["npu0-share-2", "npu0-share-0"]
    );
    let too_many = dp
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["npu0-share-0".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(too_many.code(), tonic::Code::InvalidArgument);
    assert!(
        too_many
            .message()
            .contains("only 1 of this plugin's devices"),
        "{too_many:?}"
    );

    // Allocate: npud's socket directory and a token file, no device node.
    let r = dp
        .allocate(allocate_request(&["npu0-share-1"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.container_responses.len(), 1);
    let c = &r.container_responses[0];
    let socket_name = npud.socket.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        c.envs,
        HashMap::from([
            (
                "NPUD_ADDR".to_owned(),
                format!("unix:/run/npud/{socket_name}")
            ),
            (
                "NPUD_TOKEN_FILE".to_owned(),
                "/var/run/secrets/npud/token".to_owned()
            ),
        ])
    );
    assert!(c.devices.is_empty() && c.cdi_devices.is_empty() && c.annotations.is_empty());
    let token_file = tokens.join("npu0-share-1");
    assert_eq!(
        c.mounts,
        [
            api::Mount {
                container_path: "/run/npud".into(),
                host_path: npud.dir.path().display().to_string(),
                read_only: true,
            },
            api::Mount {
                container_path: "/var/run/secrets/npud/token".into(),
                host_path: token_file.display().to_string(),
                read_only: true,
            },
        ]
    );
    // The mounted directory holds npud's socket: the container's NPUD_ADDR reaches npud.
    let seen_by_container = Path::new(&c.mounts[0].host_path).join(socket_name);
    assert!(
        std::fs::metadata(&seen_by_container)
            .unwrap()
            .file_type()
            .is_socket()
    );
    let first = secret(&token_file);

    // A new Allocate of the share rotates its secret: the previous pod's no longer works.
    dp.allocate(allocate_request(&["npu0-share-1"]))
        .await
        .unwrap();
    let second = secret(&token_file);
    assert_ne!(first, second, "a fresh secret at each Allocate");
    // Two shares in one allocation: one file named after both; allocating one of them again
    // revokes it.
    dp.allocate(allocate_request(&["npu0-share-2", "npu0-share-0"]))
        .await
        .unwrap();
    let both = tokens.join("npu0-share-0.2");
    secret(&both);
    dp.allocate(allocate_request(&["npu0-share-2"]))
        .await
        .unwrap();
    assert!(
        !both.exists(),
        "share 2 moved on: its old allocation's token is gone"
    );
    secret(&tokens.join("npu0-share-2"));
    assert_eq!(secret(&token_file), second, "share 1 was not touched");
    // An unknown share is refused, naming it, and writes nothing.
    let e = dp
        .allocate(allocate_request(&["npu0-share-7"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .contains("\"npu0-share-7\" is not one of this plugin's devices"),
        "{e:?}"
    );
    // Two containers of one pod cannot hold the same share.
    let e = dp
        .allocate(api::AllocateRequest {
            container_requests: vec![
                api::ContainerAllocateRequest {
                    devices_ids: vec!["npu0-share-0".into()],
                },
                api::ContainerAllocateRequest {
                    devices_ids: vec!["npu0-share-0".into()],
                },
            ],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .contains("container_requests[1] and container_requests[0] list the same device"),
        "{e:?}"
    );
    let pre = dp
        .pre_start_container(api::PreStartContainerRequest {
            devices_ids: vec!["npu0-share-1".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pre, api::PreStartContainerResponse {});

    // A device fault: npud reports NOT_SERVING while it recovers, and the shares follow.
    let mut s = Session::open(npud.connect().await, "faulty").await.unwrap();
    let fault = s.register(&EmuDesign::fault(4096)).await.unwrap();
    let a = s.alloc_mapped(4096).await.unwrap();
    let b = s.alloc_mapped(4096).await.unwrap();
    s.dispatch(fault.program_id, &[a.id, b.id])
        .await
        .unwrap_err();
    until_all(&mut lists, "Unhealthy").await;
    until_all(&mut lists, "Healthy").await;
    drop((a, b, s));

    // npud stops: every share Unhealthy; it starts again: Healthy.
    npud.terminate();
    until_all(&mut lists, "Unhealthy").await;
    npud.restart();
    until_all(&mut lists, "Healthy").await;

    // The kubelet restarts: its socket is recreated and the plugin's removed. The plugin
    // serves on a new socket and registers again; the old stream ends.
    kubelet.stop_and_clean().await;
    assert!(!endpoint.exists());
    let mut kubelet = Kubelet::start(&kubelet_socket, None);
    let again = kubelet.next_registration().await;
    assert_eq!(again, reg, "the same registration");
    let old_end = tokio::time::timeout(BOUND, async {
        while let Ok(Some(_)) = lists.message().await {}
    })
    .await;
    assert!(old_end.is_ok(), "the old socket's ListAndWatch stream ends");
    let mut dp = plugin_client(&endpoint).await;
    let mut lists = dp.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    until_all(&mut lists, "Healthy").await;
    // Token files outlive the kubelet's restart: running pods keep their identities.
    assert_eq!(secret(&token_file), second);

    // SIGTERM: a clean exit, the plugin's socket removed, the tokens kept.
    let status = plugin.terminate().expect("the plugin ran");
    assert!(status.success(), "{status:?}\n{}", plugin.stderr());
    assert!(!endpoint.exists());
    assert!(token_file.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_stops_the_plugin_with_the_kubelets_reason() {
    let root = tempfile::Builder::new()
        .prefix("dp")
        .tempdir_in("/tmp")
        .unwrap();
    let kubelet_socket = root.path().join("kubelet.sock");
    let why = "resource amd.com/npu is already registered by another plugin";
    let mut kubelet = Kubelet::start(&kubelet_socket, Some(why));
    // No npud at all: the plugin still registers (its shares are Unhealthy).
    let mut plugin = PluginProcess::start(
        &plugin_args(
            &kubelet_socket,
            &root.path().join("no-npud.sock"),
            &root.path().join("tokens"),
        ),
        root.path(),
    );
    kubelet.next_registration().await;
    let status = plugin.wait_exit();
    assert_eq!(status.code(), Some(1), "{}", plugin.stderr());
    let stderr = plugin.stderr();
    assert!(
        stderr.contains("the kubelet refused the registration of amd.com/npu")
            && stderr.contains(why),
        "{stderr}"
    );
}

#[test]
fn bad_configuration_is_refused_naming_the_flag_and_print_config_shows_the_allocation() {
    let bin = package_binary("npud-device-plugin", "npud-device-plugin");
    let out = Command::new(&bin)
        .args(["--shares", "0"])
        .env_remove("NPUD_PLUGIN_SHARES")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "npud-device-plugin: --shares: 0 is outside 1 to 64\n"
    );
    let out = Command::new(&bin)
        .arg("--print-config")
        .env("NPUD_PLUGIN_SHARES", "5")
        .env("NPUD_PLUGIN_RESOURCE_NAME", "example.com/npu-share")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["shares"], 5, "{c}");
    assert_eq!(c["resource_name"], "example.com/npu-share");
    assert_eq!(c["container_npud_addr"], "unix:/run/npud/npud.sock");
    assert_eq!(c["host_socket_dir"], "/run/npud");
}

/// Shell words, single-quoted.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The commands a container runtime's bind mounts amount to, from an Allocate answer: parents
/// before children (as containerd orders them), each mount point created when missing (a
/// directory, or an empty file for a file), read-only ones remounted so.
fn mount_script(c: &api::ContainerAllocateResponse) -> String {
    let mut mounts = c.mounts.clone();
    mounts.sort_by_key(|m| Path::new(&m.container_path).components().count());
    let mut script = String::new();
    for m in &mounts {
        let (host, target) = (quoted(&m.host_path), quoted(&m.container_path));
        if Path::new(&m.host_path).is_dir() {
            script += &format!("mkdir -p {target}\n");
        } else {
            script +=
                &format!("mkdir -p \"$(dirname {target})\"\n[ -e {target} ] || : > {target}\n");
        }
        script += &format!("mount --bind {host} {target}\n");
        if m.read_only {
            script += &format!("mount -o remount,ro,bind {target}\n");
        }
    }
    for (k, v) in &c.envs {
        script += &format!("export {k}={}\n", quoted(v));
    }
    script
}

/// npud in a mount namespace of its own that has the host directory `sockets` at /run/npud,
/// as the DaemonSet's npud container has: its socket is /run/npud/npud.sock there.
struct NamespacedNpud {
    child: Child,
}

impl NamespacedNpud {
    /// npud reads its token identities from `tokens` (`auth.token_dir`), as in the DaemonSet.
    fn start(sockets: &Path, tokens: &Path, work: &Path) -> NamespacedNpud {
        let ready = work.join("npud-ready");
        let script = format!(
            "mount --bind {} /run/npud\nexec {} --backend emulator --socket /run/npud/npud.sock \
             --fd-socket /run/npud/npud.fd.sock --state-dir {} --ready-file {}",
            quoted(&sockets.display().to_string()),
            quoted(&npud_e2e::binary("npud").display().to_string()),
            quoted(&work.join("state").display().to_string()),
            quoted(&ready.display().to_string()),
        );
        let log = std::fs::File::create(work.join("npud.stderr")).unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-ec", &script])
            .env_remove("RUST_LOG")
            .env("NPUD_AUTH__TOKEN_DIR", tokens)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("unshare starts");
        let mut d = NamespacedNpud { child };
        let until = Instant::now() + BOUND;
        while !ready.exists() {
            if let Ok(Some(s)) = d.child.try_wait() {
                panic!(
                    "npud exited with {s}:\n{}",
                    std::fs::read_to_string(work.join("npud.stderr")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < until, "npud not ready within the bound");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }
}

impl Drop for NamespacedNpud {
    fn drop(&mut self) {
        signal(&self.child, rustix::process::Signal::TERM);
        let until = Instant::now() + BOUND;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod's view, as far as mounts and environment make it: npud runs in a mount namespace with
/// the host's socket directory at /run/npud (the DaemonSet), and a "container" in another
/// mount namespace gets exactly what Allocate answered (mounts, environment) and runs npuctl:
/// health, an emulated design run with tensors shared through the fd socket whose path npud
/// reports, and its token read from NPUD_TOKEN_FILE. Needs root and unshare(1) for the mount
/// namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(as_root),
    ignore = "needs root: npud and the container are mount namespaces of their own"
)]
async fn a_container_given_the_allocation_reaches_npud_through_its_mounts() {
    let root = tempfile::Builder::new()
        .prefix("dpc")
        .tempdir_in("/tmp")
        .unwrap();
    // Others may enter the test's directory: only the token directory's own mode keeps them out.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sockets = root.path().join("run-npud");
    let plugins_dir = root.path().join("dp");
    let tokens = root.path().join("tokens");
    std::fs::create_dir(&sockets).unwrap();
    std::fs::create_dir(&plugins_dir).unwrap();
    // The mount point npud's and the container's namespaces bind the host directory onto.
    let made_run_npud = !Path::new("/run/npud").exists();
    if made_run_npud {
        std::fs::create_dir_all("/run/npud").unwrap();
    }
    struct RemoveDir(bool);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            if self.0 {
                let _ = std::fs::remove_dir("/run/npud");
            }
        }
    }
    let _cleanup = RemoveDir(made_run_npud);
    std::fs::create_dir(&tokens).unwrap();
    // As the DaemonSet's init container leaves it: npud's (here root's), no access for others.
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o700)).unwrap();
    let _npud = NamespacedNpud::start(&sockets, &tokens, root.path());

    let kubelet_socket = plugins_dir.join("kubelet.sock");
    let mut kubelet = Kubelet::start(&kubelet_socket, None);
    let _plugin = PluginProcess::start(
        &plugin_args(&kubelet_socket, &sockets.join("npud.sock"), &tokens),
        root.path(),
    );
    let reg = kubelet.next_registration().await;
    let mut dp = plugin_client(&plugins_dir.join(&reg.endpoint)).await;
    let mut lists = dp.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    until_all(&mut lists, "Healthy").await;
    let r = dp
        .allocate(allocate_request(&["npu0-share-0"]))
        .await
        .unwrap()
        .into_inner();
    let c = &r.container_responses[0];
    assert_eq!(c.envs["NPUD_ADDR"], "unix:/run/npud/npud.sock");
    let token = secret(&tokens.join("npu0-share-0"));

    let work = root.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let w = |name: &str| quoted(&work.join(name).display().to_string());
    let npuctl = quoted(&npud_e2e::npuctl_binary().display().to_string());
    let script = format!(
        "mount -t tmpfs tmpfs /run\n{mounts}{npuctl} health\n\
         {npuctl} emu-design vector_scalar_add --out {vsa}\n\
         head -c 4096 /dev/zero > {input}\n\
         {npuctl} --json run {vsa} --input {input} --output {output}\n\
         echo \"token=$(cat \"$NPUD_TOKEN_FILE\")\"\n\
         echo \"uid 1000 reads token=$(setpriv --reuid=1000 --regid=1000 --clear-groups cat \"$NPUD_TOKEN_FILE\")\"\n\
         {npuctl} --json status\n\
         echo \"socket mount: $(grep ' /run/npud ' /proc/self/mountinfo | cut -d' ' -f6)\"\n\
         echo \"token mount: $(grep ' /run/secrets/npud/token \\| /var/run/secrets/npud/token ' /proc/self/mountinfo | wc -l)\"\n",
        mounts = mount_script(c),
        vsa = w("vsa"),
        input = w("in"),
        output = w("out"),
    );
    let out = tokio::time::timeout(
        BOUND,
        tokio::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-ec", &script])
            .env_remove("NPUD_ADDR")
            .env_remove("NPUD_TOKEN_FILE")
            .output(),
    )
    .await
    .expect("the container's commands finish within the bound")
    .expect("unshare runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("SERVING\n"), "{stdout}");
    // Tensors went through the fd socket, at the path npud reported (/run/npud/npud.fd.sock).
    assert!(stdout.contains("\"shared\": true"), "{stdout}");
    // vector_scalar_add adds 1 to each of the 1024 zeros.
    let output = std::fs::read(work.join("out")).unwrap();
    let ones: Vec<i32> = output
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(ones, vec![1; 1024]);
    assert!(stdout.contains(&format!("token={token}\n")), "{stdout}");
    assert!(stdout.contains("token mount: 1\n"), "{stdout}");
    // A container running as any uid reads its token through the mount, though the host's
    // token directory is 0700: the runtime mounted the file itself.
    assert!(
        stdout.contains(&format!("uid 1000 reads token={token}\n")),
        "{stdout}"
    );
    // On the host, another uid can neither list the directory nor read the token by name.
    for (cmd, arg) in [("cat", tokens.join("npu0-share-0")), ("ls", tokens.clone())] {
        let out = std::os::unix::process::CommandExt::uid(&mut Command::new(cmd), 65534)
            .arg(&arg)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{cmd} {} as uid 65534",
            arg.display()
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Permission denied"), "{err}");
    }
    // npud knows the pod by its allocation: the token is the caller's identity.
    assert!(
        stdout.contains("\"caller_identity\": \"token:npu0-share-0@"),
        "{stdout}"
    );
    // The socket directory is mounted read-only, and nothing was created in it for the token.
    assert!(stdout.contains("socket mount: ro,"), "{stdout}");
    assert!(!sockets.join("token").exists());
}

//! Compiles the kubelet's device-plugin API (`proto/kubelet/deviceplugin/v1beta1/api.proto`)
//! without a system `protoc`: the plugin's `DevicePlugin` server and `Registration` client, and
//! the other halves for the tests that play the kubelet.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let fds = protox::compile(
        [root.join("kubelet/deviceplugin/v1beta1/api.proto")],
        [&root],
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    // tonic-prost-build emits no rerun-if-changed of its own.
    println!("cargo::rerun-if-changed={}", root.join("kubelet").display());
    Ok(())
}

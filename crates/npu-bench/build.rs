//! Compiles `proto/bench/v1/echo.proto` (the bare echo service) without a system `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let fds = protox::compile([root.join("bench/v1/echo.proto")], [&root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    // tonic-prost-build emits no rerun-if-changed of its own.
    println!("cargo::rerun-if-changed={}", root.join("bench").display());
    Ok(())
}

//! Compiles `proto/npud/v1/npud.proto` without a system `protoc` (protox is a pure-Rust
//! compiler) and writes the descriptor set that server reflection serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile([root.join("npud/v1/npud.proto")], [&root])?;
    std::fs::write(
        out.join("npud_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    // tonic-prost-build emits no rerun-if-changed of its own.
    println!("cargo::rerun-if-changed={}", root.display());
    Ok(())
}

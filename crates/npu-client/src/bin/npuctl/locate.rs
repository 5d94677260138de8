//! Finding the workspace's other binaries (`npud` for the demo, `npuctl-bench` for `bench`):
//! beside npuctl (where cargo puts them), then an environment variable, then `PATH`; when none
//! has it and a cargo workspace is above the current directory, it is built with cargo, in the
//! profile npuctl was built with.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A binary of this workspace.
#[derive(Debug)]
pub struct Binary {
    /// The executable's file name.
    pub name: &'static str,
    /// The cargo package that builds it.
    pub package: &'static str,
    /// The environment variable that may name it.
    pub env: &'static str,
    /// The flag that names it explicitly, for messages.
    pub flag: &'static str,
}

/// The path of `bin`, building it first when it is nowhere.
pub fn find_binary(bin: &Binary, explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("{} {}: no such file", bin.flag, p.display()))
        };
    }
    if let Some(p) = crate::sibling(bin.name).filter(|p| p.is_file()) {
        return Ok(p);
    }
    if let Some(p) = std::env::var_os(bin.env)
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Ok(p);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&paths) {
            let p = d.join(bin.name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
    let root = cwd
        .ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]"))
        })
        .ok_or_else(|| {
            format!(
                "no {} binary beside npuctl, in ${} or on PATH, and no cargo workspace above \
                 this directory to build it in",
                bin.name, bin.env
            )
        })?;
    let release = crate::sibling(bin.name)
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .is_some_and(|d| d.ends_with("release"));
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "-p", bin.package, "--bin", bin.name])
        .current_dir(root);
    if release {
        cmd.arg("--release");
    }
    println!(
        "npuctl: building {} first (cargo build{} -p {} in {})",
        bin.name,
        if release { " --release" } else { "" },
        bin.package,
        root.display()
    );
    let status = cmd
        .status()
        .map_err(|e| format!("running cargo to build {}: {e}", bin.name))?;
    if !status.success() {
        return Err(format!("cargo build -p {} failed ({status})", bin.package));
    }
    let profile = if release { "release" } else { "debug" };
    [
        crate::sibling(bin.name),
        Some(root.join("target").join(profile).join(bin.name)),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.is_file())
    .ok_or_else(|| format!("cargo built {} but it is not where npuctl looked", bin.name))
}

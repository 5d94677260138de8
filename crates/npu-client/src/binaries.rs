//! Finding npud's binaries (the daemon for `npuctl demo` and the benchmarks, `npuctl-bench`
//! for `npuctl bench`): an explicit path, else beside the running executable (where cargo puts
//! all of a workspace's binaries), else an environment variable, else `PATH`. When none has it
//! and a cargo workspace is above the current directory, it is built there with cargo, in the
//! profile the running executable was built with, saying so on stderr.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ClientError;

/// A binary of this workspace.
#[derive(Debug, Clone, Copy)]
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

/// The daemon.
pub const NPUD: Binary = Binary {
    name: "npud",
    package: "npud",
    env: "NPUD_BIN",
    flag: "--npud",
};

/// The benchmark `npuctl bench` runs.
pub const NPUCTL_BENCH: Binary = Binary {
    name: "npuctl-bench",
    package: "npu-bench",
    env: "NPUCTL_BENCH_BIN",
    flag: "--bench-bin",
};

fn err(message: String) -> ClientError {
    ClientError::LocalDaemon { message }
}

/// The path of a file beside the running executable.
fn sibling(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join(name))
}

/// The path of `bin` (see the module docs), building it first when it is nowhere.
///
/// # Errors
/// [`ClientError::LocalDaemon`] when an explicit path names no file, or the binary is nowhere
/// and cannot be built (no workspace here, or cargo failed).
pub fn find_binary(bin: &Binary, explicit: Option<&Path>) -> Result<PathBuf, ClientError> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(err(format!("{} {}: no such file", bin.flag, p.display())))
        };
    }
    if let Some(p) = sibling(bin.name).filter(|p| p.is_file()) {
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
    build(bin)
}

/// Variables cargo sets for the program it runs (`cargo run`), which a build started from that
/// program must not inherit: build scripts track some of them (ring's tracks
/// `CARGO_MANIFEST_DIR`), so a build that sees them rebuilds what a plain `cargo build` built,
/// and the next plain one rebuilds it again (for npud in release, about 50 s each time).
const RUN_VARIABLES: &[&str] = &[
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_MANIFEST_LINKS",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];
/// Prefixes of such variables.
const RUN_PREFIXES: &[&str] = &["CARGO_PKG_", "CARGO_BIN_EXE_"];

/// `cargo build -p PACKAGE --bin NAME [--release]` in `root`, with the environment a user's
/// own `cargo build` there would have: without what `cargo run` set for this program.
fn cargo_build(bin: &Binary, root: &Path, release: bool) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "-p", bin.package, "--bin", bin.name])
        .current_dir(root);
    if release {
        cmd.arg("--release");
    }
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if RUN_VARIABLES.contains(&k) || RUN_PREFIXES.iter().any(|p| k.starts_with(p)) {
            cmd.env_remove(k);
        }
    }
    for k in RUN_VARIABLES {
        cmd.env_remove(k);
    }
    cmd
}

fn build(bin: &Binary) -> Result<PathBuf, ClientError> {
    let cwd = std::env::current_dir().map_err(|e| err(format!("the current directory: {e}")))?;
    let root = cwd
        .ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]"))
        })
        .ok_or_else(|| {
            err(format!(
                "no {} binary beside this program, in ${} or on PATH, and no cargo workspace \
                 above this directory to build it in (cargo build --release -p {})",
                bin.name, bin.env, bin.package
            ))
        })?;
    let release = sibling(bin.name)
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .is_some_and(|d| d.ends_with("release"));
    let mut cmd = cargo_build(bin, root, release);
    eprintln!(
        "building {} first (cargo build{} -p {} in {})",
        bin.name,
        if release { " --release" } else { "" },
        bin.package,
        root.display()
    );
    let status = cmd
        .status()
        .map_err(|e| err(format!("running cargo to build {}: {e}", bin.name)))?;
    if !status.success() {
        return Err(err(format!(
            "cargo build -p {} failed ({status})",
            bin.package
        )));
    }
    let profile = if release { "release" } else { "debug" };
    [
        sibling(bin.name),
        Some(root.join("target").join(profile).join(bin.name)),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.is_file())
    .ok_or_else(|| {
        err(format!(
            "cargo built {} but it is not where it was looked for",
            bin.name
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_does_not_inherit_what_cargo_run_set() {
        // Under `cargo test`, as under `cargo run`, cargo set these for this process.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let cmd = cargo_build(&NPUD, Path::new("/"), true);
        let removed: Vec<String> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for k in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION",
            "CARGO_CRATE_NAME",
        ] {
            assert!(
                removed.iter().any(|r| r == k),
                "{k} is inherited: {removed:?}"
            );
        }
        // Configuration a user set stays.
        assert!(
            !removed
                .iter()
                .any(|r| r == "CARGO_HOME" || r == "CARGO_TARGET_DIR")
        );
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args, ["build", "-p", "npud", "--bin", "npud", "--release"]);
    }
}

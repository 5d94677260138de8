//! Where to find `libhsa-runtime64`, in the order a user with ROCm expects.
//!
//! 1. an explicit path from configuration (a file, or a directory holding the library or its
//!    `lib/`);
//! 2. `$ROCM_PATH/lib`;
//! 3. a pip-installed ROCm: `site-packages/_rocm_sdk_core/lib` of the Pythons on `PATH` (and of
//!    `$VIRTUAL_ENV` and the user site), found by looking at the file system, not by running
//!    Python;
//! 4. `/opt/rocm/lib`;
//! 5. the bare sonames, left to the system loader.
//!
//! Inside a directory the names tried are `libhsa-runtime64.so`, then every
//! `libhsa-runtime64.so.*` in sorted order (so `.so.1` before `.so.1.15.0`): ROCm's pip wheels
//! ship only the versioned name, and Debian's runtime package has no unversioned link.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The unversioned library name.
pub const LIBRARY_NAME: &str = "libhsa-runtime64.so";
/// The soname ROCR is installed under.
pub const LIBRARY_SONAME: &str = "libhsa-runtime64.so.1";

/// Which discovery step a candidate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootKind {
    /// The path given in configuration.
    Explicit,
    /// `$ROCM_PATH`.
    RocmPath,
    /// A pip-installed ROCm (`_rocm_sdk_core`).
    PipWheel,
    /// `/opt/rocm`.
    OptRocm,
    /// A bare soname resolved by the system loader (`ld.so` search path).
    SystemLoader,
}

impl fmt::Display for RootKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Explicit => "the configured library path",
            Self::RocmPath => "$ROCM_PATH",
            Self::PipWheel => "a pip-installed ROCm (_rocm_sdk_core)",
            Self::OptRocm => "/opt/rocm",
            Self::SystemLoader => "the system loader's search path",
        })
    }
}

/// One thing to try loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// A path, or (for [`RootKind::SystemLoader`]) a bare soname.
    pub target: PathBuf,
    pub root: RootKind,
    /// False when the file was looked for and is not there (kept so errors list it).
    pub exists: bool,
}

/// The process facts discovery depends on, gathered once so tests can supply their own.
#[derive(Debug, Clone, Default)]
pub struct SearchEnv {
    pub rocm_path: Option<PathBuf>,
    pub path_var: Option<OsString>,
    pub virtual_env: Option<PathBuf>,
    pub home: Option<PathBuf>,
    /// Normally `/opt/rocm`.
    pub opt_rocm: PathBuf,
}

impl SearchEnv {
    /// The current process's environment.
    pub fn from_process() -> Self {
        let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        Self {
            rocm_path: non_empty("ROCM_PATH").map(PathBuf::from),
            path_var: non_empty("PATH"),
            virtual_env: non_empty("VIRTUAL_ENV").map(PathBuf::from),
            home: non_empty("HOME").map(PathBuf::from),
            opt_rocm: PathBuf::from("/opt/rocm"),
        }
    }
}

/// Every candidate, in the order they are to be tried.
pub fn candidates(explicit: Option<&Path>, env: &SearchEnv) -> Vec<Candidate> {
    let mut out = Vec::new();
    if let Some(p) = explicit {
        if p.is_dir() {
            push_dir(&mut out, p, RootKind::Explicit);
            push_dir(&mut out, &p.join("lib"), RootKind::Explicit);
        } else {
            out.push(Candidate {
                target: p.to_path_buf(),
                root: RootKind::Explicit,
                exists: p.is_file(),
            });
        }
    }
    if let Some(root) = &env.rocm_path {
        push_dir(&mut out, &root.join("lib"), RootKind::RocmPath);
    }
    for site in site_packages_dirs(env) {
        push_dir(
            &mut out,
            &site.join("_rocm_sdk_core").join("lib"),
            RootKind::PipWheel,
        );
    }
    push_dir(&mut out, &env.opt_rocm.join("lib"), RootKind::OptRocm);
    for name in [LIBRARY_NAME, LIBRARY_SONAME] {
        out.push(Candidate {
            target: PathBuf::from(name),
            root: RootKind::SystemLoader,
            exists: true,
        });
    }
    out
}

/// Adds the library names found in `dir`; when none is there, one non-existent entry so the
/// error can say the directory was looked at.
fn push_dir(out: &mut Vec<Candidate>, dir: &Path, root: RootKind) {
    let mut names: Vec<PathBuf> = Vec::new();
    let plain = dir.join(LIBRARY_NAME);
    if plain.is_file() {
        names.push(plain.clone());
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut versioned: Vec<PathBuf> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{LIBRARY_NAME}.")))
                    && p.is_file()
            })
            .collect();
        versioned.sort();
        names.extend(versioned);
    }
    if names.is_empty() {
        out.push(Candidate {
            target: plain,
            root,
            exists: false,
        });
    } else {
        out.extend(names.into_iter().map(|target| Candidate {
            target,
            root,
            exists: true,
        }));
    }
}

/// `site-packages` directories of the Pythons this user would run, without running Python:
/// `$VIRTUAL_ENV`, then each `PATH` directory holding a `python3`/`python` (`<bin>/../lib`),
/// then the user site under `$HOME/.local`. Duplicates are dropped, order kept.
fn site_packages_dirs(env: &SearchEnv) -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(v) = &env.virtual_env {
        prefixes.push(v.clone());
    }
    if let Some(path) = &env.path_var {
        for bin in std::env::split_paths(path) {
            if ["python3", "python"].iter().any(|p| bin.join(p).is_file())
                && let Some(prefix) = bin.parent()
            {
                prefixes.push(prefix.to_path_buf());
            }
        }
    }
    if let Some(home) = &env.home {
        prefixes.push(home.join(".local"));
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let Ok(rd) = std::fs::read_dir(&lib) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pys.sort();
        pys.reverse(); // newest Python first
        for py in pys {
            for sub in ["site-packages", "dist-packages"] {
                let d = py.join(sub);
                if d.is_dir() && !out.contains(&d) {
                    out.push(d);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn touch(p: &Path) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"").unwrap();
    }

    #[test]
    fn order_is_explicit_rocm_path_pip_opt_then_sonames() {
        let t = tempfile::tempdir().unwrap();
        let explicit = t.path().join("custom/libhsa-runtime64.so.1");
        touch(&explicit);
        let rocm = t.path().join("rocm");
        touch(&rocm.join("lib/libhsa-runtime64.so"));
        touch(&rocm.join("lib/libhsa-runtime64.so.1.15.0"));
        touch(&rocm.join("lib/libhsa-runtime64.so.1"));
        let venv = t.path().join("venv");
        touch(&venv.join("bin/python3"));
        let wheel =
            venv.join("lib/python3.12/site-packages/_rocm_sdk_core/lib/libhsa-runtime64.so.1");
        touch(&wheel);
        let opt = t.path().join("opt-rocm");
        let env = SearchEnv {
            rocm_path: Some(rocm.clone()),
            path_var: Some(venv.join("bin").into_os_string()),
            virtual_env: None,
            home: None,
            opt_rocm: opt.clone(),
        };
        let c = candidates(Some(&explicit), &env);
        let got: Vec<(PathBuf, RootKind, bool)> = c
            .into_iter()
            .map(|c| (c.target, c.root, c.exists))
            .collect();
        assert_eq!(
            got,
            vec![
                (explicit, RootKind::Explicit, true),
                (
                    rocm.join("lib/libhsa-runtime64.so"),
                    RootKind::RocmPath,
                    true
                ),
                (
                    rocm.join("lib/libhsa-runtime64.so.1"),
                    RootKind::RocmPath,
                    true
                ),
                (
                    rocm.join("lib/libhsa-runtime64.so.1.15.0"),
                    RootKind::RocmPath,
                    true
                ),
                (wheel, RootKind::PipWheel, true),
                (
                    opt.join("lib/libhsa-runtime64.so"),
                    RootKind::OptRocm,
                    false
                ),
                (
                    PathBuf::from("libhsa-runtime64.so"),
                    RootKind::SystemLoader,
                    true
                ),
                (
                    PathBuf::from("libhsa-runtime64.so.1"),
                    RootKind::SystemLoader,
                    true
                ),
            ]
        );
    }

    #[test]
    fn explicit_directory_is_searched_with_its_lib() {
        let t = tempfile::tempdir().unwrap();
        touch(&t.path().join("lib/libhsa-runtime64.so.1"));
        let env = SearchEnv {
            opt_rocm: t.path().join("none"),
            ..Default::default()
        };
        let c = candidates(Some(t.path()), &env);
        assert_eq!(
            c[0],
            Candidate {
                target: t.path().join("libhsa-runtime64.so"),
                root: RootKind::Explicit,
                exists: false
            }
        );
        assert_eq!(
            c[1],
            Candidate {
                target: t.path().join("lib/libhsa-runtime64.so.1"),
                root: RootKind::Explicit,
                exists: true
            }
        );
    }
}

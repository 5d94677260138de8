//! [`HsaApi`]: the loaded function table, and the checked calls the device layer builds on.

use std::ffi::{CStr, c_char, c_void};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::discovery::{self, Candidate, RootKind, SearchEnv};
use crate::error::{HsaError, Tried};
use crate::sys::{HsaFns, Status};

/// Where a function table came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiSource {
    /// A shared library loaded at run time.
    Loaded { path: PathBuf, root: RootKind },
    /// Functions linked into this program (the emulator).
    Static { name: &'static str },
}

impl fmt::Display for ApiSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Loaded { path, root } => write!(f, "{} (from {root})", path.display()),
            Self::Static { name } => write!(f, "{name} (linked in)"),
        }
    }
}

/// The HSA runtime's entry points, with the library that holds them kept alive.
pub struct HsaApi {
    fns: HsaFns,
    source: ApiSource,
    /// Dropped last: the pointers in `fns` point into it.
    _lib: Option<Library>,
}

impl fmt::Debug for HsaApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HsaApi")
            .field("source", &self.source)
            .field("fns", &self.fns)
            .finish()
    }
}

impl HsaApi {
    /// Loads the library at `path` (a file path, or a bare soname for the system loader) and
    /// resolves every entry point.
    ///
    /// # Errors
    /// [`HsaError::LibraryLoad`] when the loader refuses the file, [`HsaError::MissingSymbol`]
    /// naming the first required entry point it lacks.
    pub fn open(path: &Path) -> Result<Self, HsaError> {
        Self::open_as(path, RootKind::Explicit)
    }

    fn open_as(path: &Path, root: RootKind) -> Result<Self, HsaError> {
        // SAFETY: loading ROCR runs its static initialisers, which only set up the runtime's
        // own globals; RTLD_GLOBAL matches how ROCm's own Python host runtime loads it.
        let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
            HsaError::LibraryLoad {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
        // SAFETY: the table is resolved by name from a library that claims to be
        // libhsa-runtime64; each symbol is declared with the signature in ROCR's headers, and
        // `lib` is stored beside the table so the pointers outlive no library.
        let fns = unsafe {
            HsaFns::resolve(|name| match lib.get::<*const c_void>(name) {
                Ok(sym) => *sym,
                Err(_) => std::ptr::null(),
            })
        }
        .map_err(|symbol| HsaError::MissingSymbol {
            library: path.display().to_string(),
            symbol,
        })?;
        Ok(Self {
            fns,
            source: ApiSource::Loaded {
                path: path.to_path_buf(),
                root,
            },
            _lib: Some(lib),
        })
    }

    /// Finds and loads the runtime as [`crate::discovery`] describes: the first candidate that
    /// loads wins.
    ///
    /// # Errors
    /// [`HsaError::LibraryNotFound`] listing every candidate and why it was not used, or the
    /// [`HsaError::MissingSymbol`] of the first library that loaded.
    pub fn discover(explicit: Option<&Path>) -> Result<Self, HsaError> {
        Self::discover_in(explicit, &SearchEnv::from_process())
    }

    /// [`HsaApi::discover`] with the process facts supplied by the caller.
    ///
    /// # Errors
    /// As [`HsaApi::discover`].
    pub fn discover_in(explicit: Option<&Path>, env: &SearchEnv) -> Result<Self, HsaError> {
        let mut tried = Vec::new();
        for Candidate {
            target,
            root,
            exists,
        } in discovery::candidates(explicit, env)
        {
            if !exists {
                tried.push(Tried {
                    candidate: target.display().to_string(),
                    outcome: "not present".into(),
                });
                continue;
            }
            match Self::open_as(&target, root) {
                Ok(api) => return Ok(api),
                Err(HsaError::LibraryLoad { reason, .. }) => tried.push(Tried {
                    candidate: target.display().to_string(),
                    outcome: reason,
                }),
                Err(other) => return Err(other),
            }
        }
        Err(HsaError::LibraryNotFound { tried })
    }

    /// A table of functions linked into this program (how the emulator is used in-process;
    /// `hsa_sim::api()` wraps this for the emulator).
    ///
    /// # Safety
    ///
    /// As for [`HsaFns::resolve`]: every function in `fns` must be the C function of its
    /// field's name, or behave exactly as ROCR's headers specify it, with that signature, for
    /// as long as the table is used. The device layer calls them from safe code on the strength
    /// of that contract (a function that writes more bytes than the headers say, or keeps a
    /// pointer past the call, makes safe code undefined).
    ///
    /// Safe code cannot vouch for a table:
    ///
    /// ```compile_fail,E0133
    /// fn api(fns: hsa_core::sys::HsaFns) -> hsa_core::HsaApi {
    ///     hsa_core::HsaApi::from_static(fns, "mine")
    /// }
    /// ```
    pub unsafe fn from_static(fns: HsaFns, name: &'static str) -> Self {
        Self {
            fns,
            source: ApiSource::Static { name },
            _lib: None,
        }
    }

    /// The raw table. Calling through it is `unsafe`; prefer the device layer.
    pub fn fns(&self) -> &HsaFns {
        &self.fns
    }

    /// Where the table came from.
    pub fn source(&self) -> &ApiSource {
        &self.source
    }

    /// The runtime's own text for `status` (`hsa_status_string`), or a fallback naming the
    /// code when the runtime has none.
    #[doc(alias = "hsa_status_string")]
    pub fn status_string(&self, status: Status) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: `s` is a valid out-pointer; the runtime writes a pointer to a static string.
        let st = unsafe { (self.fns.status_string)(status, &mut s) };
        if st == Status::SUCCESS && !s.is_null() {
            // SAFETY: on success ROCR points `s` at a NUL-terminated string it owns for the
            // life of the library.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        } else {
            match status.name() {
                Some(n) => format!("{n} (the runtime has no text for this status)"),
                None => format!("unknown status {:#x}", status.0),
            }
        }
    }

    /// `Ok` for success statuses, otherwise [`HsaError::Call`] naming `call`.
    ///
    /// # Errors
    /// [`HsaError::Call`] with the runtime's status string.
    pub fn check(&self, call: &'static str, status: Status) -> Result<(), HsaError> {
        if status.is_ok() {
            Ok(())
        } else {
            Err(HsaError::Call {
                call,
                status,
                message: self.status_string(status),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_lists_every_place_tried() {
        let t = tempfile::tempdir().unwrap();
        let env = SearchEnv {
            rocm_path: Some(t.path().join("rocm")),
            opt_rocm: t.path().join("opt"),
            ..Default::default()
        };
        let explicit = t.path().join("nowhere/libhsa-runtime64.so");
        // The system loader may really have a ROCR (a CI host with Debian's package): then it,
        // and only it, may win; otherwise every place tried is listed.
        match HsaApi::discover_in(Some(&explicit), &env) {
            Ok(api) => assert!(
                matches!(
                    api.source(),
                    ApiSource::Loaded {
                        root: RootKind::SystemLoader,
                        ..
                    }
                ),
                "{:?}",
                api.source()
            ),
            Err(HsaError::LibraryNotFound { tried }) => {
                let names: Vec<&str> = tried.iter().map(|t| t.candidate.as_str()).collect();
                assert!(
                    names[0].ends_with("nowhere/libhsa-runtime64.so"),
                    "{names:?}"
                );
                assert!(
                    names[1].ends_with("rocm/lib/libhsa-runtime64.so"),
                    "{names:?}"
                );
                assert!(
                    names
                        .iter()
                        .any(|n| n.ends_with("opt/lib/libhsa-runtime64.so")),
                    "{names:?}"
                );
                assert!(names.contains(&"libhsa-runtime64.so.1"), "{names:?}");
            }
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn a_file_that_is_not_a_library_is_a_load_error_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("libhsa-runtime64.so");
        std::fs::write(&p, b"not an ELF file").unwrap();
        let err = HsaApi::open(&p).unwrap_err();
        let HsaError::LibraryLoad { path, reason } = &err else {
            panic!("{err}")
        };
        assert_eq!(path, &p);
        assert!(!reason.is_empty());
        assert!(err.to_string().contains("libhsa-runtime64.so"));
    }
}

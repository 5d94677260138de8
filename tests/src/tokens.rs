//! Token identities for the tests: a token directory with one file per name, as the device
//! plugin writes them (0600 files in a 0700 directory).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A token directory in a temporary directory of its own.
#[derive(Debug)]
pub struct TokenDir {
    dir: tempfile::TempDir,
}

impl TokenDir {
    /// A directory holding a token file for each of `names`.
    pub fn new(names: &[&str]) -> TokenDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let t = TokenDir { dir };
        std::fs::create_dir(t.path()).expect("the token directory");
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod the token directory");
        for n in names {
            t.add(n);
        }
        t
    }

    /// Writes the token file `name`.
    pub fn add(&self, name: &str) {
        let f = self.path().join(name);
        std::fs::write(&f, format!("{}\n", secret(name))).expect("a token file");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))
            .expect("chmod a token file");
    }

    /// The token directory (`auth.token_dir`).
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("tokens")
    }

    /// A free place beside it, for a config file.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
}

/// The secret of token `name` (48 characters).
pub fn secret(name: &str) -> String {
    format!("{name:x<48}")
}

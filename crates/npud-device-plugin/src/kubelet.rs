//! Registration with the kubelet, and how a kubelet restart is noticed.
//!
//! The kubelet serves `Registration` on `kubelet.sock` in its device-plugins directory. When it
//! restarts it removes every socket in that directory, the plugins' included, and creates its
//! own anew, so a plugin learns of the restart from the socket files: the kubelet's has another
//! inode (or came back after being gone), or the plugin's own is gone. Checking the two
//! files' identities every `--watch-interval-ms` (Kubernetes' documentation says a restarted
//! kubelet deletes the sockets and that a plugin can watch for its own socket's deletion) needs
//! no inotify, and sees the same through a host path mounted into a container.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use tonic::transport::Endpoint;

use crate::API_VERSION;
use crate::config::Config;
use crate::plugin::Plugin;
use crate::v1beta1 as api;
use crate::v1beta1::registration_client::RegistrationClient;

/// A file's identity: its device and inode numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// The identity of the file at `path`, `None` when there is none.
#[must_use]
pub fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path).ok().map(|m| FileId {
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// Why a registration did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The kubelet could not be reached; try again.
    #[error("kubelet at {socket} unreachable: {message}")]
    Unreachable { socket: String, message: String },
    /// The kubelet answered and refused: the API expects the plugin to stop.
    #[error("the kubelet refused the registration of {resource} ({code:?}): {message}")]
    Refused {
        resource: String,
        code: tonic::Code,
        message: String,
    },
}

/// The registration the plugin sends.
#[must_use]
pub fn request(config: &Config) -> api::RegisterRequest {
    api::RegisterRequest {
        version: API_VERSION.to_owned(),
        endpoint: config.endpoint.clone(),
        resource_name: config.resource_name.clone(),
        options: Some(Plugin::options()),
    }
}

/// Registers once with the kubelet, each step bounded.
///
/// # Errors
///
/// [`RegisterError::Unreachable`] when the socket does not answer, [`RegisterError::Refused`]
/// when the kubelet answers with an error.
pub async fn register(config: &Config) -> Result<(), RegisterError> {
    let socket = config.kubelet_socket.display().to_string();
    let unreachable = |message: String| RegisterError::Unreachable {
        socket: socket.clone(),
        message,
    };
    let channel = Endpoint::from_shared(format!("unix:{socket}"))
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    match RegistrationClient::new(channel)
        .register(request(config))
        .await
    {
        Ok(_) => Ok(()),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) =>
        {
            Err(unreachable(format!("{:?}: {}", s.code(), s.message())))
        }
        Err(s) => Err(RegisterError::Refused {
            resource: config.resource_name.clone(),
            code: s.code(),
            message: s.message().to_owned(),
        }),
    }
}

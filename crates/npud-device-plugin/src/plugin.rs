//! The `DevicePlugin` service the kubelet calls on the plugin's socket.
//!
//! - `GetDevicePluginOptions`: GetPreferredAllocation is answered; PreStartContainer is not
//!   needed.
//! - `ListAndWatch`: every share with npud's health, at once and again at each change, until
//!   the plugin's socket is replaced or the plugin stops.
//! - `GetPreferredAllocation`: [`crate::shares::preferred`] for each container.
//! - `Allocate`: for each container, npud's socket directory mounted (no device node), a
//!   fresh token file mounted read-only, `NPUD_ADDR` and `NPUD_TOKEN_FILE`. Every container's
//!   request is checked before any token is written, so a bad request changes nothing.
//! - `PreStartContainer`: an empty answer.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::config::Config;
use crate::shares::{self, Allocation};
use crate::token::TokenDir;
use crate::v1beta1 as api;
use crate::v1beta1::device_plugin_server::DevicePlugin;
use crate::{HEALTHY, UNHEALTHY};

/// The environment variable with npud's address in a container.
pub const ADDR_ENV: &str = "NPUD_ADDR";
/// The environment variable with the token file's path in a container.
pub const TOKEN_FILE_ENV: &str = "NPUD_TOKEN_FILE";

/// The service of one plugin socket.
#[derive(Debug, Clone)]
pub struct Plugin {
    config: Arc<Config>,
    tokens: Arc<TokenDir>,
    serving: watch::Receiver<bool>,
    /// Ends this socket's ListAndWatch streams (the socket is being replaced, or the plugin
    /// stops).
    done: CancellationToken,
}

impl Plugin {
    #[must_use]
    pub fn new(
        config: Arc<Config>,
        tokens: Arc<TokenDir>,
        serving: watch::Receiver<bool>,
        done: CancellationToken,
    ) -> Plugin {
        Plugin {
            config,
            tokens,
            serving,
            done,
        }
    }

    /// The options the plugin registers with and answers `GetDevicePluginOptions` with.
    #[must_use]
    pub fn options() -> api::DevicePluginOptions {
        api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
    }

    /// Every share, with the health `serving` gives it.
    #[must_use]
    pub fn devices(shares: u32, serving: bool) -> api::ListAndWatchResponse {
        let health = if serving { HEALTHY } else { UNHEALTHY };
        api::ListAndWatchResponse {
            devices: (0..shares)
                .map(|i| api::Device {
                    id: shares::share_id(i),
                    health: health.to_owned(),
                    topology: None,
                })
                .collect(),
        }
    }

    fn container_response(&self, token_name: &str) -> api::ContainerAllocateResponse {
        let c = &self.config;
        let mounts = vec![
            api::Mount {
                container_path: c.container_socket_dir.display().to_string(),
                host_path: c.host_socket_dir.display().to_string(),
                read_only: !c.socket_dir_writable,
            },
            api::Mount {
                container_path: c.token_mount_path.display().to_string(),
                host_path: c.host_token_dir.join(token_name).display().to_string(),
                read_only: true,
            },
        ];
        let envs = HashMap::from([
            (ADDR_ENV.to_owned(), c.container_npud_addr.clone()),
            (
                TOKEN_FILE_ENV.to_owned(),
                c.token_mount_path.display().to_string(),
            ),
        ]);
        api::ContainerAllocateResponse {
            envs,
            mounts,
            devices: Vec::new(),
            annotations: HashMap::new(),
            cdi_devices: Vec::new(),
        }
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(Plugin::options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut serving = self.serving.clone();
        let done = self.done.clone();
        let shares = self.config.shares;
        tokio::spawn(async move {
            loop {
                let now = *serving.borrow_and_update();
                tracing::info!(
                    shares,
                    health = if now { HEALTHY } else { UNHEALTHY },
                    "ListAndWatch: sending the list"
                );
                if tx.send(Ok(Plugin::devices(shares, now))).await.is_err() {
                    return;
                }
                tokio::select! {
                    () = done.cancelled() => return,
                    () = tx.closed() => return,
                    r = serving.changed() => if r.is_err() { return },
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let serving = *self.serving.borrow();
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .enumerate()
            .map(|(n, r)| {
                shares::preferred(
                    &r.available_device_i_ds,
                    &r.must_include_device_i_ds,
                    r.allocation_size,
                    self.config.shares,
                    serving,
                )
                .map(|device_i_ds| api::ContainerPreferredAllocationResponse { device_i_ds })
                .map_err(|e| Status::invalid_argument(format!("container_requests[{n}]: {e}")))
            })
            .collect::<Result<Vec<_>, Status>>()?;
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let requests = request.into_inner().container_requests;
        let allocations = requests
            .iter()
            .enumerate()
            .map(|(n, r)| {
                Allocation::parse(&r.devices_ids, self.config.shares).map_err(|e| {
                    Status::invalid_argument(format!("container_requests[{n}].devices_ids: {e}"))
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        // The kubelet gives a share to one container at a time; two containers of one request
        // sharing one would revoke each other's token.
        for (n, a) in allocations.iter().enumerate() {
            if let Some(m) = allocations[..n].iter().position(|b| b.overlaps(a)) {
                return Err(Status::invalid_argument(format!(
                    "container_requests[{n}] and container_requests[{m}] list the same device"
                )));
            }
        }
        let mut container_responses = Vec::with_capacity(allocations.len());
        for (n, a) in allocations.iter().enumerate() {
            let name = self.tokens.issue(a).map_err(|e| {
                tracing::error!(error = %e, "Allocate: no token written");
                Status::internal(format!("container_requests[{n}]: {e}"))
            })?;
            tracing::info!(token = %name, "Allocate: token written, socket directory mounted");
            container_responses.push(self.container_response(&name));
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

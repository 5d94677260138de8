//! [`Client`]: a session on npud, and [`Operator`]: the daemon's session-less views.

use std::sync::Arc;

use npu_artifacts::NpuGen;
use npu_proto::v1 as pb;

use crate::ClientError;
use crate::class::SessionClass;
use crate::connect::{Address, ConnectOptions};
use crate::program::{Program, ProgramInfo};
use crate::session::{Inner, Rpc};
use crate::tensor::{Element, Tensor};

/// A connection to npud with an open session. Cheap to clone (clones share the session).
///
/// Tensors and registered programs belong to the session. The session ends when
/// [`Client::close`] is called, or when the connection has been gone for the daemon's grace
/// period (dropping every clone, tensor and the connection lets it lapse).
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl Client {
    /// Connects to `address` (see [`crate::connect`] for the forms; `None` means `NPUD_ADDR`,
    /// else the daemon's default socket) and opens a session.
    ///
    /// # Errors
    ///
    /// [`ClientError::Address`] for an address that cannot be used, [`ClientError::Connect`]
    /// when the daemon cannot be reached within the connect timeout, [`ClientError::Daemon`]
    /// when it refuses the session (too many sessions; `PERMISSION_DENIED` for a class the
    /// policy does not give the caller, `INVALID_ARGUMENT` for a deadline it does not take).
    pub async fn connect(address: Option<&str>) -> Result<Client, ClientError> {
        Self::connect_with(address, ConnectOptions::default()).await
    }

    /// Like [`Client::connect`], with options.
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub async fn connect_with(
        address: Option<&str>,
        opts: ConnectOptions,
    ) -> Result<Client, ClientError> {
        let addr = Address::resolve(address)?;
        Ok(Client {
            inner: Inner::connect(addr, opts, true).await?,
        })
    }

    /// The session id.
    #[must_use]
    pub fn session_id(&self) -> u64 {
        self.inner.session_id()
    }

    /// The daemon's address.
    #[must_use]
    pub fn address(&self) -> &Address {
        &self.inner.addr
    }

    /// The class the daemon granted the session: the one asked for
    /// ([`ConnectOptions::session_class`]), or batch from a daemon older than classes.
    #[must_use]
    pub fn session_class(&self) -> SessionClass {
        self.inner.session_class()
    }

    /// The deadline the daemon granted an interactive session ([`ConnectOptions::deadline`]);
    /// `None` without one.
    #[must_use]
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.inner.deadline()
    }

    /// Whether tensors are shared by fd (a Unix socket and a daemon that exports memory).
    #[must_use]
    pub fn is_local(&self) -> bool {
        self.inner.addr.is_local() && self.inner.device.fd_export
    }

    /// What the daemon reported when the client connected.
    #[must_use]
    pub fn device(&self) -> &pb::DeviceInfo {
        &self.inner.device
    }

    /// The device's generation, for writing emulated designs that match it.
    #[must_use]
    pub fn generation(&self) -> NpuGen {
        if self.inner.device.generation == "npu1" {
            NpuGen::Npu1
        } else {
            NpuGen::Npu2
        }
    }

    /// How many times the client reconnected and resumed its session.
    #[must_use]
    pub fn reconnects(&self) -> u64 {
        self.inner.reconnects()
    }

    /// The daemon's current device information.
    ///
    /// # Errors
    ///
    /// A transport error or timeout.
    pub async fn device_info(&self) -> Result<pb::DeviceInfo, ClientError> {
        device_info(&self.inner).await
    }

    /// The daemon's counters.
    ///
    /// # Errors
    ///
    /// A transport error or timeout.
    pub async fn statistics(&self) -> Result<pb::Statistics, ClientError> {
        statistics(&self.inner).await
    }

    /// This session's programs.
    ///
    /// # Errors
    ///
    /// [`ClientError::SessionLost`], a transport error or timeout.
    pub async fn programs(&self) -> Result<Vec<pb::ProgramListing>, ClientError> {
        Ok(listing(&self.inner, false).await?.programs)
    }

    /// Registers a program in this session (once: later calls return the first answer).
    /// Dispatching an unregistered program registers it first, so calling this is optional.
    ///
    /// # Errors
    ///
    /// [`ClientError::Daemon`] with `INVALID_ARGUMENT` for bytes the daemon refuses,
    /// `FAILED_PRECONDITION` for a program of another generation or kind than the device.
    pub async fn register(&self, program: &Program) -> Result<ProgramInfo, ClientError> {
        // No lock is held across the RPC: dispatches of other programs go on meanwhile.
        self.inner
            .programs
            .get_or_register(program.key(), || async {
                let req = match program.hsaco() {
                    Some(h) => pb::RegisterProgramRequest {
                        hsaco: h.bytes.clone(),
                        kernel: h.kernel.clone(),
                        name: program.name().to_owned(),
                        ..Default::default()
                    },
                    None => pb::RegisterProgramRequest {
                        pdi: program.pdi().to_vec(),
                        insts: program.insts().to_vec(),
                        name: program.name().to_owned(),
                        ..Default::default()
                    },
                };
                let r = self
                    .inner
                    .call("RegisterProgram", |mut c| {
                        let req = req.clone();
                        async move {
                            c.register_program(req)
                                .await
                                .map(tonic::Response::into_inner)
                        }
                    })
                    .await?;
                Ok(ProgramInfo {
                    id: r.program_id,
                    content_hash: r.content_hash,
                    newly_stored: r.newly_stored,
                    summary: r.summary,
                })
            })
            .await
    }

    /// Drops this session's reference to a program; the next dispatch of it registers again.
    ///
    /// # Errors
    ///
    /// The daemon's refusal or a transport error.
    pub async fn unregister(&self, program: &Program) -> Result<(), ClientError> {
        let Some(info) = self.inner.programs.remove(program.key()) else {
            return Ok(());
        };
        self.inner
            .call("UnregisterProgram", |mut c| async move {
                c.unregister_program(pb::UnregisterProgramRequest {
                    program_id: info.id,
                })
                .await
                .map(tonic::Response::into_inner)
            })
            .await
            .map(|_| ())
    }

    /// Allocates a tensor of `len` elements (zeroed).
    ///
    /// # Errors
    ///
    /// [`ClientError::Invalid`] for `len == 0`; the daemon's `RESOURCE_EXHAUSTED` for quotas;
    /// [`ClientError::Fd`] when the fd socket refuses or fails.
    pub async fn alloc<T: Element>(&self, len: usize) -> Result<Tensor<T>, ClientError> {
        Tensor::allocate(&self.inner, len, "").await
    }

    /// Allocates a named tensor (the name shows in the daemon's logs).
    ///
    /// # Errors
    ///
    /// As [`Client::alloc`].
    pub async fn alloc_named<T: Element>(
        &self,
        name: &str,
        len: usize,
    ) -> Result<Tensor<T>, ClientError> {
        Tensor::allocate(&self.inner, len, name).await
    }

    /// Allocates a tensor holding a copy of `data`.
    ///
    /// # Errors
    ///
    /// As [`Client::alloc`].
    pub async fn tensor_from<T: Element>(&self, data: &[T]) -> Result<Tensor<T>, ClientError> {
        let mut t = self.alloc::<T>(data.len()).await?;
        t.copy_from_slice(data)?;
        Ok(t)
    }

    /// Drops the connection and opens a new one, resuming the session on it (what the client
    /// does by itself after a transport error).
    ///
    /// # Errors
    ///
    /// [`ClientError::SessionLost`] when the daemon no longer knows the session,
    /// [`ClientError::Connect`] when no connection can be made within the reconnect timeout.
    pub async fn reconnect(&self) -> Result<(), ClientError> {
        self.inner.reconnect().await
    }

    /// Ends the session: the daemon frees its tensors and drops its program references. Later
    /// calls through any clone fail with [`ClientError::SessionLost`].
    ///
    /// # Errors
    ///
    /// A transport error or timeout (the session then lapses after the grace period).
    pub async fn close(self) -> Result<(), ClientError> {
        self.inner.close().await
    }
}

/// A connection without a session, for the daemon's operator views: device information,
/// statistics and every stored program. It holds nothing on the daemon.
#[derive(Debug, Clone)]
pub struct Operator {
    inner: Arc<Inner>,
}

impl Operator {
    /// Connects without opening a session.
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub async fn connect(address: Option<&str>) -> Result<Operator, ClientError> {
        Self::connect_with(address, ConnectOptions::default()).await
    }

    /// Like [`Operator::connect`], with options.
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub async fn connect_with(
        address: Option<&str>,
        opts: ConnectOptions,
    ) -> Result<Operator, ClientError> {
        let addr = Address::resolve(address)?;
        Ok(Operator {
            inner: Inner::connect(addr, opts, false).await?,
        })
    }

    /// The daemon's address.
    #[must_use]
    pub fn address(&self) -> &Address {
        &self.inner.addr
    }

    /// The daemon's device information.
    ///
    /// # Errors
    ///
    /// A transport error or timeout.
    pub async fn device_info(&self) -> Result<pb::DeviceInfo, ClientError> {
        device_info(&self.inner).await
    }

    /// The daemon's counters.
    ///
    /// # Errors
    ///
    /// A transport error or timeout.
    pub async fn statistics(&self) -> Result<pb::Statistics, ClientError> {
        statistics(&self.inner).await
    }

    /// Every stored program.
    ///
    /// # Errors
    ///
    /// A transport error or timeout.
    pub async fn programs(&self) -> Result<Vec<pb::ProgramListing>, ClientError> {
        Ok(self.program_listing().await?.programs)
    }

    /// Every stored program, and every quarantine record (stored program or not).
    ///
    /// # Errors
    ///
    /// A transport error or timeout.
    pub async fn program_listing(&self) -> Result<pb::ListProgramsResponse, ClientError> {
        listing(&self.inner, true).await
    }

    /// Removes the quarantine record of the program whose content hash is `content_hash`, so
    /// that its bytes may be registered and run again (`removed` is false when there was none).
    ///
    /// # Errors
    ///
    /// [`ClientError::Daemon`] with `PERMISSION_DENIED` unless the caller is root or the
    /// daemon's own uid on its Unix socket, `INVALID_ARGUMENT` for a malformed hash; a transport
    /// error or timeout.
    pub async fn clear_quarantine(
        &self,
        content_hash: &str,
    ) -> Result<pb::ClearQuarantineResponse, ClientError> {
        let content_hash = content_hash.to_owned();
        self.inner
            .call_anonymous("ClearQuarantine", |mut c| {
                let content_hash = content_hash.clone();
                async move {
                    c.clear_quarantine(pb::ClearQuarantineRequest { content_hash })
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await
    }
}

async fn device_info(inner: &Inner) -> Result<pb::DeviceInfo, ClientError> {
    inner
        .call_anonymous("GetDeviceInfo", |mut c| async move {
            c.get_device_info(pb::GetDeviceInfoRequest {})
                .await
                .map(tonic::Response::into_inner)
        })
        .await
}

/// Every page of a program listing (the daemon answers a page of programs a call), as one
/// answer: the session's programs, or the session-less view (`anonymous`); then every page of
/// the quarantine records past the first page's.
async fn listing(inner: &Inner, anonymous: bool) -> Result<pb::ListProgramsResponse, ClientError> {
    let mut whole = pb::ListProgramsResponse::default();
    let mut after = 0;
    let mut records_after = String::new();
    loop {
        let page = list_page(
            inner,
            anonymous,
            pb::ListProgramsRequest {
                after_program_id: after,
                ..Default::default()
            },
        )
        .await?;
        whole.programs.extend(page.programs);
        whole.quarantine.extend(page.quarantine);
        if after == 0 {
            records_after = page.next_quarantine_after;
        }
        match next_page(after, page.next_after_program_id) {
            Some(next) => after = next,
            None => break,
        }
    }
    while !records_after.is_empty() {
        let page = list_page(
            inner,
            anonymous,
            pb::ListProgramsRequest {
                quarantine_after: records_after.clone(),
                ..Default::default()
            },
        )
        .await?;
        whole.quarantine.extend(page.quarantine);
        // A cursor that does not move forward ends the walk.
        records_after = if page.next_quarantine_after > records_after {
            page.next_quarantine_after
        } else {
            String::new()
        };
    }
    Ok(whole)
}

/// One `ListPrograms` call, with the session's metadata or without (`anonymous`).
async fn list_page(
    inner: &Inner,
    anonymous: bool,
    req: pb::ListProgramsRequest,
) -> Result<pb::ListProgramsResponse, ClientError> {
    let call = |mut c: Rpc| {
        let req = req.clone();
        async move { c.list_programs(req).await.map(tonic::Response::into_inner) }
    };
    if anonymous {
        inner.call_anonymous("ListPrograms", call).await
    } else {
        inner.call("ListPrograms", call).await
    }
}

/// The statistics with every page of their programs.
async fn statistics(inner: &Inner) -> Result<pb::Statistics, ClientError> {
    let page = |after: u64| {
        inner.call_anonymous("GetStatistics", move |mut c| async move {
            c.get_statistics(pb::GetStatisticsRequest {
                programs_after: after,
                max_programs: 0,
            })
            .await
            .map(tonic::Response::into_inner)
        })
    };
    let mut whole = page(0).await?;
    let mut after = 0;
    while let Some(next) = next_page(after, whole.next_programs_after) {
        let more = page(next).await?;
        whole.programs.extend(more.programs);
        whole.next_programs_after = more.next_programs_after;
        after = next;
    }
    whole.next_programs_after = 0;
    Ok(whole)
}

/// Where the page after the one that started after `after` starts, if one follows. A cursor
/// that does not move forward ends the walk rather than asking for the same page forever.
fn next_page(after: u64, next: u64) -> Option<u64> {
    (next > after).then_some(next)
}

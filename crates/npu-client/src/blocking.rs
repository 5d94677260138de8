//! A blocking facade over [`crate::Client`], for programs without an async runtime.
//!
//! [`Client`] owns a small tokio runtime (one worker thread) and runs each call to completion
//! on it. Tensors are the same [`crate::Tensor`] type: `as_slice` and `as_mut_slice` need no
//! runtime; upload, download and free go through the client. Do not call these methods from
//! inside an async runtime (tokio refuses to block there); use [`crate::Client`] instead.
//!
//! ```no_run
//! use npu_client::{blocking::Client, Program};
//!
//! let client = Client::connect(None)?;
//! let program = Program::from_dir("build")?;
//! let mut a = client.alloc::<i32>(1024)?;
//! let mut b = client.alloc::<i32>(1024)?;
//! a.as_mut_slice().fill(41);
//! client.dispatch(&program, &[&a], &mut [&mut b])?;
//! assert!(b.as_slice().iter().all(|&x| x == 42));
//! # Ok::<(), npu_client::ClientError>(())
//! ```

use std::sync::Arc;

use npu_artifacts::NpuGen;
use npu_proto::v1 as pb;

use crate::ClientError;
use crate::class::SessionClass;
use crate::connect::{Address, ConnectOptions};
use crate::dispatch::{ChainArg, ChainResult, DispatchResult};
use crate::program::{Program, ProgramInfo};
use crate::tensor::{Element, Tensor, TensorArg};

/// A blocking client: [`crate::Client`] plus the runtime it runs on.
#[derive(Debug, Clone)]
pub struct Client {
    rt: Arc<tokio::runtime::Runtime>,
    inner: crate::Client,
}

impl Client {
    /// Connects and opens a session; see [`crate::Client::connect`].
    ///
    /// # Errors
    ///
    /// As [`crate::Client::connect`], and [`ClientError::Invalid`] when the runtime cannot start.
    pub fn connect(address: Option<&str>) -> Result<Client, ClientError> {
        Self::connect_with(address, ConnectOptions::default())
    }

    /// Connects with options; see [`crate::Client::connect_with`].
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub fn connect_with(
        address: Option<&str>,
        opts: ConnectOptions,
    ) -> Result<Client, ClientError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("npu-client")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Invalid(format!("starting the client's runtime: {e}")))?;
        let inner = rt.block_on(crate::Client::connect_with(address, opts))?;
        Ok(Client {
            rt: Arc::new(rt),
            inner,
        })
    }

    /// The async client underneath.
    #[must_use]
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }

    /// The session id.
    #[must_use]
    pub fn session_id(&self) -> u64 {
        self.inner.session_id()
    }

    /// The daemon's address.
    #[must_use]
    pub fn address(&self) -> &Address {
        self.inner.address()
    }

    /// See [`crate::Client::session_class`].
    #[must_use]
    pub fn session_class(&self) -> SessionClass {
        self.inner.session_class()
    }

    /// See [`crate::Client::deadline`].
    #[must_use]
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.inner.deadline()
    }

    /// Whether tensors are shared by fd.
    #[must_use]
    pub fn is_local(&self) -> bool {
        self.inner.is_local()
    }

    /// The device's generation.
    #[must_use]
    pub fn generation(&self) -> NpuGen {
        self.inner.generation()
    }

    /// See [`crate::Client::fast_path_active`].
    #[must_use]
    pub fn fast_path_active(&self) -> bool {
        self.inner.fast_path_active()
    }

    /// See [`crate::Client::device_info`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn device_info(&self) -> Result<pb::DeviceInfo, ClientError> {
        self.rt.block_on(self.inner.device_info())
    }

    /// See [`crate::Client::statistics`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn statistics(&self) -> Result<pb::Statistics, ClientError> {
        self.rt.block_on(self.inner.statistics())
    }

    /// See [`crate::Client::register`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn register(&self, program: &Program) -> Result<ProgramInfo, ClientError> {
        self.rt.block_on(self.inner.register(program))
    }

    /// See [`crate::Client::alloc`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Tensor<T>, ClientError> {
        self.rt.block_on(self.inner.alloc(len))
    }

    /// See [`crate::Client::tensor_from`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn tensor_from<T: Element>(&self, data: &[T]) -> Result<Tensor<T>, ClientError> {
        self.rt.block_on(self.inner.tensor_from(data))
    }

    /// See [`crate::Client::dispatch`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn dispatch(
        &self,
        program: &Program,
        reads: &[&dyn TensorArg],
        writes: &mut [&mut dyn TensorArg],
    ) -> Result<DispatchResult, ClientError> {
        self.rt
            .block_on(self.inner.dispatch(program, reads, writes))
    }

    /// Starts a chain; see [`crate::Client::chain`].
    #[must_use]
    pub fn chain(&self) -> ChainBuilder<'_> {
        ChainBuilder {
            rt: &self.rt,
            inner: self.inner.chain(),
        }
    }

    /// See [`crate::Tensor::upload`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn upload<T: Element>(&self, tensor: &Tensor<T>) -> Result<(), ClientError> {
        self.rt.block_on(tensor.upload())
    }

    /// See [`crate::Tensor::download`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn download<T: Element>(&self, tensor: &mut Tensor<T>) -> Result<(), ClientError> {
        self.rt.block_on(tensor.download())
    }

    /// See [`crate::Client::reconnect`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn reconnect(&self) -> Result<(), ClientError> {
        self.rt.block_on(self.inner.reconnect())
    }

    /// See [`crate::Client::close`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn close(self) -> Result<(), ClientError> {
        self.rt.block_on(self.inner.close())
    }
}

/// A blocking [`crate::ChainBuilder`].
#[derive(Debug)]
pub struct ChainBuilder<'a> {
    rt: &'a tokio::runtime::Runtime,
    inner: crate::ChainBuilder<'a>,
}

impl<'a> ChainBuilder<'a> {
    /// Adds a tensor the links only read; see [`crate::ChainBuilder::read`].
    pub fn read(&mut self, tensor: &'a dyn TensorArg) -> ChainArg {
        self.inner.read(tensor)
    }

    /// Adds a tensor a link may write; see [`crate::ChainBuilder::write`].
    pub fn write(&mut self, tensor: &'a mut dyn TensorArg) -> ChainArg {
        self.inner.write(tensor)
    }

    /// Adds a link; see [`crate::ChainBuilder::then`].
    pub fn then(&mut self, program: &'a Program, args: &[ChainArg]) -> &mut Self {
        self.inner.then(program, args);
        self
    }

    /// Runs the chain; see [`crate::ChainBuilder::run`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn run(self) -> Result<ChainResult, ClientError> {
        self.rt.block_on(self.inner.run())
    }
}

impl Client {
    /// Opens a pipeline; see [`crate::Client::pipeline`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn pipeline(&self, depth: usize) -> Result<Pipeline<'_>, ClientError> {
        Ok(Pipeline {
            rt: &self.rt,
            inner: self.rt.block_on(self.inner.pipeline(depth))?,
        })
    }
}

/// A blocking [`crate::Pipeline`].
#[derive(Debug)]
pub struct Pipeline<'a> {
    rt: &'a tokio::runtime::Runtime,
    inner: crate::Pipeline<'a>,
}

impl<'a> Pipeline<'a> {
    /// See [`crate::Pipeline::on_ring`].
    #[must_use]
    pub fn on_ring(&self) -> bool {
        self.inner.on_ring()
    }

    /// See [`crate::Pipeline::in_flight`].
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    /// Sends a dispatch; see [`crate::Pipeline::submit`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn submit(
        &mut self,
        program: &Program,
        reads: &[&'a dyn TensorArg],
        writes: Vec<&'a mut dyn TensorArg>,
    ) -> Result<u64, ClientError> {
        self.rt.block_on(self.inner.submit(program, reads, writes))
    }

    /// The next completion; see [`crate::Pipeline::next_completion`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn next_completion(&mut self) -> Result<Option<crate::Completion>, ClientError> {
        self.rt.block_on(self.inner.next_completion())
    }

    /// Every remaining completion; see [`crate::Pipeline::finish`].
    ///
    /// # Errors
    ///
    /// As there.
    pub fn finish(self) -> Result<Vec<crate::Completion>, ClientError> {
        self.rt.block_on(self.inner.finish())
    }
}

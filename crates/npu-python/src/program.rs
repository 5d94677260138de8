//! `npud._npud.Program`: a design's program, from a directory, bytes, an hsaco or the
//! emulator's designs.

use npu_client::{ClientError, Program as NativeProgram};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::to_pyerr;

/// A design's program: `main.pdi` plus `insts.bin`.
#[pyclass(frozen, module = "npud._npud")]
pub(crate) struct Program {
    pub(crate) program: NativeProgram,
}

pub(crate) fn artifact_err(py: Python<'_>, e: ClientError) -> PyErr {
    to_pyerr(py, &e)
}

pub(crate) fn emu_design(
    kernel: &str,
    n: u32,
    dtype: Option<&str>,
    scalar: Option<i64>,
) -> Result<npu_artifacts::emu::EmuDesign, ClientError> {
    let dtype = dtype
        .map(str::parse::<npu_artifacts::emu::DType>)
        .transpose()?;
    let mut d = npu_artifacts::emu::EmuDesign::by_name(kernel, n, dtype)?;
    if let Some(s) = scalar {
        d.scalar = s;
        d.validate()?;
    }
    Ok(d)
}

pub(crate) fn generation(g: &str) -> PyResult<npu_client::NpuGen> {
    match g {
        "npu1" => Ok(npu_client::NpuGen::Npu1),
        "npu2" => Ok(npu_client::NpuGen::Npu2),
        _ => Err(PyValueError::new_err(format!(
            "generation {g:?}: expected \"npu1\" or \"npu2\""
        ))),
    }
}

#[pymethods]
impl Program {
    #[staticmethod]
    fn from_dir(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        NativeProgram::from_dir(path)
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    #[staticmethod]
    fn from_bytes(py: Python<'_>, name: &str, pdi: &[u8], insts: &[u8]) -> PyResult<Self> {
        NativeProgram::from_bytes(name, pdi.to_vec(), insts.to_vec())
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    /// Kernel `kernel` of an AIE hsaco given as a path or as bytes (`kernel` may be empty
    /// when the file has one kernel).
    #[staticmethod]
    #[pyo3(signature = (source, kernel=""))]
    fn from_hsaco(py: Python<'_>, source: &Bound<'_, PyAny>, kernel: &str) -> PyResult<Self> {
        let source = if let Ok(b) = source.cast::<PyBytes>() {
            npu_client::HsacoSource::Bytes(b.as_bytes().to_vec())
        } else {
            npu_client::HsacoSource::Path(source.extract::<std::path::PathBuf>()?)
        };
        NativeProgram::from_hsaco(source, kernel)
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    /// A full ELF (PDIs plus control code, as aiecc's `--get-full-elf` writes it), packed as
    /// an hsaco of FullElf kernels; `kernel` may be empty when it has one, and `num_cols` is
    /// needed only when the ELF does not record its column count.
    #[staticmethod]
    #[pyo3(signature = (elf, kernel="", num_cols=None))]
    fn from_full_elf(
        py: Python<'_>,
        elf: &[u8],
        kernel: &str,
        num_cols: Option<u32>,
    ) -> PyResult<Self> {
        let mut b = npu_artifacts::hsaco::HsacoBuilder::new();
        b.full_elf(elf, num_cols)
            .map_err(|e| artifact_err(py, ClientError::from(e)))?;
        let bytes = b
            .build()
            .map_err(|e| artifact_err(py, ClientError::from(e)))?;
        NativeProgram::from_hsaco(npu_client::HsacoSource::Bytes(bytes), kernel)
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    #[staticmethod]
    #[pyo3(signature = (kernel, n, generation, dtype=None, scalar=None))]
    fn emulated(
        py: Python<'_>,
        kernel: &str,
        n: u32,
        generation: &str,
        dtype: Option<&str>,
        scalar: Option<i64>,
    ) -> PyResult<Self> {
        let g = self::generation(generation)?;
        emu_design(kernel, n, dtype, scalar)
            .and_then(|d| NativeProgram::emulated(&d, g))
            .map(|program| Self { program })
            .map_err(|e| artifact_err(py, e))
    }

    #[staticmethod]
    #[pyo3(signature = (dir, kernel, n, generation, dtype=None, scalar=None))]
    fn write_emulated(
        py: Python<'_>,
        dir: std::path::PathBuf,
        kernel: &str,
        n: u32,
        generation: &str,
        dtype: Option<&str>,
        scalar: Option<i64>,
    ) -> PyResult<()> {
        let g = self::generation(generation)?;
        emu_design(kernel, n, dtype, scalar)
            .and_then(|d| d.write_dir(&dir, g).map_err(ClientError::from))
            .map(|_| ())
            .map_err(|e| artifact_err(py, e))
    }

    #[getter]
    fn name(&self) -> &str {
        self.program.name()
    }

    #[getter]
    fn pdi<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.program.pdi())
    }

    #[getter]
    fn insts<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.program.insts())
    }

    /// The smallest size in bytes of each buffer argument, as the instruction stream patches
    /// them.
    #[getter]
    fn min_arg_bytes(&self) -> Vec<u64> {
        self.program.txn().min_arg_sizes()
    }

    fn __repr__(&self) -> String {
        format!(
            "Program(name={:?}, args={})",
            self.program.name(),
            self.program.txn().arg_count()
        )
    }
}

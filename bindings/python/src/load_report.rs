//! `trash_panda._core.LoadReport` (`trash_panda.LoadReport`): the report `stream_load` returns,
//! the core's type, filled in by the Python loader and formatted by the core.

use pyo3::prelude::*;

use trash_panda::profile::{LoadReport, LoadedTier, LoaderRun};

use crate::dtype::parse_dtype;

/// What one tier (or the weights outside the blocks) took at load time. Immutable: a report's
/// tier is replaced as a whole.
#[pyclass(name = "TierLoad", module = "trash_panda._core", frozen, eq)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PyTierLoad {
    inner: LoadedTier,
}

#[pymethods]
impl PyTierLoad {
    #[new]
    #[pyo3(signature = (blocks=0, tensors=0, bytes=0, seconds=0.0))]
    fn new(blocks: u64, tensors: u64, bytes: u64, seconds: f64) -> Self {
        PyTierLoad {
            inner: LoadedTier {
                blocks,
                tensors,
                bytes,
                seconds,
            },
        }
    }

    #[getter]
    fn blocks(&self) -> u64 {
        self.inner.blocks
    }
    #[getter]
    fn tensors(&self) -> u64 {
        self.inner.tensors
    }
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.bytes
    }
    #[getter]
    fn seconds(&self) -> f64 {
        self.inner.seconds
    }

    fn __repr__(&self) -> String {
        let t = &self.inner;
        format!(
            "TierLoad(blocks={}, tensors={}, bytes={}, seconds={})",
            t.blocks, t.tensors, t.bytes, t.seconds
        )
    }
}

impl From<LoadedTier> for PyTierLoad {
    fn from(inner: LoadedTier) -> Self {
        PyTierLoad { inner }
    }
}

/// Bytes and seconds of a load, per tier. ``str(report)`` is a short table.
#[pyclass(name = "LoadReport", module = "trash_panda._core")]
#[derive(Debug, Clone)]
pub(crate) struct PyLoadReport {
    inner: LoadReport,
}

#[pymethods]
impl PyLoadReport {
    #[new]
    fn new(checkpoint: String, device: String, compute_dtype: String) -> Self {
        PyLoadReport {
            inner: LoadReport::new(checkpoint, device, compute_dtype),
        }
    }

    #[getter]
    fn checkpoint(&self) -> &str {
        &self.inner.checkpoint
    }
    #[getter]
    fn device(&self) -> &str {
        &self.inner.device
    }
    #[getter]
    fn compute_dtype(&self) -> &str {
        &self.inner.compute_dtype
    }

    #[getter]
    fn seconds(&self) -> f64 {
        self.inner.seconds
    }
    #[setter]
    fn set_seconds(&mut self, value: f64) {
        self.inner.seconds = value;
    }

    #[getter]
    fn outside(&self) -> PyTierLoad {
        self.inner.outside.into()
    }
    #[setter]
    fn set_outside(&mut self, value: PyTierLoad) {
        self.inner.outside = value.inner;
    }
    #[getter]
    fn device_tier(&self) -> PyTierLoad {
        self.inner.device_tier.into()
    }
    #[setter]
    fn set_device_tier(&mut self, value: PyTierLoad) {
        self.inner.device_tier = value.inner;
    }
    #[getter]
    fn ram(&self) -> PyTierLoad {
        self.inner.ram.into()
    }
    #[setter]
    fn set_ram(&mut self, value: PyTierLoad) {
        self.inner.ram = value.inner;
    }
    #[getter]
    fn disk(&self) -> PyTierLoad {
        self.inner.disk.into()
    }
    #[setter]
    fn set_disk(&mut self, value: PyTierLoad) {
        self.inner.disk = value.inner;
    }

    #[getter]
    fn ram_source(&self) -> &str {
        &self.inner.ram_source
    }
    #[setter]
    fn set_ram_source(&mut self, value: String) {
        self.inner.ram_source = value;
    }
    #[getter]
    fn disk_mode(&self) -> Option<&str> {
        self.inner.disk_mode.as_deref()
    }
    #[setter]
    fn set_disk_mode(&mut self, value: Option<String>) {
        self.inner.disk_mode = value;
    }
    #[getter]
    fn disk_mode_reason(&self) -> &str {
        &self.inner.disk_mode_reason
    }
    #[setter]
    fn set_disk_mode_reason(&mut self, value: String) {
        self.inner.disk_mode_reason = value;
    }
    #[getter]
    fn staging_bytes(&self) -> u64 {
        self.inner.staging_bytes
    }
    #[setter]
    fn set_staging_bytes(&mut self, value: u64) {
        self.inner.staging_bytes = value;
    }
    /// Embedding tables left in the checkpoint's map (counted within outside or device).
    #[getter]
    fn mapped_bytes(&self) -> u64 {
        self.inner.mapped_bytes
    }
    #[setter]
    fn set_mapped_bytes(&mut self, value: u64) {
        self.inner.mapped_bytes = value;
    }
    #[getter]
    fn kept_buffers(&self) -> Vec<String> {
        self.inner.kept_buffers.clone()
    }
    #[setter]
    fn set_kept_buffers(&mut self, value: Vec<String>) {
        self.inner.kept_buffers = value;
    }
    #[getter]
    fn unexpected(&self) -> Vec<String> {
        self.inner.unexpected.clone()
    }
    #[setter]
    fn set_unexpected(&mut self, value: Vec<String>) {
        self.inner.unexpected = value;
    }

    /// The profile's figures of this load (a LoadSummary as JSON, what `profile_report` takes):
    /// `ram_in_memory_threads` readers read the RAM tier into memory, as `storage` (a dtype
    /// name) if given (None: it is mapped); `loader` is stage(overlap=True)'s loader thread as
    /// (blocks, bytes, seconds, waited seconds).
    #[pyo3(signature = (ram_in_memory_threads=None, storage=None, loader=None))]
    fn summary(
        &self,
        ram_in_memory_threads: Option<u32>,
        storage: Option<&str>,
        loader: Option<(u64, u64, f64, f64)>,
    ) -> PyResult<String> {
        let storage = storage.map(parse_dtype).transpose()?;
        let loader = loader.map(|(blocks, bytes, seconds, waited_seconds)| LoaderRun {
            blocks,
            bytes,
            seconds,
            waited_seconds,
        });
        let summary = self.inner.summary(ram_in_memory_threads, storage, loader);
        Ok(serde_json::to_string(&summary).expect("a load summary serializes"))
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTierLoad>()?;
    m.add_class::<PyLoadReport>()?;
    Ok(())
}

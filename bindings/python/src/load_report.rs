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

    /// Blocks in the tier (0 for the weights outside the blocks).
    #[getter]
    fn blocks(&self) -> u64 {
        self.inner.blocks
    }
    /// Tensors loaded.
    #[getter]
    fn tensors(&self) -> u64 {
        self.inner.tensors
    }
    /// Bytes of those tensors, as the tier holds them.
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.bytes
    }
    /// Wall-clock seconds the tier's part of the load took.
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

    /// The checkpoint's file, or the folder of its shards.
    #[getter]
    fn checkpoint(&self) -> &str {
        &self.inner.checkpoint
    }
    /// The compute device as torch writes it ("cuda:0", "cpu").
    #[getter]
    fn device(&self) -> &str {
        &self.inner.device
    }
    /// torch's name of the compute dtype ("bfloat16").
    #[getter]
    fn compute_dtype(&self) -> &str {
        &self.inner.compute_dtype
    }

    /// Wall-clock seconds of the whole load.
    #[getter]
    fn seconds(&self) -> f64 {
        self.inner.seconds
    }
    #[setter]
    fn set_seconds(&mut self, value: f64) {
        self.inner.seconds = value;
    }

    /// What the weights outside the blocks (embeddings, final norm, heads) took.
    #[getter]
    fn outside(&self) -> PyTierLoad {
        self.inner.outside.into()
    }
    #[setter]
    fn set_outside(&mut self, value: PyTierLoad) {
        self.inner.outside = value.inner;
    }
    /// What the device tier took.
    #[getter]
    fn device_tier(&self) -> PyTierLoad {
        self.inner.device_tier.into()
    }
    #[setter]
    fn set_device_tier(&mut self, value: PyTierLoad) {
        self.inner.device_tier = value.inner;
    }
    /// What the RAM tier took.
    #[getter]
    fn ram(&self) -> PyTierLoad {
        self.inner.ram.into()
    }
    #[setter]
    fn set_ram(&mut self, value: PyTierLoad) {
        self.inner.ram = value.inner;
    }
    /// What the disk tier took.
    #[getter]
    fn disk(&self) -> PyTierLoad {
        self.inner.disk.into()
    }
    #[setter]
    fn set_disk(&mut self, value: PyTierLoad) {
        self.inner.disk = value.inner;
    }

    /// How the RAM tier is held: "mapped", "in memory" or "in memory as <storage dtype>".
    #[getter]
    fn ram_source(&self) -> &str {
        &self.inner.ram_source
    }
    #[setter]
    fn set_ram_source(&mut self, value: String) {
        self.inner.ram_source = value;
    }
    /// How the disk tier is read ("direct" or "buffered"); None when no block is on disk.
    #[getter]
    fn disk_mode(&self) -> Option<&str> {
        self.inner.disk_mode.as_deref()
    }
    #[setter]
    fn set_disk_mode(&mut self, value: Option<String>) {
        self.inner.disk_mode = value;
    }
    /// Why the disk tier is read that way, in words; empty when there is nothing to say.
    #[getter]
    fn disk_mode_reason(&self) -> &str {
        &self.inner.disk_mode_reason
    }
    #[setter]
    fn set_disk_mode_reason(&mut self, value: String) {
        self.inner.disk_mode_reason = value;
    }
    /// How the load itself read (past the page cache or through it) and why, in words; empty
    /// when it was not decided for this model alone (a pipeline's stage: its report says).
    #[getter]
    fn reads(&self) -> &str {
        &self.inner.reads
    }
    #[setter]
    fn set_reads(&mut self, value: String) {
        self.inner.reads = value;
    }
    /// Bytes of the engine's staging pool; 0 when no block streams.
    #[getter]
    fn staging_bytes(&self) -> u64 {
        self.inner.staging_bytes
    }
    #[setter]
    fn set_staging_bytes(&mut self, value: u64) {
        self.inner.staging_bytes = value;
    }
    /// Bytes of embedding tables left in the checkpoint's map (counted within outside or device).
    #[getter]
    fn mapped_bytes(&self) -> u64 {
        self.inner.mapped_bytes
    }
    #[setter]
    fn set_mapped_bytes(&mut self, value: u64) {
        self.inner.mapped_bytes = value;
    }
    /// The names of the model's buffers not in the checkpoint, kept as its construction made them.
    #[getter]
    fn kept_buffers(&self) -> Vec<String> {
        self.inner.kept_buffers.clone()
    }
    #[setter]
    fn set_kept_buffers(&mut self, value: Vec<String>) {
        self.inner.kept_buffers = value;
    }
    /// Checkpoint tensors the model has no place for.
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

//! `trash_panda._core.EngineConfig`: every figure the runtime of one model holds, from its plan.

use pyo3::prelude::*;

use trash_panda::engine_config::{EngineConfig, EngineSettings};
use trash_panda::rules::{expansion_layout, maps_lookup_table, ExpansionInput};
use trash_panda::stream::RamSource;
use trash_panda::DType;

use crate::checkpoint::PyTensorInfo;
use crate::dtype::parse_dtype;
use crate::errors::{raise, Kind, ToPyErr};
use crate::plan::PyPlan;

/// The runtime figures of a plan under the current TRASH_PANDA_* settings.
#[pyclass(name = "EngineConfig", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyEngineConfig {
    pub(crate) inner: EngineConfig,
}

#[pymethods]
impl PyEngineConfig {
    #[new]
    pub(crate) fn new(plan: PyRef<'_, PyPlan>) -> PyResult<Self> {
        let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
        let inner = EngineConfig::from_plan(&plan.inner, &settings).map_err(ToPyErr::to_py)?;
        Ok(PyEngineConfig { inner })
    }

    /// Whether the plan is a GPU's (device slots, 512-byte alignment); False when the CPU
    /// computes.
    #[getter]
    fn gpu(&self) -> bool {
        self.inner.gpu
    }

    /// "BF16", "F16" or "F32".
    #[getter]
    fn compute_dtype(&self) -> &'static str {
        self.inner.compute_dtype.safetensors_name()
    }

    /// The dtype weights are converted to on load ("BF16" or "F8_E4M3"); None: kept as stored.
    #[getter]
    fn storage_dtype(&self) -> Option<&'static str> {
        self.inner.storage_dtype.map(DType::safetensors_name)
    }

    /// Streamed blocks staged ahead of the one that runs, at the start.
    #[getter]
    fn lookahead(&self) -> usize {
        self.inner.lookahead
    }

    /// Offset alignment of staged tensors and of tensors in the expansion buffer.
    #[getter]
    fn align(&self) -> usize {
        self.inner.align
    }

    /// Host staging buffers (pinned on CUDA) the plan counted; 0 when no block streams.
    #[getter]
    fn staging_buffers(&self) -> usize {
        self.inner.held.staging_buffers
    }

    /// Bytes of each staging buffer: the largest streamed block as staged in its tier, rounded
    /// up to whole pages.
    #[getter]
    fn staging_buffer_bytes(&self) -> u64 {
        self.inner.held.staging_buffer_bytes
    }

    /// Device slots a staged block is copied into: one per staging buffer on a GPU, 0 on the
    /// CPU, which computes from the staging buffers.
    #[getter]
    fn device_slots(&self) -> usize {
        self.inner.held.device_slots
    }

    /// Bytes of the expansion buffer: the largest expansion to the compute dtype any hooked
    /// block needs in its tier.
    #[getter]
    fn expansion_bytes(&self) -> u64 {
        self.inner.held.expansion_bytes
    }

    /// The checkpoint pages a disk-tier block used in place maps while it runs.
    #[getter]
    fn mapped_window_bytes(&self) -> u64 {
        self.inner.held.mapped_window_bytes
    }

    /// The pinned ring a loader reads resident weights into on a GPU (both halves); 0 on the CPU.
    #[getter]
    fn loader_ring_bytes(&self) -> u64 {
        self.inner.held.loader_ring_bytes
    }

    /// "direct" or "buffered".
    #[getter]
    fn disk_mode(&self) -> &'static str {
        self.inner.disk_mode.as_str()
    }

    /// Why the disk tier is read that way, in words for the load report; empty when no block is
    /// on disk.
    #[getter]
    fn disk_mode_reason(&self) -> String {
        self.inner.disk_mode_reason.clone()
    }

    /// Threads that fill staging buffers (`TRASH_PANDA_WORKERS`, at least 1).
    #[getter]
    fn workers(&self) -> usize {
        self.inner.workers
    }

    /// Threads reading the RAM tier into private memory; None when it is mapped.
    #[getter]
    fn ram_in_memory_threads(&self) -> Option<usize> {
        match self.inner.ram_source {
            RamSource::InMemory { threads } => Some(threads),
            RamSource::Mapped => None,
        }
    }

    /// Whether a RAM tier in private memory is pinned and copied to the GPU directly.
    #[getter]
    fn pin_ram_tier(&self) -> bool {
        self.inner.gpu && self.inner.pin_ram_tier
    }

    /// Whether `info`, a tensor the model only reads by rows (an embedding table), is left in a
    /// private map of its file rather than read into memory.
    fn maps_lookup_table(&self, info: PyRef<'_, PyTensorInfo>) -> PyResult<bool> {
        Ok(maps_lookup_table(
            self.inner.gpu,
            parse_dtype(info.dtype())?,
            info.start(),
        ))
    }

    /// Where each tensor of a resident block goes in the expansion buffer (None: used as it is
    /// held), by the rule the plan counts with: tensors held in `dtypes` (header names), of
    /// `elements` elements, `scaled` when a scale applies, `reordered` (all false when not
    /// given) when the model takes their rows in another order than the stored one.
    #[pyo3(signature = (dtypes, elements, scaled, reordered=None))]
    fn expansion(
        &self,
        dtypes: Vec<String>,
        elements: Vec<u64>,
        scaled: Vec<bool>,
        reordered: Option<Vec<bool>>,
    ) -> PyResult<Vec<Option<u64>>> {
        let reordered = reordered.unwrap_or_else(|| vec![false; dtypes.len()]);
        if dtypes.len() != elements.len()
            || dtypes.len() != scaled.len()
            || dtypes.len() != reordered.len()
        {
            return Err(raise(
                Kind::Argument,
                "expansion: dtypes, elements, scaled and reordered must have the same length",
            ));
        }
        let inputs = dtypes
            .iter()
            .zip(elements)
            .zip(scaled)
            .zip(reordered)
            .map(|(((d, elements), scaled), reordered)| {
                Ok(ExpansionInput {
                    held: parse_dtype(d)?,
                    elements,
                    scaled,
                    reordered,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let (offsets, total) =
            expansion_layout(&inputs, self.inner.compute_dtype, self.inner.align);
        if total > self.inner.held.expansion_bytes {
            return Err(raise(
                Kind::Stream,
                format!(
                    "a block needs {total} bytes of expansion but the plan counted {}: the plan \
                     was made for other tensors; plan the model again",
                    self.inner.held.expansion_bytes
                ),
            ));
        }
        Ok(offsets)
    }

    fn __repr__(&self) -> String {
        serde_json::to_string(&self.inner).unwrap_or_default()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngineConfig>()?;
    Ok(())
}

//! `trash_panda._core.EngineStats` and `Staging`: the prefetch engine's counters and the record of
//! its workers' stagings, typed.

use pyo3::prelude::*;

use crate::mirror::mirror_enum;
use trash_panda::profile::{CopyRun, EngineSummary, Tier};
use trash_panda::stream::{EngineStats, Staging, StagingSource};

/// The prefetch engine's counters.
#[pyclass(name = "EngineStats", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyEngineStats {
    inner: EngineStats,
}

impl PyEngineStats {
    /// The counters the profile report shows.
    pub(crate) fn summary(&self) -> EngineSummary {
        let s = &self.inner;
        EngineSummary {
            buffer_waits: s.buffer_waits,
            buffer_wait_seconds: s.buffer_wait_seconds,
            hits: s.hits,
            misses: s.misses,
            reclaimed_unused: s.reclaimed_unused,
            out_of_order: s.out_of_order,
            ram_cold_bytes: s.ram_cold_bytes,
            ram_cold_blocks: s.ram_cold_blocks,
            ram_cold_seconds: s.ram_cold_seconds,
            workers: s.workers,
            depth: s.depth.clone(),
        }
    }
}

#[pymethods]
impl PyEngineStats {
    /// Tensor bytes staged from the RAM tier.
    #[getter]
    fn ram_bytes(&self) -> u64 {
        self.inner.ram_bytes
    }
    /// Tensor bytes staged from the disk tier.
    #[getter]
    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes
    }
    /// Of the RAM tier's bytes, those read from the drive (pages not in memory: a first pass).
    #[getter]
    fn ram_cold_bytes(&self) -> u64 {
        self.inner.ram_cold_bytes
    }
    /// Blocks of the RAM tier read from the drive.
    #[getter]
    fn ram_cold_blocks(&self) -> u64 {
        self.inner.ram_cold_blocks
    }
    /// Workers' seconds on those blocks, summed over workers.
    #[getter]
    fn ram_cold_seconds(&self) -> f64 {
        self.inner.ram_cold_seconds
    }
    /// Seconds workers spent staging, summed over workers.
    #[getter]
    fn read_seconds(&self) -> f64 {
        self.inner.read_seconds
    }
    /// Seconds the compute thread waited for staged blocks.
    #[getter]
    fn compute_waited_seconds(&self) -> f64 {
        self.inner.compute_waited_seconds
    }
    /// Runs of blocks counted: each `acquire`, and each `advance` after a `try_lease`.
    #[getter]
    fn acquires(&self) -> u64 {
        self.inner.acquires
    }
    /// Acquires that found their block already staged.
    #[getter]
    fn hits(&self) -> u64 {
        self.inner.hits
    }
    /// Acquires that had to wait for their block.
    #[getter]
    fn misses(&self) -> u64 {
        self.inner.misses
    }
    /// Times a worker waited for a free pinned buffer, and for how long.
    #[getter]
    fn buffer_waits(&self) -> u64 {
        self.inner.buffer_waits
    }
    /// Seconds workers waited for a free staging buffer, summed over workers.
    #[getter]
    fn buffer_wait_seconds(&self) -> f64 {
        self.inner.buffer_wait_seconds
    }
    /// Acquires of a block other than the one the run order says comes next.
    #[getter]
    fn out_of_order(&self) -> u64 {
        self.inner.out_of_order
    }
    /// Stagings that failed (the block's next `acquire` raises the error).
    #[getter]
    fn failures(&self) -> u64 {
        self.inner.failures
    }
    fn __repr__(&self) -> String {
        format!(
            "EngineStats(ram_bytes={}, disk_bytes={}, acquires={}, hits={}, misses={})",
            self.inner.ram_bytes,
            self.inner.disk_bytes,
            self.inner.acquires,
            self.inner.hits,
            self.inner.misses
        )
    }
}

impl From<EngineStats> for PyEngineStats {
    fn from(inner: EngineStats) -> Self {
        PyEngineStats { inner }
    }
}

/// Where a worker's staging read its bytes from: the core's `stream::StagingSource` as a Python
/// enum class.
#[pyclass(
    name = "StagingSource",
    module = "trash_panda._core",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms, non_camel_case_types)]
pub(crate) enum PyStagingSource {
    /// The disk tier, read from the checkpoint file.
    DISK,
    /// The RAM tier with its pages in memory: a memory copy.
    RAM_WARM,
    /// The RAM tier with pages read from the drive (a mapped RAM tier's first pass).
    RAM_COLD,
}

mirror_enum!(PyStagingSource <=> StagingSource {
    DISK = Disk,
    RAM_WARM = RamWarm,
    RAM_COLD = RamCold,
});

#[pymethods]
impl PyStagingSource {
    /// The source's name in traces and logs: "disk", "ram_warm" or "ram_cold".
    #[getter]
    fn value(&self) -> &'static str {
        StagingSource::from(*self).name()
    }

    fn __str__(&self) -> &'static str {
        StagingSource::from(*self).name()
    }
}

/// One block a worker read into a staging buffer, timed on `clock()`.
#[pyclass(name = "Staging", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PyStaging {
    inner: Staging,
}

impl PyStaging {
    /// The copy the profile's trace draws, for the profile's block `block`.
    pub(crate) fn copy_run(&self, block: usize) -> CopyRun {
        let s = &self.inner;
        CopyRun {
            block,
            start: s.start,
            end: s.end,
            bytes: s.bytes,
            tier: match s.source {
                StagingSource::Disk => Tier::Disk,
                StagingSource::RamWarm | StagingSource::RamCold => Tier::Ram,
            },
            worker: Some(s.worker),
            cold: s.source == StagingSource::RamCold,
        }
    }

    pub(crate) fn block(&self) -> usize {
        self.inner.block
    }
}

#[pymethods]
impl PyStaging {
    /// The engine's index of the block.
    #[getter(block)]
    fn py_block(&self) -> usize {
        self.inner.block
    }
    /// The worker thread, from 0.
    #[getter]
    fn worker(&self) -> usize {
        self.inner.worker
    }
    /// Seconds on `clock()`.
    #[getter]
    fn start(&self) -> f64 {
        self.inner.start
    }
    /// When the staging ended: seconds on `clock()`, like `start`.
    #[getter]
    fn end(&self) -> f64 {
        self.inner.end
    }
    /// Tensor bytes staged.
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.bytes
    }
    /// Where the bytes came from: `StagingSource.DISK`, `RAM_WARM` (pages in memory) or
    /// `RAM_COLD` (pages read from the drive).
    #[getter]
    fn source(&self) -> PyStagingSource {
        self.inner.source.into()
    }
    fn __repr__(&self) -> String {
        let s = &self.inner;
        format!(
            "Staging(block={}, worker={}, start={:.6}, end={:.6}, bytes={}, source={:?})",
            s.block,
            s.worker,
            s.start,
            s.end,
            s.bytes,
            s.source.name()
        )
    }
}

impl From<Staging> for PyStaging {
    fn from(inner: Staging) -> Self {
        PyStaging { inner }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngineStats>()?;
    m.add_class::<PyStaging>()?;
    m.add_class::<PyStagingSource>()?;
    Ok(())
}

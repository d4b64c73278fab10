//! `Shed`, `ReadCosts`, `give_back`, `resident_among` and `read_costs`: a loaded stage's blocks
//! as its plan counts them, which it gives back, and what its loader's reads cost (the core's
//! `pipeline::blocks`).

use pyo3::prelude::*;

use trash_panda::pipeline::{give_back, read_costs, resident_among, ReadCosts, Shed};

use crate::engine_config::PyEngineConfig;
use crate::plan::PyPlan;

/// Blocks (by prefix, in the order chosen) and the bytes they hold, as their plan counts them.
#[pyclass(name = "Shed", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyShed {
    inner: Shed,
}

#[pymethods]
impl PyShed {
    /// The blocks' prefixes, in the order chosen.
    #[getter]
    fn blocks(&self) -> Vec<String> {
        self.inner.blocks.clone()
    }
    /// Their bytes together.
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.bytes
    }
    fn __repr__(&self) -> String {
        format!(
            "Shed(blocks={:?}, bytes={})",
            self.inner.blocks, self.inner.bytes
        )
    }
}

/// What each read of a stage's loader holds once done, as its plan counts it: each block asked
/// about (its stored bytes when resident, else 0), the weights outside the blocks, and a RAM tier
/// read into memory.
#[pyclass(name = "ReadCosts", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyReadCosts {
    inner: ReadCosts,
}

#[pymethods]
impl PyReadCosts {
    /// Each block asked about, in the order asked: its stored bytes when resident, else 0.
    #[getter]
    fn blocks(&self) -> Vec<u64> {
        self.inner.blocks.clone()
    }
    /// The weights outside the blocks, when the loader reads some of them: their budget.
    #[getter]
    fn outside(&self) -> u64 {
        self.inner.outside
    }
    /// A RAM tier the loader reads into memory on the CPU: each RAM-tier block's staged bytes.
    #[getter]
    fn ram_tier(&self) -> u64 {
        self.inner.ram_tier
    }
    fn __repr__(&self) -> String {
        format!(
            "ReadCosts(blocks={:?}, outside={}, ram_tier={})",
            self.inner.blocks, self.inner.outside, self.inner.ram_tier
        )
    }
}

/// Which blocks a stage loaded by `plan` gives back so that `ask` bytes are free, `counted` of
/// them free already: its resident blocks not given back yet (`gone`), those that run last first
/// (`run_order`: every block's prefix in the order they run), until their bytes and `counted`
/// cover `ask`.
#[pyfunction(name = "give_back")]
#[pyo3(signature = (plan, run_order, gone, ask, counted=0))]
pub(super) fn py_give_back(
    plan: PyRef<'_, PyPlan>,
    run_order: Vec<String>,
    gone: Vec<String>,
    ask: u64,
    counted: u64,
) -> PyShed {
    PyShed {
        inner: give_back(&plan.inner, &run_order, &gone, ask, counted),
    }
}

/// The resident blocks among `blocks` (prefixes, in their order) and the bytes they hold, as
/// `plan` counts them.
#[pyfunction(name = "resident_among")]
pub(super) fn py_resident_among(plan: PyRef<'_, PyPlan>, blocks: Vec<String>) -> PyShed {
    PyShed {
        inner: resident_among(&plan.inner, &blocks),
    }
}

/// What the loader's reads of `blocks` (prefixes) hold once done, with the weights outside the
/// blocks when it reads some (`outside`) and the RAM tier when it reads that too (`ram_tier`),
/// for a stage loaded by `plan` and configured as `config`, computing on a GPU when `gpu`.
#[pyfunction(name = "read_costs")]
#[pyo3(signature = (plan, config, blocks, *, outside, ram_tier, gpu))]
pub(super) fn py_read_costs(
    plan: PyRef<'_, PyPlan>,
    config: PyRef<'_, PyEngineConfig>,
    blocks: Vec<String>,
    outside: bool,
    ram_tier: bool,
    gpu: bool,
) -> PyReadCosts {
    PyReadCosts {
        inner: read_costs(&plan.inner, &config.inner, &blocks, outside, ram_tier, gpu),
    }
}

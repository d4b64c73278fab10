//! `LoadReads`, `load_reads` and `plan_reads`: whether loads read through the page cache (the
//! core's `pipeline::reads`).

use pyo3::prelude::*;

use trash_panda::engine_config::{EngineConfig, EngineSettings};
use trash_panda::io::ReadMode;
use trash_panda::pipeline::{load_reads, plan_reads, LoadReads};

use crate::errors::ToPyErr;
use crate::plan::PyPlan;

/// How a pipeline's loads read its stages' weights: through the page cache or past it.
#[pyclass(name = "LoadReads", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyLoadReads {
    inner: LoadReads,
}

#[pymethods]
impl PyLoadReads {
    /// Whether the loads read past the page cache (O_DIRECT where the file system allows it).
    #[getter]
    fn direct(&self) -> bool {
        self.inner.mode == ReadMode::Direct
    }
    /// Why, in a sentence for the report.
    #[getter]
    fn reason(&self) -> &str {
        &self.inner.reason
    }
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
    fn __repr__(&self) -> String {
        format!("LoadReads(direct={})", self.direct())
    }
}

/// How a pipeline whose stages' files hold `files` bytes together reads them at its loads,
/// allowed `ram` bytes of RAM (and `vram` of device memory on a GPU), keeping its stages loaded
/// between runs where they fit (`keep`): past the page cache when each file is read once (the
/// stages stay loaded together), or when the files would not stay cached beside what the stages
/// hold in RAM; `TRASH_PANDA_DISK_MODE` other than `auto` wins.
#[pyfunction(name = "load_reads")]
#[pyo3(signature = (files, ram, vram=None, keep=true))]
pub(super) fn py_load_reads(
    files: u64,
    ram: u64,
    vram: Option<u64>,
    keep: bool,
) -> PyResult<PyLoadReads> {
    let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
    Ok(PyLoadReads {
        inner: load_reads(settings.disk_mode, files, ram, vram, keep),
    })
}

/// How one model loaded by `plan` on its own (not a pipeline's stage) reads its files of `files`
/// bytes: through the page cache only when a later load reads them again (`read_again`:
/// `stage()` releases the model at its end) and they stay cached beside what the plan holds in
/// RAM, within the RAM the plan may use; `TRASH_PANDA_DISK_MODE` other than `auto` wins.
#[pyfunction(name = "plan_reads")]
#[pyo3(signature = (plan, files, read_again=false))]
pub(crate) fn py_plan_reads(
    plan: PyRef<'_, PyPlan>,
    files: u64,
    read_again: bool,
) -> PyResult<PyLoadReads> {
    let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
    let config = EngineConfig::from_plan(&plan.inner, &settings).map_err(ToPyErr::to_py)?;
    let inner = plan_reads(settings.disk_mode, files, &plan.inner, &config, read_again)
        .map_err(ToPyErr::to_py)?;
    Ok(PyLoadReads { inner })
}

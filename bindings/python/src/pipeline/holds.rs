//! `Holds`, `Free` and `replan`: what a loaded stage holds, the free memory predicted once it
//! is released, and when a stage planned for that prediction is planned again (the core's
//! `pipeline::holds`).

use pyo3::prelude::*;

use trash_panda::engine_config::{EngineConfig, EngineSettings};
use trash_panda::pipeline::{ram_floor, replan, still_fits, Free, Holds, Replan};
use trash_panda::sys::MemoryFigures;

use crate::errors::ToPyErr;
use crate::plan::{min_free_ram_arg, PyPlan};

/// What a loaded stage holds that its release gives back, in bytes.
#[pyclass(name = "Holds", module = "trash_panda._core", frozen, eq)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PyHolds {
    pub(super) inner: Holds,
}

#[pymethods]
impl PyHolds {
    /// What `stage` (its name, for errors), loaded by `plan` under the current settings, holds.
    #[staticmethod]
    pub(crate) fn of(stage: &str, plan: PyRef<'_, PyPlan>) -> PyResult<Self> {
        let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
        let config = EngineConfig::from_plan(&plan.inner, &settings).map_err(ToPyErr::to_py)?;
        let inner = Holds::of(stage, &plan.inner, &config).map_err(ToPyErr::to_py)?;
        Ok(PyHolds { inner })
    }

    /// What `stage` (its name, for errors), loaded by `plan`, takes as its load is set up,
    /// before any read its allowance gates: its own staging buffers and, on a GPU, its device
    /// slots and expansion buffers.
    #[staticmethod]
    pub(crate) fn at_once(stage: &str, plan: PyRef<'_, PyPlan>) -> PyResult<Self> {
        let inner = Holds::at_once(stage, &plan.inner).map_err(ToPyErr::to_py)?;
        Ok(PyHolds { inner })
    }

    /// What `stage`, loaded by `plan`, needs free at its start: what it holds and the free
    /// memory its plan leaves alone.
    #[staticmethod]
    pub(crate) fn needed(stage: &str, plan: PyRef<'_, PyPlan>) -> PyResult<Self> {
        let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
        let config = EngineConfig::from_plan(&plan.inner, &settings).map_err(ToPyErr::to_py)?;
        let inner = Holds::needed(stage, &plan.inner, &config).map_err(ToPyErr::to_py)?;
        Ok(PyHolds { inner })
    }

    /// Whether a stage holding this computes its blocks in device memory (it holds some).
    #[getter]
    fn on_device(&self) -> bool {
        self.inner.on_device()
    }

    /// `n` bytes of the memory a stage holding this computes its blocks in.
    fn in_compute_memory(&self, n: u64) -> PyHolds {
        PyHolds {
            inner: self.inner.in_compute_memory(n),
        }
    }

    /// The bytes of `part` in the memory a stage holding this computes its blocks in.
    fn compute_part(&self, part: &PyHolds) -> u64 {
        self.inner.compute_part(part.inner)
    }

    /// Whether this much fits in `free`.
    fn fits(&self, free: &PyFree) -> bool {
        self.inner.fits(free.inner)
    }

    /// What of this does not fit in `free`.
    fn beyond(&self, free: &PyFree) -> Self {
        PyHolds {
            inner: self.inner.beyond(free.inner),
        }
    }

    #[new]
    #[pyo3(signature = (ram=0, vram=0))]
    fn new(ram: u64, vram: u64) -> Self {
        PyHolds {
            inner: Holds { ram, vram },
        }
    }

    /// Private RAM.
    #[getter]
    fn ram(&self) -> u64 {
        self.inner.ram
    }

    /// Device memory (a GPU's; 0 on the CPU).
    #[getter]
    fn vram(&self) -> u64 {
        self.inner.vram
    }

    /// What is left once `part` is taken out (none below zero).
    fn less(&self, part: &PyHolds) -> PyHolds {
        PyHolds {
            inner: self.inner.less(part.inner),
        }
    }

    /// The sum of two holdings.
    fn plus(&self, other: &PyHolds) -> PyHolds {
        PyHolds {
            inner: self.inner.plus(other.inner),
        }
    }

    fn __repr__(&self) -> String {
        format!("Holds(ram={}, vram={})", self.inner.ram, self.inner.vram)
    }
}

/// Free memory in bytes: RAM the process can use, and free VRAM where a GPU computes.
#[pyclass(name = "Free", module = "trash_panda._core", frozen, eq)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PyFree {
    pub(super) inner: Free,
}

#[pymethods]
impl PyFree {
    #[new]
    #[pyo3(signature = (ram, vram=None))]
    fn new(ram: u64, vram: Option<u64>) -> Self {
        PyFree {
            inner: Free { ram, vram },
        }
    }

    /// The memory free now as a plan made now counts it; `vram` is the device's free memory
    /// (None off a GPU).
    #[staticmethod]
    #[pyo3(signature = (vram=None))]
    fn probe(vram: Option<u64>) -> PyResult<Self> {
        let inner = Free::probe(vram).map_err(ToPyErr::to_py)?;
        Ok(PyFree { inner })
    }

    /// RAM the process can use, in bytes.
    #[getter]
    fn ram(&self) -> u64 {
        self.inner.ram
    }

    /// Free device memory in bytes; None when the CPU computes.
    #[getter]
    fn vram(&self) -> Option<u64> {
        self.inner.vram
    }

    /// The memory free once `released` is given back.
    fn after_release(&self, released: &PyHolds) -> PyFree {
        PyFree {
            inner: self.inner.after_release(released.inner),
        }
    }

    /// The memory free within a budget of `ram` (and `vram`) bytes, less what is `held`,
    /// never more than this.
    #[pyo3(signature = (ram, vram, held))]
    fn within(&self, ram: Option<u64>, vram: Option<u64>, held: &PyHolds) -> PyFree {
        PyFree {
            inner: self.inner.within(ram, vram, held.inner),
        }
    }

    /// The memory free for planning a stage beside a shared staging pool of `pool` bytes,
    /// which every stage's plan counts itself: the pool's RAM back (before `within`).
    fn with_shared_pool(&self, pool: u64) -> PyFree {
        PyFree {
            inner: self.inner.with_shared_pool(pool),
        }
    }

    /// The memory free for a pipeline whose pool of pages keeps `kept` bytes for its stages'
    /// next reads: those pages back (before `within`).
    fn with_kept_pages(&self, kept: u64) -> PyFree {
        PyFree {
            inner: self.inner.with_kept_pages(kept),
        }
    }

    /// The bytes a stage read ahead may fill now, beside a running stage: the free memory its
    /// blocks compute in (VRAM with a GPU, else RAM) less the running stage's working memory
    /// (`peak`, its measured activations; on a GPU at least the `reserve` its plan set aside).
    /// The floor of free RAM is this one's already (`keeping`).
    #[pyo3(signature = (*, peak=0, reserve=0))]
    fn for_reads_beside(&self, peak: u64, reserve: u64) -> u64 {
        self.inner.for_reads_beside(peak, reserve)
    }

    /// Whether `need` (what a stage read ahead takes at once, `Holds.at_once`) fits in this
    /// memory beside a running stage whose working memory is `peak` (on a GPU at least its
    /// `reserve`): the memory its blocks compute in as `for_reads_beside` counts it, and with a
    /// GPU the RAM as well.
    #[pyo3(signature = (need, *, peak=0, reserve=0))]
    fn fits_beside(&self, need: &PyHolds, peak: u64, reserve: u64) -> bool {
        self.inner.fits_beside(need.inner, peak, reserve)
    }

    /// The memory free for a pipeline's stages: this, with `floor` bytes of RAM kept for the
    /// rest of the machine (see `ram_floor`; before `within`: off the machine, not the budget).
    fn keeping(&self, floor: u64) -> PyFree {
        PyFree {
            inner: self.inner.keeping(floor),
        }
    }

    /// The memory left free once `taken` is taken (none below zero).
    fn less(&self, taken: &PyHolds) -> PyFree {
        PyFree {
            inner: self.inner.less(taken.inner),
        }
    }

    fn __repr__(&self) -> String {
        match self.inner.vram {
            Some(v) => format!("Free(ram={}, vram={v})", self.inner.ram),
            None => format!("Free(ram={})", self.inner.ram),
        }
    }
}

/// Why a stage is planned again at its start: the memory that missed the prediction.
#[pyclass(name = "Replan", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyReplan {
    pub(super) inner: Replan,
}

#[pymethods]
impl PyReplan {
    /// "RAM" or "VRAM".
    #[getter]
    fn memory(&self) -> &'static str {
        self.inner.memory
    }
    /// Bytes of that memory the stage was planned to find free.
    #[getter]
    fn predicted(&self) -> u64 {
        self.inner.predicted
    }
    /// Bytes of that memory free at the stage's start.
    #[getter]
    fn actual(&self) -> u64 {
        self.inner.actual
    }
    /// The largest gap in bytes, either way, between `predicted` and `actual` that would have
    /// kept the plan.
    #[getter]
    fn margin(&self) -> u64 {
        self.inner.margin
    }
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
    fn __repr__(&self) -> String {
        format!("Replan({})", self.inner)
    }
}

/// Whether a stage planned for `predicted` must be planned again for `actual` (None: keep it).
#[pyfunction(name = "replan")]
pub(super) fn py_replan(predicted: &PyFree, actual: &PyFree) -> Option<PyReplan> {
    replan(predicted.inner, actual.inner).map(|inner| PyReplan { inner })
}

/// Whether `stage`, read ahead by plan `loaded`, whose start found `actual` free past the
/// prediction's margin, is kept as it was loaded: `fresh` (a plan made for `actual`) puts every
/// block in the same tier, and what `loaded` needs at its start under the current settings
/// fits `actual`.
#[pyfunction(name = "still_fits")]
pub(super) fn py_still_fits(
    stage: &str,
    loaded: PyRef<'_, PyPlan>,
    fresh: PyRef<'_, PyPlan>,
    actual: &PyFree,
) -> PyResult<bool> {
    let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
    let config = EngineConfig::from_plan(&loaded.inner, &settings).map_err(ToPyErr::to_py)?;
    still_fits(stage, &loaded.inner, &fresh.inner, &config, actual.inner).map_err(ToPyErr::to_py)
}

/// The RAM a pipeline leaves to the rest of this machine: the largest of its stages'
/// `min_free_ram` (each `"auto"`, bytes or a size; None is `"auto"`), `"auto"` resolved for
/// this machine's RAM. The pipeline keeps it from the machine's free memory
/// (`Free.keeping`), and its stages plan with none.
#[pyfunction(name = "ram_floor")]
pub(super) fn py_ram_floor(min_free_ram: Vec<Bound<'_, PyAny>>) -> PyResult<u64> {
    let stages = min_free_ram
        .iter()
        .map(|v| {
            if v.is_none() {
                Ok(Default::default())
            } else {
                min_free_ram_arg(v)
            }
        })
        .collect::<PyResult<Vec<_>>>()?;
    let total = MemoryFigures::probe().map_err(ToPyErr::to_py)?.total_ram;
    Ok(ram_floor(&stages, total))
}

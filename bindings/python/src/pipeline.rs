//! `trash_panda._core` memory handover between a pipeline's stages (the core's `pipeline`):
//! what a loaded stage holds, the free memory predicted once it is released, when to plan again,
//! and the allowance the next stage's early reads take from.

use std::sync::Arc;

use pyo3::prelude::*;

use trash_panda::engine_config::{EngineConfig, EngineSettings};
use trash_panda::io::ReadMode;
use trash_panda::pipeline::{
    load_reads, plan_reads, replan, report, Allowance, Arrival, Departure, Free, Holds, LoadReads,
    Replan, StageRecord,
};

use crate::errors::{raise, Kind};

use crate::errors::ToPyErr;
use crate::gil::without_gil;
use crate::plan::PyPlan;

/// What a loaded stage holds that its release gives back, in bytes.
#[pyclass(name = "Holds", module = "trash_panda._core", frozen, eq)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PyHolds {
    inner: Holds,
}

#[pymethods]
impl PyHolds {
    /// What `stage` (its name, for errors), loaded by `plan` under the current settings, holds.
    #[staticmethod]
    fn of(stage: &str, plan: PyRef<'_, PyPlan>) -> PyResult<Self> {
        let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
        let config = EngineConfig::from_plan(&plan.inner, &settings).map_err(ToPyErr::to_py)?;
        let inner = Holds::of(stage, &plan.inner, &config).map_err(ToPyErr::to_py)?;
        Ok(PyHolds { inner })
    }

    /// What `stage`, loaded by `plan`, needs free at its start: what it holds and the free
    /// memory its plan leaves alone.
    #[staticmethod]
    fn needed(stage: &str, plan: PyRef<'_, PyPlan>) -> PyResult<Self> {
        let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
        let config = EngineConfig::from_plan(&plan.inner, &settings).map_err(ToPyErr::to_py)?;
        let inner = Holds::needed(stage, &plan.inner, &config).map_err(ToPyErr::to_py)?;
        Ok(PyHolds { inner })
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
    inner: Free,
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
    inner: Replan,
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
fn py_replan(predicted: &PyFree, actual: &PyFree) -> Option<PyReplan> {
    replan(predicted.inner, actual.inner).map(|inner| PyReplan { inner })
}

/// What an allowance has done.
#[pyclass(name = "AllowanceStats", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PyAllowanceStats {
    /// Bytes the reads took, waiting or not.
    #[pyo3(get)]
    taken: u64,
    /// Bytes the running stage gave back with `give`.
    #[pyo3(get)]
    given: u64,
    /// Takes that had to wait for memory.
    #[pyo3(get)]
    waits: u64,
    /// Seconds those takes waited, summed.
    #[pyo3(get)]
    wait_seconds: f64,
}

/// The memory the next stage's early reads may fill while the stage before it runs: `take`
/// waits (without the GIL) until the bytes are there; `give` adds what the running stage freed;
/// `open` lifts the limit when the stage starts; `close` fails every wait.
#[pyclass(name = "Allowance", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyAllowance {
    inner: Arc<Allowance>,
}

#[pymethods]
impl PyAllowance {
    #[new]
    fn new(stage: String, bytes: u64) -> Self {
        PyAllowance {
            inner: Arc::new(Allowance::new(stage, bytes)),
        }
    }

    /// Takes `bytes` for a read, waiting (without the GIL) until they are there or the
    /// allowance is opened; a StreamError once it is closed. A read larger than anything
    /// the running stage can give back waits for the next stage's start.
    fn take(&self, py: Python<'_>, bytes: u64) -> PyResult<()> {
        let inner = self.inner.clone();
        without_gil(py, move || inner.take(bytes)).map_err(ToPyErr::to_py)
    }

    /// Takes `bytes` if they are there now, without waiting; whether it took them (False once
    /// closed).
    fn try_take(&self, bytes: u64) -> bool {
        self.inner.try_take(bytes)
    }

    /// Adds `bytes` the running stage freed, waking the takes that now fit.
    fn give(&self, bytes: u64) {
        self.inner.give(bytes);
    }

    /// Lifts the limit: call it when the stage the reads are for starts, as its plan holds from
    /// then on; waiting and later takes go through.
    fn open(&self) {
        self.inner.open();
    }

    /// Fails every waiting and later take: call it when the stage the reads are for is
    /// dropped.
    fn close(&self) {
        self.inner.close();
    }

    /// Bytes a read may take now without waiting (None once opened: no limit).
    #[getter]
    fn available(&self) -> Option<u64> {
        (!self.inner.is_open()).then(|| self.inner.available())
    }

    /// Whether `open` was called: reads then take without limit.
    #[getter]
    fn is_open(&self) -> bool {
        self.inner.is_open()
    }

    /// Takes waiting for memory now.
    #[getter]
    fn waiting(&self) -> usize {
        self.inner.waiting()
    }

    /// The name of the stage the reads are for.
    #[getter]
    fn stage(&self) -> &str {
        self.inner.stage()
    }

    /// What the allowance has done so far (a copy, which later takes do not change).
    fn stats(&self) -> PyAllowanceStats {
        let s = self.inner.stats();
        PyAllowanceStats {
            taken: s.taken,
            given: s.given,
            waits: s.waits,
            wait_seconds: s.wait_seconds,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Allowance(stage={:?}, available={})",
            self.inner.stage(),
            if self.inner.is_open() {
                "open".to_string()
            } else {
                self.inner.available().to_string()
            }
        )
    }
}

const ARRIVALS: [(&str, Arrival); 4] = [
    ("kept", Arrival::Kept),
    ("read_ahead", Arrival::ReadAhead),
    ("read_at_start", Arrival::ReadAtStart),
    ("replanned", Arrival::Replanned),
];
const DEPARTURES: [(&str, Departure); 4] = [
    ("kept", Departure::Kept),
    ("released", Departure::Released),
    ("final_pass", Departure::FinalPass),
    ("failed", Departure::Failed),
];

fn pick<T: Copy>(table: &[(&str, T)], name: &str, what: &str) -> PyResult<T> {
    table
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            raise(
                Kind::Argument,
                format!("{what}: {name:?} is not one of {}", names.join(", ")),
            )
        })
}

/// One stage of one pipeline run, for the pipeline's report.
#[pyclass(name = "StageRecord", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyStageRecord {
    inner: StageRecord,
}

#[pymethods]
impl PyStageRecord {
    /// `arrival`: "kept", "read_ahead", "read_at_start" or "replanned"; `departure`: "kept",
    /// "released", "final_pass" or "failed".
    #[new]
    #[pyo3(signature = (run, stage, arrival, departure, *, predicted=None, actual=None, replan=None,
        read_before_start=0, holds=0, file_bytes=0, cached_at_load=0, waited=0.0, seconds=0.0, peak=0, read_again=0, given_back=0, file_changed=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        run: u32,
        stage: String,
        arrival: &str,
        departure: &str,
        predicted: Option<PyFree>,
        actual: Option<PyFree>,
        replan: Option<PyReplan>,
        read_before_start: u64,
        holds: u64,
        file_bytes: u64,
        cached_at_load: u64,
        waited: f64,
        seconds: f64,
        peak: u64,
        read_again: u64,
        given_back: u64,
        file_changed: Option<String>,
    ) -> PyResult<Self> {
        Ok(PyStageRecord {
            inner: StageRecord {
                run,
                stage,
                arrival: pick(&ARRIVALS, arrival, "arrival")?,
                predicted: predicted.map(|f| f.inner),
                actual: actual.map(|f| f.inner),
                replan: replan.map(|r| r.inner),
                read_before_start,
                holds,
                file_bytes,
                cached_at_load,
                waited,
                seconds,
                peak,
                departure: pick(&DEPARTURES, departure, "departure")?,
                read_again,
                given_back,
                file_changed,
            },
        })
    }

    /// The run's number, as the caller counts its runs.
    #[getter]
    fn run(&self) -> u32 {
        self.inner.run
    }
    /// The stage's name.
    #[getter]
    fn stage(&self) -> &str {
        &self.inner.stage
    }
    /// How its weights were there when its turn came: "kept", "read_ahead", "read_at_start" or
    /// "replanned".
    #[getter]
    fn arrival(&self) -> &'static str {
        ARRIVALS
            .iter()
            .find(|(_, a)| *a == self.inner.arrival)
            .map_or("", |(n, _)| n)
    }
    /// What became of it at its end: "kept", "released", "final_pass" or "failed".
    #[getter]
    fn departure(&self) -> &'static str {
        DEPARTURES
            .iter()
            .find(|(_, d)| *d == self.inner.departure)
            .map_or("", |(n, _)| n)
    }
    /// Bytes it already held when its turn came, read while the stage before it computed.
    #[getter]
    fn read_before_start(&self) -> u64 {
        self.inner.read_before_start
    }
    /// Bytes its plan holds in all.
    #[getter]
    fn holds(&self) -> u64 {
        self.inner.holds
    }
    /// Bytes of its checkpoint; 0 when kept.
    #[getter]
    fn file_bytes(&self) -> u64 {
        self.inner.file_bytes
    }
    /// Bytes of its checkpoint already in the page cache when its load began; 0 when kept.
    #[getter]
    fn cached_at_load(&self) -> u64 {
        self.inner.cached_at_load
    }
    /// Seconds its calls waited for weights not read yet.
    #[getter]
    fn waited(&self) -> f64 {
        self.inner.waited
    }
    /// Seconds from its start to its end.
    #[getter]
    fn seconds(&self) -> f64 {
        self.inner.seconds
    }
    /// Its peak activation memory in bytes, remembered for its next plan (0: not measured).
    #[getter]
    fn peak(&self) -> u64 {
        self.inner.peak
    }
    /// Bytes of its blocks given to other stages since its last run and read again at its start
    /// (for a stage kept loaded).
    #[getter]
    fn read_again(&self) -> u64 {
        self.inner.read_again
    }
    /// Bytes of its blocks given to the next stage, by its final pass or at its end (for a stage
    /// kept loaded; the rest stays for the next run).
    #[getter]
    fn given_back(&self) -> u64 {
        self.inner.given_back
    }
    /// Why it was loaded afresh though kept from an earlier run: its checkpoint changed on disk
    /// since (which file, and how). None otherwise.
    #[getter]
    fn file_changed(&self) -> Option<&str> {
        self.inner.file_changed.as_deref()
    }
    /// The free memory its plan was made for; None when it was kept loaded.
    #[getter]
    fn predicted(&self) -> Option<PyFree> {
        self.inner.predicted.map(|inner| PyFree { inner })
    }
    /// The memory free at its start, what it already held counted as free; None when it was kept
    /// loaded.
    #[getter]
    fn actual(&self) -> Option<PyFree> {
        self.inner.actual.map(|inner| PyFree { inner })
    }
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
}

/// The report of the stages of a pipeline's runs, in the order they ran.
#[pyfunction]
fn pipeline_report(records: Vec<PyRef<'_, PyStageRecord>>) -> String {
    let records: Vec<StageRecord> = records.iter().map(|r| r.inner.clone()).collect();
    report(&records)
}

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
/// allowed `ram` bytes of RAM (and `vram` of device memory on a GPU): past the page cache unless
/// the files stay cached beside what the stages hold in RAM; `TRASH_PANDA_DISK_MODE` other than
/// `auto` wins.
#[pyfunction(name = "load_reads")]
#[pyo3(signature = (files, ram, vram=None))]
fn py_load_reads(files: u64, ram: u64, vram: Option<u64>) -> PyResult<PyLoadReads> {
    let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
    Ok(PyLoadReads {
        inner: load_reads(settings.disk_mode, files, ram, vram),
    })
}

/// How one model loaded by `plan` on its own (not a pipeline's stage) reads its files of `files`
/// bytes: past the page cache unless they stay cached beside what the plan holds in RAM, within
/// the RAM the plan may use; `TRASH_PANDA_DISK_MODE` other than `auto` wins.
#[pyfunction(name = "plan_reads")]
fn py_plan_reads(plan: PyRef<'_, PyPlan>, files: u64) -> PyResult<PyLoadReads> {
    let settings = EngineSettings::from_env().map_err(ToPyErr::to_py)?;
    let config = EngineConfig::from_plan(&plan.inner, &settings).map_err(ToPyErr::to_py)?;
    let inner =
        plan_reads(settings.disk_mode, files, &plan.inner, &config).map_err(ToPyErr::to_py)?;
    Ok(PyLoadReads { inner })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLoadReads>()?;
    m.add_function(wrap_pyfunction!(py_load_reads, m)?)?;
    m.add_function(wrap_pyfunction!(py_plan_reads, m)?)?;
    m.add_class::<PyHolds>()?;
    m.add_class::<PyFree>()?;
    m.add_class::<PyReplan>()?;
    m.add_class::<PyAllowanceStats>()?;
    m.add_class::<PyAllowance>()?;
    m.add_class::<PyStageRecord>()?;
    m.add_function(wrap_pyfunction!(py_replan, m)?)?;
    m.add_function(wrap_pyfunction!(pipeline_report, m)?)?;
    Ok(())
}

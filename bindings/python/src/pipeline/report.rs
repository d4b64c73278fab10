//! `StageRecord` and `pipeline_report`: each stage of each run, for the pipeline's report (the
//! core's `pipeline::report`).

use pyo3::prelude::*;

use trash_panda::pipeline::{report, Arrival, Departure, GroupRecord, StageRecord};

use crate::mirror::mirror_enum;

use super::group::{PyGroupRecord, PyShare};
use super::holds::{PyFree, PyReplan};
use super::pace::PyPaceVerdict;

/// How a stage's weights were there when its turn came (the core's `Arrival`).
#[pyclass(
    name = "Arrival",
    module = "trash_panda._core",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms, non_camel_case_types)]
pub(crate) enum PyArrival {
    /// Still loaded from an earlier run.
    KEPT,
    /// Read while the stage before it computed (some may have arrived after its start).
    READ_AHEAD,
    /// Read at its start (the first stage of a run, or read-ahead off).
    READ_AT_START,
    /// Read ahead, then planned and read again at its start: the free memory missed the
    /// prediction by more than the margin.
    REPLANNED,
}

mirror_enum!(PyArrival <=> Arrival {
    KEPT = Kept,
    READ_AHEAD = ReadAhead,
    READ_AT_START = ReadAtStart,
    REPLANNED = Replanned,
});

#[pymethods]
impl PyArrival {
    /// How the report says it ("read ahead", "kept from the run before", ...).
    fn __str__(&self) -> String {
        Arrival::from(*self).to_string()
    }
}

/// What became of a stage at its end (the core's `Departure`).
#[pyclass(
    name = "Departure",
    module = "trash_panda._core",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms, non_camel_case_types)]
pub(crate) enum PyDeparture {
    /// Left loaded: the stages after it did not need its memory.
    KEPT,
    /// Released: a later stage needed its memory (or keeping is off).
    RELEASED,
    /// Its blocks were freed by a final pass and given to the next stage as they went.
    FINAL_PASS,
    /// Its block raised; it was released.
    FAILED,
}

mirror_enum!(PyDeparture <=> Departure {
    KEPT = Kept,
    RELEASED = Released,
    FINAL_PASS = FinalPass,
    FAILED = Failed,
});

#[pymethods]
impl PyDeparture {
    /// How the report says it ("kept", "freed by its final pass", ...).
    fn __str__(&self) -> String {
        Departure::from(*self).to_string()
    }
}

/// One stage of one pipeline run, for the pipeline's report.
#[pyclass(name = "StageRecord", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyStageRecord {
    inner: StageRecord,
}

#[pymethods]
impl PyStageRecord {
    #[new]
    #[pyo3(signature = (run, stage, arrival, departure, *, predicted=None, actual=None, replan=None,
        read_before_start=0, holds=0, file_bytes=0, cached_at_load=0, waited=0.0, seconds=0.0, peak=0, read_again=0, given_back=0, file_changed=None, beside=None, plan_warnings=Vec::new(), share=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        run: u32,
        stage: String,
        arrival: PyArrival,
        departure: PyDeparture,
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
        beside: Option<PyPaceVerdict>,
        plan_warnings: Vec<String>,
        share: Option<PyShare>,
    ) -> Self {
        PyStageRecord {
            inner: StageRecord {
                run,
                stage,
                arrival: arrival.into(),
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
                departure: departure.into(),
                read_again,
                given_back,
                file_changed,
                beside: beside.map(|v| v.inner),
                plan_warnings,
                share: share.map(|s| s.inner),
            },
        }
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
    /// How its weights were there when its turn came.
    #[getter]
    fn arrival(&self) -> PyArrival {
        self.inner.arrival.into()
    }
    /// What became of it at its end.
    #[getter]
    fn departure(&self) -> PyDeparture {
        self.inner.departure.into()
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
    /// What the next stage's read-ahead cost its compute, and what the runner did about it;
    /// None when nothing was read beside it.
    #[getter]
    fn beside(&self) -> Option<PyPaceVerdict> {
        self.inner
            .beside
            .clone()
            .map(|inner| PyPaceVerdict { inner })
    }
    /// The warnings of the plan it was loaded by; empty when it was kept loaded.
    #[getter]
    fn plan_warnings(&self) -> Vec<String> {
        self.inner.plan_warnings.clone()
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
    /// Its group and why it got its share of the group's memory; None outside a group.
    #[getter]
    fn share(&self) -> Option<PyShare> {
        self.inner.share.clone().map(|inner| PyShare { inner })
    }
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
}

/// The report of the stages of a pipeline's runs, in the order they ran; each group's run
/// before its first member's record.
#[pyfunction]
#[pyo3(signature = (records, groups=Vec::new()))]
pub(super) fn pipeline_report(
    records: Vec<PyRef<'_, PyStageRecord>>,
    groups: Vec<PyRef<'_, PyGroupRecord>>,
) -> String {
    let records: Vec<StageRecord> = records.iter().map(|r| r.inner.clone()).collect();
    let groups: Vec<GroupRecord> = groups.iter().map(|g| g.inner.clone()).collect();
    report(&records, &groups)
}

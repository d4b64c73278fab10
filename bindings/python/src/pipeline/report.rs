//! `StageRecord` and `pipeline_report`: each stage of each run, for the pipeline's report (the
//! core's `pipeline::report`).

use pyo3::prelude::*;

use trash_panda::pipeline::{report, Arrival, Departure, StageRecord};

use crate::errors::{raise, Kind};

use super::holds::{PyFree, PyReplan};

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
        read_before_start=0, holds=0, file_bytes=0, cached_at_load=0, waited=0.0, seconds=0.0, peak=0, read_again=0, given_back=0, file_changed=None, plan_warnings=Vec::new()))]
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
        plan_warnings: Vec<String>,
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
                plan_warnings,
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
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
}

/// The report of the stages of a pipeline's runs, in the order they ran.
#[pyfunction]
pub(super) fn pipeline_report(records: Vec<PyRef<'_, PyStageRecord>>) -> String {
    let records: Vec<StageRecord> = records.iter().map(|r| r.inner.clone()).collect();
    report(&records)
}

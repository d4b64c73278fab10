//! `Allowance`: the memory the next stage's early reads may fill (the core's
//! `pipeline::allowance`).

use std::sync::Arc;

use pyo3::prelude::*;

use trash_panda::pipeline::Allowance;

use crate::errors::ToPyErr;
use crate::gil::without_gil;

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

    /// Makes every read wait, whatever memory is there, until `resume` or `open`: the read
    /// ahead is paused.
    fn hold(&self) {
        self.inner.hold();
    }

    /// Lets reads take what is there again after `hold`.
    fn resume(&self) {
        self.inner.resume();
    }

    /// Whether reads are held (and the allowance not opened since).
    #[getter]
    fn is_held(&self) -> bool {
        self.inner.is_held()
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

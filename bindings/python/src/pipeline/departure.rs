//! `Leaving` and `depart`: how a stage leaves at its turn's end, and what a kept one gives back
//! (the core's `pipeline::departure`).

use pyo3::prelude::*;

use trash_panda::pipeline::{depart, Ending, Leaving};

use super::report::PyDeparture;

/// What becomes of a stage at its end (`departure`), and the bytes of its blocks a kept one
/// gives back now (`give`, 0 otherwise), those it runs last.
#[pyclass(name = "Leaving", module = "trash_panda._core", frozen, eq)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PyLeaving {
    inner: Leaving,
}

#[pymethods]
impl PyLeaving {
    /// How it leaves.
    #[getter]
    fn departure(&self) -> PyDeparture {
        self.inner.departure.into()
    }
    /// Kept: bytes of its blocks to give back now (0: none); 0 when it is not kept.
    #[getter]
    fn give(&self) -> u64 {
        self.inner.give
    }
    fn __repr__(&self) -> String {
        format!(
            "Leaving(departure={:?}, give={})",
            self.inner.departure, self.inner.give
        )
    }
}

/// How a stage leaves at its turn's end: `failed` (one of its blocks raised) first; released
/// (by its `final_pass` when one ran) when `release_after`, when `keep` is off, or when what it
/// must still give (`to_give` less what its final pass freed, `passed`) reaches all it could
/// shed (`sheddable`); kept otherwise, giving back the rest of what was asked.
#[pyfunction(name = "depart")]
#[pyo3(signature = (*, failed, final_pass, release_after, keep, to_give, passed, sheddable))]
#[allow(clippy::too_many_arguments)]
pub(super) fn py_depart(
    failed: bool,
    final_pass: bool,
    release_after: bool,
    keep: bool,
    to_give: u64,
    passed: u64,
    sheddable: u64,
) -> PyLeaving {
    PyLeaving {
        inner: depart(Ending {
            failed,
            final_pass,
            release_after,
            keep,
            to_give,
            passed,
            sheddable,
        }),
    }
}

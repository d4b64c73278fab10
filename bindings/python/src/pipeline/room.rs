//! `Holder`, `Giving` and `make_room`: which loaded stages give memory to a stage that needs
//! more than is free, and how much (the core's `pipeline::room`).

use pyo3::prelude::*;

use trash_panda::pipeline::{make_room, Give, Giving, Holder};

use crate::errors::ToPyErr;

use super::holds::PyHolds;

/// A loaded stage that could give memory to the stage being loaded: its name, its place in the
/// pipeline, what its release frees (`whole`), the bytes of resident blocks it could give back
/// one by one, and whether it has run.
#[pyclass(name = "Holder", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyHolder {
    inner: Holder,
}

#[pymethods]
impl PyHolder {
    #[new]
    #[pyo3(signature = (name, index, whole, sheddable, has_run))]
    fn new(name: String, index: usize, whole: &PyHolds, sheddable: u64, has_run: bool) -> Self {
        PyHolder {
            inner: Holder {
                name,
                index,
                whole: whole.inner,
                sheddable,
                has_run,
            },
        }
    }
    /// The stage's name.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    /// Its place in the pipeline (0: the first stage).
    #[getter]
    fn index(&self) -> usize {
        self.inner.index
    }
    fn __repr__(&self) -> String {
        format!(
            "Holder({:?}, index={}, whole={:?}, sheddable={}, has_run={})",
            self.inner.name,
            self.inner.index,
            self.inner.whole,
            self.inner.sheddable,
            if self.inner.has_run { "True" } else { "False" }
        )
    }
}

/// One stage's part of the room made: all of it (`whole`), or `blocks` bytes of its resident
/// blocks, those it runs last, in the memory its blocks compute in.
#[pyclass(name = "Giving", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyGiving {
    inner: Giving,
}

#[pymethods]
impl PyGiving {
    /// The giving stage's name.
    #[getter]
    fn stage(&self) -> &str {
        &self.inner.stage
    }
    /// Whether it gives all it holds (it is released).
    #[getter]
    fn whole(&self) -> bool {
        self.inner.give == Give::Whole
    }
    /// Bytes of its blocks it gives back (0 when it gives all of it).
    #[getter]
    fn blocks(&self) -> u64 {
        match self.inner.give {
            Give::Blocks(n) => n,
            Give::Whole => 0,
        }
    }
    fn __repr__(&self) -> String {
        match self.inner.give {
            Give::Blocks(n) => format!("Giving({:?}, blocks={n})", self.inner.stage),
            Give::Whole => format!("Giving({:?}, whole)", self.inner.stage),
        }
    }
}

/// Who gives what so that `short` (what the stage at `here` needs beyond the free memory) is
/// free, among `holders`, in a pipeline of `stages` stages: the stage whose next turn is
/// furthest off first; one that has run gives only the blocks missing when it has more
/// (unless `keep` is off), any other goes whole.
#[pyfunction(name = "make_room")]
#[pyo3(signature = (here, stages, short, holders, *, keep))]
pub(super) fn py_make_room(
    here: usize,
    stages: usize,
    short: &PyHolds,
    holders: Vec<PyRef<'_, PyHolder>>,
    keep: bool,
) -> PyResult<Vec<PyGiving>> {
    let holders: Vec<Holder> = holders.iter().map(|h| h.inner.clone()).collect();
    let givings = make_room(here, stages, short.inner, &holders, keep).map_err(ToPyErr::to_py)?;
    Ok(givings
        .into_iter()
        .map(|inner| PyGiving { inner })
        .collect())
}

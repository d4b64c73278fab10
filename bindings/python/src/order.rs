//! `trash_panda._core`'s order files: the core's `order` module for the Python layer, which only
//! asks it (where the file is, what it holds, whether to write it, the full run order).

use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::prelude::*;

use trash_panda::order::{self, OrderRead, ORDER_FORMAT, ORDER_SUFFIX, ORDER_VERSION};

use crate::errors::ToPyErr;
use crate::gil::without_gil;

/// What reading an order file gave: the order, or why the file was not used.
#[pyclass(name = "OrderRead", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyOrderRead {
    inner: OrderRead,
    /// The file that was read, for the warning.
    #[pyo3(get)]
    path: PathBuf,
}

#[pymethods]
impl PyOrderRead {
    /// Whether the file held an order that fits the model.
    #[getter]
    fn usable(&self) -> bool {
        self.inner.order().is_some()
    }

    /// The file's blocks as the model spells them, in the file's order (None if not usable).
    #[getter]
    fn blocks(&self) -> Option<Vec<String>> {
        self.inner.order().map(|k| k.blocks.clone())
    }

    /// The positions of those blocks among the model's blocks (None if not usable).
    #[getter]
    fn indices(&self) -> Option<Vec<usize>> {
        self.inner.order().map(|k| k.indices.clone())
    }

    /// The file's outside modules: name -> how many blocks of the run order start before its
    /// first use (None if not usable; empty when the file has none, as older files).
    #[getter]
    fn outside(&self) -> Option<BTreeMap<String, usize>> {
        self.inner.order().map(|k| k.outside.clone())
    }

    /// The file's outside positions when every name in them is one of `modules` (the model's
    /// modules outside its blocks that hold weights), else empty: the core's rule.
    fn outside_for(&self, modules: Vec<String>) -> BTreeMap<String, usize> {
        self.inner
            .order()
            .map(|k| k.outside_for(&modules))
            .unwrap_or_default()
    }

    /// Why the file was not used, as a tag: "absent", "torn", "not-json", "wrong-format",
    /// "wrong-version", "malformed", "too-large", "unknown-block" or "duplicate".
    #[getter]
    fn reason(&self) -> Option<&'static str> {
        self.inner.ignored().map(|i| i.tag())
    }

    /// Why the file was not used, in words.
    #[getter]
    fn detail(&self) -> Option<String> {
        self.inner.ignored().map(ToString::to_string)
    }

    /// The block name at fault, for "unknown-block" and "duplicate".
    #[getter]
    fn block(&self) -> Option<String> {
        self.inner
            .ignored()
            .and_then(|i| i.block())
            .map(str::to_string)
    }

    /// The one warning line for a file that exists but was ignored; None otherwise.
    fn warning(&self) -> Option<String> {
        self.inner.warning(&self.path)
    }

    fn __repr__(&self) -> String {
        match self.inner.order() {
            Some(k) => format!("OrderRead(usable, {} blocks)", k.blocks.len()),
            None => format!("OrderRead({})", self.reason().unwrap_or_default()),
        }
    }
}

/// The order file of `checkpoint` (a file, an index or a folder), next to it or in `destination`.
#[pyfunction]
#[pyo3(signature = (checkpoint, destination=None))]
fn order_file_path(checkpoint: PathBuf, destination: Option<PathBuf>) -> PyResult<PathBuf> {
    order::order_file_path(&checkpoint, destination.as_deref()).map_err(ToPyErr::to_py)
}

/// Reads the order file at `path`, matched against the model's `blocks` in plan order.
#[pyfunction]
fn read_order_file(py: Python<'_>, path: PathBuf, blocks: Vec<String>) -> PyResult<PyOrderRead> {
    let inner =
        without_gil(py, || order::read_order_file(&path, &blocks)).map_err(ToPyErr::to_py)?;
    Ok(PyOrderRead { inner, path })
}

/// Writes `blocks`, in the order they ran, as the order file at `path` for `checkpoint`,
/// atomically; `outside` (module name -> blocks started before its first use) goes with them.
#[pyfunction]
#[pyo3(signature = (path, checkpoint, blocks, outside=None))]
fn write_order_file(
    py: Python<'_>,
    path: PathBuf,
    checkpoint: PathBuf,
    blocks: Vec<String>,
    outside: Option<BTreeMap<String, usize>>,
) -> PyResult<()> {
    let outside = outside.unwrap_or_default();
    without_gil(py, || {
        order::write_order_file_with_outside(&path, &checkpoint, &blocks, &outside)
    })
    .map_err(ToPyErr::to_py)
}

/// Outside module name -> blocks of the run order started before its first use.
type Outside = BTreeMap<String, usize>;

/// `order_to_write` with the outside modules the run recorded (name -> distinct blocks started
/// before its first use): (blocks, outside) to write, or None to leave the file.
#[pyfunction]
fn file_to_write(
    read: PyRef<'_, PyOrderRead>,
    recorded: Vec<String>,
    blocks: Vec<String>,
    outside: Outside,
) -> PyResult<Option<(Vec<String>, Outside)>> {
    let write =
        order::file_to_write(&read.inner, &recorded, &blocks, &outside).map_err(ToPyErr::to_py)?;
    Ok(write.map(|w| (w.blocks, w.outside)))
}

/// The order to write to the file after a run (every block that ran, in the order of their
/// first run, merged into the known order when only some ran), or None to leave the file.
#[pyfunction]
fn order_to_write(
    read: PyRef<'_, PyOrderRead>,
    recorded: Vec<String>,
    blocks: Vec<String>,
) -> PyResult<Option<Vec<String>>> {
    order::order_to_write(&read.inner, &recorded, &blocks).map_err(ToPyErr::to_py)
}

/// The full run order as positions in `blocks`: the blocks `first` names, then the others in
/// plan order.
#[pyfunction]
fn full_order(first: Vec<String>, blocks: Vec<String>) -> PyResult<Vec<usize>> {
    order::full_order(&first, &blocks).map_err(ToPyErr::to_py)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ORDER_FORMAT", ORDER_FORMAT)?;
    m.add("ORDER_VERSION", ORDER_VERSION)?;
    m.add("ORDER_SUFFIX", ORDER_SUFFIX)?;
    m.add_class::<PyOrderRead>()?;
    m.add_function(wrap_pyfunction!(order_file_path, m)?)?;
    m.add_function(wrap_pyfunction!(read_order_file, m)?)?;
    m.add_function(wrap_pyfunction!(write_order_file, m)?)?;
    m.add_function(wrap_pyfunction!(order_to_write, m)?)?;
    m.add_function(wrap_pyfunction!(file_to_write, m)?)?;
    m.add_function(wrap_pyfunction!(full_order, m)?)
}

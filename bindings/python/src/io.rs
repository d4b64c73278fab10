//! `trash_panda._core` page-cache helpers, used by tests and benchmarks to make cold reads.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::errors::ToPyErr;
use crate::gil::without_gil;

/// Asks the kernel to drop the file's pages from the page cache.
#[pyfunction]
fn drop_cache(py: Python<'_>, path: PathBuf) -> PyResult<()> {
    without_gil(py, || trash_panda::io::drop_cache(&path)).map_err(ToPyErr::to_py)
}

/// How many bytes of the file are in the page cache.
#[pyfunction]
fn cached_bytes(py: Python<'_>, path: PathBuf) -> PyResult<u64> {
    without_gil(py, || trash_panda::io::cached_bytes(&path)).map_err(ToPyErr::to_py)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(drop_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cached_bytes, m)?)?;
    Ok(())
}

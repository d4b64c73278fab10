//! `trash_panda._core.StagingPool`: one set of staging buffers for the engines of a pipeline's
//! stages, which take it in turn (see the core's `stream::StagingPool`).

use std::sync::Arc;

use pyo3::prelude::*;

use trash_panda::stream::StagingPool;

use crate::errors::ToPyErr;
use crate::gil::without_gil;

/// `count` page-aligned staging buffers of `size` bytes (rounded up to whole pages), allocated
/// and written once; engines made with it (`Engine(..., pool=)`) stage into them in turn.
#[pyclass(name = "StagingPool", module = "trash_panda._core", frozen, weakref)]
#[derive(Debug)]
pub(crate) struct PyStagingPool {
    pub(crate) inner: Arc<StagingPool>,
}

#[pymethods]
impl PyStagingPool {
    #[new]
    fn new(py: Python<'_>, size: usize, count: usize) -> PyResult<Self> {
        // Writing every page of a large pool once takes a while: without the GIL.
        let pool = without_gil(py, || StagingPool::new(size, count)).map_err(ToPyErr::to_py)?;
        Ok(PyStagingPool {
            inner: Arc::new(pool),
        })
    }

    /// (address, length) of every buffer, for registering them as pinned memory once: they
    /// never move while the pool lives.
    fn buffers(&self) -> Vec<(usize, usize)> {
        self.inner.buffers().to_vec()
    }

    /// Bytes of each buffer.
    #[getter]
    fn buffer_bytes(&self) -> usize {
        self.inner.buffer_len()
    }

    /// Number of buffers.
    #[getter]
    fn count(&self) -> usize {
        self.inner.count()
    }

    /// Bytes of every buffer together.
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.bytes()
    }

    /// The name of the engine that has the buffers now (None when no engine streams).
    #[getter]
    fn holder(&self) -> Option<String> {
        self.inner.holder()
    }

    /// Engines (and their leases) that still hold a reference to the pool's memory.
    #[getter]
    fn users(&self) -> usize {
        Arc::strong_count(&self.inner) - 1
    }

    fn __repr__(&self) -> String {
        format!(
            "StagingPool(count={}, buffer_bytes={}, holder={:?})",
            self.inner.count(),
            self.inner.buffer_len(),
            self.inner.holder()
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStagingPool>()?;
    Ok(())
}

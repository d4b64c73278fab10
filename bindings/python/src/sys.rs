//! The core's `sys` module for the Python layer: the machine's and the process's memory figures
//! (available RAM, resident and private memory, a sampler of them) and giving the heap back.

use pyo3::prelude::*;

use trash_panda::sys::{self, RssMeasure};

use crate::errors::{raise, Kind, ToPyErr};
use crate::gil::without_gil;

/// Gives memory the C allocator holds free back to the system (after a release).
#[pyfunction]
fn trim_heap(py: Python<'_>) -> bool {
    without_gil(py, sys::trim_heap)
}

/// The RAM the machine has available (MemAvailable), in bytes.
#[pyfunction]
fn available_ram() -> PyResult<u64> {
    Ok(sys::MemoryFigures::probe()
        .map_err(ToPyErr::to_py)?
        .available_ram)
}

/// The process's resident memory in bytes.
#[pyfunction]
fn current_rss() -> PyResult<u64> {
    sys::current_rss().map_err(ToPyErr::to_py)
}

/// The process's private resident memory in bytes (Linux: RssAnon; Windows: private bytes).
#[pyfunction]
fn private_memory() -> PyResult<u64> {
    sys::private_memory().map_err(ToPyErr::to_py)
}

/// Samples the process's resident memory on a thread until `stop()`.
#[pyclass(name = "RssSampler", module = "trash_panda._core")]
#[derive(Debug)]
struct PyRssSampler {
    inner: Option<sys::RssSampler>,
}

#[pymethods]
impl PyRssSampler {
    /// `private`: the private resident memory (see `private_memory`) instead of the resident
    /// set, so pages of a mapped file touched meanwhile do not count.
    #[new]
    #[pyo3(signature = (interval_ms=1, private=false))]
    fn new(interval_ms: u64, private: bool) -> PyResult<Self> {
        let measure = if private {
            RssMeasure::Private
        } else {
            RssMeasure::Resident
        };
        let interval = std::time::Duration::from_millis(interval_ms.max(1));
        let inner = sys::RssSampler::start_measuring(interval, measure).map_err(ToPyErr::to_py)?;
        Ok(PyRssSampler { inner: Some(inner) })
    }

    /// The peak so far.
    fn peak(&self) -> u64 {
        self.inner.as_ref().map_or(0, |s| s.peak())
    }

    /// Stops sampling: (start, peak, end) in bytes.
    fn stop(&mut self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        let sampler = self
            .inner
            .take()
            .ok_or_else(|| raise(Kind::Argument, "the sampler was already stopped"))?;
        let stats = without_gil(py, || sampler.stop());
        Ok((stats.start, stats.peak, stats.end))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(trim_heap, m)?)?;
    m.add_function(wrap_pyfunction!(current_rss, m)?)?;
    m.add_function(wrap_pyfunction!(private_memory, m)?)?;
    m.add_function(wrap_pyfunction!(available_ram, m)?)?;
    m.add_class::<PyRssSampler>()?;
    Ok(())
}

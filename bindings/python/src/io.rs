//! `trash_panda._core` page-cache helpers, used by tests and benchmarks to make cold reads.

use std::path::PathBuf;

use pyo3::prelude::*;

use trash_panda::io::{read_ranges_with, FileReader, ReadMode, ReadOptions, ReadRequest};

use crate::dlpack::{disjoint, Borrowed};
use crate::errors::ToPyErr;
use crate::gil::without_gil;

/// Reads byte ranges of a file straight into CPU tensors: `requests` is a list of
/// (file offset, destination); each destination is filled completely. Returns (bytes, seconds).
#[pyfunction]
#[pyo3(signature = (path, requests, threads=2, direct=false))]
fn read_tensors(
    py: Python<'_>,
    path: PathBuf,
    requests: Vec<(u64, Bound<'_, PyAny>)>,
    threads: usize,
    direct: bool,
) -> PyResult<(u64, f64)> {
    let borrowed = requests
        .iter()
        .map(|(offset, dst)| Ok((*offset, Borrowed::new(dst, "dst")?)))
        .collect::<PyResult<Vec<_>>>()?;
    for (i, (_, a)) in borrowed.iter().enumerate() {
        for (_, b) in &borrowed[i + 1..] {
            disjoint(a, b, "read_tensors")?;
        }
    }
    let mut reqs: Vec<ReadRequest<'_>> = borrowed
        .iter()
        // SAFETY: every pair of destinations was checked disjoint above, and nothing else of
        // their memory is borrowed.
        .map(|(offset, dst)| ReadRequest::new(*offset, unsafe { dst.bytes_mut() }))
        .collect();
    let mode = if direct {
        ReadMode::Direct
    } else {
        ReadMode::Buffered
    };
    let options = ReadOptions {
        threads: threads.max(1),
        ..ReadOptions::default()
    };
    let stats = without_gil(py, || {
        let reader = FileReader::open(&path, mode)?;
        read_ranges_with(&reader, &mut reqs, &options)
    })
    .map_err(ToPyErr::to_py)?;
    Ok((stats.bytes, stats.seconds))
}

/// The drive's read rate, measured with unbuffered reads (see `measure_drive`).
#[pyclass(name = "DriveRate", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PyDriveRate {
    pub(crate) inner: trash_panda::io::DriveRate,
}

#[pymethods]
impl PyDriveRate {
    /// Bytes read.
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.bytes
    }

    /// Wall-clock seconds the reads took.
    #[getter]
    fn seconds(&self) -> f64 {
        self.inner.seconds
    }

    /// Requests kept in flight.
    #[getter]
    fn in_flight(&self) -> usize {
        self.inner.in_flight
    }

    /// GB/s (10^9 bytes).
    #[getter]
    fn gb_per_s(&self) -> f64 {
        self.inner.gb_per_s()
    }

    fn __repr__(&self) -> String {
        format!(
            "DriveRate({:.2} GB/s: {} bytes in {:.3} s, {} in flight)",
            self.inner.gb_per_s(),
            self.inner.bytes,
            self.inner.seconds,
            self.inner.in_flight
        )
    }
}

/// Reads up to `max_bytes` from the start of `paths` with unbuffered reads, several in flight,
/// and returns the rate; `None` where the file system refuses unbuffered reads.
#[pyfunction]
#[pyo3(signature = (paths, max_bytes=536_870_912))]
fn measure_drive(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    max_bytes: u64,
) -> PyResult<Option<PyDriveRate>> {
    let rate = without_gil(py, || trash_panda::io::measure_drive(&paths, max_bytes))
        .map_err(ToPyErr::to_py)?;
    Ok(rate.map(|inner| PyDriveRate { inner }))
}

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

/// Gives memory the C allocator holds free back to the system (after a release).
#[pyfunction]
fn trim_heap(py: Python<'_>) -> bool {
    without_gil(py, trash_panda::sys::trim_heap)
}

/// The RAM the machine has available (MemAvailable), in bytes.
#[pyfunction]
fn available_ram() -> PyResult<u64> {
    Ok(trash_panda::sys::MemoryFigures::probe()
        .map_err(ToPyErr::to_py)?
        .available_ram)
}

/// The process's resident memory in bytes.
#[pyfunction]
fn current_rss() -> PyResult<u64> {
    trash_panda::sys::current_rss().map_err(ToPyErr::to_py)
}

/// The process's private resident memory in bytes (Linux: RssAnon; Windows: private bytes).
#[pyfunction]
fn private_memory() -> PyResult<u64> {
    trash_panda::sys::private_memory().map_err(ToPyErr::to_py)
}

/// Samples the process's resident memory on a thread until `stop()`.
#[pyclass(name = "RssSampler", module = "trash_panda._core")]
#[derive(Debug)]
struct PyRssSampler {
    inner: Option<trash_panda::sys::RssSampler>,
}

#[pymethods]
impl PyRssSampler {
    /// `private`: the private resident memory (see `private_memory`) instead of the resident
    /// set, so pages of a mapped file touched meanwhile do not count.
    #[new]
    #[pyo3(signature = (interval_ms=1, private=false))]
    fn new(interval_ms: u64, private: bool) -> PyResult<Self> {
        use trash_panda::sys::RssMeasure;
        let measure = if private {
            RssMeasure::Private
        } else {
            RssMeasure::Resident
        };
        let interval = std::time::Duration::from_millis(interval_ms.max(1));
        let inner = trash_panda::sys::RssSampler::start_measuring(interval, measure)
            .map_err(ToPyErr::to_py)?;
        Ok(PyRssSampler { inner: Some(inner) })
    }

    /// The peak so far.
    fn peak(&self) -> u64 {
        self.inner.as_ref().map_or(0, |s| s.peak())
    }

    /// Stops sampling: (start, peak, end) in bytes.
    fn stop(&mut self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        let sampler = self.inner.take().ok_or_else(|| {
            crate::errors::raise(
                crate::errors::Kind::Argument,
                "the sampler was already stopped",
            )
        })?;
        let stats = without_gil(py, || sampler.stop());
        Ok((stats.start, stats.peak, stats.end))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(trim_heap, m)?)?;
    m.add_function(wrap_pyfunction!(current_rss, m)?)?;
    m.add_function(wrap_pyfunction!(private_memory, m)?)?;
    m.add_function(wrap_pyfunction!(available_ram, m)?)?;
    m.add_class::<PyRssSampler>()?;
    m.add_function(wrap_pyfunction!(drop_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cached_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(measure_drive, m)?)?;
    m.add_class::<PyDriveRate>()?;
    Ok(())
}

//! `trash_panda._core` reads into tensors (one file, or a whole block through the read queue),
//! the read queue, and page-cache helpers used by tests and benchmarks to make cold reads.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pyo3::prelude::*;

use trash_panda::io::{
    read_ranges_queued, read_ranges_with, FileReader, Need, ReadMode, ReadOptions, ReadQueue,
    ReadRequest, ReadStats, DRIVE_IN_FLIGHT,
};

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

/// The read queue a model's reads share (see the core's `io::ReadQueue`): `depth` reads at the
/// drive at once, the one needed soonest next; positions count in a run order of `blocks`.
#[pyclass(name = "ReadQueue", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyReadQueue {
    pub(crate) inner: Arc<ReadQueue>,
}

#[pymethods]
impl PyReadQueue {
    #[new]
    #[pyo3(signature = (blocks, depth=None))]
    fn new(blocks: usize, depth: Option<usize>) -> Self {
        PyReadQueue {
            inner: Arc::new(ReadQueue::new(depth.unwrap_or(DRIVE_IN_FLIGHT), blocks)),
        }
    }

    /// Reads at the drive at once.
    #[getter]
    fn depth(&self) -> usize {
        self.inner.depth()
    }

    /// The position of the block being run.
    #[getter]
    fn current(&self) -> usize {
        self.inner.current()
    }

    /// The block at `position` of the run order runs now: waiting reads rank from it.
    fn advance(&self, position: usize) {
        self.inner.advance(position);
    }

    /// (grants, grants that waited, seconds waited in all).
    fn stats(&self) -> (u64, u64, f64) {
        let s = self.inner.stats();
        (s.grants, s.waits, s.wait_seconds)
    }

    fn __repr__(&self) -> String {
        format!(
            "ReadQueue(depth={}, blocks={}, current={})",
            self.inner.depth(),
            self.inner.blocks(),
            self.inner.current()
        )
    }
}

/// Reads byte ranges of several files into CPU tensors in one call without the GIL: `requests`
/// is a list of (path, file offset, destination). Each file's ranges are read in file order by
/// `threads` readers; with a `queue`, every read waits there for a place at the drive as the
/// block at `position` of its run order (`None`: needed now). Returns (bytes, seconds).
#[pyfunction]
#[pyo3(signature = (requests, threads=2, queue=None, position=None))]
fn read_block(
    py: Python<'_>,
    requests: Vec<(PathBuf, u64, Bound<'_, PyAny>)>,
    threads: usize,
    queue: Option<&PyReadQueue>,
    position: Option<usize>,
) -> PyResult<(u64, f64)> {
    let borrowed = requests
        .iter()
        .map(|(path, offset, dst)| Ok((path, *offset, Borrowed::new(dst, "dst")?)))
        .collect::<PyResult<Vec<_>>>()?;
    for (i, (_, _, a)) in borrowed.iter().enumerate() {
        for (_, _, b) in &borrowed[i + 1..] {
            disjoint(a, b, "read_block")?;
        }
    }
    // Grouped by file in the order files first appear, each group in file order.
    let mut files: Vec<(&PathBuf, Vec<ReadRequest<'_>>)> = Vec::new();
    for (path, offset, dst) in &borrowed {
        // SAFETY: every pair of destinations was checked disjoint above, and nothing else of
        // their memory is borrowed.
        let req = ReadRequest::new(*offset, unsafe { dst.bytes_mut() });
        match files.iter_mut().find(|(p, _)| p == path) {
            Some((_, reqs)) => reqs.push(req),
            None => files.push((path, vec![req])),
        }
    }
    for (_, reqs) in &mut files {
        reqs.sort_by_key(|r| r.offset);
    }
    let options = ReadOptions {
        threads: threads.max(1),
        ..ReadOptions::default()
    };
    let queue = queue.map(|q| q.inner.clone());
    let need = position.map_or(Need::Now, Need::Block);
    let stats = without_gil(py, || {
        let never = AtomicBool::new(false);
        let mut total = ReadStats::new(0, 0.0, ReadMode::Buffered);
        for (path, reqs) in &mut files {
            let reader = FileReader::open(path, ReadMode::Buffered)?;
            let gate = queue.as_deref().map(|q| (q, need));
            let read = read_ranges_queued(&reader, reqs, &options, &never, gate)?;
            total += read.expect("never stopped");
        }
        Ok::<_, trash_panda::io::IoError>(total)
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
    m.add_function(wrap_pyfunction!(read_block, m)?)?;
    m.add_class::<PyReadQueue>()?;
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

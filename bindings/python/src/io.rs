//! `trash_panda._core` reads into tensors (one file, or a whole block through a read lane), a
//! model's lane of its drive's read queue, and page-cache helpers used by tests and benchmarks
//! to make cold reads.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pyo3::prelude::*;

use trash_panda::io::{
    drive_queue, read_ranges_queued, read_ranges_with, FileReader, Lane, Need, PagePool,
    PooledPages, Priority, QueueStats, ReadMode, ReadOptions, ReadRequest, ReadStats, WritableSpan,
    DIRECT_ALIGN,
};

use crate::checkpoint::PyTensorBytes;
use crate::dlpack::{disjoint, Borrowed, ByteOwner, Memory};
use crate::errors::ToPyErr;
use crate::gil::without_gil;
use crate::mirror::mirror_enum;

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
        // Python's destinations are tensors made for the read: fresh pages.
        populate: true,
        ..ReadOptions::default()
    };
    let stats = without_gil(py, || {
        let reader = FileReader::open(&path, mode)?;
        read_ranges_with(&reader, &mut reqs, &options)
    })
    .map_err(ToPyErr::to_py)?;
    Ok((stats.bytes, stats.seconds))
}

/// One model's lane of the read queue of the drive its checkpoint lies on (see the core's
/// `io::Lane` and `io::drive_queue`): the queue has `DRIVE_IN_FLIGHT` places for every model of
/// the process reading that drive; the lane ranks this model's reads by its run order of
/// `blocks` blocks and by its `Priority` (`RUN` before `AHEAD`). With `direct`, `read_block`'s
/// reads through the lane go past the page cache. `pages`: the pool the model's tensors are
/// read into (a pipeline's), or None for new memory of their own.
#[pyclass(name = "ReadLane", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyReadLane {
    pub(crate) inner: Lane,
    direct: bool,
    pages: Option<Py<PyPagePool>>,
}

/// How a lane's reads rank against other lanes': the core's `io::Priority` as a Python enum
/// class. `RUN` reads go before any `AHEAD` read.
#[pyclass(
    name = "Priority",
    module = "trash_panda._core",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub(crate) enum PyPriority {
    /// A model that runs now or is about to: its reads go before any `AHEAD` read.
    RUN,
    /// A model that runs later, read ahead of time behind the running one.
    AHEAD,
}

mirror_enum!(PyPriority <=> Priority {
    RUN = Run,
    AHEAD = Ahead,
});

#[pymethods]
impl PyPriority {
    /// The priority named `name` ("run" or "ahead"); an ArgumentError listing them otherwise.
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        Priority::parse(name).map(Self::from).ok_or_else(|| {
            crate::errors::raise(
                crate::errors::Kind::Argument,
                format!(
                    "unknown read priority {name:?}: expected one of {}",
                    Priority::NAMES.join(", ")
                ),
            )
        })
    }

    /// The priority's name, lower-case ("run" or "ahead").
    #[getter]
    fn value(&self) -> &'static str {
        Priority::from(*self).name()
    }

    fn __str__(&self) -> &'static str {
        Priority::from(*self).name()
    }
}

fn stats_tuple(s: QueueStats) -> (u64, u64, f64) {
    (s.grants, s.waits, s.wait_seconds)
}

#[pymethods]
impl PyReadLane {
    /// A new lane on the queue of the drive holding `files[0]` (a checkpoint's files lie on one
    /// drive as a rule; its other files are not looked at).
    #[new]
    #[pyo3(signature = (files, blocks, priority=PyPriority::RUN, direct=false, pages=None))]
    fn new(
        py: Python<'_>,
        files: Vec<PathBuf>,
        blocks: usize,
        priority: PyPriority,
        direct: bool,
        pages: Option<Py<PyPagePool>>,
    ) -> PyResult<Self> {
        let first = files.first().ok_or_else(|| {
            crate::errors::raise(
                crate::errors::Kind::Argument,
                "a read lane needs a checkpoint file to find its drive; none was given",
            )
        })?;
        let queue = without_gil(py, || drive_queue(first)).map_err(ToPyErr::to_py)?;
        Ok(PyReadLane {
            inner: queue.lane(blocks, priority.into()),
            direct,
            pages,
        })
    }

    /// The pool the model's tensors are read into, or None.
    #[getter]
    fn pages(&self, py: Python<'_>) -> Option<Py<PyPagePool>> {
        self.pages.as_ref().map(|p| p.clone_ref(py))
    }

    /// Whether `read_block` reads through this lane past the page cache.
    #[getter]
    fn direct(&self) -> bool {
        self.direct
    }

    /// Reads at the drive at once (the queue's, shared with every lane).
    #[getter]
    fn depth(&self) -> usize {
        self.inner.queue().depth()
    }

    /// Blocks in the lane's run order.
    #[getter]
    fn blocks(&self) -> usize {
        self.inner.blocks()
    }

    #[setter]
    fn set_blocks(&self, blocks: usize) {
        self.inner.set_blocks(blocks);
    }

    /// The position of the block being run.
    #[getter]
    fn current(&self) -> usize {
        self.inner.current()
    }

    /// How the lane's reads rank against other lanes' (`Priority.RUN` before `Priority.AHEAD`).
    #[getter]
    fn priority(&self) -> PyPriority {
        self.inner.priority().into()
    }

    #[setter]
    fn set_priority(&self, priority: PyPriority) {
        self.inner.set_priority(priority.into());
    }

    /// An identity of the drive's queue: equal for two lanes on the same queue.
    #[getter]
    fn queue_id(&self) -> usize {
        Arc::as_ptr(self.inner.queue()) as usize
    }

    /// The lane's id in its queue (a dropped lane's id is reused).
    #[getter]
    fn lane_id(&self) -> usize {
        self.inner.id()
    }

    /// The block at `position` of the run order runs now: waiting reads rank from it.
    fn advance(&self, position: usize) {
        self.inner.advance(position);
    }

    /// The place of each position of its order in the run order it shares with other lanes
    /// (see `join_lanes`); None when it shares none.
    #[getter]
    fn joint_places(&self) -> Option<Vec<usize>> {
        self.inner.joint_places()
    }

    /// Leaves the run order it shared: its reads rank in its own order again.
    fn leave_joint(&self) {
        self.inner.leave_joint();
    }

    /// This lane's (grants, grants that waited, seconds waited in all).
    fn stats(&self) -> (u64, u64, f64) {
        stats_tuple(self.inner.stats())
    }

    /// The same for the whole queue: every lane of the drive, including lanes since dropped.
    fn queue_stats(&self) -> (u64, u64, f64) {
        stats_tuple(self.inner.queue().stats())
    }

    /// Starts (or stops) recording the order the queue serves reads in (tests).
    fn record(&self, on: bool) {
        self.inner.queue().record(on);
    }

    /// The reads the queue served since `record(True)`, every lane's: (lane id, position or
    /// None for a read needed now).
    fn served(&self) -> Vec<(usize, Option<usize>)> {
        let need = |n: Need| match n {
            Need::Now => None,
            Need::Block(p) => Some(p),
        };
        self.inner
            .queue()
            .served()
            .into_iter()
            .map(|s| (s.lane, need(s.need)))
            .collect()
    }

    /// Reads waiting for a place in the queue now, all lanes together.
    fn waiting(&self) -> usize {
        self.inner.queue().waiting()
    }

    /// Takes a place at the drive as a read needed now and holds it until `release_place`, as a
    /// slow read would (tests observe the order served behind it).
    fn hold_place(&self, py: Python<'_>) -> PyHeldPlace {
        let lane = self.inner.clone();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let place = lane.acquire(Need::Now);
            let _ = held_tx.send(());
            let _ = rx.recv();
            drop(place);
        });
        without_gil(py, move || {
            let _ = held_rx.recv();
        });
        PyHeldPlace {
            release: std::sync::Mutex::new(Some((tx, thread))),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "ReadLane(priority={}, blocks={}, current={}, depth={})",
            self.inner.priority().name(),
            self.inner.blocks(),
            self.inner.current(),
            self.inner.queue().depth()
        )
    }
}

type Release = (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>);

/// A place at the drive held by `ReadLane.hold_place` until `release()`.
#[pyclass(name = "HeldPlace", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyHeldPlace {
    release: std::sync::Mutex<Option<Release>>,
}

#[pymethods]
impl PyHeldPlace {
    /// Frees the place (once; later calls do nothing).
    fn release(&self, py: Python<'_>) {
        let taken = self
            .release
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((tx, thread)) = taken {
            let _ = tx.send(());
            without_gil(py, || {
                let _ = thread.join();
            });
        }
    }
}

/// Reads byte ranges of several files into CPU tensors in one call without the GIL: `requests`
/// is a list of (path, file offset, destination). Each file's ranges are read in file order by
/// `threads` readers; with a `lane`, every read waits in its queue for a place at the drive as
/// the block at `position` of the lane's run order (`None`: needed now), and reads past the page
/// cache when the lane is `direct` (straight into destinations that line up with the file
/// modulo 4096 bytes, through a bounce buffer otherwise). Returns (bytes, seconds).
#[pyfunction]
#[pyo3(signature = (requests, threads=2, lane=None, position=None))]
fn read_block(
    py: Python<'_>,
    requests: Vec<(PathBuf, u64, Bound<'_, PyAny>)>,
    threads: usize,
    lane: Option<&PyReadLane>,
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
    // Python's destinations are tensors made for the read: fresh pages, made present ahead of
    // the readers, except for a model read ahead of its turn: beside another's compute, the
    // thread that does it would only take the same CPU sooner.
    let ahead = lane.is_some_and(|l| l.inner.priority() == Priority::Ahead);
    let options = ReadOptions {
        threads: threads.max(1),
        populate: !ahead,
        ..ReadOptions::default()
    };
    let mode = match lane {
        Some(l) if l.direct => ReadMode::Direct,
        _ => ReadMode::Buffered,
    };
    let lane = lane.map(|l| l.inner.clone());
    let need = position.map_or(Need::Now, Need::Block);
    let stats = without_gil(py, || {
        let never = AtomicBool::new(false);
        let mut total = ReadStats::new(0, 0.0, mode);
        for (path, reqs) in &mut files {
            let reader = FileReader::open(path, mode)?;
            let gate = lane.as_ref().map(|l| (l, need));
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

/// Private memory faulted once and handed on (the core's `io::PagePool`): regions given back
/// (their tensors freed) are kept and handed out again by `take`, whatever their sizes. Kept
/// pages are the process's memory until `trim()` or `close()`.
#[pyclass(name = "PagePool", module = "trash_panda._core", frozen)]
#[derive(Debug, Default)]
pub(crate) struct PyPagePool {
    inner: PagePool,
}

/// Part of a region from a pool, shown to torch: the region's pages go back to the pool with
/// the tensor.
struct PoolRegion {
    _region: PooledPages,
    /// Made by the region itself, which owns its pages alone.
    span: WritableSpan,
}

impl ByteOwner for PoolRegion {
    fn memory(&self) -> Memory {
        Memory::Writable(self.span)
    }
}

#[pymethods]
impl PyPagePool {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Whether pages given back are kept on this platform (not on Windows, where a pool hands
    /// out new memory only).
    #[staticmethod]
    fn keeps_pages() -> bool {
        PagePool::keeps_pages()
    }

    /// `nbytes` bytes starting `shift` bytes into a new region of whole pages (`shift` places
    /// them in their page as a direct read needs), as `TensorBytes` for `torch.from_dlpack`;
    /// kept pages where the pool has them. The bytes are whatever the pages held: for a read
    /// that fills them.
    #[pyo3(signature = (nbytes, shift=0))]
    fn take(&self, py: Python<'_>, nbytes: usize, shift: usize) -> PyResult<PyTensorBytes> {
        let len = nbytes.checked_add(shift).ok_or_else(|| {
            crate::errors::raise(
                crate::errors::Kind::Argument,
                "PagePool.take: nbytes + shift overflows",
            )
        })?;
        let region = without_gil(py, || self.inner.take(len)).map_err(ToPyErr::to_py)?;
        let span = region.writable_part(shift, nbytes).ok_or_else(|| {
            crate::errors::raise(
                crate::errors::Kind::Argument,
                "PagePool.take: the part lies past the region",
            )
        })?;
        Ok(PyTensorBytes::from_owner(Arc::new(PoolRegion {
            _region: region,
            span,
        })))
    }

    /// Keeps at most `nbytes` of pages from now on (what the reads still to come will take;
    /// each region handed out counts against it), giving back at once what is kept beyond;
    /// returns the bytes given back.
    fn want(&self, py: Python<'_>, nbytes: usize) -> usize {
        without_gil(py, || self.inner.want(nbytes))
    }

    /// Bytes of pages kept, not handed out.
    #[getter]
    fn idle_bytes(&self) -> usize {
        self.inner.idle_bytes()
    }

    /// Bytes handed out in pages that had been given back.
    #[getter]
    fn reused(&self) -> u64 {
        self.inner.stats().reused
    }

    /// Bytes handed out in new pages.
    #[getter]
    fn fresh(&self) -> u64 {
        self.inner.stats().fresh
    }

    /// Gives every kept page back to the system; returns their bytes.
    fn trim(&self, py: Python<'_>) -> usize {
        without_gil(py, || self.inner.trim())
    }

    /// Trims, and keeps nothing from now on; returns the bytes given back.
    fn close(&self, py: Python<'_>) -> usize {
        without_gil(py, || self.inner.close())
    }

    fn __repr__(&self) -> String {
        let stats = self.inner.stats();
        format!(
            "PagePool(idle_bytes={}, reused={}, fresh={})",
            self.inner.idle_bytes(),
            stats.reused,
            stats.fresh
        )
    }
}

/// Makes `lanes` of one drive's queue, each with the place of each position of its run order in
/// one shared order of `length` blocks, rank their reads in that order (models that run
/// together, their blocks alternating). False, changing nothing, when the lanes are not all of
/// one queue or a place is past `length`.
#[pyfunction]
fn join_lanes(lanes: Vec<(PyRef<'_, PyReadLane>, Vec<usize>)>, length: usize) -> bool {
    let Some((first, _)) = lanes.first() else {
        return true;
    };
    let queue = first.inner.queue().clone();
    let pairs: Vec<(&Lane, Vec<usize>)> =
        lanes.iter().map(|(l, p)| (&l.inner, p.clone())).collect();
    queue.join(&pairs, length)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPagePool>()?;
    m.add("DIRECT_ALIGN", DIRECT_ALIGN)?;
    m.add_function(wrap_pyfunction!(read_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(read_block, m)?)?;
    m.add_class::<PyReadLane>()?;
    m.add_function(wrap_pyfunction!(join_lanes, m)?)?;
    m.add_class::<PyPriority>()?;
    m.add_class::<PyHeldPlace>()?;
    m.add_function(wrap_pyfunction!(drop_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cached_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(measure_drive, m)?)?;
    m.add_class::<PyDriveRate>()?;
    Ok(())
}

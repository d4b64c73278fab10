//! `trash_panda._core.Engine` and `Lease`: the prefetch engine for the Python hooks.
//!
//! A lease's staged bytes reach torch as zero-copy views; each view keeps the lease alive, so the
//! buffer goes back to the engine only when the hook and every view of it are done.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;

use trash_panda::dtype::{self, DType};
use trash_panda::io::ReadMode;
use trash_panda::stream::{
    Engine, EngineOptions, Lease, RamSource, SourceTier, StreamBlock, StreamError, StreamTensor,
};

use crate::checkpoint::PyTensorBytes;
use crate::dlpack::{Borrowed, ByteOwner};
use crate::dtype::{f32_values, parse_dtype, scale_of};
use crate::errors::{raise, Kind, ToPyErr};
use crate::gil::{threads as worker_threads, without_gil};

impl ToPyErr for StreamError {
    fn to_py(self) -> PyErr {
        match self {
            StreamError::Read { .. } | StreamError::Open { .. } => {
                raise(Kind::Read, self.to_string())
            }
            other => raise(Kind::Stream, other.to_string()),
        }
    }
}

/// A tensor as Python describes it: name, file index, start, end, dtype (header name), shape.
type TensorArg = (String, usize, u64, u64, String, Vec<usize>);
/// A block: name, tier ("ram" or "disk"), tensors.
type BlockArg = (String, String, Vec<TensorArg>);

fn block_from(arg: BlockArg) -> PyResult<StreamBlock> {
    let (name, tier, tensors) = arg;
    let tier = match tier.as_str() {
        "ram" => SourceTier::Ram,
        "disk" => SourceTier::Disk,
        other => {
            return Err(raise(
                Kind::Argument,
                format!("block {name:?}: tier {other:?} is not ram or disk"),
            ))
        }
    };
    let tensors = tensors
        .into_iter()
        .map(|(name, file, start, end, dtype, shape)| {
            let dtype = DType::from_safetensors_name(&dtype).ok_or_else(|| {
                raise(
                    Kind::Dtype,
                    format!("tensor {name:?}: unknown dtype {dtype:?}"),
                )
            })?;
            Ok(StreamTensor {
                name,
                file,
                start,
                end,
                dtype,
                shape,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(StreamBlock {
        name,
        tier,
        tensors,
    })
}

fn read_mode(name: &str) -> PyResult<ReadMode> {
    match name {
        "direct" => Ok(ReadMode::Direct),
        "buffered" => Ok(ReadMode::Buffered),
        other => Err(raise(
            Kind::Argument,
            format!("disk_mode {other:?}: expected direct or buffered"),
        )),
    }
}

/// The prefetch engine of one model.
#[pyclass(name = "Engine", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyEngine {
    /// `None` once closed: the workers are joined and the staging pool freed with the last lease.
    inner: Mutex<Option<Arc<Engine>>>,
}

impl PyEngine {
    fn engine(&self) -> PyResult<Arc<Engine>> {
        self.inner
            .lock()
            .map_err(|_| raise(Kind::Stream, "engine lock poisoned"))?
            .clone()
            .ok_or_else(|| {
                raise(
                    Kind::Stream,
                    "the engine was closed (the model was released)",
                )
            })
    }
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (blocks, files, *, lookahead, workers, disk_mode, ram_in_memory, ram_threads, storage=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        blocks: Vec<BlockArg>,
        files: Vec<PathBuf>,
        lookahead: usize,
        workers: usize,
        disk_mode: &str,
        ram_in_memory: bool,
        ram_threads: usize,
        storage: Option<&str>,
    ) -> PyResult<Self> {
        let blocks = blocks
            .into_iter()
            .map(block_from)
            .collect::<PyResult<Vec<_>>>()?;
        let options = EngineOptions {
            lookahead,
            workers: workers.max(1),
            disk_mode: read_mode(disk_mode)?,
            ram_source: if ram_in_memory {
                RamSource::InMemory {
                    threads: ram_threads.max(1),
                }
            } else {
                RamSource::Mapped
            },
            storage: match storage {
                Some(name) => Some(parse_dtype(name)?),
                None => None,
            },
            ..EngineOptions::default()
        };
        let engine =
            without_gil(py, || Engine::new(blocks, files, options)).map_err(ToPyErr::to_py)?;
        Ok(PyEngine {
            inner: Mutex::new(Some(Arc::new(engine))),
        })
    }

    /// Sets the run order (engine block indices); blocks left out follow in definition order.
    fn set_order(&self, order: Vec<usize>) -> PyResult<()> {
        self.engine()?.set_order(order).map_err(ToPyErr::to_py)
    }

    /// The order blocks were first acquired in.
    fn recorded_order(&self) -> PyResult<Vec<usize>> {
        Ok(self.engine()?.recorded_order())
    }

    /// Waits (without the GIL) until `block` is staged, and leases its buffer.
    fn acquire(&self, py: Python<'_>, block: usize) -> PyResult<PyLease> {
        let engine = self.engine()?;
        let lease = without_gil(py, || engine.acquire(block)).map_err(ToPyErr::to_py)?;
        Ok(PyLease {
            cell: Mutex::new(Some(Arc::new(LeaseCell(lease)))),
        })
    }

    /// Reads the RAM tier into private memory now (only with ram_in_memory); (bytes, seconds).
    fn load_ram_tier(&self, py: Python<'_>) -> PyResult<(u64, f64)> {
        let engine = self.engine()?;
        let stats = without_gil(py, || engine.load_ram_tier()).map_err(ToPyErr::to_py)?;
        Ok((stats.bytes, stats.seconds))
    }

    /// (address, length) of each staging buffer, for registering them as pinned memory.
    fn staging_buffers(&self) -> PyResult<Vec<(usize, usize)>> {
        Ok(self.engine()?.staging_buffers())
    }

    /// Each tensor of `block` in its staging buffer: (name, offset, length, dtype as staged,
    /// shape, per-row scales the engine made as (offset, length) or None).
    fn layout(&self, block: usize) -> PyResult<Vec<LayoutEntry>> {
        let engine = self.engine()?;
        let layout = engine.layout(block).map_err(ToPyErr::to_py)?;
        Ok(layout
            .iter()
            .map(|t| {
                let scale = t.scale.map(|s| (s.offset, s.len));
                (
                    t.name.clone(),
                    t.offset,
                    t.len,
                    t.dtype.safetensors_name(),
                    t.shape.clone(),
                    scale,
                )
            })
            .collect())
    }

    fn staging_bytes(&self) -> PyResult<usize> {
        Ok(self.engine()?.staging_bytes())
    }

    /// The mode disk reads really use ("direct", or "buffered" after a refused O_DIRECT).
    fn disk_read_mode(&self) -> PyResult<Option<&'static str>> {
        Ok(self.engine()?.disk_read_mode().map(ReadMode::as_str))
    }

    /// The engine's statistics as JSON.
    fn stats_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.engine()?.stats())
            .map_err(|e| raise(Kind::Stream, e.to_string()))
    }

    fn reset_stats(&self) -> PyResult<()> {
        self.engine()?.reset_stats();
        Ok(())
    }

    /// Stops the workers. Buffers still leased are freed when their leases go.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let engine = self
            .inner
            .lock()
            .map_err(|_| raise(Kind::Stream, "engine lock poisoned"))?
            .take();
        // Dropping joins the worker threads, which may be finishing a read.
        without_gil(py, || drop(engine));
        Ok(())
    }

    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self
            .inner
            .lock()
            .map_err(|_| raise(Kind::Stream, "engine lock poisoned"))?
            .is_none())
    }
}

type LayoutEntry = (
    String,
    usize,
    usize,
    &'static str,
    Vec<usize>,
    Option<(usize, usize)>,
);

/// Holds a lease; dropping the last reference gives the buffer back to the engine.
#[derive(Debug)]
struct LeaseCell(Lease);

/// A tensor's bytes inside a leased staging buffer.
struct LeaseSlice {
    cell: Arc<LeaseCell>,
    offset: usize,
    len: usize,
}

impl ByteOwner for LeaseSlice {
    fn raw_parts(&self) -> (*mut u8, usize) {
        // The Python layer only reads these views (they are copy or expansion sources).
        let base = self.cell.0.bytes().as_ptr().cast_mut();
        // SAFETY: `offset + len` lies inside the lease's bytes (checked in `PyLease::view`).
        (unsafe { base.add(self.offset) }, self.len)
    }
}

/// A staged block, leased from the engine.
#[pyclass(name = "Lease", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyLease {
    cell: Mutex<Option<Arc<LeaseCell>>>,
}

impl PyLease {
    fn cell(&self) -> PyResult<Arc<LeaseCell>> {
        self.cell
            .lock()
            .map_err(|_| raise(Kind::Stream, "lease lock poisoned"))?
            .clone()
            .ok_or_else(|| raise(Kind::Stream, "the lease was released"))
    }
}

/// One expansion out of a lease: (tensor, destination, destination dtype, rows, cols, scale
/// tensor, scale kind, block size). Source and scale dtypes come from the staged layout; a tensor
/// the engine quantized on load brings its own per-row scales.
type ExpandItem<'py> = (
    usize,
    Bound<'py, PyAny>,
    String,
    usize,
    usize,
    Option<usize>,
    String,
    usize,
);

fn scale_values(bytes: &[u8], dtype: DType) -> Result<Vec<f32>, dtype::DtypeError> {
    if dtype == DType::F32 {
        return Ok(f32_values(bytes));
    }
    let mut out = vec![0u8; bytes.len() / dtype.size() * 4];
    dtype::cast(bytes, dtype, &mut out, DType::F32, 1)?;
    Ok(f32_values(&out))
}

#[pymethods]
impl PyLease {
    #[getter]
    fn block(&self) -> PyResult<usize> {
        Ok(self.cell()?.0.block())
    }

    /// Seconds `acquire` waited for the block to be staged.
    #[getter]
    fn waited(&self) -> PyResult<f64> {
        Ok(self.cell()?.0.waited().as_secs_f64())
    }

    /// True when the block was already staged at `acquire`.
    #[getter]
    fn hit(&self) -> PyResult<bool> {
        Ok(self.cell()?.0.was_hit())
    }

    /// The whole staged block as bytes (a zero-copy view for torch.from_dlpack).
    fn block_bytes(&self) -> PyResult<PyTensorBytes> {
        let cell = self.cell()?;
        let len = cell.0.bytes().len();
        Ok(PyTensorBytes::from_owner(Arc::new(LeaseSlice {
            cell,
            offset: 0,
            len,
        })))
    }

    /// One tensor's staged bytes, by index in the block's layout.
    fn view(&self, tensor: usize) -> PyResult<PyTensorBytes> {
        let cell = self.cell()?;
        let bytes = cell.0.tensor(tensor).map_err(ToPyErr::to_py)?;
        let offset = bytes.as_ptr() as usize - cell.0.bytes().as_ptr() as usize;
        let len = bytes.len();
        Ok(PyTensorBytes::from_owner(Arc::new(LeaseSlice {
            cell,
            offset,
            len,
        })))
    }

    /// Expands staged tensors into CPU tensors in one call, without the GIL.
    #[pyo3(signature = (items, threads=None))]
    fn expand_into(
        &self,
        py: Python<'_>,
        items: Vec<ExpandItem<'_>>,
        threads: Option<usize>,
    ) -> PyResult<()> {
        let cell = self.cell()?;
        let mut jobs = Vec::with_capacity(items.len());
        for (idx, dst, dd, rows, cols, scale_idx, kind, block) in &items {
            let dst = Borrowed::new(dst, "dst")?;
            jobs.push((
                *idx,
                dst,
                parse_dtype(dd)?,
                *rows,
                *cols,
                *scale_idx,
                kind.as_str(),
                *block,
            ));
        }
        let mut spans: Vec<(usize, usize)> = jobs
            .iter()
            .map(|j| j.1.span())
            .filter(|(a, b)| a < b)
            .collect();
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err(raise(
                Kind::Argument,
                "expand_into: two destinations overlap",
            ));
        }
        let n = worker_threads(threads);
        let work: Vec<_> = jobs
            .iter()
            .map(|(idx, dst, dd, rows, cols, sidx, kind, block)| {
                (
                    *idx,
                    dst.bytes_mut(),
                    *dd,
                    *rows,
                    *cols,
                    *sidx,
                    *kind,
                    *block,
                )
            })
            .collect();
        let lease = &cell.0;
        let layout = lease.layout();
        without_gil(py, || {
            for (idx, dst, dd, rows, cols, sidx, kind, block) in work {
                let fail = |m: String| format!("tensor #{idx}: {m}");
                let staged = layout
                    .get(idx)
                    .ok_or_else(|| fail("not in the block".into()))?;
                let src = lease.tensor(idx).map_err(|e| e.to_string())?;
                let (values, kind) =
                    if let Some(own) = lease.scale(idx).map_err(|e| e.to_string())? {
                        (f32_values(own), "row")
                    } else if let Some(i) = sidx {
                        let st = layout
                            .get(i)
                            .ok_or_else(|| fail("its scale is not in the block".into()))?;
                        let bytes = lease.tensor(i).map_err(|e| e.to_string())?;
                        (
                            scale_values(bytes, st.dtype).map_err(|e| fail(e.to_string()))?,
                            kind,
                        )
                    } else {
                        (Vec::new(), kind)
                    };
                let scale = scale_of(kind, &values, block).map_err(fail)?;
                dtype::expand(src, staged.dtype, dst, dd, (rows, cols), &scale, n)
                    .map_err(|e| fail(e.to_string()))?;
            }
            Ok(())
        })
        .map_err(|msg: String| raise(Kind::Dtype, msg))
    }

    /// Gives the buffer back once every view of it is gone.
    fn release(&self) -> PyResult<()> {
        self.cell
            .lock()
            .map_err(|_| raise(Kind::Stream, "lease lock poisoned"))?
            .take();
        Ok(())
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<PyLease>()?;
    Ok(())
}

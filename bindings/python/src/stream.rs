//! `trash_panda._core.Engine` and `Lease`: the prefetch engine for the Python hooks.
//!
//! A lease's staged bytes reach torch as zero-copy views; each view keeps the lease alive, so the
//! buffer goes back to the engine only when the hook and every view of it are done.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;

use trash_panda::dtype::{DType, ALL_DTYPES, BLOCK_DTYPES};
use trash_panda::engine_config::{staged_work, EngineConfig, ExpandTarget, Expansion, ScaleSource};
use trash_panda::io::{ReadMode, WritableSpan};
use trash_panda::plan::Tier;
use trash_panda::stream::{
    Engine, Lease, OverlayBytes, OverlayStore, Patch, PatchPlace, RamImage, SourceTier,
    StreamBlock, StreamTensor,
};

use crate::checkpoint::PyTensorBytes;
use crate::dlpack::{Borrowed, ByteOwner, Memory};
use crate::engine_config::PyEngineConfig;
use crate::engine_stats::{PyEngineStats, PyStaging};
use crate::errors::{raise, Kind, ToPyErr};
use crate::gil::{threads as worker_threads, without_gil};
use crate::io::PyReadLane;
use crate::plan::{PyTier, TierArg};
use crate::staging_pool::PyStagingPool;

/// One tensor of a streamed block, as the engine reads it: bytes `start..end` of the engine's
/// file `file` (an index into its `files`), holding `shape` elements of `dtype`.
#[pyclass(name = "StreamTensor", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyStreamTensor {
    inner: StreamTensor,
}

#[pymethods]
impl PyStreamTensor {
    /// `dtype` is the safetensors header name ("BF16", "F8_E4M3", ...) or a GGML block type
    /// ("Q4_K"), checked here; `rows`, when given, the order the model takes the rows in (row
    /// `r` of the weight is stored row `rows[r]`), checked when the engine is made.
    #[new]
    #[pyo3(signature = (name, *, file, start, end, dtype, shape, rows=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        file: usize,
        start: u64,
        end: u64,
        dtype: &str,
        shape: Vec<usize>,
        rows: Option<Vec<u32>>,
    ) -> PyResult<Self> {
        let dtype = DType::from_name(dtype).ok_or_else(|| {
            let names: Vec<&str> = ALL_DTYPES
                .iter()
                .chain(&BLOCK_DTYPES)
                .map(|d| d.safetensors_name())
                .collect();
            raise(
                Kind::Dtype,
                format!(
                    "tensor {name:?}: unknown dtype {dtype:?}: expected a safetensors header name or a GGML block type, one of {}",
                    names.join(", ")
                ),
            )
        })?;
        Ok(PyStreamTensor {
            inner: StreamTensor {
                name,
                file,
                start,
                end,
                dtype,
                shape,
                rows,
            },
        })
    }

    /// The tensor's name in the checkpoint.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// Index into the engine's files.
    #[getter]
    fn file(&self) -> usize {
        self.inner.file
    }

    /// Offset of its first byte in the file (header included).
    #[getter]
    fn start(&self) -> u64 {
        self.inner.start
    }

    /// Offset one past its last byte.
    #[getter]
    fn end(&self) -> u64 {
        self.inner.end
    }

    /// The dtype of its bytes in the file (header name).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype.safetensors_name()
    }

    /// Elements along each dimension, outermost first; empty for a scalar.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape.clone()
    }
}

/// A streamed block as the engine stages it: its name, the tier it waits in between runs
/// (`Tier.RAM` or `Tier.DISK`) and its tensors.
#[pyclass(name = "StreamBlock", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyStreamBlock {
    inner: StreamBlock,
}

#[pymethods]
impl PyStreamBlock {
    /// `tier` is a `Tier` (or a tier name, parsed here); a resident tier is refused.
    #[new]
    fn new(name: String, tier: TierArg, tensors: Vec<PyRef<'_, PyStreamTensor>>) -> PyResult<Self> {
        let tier = match tier.0 {
            Tier::Ram => SourceTier::Ram,
            Tier::Disk => SourceTier::Disk,
            Tier::Device => {
                return Err(raise(
                    Kind::Argument,
                    format!(
                        "block {name:?}: tier: expected Tier.RAM or Tier.DISK (a streamed tier), \
                         got Tier.DEVICE"
                    ),
                ))
            }
        };
        let tensors = tensors.iter().map(|t| t.inner.clone()).collect();
        Ok(PyStreamBlock {
            inner: StreamBlock {
                name,
                tier,
                tensors,
            },
        })
    }

    /// The block's name, as the plan and the run order name it.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The tier it waits in between runs: `Tier.RAM` or `Tier.DISK`.
    #[getter]
    fn tier(&self) -> PyTier {
        match self.inner.tier {
            SourceTier::Ram => PyTier::RAM,
            SourceTier::Disk => PyTier::DISK,
        }
    }

    /// Its tensors, in the order the engine stages them.
    #[getter]
    fn tensors(&self) -> Vec<PyStreamTensor> {
        self.inner
            .tensors
            .iter()
            .map(|t| PyStreamTensor { inner: t.clone() })
            .collect()
    }
}

/// The prefetch engine of one model.
#[pyclass(name = "Engine", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyEngine {
    /// `None` once closed: the workers are joined and the staging pool freed with the last lease.
    inner: Mutex<Option<Arc<Engine>>>,
    config: EngineConfig,
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
    /// An engine for `blocks` (`StreamBlock`s) of `files`, with every figure from `config`
    /// (the plan's): its pool is exactly the plan's host staging. With `pool`, it stages into
    /// that shared pool instead, taken when it streams and given back at `park`, under the name
    /// `holder`.
    #[new]
    #[pyo3(signature = (blocks, files, config, *, pool=None, holder=None))]
    fn new(
        py: Python<'_>,
        blocks: Vec<PyRef<'_, PyStreamBlock>>,
        files: Vec<PathBuf>,
        config: PyRef<'_, PyEngineConfig>,
        pool: Option<PyRef<'_, PyStagingPool>>,
        holder: Option<String>,
    ) -> PyResult<Self> {
        let blocks: Vec<StreamBlock> = blocks.iter().map(|b| b.inner.clone()).collect();
        let config = config.inner.clone();
        let options = config.engine_options();
        let pool = pool.map(|p| p.inner.clone());
        let holder = holder.unwrap_or_else(|| "an engine".to_owned());
        let engine = without_gil(py, || match pool {
            Some(pool) => Engine::with_pool(blocks, files, options, pool, holder),
            None => Engine::new(blocks, files, options),
        })
        .map_err(ToPyErr::to_py)?;
        Ok(PyEngine {
            inner: Mutex::new(Some(Arc::new(engine))),
            config,
        })
    }

    /// Sets the run order (engine block indices); blocks left out follow in definition order.
    fn set_order(&self, order: Vec<usize>) -> PyResult<()> {
        self.engine()?.set_order(order).map_err(ToPyErr::to_py)
    }

    /// The run order in use (engine block indices, every block once).
    fn order(&self) -> PyResult<Vec<usize>> {
        Ok(self.engine()?.order())
    }

    /// The order blocks were first acquired in.
    fn recorded_order(&self) -> PyResult<Vec<usize>> {
        Ok(self.engine()?.recorded_order())
    }

    /// Forgets the recorded order (new hooks on the same model record their own).
    fn clear_recorded_order(&self) -> PyResult<()> {
        self.engine()?.clear_recorded_order();
        Ok(())
    }

    /// Waits (without the GIL) until `block` is staged, and leases its buffer.
    fn acquire(&self, py: Python<'_>, block: usize) -> PyResult<PyLease> {
        let engine = self.engine()?;
        let lease = without_gil(py, || engine.acquire(block)).map_err(ToPyErr::to_py)?;
        Ok(PyLease {
            cell: Mutex::new(Some(Arc::new(LeaseCell(lease)))),
        })
    }

    /// Leases `block` if it is staged now (None otherwise), without counting a run: for copying
    /// it to the device ahead of its run. Call `advance(block)` when it runs.
    fn try_lease(&self, block: usize) -> PyResult<Option<PyLease>> {
        let lease = self.engine()?.try_lease(block).map_err(ToPyErr::to_py)?;
        Ok(lease.map(|lease| PyLease {
            cell: Mutex::new(Some(Arc::new(LeaseCell(lease)))),
        }))
    }

    /// Gives back a RAM-tier block's memory (its mapped pages, and their page cache unless
    /// `keep_cache`); the bytes given back.
    #[pyo3(signature = (block, keep_cache=false))]
    fn release_pages(&self, py: Python<'_>, block: usize, keep_cache: bool) -> PyResult<u64> {
        let engine = self.engine()?;
        without_gil(py, || engine.release_pages(block, keep_cache)).map_err(ToPyErr::to_py)
    }

    /// The in-memory RAM tier's bytes of `block`, laid out as staged (a zero-copy view, read-only:
    /// the engine copies from it too), or None when the block is not held in private memory.
    /// Such blocks are not staged ahead when the configuration pins the RAM tier: copy them from
    /// here and count the run with `advance`.
    fn ram_image(&self, block: usize) -> PyResult<Option<PyTensorBytes>> {
        let image = self.engine()?.ram_image(block).map_err(ToPyErr::to_py)?;
        Ok(image.map(|image| PyTensorBytes::from_owner(Arc::new(ImageBytes(image)))))
    }

    /// (address, length) of every in-memory RAM-tier block, for registering them as pinned.
    fn ram_image_buffers(&self) -> PyResult<Vec<(usize, usize)>> {
        let engine = self.engine()?;
        let mut out = Vec::new();
        for b in 0..engine.block_count() {
            if let Some(image) = engine.ram_image(b).map_err(ToPyErr::to_py)? {
                let bytes = image.bytes();
                if !bytes.is_empty() {
                    out.push((bytes.as_ptr() as usize, bytes.len()));
                }
            }
        }
        Ok(out)
    }

    /// Keeps disk-tier blocks' patched images as overlay files in `dir` (made if missing), at
    /// most `limit` bytes of them in the folder.
    fn keep_overlays_in(&self, dir: PathBuf, limit: u64) -> PyResult<()> {
        let store = OverlayStore::open(dir, limit).map_err(ToPyErr::to_py)?;
        self.engine()?.keep_overlays_in(store);
        Ok(())
    }

    /// Writes `data` (a CPU tensor: the new bytes of staged tensor `tensor` of `block`, in its
    /// staged form; `scale`, its staged scales where it has them) into the block's patched
    /// image, made in `place` ("memory" or "file") where it has none, and staged from then on;
    /// `key` names what the bytes depend on. Returns where the image is kept.
    #[pyo3(signature = (block, tensor, data, key, place, scale=None))]
    #[allow(clippy::too_many_arguments)]
    fn patch(
        &self,
        py: Python<'_>,
        block: usize,
        tensor: usize,
        data: &Bound<'_, PyAny>,
        key: &str,
        place: &str,
        scale: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<&'static str> {
        let place = match place {
            "memory" => PatchPlace::Memory,
            "file" => PatchPlace::File,
            other => {
                return Err(raise(
                    Kind::Argument,
                    format!("patch: place {other:?} is not one of memory, file"),
                ))
            }
        };
        let engine = self.engine()?;
        let data = Borrowed::new(data, "data")?;
        let scale = scale.map(|s| Borrowed::new(s, "scale")).transpose()?;
        let patch = [Patch {
            tensor,
            data: data.bytes(),
            scale: scale.as_ref().map(Borrowed::bytes),
        }];
        let kept =
            without_gil(py, || engine.patch(block, &patch, key, place)).map_err(ToPyErr::to_py)?;
        Ok(kept.as_str())
    }

    /// Takes back the patches of `tensors` (staged indices) of `block`: the checkpoint's bytes
    /// are staged again.
    fn unpatch(&self, py: Python<'_>, block: usize, tensors: Vec<usize>) -> PyResult<()> {
        let engine = self.engine()?;
        without_gil(py, || engine.unpatch(block, &tensors)).map_err(ToPyErr::to_py)
    }

    /// Takes the overlay file of the merges `keys` (staged index to key, as `patch` named them)
    /// for `block`'s image, where the overlay folder has one: staged from it from now on, merged.
    /// False where there is none.
    fn adopt(
        &self,
        py: Python<'_>,
        block: usize,
        keys: std::collections::BTreeMap<usize, String>,
    ) -> PyResult<bool> {
        let engine = self.engine()?;
        without_gil(py, || engine.adopt(block, &keys)).map_err(ToPyErr::to_py)
    }

    /// The key of each patched tensor of `block`, by staged index.
    fn patches(&self, block: usize) -> PyResult<std::collections::BTreeMap<usize, String>> {
        let found = self.engine()?.patches(block).map_err(ToPyErr::to_py)?;
        Ok(found.into_iter().collect())
    }

    /// Bytes of `block`'s patched image, made or not (its staged length; for a block used in
    /// place, its tensors packed at the CPU's alignment).
    fn patched_image_len(&self, block: usize) -> PyResult<usize> {
        self.engine()?
            .patched_image_len(block)
            .map_err(ToPyErr::to_py)
    }

    /// What the patched images of every block take.
    fn overlay_bytes(&self) -> PyResult<PyOverlayBytes> {
        Ok(PyOverlayBytes {
            inner: self.engine()?.overlay_bytes(),
        })
    }

    /// Makes the engine's drive reads wait in `lane` (the model's), shared with the model's
    /// other readers; `positions[b]` is engine block `b`'s position in the lane's run order.
    /// Called again, it replaces the positions.
    fn share_reads(&self, lane: &PyReadLane, positions: Vec<usize>) -> PyResult<()> {
        self.engine()?
            .share_reads(lane.inner.clone(), positions)
            .map_err(ToPyErr::to_py)
    }

    /// Counts a run of `block` leased with `try_lease`, and stages the blocks after it.
    fn advance(&self, block: usize) -> PyResult<()> {
        self.engine()?.advance(block).map_err(ToPyErr::to_py)
    }

    /// Marks the pass under way as the last (True): nothing past the end of the order is staged,
    /// and queued blocks past it are dropped. False wraps into the next pass again.
    fn set_last_pass(&self, py: Python<'_>, last: bool) -> PyResult<()> {
        let engine = self.engine()?;
        without_gil(py, || engine.set_last_pass(last));
        Ok(())
    }

    /// Stages the RAM tier ahead like the other tiers from now on (it was held back to be copied
    /// straight from memory, which its failed pinning rules out); whether anything changed.
    fn stage_ram_tier_ahead(&self) -> PyResult<bool> {
        Ok(self.engine()?.stage_ram_tier_ahead())
    }

    /// Holds the RAM tier back for the caller to copy straight from memory again, after
    /// `stage_ram_tier_ahead` (the tier arrived later and was pinned then); whether anything
    /// changed.
    fn copy_ram_tier_directly(&self) -> PyResult<bool> {
        Ok(self.engine()?.copy_ram_tier_directly())
    }

    /// The blocks staged ahead once `block` runs, nearest first (none past the end of the order
    /// in a last pass): what a device copying ahead copies.
    fn next_blocks(&self, block: usize) -> PyResult<Vec<usize>> {
        self.engine()?.next_blocks(block).map_err(ToPyErr::to_py)
    }

    /// Waits (without the GIL) until the workers have nothing queued or in hand, or `timeout`
    /// seconds pass; whether they are idle.
    fn wait_idle(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let engine = self.engine()?;
        let timeout = Duration::try_from_secs_f64(timeout).map_err(|e| {
            raise(
                Kind::Argument,
                format!("timeout: expected seconds >= 0, got {timeout} ({e})"),
            )
        })?;
        Ok(without_gil(py, || engine.wait_idle(timeout)))
    }

    /// Reads the RAM tier into private memory now (only with ram_in_memory); (bytes, seconds).
    fn load_ram_tier(&self, py: Python<'_>) -> PyResult<(u64, f64)> {
        let engine = self.engine()?;
        let stats = without_gil(py, || engine.load_ram_tier()).map_err(ToPyErr::to_py)?;
        Ok((stats.bytes, stats.seconds))
    }

    /// Gives the shared pool's buffers back (waiting, without the GIL, for blocks being staged
    /// into them); whether it had them. False for an engine with buffers of its own.
    fn park(&self, py: Python<'_>) -> PyResult<bool> {
        let engine = self.engine()?;
        without_gil(py, || engine.park()).map_err(ToPyErr::to_py)
    }

    /// (address, length) of each staging buffer, for registering them as pinned memory.
    fn staging_buffers(&self) -> PyResult<Vec<(usize, usize)>> {
        Ok(self.engine()?.staging_buffers())
    }

    /// Each tensor of `block` as staged, with what the backends do with it.
    fn layout(&self, block: usize) -> PyResult<Vec<PyStagedTensor>> {
        let engine = self.engine()?;
        let layout = engine.layout(block).map_err(ToPyErr::to_py)?;
        let work = staged_work(layout, self.config.compute_dtype, self.config.align)
            .map_err(ToPyErr::to_py)?;
        Ok(layout
            .iter()
            .zip(work)
            .map(|(t, w)| PyStagedTensor {
                name: t.name.clone(),
                offset: t.offset,
                length: t.len,
                dtype: t.dtype.safetensors_name(),
                shape: t.shape.clone(),
                own_scale: t.scale.map(|s| (s.offset, s.len)),
                scale_index: match w.scale {
                    Some((ScaleSource::Tensor(i), _)) => Some(i),
                    _ => None,
                },
                scale_layout: w.scale.map(|(_, l)| l.name()),
                expand_at: w.expand_at,
                is_scale: w.is_scale,
            })
            .collect())
    }

    /// Bytes of the staging buffers the engine stages into, all together (a shared pool's when
    /// it was made with one).
    fn staging_bytes(&self) -> PyResult<usize> {
        Ok(self.engine()?.staging_bytes())
    }

    /// True when `block` is used in place from the map of its files (its leases are views of
    /// the file's pages).
    fn in_place(&self, block: usize) -> PyResult<bool> {
        self.engine()?.in_place(block).map_err(ToPyErr::to_py)
    }

    /// True when `block`'s tensors are unmapped one by one as the modules that use them end (a
    /// disk-tier block used in place); a RAM-tier block's pages stay cached either way.
    fn unmaps_as_used(&self, block: usize) -> PyResult<bool> {
        self.engine()?.unmaps_as_used(block).map_err(ToPyErr::to_py)
    }

    /// The mode disk reads really use ("direct", or "buffered" after a refused O_DIRECT).
    fn disk_read_mode(&self) -> PyResult<Option<&'static str>> {
        Ok(self.engine()?.disk_read_mode().map(ReadMode::as_str))
    }

    /// The engine's statistics since the last reset.
    fn stats(&self) -> PyResult<PyEngineStats> {
        Ok(PyEngineStats::from(self.engine()?.stats()))
    }

    /// The workers' most recent stagings (at most 4096), oldest first; a reset keeps them.
    fn stagings(&self) -> PyResult<Vec<PyStaging>> {
        let stagings = self.engine()?.stagings();
        Ok(stagings.into_iter().map(PyStaging::from).collect())
    }

    /// Starts the statistics again, for measuring from here (a new pass): `stats()` counts from
    /// now on; the RAM tier's load figures and `stagings()` are kept.
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

    /// True once `close` was called: the workers are stopped, and every other call but `close`
    /// raises a StreamError.
    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self
            .inner
            .lock()
            .map_err(|_| raise(Kind::Stream, "engine lock poisoned"))?
            .is_none())
    }
}

/// One tensor of a staged block, and what the backends do with it before the block runs.
#[pyclass(name = "StagedTensor", module = "trash_panda._core", frozen, get_all)]
#[derive(Debug, Clone)]
pub(crate) struct PyStagedTensor {
    /// The tensor's name in the checkpoint.
    name: String,
    /// Offset of its first byte in the staging buffer (and in a device slot).
    offset: usize,
    /// Its length in bytes in the staging buffer.
    length: usize,
    /// The dtype of the staged bytes (header name).
    dtype: &'static str,
    /// Elements along each dimension, outermost first; empty for a scalar.
    shape: Vec<usize>,
    /// (offset, length) of the per-row f32 scales the engine made quantizing it on load.
    own_scale: Option<(usize, usize)>,
    /// The block's checkpoint scale tensor that scales it, by index in the layout.
    scale_index: Option<usize>,
    /// "tensor", "row" or "block" when a scale applies.
    scale_layout: Option<&'static str>,
    /// Offset in the expansion buffer; None: used in place (or a scale tensor).
    expand_at: Option<u64>,
    /// A checkpoint scale tensor, consumed by its weight's expansion.
    is_scale: bool,
}

/// A block's image in the in-memory RAM tier, kept alive by the views of it.
///
/// The image is shared: the engine's workers copy from it into staging buffers for as long as
/// the engine lives. So it goes to torch read-only (a DLPack 1.0 capsule with the read-only
/// flag): a copy source for the device, never a tensor to write.
struct ImageBytes(RamImage);

impl ByteOwner for ImageBytes {
    fn memory(&self) -> Memory {
        Memory::read_only(self.0.bytes())
    }
}

/// Holds a lease; dropping the last reference gives the buffer back to the engine.
#[derive(Debug)]
struct LeaseCell(Lease);

/// A tensor's bytes inside a leased staging buffer, or, for a block used in place, inside the
/// private map of its file.
struct LeaseSlice {
    /// Kept for its lease, which keeps `span`'s memory alive and unmoved.
    _cell: Arc<LeaseCell>,
    /// Made by the lease: memory torch may write (the staging buffer the lease owns alone, or
    /// this process's copy-on-write pages of the file), see `Lease::tensor_writable`.
    span: WritableSpan,
}

impl ByteOwner for LeaseSlice {
    fn memory(&self) -> Memory {
        Memory::Writable(self.span)
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

#[pymethods]
impl PyLease {
    /// The engine's index of the leased block.
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
        let span = cell.0.bytes_writable();
        Ok(PyTensorBytes::from_owner(Arc::new(LeaseSlice {
            _cell: cell,
            span,
        })))
    }

    /// True when the block is used in place from the map of its files (the views are the
    /// file's pages, and ``block_bytes`` is empty).
    #[getter]
    fn in_place(&self) -> PyResult<bool> {
        Ok(self.cell()?.0.in_place())
    }

    /// Gives back the pages of one tensor of a block used in place once its views are no
    /// longer read (a later read maps them again); nothing for a staged block.
    fn forget_tensor(&self, tensor: usize) -> PyResult<()> {
        self.cell()?.0.forget_tensor(tensor).map_err(ToPyErr::to_py)
    }

    /// One tensor's staged bytes, by index in the block's layout.
    fn view(&self, tensor: usize) -> PyResult<PyTensorBytes> {
        let cell = self.cell()?;
        let span = cell.0.tensor_writable(tensor).map_err(ToPyErr::to_py)?;
        Ok(PyTensorBytes::from_owner(Arc::new(LeaseSlice {
            _cell: cell,
            span,
        })))
    }

    /// Expands staged tensors into CPU tensors in one call, without the GIL: each item is (the
    /// tensor's index in the block's layout, a contiguous CPU tensor of the engine's compute
    /// dtype and the tensor's size). The scale, its layout and the dtypes come from the core.
    #[pyo3(signature = (items, dtype, threads=None))]
    fn expand_into(
        &self,
        py: Python<'_>,
        items: Vec<(usize, Bound<'_, PyAny>)>,
        dtype: &str,
        threads: Option<usize>,
    ) -> PyResult<()> {
        let cell = self.cell()?;
        let lease = &cell.0;
        let to = crate::dtype::parse_dtype(dtype)?;
        let dsts = items
            .iter()
            .map(|(i, dst)| Ok((*i, Borrowed::new(dst, "dst")?)))
            .collect::<PyResult<Vec<_>>>()?;
        let targets: Vec<ExpandTarget> = dsts
            .iter()
            .map(|(tensor, d)| {
                let (a, b) = d.span();
                ExpandTarget {
                    tensor: *tensor,
                    span: a..b,
                }
            })
            .collect();
        let staged = lease.bytes().as_ptr_range();
        let staged = staged.start as usize..staged.end as usize;
        let expansion =
            Expansion::plan(lease.layout(), staged, &targets, to).map_err(ToPyErr::to_py)?;
        // SAFETY: the plan checked the destinations pairwise disjoint and disjoint from the
        // staged buffer, the only other memory borrowed while the slices live.
        let jobs: Vec<&mut [u8]> = dsts.iter().map(|(_, d)| unsafe { d.bytes_mut() }).collect();
        let n = worker_threads(threads);
        without_gil(py, || expansion.run(lease, jobs, n)).map_err(ToPyErr::to_py)
    }

    /// Marks the staged bytes as spoiled: the block is staged again before its next run.
    fn discard(&self) -> PyResult<()> {
        self.cell()?.0.discard();
        Ok(())
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

/// What an engine's patched images take.
#[pyclass(name = "OverlayBytes", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PyOverlayBytes {
    inner: OverlayBytes,
}

#[pymethods]
impl PyOverlayBytes {
    /// Bytes of private memory (RAM-tier blocks' images).
    #[getter]
    fn memory(&self) -> u64 {
        self.inner.memory
    }

    /// Bytes of overlay files (disk-tier blocks' images).
    #[getter]
    fn file(&self) -> u64 {
        self.inner.file
    }

    /// Blocks staged from a patched image.
    #[getter]
    fn blocks(&self) -> u64 {
        self.inner.blocks
    }

    fn __repr__(&self) -> String {
        format!(
            "OverlayBytes(memory={}, file={}, blocks={})",
            self.inner.memory, self.inner.file, self.inner.blocks
        )
    }
}

/// The overlay folder's limit in bytes from the `overlay_limit` setting's text: a size
/// ("20GB"), or "auto" (twice `streamed`, the bytes of the streamed blocks that may use it).
#[pyfunction]
fn overlay_limit(text: &str, streamed: u64) -> PyResult<u64> {
    OverlayStore::limit_from(text, streamed).map_err(|e| raise(Kind::Argument, e))
}

/// Where overlay files go when no folder is set: a folder beside the checkpoint's `file`.
#[pyfunction]
fn default_overlay_dir(file: PathBuf) -> PathBuf {
    OverlayStore::default_dir(&file)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStreamTensor>()?;
    m.add_class::<PyStreamBlock>()?;
    m.add_class::<PyEngine>()?;
    m.add_class::<PyLease>()?;
    m.add_class::<PyStagedTensor>()?;
    m.add_class::<PyOverlayBytes>()?;
    m.add_function(wrap_pyfunction!(overlay_limit, m)?)?;
    m.add_function(wrap_pyfunction!(default_overlay_dir, m)?)?;
    Ok(())
}

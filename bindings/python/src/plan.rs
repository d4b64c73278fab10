//! `trash_panda._core` planner: `make_plan`, `Plan`, and the size/option parsing of its arguments.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyString};

use trash_panda::plan::{
    self, BlockPlan, Figures, MinFreeRam, ModelBlocks, Plan, PlanOptions, Selector, SharedStaging,
    TensorSizes, Tier,
};
use trash_panda::units::{parse_bytes, ACCEPTED_SIZES};
use trash_panda::DType;

mod budget;
mod tier;

pub(crate) use budget::PyBudgets;
pub(crate) use tier::{PyTier, TierArg};

use std::path::PathBuf;

use pyo3::exceptions::PyOSError;

use crate::checkpoint::PyTensorInfo;
use crate::engine_config::PyEngineConfig;
use crate::errors::{raise, Kind, ToPyErr};
use crate::pipeline::{PyHolds, PyLoadReads};
use crate::staging_pool::PyStagingPool;

/// A model's tensor for the planner: its name in the model and its checkpoint entry.
type ModelTensor<'py> = (String, PyRef<'py, PyTensorInfo>);

/// A size argument: an int of bytes or a string such as "9GB".
pub(crate) fn size_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if value.is_instance_of::<PyInt>() {
        return value.extract::<u64>().map_err(|_| {
            raise(
                Kind::Argument,
                format!("{what}: expected a size of 0 bytes or more, got {value}"),
            )
        });
    }
    if let Ok(s) = value.cast::<PyString>() {
        let s = s.to_cow()?;
        return parse_bytes(&s).map_err(|e| raise(Kind::Argument, format!("{what}: {e}")));
    }
    Err(raise(
        Kind::Argument,
        format!(
            "{what}: expected an int of bytes or a string ({ACCEPTED_SIZES}), got {}",
            value.get_type().name()?
        ),
    ))
}

fn dtype_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<DType> {
    let s: String = value.extract().map_err(|_| {
        raise(
            Kind::Argument,
            format!("{what}: expected a dtype name such as \"bf16\""),
        )
    })?;
    s.parse::<DType>()
        .map_err(|e| raise(Kind::Argument, format!("{what}: {e}")))
}

/// `min_free_ram`: `"auto"`, or bytes or a size such as `"1GB"`.
pub(crate) fn min_free_ram_arg(value: &Bound<'_, PyAny>) -> PyResult<MinFreeRam> {
    Ok(match value.extract::<String>() {
        Ok(s) if s.trim().eq_ignore_ascii_case("auto") => MinFreeRam::Auto,
        _ => MinFreeRam::Bytes(size_arg(value, "min_free_ram")?),
    })
}

/// Builds `PlanOptions` from the keyword arguments of `plan()` (None means the default).
fn options_from(kwargs: &Bound<'_, PyDict>, base: PlanOptions) -> PyResult<PlanOptions> {
    let mut o = base;
    for (key, value) in kwargs.iter() {
        let key: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        match key.as_str() {
            "resident_blocks" => {
                o.resident_blocks = Some(value.extract().map_err(|_| {
                    raise(Kind::Argument, format!("resident_blocks: expected a count of 0 or more, got {value}"))
                })?)
            }
            "max_vram" => o.max_vram = Some(size_arg(&value, "max_vram")?),
            "min_free_ram" => o.min_free_ram = min_free_ram_arg(&value)?,
            "headroom_vram" => o.headroom_vram = size_arg(&value, "headroom_vram")?,
            "activation_vram" => o.activation_vram = Some(size_arg(&value, "activation_vram")?),
            "compute_dtype" => o.compute_dtype = Some(dtype_arg(&value, "compute_dtype")?),
            "storage_dtype" => o.storage_dtype = Some(dtype_arg(&value, "storage_dtype")?),
            "lookahead" => {
                o.lookahead = value.extract().map_err(|_| {
                    raise(Kind::Argument, format!("lookahead: expected a count of 0 or more, got {value}"))
                })?
            }
            "pinned_buffers" => {
                let n: usize = value.extract().map_err(|_| {
                    raise(Kind::Argument, format!("pinned_buffers: expected a count of 0 or more, got {value}"))
                })?;
                o.staging_buffers = trash_panda::rules::asked_staging_buffers(n);
            }
            "max_lookahead" => {
                let n: usize = value.extract().map_err(|_| {
                    raise(Kind::Argument, format!("max_lookahead: expected a count of 0 or more, got {value}"))
                })?;
                o.max_lookahead = trash_panda::rules::asked_max_depth(n);
            }
            "ram_in_memory" => {
                o.ram_in_memory = value.extract().map_err(|_| {
                    raise(Kind::Argument, format!("ram_in_memory: expected True or False, got {value}"))
                })?
            }
            "staging_pool" => {
                let pool: PyRef<'_, PyStagingPool> = value.extract().map_err(|_| {
                    raise(Kind::Argument, format!("staging_pool: expected a StagingPool, got {value}"))
                })?;
                o.staging_pool = Some(SharedStaging {
                    buffers: pool.inner.count(),
                    buffer_bytes: pool.inner.buffer_len() as u64,
                });
            }
            "adapter_bytes" => {
                o.adapter_bytes = value.extract().map_err(|_| {
                    raise(Kind::Argument, format!("adapter_bytes: expected a count of bytes, got {value}"))
                })?
            }
            "merged_modules" => {
                o.merged_modules = value.extract().map_err(|_| {
                    raise(Kind::Argument, format!("merged_modules: expected a list of module names, got {value}"))
                })?
            }
            other => {
                return Err(raise(Kind::Argument, format!(
                    "unknown plan option {other:?}: expected resident_blocks, max_vram, min_free_ram, \
                     headroom_vram, activation_vram, compute_dtype, storage_dtype, lookahead, \
                     pinned_buffers, max_lookahead, ram_in_memory, staging_pool, adapter_bytes or \
                     merged_modules"
                )))
            }
        }
    }
    Ok(o)
}

/// The machine's memory, with either figure replaced when given (tests and docs inject them).
/// `has_gpu` says whether a GPU computes; without one, a `free_vram` given sizes a device tier
/// that the CPU's RAM holds, as a GPU of that memory would get it (a simulated device).
fn figures_from(free_vram: Option<u64>, has_gpu: bool, ram: Option<u64>) -> PyResult<Figures> {
    let mut figures = match ram {
        Some(ram) => Figures::injected(ram, None),
        None => Figures::probe().map_err(ToPyErr::to_py)?,
    };
    figures.free_vram = free_vram;
    Ok(if has_gpu { figures } else { figures.on_cpu() })
}

fn model_from(
    tensors: Vec<ModelTensor<'_>>,
    prefixes: Option<Vec<String>>,
) -> PyResult<ModelBlocks> {
    let sizes = tensors
        .into_iter()
        .map(|(name, info)| info.sizes(name))
        .collect::<PyResult<Vec<_>>>()?;
    match prefixes {
        Some(p) => ModelBlocks::from_prefixes(sizes, &p).map_err(ToPyErr::to_py),
        None => Ok(ModelBlocks::discover(sizes)),
    }
}

/// What a plan is made from: the model's blocks, the memory figures, the options over `base`.
fn inputs(
    tensors: Vec<ModelTensor<'_>>,
    prefixes: Option<Vec<String>>,
    free_vram: Option<u64>,
    has_gpu: bool,
    ram: Option<u64>,
    options: Option<&Bound<'_, PyDict>>,
    base: PlanOptions,
) -> PyResult<(ModelBlocks, Figures, PlanOptions)> {
    let model = model_from(tensors, prefixes)?;
    let opts = match options {
        Some(o) => options_from(o, base)?,
        None => base,
    };
    Ok((model, figures_from(free_vram, has_gpu, ram)?, opts))
}

/// A plan: which block lives on the device, in RAM and on disk.
#[pyclass(name = "Plan", module = "trash_panda._core")]
#[derive(Debug, Clone)]
pub(crate) struct PyPlan {
    pub(crate) inner: Plan,
}

#[pymethods]
impl PyPlan {
    /// A plan written by hand; matched against the model when it is loaded.
    #[staticmethod]
    #[pyo3(signature = (resident, streamed, streamed_tier=TierArg(Tier::Ram)))]
    fn manual(
        resident: Vec<String>,
        streamed: Vec<String>,
        streamed_tier: TierArg,
    ) -> PyResult<Self> {
        let inner = Plan::manual(&resident, &streamed, streamed_tier.0).map_err(ToPyErr::to_py)?;
        Ok(PyPlan { inner })
    }

    /// A plan from a JSON file written by `save` or `trash-panda plan --json`.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Self> {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            PyOSError::new_err(format!("{}: cannot read the plan: {e}", path.display()))
        })?;
        Self::from_json(&text)
    }

    /// Writes `to_json` to `path`.
    fn save(&self, path: PathBuf) -> PyResult<()> {
        std::fs::write(&path, self.inner.to_json()).map_err(|e| {
            PyOSError::new_err(format!("{}: cannot write the plan: {e}", path.display()))
        })
    }

    /// The tier of the block named `block` (its prefix), or None if the plan has no such block.
    fn tier_of(&self, block: &str) -> Option<PyTier> {
        self.inner
            .blocks
            .iter()
            .find(|b| b.name == block)
            .map(|b| b.tier.into())
    }

    /// The names of the blocks in `tier`, in model order.
    fn blocks_in(&self, tier: TierArg) -> Vec<String> {
        self.inner
            .blocks_in(tier.0)
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// The table `str()` prints without its warnings (a log writes those apart).
    fn table(&self) -> String {
        self.inner.table().to_string()
    }

    /// Every figure the runtime holds, from this (resolved) plan.
    fn engine_config(slf: PyRef<'_, Self>) -> PyResult<PyEngineConfig> {
        PyEngineConfig::new(slf)
    }

    /// What a model loaded by this (resolved) plan holds under the current settings, and its
    /// release gives back: the figures a pipeline moves between stages (`stage` names it in
    /// errors).
    #[pyo3(signature = (stage="model"))]
    fn holds(slf: PyRef<'_, Self>, stage: &str) -> PyResult<PyHolds> {
        PyHolds::of(stage, slf)
    }

    /// What a model loaded by this plan needs free at its start: what it holds, and the free
    /// memory the plan leaves alone (free-RAM floor, activation reserve, CUDA context).
    #[pyo3(signature = (stage="model"))]
    fn needs(slf: PyRef<'_, Self>, stage: &str) -> PyResult<PyHolds> {
        PyHolds::needed(stage, slf)
    }

    /// What a model loaded by this plan takes as its load is set up, before any read a stage
    /// read ahead puts behind its allowance: its own staging buffers and, on a GPU, its device
    /// slots and expansion buffers.
    #[pyo3(signature = (stage="model"))]
    fn at_once(slf: PyRef<'_, Self>, stage: &str) -> PyResult<PyHolds> {
        PyHolds::at_once(stage, slf)
    }

    /// How a model loaded by this (resolved) plan on its own reads its files of `files` bytes:
    /// through the page cache only when a later load reads them again (`read_again`: `stage()`
    /// releases the model at its end) and they stay cached beside what the plan holds in RAM
    /// (`TRASH_PANDA_DISK_MODE` other than `auto` wins).
    #[pyo3(signature = (files, read_again=false))]
    fn load_reads(slf: PyRef<'_, Self>, files: u64, read_again: bool) -> PyResult<PyLoadReads> {
        crate::pipeline::py_plan_reads(slf, files, read_again)
    }

    /// Reads a plan from the JSON `to_json` writes; a PlanError for another format or version.
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Self> {
        Ok(PyPlan {
            inner: Plan::from_json(text).map_err(ToPyErr::to_py)?,
        })
    }

    /// The plan as JSON, format name and version first: save it to load the model the same way
    /// later (`from_json` reads it back).
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// Moves blocks, named by position or by prefix, to `tier`; returns the plan itself. An
    /// index out of range, a prefix that matches no block, or a block named twice is a
    /// PlanError and leaves the plan as it was.
    #[pyo3(signature = (tier, indices=None, prefixes=None))]
    fn assign(
        mut slf: PyRefMut<'_, Self>,
        tier: TierArg,
        indices: Option<Vec<usize>>,
        prefixes: Option<Vec<String>>,
    ) -> PyResult<PyRefMut<'_, Self>> {
        let selector = match (indices, prefixes) {
            (Some(i), None) => Selector::Indices(i),
            (None, Some(p)) => Selector::Prefixes(p),
            _ => {
                return Err(raise(
                    Kind::Argument,
                    "assign: give exactly one of indices= or prefixes=",
                ))
            }
        };
        slf.inner
            .assign(tier.0, &selector)
            .map_err(ToPyErr::to_py)?;
        Ok(slf)
    }

    /// This plan applied to a model's tensors (a manual plan gets its sizes and budgets here).
    #[pyo3(signature = (tensors, prefixes, free_vram, has_gpu, ram=None, **options))]
    fn resolve(
        &self,
        tensors: Vec<ModelTensor<'_>>,
        prefixes: Option<Vec<String>>,
        free_vram: Option<u64>,
        has_gpu: bool,
        ram: Option<u64>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let (model, figures, opts) = inputs(
            tensors,
            prefixes,
            free_vram,
            has_gpu,
            ram,
            options,
            self.inner.options.clone(),
        )?;
        Ok(PyPlan {
            inner: self
                .inner
                .resolve(&model, &figures, &opts)
                .map_err(ToPyErr::to_py)?,
        })
    }

    /// Every block in plan order.
    #[getter]
    fn blocks(&self) -> Vec<PyBlockPlan> {
        self.inner.blocks.iter().map(PyBlockPlan::from).collect()
    }

    /// The budgets (None for a manual plan not matched against a model yet).
    #[getter]
    fn budgets(&self) -> Option<PyBudgets> {
        self.inner.budgets.clone().map(|inner| PyBudgets { inner })
    }

    /// What the planner wants the user to know about this plan (it still made it), one message
    /// each.
    #[getter]
    fn warnings(&self) -> Vec<String> {
        self.inner
            .warnings
            .iter()
            .map(|w| w.message.clone())
            .collect()
    }

    /// False for a manual plan not matched against a model yet (`resolve` does it): it has no
    /// sizes or budgets.
    #[getter]
    fn resolved(&self) -> bool {
        self.inner.resolved
    }

    /// The dtype the blocks compute in ("BF16", "F16" or "F32").
    #[getter]
    fn compute_dtype(&self) -> &'static str {
        self.inner.compute_dtype().safetensors_name()
    }

    /// The storage dtype ("BF16", "F8_E4M3") or None (weights as stored).
    #[getter]
    fn storage_dtype(&self) -> Option<&'static str> {
        self.inner
            .options
            .storage_dtype
            .map(DType::safetensors_name)
    }

    /// Streamed blocks staged ahead of the one that runs.
    #[getter]
    fn lookahead(&self) -> usize {
        self.inner.options.lookahead
    }

    /// (buffers, bytes of each) of the shared staging pool the blocks need in whichever tiers
    /// they are put: a pipeline sizes its pool by the largest of its stages'.
    fn shared_staging(&self) -> (usize, u64) {
        let s = self.inner.shared_staging();
        (s.buffers, s.buffer_bytes)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.borrow().inner == self.inner)
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        let count = |t| self.inner.blocks.iter().filter(|b| b.tier == t).count();
        format!(
            "Plan(device={}, ram={}, disk={}, warnings={})",
            count(Tier::Device),
            count(Tier::Ram),
            count(Tier::Disk),
            self.inner.warnings.len()
        )
    }
}

/// One block of a plan.
#[pyclass(name = "BlockPlan", module = "trash_panda._core", frozen, get_all)]
#[derive(Debug, Clone)]
pub(crate) struct PyBlockPlan {
    /// The block's name prefix, e.g. "model.layers.12.".
    name: String,
    /// Where the block lives between uses.
    tier: PyTier,
    /// Bytes in its tier's form: the checkpoint's on disk, the storage dtype's in RAM and on the
    /// device.
    stored_bytes: u64,
    /// Bytes once expanded to the compute dtype, scale tensors dropped: what it takes to run.
    expanded_bytes: u64,
    /// Staging-buffer bytes the block needs in its tier (0 when resident).
    staged_bytes: u64,
    /// Expansion-buffer bytes the block needs in its tier.
    expansion_bytes: u64,
    /// How many tensors the block holds.
    tensors: usize,
    /// An adapter is merged into it (the plan's `merged_modules`): on the CPU it keeps the
    /// merge in an image where it lives.
    merged: bool,
    /// Bytes of its merged image in its tier (memory or an overlay file; 0 when resident).
    image_bytes: u64,
    /// It holds GGML blocks (a GGUF file's, or `storage_dtype="q8_0"`'s): a GPU expands them with
    /// temporaries the plan counts (`Budgets.device_scratch`).
    ggml: bool,
}

impl From<&BlockPlan> for PyBlockPlan {
    fn from(b: &BlockPlan) -> Self {
        PyBlockPlan {
            name: b.name.clone(),
            tier: b.tier.into(),
            stored_bytes: b.stored_bytes,
            expanded_bytes: b.expanded_bytes,
            staged_bytes: b.staging.get(b.tier),
            expansion_bytes: b.expansion.get(b.tier),
            tensors: b.tensors,
            merged: b.merged,
            image_bytes: b.image.get(b.tier),
            ggml: b.ggml,
        }
    }
}

/// Plans a model from its tensors (its names and their checkpoint entries) and block prefixes.
#[pyfunction]
#[pyo3(signature = (tensors, prefixes, free_vram, has_gpu, ram=None, **options))]
fn make_plan(
    tensors: Vec<ModelTensor<'_>>,
    prefixes: Option<Vec<String>>,
    free_vram: Option<u64>,
    has_gpu: bool,
    ram: Option<u64>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyPlan> {
    let (model, figures, opts) = inputs(
        tensors,
        prefixes,
        free_vram,
        has_gpu,
        ram,
        options,
        PlanOptions::default(),
    )?;
    Ok(PyPlan {
        inner: plan::plan(&model, &figures, &opts).map_err(ToPyErr::to_py)?,
    })
}

/// What `storage_dtype` does to a tensor on load: "keep", "bf16", "fp8", "int8" or "q8_0" (the
/// core's one rule).
#[pyfunction]
fn storage_conversion(
    name: &str,
    dtype: &str,
    shape: Vec<usize>,
    storage: &str,
) -> PyResult<&'static str> {
    let d = DType::from_name(dtype).ok_or_else(|| {
        raise(
            Kind::Dtype,
            format!("tensor {name:?}: unknown dtype {dtype:?}"),
        )
    })?;
    let target = dtype_arg_str(storage, "storage_dtype")?;
    Ok(
        match plan::storage_conversion(&TensorSizes::new(name, d, &shape), target) {
            plan::Conversion::Keep => "keep",
            plan::Conversion::ToBf16 => "bf16",
            plan::Conversion::ToFp8 { .. } => "fp8",
            plan::Conversion::ToInt8 { .. } => "int8",
            plan::Conversion::ToQ8_0 => "q8_0",
        },
    )
}

/// The dtype a model computes in when nothing says (the core's one rule): "BF16", "F16" or
/// "F32", from the checkpoint's tensors by element count (see `rules::infer_compute_dtype`).
#[pyfunction]
fn infer_compute_dtype(tensors: Vec<PyRef<'_, PyTensorInfo>>) -> PyResult<&'static str> {
    let sizes = tensors
        .iter()
        .map(|info| info.sizes(info.name().to_owned()))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(plan::infer_compute_dtype(&sizes).safetensors_name())
}

/// The scale tensor applied to weight `name`, among `names` (any container of names: a dict
/// or a set): `<layer>.weight_scale`, `<layer>.scale_weight` or `<layer>.weight_scale_inv`,
/// first found; None for no scale or a name not ending in `.weight` (the core's one rule).
#[pyfunction]
fn paired_scale(name: &str, names: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let mut error = None;
    let found = trash_panda::rules::paired_scale_where(name, |c| {
        names.contains(c).unwrap_or_else(|e| {
            error.get_or_insert(e);
            false
        })
    });
    match error {
        Some(e) => Err(e),
        None => Ok(found),
    }
}

fn dtype_arg_str(value: &str, what: &str) -> PyResult<DType> {
    value
        .parse::<DType>()
        .map_err(|e| raise(Kind::Argument, format!("{what}: {e}")))
}

/// Parses a size as users write it ("9GB", "1.5GiB", 123) into bytes.
#[pyfunction]
#[pyo3(signature = (value, what="size"))]
fn parse_size(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    size_arg(value, what)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FP8_MIN_ELEMENTS", plan::FP8_MIN_ELEMENTS)?;
    m.add("CUDA_CONTEXT_FLOOR", plan::CUDA_CONTEXT_FLOOR)?;
    m.add("SCALE_SUFFIXES", plan::SCALE_SUFFIXES.to_vec())?;
    m.add_class::<PyPlan>()?;
    m.add_class::<PyBlockPlan>()?;
    m.add_class::<PyBudgets>()?;
    m.add_class::<PyTier>()?;
    m.add_function(wrap_pyfunction!(make_plan, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(storage_conversion, m)?)?;
    m.add_function(wrap_pyfunction!(infer_compute_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(paired_scale, m)?)?;
    Ok(())
}

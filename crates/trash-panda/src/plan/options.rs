//! The planner's options (names and defaults as in the spec) and its memory inputs.

use serde::{Deserialize, Serialize};

use super::blocks::ModelBlocks;
use super::PlanError;
use crate::rules::{self, infer_compute_dtype, SharedStaging};
use crate::sys::{GpuProbe, MemoryFigures, SysError};
use crate::units::{parse_bytes, UnitsError};
use crate::DType;

/// `min_free_ram`: RAM the plan leaves to the rest of the machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MinFreeRam {
    /// 8% of the machine's RAM, clamped to 1..4 GB.
    #[default]
    Auto,
    /// Exactly this many bytes.
    Bytes(u64),
}

impl MinFreeRam {
    /// The share of the machine's RAM that `auto` keeps free, before clamping.
    pub const AUTO_FRACTION: f64 = 0.08;
    /// The least `auto` keeps free, in bytes.
    pub const AUTO_MIN: u64 = 1_000_000_000;
    /// The most `auto` keeps free, in bytes.
    pub const AUTO_MAX: u64 = 4_000_000_000;

    /// The reserve in bytes for a machine with `total_ram`.
    pub fn resolve(self, total_ram: u64) -> u64 {
        match self {
            MinFreeRam::Bytes(b) => b,
            MinFreeRam::Auto => ((total_ram as f64 * Self::AUTO_FRACTION) as u64)
                .clamp(Self::AUTO_MIN, Self::AUTO_MAX),
        }
    }
}

impl std::str::FromStr for MinFreeRam {
    type Err = UnitsError;
    /// `"auto"` or a size such as `"4GB"` or `"0"`.
    fn from_str(s: &str) -> Result<Self, UnitsError> {
        if s.trim().eq_ignore_ascii_case("auto") {
            Ok(MinFreeRam::Auto)
        } else {
            parse_bytes(s).map(MinFreeRam::Bytes)
        }
    }
}

/// The options of `plan()`, with the spec's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanOptions {
    /// Exactly this many blocks resident on the device (clamped to the number of blocks), even
    /// past the budget, which then gives a warning. `None`: as many as fit.
    pub resident_blocks: Option<usize>,
    /// A cap on the device memory the plan uses, below the free VRAM.
    pub max_vram: Option<u64>,
    /// RAM left to the rest of the machine.
    pub min_free_ram: MinFreeRam,
    /// Device memory kept free for activations when `activation_vram` is not given.
    pub headroom_vram: u64,
    /// Measured peak activation memory; replaces `headroom_vram`.
    pub activation_vram: Option<u64>,
    /// `None`: the dtype most of the checkpoint's float weights have (see
    /// [`crate::rules::infer_compute_dtype`]); a made plan always holds the dtype it chose.
    pub compute_dtype: Option<DType>,
    /// `None`: weights kept as stored; `bf16` or `fp8` (e4m3fn): see [`super::Budgets`].
    pub storage_dtype: Option<DType>,
    /// Streamed blocks staged ahead of the one that runs.
    pub lookahead: usize,
    /// Host staging buffers (pinned on CUDA) when a block streams; `None`: one more than the
    /// maximum depth (`TRASH_PANDA_PINNED_BUFFERS`). Never fewer than one.
    pub staging_buffers: Option<usize>,
    /// The deepest the staging may grow where the compute waits for blocks
    /// (`TRASH_PANDA_MAX_LOOKAHEAD`); `None`: the look-ahead, a fixed depth. Written only when
    /// set, so plans without it read as they always did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_lookahead: Option<usize>,
    /// The staging pool a pipeline shares among its stages: counted as this plan's staging
    /// buffers where every block fits it in any tier ([`super::Plan::shared_staging`]), else ignored
    /// (the stage keeps buffers of its own, `Budgets::shared_staging` false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_pool: Option<SharedStaging>,
    /// The RAM tier is read into private memory at load (`TRASH_PANDA_RAM_IN_MEMORY`) rather
    /// than mapped from the checkpoint: its blocks are staged for each run. Mapped, on the CPU
    /// on Linux, they run where they lie and stage nothing ([`rules::maps_ram_tier`]). Written
    /// only when set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ram_in_memory: bool,
    /// Bytes of the adapters (LoRA matrices and the like) the model holds where it computes,
    /// beside the weights outside the blocks: no checkpoint of the model has them, yet they
    /// take the same memory. Written only when set.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub adapter_bytes: u64,
    /// Modules with an adapter merged into them when the model was planned (a LoRA fused before
    /// a chained pipeline's first call, or a model planned again after a merge): the blocks
    /// holding them keep the merge in an image where they live, which the plan counts. Written
    /// only when set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_modules: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl PlanOptions {
    /// The default `headroom_vram`, in bytes.
    pub const DEFAULT_HEADROOM_VRAM: u64 = rules::DEFAULT_HEADROOM_VRAM;
    /// The default `lookahead`, in blocks.
    pub const DEFAULT_LOOKAHEAD: usize = rules::DEFAULT_LOOKAHEAD;

    /// The compute dtype (bf16 until one is chosen or inferred).
    pub fn compute(&self) -> DType {
        self.compute_dtype.unwrap_or(DType::BF16)
    }

    /// The staging buffers a plan with a streamed block counts: the figure asked for, else one
    /// per block staged ahead at the maximum depth plus the one that runs; at least one.
    pub fn buffers(&self) -> usize {
        rules::staging_buffers(self.staging_buffers, self.max_depth())
    }

    /// The deepest the staging may grow ([`rules::max_depth`]).
    pub fn max_depth(&self) -> usize {
        rules::max_depth(self.lookahead, self.max_lookahead)
    }
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            resident_blocks: None,
            max_vram: None,
            min_free_ram: MinFreeRam::Auto,
            headroom_vram: Self::DEFAULT_HEADROOM_VRAM,
            activation_vram: None,
            compute_dtype: None,
            storage_dtype: None,
            lookahead: Self::DEFAULT_LOOKAHEAD,
            staging_buffers: None,
            max_lookahead: None,
            staging_pool: None,
            ram_in_memory: false,
            adapter_bytes: 0,
            merged_modules: Vec::new(),
        }
    }
}

/// What computes the blocks of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeDevice {
    /// A GPU, whose memory holds the device tier.
    Gpu,
    /// The CPU, whose RAM then holds the device tier too.
    Cpu,
}

/// The memory the plan is made for. Tests and `--vram`/`--ram` fill it by hand;
/// [`Figures::probe`] fills it from the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// The machine's RAM, what is available of it, and any cgroup limit.
    pub memory: MemoryFigures,
    /// Free memory of the GPU; `None` when there is no GPU and the CPU computes.
    pub free_vram: Option<u64>,
    /// `Some(Cpu)` when the CPU computes although `free_vram` is given: the device tier is then
    /// sized as a GPU's of that much memory but lives in RAM (a simulated device, as `make demo`
    /// plans). `None`: the device `free_vram` implies. Only this case is written, so the plans of
    /// real machines read as they always did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<ComputeDevice>,
}

impl Figures {
    /// RAM and cgroup from /proc and /sys, free VRAM of GPU 0 through NVML when there is one.
    pub fn probe() -> Result<Figures, SysError> {
        Ok(Figures {
            memory: MemoryFigures::probe()?,
            free_vram: crate::sys::nvml::probe().free_vram(0),
            device: None,
        })
    }

    /// Figures for tests and docs: `ram` bytes available, `vram` free on a GPU (or no GPU).
    pub fn injected(ram: u64, vram: Option<u64>) -> Figures {
        Figures {
            memory: MemoryFigures::with_ram(ram),
            free_vram: vram,
            device: None,
        }
    }

    /// Replaces the GPU part from an existing probe: a GPU found computes.
    pub fn with_gpu(mut self, gpus: &GpuProbe) -> Figures {
        self.free_vram = gpus.free_vram(0);
        self.device = None;
        self
    }

    /// These figures for a plan the CPU runs: a `free_vram` given sizes a device tier that the
    /// CPU's RAM holds (the budgets stay a GPU's, so the plan is the one such a GPU would get).
    pub fn on_cpu(mut self) -> Figures {
        self.device = self.free_vram.map(|_| ComputeDevice::Cpu);
        self
    }

    /// What computes: the CPU without `free_vram`, else the GPU unless [`Figures::on_cpu`] said
    /// the CPU.
    pub fn device(&self) -> ComputeDevice {
        match (self.free_vram, self.device) {
            (None, _) => ComputeDevice::Cpu,
            (Some(_), Some(device)) => device,
            (Some(_), None) => ComputeDevice::Gpu,
        }
    }
}

/// Checks `options` and fills in what they leave to the model (the compute dtype).
pub(crate) fn resolve_options(
    options: &PlanOptions,
    model: &ModelBlocks,
) -> Result<PlanOptions, PlanError> {
    let mut options = options.clone();
    let compute = *options.compute_dtype.get_or_insert_with(|| {
        infer_compute_dtype(
            model
                .blocks
                .iter()
                .flat_map(|b| &b.tensors)
                .chain(&model.outside),
        )
    });
    if !matches!(compute, DType::F32 | DType::F16 | DType::BF16) {
        return Err(PlanError::ComputeDtype { dtype: compute });
    }
    if let Some(dtype) = options.storage_dtype {
        if !crate::rules::conversion::is_storage_dtype(dtype) {
            return Err(PlanError::StorageDtype { dtype });
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::TensorSizes;

    fn t(name: &str, dtype: DType, n: usize) -> TensorSizes {
        TensorSizes::new(name, dtype, &[n])
    }

    /// The cases where the Python copy of this rule (bytes, f64 ignored, f32 when no float)
    /// answered differently; Python now asks this function.
    #[test]
    fn compute_dtype_counts_elements_and_votes_for_the_compute_dtype() {
        // More f32 bytes (24) than bf16 bytes (20), more bf16 elements (10 against 6).
        let mixed = [t("a", DType::BF16, 10), t("b", DType::F32, 6)];
        assert_eq!(infer_compute_dtype(&mixed), DType::BF16);
        // f64 weights compute in f32, alone or beside fewer bf16 elements.
        assert_eq!(infer_compute_dtype(&[t("a", DType::F64, 4)]), DType::F32);
        let f64_bf16 = [t("a", DType::F64, 10), t("b", DType::BF16, 9)];
        assert_eq!(infer_compute_dtype(&f64_bf16), DType::F32);
        // No float weights (none at all, or integers only): bf16.
        assert_eq!(infer_compute_dtype(&[]), DType::BF16);
        assert_eq!(infer_compute_dtype(&[t("ids", DType::I64, 9)]), DType::BF16);
        // fp8 weights with f32 scales (per row, here more elements than the bf16 norms) and
        // f32 weights fewer than the fp8 ones: bf16.
        let fp8 = [
            t("l.0.w.weight", DType::F8E4M3, 64),
            t("l.0.w.weight_scale", DType::F32, 32),
            t("l.0.w.weight_scale_inv", DType::F32, 32),
            t("l.0.norm.weight", DType::BF16, 8),
            t("l.0.router.weight", DType::F32, 16),
        ];
        assert_eq!(infer_compute_dtype(&fp8), DType::BF16);
        let e5m2 = [t("w", DType::F8E5M2, 64), t("v", DType::F16, 63)];
        assert_eq!(infer_compute_dtype(&e5m2), DType::BF16);
    }
}

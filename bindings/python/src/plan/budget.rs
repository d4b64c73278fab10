//! `trash_panda._core` plan budgets (the core's `plan::budget`): what a plan allows each tier
//! and what the runtime holds beside the weights.

use pyo3::prelude::*;

use trash_panda::plan::Budgets;

/// The budgets of a plan, in bytes (see docs/plan-format.md).
#[pyclass(name = "Budgets", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyBudgets {
    pub(super) inner: Budgets,
}

#[pymethods]
impl PyBudgets {
    /// True when the plan sizes the device tier as a GPU's (a free VRAM was given); False when the
    /// CPU computes: RAM is then the device's memory, and the device and RAM tiers share it.
    #[getter]
    fn gpu(&self) -> bool {
        self.inner.gpu
    }
    /// The device memory the plan may use: the free VRAM with a GPU; on the CPU, the RAM left
    /// after `min_free_ram`, the host staging and the mapped window. Capped by `max_vram` if given.
    #[getter]
    fn device_limit(&self) -> u64 {
        self.inner.device_limit
    }
    /// Memory kept for activations: `activation_vram` if given, else `headroom_vram` with a GPU
    /// and 0 on the CPU.
    #[getter]
    fn reserve(&self) -> u64 {
        self.inner.reserve
    }
    /// True when `reserve` is the measured `activation_vram` given to the planner, False when it
    /// is the `headroom_vram` guess.
    #[getter]
    fn reserve_measured(&self) -> bool {
        self.inner.reserve_measured
    }
    /// `CUDA_CONTEXT_FLOOR` when a GPU computes, else 0.
    #[getter]
    fn cuda_floor(&self) -> u64 {
        self.inner.cuda_floor
    }
    /// Host staging buffers (pinned on CUDA) when a block streams, else 0.
    #[getter]
    fn staging_buffers(&self) -> usize {
        self.inner.staging_buffers
    }
    /// Bytes of each staging buffer (and device slot): the largest streamed block as staged.
    #[getter]
    fn staging_buffer_bytes(&self) -> u64 {
        self.inner.staging_buffer_bytes
    }
    /// True when the staging buffers counted are a pipeline's shared pool (planned with
    /// `staging_pool`): the pipeline holds them, counted once for all its stages.
    #[getter]
    fn shared_staging(&self) -> bool {
        self.inner.shared_staging
    }
    /// Bytes of the host staging pool: `staging_buffers` x `staging_buffer_bytes`.
    #[getter]
    fn host_staging(&self) -> u64 {
        self.inner.host_staging
    }
    /// Device slots a staged block is copied into: one per staging buffer on a GPU, 0 on the CPU.
    #[getter]
    fn device_slots(&self) -> usize {
        self.inner.device_slots
    }
    /// Device memory of the device slots: `device_slots` x `staging_buffer_bytes`.
    #[getter]
    fn device_slot_bytes(&self) -> u64 {
        self.inner.device_slot_bytes
    }
    /// The expansion buffer: the largest expansion to the compute dtype a hooked block needs.
    #[getter]
    fn expansion(&self) -> u64 {
        self.inner.expansion
    }
    /// The device temporaries of GGML expansions on a GPU (when a hooked block holds GGML
    /// blocks), else 0.
    #[getter]
    fn device_scratch(&self) -> u64 {
        self.inner.device_scratch
    }
    /// The checkpoint pages a disk-tier block used in place maps while it runs (the CPU on
    /// Linux), 0 when none is.
    #[getter]
    fn mapped_window(&self) -> u64 {
        self.inner.mapped_window
    }
    /// The pinned host memory a loader reads resident weights into on a GPU before its own
    /// stream copies them to the device; 0 on the CPU.
    #[getter]
    fn loader_ring(&self) -> u64 {
        self.inner.loader_ring
    }
    /// The weights outside the blocks (embeddings, final norm, heads) in the compute dtype: on the
    /// device, or in RAM without a GPU.
    #[getter]
    fn outside(&self) -> u64 {
        self.inner.outside
    }
    /// The adapters (LoRA matrices and the like) the model holds beside the outside weights,
    /// counted with them (the `adapter_bytes` the plan was given).
    #[getter]
    fn adapters(&self) -> u64 {
        self.inner.adapters
    }
    /// What making a merge takes while it is made (a merged layer's weight copied and its
    /// ΔW: twice the largest merged weight), counted with the outside weights.
    #[getter]
    fn merge_work(&self) -> u64 {
        self.inner.merge_work
    }
    /// Private memory of the merged blocks' images (staged RAM-tier blocks with an adapter
    /// merged in, on the CPU).
    #[getter]
    fn merged_memory(&self) -> u64 {
        self.inner.merged_memory
    }
    /// Overlay files of the merged blocks' images (disk-tier blocks, and RAM-tier blocks used in
    /// place).
    #[getter]
    fn merged_files(&self) -> u64 {
        self.inner.merged_files
    }
    /// Of `ram_used`, what the merged blocks' images take beyond the blocks' own bytes.
    #[getter]
    fn merged_beyond(&self) -> u64 {
        self.inner.merged_beyond
    }
    /// What resident (device-tier) blocks may take: `device_limit` less `cuda_floor`, `reserve`,
    /// `device_slot_bytes`, `expansion` and `outside` (0 rather than below).
    #[getter]
    fn device_budget(&self) -> u64 {
        self.inner.device_budget
    }
    /// What the device-tier blocks take, in their stored form.
    #[getter]
    fn device_used(&self) -> u64 {
        self.inner.device_used
    }
    /// RAM this process could use when the plan was made (MemAvailable within a cgroup's limit
    /// and, on Windows, the commit headroom).
    #[getter]
    fn usable_ram(&self) -> u64 {
        self.inner.usable_ram
    }
    /// RAM the plan leaves to the rest of the machine: the `min_free_ram` option resolved.
    #[getter]
    fn min_free_ram(&self) -> u64 {
        self.inner.min_free_ram
    }
    /// What RAM-tier blocks may take: `usable_ram` less `min_free_ram`, the host staging and the
    /// mapped window; on the CPU, less also the device tier, `reserve`, `expansion` and `outside`.
    #[getter]
    fn ram_budget(&self) -> u64 {
        self.inner.ram_budget
    }
    /// What the RAM-tier blocks take, in their stored form.
    #[getter]
    fn ram_used(&self) -> u64 {
        self.inner.ram_used
    }
    /// What the disk-tier blocks take in the checkpoint, read from it every pass.
    #[getter]
    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes
    }
    /// Everything the runtime holds beside the weights on the device: device slots and the
    /// expansion buffer (on the CPU, the host staging pool, the mapped window and the expansion
    /// buffer).
    #[getter]
    fn held_on_device(&self) -> u64 {
        self.inner.held_on_device()
    }
    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

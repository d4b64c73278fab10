//! The staging rules: where staged tensors may start, how large a staging buffer is, what the
//! runtime holds beside the weights ([`Held`]), and the defaults of the figures that size it.

use serde::{Deserialize, Serialize};

use crate::io::DIRECT_ALIGN;
use crate::DType;

/// Offset alignment of staged tensors (and scales) for the CPU: a cache line, the alignment of
/// torch's own CPU allocations, and enough for any element type.
pub const TENSOR_ALIGN: usize = 64;

/// Offset alignment of staged tensors for a GPU: the alignment of the CUDA caching allocator's
/// blocks, so a tensor copied with its block into a device slot can be used there in place
/// (cuBLAS picks kernels, and so roundings, by alignment).
pub const DEVICE_TENSOR_ALIGN: usize = 512;

/// The largest page the page cache maps at once (a PMD on x86-64 and arm64): what a block run in
/// place may map beyond its own bytes, at each end of each run.
pub const MAP_GRAIN: u64 = 2 << 20;

/// What a loader reads at once of a model's resident weights (a block's, or a group of the
/// weights outside the blocks) before it hands them on: the bound of one call of the core.
pub const LOAD_GROUP_BYTES: u64 = 64 << 20;

/// Room a loader's pinned ring keeps in each half beside a group: a direct read lands in a
/// tensor whose first byte sits at the same place in its page as in the file.
pub const LOADER_RING_SLACK: u64 = 1 << 20;

/// The pinned host memory a loader on a GPU reads resident weights into while its own stream
/// copies the other half's to the device: two halves of a group and its slack, and a page to
/// align it on (registration takes whole pages).
pub const LOADER_RING_BYTES: u64 = 2 * (LOAD_GROUP_BYTES + LOADER_RING_SLACK) + DIRECT_ALIGN as u64;

/// Weights the device path expands per pass from GGML blocks (torch operations on a GPU, which
/// compute each weight through float32 temporaries): a million, so a pass's temporaries stay
/// within [`GGML_DEVICE_SCRATCH_BYTES`] whatever the tensor.
pub const GGML_DEVICE_PASS_WEIGHTS: u64 = 1 << 20;

/// Device memory a GGML expansion pass holds beyond its output: at most 16 bytes a weight (its
/// float32 values, its codes widened, the bytes shifted out of its blocks and their scales).
/// Counted on a GPU when a hooked block holds GGML blocks; `scripts/gpu-check.sh` measures it.
pub const GGML_DEVICE_SCRATCH_BYTES: u64 = GGML_DEVICE_PASS_WEIGHTS * 16;

/// Streamed blocks staged ahead of the one that runs, unless a plan says otherwise.
pub const DEFAULT_LOOKAHEAD: usize = 2;

/// Device memory kept free for activations when no measured figure is given (1.5 GB).
pub const DEFAULT_HEADROOM_VRAM: u64 = 1_500_000_000;

/// The offset alignment of staged and expanded tensors: the CPU allocator's, or the CUDA
/// caching allocator's when a GPU computes.
pub const fn tensor_align(gpu: bool) -> usize {
    if gpu {
        DEVICE_TENSOR_ALIGN
    } else {
        TENSOR_ALIGN
    }
}

/// Whether disk-tier blocks are used in place from maps of the checkpoint (where
/// [`crate::rules::in_place_eligible`] allows): on the CPU, on Linux, whose `MADV_DONTNEED`
/// hands a block's pages back as soon as it has run. A GPU copies every block anyway, and
/// elsewhere a map's pages would stay in the process until the system trims them.
pub const fn maps_disk_tier(gpu: bool) -> bool {
    !gpu && cfg!(target_os = "linux")
}

/// Whether RAM-tier blocks are used in place from maps of the checkpoint, as disk-tier ones are
/// ([`maps_disk_tier`]): where the RAM tier is the checkpoint's map, not read into private
/// memory (`ram_in_memory`) nor converted to a storage dtype (its bytes are then not the
/// file's).
pub const fn maps_ram_tier(gpu: bool, ram_in_memory: bool, storage: Option<DType>) -> bool {
    maps_disk_tier(gpu) && !ram_in_memory && storage.is_none()
}

/// The per-tensor half of [`crate::rules::in_place_eligible`]: a 16-bit float anywhere, or any
/// dtype at an `align` offset of its file.
pub fn tensor_in_place_eligible(dtype: DType, start: u64, align: usize) -> bool {
    matches!(dtype, DType::BF16 | DType::F16) || start.is_multiple_of(align as u64)
}

/// Whether a tensor that the model only reads by rows (an embedding table) stays in a private
/// map of the checkpoint instead of being read into memory: a pass then brings in the pages of
/// the rows it looks up and no others, and the rest of the table costs no RAM. Where the disk
/// tier is used in place ([`maps_disk_tier`]), for a tensor that could be
/// ([`tensor_in_place_eligible`]: the same results as from its own memory, should
/// the model also multiply by it). The plan still counts the whole table as resident.
pub fn maps_lookup_table(gpu: bool, dtype: DType, start: u64) -> bool {
    maps_disk_tier(gpu) && tensor_in_place_eligible(dtype, start, tensor_align(gpu))
}

/// The staging buffer a block of `len` bytes needs: whole pages (O_DIRECT reads land in it), at
/// least one.
pub fn buffer_len(len: usize) -> usize {
    len.next_multiple_of(DIRECT_ALIGN).max(DIRECT_ALIGN)
}

/// The staging buffers a plan with a streamed block counts: the figure asked for
/// (`TRASH_PANDA_PINNED_BUFFERS`), else one per block staged ahead at the deepest the staging
/// may grow to ([`max_depth`]: the look-ahead unless `TRASH_PANDA_MAX_LOOKAHEAD` allows more)
/// plus the one that runs; at least one.
pub fn staging_buffers(asked: Option<usize>, depth: usize) -> usize {
    asked.unwrap_or(depth + 1).max(1)
}

/// The deepest the staging may grow where the compute waits for blocks: the figure asked for
/// (`TRASH_PANDA_MAX_LOOKAHEAD`), never below the plan's look-ahead; without one, the look-ahead
/// itself (a fixed depth, as before the depth followed the profile).
pub fn max_depth(lookahead: usize, asked: Option<usize>) -> usize {
    asked.map_or(lookahead, |m| m.max(lookahead))
}

/// The depth a `max_lookahead` setting asks for: 0 asks for none (the look-ahead stays fixed);
/// the one place where that reading of 0 is made.
pub fn asked_max_depth(setting: usize) -> Option<usize> {
    (setting > 0).then_some(setting)
}

/// The deepest the engine stages with `buffers` staging buffers: the plan's maximum, but never
/// more blocks ahead than the buffers hold beside the one that runs (a `pinned_buffers` figure
/// below the maximum caps the growth, so no byte the plan did not count is taken), and never less
/// than the look-ahead (a smaller pool with a deeper look-ahead stages as it always did).
pub fn depth_cap(lookahead: usize, max: usize, buffers: usize) -> usize {
    max.min(buffers.saturating_sub(1)).max(lookahead)
}

/// The staging buffers a `pinned_buffers` setting or argument asks for
/// (`TRASH_PANDA_PINNED_BUFFERS`): 0 asks for none in particular, leaving the count to the
/// look-ahead ([`staging_buffers`]); the one place where that reading of 0 is made.
pub fn asked_staging_buffers(setting: usize) -> Option<usize> {
    (setting > 0).then_some(setting)
}

/// The staging pool a pipeline shares among its stages, as each stage's plan counts it: the
/// pool's own figures (the same whichever stage streams), not the stage's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedStaging {
    /// How many staging buffers the pool holds.
    pub buffers: usize,
    /// Bytes of each buffer (whole pages).
    pub buffer_bytes: u64,
}

impl SharedStaging {
    /// Bytes of the pool.
    pub fn bytes(&self) -> u64 {
        self.buffers as u64 * self.buffer_bytes
    }
}

/// What the runtime holds beside the weights, as a plan counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Host staging buffers (pinned on CUDA) when a block streams, else 0: the plan's
    /// `staging_buffers` option (`TRASH_PANDA_PINNED_BUFFERS`), by default `lookahead + 1`.
    pub staging_buffers: usize,
    /// Bytes of each: the largest streamed block's staged bytes in its tier (tensors at aligned
    /// offsets, the disk tier's read area included), rounded up to whole pages.
    pub staging_buffer_bytes: u64,
    /// Device slots a staged block is copied into: one per staging buffer on a GPU, none on the
    /// CPU (the CPU computes from the staging buffers themselves).
    pub device_slots: usize,
    /// The expansion buffer: the largest expansion any hooked block needs in its tier.
    pub expansion_bytes: u64,
    /// The checkpoint pages the process maps for disk-tier blocks used in place: the largest
    /// such block's, runs rounded out to [`MAP_GRAIN`], and one [`MAP_GRAIN`] per look-ahead
    /// block being read in (0 when none is used in place).
    #[serde(default)]
    pub mapped_window_bytes: u64,
    /// The staging buffers are a pipeline's shared pool ([`SharedStaging`]): counted in this
    /// plan, but held by the pipeline, which counts them once for all its stages.
    #[serde(default)]
    pub shared_staging: bool,
    /// The pinned ring a loader reads resident weights into on a GPU ([`LOADER_RING_BYTES`]),
    /// 0 on the CPU, which reads them where they stay.
    #[serde(default)]
    pub loader_ring_bytes: u64,
    /// Device memory the GGML expansions' temporaries take on a GPU
    /// ([`GGML_DEVICE_SCRATCH_BYTES`] when a hooked block holds GGML blocks, else 0).
    #[serde(default)]
    pub device_scratch_bytes: u64,
}

impl Held {
    /// The figures for a largest streamed block of `largest_staged` bytes (`None`: nothing
    /// streams), a largest expansion of `expansion` bytes and `buffers` staging buffers
    /// ([`staging_buffers`]; at least one is kept when a block streams).
    pub fn new(largest_staged: Option<u64>, expansion: u64, buffers: usize, gpu: bool) -> Held {
        let buffers = largest_staged.map_or(0, |_| buffers.max(1));
        Held {
            staging_buffers: buffers,
            staging_buffer_bytes: largest_staged.map_or(0, |b| buffer_len(b as usize) as u64),
            device_slots: if gpu { buffers } else { 0 },
            expansion_bytes: expansion,
            mapped_window_bytes: 0,
            shared_staging: false,
            loader_ring_bytes: if gpu { LOADER_RING_BYTES } else { 0 },
            device_scratch_bytes: 0,
        }
    }

    /// The same figures with the device scratch of GGML expansions, when a hooked block holds
    /// GGML blocks and a GPU expands them.
    pub fn with_ggml_scratch(self, ggml: bool, gpu: bool) -> Held {
        Held {
            device_scratch_bytes: if ggml && gpu {
                GGML_DEVICE_SCRATCH_BYTES
            } else {
                0
            },
            ..self
        }
    }

    /// The same figures with `pool` as the staging buffers, whether or not a block streams: the
    /// pool is there all the while the stage runs. Device slots stay one per staging buffer
    /// where a block streams on a GPU.
    pub fn in_shared_pool(self, pool: SharedStaging, gpu: bool) -> Held {
        let streams = self.staging_buffers > 0;
        Held {
            staging_buffers: pool.buffers,
            staging_buffer_bytes: pool.buffer_bytes,
            device_slots: if gpu && streams { pool.buffers } else { 0 },
            shared_staging: true,
            ..self
        }
    }

    /// The same figures with the mapped window of a plan whose largest block used in place maps
    /// `largest_mapped` bytes: that block, and one huge page for each of the `lookahead` blocks
    /// the workers bring into the page cache meanwhile (a chunk at a time, each unmapped at once).
    pub fn with_mapped_window(self, largest_mapped: u64, lookahead: usize) -> Held {
        let ahead = if largest_mapped > 0 {
            lookahead as u64 * MAP_GRAIN
        } else {
            0
        };
        Held {
            mapped_window_bytes: largest_mapped + ahead,
            ..self
        }
    }

    /// Bytes of the host staging pool.
    pub fn host_staging(&self) -> u64 {
        self.staging_buffers as u64 * self.staging_buffer_bytes
    }

    /// Host RAM the runtime takes beside the weights: the staging pool, the mapped window and
    /// the loader's ring.
    pub fn host_ram(&self) -> u64 {
        self.host_staging() + self.mapped_window_bytes + self.loader_ring_bytes
    }

    /// Bytes of the device slots.
    pub fn device_slot_bytes(&self) -> u64 {
        self.device_slots as u64 * self.staging_buffer_bytes
    }
}

/// Bytes a patched block's image takes (a block with an adapter merged in, kept where the block
/// lives): its staged length, rounded up to whole pages in memory (the allocation's grain), as
/// it is in an overlay file.
pub const fn patched_image_bytes(block_len: u64, in_memory: bool) -> u64 {
    if in_memory {
        block_len.next_multiple_of(crate::io::DIRECT_ALIGN as u64)
    } else {
        block_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::SETTINGS;

    #[test]
    fn the_settings_table_states_the_same_defaults() {
        let default = |name: &str| SETTINGS.iter().find(|s| s.name == name).unwrap().default;
        assert_eq!(default("lookahead"), DEFAULT_LOOKAHEAD.to_string());
        // `pinned_buffers = 0` leaves the count to the look-ahead: one more than it.
        assert_eq!(default("pinned_buffers"), "0");
        assert_eq!(
            staging_buffers(None, DEFAULT_LOOKAHEAD),
            DEFAULT_LOOKAHEAD + 1
        );
        assert_eq!(staging_buffers(Some(0), 0), 1);
        assert_eq!(staging_buffers(Some(5), 2), 5);
        assert_eq!(
            staging_buffers(asked_staging_buffers(0), DEFAULT_LOOKAHEAD),
            DEFAULT_LOOKAHEAD + 1
        );
        assert_eq!(asked_staging_buffers(4), Some(4));
    }

    #[test]
    fn the_maximum_depth_is_counted_and_capped_by_the_buffers() {
        let default = |name: &str| SETTINGS.iter().find(|s| s.name == name).unwrap().default;
        // `max_lookahead = 0` leaves the depth fixed at the look-ahead: today's count.
        assert_eq!(default("max_lookahead"), "0");
        assert_eq!(max_depth(2, asked_max_depth(0)), 2);
        assert_eq!(staging_buffers(None, max_depth(2, None)), 3);
        // A maximum above the look-ahead is counted as buffers; one below it changes nothing.
        assert_eq!(max_depth(2, asked_max_depth(5)), 5);
        assert_eq!(staging_buffers(None, max_depth(2, Some(5))), 6);
        assert_eq!(max_depth(3, Some(1)), 3);
        // The engine never stages deeper than its buffers hold, nor shallower than asked.
        assert_eq!(depth_cap(2, 5, 6), 5);
        assert_eq!(depth_cap(2, 5, 4), 3);
        assert_eq!(depth_cap(2, 2, 3), 2);
        assert_eq!(depth_cap(2, 5, 1), 2);
    }

    #[test]
    fn staged_tensors_align_to_their_allocator() {
        assert_eq!(tensor_align(false), TENSOR_ALIGN);
        assert_eq!(tensor_align(true), DEVICE_TENSOR_ALIGN);
        assert_eq!(buffer_len(0), DIRECT_ALIGN);
        assert_eq!(buffer_len(DIRECT_ALIGN + 1), 2 * DIRECT_ALIGN);
    }
}

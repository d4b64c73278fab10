//! The rulebook every layer shares: the per-tensor and per-block rules that the planner, the
//! engine and (through the binding) Python all follow, kept in one place below them so that none
//! restates another's.
//!
//! - [`tier`]: the tiers a block can live in, their names, and a figure for each.
//! - [`tensor`]: what is known of one tensor ([`TensorSizes`]), the pairing of scale tensors
//!   with their weights, and the compute dtype a checkpoint's weights vote for.
//! - [`conversion`]: what `storage_dtype` does to a tensor, and which tensors are expanded to the
//!   compute dtype before their block runs (and where, in the expansion buffer).
//! - [`staging`]: the alignment of staged tensors, staging-buffer rounding, the map grain, the
//!   figures the runtime holds beside the weights ([`Held`]), and the defaults of the look-ahead,
//!   the staging buffers and the device headroom.
//! - [`block`]: what the engine is told of a streamed block ([`StreamBlock`]: its tier, and each
//!   tensor's file, range, dtype and shape).
//! - [`layout`]: the staged layout ([`StagedLayout`]): where each tensor of a block sits in a
//!   staging buffer, the runs a block is read in, and which disk-tier blocks run in place.
//! - [`figures`]: the staging, expansion and mapped bytes of one block ([`block_figures`]), from
//!   the same layout, so the planner counts a block as the engine stages it.
//! - [`run_order`]: how names become a run order (block keys, the named blocks first, then the
//!   others in plan order).
//!
//! Its one error type, [`RuleError`], is a layout the rules refuse; the engine reports it as its
//! own `StreamError` of the same name and message. Run-order mismatches are plain facts that
//! `order` turns into its errors or into an ignored order file.
//!
//! This module depends only on `dtype`, `io` (page alignment) and `checkpoint` (tensor
//! locations), and its tests on `settings` (the settings table states the same defaults).
//! `plan`, `stream`, `order` and `engine_config` depend on it, never the other way round (`stream`
//! re-exports the layout and the block description for the binding and the tools);
//! `tests/module_graph.rs` fails if any circle of imports across the core's top-level modules
//! comes back.

pub mod block;
pub mod conversion;
mod error;
pub mod figures;
pub mod layout;
pub mod run_order;
pub mod staging;
pub mod tensor;
pub mod tier;

pub use block::{is_row_order, SourceTier, StreamBlock, StreamTensor};
pub use conversion::{
    expansion_layout, needs_expansion, storage_conversion, stored_form, Conversion, ExpansionInput,
    FP8_MIN_ELEMENTS, STORAGE_DTYPES,
};
pub use error::RuleError;
pub use figures::{block_figures, BlockFigures};
pub use layout::{in_place_eligible, StagedLayout, StagedScale, StagedTensor, MERGE_GAP};
pub use staging::{
    asked_max_depth, asked_staging_buffers, buffer_len, depth_cap, maps_disk_tier,
    maps_lookup_table, maps_ram_tier, max_depth, patched_image_bytes, staging_buffers,
    tensor_align, tensor_in_place_eligible, Held, SharedStaging, DEFAULT_HEADROOM_VRAM,
    DEFAULT_LOOKAHEAD, DEVICE_TENSOR_ALIGN, GGML_DEVICE_PASS_WEIGHTS, GGML_DEVICE_SCRATCH_BYTES,
    LOADER_RING_BYTES, LOADER_RING_SLACK, LOAD_GROUP_BYTES, MAP_GRAIN, TENSOR_ALIGN,
};
pub use tensor::{
    infer_compute_dtype, is_scale_name, paired_scale, paired_scale_where, weight_of_scale,
    TensorLocation, TensorSizes, SCALE_SUFFIXES,
};
pub use tier::{tier_aliases, ByTier, Tier, TIER_NAMES};

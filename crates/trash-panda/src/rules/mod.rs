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
//!
//! This module depends only on `dtype`, `io` (page alignment) and `checkpoint` (tensor
//! locations), and its tests on `config` (the settings table states the same defaults). `plan`,
//! `stream` and `engine_config` depend on it, never the other way round; `tests/module_graph.rs`
//! fails if any circle of imports across the core's top-level modules comes back.
//!
//! Not here yet: the staged layout itself (`stream::StagedLayout`) and the block figures built on
//! it (`stream::block_figures`), and run-order composition (`order`).

pub mod conversion;
pub mod staging;
pub mod tensor;
pub mod tier;

pub use conversion::{
    expansion_layout, needs_expansion, storage_conversion, stored_form, Conversion, ExpansionInput,
    FP8_MIN_ELEMENTS,
};
pub use staging::{
    asked_staging_buffers, buffer_len, maps_disk_tier, maps_lookup_table, staging_buffers,
    tensor_align, tensor_in_place_eligible, Held, DEFAULT_HEADROOM_VRAM, DEFAULT_LOOKAHEAD,
    DEVICE_TENSOR_ALIGN, MAP_GRAIN, TENSOR_ALIGN,
};
pub use tensor::{
    infer_compute_dtype, is_scale_name, paired_scale, paired_scale_where, weight_of_scale,
    TensorLocation, TensorSizes, SCALE_SUFFIXES,
};
pub use tier::{ByTier, Tier};

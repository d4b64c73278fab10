//! The planner: which block of a model lives on the device, in RAM or on disk.
//!
//! [`plan`] takes the blocks of a checkpoint ([`ModelBlocks`]), the memory figures of the
//! machine ([`Figures`], always given by the caller so a plan is reproducible) and the options
//! ([`PlanOptions`]), and returns a [`Plan`]. The same inputs always give the same plan.

mod assign;
mod blocks;
mod budget;
mod edit;
#[cfg(test)]
mod fit_props;
mod json;
pub(crate) mod near;
mod options;
mod table;
pub use table::PlanTable;
mod warnings;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use assign::plan;
pub use blocks::{check_block_prefixes, BlockTensors, ModelBlocks};
pub use budget::{Budgets, CUDA_CONTEXT_FLOOR};
pub use edit::Selector;
pub use json::{PLAN_FORMAT, PLAN_VERSION};
pub use options::{ComputeDevice, Figures, MinFreeRam, PlanOptions};
pub use warnings::{Warning, WarningKind};

// The shared rules a plan is made by, at the paths the planner's users know them by.
pub use crate::rules::{
    infer_compute_dtype, storage_conversion, Conversion, SharedStaging, TensorLocation,
    TensorSizes, Tier, FP8_MIN_ELEMENTS, SCALE_SUFFIXES,
};

use crate::checkpoint::CheckpointError;
use crate::rules::ByTier;

impl std::str::FromStr for Tier {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        Tier::parse(s).ok_or_else(|| PlanError::UnknownTier {
            name: s.to_string(),
        })
    }
}

/// One block of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockPlan {
    /// The block's name prefix, e.g. `model.layers.12.`.
    pub name: String,
    /// Where the block lives between uses.
    pub tier: Tier,
    /// Bytes in the tier's form: the checkpoint's bytes on disk, the storage dtype's in RAM and
    /// on the device.
    pub stored_bytes: u64,
    /// Bytes in the checkpoint file.
    pub file_bytes: u64,
    /// Bytes once loaded in the storage dtype (equal to `file_bytes` without `storage_dtype`).
    pub storage_bytes: u64,
    /// Bytes of the block expanded to the compute dtype, scale tensors dropped.
    pub expanded_bytes: u64,
    /// Staging-buffer bytes the block needs when streamed from RAM or disk (tensors at aligned
    /// offsets, the disk tier's read area included); what the engine lays out.
    #[serde(default)]
    pub staging: ByTier,
    /// Bytes of the expansion buffer the block needs in each tier: its tensors that are not in
    /// the compute dtype (or carry a scale), expanded at aligned offsets; the rest are used in
    /// place.
    #[serde(default)]
    pub expansion: ByTier,
    /// Bytes of the checkpoint's pages the block maps while it runs in place from the disk tier
    /// (on the CPU); 0 when it is staged there.
    #[serde(default)]
    pub mapped: u64,
    /// How many tensors the block holds.
    pub tensors: usize,
    /// An adapter is merged into the block ([`PlanOptions::merged_modules`]): on the CPU it is
    /// kept merged in an image where the block lives. Written only when set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub merged: bool,
    /// Bytes of the block's image, merged, in each tier (see [`crate::rules::BlockFigures`]).
    #[serde(default)]
    pub image: ByTier,
    /// A RAM-tier block used in place: its image is a file it maps, in the page cache.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ram_in_place: bool,
    /// It holds GGML blocks (a GGUF file's, or `storage_dtype="q8_0"`'s), which a GPU expands
    /// with temporaries of its own (`Held::device_scratch_bytes`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ggml: bool,
}

/// The weights outside the blocks (embeddings, final norm, heads): always resident.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsidePlan {
    /// How many tensors lie outside the blocks.
    pub tensors: usize,
    /// Their bytes in the checkpoint file.
    pub file_bytes: u64,
    /// Counted on the device in the compute dtype: these weights are used as they are, every pass.
    pub expanded_bytes: u64,
    /// A few of their names, for the table.
    pub names: Vec<String>,
    /// What making a merge takes while it is made ([`PlanOptions::merged_modules`]): the merged
    /// layer's weight copied and the adapter's `ΔW`, twice the largest merged weight in the
    /// compute dtype, where the model computes; counted beside these weights (absent in older
    /// files: 0).
    #[serde(default)]
    pub merge_work: u64,
}

/// A plan: every block's tier, the budgets, and what it was made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Every block, in plan order (the model's block order).
    pub blocks: Vec<BlockPlan>,
    /// The weights outside the blocks.
    pub outside: OutsidePlan,
    /// True for a plan written by hand with [`Plan::manual`].
    pub manual: bool,
    /// False for a manual plan not yet matched against a model (see [`Plan::resolve`]): its
    /// blocks are the prefixes the user gave and it has no sizes, figures or budgets.
    pub resolved: bool,
    /// The machine's memory figures the plan was made for; `None` for an unresolved manual plan.
    pub figures: Option<Figures>,
    /// The options the plan was made with.
    pub options: PlanOptions,
    /// What each tier may hold and what the runtime holds beside the weights; `None` for an
    /// unresolved manual plan.
    pub budgets: Option<Budgets>,
    /// What the planner wants the user to know about this plan (it still made it).
    pub warnings: Vec<Warning>,
}

/// Errors of the planner.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Opening or reading the checkpoint's headers failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A block prefix given for the model matches no tensor of the checkpoint.
    ///
    /// What to do: use a prefix of the checkpoint's tensor names, trailing dot included (the
    /// message lists near names); with `key_map`, the model's names.
    #[error("block prefix {prefix:?} matches no tensor{}", near_list(near))]
    UnknownPrefix {
        /// The prefix, with its trailing dot.
        prefix: String,
        /// Up to three tensor names close to it, for the message.
        near: Vec<String>,
    },
    /// A prefix given to edit a plan (or in a manual plan's lists) matches no block of it.
    ///
    /// What to do: name a block the plan has (`print(plan)` lists them; the message lists near
    /// ones).
    #[error("block prefix {prefix:?} matches no block{}", near_list(near))]
    NoBlockMatches {
        /// The prefix as given.
        prefix: String,
        /// Up to three block names close to it, for the message.
        near: Vec<String>,
    },
    /// A block index given to edit a plan is past its last block.
    ///
    /// What to do: block positions count from 0 to the number of blocks minus one.
    #[error("block index {index} is out of range: the plan has {count} blocks")]
    IndexOutOfRange {
        /// The index given, from 0.
        index: usize,
        /// Blocks in the plan.
        count: usize,
    },
    /// Two entries of one selection, one prefix list or one manual plan name the same block.
    ///
    /// What to do: name each block once: drop one of the two entries the message shows.
    #[error("block {block:?} is named twice ({first:?} and {second:?})")]
    NamedTwice {
        /// The block named twice.
        block: String,
        /// The entry that named it first, as given.
        first: String,
        /// The entry that named it again, as given.
        second: String,
    },
    /// One block prefix contains another (`blocks.` and `blocks.1.`), so a tensor would belong
    /// to two blocks.
    ///
    /// What to do: give prefixes of one level: `blocks.1.` and `blocks.2.`, or `blocks.` alone, not
    /// both.
    #[error("block prefixes {first:?} and {second:?} overlap: one contains the other")]
    OverlappingPrefixes {
        /// The prefix given earlier.
        first: String,
        /// The prefix given later.
        second: String,
    },
    /// A block prefix is empty or only a dot.
    ///
    /// What to do: give a module's name with its trailing dot, such as `"model.layers.0."`.
    #[error("empty block prefix: a prefix names a module, e.g. \"blocks.0.\"")]
    EmptyPrefix,
    /// Resolving a manual plan left blocks of the model in none of its tier lists.
    ///
    /// What to do: a manual plan must put every block in a list: add the blocks the message names
    /// to `device`, `ram` or `disk`.
    #[error("{count} block(s) are in no list of the manual plan: {}", names.join(", "))]
    Unassigned {
        /// How many blocks are left out.
        count: usize,
        /// Their names (all of them).
        names: Vec<String>,
    },
    /// A tier name is not a tier or one of its aliases.
    ///
    /// What to do: use `"device"`, `"ram"` or `"disk"` (or an alias the message lists), or a
    /// `Tier`.
    #[error(
        "unknown tier {name:?}: expected device, ram or disk (or an alias: {})",
        crate::rules::tier_aliases()
    )]
    UnknownTier {
        /// The name as given.
        name: String,
    },
    /// The compute dtype asked for is not f32, f16 or bf16.
    ///
    /// What to do: pass `compute_dtype=` as `torch.float32`, `torch.float16` or `torch.bfloat16`.
    #[error("compute dtype {dtype} is not supported: expected f32, f16 or bf16")]
    ComputeDtype {
        /// The dtype asked for.
        dtype: crate::DType,
    },
    /// The storage dtype asked for is not one the engine converts to.
    ///
    /// What to do: pass `storage_dtype=` as `"bf16"`, `"fp8"`, `"int8"` or `"q8_0"`, or leave it
    /// out to keep the weights as stored.
    #[error("storage dtype {dtype} is not supported: expected bf16, fp8 (e4m3fn), int8 or q8_0, or none to keep weights as stored")]
    StorageDtype {
        /// The dtype asked for.
        dtype: crate::DType,
    },
    /// Plan JSON that is not JSON, not of [`PLAN_FORMAT`], or has a field missing or wrong.
    ///
    /// What to do: the file is not a plan written by `Plan.save()` (or it was edited into another
    /// shape): save the plan again.
    #[error("not a trash-panda plan: {reason}")]
    Json {
        /// What is wrong, in words.
        reason: String,
    },
    /// A plan file of a [`PLAN_VERSION`] this build does not read.
    ///
    /// What to do: the plan was saved by another version of trash-panda: make the plan again with
    /// this one.
    #[error("plan format version {found} is not supported: this build reads version {supported}")]
    Version {
        /// The version the file gives.
        found: u64,
        /// The version this build reads.
        supported: u64,
    },
    /// A plan file could not be read.
    ///
    /// What to do: check the plan file's path and permissions.
    #[error("cannot read plan file {path}: {source}")]
    Io {
        /// The plan file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

fn near_list(near: &[String]) -> String {
    if near.is_empty() {
        String::new()
    } else {
        format!("; near names: {}", near.join(", "))
    }
}

impl Plan {
    /// The dtype the blocks compute in.
    pub fn compute_dtype(&self) -> crate::DType {
        self.options.compute()
    }

    /// The tier of the block named exactly `block` (its full prefix, trailing dot included);
    /// `None` when no block has that name.
    pub fn tier_of(&self, block: &str) -> Option<Tier> {
        self.blocks.iter().find(|b| b.name == block).map(|b| b.tier)
    }

    /// The names of the blocks in a tier, in block order.
    pub fn blocks_in(&self, tier: Tier) -> Vec<&str> {
        self.blocks
            .iter()
            .filter(|b| b.tier == tier)
            .map(|b| b.name.as_str())
            .collect()
    }

    /// The shared staging pool this plan's blocks need in whichever tiers they are put: a
    /// pipeline sizes its pool by the largest of its stages', and a stage planned with a pool at
    /// least this large ([`PlanOptions::staging_pool`]) counts it as its staging buffers.
    pub fn shared_staging(&self) -> SharedStaging {
        budget::shared_staging(&self.blocks, &self.options)
    }

    /// Total bytes of a tier, in the tier's form.
    pub fn tier_bytes(&self, tier: Tier) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.tier == tier)
            .map(|b| b.stored_bytes)
            .sum()
    }
}

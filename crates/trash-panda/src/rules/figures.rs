//! What one block holds while it is streamed or run: its staging-buffer bytes in each tier and
//! its expansion buffer, from the same layout code the engine stages it with. The planner counts
//! a block by these figures and the engine configuration sizes the runtime from the plan's.

use super::block::{SourceTier, StreamBlock, StreamTensor};
use super::conversion::{expansion_layout, stored_form, ExpansionInput};
use super::layout::StagedLayout;
use super::tensor::{paired_scale, TensorSizes};
use super::tier::ByTier;
use crate::DType;

/// The staging and expansion figures of one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFigures {
    /// Staging-buffer bytes the block needs when streamed from each tier (0 for the device).
    pub staging: ByTier,
    /// Expansion-buffer bytes the block needs in each tier.
    pub expansion: ByTier,
    /// Bytes of the checkpoint's pages the block maps while it runs in place from the disk tier
    /// (see [`super::in_place_eligible`]); 0 when it is staged.
    pub mapped: u64,
    /// Bytes of the block's patched image (an adapter merged in, kept where the block lives;
    /// [`StagedLayout::image_places`]) in each tier.
    pub image: ByTier,
    /// Whether a RAM-tier block is used in place (its image is then a file it maps).
    pub ram_in_place: bool,
}

/// The figures of a block of `tensors` (a checkpoint's, scale tensors included) for an engine
/// with these dtypes and alignment, that uses disk-tier blocks in place if `in_place` (see
/// [`crate::rules::maps_disk_tier`]) and RAM-tier ones if `ram_in_place`
/// ([`crate::rules::maps_ram_tier`]). Tensors without a location are taken as lying one after
/// the other, from offset 0, in the first file.
pub fn block_figures(
    name: &str,
    tensors: &[TensorSizes],
    compute: DType,
    storage: Option<DType>,
    align: usize,
    in_place: bool,
    ram_in_place: bool,
) -> BlockFigures {
    let names = || tensors.iter().map(|t| t.name.as_str());
    let weights: Vec<&TensorSizes> = tensors.iter().filter(|t| !t.is_scale()).collect();
    let expansion = |form: &dyn Fn(&TensorSizes) -> (DType, bool)| {
        let inputs: Vec<ExpansionInput> = weights
            .iter()
            .map(|t| {
                let (held, own_scale) = form(t);
                ExpansionInput {
                    held,
                    elements: t.numel(),
                    scaled: own_scale || paired_scale(&t.name, names()).is_some(),
                    reordered: t.reordered,
                }
            })
            .collect();
        expansion_layout(&inputs, compute, align).1
    };
    let stored = expansion(&|t| stored_form(t, storage));
    let layout = |tier: SourceTier| {
        let block = stream_block(name, tier, tensors);
        let files = block.tensors.iter().map(|t| t.file + 1).max().unwrap_or(1);
        // Sizes were checked against dtype and shape when the tensors were read; a block the
        // layout refuses cannot be streamed, and the engine reports why when it is made.
        StagedLayout::build_in_place(&[block], files, storage, align, in_place, ram_in_place).ok()
    };
    let staging = |l: &Option<StagedLayout>| l.as_ref().map_or(0, |l| l.block_len(0) as u64);
    let image = |l: &Option<StagedLayout>| l.as_ref().map_or(0, |l| l.image_places(0).1 as u64);
    let (ram, disk) = (layout(SourceTier::Ram), layout(SourceTier::Disk));
    BlockFigures {
        mapped: disk.as_ref().map_or(0, |l| l.mapped_bytes(0)),
        image: ByTier {
            device: 0,
            ram: image(&ram),
            disk: image(&disk),
        },
        ram_in_place: ram.as_ref().is_some_and(|l| l.is_in_place(0)),
        staging: ByTier {
            device: 0,
            ram: staging(&ram),
            disk: staging(&disk),
        },
        expansion: ByTier {
            device: stored,
            ram: stored,
            disk: expansion(&|t| (t.dtype, false)),
        },
    }
}

/// The stream block of `tensors` as the engine would be given it.
fn stream_block(name: &str, tier: SourceTier, tensors: &[TensorSizes]) -> StreamBlock {
    let mut next = 0u64;
    let tensors = tensors
        .iter()
        .map(|t| {
            let (file, start) = t.location.map_or((0, next), |l| (l.file, l.start));
            next = start + t.file_bytes;
            StreamTensor {
                name: t.name.clone(),
                file,
                start,
                end: start + t.file_bytes,
                dtype: t.dtype,
                shape: t.shape.clone(),
                // The planner needs only that the rows are reordered, not how.
                rows: t
                    .reordered
                    .then(|| (0..t.shape.first().copied().unwrap_or(1) as u32).collect()),
            }
        })
        .collect();
    StreamBlock {
        name: name.to_owned(),
        tier,
        tensors,
    }
}

//! What one block holds while it is streamed or run: its staging-buffer bytes in each tier and
//! its expansion buffer, from the same layout code the engine and the backends use.

use serde::{Deserialize, Serialize};

use crate::dtype::{classify_scale, DType, DtypeError, ScaleLayout, SCALE_BLOCK};
use crate::plan::{storage_conversion, Conversion, TensorSizes, Tier, SCALE_SUFFIXES};
use crate::stream::{SourceTier, StagedLayout, StreamBlock, StreamTensor};

/// A figure for each tier a block can be in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByTier {
    pub device: u64,
    pub ram: u64,
    pub disk: u64,
}

impl ByTier {
    pub fn get(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Device => self.device,
            Tier::Ram => self.ram,
            Tier::Disk => self.disk,
        }
    }

    /// The larger of the two streamed tiers: what a block may need before its tier is decided.
    pub fn streamed(&self) -> u64 {
        self.ram.max(self.disk)
    }
}

/// The scale tensor of weight `name` among `names`: `<layer>.weight` pairs with
/// `<layer>.weight_scale`, `<layer>.scale_weight` or `<layer>.weight_scale_inv`, first found
/// (`input_scale` scales activations and is never applied to a weight).
pub fn paired_scale<'a>(
    name: &str,
    names: impl Iterator<Item = &'a str> + Clone,
) -> Option<&'a str> {
    let stem = name.strip_suffix(".weight")?;
    SCALE_SUFFIXES[..3].iter().find_map(|suffix| {
        names.clone().find(|n| {
            n.len() == stem.len() + suffix.len() && n.starts_with(stem) && n.ends_with(suffix)
        })
    })
}

/// Whether a weight held as `held` (its dtype in the tier) is expanded into the expansion buffer
/// before its block runs, rather than used in place: a float tensor in another dtype than the
/// compute dtype, or one with a scale to apply. The CPU and CUDA backends follow this rule and
/// the planner counts by it.
pub fn needs_expansion(held: DType, compute: DType, scaled: bool) -> bool {
    held.is_float() && (held != compute || scaled)
}

/// One tensor as the expansion layout sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpansionInput {
    /// The dtype the tensor is held in (file, or storage dtype).
    pub held: DType,
    pub elements: u64,
    /// Whether a scale applies (a checkpoint scale tensor, or per-row scales from a storage
    /// conversion to fp8).
    pub scaled: bool,
}

/// Where each expanded tensor of a block goes in the expansion buffer (`None`: used in place),
/// and the bytes the block needs: tensors in the compute dtype, one after the other, each taking
/// whole `align` units so that the total does not depend on the order of the tensors.
pub fn expansion_layout(
    tensors: &[ExpansionInput],
    compute: DType,
    align: usize,
) -> (Vec<Option<u64>>, u64) {
    let mut end = 0u64;
    let offsets = tensors
        .iter()
        .map(|t| {
            needs_expansion(t.held, compute, t.scaled).then(|| {
                let at = end;
                end += (t.elements * compute.size() as u64).next_multiple_of(align as u64);
                at
            })
        })
        .collect();
    (offsets, end)
}

/// The dtype a tensor is held in on the device and in RAM after `storage_dtype`, and whether the
/// conversion gave it per-row scales.
fn stored_form(t: &TensorSizes, storage: Option<DType>) -> (DType, bool) {
    match storage.map(|s| storage_conversion(t, s)) {
        None | Some(Conversion::Keep) => (t.dtype, false),
        Some(Conversion::ToBf16) => (DType::BF16, false),
        Some(Conversion::ToFp8 { .. }) => (DType::F8E4M3, true),
    }
}

/// The staging and expansion figures of one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFigures {
    /// Staging-buffer bytes the block needs when streamed from each tier (0 for the device).
    pub staging: ByTier,
    /// Expansion-buffer bytes the block needs in each tier.
    pub expansion: ByTier,
    /// Bytes of the checkpoint's pages the block maps while it runs in place from the disk tier
    /// (see [`crate::stream::in_place_eligible`]); 0 when it is staged.
    pub mapped: u64,
}

/// The figures of a block of `tensors` (a checkpoint's, scale tensors included) for an engine
/// with these dtypes and alignment, that uses disk-tier blocks in place if `in_place` (see
/// [`super::maps_disk_tier`]). Tensors without a location are taken as lying one after the
/// other, from offset 0, in the first file.
pub fn block_figures(
    name: &str,
    tensors: &[TensorSizes],
    compute: DType,
    storage: Option<DType>,
    align: usize,
    in_place: bool,
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
        StagedLayout::build(&[block], files, storage, align, in_place).ok()
    };
    let staging = |l: &Option<StagedLayout>| l.as_ref().map_or(0, |l| l.block_len(0) as u64);
    let disk = layout(SourceTier::Disk);
    BlockFigures {
        mapped: disk.as_ref().map_or(0, |l| l.mapped_bytes(0)),
        staging: ByTier {
            device: 0,
            ram: staging(&layout(SourceTier::Ram)),
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
            }
        })
        .collect();
    StreamBlock {
        name: name.to_owned(),
        tier,
        tensors,
    }
}

/// The scale layout of weight `weight` (of shape `shape`) scaled by tensor `scale` (of shape
/// `scale_shape`), for the 128x128 tiles checkpoints use.
pub fn scale_layout(
    scale: &str,
    shape: &[usize],
    scale_shape: &[usize],
) -> Result<ScaleLayout, DtypeError> {
    classify_scale(scale, shape, scale_shape, SCALE_BLOCK)
}

/// Where the scale of a staged tensor comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleSource {
    /// Per-row scales the engine made when it quantized the tensor on load.
    Own,
    /// A checkpoint scale tensor of the same block, by its index in the block's layout.
    Tensor(usize),
}

/// What the backends do with one staged tensor before its block runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorWork {
    /// The scale to apply, and how it is laid out.
    pub scale: Option<(ScaleSource, ScaleLayout)>,
    /// Offset in the expansion buffer; `None`: the tensor is used in place (or is a scale).
    pub expand_at: Option<u64>,
    /// Whether this tensor is a checkpoint scale tensor (consumed by its weight's expansion).
    pub is_scale: bool,
}

/// The work of every tensor of a staged block (`layout`), for blocks computing in `compute`
/// with expansions at `align` offsets: the same rule the planner counts by.
pub fn staged_work(
    layout: &[crate::stream::StagedTensor],
    compute: DType,
    align: usize,
) -> Result<Vec<TensorWork>, DtypeError> {
    let names = || layout.iter().map(|t| t.name.as_str());
    let is_scale = |name: &str| SCALE_SUFFIXES.iter().any(|s| name.ends_with(s));
    let mut scales = Vec::with_capacity(layout.len());
    for t in layout {
        let scale = if t.scale.is_some() {
            Some((ScaleSource::Own, ScaleLayout::Row))
        } else if let Some(s) = paired_scale(&t.name, names()) {
            let i = layout.iter().position(|x| x.name == s).unwrap_or(0);
            Some((
                ScaleSource::Tensor(i),
                classify_scale(s, &t.shape, &layout[i].shape, SCALE_BLOCK)?,
            ))
        } else {
            None
        };
        scales.push(scale);
    }
    let inputs: Vec<ExpansionInput> = layout
        .iter()
        .zip(&scales)
        .map(|(t, scale)| ExpansionInput {
            // A scale tensor is never expanded: it counts as an integer would.
            held: if is_scale(&t.name) {
                DType::U8
            } else {
                t.dtype
            },
            elements: t.shape.iter().product::<usize>() as u64,
            scaled: scale.is_some(),
        })
        .collect();
    let (offsets, _) = expansion_layout(&inputs, compute, align);
    Ok(layout
        .iter()
        .zip(scales)
        .zip(offsets)
        .map(|((t, scale), expand_at)| TensorWork {
            scale,
            expand_at,
            is_scale: is_scale(&t.name),
        })
        .collect())
}

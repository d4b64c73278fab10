//! What the backends do with each tensor of a staged block before it runs: which scale applies,
//! how it is laid out, and where the tensor is expanded; the rules of [`crate::rules`] applied to
//! the engine's staged layout.

use crate::dtype::{classify_scale, DType, DtypeError, ScaleLayout, SCALE_BLOCK};
use crate::rules::StagedTensor;
use crate::rules::{expansion_layout, is_scale_name, paired_scale, ExpansionInput};

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
    layout: &[StagedTensor],
    compute: DType,
    align: usize,
) -> Result<Vec<TensorWork>, DtypeError> {
    let names = || layout.iter().map(|t| t.name.as_str());
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
            held: if is_scale_name(&t.name) {
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
            is_scale: is_scale_name(&t.name),
        })
        .collect())
}

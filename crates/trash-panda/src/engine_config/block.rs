//! What the backends do with each tensor of a staged block before it runs: which scale applies,
//! how it is laid out, and where the tensor is expanded; the rules of [`crate::rules`] applied to
//! the engine's staged layout.

use crate::dtype::{self, classify_scale, DType, DtypeError, Scale, ScaleLayout, SCALE_BLOCK};
use crate::rules::{expansion_layout, is_scale_name, paired_scale, ExpansionInput, StagedTensor};
use crate::stream::{Lease, StreamError};

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
            reordered: t.rows.is_some(),
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

/// The scale a staged tensor is expanded with, read from its leased block: its values as f32
/// and how they apply (no layout: no scale).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScaleValues {
    /// How the values apply; `None`: the tensor has no scale.
    pub layout: Option<ScaleLayout>,
    /// The scale values, as f32, in the layout's order.
    pub values: Vec<f32>,
}

impl ScaleValues {
    /// The scale as the kernels take it: one value for the tensor (1 when none was staged), one
    /// per row, or one per [`SCALE_BLOCK`] x [`SCALE_BLOCK`] tile.
    pub fn scale(&self) -> Scale<'_> {
        match self.layout {
            None => Scale::None,
            Some(ScaleLayout::Tensor) => {
                Scale::PerTensor(self.values.first().copied().unwrap_or(1.0))
            }
            Some(ScaleLayout::Row) => Scale::PerRow(&self.values),
            Some(ScaleLayout::Block) => Scale::Block {
                scales: &self.values,
                block: SCALE_BLOCK,
            },
        }
    }
}

/// Why the scale of a staged tensor could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ScaleReadError {
    /// The lease could not give the scale's bytes (a tensor the block does not hold, or a map
    /// of a block used in place that failed).
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The checkpoint scale tensor's values could not be made f32.
    ///
    /// What to do: the checkpoint's scale tensor is not in a float dtype: the checkpoint is of a
    /// kind the library does not read. Report it with the model's name.
    #[error("tensor {tensor}: {source}")]
    Dtype {
        /// The scale tensor's name.
        tensor: String,
        /// Why the values could not be converted.
        #[source]
        source: DtypeError,
    },
}

/// The scale tensor `index` of a leased block is expanded with, by `work` (the block's
/// [`staged_work`]): the per-row scales the engine made quantizing it on load
/// ([`ScaleSource::Own`]), or the values of the block's checkpoint scale tensor
/// ([`ScaleSource::Tensor`]) as f32, laid out per tensor, per row or per tile. `index` is a
/// position in the block's layout (as `work` is).
pub fn leased_scale(
    lease: &Lease,
    work: &[TensorWork],
    index: usize,
) -> Result<ScaleValues, ScaleReadError> {
    let Some((source, layout)) = work[index].scale else {
        return Ok(ScaleValues::default());
    };
    let values = match source {
        ScaleSource::Own => f32_values(lease.scale(index)?.unwrap_or(&[])),
        ScaleSource::Tensor(i) => {
            let bytes = lease.tensor(i)?;
            let dtype = lease.layout()[i].dtype;
            as_f32(bytes, dtype).map_err(|source| ScaleReadError::Dtype {
                tensor: lease.layout()[index].name.clone(),
                source,
            })?
        }
    };
    Ok(ScaleValues {
        layout: Some(layout),
        values,
    })
}

/// Little-endian f32 values of a byte slice (a partial trailing value is ignored).
fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Scale values stored as `dtype`, as f32.
fn as_f32(bytes: &[u8], dtype: DType) -> Result<Vec<f32>, DtypeError> {
    if dtype == DType::F32 {
        return Ok(f32_values(bytes));
    }
    let mut out = vec![0u8; bytes.len() / dtype.size() * 4];
    dtype::cast(bytes, dtype, &mut out, DType::F32, 1)?;
    Ok(f32_values(&out))
}

//! What the engine is told of a streamed block, and what the layout lays out: the tier it waits
//! in between passes and, for each tensor, its file, byte range, dtype and shape.

use crate::DType;

/// Where a streamed block waits between passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceTier {
    /// Held in host RAM (in private memory or mapped from the file) between passes.
    Ram,
    /// Read from the checkpoint file for each pass.
    Disk,
}

/// One tensor of a streamed block: bytes `start..end` of file `file` (an index into the engine's
/// files), holding `shape` elements of `dtype` (checked against the range when the engine is
/// made; the storage conversion needs both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTensor {
    /// The tensor's name in the checkpoint.
    pub name: String,
    /// Index into the list of files the engine was made with.
    pub file: usize,
    /// Byte offset of the tensor's first byte in that file (from the file's start, not from the
    /// end of the safetensors header).
    pub start: u64,
    /// Byte offset one past the tensor's last byte; `end - start` must equal the bytes of
    /// `shape` elements of `dtype`.
    pub end: u64,
    /// The dtype of the bytes in the file.
    pub dtype: DType,
    /// Elements along each dimension, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// The order the model takes the rows in, when it is not the file's: row `r` of the weight is
    /// row `rows[r]` of the stored tensor (GGUF stores the attention projections of Llama-family
    /// models with their rows permuted). Such a tensor is always expanded.
    pub rows: Option<Vec<u32>>,
}

/// Whether `rows` can be the row order of a tensor of `shape` ([`StreamTensor::rows`]): the
/// tensor has rows (two dimensions or more) and `rows` names a stored row for each of them.
pub fn is_row_order(shape: &[usize], rows: &[u32]) -> bool {
    let stored = shape.first().copied().unwrap_or(1);
    shape.len() >= 2 && rows.len() == stored && rows.iter().all(|&r| (r as usize) < stored)
}

/// A block whose weights are staged before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamBlock {
    /// The block's key (e.g. `model.layers.3`), as the plan and the run order name it.
    pub name: String,
    /// Where the block waits between passes.
    pub tier: SourceTier,
    /// Its tensors, in the order the block's description lists them.
    pub tensors: Vec<StreamTensor>,
}

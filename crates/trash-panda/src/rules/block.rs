//! What the engine is told of a streamed block, and what the layout lays out: the tier it waits
//! in between passes and, for each tensor, its file, byte range, dtype and shape.

use crate::DType;

/// Where a streamed block waits between passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceTier {
    Ram,
    Disk,
}

/// One tensor of a streamed block: bytes `start..end` of file `file` (an index into the engine's
/// files), holding `shape` elements of `dtype` (checked against the range when the engine is
/// made; the storage conversion needs both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTensor {
    pub name: String,
    pub file: usize,
    pub start: u64,
    pub end: u64,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// A block whose weights are staged before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamBlock {
    pub name: String,
    pub tier: SourceTier,
    pub tensors: Vec<StreamTensor>,
}

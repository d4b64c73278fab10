//! One tensor of a checkpoint: where its bytes are and what they hold.

use serde::Serialize;

use crate::dtype::DType;

/// A tensor as described by a safetensors header, resolved to an absolute byte range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorInfo {
    /// The tensor's name in the checkpoint, e.g. `model.layers.3.mlp.up_proj.weight`.
    pub name: String,
    /// The dtype of the bytes in the file.
    pub dtype: DType,
    /// Elements along each dimension, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// Index into [`Checkpoint::files`](super::Checkpoint::files).
    pub file: usize,
    /// Absolute offset of the first byte in the file (header included).
    pub start: u64,
    /// Absolute offset one past the last byte.
    pub end: u64,
}

impl TensorInfo {
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of bytes of the tensor's data.
    pub fn nbytes(&self) -> u64 {
        // Saturating: a hand-built TensorInfo with end < start must not panic.
        self.end.saturating_sub(self.start)
    }
}

//! Safetensors checkpoints: header parsing and validation, sharded checkpoints, the tensor index.

mod tensor;

pub use tensor::TensorInfo;

use std::path::PathBuf;

/// Errors of the checkpoint module.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// An opened checkpoint: one file, or the shards of a sharded checkpoint, with one tensor index.
#[derive(Debug)]
pub struct Checkpoint {
    files: Vec<PathBuf>,
    tensors: Vec<TensorInfo>,
}

impl Checkpoint {
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
}

//! Safetensors checkpoints: header parsing and validation, sharded checkpoints, the tensor index.

mod tensor;

pub use tensor::TensorInfo;

use std::path::{Path, PathBuf};

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
    /// Opens a `.safetensors` file, a `*.safetensors.index.json`, or a folder of shards.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        Err(CheckpointError::Invalid {
            path: path.as_ref().to_path_buf(),
            message: "checkpoint reading is not built yet".into(),
        })
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
}

//! trash-panda core: reads safetensors and GGUF checkpoints, moves their bytes between disk, RAM
//! and staging buffers, converts dtypes, and plans which block of a model lives in which tier.
//!
//! This crate knows nothing of Python or torch; the binding and the CLI sit on top of it.
//! Every module has one job and one error enum.

// Every public item says what it is for; `cargo doc -p trash-panda --no-deps` is the reference.
#![deny(missing_docs)]

pub mod adapter;
pub mod checkpoint;
pub mod dtype;
pub mod engine_config;
pub mod io;
pub mod order;
pub mod pipeline;
pub mod plan;
pub mod profile;
pub mod rules;
pub mod settings;
pub mod stream;
pub mod sys;
pub mod units;

pub use checkpoint::{Checkpoint, CheckpointError, TensorInfo};
pub use dtype::{DType, DtypeError};

//! What can be wrong with a checkpoint: one header's problems ([`HeaderError`], file-free so the
//! parser stays pure) and the whole checkpoint's ([`CheckpointError`], always naming the file).

use std::io;
use std::path::PathBuf;

use crate::dtype::DType;

/// A problem with one safetensors file's length field or JSON header.
///
/// Offsets in `data_offsets` are relative to the data section, as in the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    #[error("file is {file_len} bytes, too short for the 8-byte header length field")]
    FileTooShort { file_len: u64 },

    #[error("header length field says {header_len} bytes, more than the limit of {limit}")]
    HeaderTooLarge { header_len: u64, limit: u64 },

    #[error(
        "header length field says {header_len} bytes but only {available} bytes follow it \
         (file is {file_len} bytes)"
    )]
    HeaderBeyondFile {
        header_len: u64,
        available: u64,
        file_len: u64,
    },

    #[error("cannot read {len} bytes at offset {offset}: {source}")]
    Read {
        offset: u64,
        len: u64,
        #[source]
        source: io::Error,
    },

    #[error("header is not UTF-8: invalid byte at header offset {offset}")]
    NotUtf8 { offset: usize },

    #[error("header is not valid JSON at line {line}, column {column}: {message}")]
    NotJson {
        line: usize,
        column: usize,
        message: String,
    },

    #[error("header is {found}, expected a JSON object of tensors")]
    NotObject { found: &'static str },

    #[error("__metadata__ appears more than once in the header")]
    DuplicateMetadata,

    #[error("__metadata__ is {found}, expected an object of strings")]
    MetadataNotObject { found: &'static str },

    #[error("__metadata__ key {key:?} is {found}, expected a string")]
    MetadataValueNotString { key: String, found: &'static str },

    #[error("__metadata__ key {key:?} appears more than once")]
    DuplicateMetadataKey { key: String },

    #[error("tensor {tensor:?} appears more than once in the header")]
    DuplicateTensor { tensor: String },

    #[error("tensor {tensor:?}: entry is {found}, expected an object with dtype, shape and data_offsets")]
    EntryNotObject { tensor: String, found: &'static str },

    #[error("tensor {tensor:?}: field {field:?} appears more than once")]
    DuplicateField { tensor: String, field: String },

    #[error("tensor {tensor:?}: missing field {field:?}")]
    MissingField { tensor: String, field: &'static str },

    #[error("tensor {tensor:?}: {field} is {found}, expected {expected}")]
    WrongFieldType {
        tensor: String,
        field: &'static str,
        expected: &'static str,
        found: String,
    },

    #[error(
        "tensor {tensor:?}: unknown dtype {dtype:?}, expected one of F64 F32 F16 BF16 F8_E4M3 \
         F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL"
    )]
    UnknownDtype { tensor: String, dtype: String },

    #[error("tensor {tensor:?}: {} x {shape:?} has more bytes than fit in 64 bits", dtype.safetensors_name())]
    ShapeOverflow {
        tensor: String,
        dtype: DType,
        shape: Vec<usize>,
    },

    #[error("tensor {tensor:?}: data_offsets [{begin}, {end}] end before they begin")]
    OffsetsReversed {
        tensor: String,
        begin: u64,
        end: u64,
    },

    #[error(
        "tensor {tensor:?}: data_offsets [{begin}, {end}] reach past the data section of \
         {data_len} bytes"
    )]
    OffsetsBeyondData {
        tensor: String,
        begin: u64,
        end: u64,
        data_len: u64,
    },

    #[error(
        "tensor {tensor:?}: data_offsets [{begin}, {end}] give {found} bytes but {} x {shape:?} \
         needs {expected}",
        dtype.safetensors_name()
    )]
    SizeMismatch {
        tensor: String,
        begin: u64,
        end: u64,
        found: u64,
        dtype: DType,
        shape: Vec<usize>,
        expected: u64,
    },

    #[error(
        "tensor {tensor:?}: data_offsets [{begin}, {end}] overlap tensor {other:?} at \
         [{other_begin}, {other_end}]"
    )]
    Overlap {
        tensor: String,
        begin: u64,
        end: u64,
        other: String,
        other_begin: u64,
        other_end: u64,
    },
}

/// Errors of the checkpoint module. Every message starts with the file it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: io::Error,
    },

    /// The file's own header is wrong; `kind` says how (it is part of the message, not a source,
    /// so error chains do not print it twice).
    #[error("{}: {kind}", path.display())]
    Header { path: PathBuf, kind: HeaderError },

    #[error(
        "{}: folder holds no *.safetensors file and no *.safetensors.index.json",
        path.display()
    )]
    EmptyFolder { path: PathBuf },

    #[error("{}: index is not valid JSON at line {line}, column {column}: {message}", path.display())]
    IndexNotJson {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },

    #[error("{}: index is {found}, expected a JSON object with a weight_map", path.display())]
    IndexNotObject { path: PathBuf, found: &'static str },

    #[error("{}: index has no weight_map", path.display())]
    IndexNoWeightMap { path: PathBuf },

    #[error("{}: index has more than one weight_map", path.display())]
    IndexDuplicateWeightMap { path: PathBuf },

    #[error("{}: weight_map is {found}, expected an object of tensor name -> shard file", path.display())]
    IndexWeightMapNotObject { path: PathBuf, found: &'static str },

    #[error("{}: weight_map names no tensor", path.display())]
    IndexEmpty { path: PathBuf },

    #[error("{}: weight_map entry for tensor {tensor:?} is {found}, expected a shard file name", path.display())]
    IndexEntryNotString {
        path: PathBuf,
        tensor: String,
        found: &'static str,
    },

    #[error("{}: weight_map lists tensor {tensor:?} more than once", path.display())]
    IndexDuplicateTensor { path: PathBuf, tensor: String },

    #[error(
        "{}: weight_map maps tensor {tensor:?} to {shard:?}, expected a file name relative to \
         the index's folder",
        path.display()
    )]
    IndexBadShardName {
        path: PathBuf,
        tensor: String,
        shard: String,
    },

    #[error(
        "{}: weight_map maps tensor {tensor:?} to shard {}, which does not exist",
        path.display(),
        shard.display()
    )]
    MissingShard {
        path: PathBuf,
        tensor: String,
        shard: PathBuf,
    },

    #[error(
        "{}: weight_map maps tensor {tensor:?} to shard {}, whose header has no such tensor",
        path.display(),
        shard.display()
    )]
    TensorNotInShard {
        path: PathBuf,
        tensor: String,
        shard: PathBuf,
    },

    #[error(
        "{}: tensor {tensor:?} is not listed in the weight_map of {}",
        shard.display(),
        path.display()
    )]
    TensorNotInIndex {
        path: PathBuf,
        tensor: String,
        shard: PathBuf,
    },

    #[error(
        "{}: tensor {tensor:?} is also in {}; a name may appear in one file only",
        path.display(),
        first.display()
    )]
    DuplicateTensor {
        path: PathBuf,
        tensor: String,
        first: PathBuf,
    },

    #[error(
        "{}: tensor {tensor:?} ends at byte {end} but the file now has {len} bytes: it was \
         truncated or rewritten after it was opened; load the model again",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        tensor: String,
        end: u64,
        len: u64,
    },
}

impl CheckpointError {
    /// The file the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            CheckpointError::Io { path, .. }
            | CheckpointError::Header { path, .. }
            | CheckpointError::EmptyFolder { path }
            | CheckpointError::IndexNotJson { path, .. }
            | CheckpointError::IndexNotObject { path, .. }
            | CheckpointError::IndexNoWeightMap { path }
            | CheckpointError::IndexDuplicateWeightMap { path }
            | CheckpointError::IndexWeightMapNotObject { path, .. }
            | CheckpointError::IndexEmpty { path }
            | CheckpointError::IndexEntryNotString { path, .. }
            | CheckpointError::IndexDuplicateTensor { path, .. }
            | CheckpointError::IndexBadShardName { path, .. }
            | CheckpointError::MissingShard { path, .. }
            | CheckpointError::TensorNotInShard { path, .. }
            | CheckpointError::TensorNotInIndex { path, .. }
            | CheckpointError::DuplicateTensor { path, .. }
            | CheckpointError::Truncated { path, .. } => path,
        }
    }
}

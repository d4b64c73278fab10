//! What can be wrong with a checkpoint: one header's problems ([`HeaderError`] for safetensors,
//! [`GgufError`] for GGUF, file-free so the parsers stay pure) and the whole checkpoint's
//! ([`CheckpointError`], always naming the file).

use std::io;
use std::path::PathBuf;

use super::gguf::GgufError;
use crate::dtype::DType;

/// A problem with one safetensors file's length field or JSON header.
///
/// Offsets in `data_offsets` are relative to the data section, as in the file.
///
/// What to do: the file is damaged or is not a safetensors file. Download or convert it again (a
/// download that stopped early is the usual cause); the message names the file and the entry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The file is shorter than the 8-byte length field that starts every safetensors file.
    #[error("file is {file_len} bytes, too short for the 8-byte header length field")]
    FileTooShort {
        /// Length of the whole file, in bytes.
        file_len: u64,
    },

    /// The length field asks for more than [`MAX_HEADER_LEN`](super::header::MAX_HEADER_LEN) bytes
    /// of JSON (or more than this machine can address); nothing is allocated for it.
    #[error("header length field says {header_len} bytes, more than the limit of {limit}")]
    HeaderTooLarge {
        /// The value of the length field: bytes of JSON announced.
        header_len: u64,
        /// The largest header accepted, in bytes.
        limit: u64,
    },

    /// The length field asks for more JSON than the file holds after it.
    #[error(
        "header length field says {header_len} bytes but only {available} bytes follow it \
         (file is {file_len} bytes)"
    )]
    HeaderBeyondFile {
        /// The value of the length field: bytes of JSON announced.
        header_len: u64,
        /// Bytes in the file after the length field.
        available: u64,
        /// Length of the whole file, in bytes.
        file_len: u64,
    },

    /// Reading the length field or the JSON failed (an I/O error, or the file ended early).
    ///
    /// What to do: the drive or file system failed while reading the header (the I/O error says
    /// how). Check the file can be read (`cat FILE > /dev/null`), then load again.
    #[error("cannot read {len} bytes at offset {offset}: {source}")]
    Read {
        /// Offset in the file where the read started, in bytes.
        offset: u64,
        /// Bytes that were to be read.
        len: u64,
        /// The I/O error (`UnexpectedEof` when the file ended early).
        #[source]
        source: io::Error,
    },

    /// The JSON bytes are not valid UTF-8.
    #[error("header is not UTF-8: invalid byte at header offset {offset}")]
    NotUtf8 {
        /// Offset of the first invalid byte, from the start of the JSON (not of the file).
        offset: usize,
    },

    /// The JSON does not parse.
    #[error("header is not valid JSON at line {line}, column {column}: {message}")]
    NotJson {
        /// Line of the JSON error, counting from 1.
        line: usize,
        /// Column of the JSON error, counting from 1.
        column: usize,
        /// The JSON parser's own message.
        message: String,
    },

    /// The JSON parses but is not an object (an array, a string, ...).
    #[error("header is {found}, expected a JSON object of tensors")]
    NotObject {
        /// What was found instead, as a JSON kind ("an array", "a number", ...).
        found: &'static str,
    },

    /// The header has two `__metadata__` keys.
    #[error("__metadata__ appears more than once in the header")]
    DuplicateMetadata,

    /// `__metadata__` is not a JSON object.
    #[error("__metadata__ is {found}, expected an object of strings")]
    MetadataNotObject {
        /// What was found instead, as a JSON kind ("an array", "a number", ...).
        found: &'static str,
    },

    /// A `__metadata__` value is not a string (safetensors allows only strings there).
    #[error("__metadata__ key {key:?} is {found}, expected a string")]
    MetadataValueNotString {
        /// The `__metadata__` key.
        key: String,
        /// What was found instead, as a JSON kind ("an array", "a number", ...).
        found: &'static str,
    },

    /// A key appears twice inside `__metadata__`.
    #[error("__metadata__ key {key:?} appears more than once")]
    DuplicateMetadataKey {
        /// The `__metadata__` key.
        key: String,
    },

    /// A tensor name appears twice in the header.
    #[error("tensor {tensor:?} appears more than once in the header")]
    DuplicateTensor {
        /// The tensor's name.
        tensor: String,
    },

    /// A tensor's entry is not a JSON object.
    #[error("tensor {tensor:?}: entry is {found}, expected an object with dtype, shape and data_offsets")]
    EntryNotObject {
        /// The tensor's name.
        tensor: String,
        /// What was found instead, as a JSON kind ("an array", "a number", ...).
        found: &'static str,
    },

    /// A tensor's entry has the same field twice.
    #[error("tensor {tensor:?}: field {field:?} appears more than once")]
    DuplicateField {
        /// The tensor's name.
        tensor: String,
        /// The field's name in the entry.
        field: String,
    },

    /// A tensor's entry lacks `dtype`, `shape` or `data_offsets`.
    #[error("tensor {tensor:?}: missing field {field:?}")]
    MissingField {
        /// The tensor's name.
        tensor: String,
        /// The field's name in the entry.
        field: &'static str,
    },

    /// A field of a tensor's entry has the wrong JSON type or form (e.g. `shape` not a list of
    /// whole numbers, `data_offsets` not two of them).
    #[error("tensor {tensor:?}: {field} is {found}, expected {expected}")]
    WrongFieldType {
        /// The tensor's name.
        tensor: String,
        /// The field's name in the entry.
        field: &'static str,
        /// What the field should hold, in words.
        expected: &'static str,
        /// What it holds instead: a short preview of the JSON value.
        found: String,
    },

    /// The `dtype` string names no dtype this crate knows.
    #[error(
        "tensor {tensor:?}: unknown dtype {dtype:?}, expected one of F64 F32 F16 BF16 F8_E4M3 \
         F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL"
    )]
    UnknownDtype {
        /// The tensor's name.
        tensor: String,
        /// The dtype string as written in the header.
        dtype: String,
    },

    /// The tensor's shape times its dtype's size does not fit in a `u64` of bytes.
    #[error("tensor {tensor:?}: {} x {shape:?} has more bytes than fit in 64 bits", dtype.safetensors_name())]
    ShapeOverflow {
        /// The tensor's name.
        tensor: String,
        /// The tensor's dtype.
        dtype: DType,
        /// The tensor's shape, as in the header.
        shape: Vec<usize>,
    },

    /// The tensor's `data_offsets` end before they begin.
    #[error("tensor {tensor:?}: data_offsets [{begin}, {end}] end before they begin")]
    OffsetsReversed {
        /// The tensor's name.
        tensor: String,
        /// First byte of the tensor's range, relative to the data section.
        begin: u64,
        /// One past the last byte of the tensor's range, relative to the data section.
        end: u64,
    },

    /// The tensor's `data_offsets` reach past the end of the file's data section.
    #[error(
        "tensor {tensor:?}: data_offsets [{begin}, {end}] reach past the data section of \
         {data_len} bytes"
    )]
    OffsetsBeyondData {
        /// The tensor's name.
        tensor: String,
        /// First byte of the tensor's range, relative to the data section.
        begin: u64,
        /// One past the last byte of the tensor's range, relative to the data section.
        end: u64,
        /// Length of the data section, in bytes.
        data_len: u64,
    },

    /// The tensor's byte range is not exactly the size its shape and dtype need.
    #[error(
        "tensor {tensor:?}: data_offsets [{begin}, {end}] give {found} bytes but {} x {shape:?} \
         needs {expected}",
        dtype.safetensors_name()
    )]
    SizeMismatch {
        /// The tensor's name.
        tensor: String,
        /// First byte of the tensor's range, relative to the data section.
        begin: u64,
        /// One past the last byte of the tensor's range, relative to the data section.
        end: u64,
        /// Bytes the range holds (`end - begin`).
        found: u64,
        /// The tensor's dtype.
        dtype: DType,
        /// The tensor's shape, as in the header.
        shape: Vec<usize>,
        /// Bytes the shape and dtype need.
        expected: u64,
    },

    /// The tensor's byte range shares bytes with another tensor's (gaps between tensors are
    /// allowed, overlaps are not).
    #[error(
        "tensor {tensor:?}: data_offsets [{begin}, {end}] overlap tensor {other:?} at \
         [{other_begin}, {other_end}]"
    )]
    Overlap {
        /// The tensor's name.
        tensor: String,
        /// First byte of the tensor's range, relative to the data section.
        begin: u64,
        /// One past the last byte of the tensor's range, relative to the data section.
        end: u64,
        /// The other tensor's name.
        other: String,
        /// First byte of the other tensor's range, relative to the data section.
        other_begin: u64,
        /// One past the last byte of the other tensor's range.
        other_end: u64,
    },
}

/// Errors of the checkpoint module. Every message starts with the file it is about.
///
/// What to do: the index (`*.safetensors.index.json`) and its shards do not agree. Download the
/// checkpoint again, whole; an index edited by hand must list every tensor of every shard, once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A file or folder of the checkpoint could not be opened, read, listed or measured.
    ///
    /// What to do: check the path exists and can be read by this user; for a folder, that it can be
    /// listed.
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        /// The file or folder the action was on.
        path: PathBuf,
        /// What was being done, as a verb phrase ("open", "list the folder", ...), for the message.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// The file's own header is wrong; `kind` says how (it is part of the message, not a source,
    /// so error chains do not print it twice).
    ///
    /// What to do: the `HeaderError` entries say what is wrong; the file is damaged or is not a
    /// safetensors file: download or convert it again.
    #[error("{}: {kind}", path.display())]
    Header {
        /// The safetensors file whose header is wrong.
        path: PathBuf,
        /// What is wrong with it.
        kind: HeaderError,
    },

    /// The GGUF file's header (metadata or tensor infos) is wrong; `kind` says how (it is part
    /// of the message, not a source, so error chains do not print it twice).
    ///
    /// What to do: the `GgufError` entries say what is wrong; the file is damaged, is not a GGUF
    /// file, or holds a tensor type this crate does not read yet: download or convert it again.
    #[error("{}: {kind}", path.display())]
    Gguf {
        /// The GGUF file whose header is wrong.
        path: PathBuf,
        /// What is wrong with it (boxed: its places and names would make every checkpoint error
        /// as large).
        kind: Box<GgufError>,
    },

    /// The folder given holds neither a `*.safetensors` file nor a `*.safetensors.index.json`,
    /// nor a `*.gguf` file.
    ///
    /// What to do: give the folder that holds the weights (for a hub download, the snapshot folder
    /// with the `.safetensors` files), or the file itself.
    #[error(
        "{}: folder holds no *.safetensors file, no *.safetensors.index.json and no *.gguf file",
        path.display()
    )]
    EmptyFolder {
        /// The folder.
        path: PathBuf,
    },

    /// The folder given holds no safetensors checkpoint but several `*.gguf` files: each is a
    /// checkpoint of its own (often one model at several quantizations), and which one to open
    /// is the caller's choice. Split GGUF checkpoints (`*-00001-of-00003.gguf`) are not read.
    ///
    /// What to do: give the `.gguf` file to open.
    #[error(
        "{}: folder holds {count} *.gguf files and no safetensors checkpoint; give the one to open",
        path.display()
    )]
    SeveralGguf {
        /// The folder.
        path: PathBuf,
        /// How many `*.gguf` files it holds.
        count: usize,
    },

    /// The index file (`*.safetensors.index.json`) does not parse as JSON.
    #[error("{}: index is not valid JSON at line {line}, column {column}: {message}", path.display())]
    IndexNotJson {
        /// The index file.
        path: PathBuf,
        /// Line of the JSON error, counting from 1.
        line: usize,
        /// Column of the JSON error, counting from 1.
        column: usize,
        /// The JSON parser's own message.
        message: String,
    },

    /// The index parses but is not a JSON object.
    #[error("{}: index is {found}, expected a JSON object with a weight_map", path.display())]
    IndexNotObject {
        /// The index file.
        path: PathBuf,
        /// What was found instead, as a JSON kind ("an array", "a number", ...).
        found: &'static str,
    },

    /// The index has no `weight_map` key.
    #[error("{}: index has no weight_map", path.display())]
    IndexNoWeightMap {
        /// The index file.
        path: PathBuf,
    },

    /// The index has two `weight_map` keys.
    #[error("{}: index has more than one weight_map", path.display())]
    IndexDuplicateWeightMap {
        /// The index file.
        path: PathBuf,
    },

    /// `weight_map` is not a JSON object.
    #[error("{}: weight_map is {found}, expected an object of tensor name -> shard file", path.display())]
    IndexWeightMapNotObject {
        /// The index file.
        path: PathBuf,
        /// What was found instead, as a JSON kind ("an array", "a number", ...).
        found: &'static str,
    },

    /// `weight_map` is an empty object.
    #[error("{}: weight_map names no tensor", path.display())]
    IndexEmpty {
        /// The index file.
        path: PathBuf,
    },

    /// A `weight_map` value is not a string.
    #[error("{}: weight_map entry for tensor {tensor:?} is {found}, expected a shard file name", path.display())]
    IndexEntryNotString {
        /// The index file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What was found instead, as a JSON kind ("an array", "a number", ...).
        found: &'static str,
    },

    /// A tensor name appears twice in `weight_map`.
    #[error("{}: weight_map lists tensor {tensor:?} more than once", path.display())]
    IndexDuplicateTensor {
        /// The index file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
    },

    /// A `weight_map` value is not a plain relative file name (empty, absolute, or climbing out of
    /// the index's folder with `..`).
    #[error(
        "{}: weight_map maps tensor {tensor:?} to {shard:?}, expected a file name relative to \
         the index's folder",
        path.display()
    )]
    IndexBadShardName {
        /// The index file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The shard name as written in the index.
        shard: String,
    },

    /// A shard file named by `weight_map` does not exist.
    ///
    /// What to do: the download is incomplete: fetch the shard the message names, or download the
    /// checkpoint again.
    #[error(
        "{}: weight_map maps tensor {tensor:?} to shard {}, which does not exist",
        path.display(),
        shard.display()
    )]
    MissingShard {
        /// The index file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The shard file, resolved against the index's folder.
        shard: PathBuf,
    },

    /// A tensor `weight_map` maps to a shard is not in that shard's header.
    #[error(
        "{}: weight_map maps tensor {tensor:?} to shard {}, whose header has no such tensor",
        path.display(),
        shard.display()
    )]
    TensorNotInShard {
        /// The index file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The shard file, resolved against the index's folder.
        shard: PathBuf,
    },

    /// A shard's header holds a tensor that `weight_map` does not list. Like every index error,
    /// the message starts with the index (given, or found in the folder given), which is
    /// [`CheckpointError::path`]; the shard comes after.
    #[error(
        "{}: weight_map does not list tensor {tensor:?}, which shard {} holds",
        path.display(),
        shard.display()
    )]
    TensorNotInIndex {
        /// The index file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The shard file, resolved against the index's folder.
        shard: PathBuf,
    },

    /// Two files of the checkpoint hold a tensor of the same name.
    ///
    /// What to do: the folder holds two checkpoints (an old shard beside a new one, or one file and
    /// its shards): remove the files that do not belong, or give the index file.
    #[error(
        "{}: tensor {tensor:?} is also in {}; a name may appear in one file only",
        path.display(),
        first.display()
    )]
    DuplicateTensor {
        /// The file where the name was seen the second time.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The file where the name was seen first.
        first: PathBuf,
    },

    /// The file holding a tensor was written to after its header was read: a map of it shows
    /// the new bytes, which the header's offsets do not describe.
    ///
    /// What to do: another program wrote over the checkpoint (copied a new one over it, as `cp`
    /// does) while a model used it. Leave checkpoints alone while a model uses them (put a new
    /// one at the path with a rename, which a loaded model does not see), and load the model
    /// again.
    #[error(
        "{}: tensor {tensor:?} cannot be read: the file changed after it was opened ({change}); \
         load the model again",
        path.display()
    )]
    Changed {
        /// The data file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What changed.
        change: crate::io::Change,
    },

    /// A tensor's bytes lie past the file's current end: the file shrank or was rewritten after the
    /// checkpoint was opened.
    ///
    /// What to do: another program rewrote or shortened the file while it was loaded. Leave
    /// checkpoints alone while a model uses them, and load the model again.
    #[error(
        "{}: tensor {tensor:?} ends at byte {end} but the file now has {len} bytes: it was \
         truncated or rewritten after it was opened; load the model again",
        path.display()
    )]
    Truncated {
        /// The data file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// Absolute offset one past the tensor's last byte, as the header said.
        end: u64,
        /// The file's length now, in bytes.
        len: u64,
    },
}

impl CheckpointError {
    /// The file the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            CheckpointError::Io { path, .. }
            | CheckpointError::Header { path, .. }
            | CheckpointError::Gguf { path, .. }
            | CheckpointError::EmptyFolder { path }
            | CheckpointError::SeveralGguf { path, .. }
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
            | CheckpointError::Truncated { path, .. }
            | CheckpointError::Changed { path, .. } => path,
        }
    }
}

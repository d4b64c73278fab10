//! Checkpoints: safetensors files (header parsing and validation, sharded checkpoints) and GGUF
//! files ([`gguf`]), with one tensor index over either.
//!
//! Opening a checkpoint reads only headers (for safetensors the 8-byte length field and the JSON
//! after it, for GGUF the metadata and tensor infos), never tensor data, and validates them
//! strictly so that later readers can trust every byte range they are given.

mod error;
pub mod gguf;
mod header;
mod index;
mod json;
mod open;
mod read;
mod tensor;

#[cfg(test)]
mod header_tests;
#[cfg(test)]
mod open_tests;
#[cfg(test)]
mod stamp_tests;

pub use crate::io::{Change, FileChange};
pub use error::{CheckpointError, HeaderError};
pub use gguf::{read_gguf, GgufError, GgufFile};
pub use header::{parse_header, Header, HeaderEntry, MAX_HEADER_LEN};
pub use read::{read_header, FileHeader, HeaderSource, LEN_FIELD};
pub use tensor::TensorInfo;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// An opened checkpoint: one safetensors or GGUF file, or the shards of a sharded safetensors
/// checkpoint, with one tensor index.
#[derive(Debug)]
pub struct Checkpoint {
    files: Vec<PathBuf>,
    /// `__metadata__` of each file, parallel to `files`.
    metadata: Vec<BTreeMap<String, String>>,
    /// What each file was when its header was read, parallel to `files`.
    stamps: Vec<crate::io::FileStamp>,
    /// By file, then by start offset.
    tensors: Vec<TensorInfo>,
    /// Tensor name -> position in `tensors`.
    by_name: HashMap<String, usize>,
    /// The header of a GGUF checkpoint (its one file's), with its typed metadata.
    gguf: Option<GgufFile>,
}

/// Returned by [`Checkpoint::metadata`] for a file index that does not exist.
static NO_METADATA: BTreeMap<String, String> = BTreeMap::new();

impl Checkpoint {
    /// Opens a `.safetensors` file, a sharded checkpoint's `*.safetensors.index.json` (any
    /// `.json` file is taken for an index), a `.gguf` file, or a folder: the folder's one
    /// `*.safetensors.index.json` if it has exactly one, else every `*.safetensors` in it, sorted
    /// by name, else its one `*.gguf` file.
    ///
    /// A GGUF file is a checkpoint of one file whose tensors have the dtypes of their GGML types
    /// (the block-quantized ones included) and the shapes torch gives them: GGUF's dimensions
    /// reversed, outermost first. Its metadata is [`Checkpoint::gguf`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        open::open(path.as_ref())
    }

    /// The files of the checkpoint, in the order [`TensorInfo::file`] indexes.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Every tensor, ordered by file, then by start offset.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor with this name, in whichever file holds it.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The file holding a tensor of this checkpoint. A `TensorInfo` from another checkpoint with
    /// a file index this one lacks gives an empty path.
    pub fn file_of(&self, tensor: &TensorInfo) -> &Path {
        self.files
            .get(tensor.file)
            .map_or(Path::new(""), PathBuf::as_path)
    }

    /// Checks that the file holding `tensor` still reaches the tensor's end, and was not written
    /// to since its header was read. A map of a file truncated after it was opened faults
    /// (SIGBUS) on the pages past the new end, and one written to in place shows the new bytes,
    /// which the header's offsets do not describe; code that reads a tensor through a map asks
    /// this first. A file replaced at the path (a rename over it) passes: a map made before
    /// still shows the file it was made of.
    pub fn check_holds(&self, tensor: &TensorInfo) -> Result<(), CheckpointError> {
        let path = self.file_of(tensor);
        let meta = std::fs::metadata(path).map_err(|source| CheckpointError::Io {
            path: path.to_owned(),
            action: "read its size",
            source,
        })?;
        let change = self
            .stamps
            .get(tensor.file)
            .and_then(|s| s.differs(&crate::io::FileStamp::of(&meta)));
        if change == Some(Change::Replaced) {
            return Ok(());
        }
        if meta.len() < tensor.end {
            return Err(CheckpointError::Truncated {
                path: path.to_owned(),
                tensor: tensor.name.clone(),
                end: tensor.end,
                len: meta.len(),
            });
        }
        match change {
            None => Ok(()),
            Some(change) => Err(CheckpointError::Changed {
                path: path.to_owned(),
                tensor: tensor.name.clone(),
                change,
            }),
        }
    }

    /// The first of its files that is no longer what it was when its header was read (see
    /// [`FileStamp`](crate::io::FileStamp)): rewritten, replaced, resized or gone. A model that
    /// reads its blocks again later asks this first: the header's offsets hold for that file only.
    pub fn changed(&self) -> Option<FileChange> {
        crate::io::first_change(&self.files, &self.stamps)
    }

    /// The `__metadata__` map of a file (empty if the file has none, or the index is out of
    /// range). Always empty for a GGUF file: its metadata is typed and may hold megabytes of
    /// arrays, and is read through [`Checkpoint::gguf`] instead.
    pub fn metadata(&self, file_idx: usize) -> &BTreeMap<String, String> {
        self.metadata.get(file_idx).unwrap_or(&NO_METADATA)
    }

    /// The header of a GGUF checkpoint: its version, alignment, typed metadata and tensor infos
    /// (in file order, with GGML's type ids and dimensions). `None` for a safetensors checkpoint.
    pub fn gguf(&self) -> Option<&GgufFile> {
        self.gguf.as_ref()
    }

    /// Bytes of tensor data over all files (headers and gaps not counted).
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.nbytes()))
    }
}

//! GGUF, llama.cpp's checkpoint container: the header (typed metadata and tensor infos) read
//! and validated as strictly as a safetensors header, so that the tensor index built from it
//! can be trusted for every byte range it gives.
//!
//! A GGUF file (little-endian) is the magic `GGUF`, a u32 version (2 or 3), a u64 tensor count
//! and a u64 metadata count, the metadata pairs (a string key, a u32 value type, the value), the
//! tensor infos (a name, up to 4 dimensions innermost first, a GGML type id, an offset into the
//! data section), padding to the alignment (`general.alignment`, 32 by default), then the data
//! section. The metadata can be megabytes (tokenizer vocabularies), so it is read through a
//! buffered reader, never mapped, and held in memory in proportion to its size.
//!
//! - [`parse_gguf`]: the reader, on any [`Read`](std::io::Read) (the fuzzer's bytes included).
//! - [`read_gguf`]: the same on a file, with errors naming it;
//!   [`Checkpoint::open`](super::Checkpoint::open) opens `.gguf` files through it.
//! - [`GgufValue`], [`GgufArray`]: the typed metadata values.
//! - [`ggml_dtype`] and friends: GGML type ids and the [`DType`] each one is.

mod error;
mod ggml;
mod parse;
mod value;

#[cfg(test)]
mod parse_tests;

pub use error::{GgufError, GgufPlace};
pub use ggml::{dtype_ggml_type, ggml_dtype, ggml_type_name};
pub use parse::parse_gguf;
pub use value::{GgufArray, GgufValue, GgufValueType};

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use super::CheckpointError;
use crate::dtype::DType;
use crate::io::FileStamp;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// The metadata key of the data section's alignment (a u32 power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The alignment of a file whose metadata has no `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The deepest nesting of arrays accepted (an array value is depth 1, an array inside it
/// depth 2, ...). Writers use depth 1, rarely 2; the bound keeps a hostile file from recursing
/// without end.
pub const MAX_ARRAY_DEPTH: u32 = 4;

/// The most dimensions a tensor may have (GGML's limit).
pub const MAX_DIMS: u32 = 4;

/// The most bytes the metadata and tensor infos may take together (1 GiB). Real files hold a
/// few MB (tens of MB for the largest vocabularies); the bound keeps a damaged length or count
/// in a large file from being read as gigabytes of metadata.
pub const MAX_GGUF_HEADER_LEN: u64 = 1 << 30;

/// A validated GGUF header: version, alignment, metadata and tensor infos, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufFile {
    /// The format version: 2 or 3 (they differ only in what writers put in them).
    pub version: u32,
    /// The data section's alignment: `general.alignment`, or 32.
    pub alignment: u64,
    /// Absolute offset of the data section: the end of the tensor infos, rounded up to the
    /// alignment. Tensor offsets count from here.
    pub data_start: u64,
    /// Every metadata pair, in file order (keys are unique).
    pub metadata: Vec<(String, GgufValue)>,
    /// Every tensor, in file order (names are unique).
    pub tensors: Vec<GgufTensor>,
}

impl GgufFile {
    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture` (`"llama"`, `"qwen2"`, ...), the prefix of the model's own keys.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(GgufValue::as_str)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// One tensor info, resolved to an absolute byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    /// The tensor's name (`blk.0.attn_q.weight`, ...).
    pub name: String,
    /// The GGML type id as written.
    pub ggml_type: u32,
    /// The dtype of that GGML type.
    pub dtype: DType,
    /// Elements along each dimension, innermost first as GGML writes them: `ne[0]` is the row
    /// length. A linear layer's weight with `ne = [in, out]` is `[out, in]` to torch.
    pub ne: Vec<u64>,
    /// The offset as written, relative to the data section; a multiple of the alignment.
    pub offset: u64,
    /// Absolute offset of the first byte: `data_start + offset`.
    pub start: u64,
    /// Bytes of the tensor's data: `dtype.bytes_for(numel)`.
    pub nbytes: u64,
}

impl GgufTensor {
    /// Absolute offset one past the last byte.
    pub fn end(&self) -> u64 {
        // The parser checked that the range lies inside the file; saturating keeps a hand-built
        // value from panicking.
        self.start.saturating_add(self.nbytes)
    }

    /// Elements along each dimension, outermost first (the reverse of `ne`), as safetensors
    /// and torch give shapes. The parser checked that every dimension fits in a `usize`.
    pub fn shape(&self) -> Vec<usize> {
        self.ne
            .iter()
            .rev()
            .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect()
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.ne.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }
}

/// Reads and validates the header of the GGUF file at `path`; errors name the file.
pub fn read_gguf(path: impl AsRef<Path>) -> Result<GgufFile, CheckpointError> {
    read_gguf_stamped(path.as_ref()).map(|(g, _)| g)
}

/// The file's header, and the stamp of the file it was read from (the same open file).
pub(crate) fn read_gguf_stamped(path: &Path) -> Result<(GgufFile, FileStamp), CheckpointError> {
    let io_err = |action| {
        move |source| CheckpointError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    };
    let file = File::open(path).map_err(io_err("open"))?;
    let meta = file.metadata().map_err(io_err("stat"))?;
    // Values are a few bytes each; a large buffer makes a vocabulary of 150k strings cheap.
    let reader = BufReader::with_capacity(1 << 16, file);
    let gguf = parse_gguf(reader, meta.len()).map_err(|kind| CheckpointError::Gguf {
        path: path.to_path_buf(),
        kind: Box::new(kind),
    })?;
    Ok((gguf, FileStamp::of(&meta)))
}

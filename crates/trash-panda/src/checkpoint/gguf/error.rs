//! What can be wrong with a GGUF file's header (metadata and tensor infos). Like
//! [`HeaderError`](crate::checkpoint::HeaderError) it names no file, so the parser stays pure;
//! [`CheckpointError::Gguf`](crate::checkpoint::CheckpointError::Gguf) adds the path.

use std::fmt;
use std::io;

use super::value::GgufValueType;
use crate::dtype::DType;

/// Where in the header a problem was found, for messages: the parser knows a metadata key or a
/// tensor's name once it has read it, and only the entry's position before.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GgufPlace {
    /// The fixed start of the file: magic, version and the two counts.
    Start,
    /// A metadata pair whose key could not be read, by its position (counting from 0).
    MetadataPair {
        /// Position of the pair among the metadata, counting from 0.
        index: u64,
    },
    /// The value of a metadata pair.
    Metadata {
        /// The pair's key.
        key: String,
    },
    /// A tensor info whose name could not be read, by its position (counting from 0).
    TensorInfo {
        /// Position of the tensor info, counting from 0.
        index: u64,
    },
    /// A tensor's info.
    Tensor {
        /// The tensor's name.
        name: String,
    },
    /// The end of the tensor infos, where the padding to the data section is.
    Padding,
}

impl fmt::Display for GgufPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufPlace::Start => f.write_str("file header"),
            GgufPlace::MetadataPair { index } => write!(f, "metadata pair #{index}"),
            GgufPlace::Metadata { key } => write!(f, "metadata key {key:?}"),
            GgufPlace::TensorInfo { index } => write!(f, "tensor info #{index}"),
            GgufPlace::Tensor { name } => write!(f, "tensor {name:?}"),
            GgufPlace::Padding => f.write_str("end of the tensor infos"),
        }
    }
}

/// A problem with one GGUF file's header: its magic and version, its metadata, or its tensor
/// infos and the byte ranges they give. Offsets are absolute, from the start of the file.
///
/// What to do: the file is damaged, is not a GGUF file, or uses a form this crate does not read.
/// Download or convert it again (a download that stopped early is the usual cause); the message
/// names the entry and the byte where reading stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with the four bytes `GGUF`.
    ///
    /// What to do: the file is not a GGUF file (or its start was overwritten); give a `.gguf`
    /// checkpoint, or open a safetensors checkpoint under its own name.
    #[error("file starts with \"{}\", not the GGUF magic \"GGUF\"", found.escape_ascii())]
    NotGguf {
        /// The first four bytes of the file.
        found: [u8; 4],
    },

    /// GGUF version 1, whose counts and lengths were 32-bit: not read by this crate.
    ///
    /// What to do: convert the model again with a current llama.cpp (`convert_hf_to_gguf.py`),
    /// which writes version 3.
    #[error("GGUF version 1 (32-bit counts) is not supported, expected version 2 or 3")]
    VersionOne,

    /// The version field reads as 2 or 3 only with its bytes swapped: a big-endian GGUF file.
    ///
    /// What to do: only little-endian GGUF files are read; convert the model again without the
    /// big-endian option.
    #[error(
        "the version field is {version} byte-swapped: the file is big-endian, and only \
         little-endian GGUF files are supported"
    )]
    BigEndian {
        /// The version the field gives when read big-endian.
        version: u32,
    },

    /// A version this crate does not know.
    ///
    /// What to do: the file is damaged, or comes from a newer GGUF writer than this crate knows;
    /// convert it again with a llama.cpp that writes version 3.
    #[error("GGUF version {version} is not supported, expected 2 or 3")]
    UnknownVersion {
        /// The version field, read little-endian.
        version: u32,
    },

    /// A field, string or padding reaches past the end of the file.
    ///
    /// What to do: the file was cut short (an interrupted download or copy): download it again.
    #[error(
        "{at}: {what} at byte {offset} needs {need} bytes, but only {left} are left in the file"
    )]
    Truncated {
        /// The entry being read.
        at: GgufPlace,
        /// What was being read, in words ("the version", "a string's bytes", ...).
        what: &'static str,
        /// Where the field starts.
        offset: u64,
        /// Bytes the field needs.
        need: u64,
        /// Bytes from `offset` to the end of the file.
        left: u64,
    },

    /// A count (of metadata pairs, tensors or array elements) asks for more items than the bytes
    /// left in the file could hold, even at their smallest. Checked before anything is allocated
    /// for them, so a damaged count cannot exhaust memory.
    ///
    /// What to do: the file was cut short or is damaged: download it again.
    #[error(
        "{at}: {what} at byte {offset} is {count}, which needs at least {count} x {min_bytes} \
         bytes, but only {left} are left in the file"
    )]
    CountBeyondFile {
        /// The entry being read.
        at: GgufPlace,
        /// What is counted, in words ("tensor count", "array length", ...).
        what: &'static str,
        /// Where the count field starts.
        offset: u64,
        /// The count as written.
        count: u64,
        /// The fewest bytes one item can take.
        min_bytes: u64,
        /// Bytes after the count field to the end of the file.
        left: u64,
    },

    /// The metadata and tensor infos together reach past
    /// [`MAX_GGUF_HEADER_LEN`](super::MAX_GGUF_HEADER_LEN) bytes; the bound keeps a damaged
    /// length or count in a large file from being read as gigabytes of metadata.
    ///
    /// What to do: real files hold a few MB of metadata (tens of MB for the largest
    /// vocabularies); this one is damaged: download or convert it again.
    #[error(
        "{at}: {what} at byte {offset} needs {need} bytes, past the limit of {limit} bytes for \
         the metadata and tensor infos"
    )]
    HeaderTooLarge {
        /// The entry being read.
        at: GgufPlace,
        /// What was being read, in words.
        what: &'static str,
        /// Where the field starts.
        offset: u64,
        /// Bytes the field (or the items counted) needs.
        need: u64,
        /// The largest header accepted, in bytes.
        limit: u64,
    },

    /// Reading failed: an I/O error, or the file ended before the length it had when opened.
    ///
    /// What to do: the drive or file system failed, or another program shortened the file while
    /// it was read (the I/O error says which). Check the file can be read
    /// (`cat FILE > /dev/null`), then open it again.
    #[error("{at}: cannot read {what} at byte {offset}: {source}")]
    Read {
        /// The entry being read.
        at: GgufPlace,
        /// What was being read, in words.
        what: &'static str,
        /// Where the read started.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// A key, string value or tensor name is not valid UTF-8.
    ///
    /// What to do: the file is damaged (GGUF strings are always UTF-8): download or convert it
    /// again.
    #[error(
        "{at}: {what} at byte {offset} is not UTF-8 (invalid byte at {})",
        offset.saturating_add(*valid_up_to)
    )]
    NotUtf8 {
        /// The entry being read.
        at: GgufPlace,
        /// What the string is, in words ("the key", "a string value", ...).
        what: &'static str,
        /// Where the string's bytes start (after its length field).
        offset: u64,
        /// Bytes of the string that are valid UTF-8 before the first invalid one.
        valid_up_to: u64,
    },

    /// A metadata value (or array element) type code outside 0..=12.
    ///
    /// What to do: the file is damaged, or comes from a newer GGUF writer than this crate knows.
    #[error("{at}: unknown value type {value_type} at byte {offset}, expected 0 to 12")]
    UnknownValueType {
        /// The entry being read.
        at: GgufPlace,
        /// Where the type code starts.
        offset: u64,
        /// The type code as written.
        value_type: u32,
    },

    /// A bool value (or array element) that is neither 0 nor 1.
    ///
    /// What to do: the file is damaged: download or convert it again.
    #[error("{at}: bool at byte {offset} is {byte}, expected 0 or 1")]
    BadBool {
        /// The entry being read.
        at: GgufPlace,
        /// Where the byte is.
        offset: u64,
        /// The byte as written.
        byte: u8,
    },

    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`](super::MAX_ARRAY_DEPTH); the bound keeps a
    /// hostile file from recursing without end.
    ///
    /// What to do: no GGUF writer nests arrays this deep; the file is damaged.
    #[error("{at}: array at byte {offset} is nested more than {limit} deep")]
    ArrayTooDeep {
        /// The entry being read.
        at: GgufPlace,
        /// Where the too-deep array's element type starts.
        offset: u64,
        /// The deepest nesting accepted.
        limit: u32,
    },

    /// A metadata key appears twice.
    ///
    /// What to do: the file was written by a broken tool: convert the model again.
    #[error("metadata key {key:?} at byte {offset} appears more than once")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Where the second occurrence starts.
        offset: u64,
    },

    /// `general.alignment` is not a u32.
    ///
    /// What to do: the file was written by a broken tool: convert the model again.
    #[error("metadata key \"general.alignment\" is a {found}, expected a u32")]
    AlignmentType {
        /// The value type found.
        found: GgufValueType,
    },

    /// `general.alignment` is zero or not a power of two.
    ///
    /// What to do: the file was written by a broken tool: convert the model again.
    #[error("metadata key \"general.alignment\" is {alignment}, expected a power of two")]
    BadAlignment {
        /// The alignment as written.
        alignment: u32,
    },

    /// A tensor name appears twice.
    ///
    /// What to do: the file was written by a broken tool: convert the model again.
    #[error("tensor {tensor:?} at byte {offset} appears more than once")]
    DuplicateTensor {
        /// The tensor's name.
        tensor: String,
        /// Where the second occurrence's info starts.
        offset: u64,
    },

    /// A tensor's dimension count is outside 1..=4.
    ///
    /// What to do: the file is damaged: download or convert it again.
    #[error("tensor {tensor:?}: {n_dims} dimensions at byte {offset}, expected 1 to 4")]
    BadDims {
        /// The tensor's name.
        tensor: String,
        /// Where the dimension count starts.
        offset: u64,
        /// The dimension count as written.
        n_dims: u32,
    },

    /// A tensor's GGML type is a known type this crate does not read yet.
    ///
    /// What to do: convert the model again to a supported type (F32, F16, BF16, Q8_0, Q4_K,
    /// Q6_K, ...); `llama-quantize` converts between them.
    #[error(
        "tensor {tensor:?}: GGML type {type_name} ({ggml_type}) is not supported yet, expected \
         one of F32 F16 BF16 F64 I8 I16 I32 I64 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K"
    )]
    UnsupportedType {
        /// The tensor's name.
        tensor: String,
        /// The GGML type id as written.
        ggml_type: u32,
        /// The type's GGML name.
        type_name: &'static str,
    },

    /// A tensor's GGML type id is not one GGML has ever defined (as far as this crate knows).
    ///
    /// What to do: the file is damaged, or uses a type newer than this crate.
    #[error("tensor {tensor:?}: unknown GGML type {ggml_type}")]
    UnknownType {
        /// The tensor's name.
        tensor: String,
        /// The GGML type id as written.
        ggml_type: u32,
    },

    /// A tensor's rows (`ne[0]` elements) are not a whole number of its type's blocks.
    ///
    /// What to do: the file is damaged: a GGML writer quantizes whole blocks only.
    #[error(
        "tensor {tensor:?}: rows of {row} elements are not whole {} blocks of {block_elems} \
         (ne {ne:?})",
        dtype.safetensors_name()
    )]
    RowNotWholeBlocks {
        /// The tensor's name.
        tensor: String,
        /// The tensor's dtype.
        dtype: DType,
        /// Elements per row, `ne[0]`.
        row: u64,
        /// Elements per block of the dtype.
        block_elems: u64,
        /// The dimensions as written, innermost first.
        ne: Vec<u64>,
    },

    /// A tensor's element count or byte count does not fit in 64 bits (or in this machine's
    /// address space).
    ///
    /// What to do: the file is damaged: download or convert it again.
    #[error(
        "tensor {tensor:?}: {} x ne {ne:?} has more elements or bytes than fit in 64 bits",
        dtype.safetensors_name()
    )]
    ShapeOverflow {
        /// The tensor's name.
        tensor: String,
        /// The tensor's dtype.
        dtype: DType,
        /// The dimensions as written, innermost first.
        ne: Vec<u64>,
    },

    /// A tensor's offset is not a multiple of the file's alignment.
    ///
    /// What to do: the file is damaged, or was written with another alignment than its
    /// `general.alignment` says: convert the model again.
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        /// The tensor's name.
        tensor: String,
        /// The offset as written, relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },

    /// A tensor's data reaches past the end of the file.
    ///
    /// What to do: the file was cut short (an interrupted download or copy): download it again.
    #[error(
        "tensor {tensor:?}: {nbytes} bytes at data offset {offset} (byte {} of the file) reach \
         past its end at byte {file_len}",
        data_start.saturating_add(*offset)
    )]
    DataBeyondFile {
        /// The tensor's name.
        tensor: String,
        /// The offset as written, relative to the data section.
        offset: u64,
        /// Bytes of the tensor's data.
        nbytes: u64,
        /// Where the data section starts.
        data_start: u64,
        /// Length of the whole file.
        file_len: u64,
    },

    /// Two tensors' data share bytes (gaps between tensors are allowed, overlaps are not).
    ///
    /// What to do: the file was written by a broken tool: convert the model again.
    #[error(
        "tensor {tensor:?}: bytes [{start}, {end}) overlap tensor {other:?} at \
         [{other_start}, {other_end})"
    )]
    Overlap {
        /// The tensor's name.
        tensor: String,
        /// First byte of its data, from the start of the file.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// The other tensor's name.
        other: String,
        /// First byte of the other tensor's data.
        other_start: u64,
        /// One past the other tensor's last byte.
        other_end: u64,
    },
}

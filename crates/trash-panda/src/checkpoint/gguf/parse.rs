//! Reading a GGUF header from a stream: magic, version, metadata, tensor infos, then the checks
//! that tie the tensor infos to the file's bytes.
//!
//! Everything here takes untrusted bytes and must never panic, hang or allocate from a count it
//! has not checked: every length and count is compared with the bytes left in the file before
//! anything is allocated for it, every item read consumes at least one byte (so loops end with
//! the file), arrays nest at most [`MAX_ARRAY_DEPTH`] deep, and arithmetic on the file's numbers
//! is checked.

use std::collections::HashSet;
use std::io::Read;

use super::error::{GgufError, GgufPlace};
use super::ggml::{ggml_dtype, ggml_type_name};
use super::value::{GgufArray, GgufValue, GgufValueType};
use super::{
    GgufFile, GgufTensor, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS,
    MAX_GGUF_HEADER_LEN,
};
use crate::dtype::DType;

/// The most elements reserved ahead for a vector before they are read: a count that passed the
/// bytes-left check may still be far more than a small file needs, and reserving for it would
/// cost memory the file never fills.
const RESERVE_LIMIT: u64 = 1 << 16;

/// The fewest bytes of one metadata pair: an empty key's length, a type code, a one-byte value.
const MIN_PAIR_BYTES: u64 = 8 + 4 + 1;

/// The fewest bytes of one tensor info: an empty name's length, the dimension count, one
/// dimension, the type and the offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Reads and validates the header of a GGUF file of `file_len` bytes from `reader`, which must
/// be at the start of the file. Reads only the metadata and tensor infos, never tensor data.
///
/// On success every tensor has a supported dtype, rows of whole blocks, a byte count of
/// `dtype.bytes_for(numel)` that fits in 64 bits, an offset that is a multiple of the alignment,
/// and data inside the file that shares no byte with another tensor's (gaps are allowed).
///
/// Wrap a file in a [`BufReader`](std::io::BufReader): values are read a few bytes at a time.
pub fn parse_gguf<R: Read>(reader: R, file_len: u64) -> Result<GgufFile, GgufError> {
    let mut c = Cursor {
        reader,
        pos: 0,
        file_len,
        at: GgufPlace::Start,
    };

    let magic: [u8; 4] = c.array("the magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::NotGguf { found: magic });
    }
    let version = c.u32("the version")?;
    match version {
        2 | 3 => {}
        1 => return Err(GgufError::VersionOne),
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(GgufError::BigEndian {
                version: v.swap_bytes(),
            })
        }
        v => return Err(GgufError::UnknownVersion { version: v }),
    }
    let tensor_count = c.counted(MIN_TENSOR_INFO_BYTES, "the tensor count")?;
    let pair_count = c.counted(MIN_PAIR_BYTES, "the metadata count")?;

    let metadata = read_metadata(&mut c, pair_count)?;
    let alignment = alignment(&metadata)?;

    let mut tensors = Vec::with_capacity(reserve(tensor_count));
    let mut names = HashSet::new();
    for index in 0..tensor_count {
        c.at = GgufPlace::TensorInfo { index };
        let name_offset = c.pos;
        let name = c.string("the tensor name")?;
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor {
                tensor: name,
                offset: name_offset,
            });
        }
        c.at = GgufPlace::Tensor { name: name.clone() };
        tensors.push(read_tensor_info(&mut c, name)?);
    }

    // Every writer pads the tensor infos to the alignment, even with no tensor data after them;
    // a file that lacks the padding was cut short.
    let infos_end = c.pos;
    let data_start = infos_end.next_multiple_of(alignment);
    let padding = data_start - infos_end;
    if padding > file_len.saturating_sub(infos_end) {
        return Err(GgufError::Truncated {
            at: GgufPlace::Padding,
            what: "the padding to the alignment",
            offset: infos_end,
            need: padding,
            left: file_len.saturating_sub(infos_end),
        });
    }

    for t in &mut tensors {
        place(t, alignment, data_start, file_len)?;
    }
    check_overlaps(&tensors)?;
    Ok(GgufFile {
        version,
        alignment,
        data_start,
        metadata,
        tensors,
    })
}

fn read_metadata<R: Read>(
    c: &mut Cursor<R>,
    pair_count: u64,
) -> Result<Vec<(String, GgufValue)>, GgufError> {
    let mut metadata = Vec::with_capacity(reserve(pair_count));
    let mut keys = HashSet::new();
    for index in 0..pair_count {
        c.at = GgufPlace::MetadataPair { index };
        let key_offset = c.pos;
        let key = c.string("the key")?;
        if !keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
        c.at = GgufPlace::Metadata { key: key.clone() };
        let ty = value_type(c, "the value type")?;
        let value = read_value(c, ty)?;
        metadata.push((key, value));
    }
    Ok(metadata)
}

/// `general.alignment`, or the default when the key is absent.
fn alignment(metadata: &[(String, GgufValue)]) -> Result<u64, GgufError> {
    let Some((_, value)) = metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match *value {
        GgufValue::U32(a) if a.is_power_of_two() => Ok(a.into()),
        GgufValue::U32(a) => Err(GgufError::BadAlignment { alignment: a }),
        ref other => Err(GgufError::AlignmentType {
            found: other.value_type(),
        }),
    }
}

fn value_type<R: Read>(c: &mut Cursor<R>, what: &'static str) -> Result<GgufValueType, GgufError> {
    let offset = c.pos;
    let code = c.u32(what)?;
    GgufValueType::from_code(code).ok_or_else(|| GgufError::UnknownValueType {
        at: c.at.clone(),
        offset,
        value_type: code,
    })
}

fn read_value<R: Read>(c: &mut Cursor<R>, ty: GgufValueType) -> Result<GgufValue, GgufError> {
    const WHAT: &str = "the value";
    Ok(match ty {
        GgufValueType::U8 => GgufValue::U8(c.num(WHAT)?),
        GgufValueType::I8 => GgufValue::I8(c.num(WHAT)?),
        GgufValueType::U16 => GgufValue::U16(c.num(WHAT)?),
        GgufValueType::I16 => GgufValue::I16(c.num(WHAT)?),
        GgufValueType::U32 => GgufValue::U32(c.num(WHAT)?),
        GgufValueType::I32 => GgufValue::I32(c.num(WHAT)?),
        GgufValueType::F32 => GgufValue::F32(c.num(WHAT)?),
        GgufValueType::Bool => GgufValue::Bool(c.bool(WHAT)?),
        GgufValueType::String => GgufValue::String(c.string("the string value")?),
        GgufValueType::Array => GgufValue::Array(read_array(c, 1)?),
        GgufValueType::U64 => GgufValue::U64(c.num(WHAT)?),
        GgufValueType::I64 => GgufValue::I64(c.num(WHAT)?),
        GgufValueType::F64 => GgufValue::F64(c.num(WHAT)?),
    })
}

/// An array at nesting `depth` (1 for a metadata value that is an array): its element type,
/// count and elements.
fn read_array<R: Read>(c: &mut Cursor<R>, depth: u32) -> Result<GgufArray, GgufError> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::ArrayTooDeep {
            at: c.at.clone(),
            offset: c.pos,
            limit: MAX_ARRAY_DEPTH,
        });
    }
    let ty = value_type(c, "the array's element type")?;
    let n = c.counted(ty.min_bytes(), "the array length")?;
    const WHAT: &str = "an array element";
    Ok(match ty {
        GgufValueType::U8 => GgufArray::U8(c.bytes(n, WHAT)?),
        GgufValueType::I8 => GgufArray::I8(c.elements(n, |c| c.num(WHAT))?),
        GgufValueType::U16 => GgufArray::U16(c.elements(n, |c| c.num(WHAT))?),
        GgufValueType::I16 => GgufArray::I16(c.elements(n, |c| c.num(WHAT))?),
        GgufValueType::U32 => GgufArray::U32(c.elements(n, |c| c.num(WHAT))?),
        GgufValueType::I32 => GgufArray::I32(c.elements(n, |c| c.num(WHAT))?),
        GgufValueType::F32 => GgufArray::F32(c.elements(n, |c| c.num(WHAT))?),
        GgufValueType::Bool => GgufArray::Bool(c.elements(n, |c| c.bool(WHAT))?),
        GgufValueType::String => GgufArray::String(c.elements(n, |c| c.string("an array string"))?),
        GgufValueType::Array => GgufArray::Array(c.elements(n, |c| read_array(c, depth + 1))?),
        GgufValueType::U64 => GgufArray::U64(c.elements(n, |c| c.num(WHAT))?),
        GgufValueType::I64 => GgufArray::I64(c.elements(n, |c| c.num(WHAT))?),
        GgufValueType::F64 => GgufArray::F64(c.elements(n, |c| c.num(WHAT))?),
    })
}

/// The rest of a tensor info after its name: dimensions, type and offset, with the checks that
/// need nothing else from the file.
fn read_tensor_info<R: Read>(c: &mut Cursor<R>, name: String) -> Result<GgufTensor, GgufError> {
    let dims_offset = c.pos;
    let n_dims = c.u32("the dimension count")?;
    if !(1..=MAX_DIMS).contains(&n_dims) {
        return Err(GgufError::BadDims {
            tensor: name,
            offset: dims_offset,
            n_dims,
        });
    }
    let mut ne = Vec::with_capacity(MAX_DIMS as usize);
    for _ in 0..n_dims {
        ne.push(c.u64("a dimension")?);
    }
    let ggml_type = c.u32("the GGML type")?;
    let offset = c.u64("the data offset")?;

    let Some(dtype) = ggml_dtype(ggml_type) else {
        return Err(match ggml_type_name(ggml_type) {
            Some(type_name) => GgufError::UnsupportedType {
                tensor: name,
                ggml_type,
                type_name,
            },
            None => GgufError::UnknownType {
                tensor: name,
                ggml_type,
            },
        });
    };
    let nbytes = tensor_bytes(&name, dtype, &ne)?;
    Ok(GgufTensor {
        name,
        ggml_type,
        dtype,
        ne,
        offset,
        // Set by `place` once the data section's start is known.
        start: 0,
        nbytes,
    })
}

/// Bytes of a tensor of `dtype` with dimensions `ne` (innermost first).
fn tensor_bytes(name: &str, dtype: DType, ne: &[u64]) -> Result<u64, GgufError> {
    let block = dtype.block_elems() as u64;
    let row = ne.first().copied().unwrap_or(0);
    if !row.is_multiple_of(block) {
        return Err(GgufError::RowNotWholeBlocks {
            tensor: name.to_owned(),
            dtype,
            row,
            block_elems: block,
            ne: ne.to_vec(),
        });
    }
    let overflow = || GgufError::ShapeOverflow {
        tensor: name.to_owned(),
        dtype,
        ne: ne.to_vec(),
    };
    // Callers turn the shape into usizes and count elements in usize.
    if ne.iter().any(|&d| usize::try_from(d).is_err()) {
        return Err(overflow());
    }
    // A zero dimension makes the tensor empty however large the others are.
    let numel = if ne.contains(&0) {
        0
    } else {
        ne.iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .filter(|&n| usize::try_from(n).is_ok())
            .ok_or_else(overflow)?
    };
    dtype.bytes_for(numel).ok_or_else(overflow)
}

/// Resolves a tensor's offset against the data section and checks it is aligned and inside the
/// file.
fn place(
    t: &mut GgufTensor,
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    if !t.offset.is_multiple_of(alignment) {
        return Err(GgufError::Misaligned {
            tensor: t.name.clone(),
            offset: t.offset,
            alignment,
        });
    }
    let end = data_start
        .checked_add(t.offset)
        .and_then(|start| start.checked_add(t.nbytes));
    match end {
        Some(end) if end <= file_len => {
            t.start = data_start + t.offset;
            Ok(())
        }
        _ => Err(GgufError::DataBeyondFile {
            tensor: t.name.clone(),
            offset: t.offset,
            nbytes: t.nbytes,
            data_start,
            file_len,
        }),
    }
}

/// Ranges sorted by start must each begin at or after the end of the one before; since the
/// first overlap stops the check, that end is also the furthest seen so far. An empty range
/// strictly inside another tensor counts as an overlap, as in a safetensors header.
fn check_overlaps(tensors: &[GgufTensor]) -> Result<(), GgufError> {
    let mut by_start: Vec<&GgufTensor> = tensors.iter().collect();
    by_start.sort_by_key(|t| (t.start, t.end()));
    for pair in by_start.windows(2) {
        if let [prev, t] = pair {
            if t.start < prev.end() {
                return Err(GgufError::Overlap {
                    tensor: t.name.clone(),
                    start: t.start,
                    end: t.end(),
                    other: prev.name.clone(),
                    other_start: prev.start,
                    other_end: prev.end(),
                });
            }
        }
    }
    Ok(())
}

/// Elements to reserve ahead for a vector of `count`.
fn reserve(count: u64) -> usize {
    usize::try_from(count.min(RESERVE_LIMIT)).unwrap_or(0)
}

/// The reader, where it is in the file, and which entry it is in (for messages).
struct Cursor<R> {
    reader: R,
    /// Bytes consumed so far: the absolute offset of the next byte.
    pos: u64,
    file_len: u64,
    at: GgufPlace,
}

impl<R: Read> Cursor<R> {
    /// Checks that `need` bytes from here are in the file and within the header limit.
    fn check(&self, need: u64, what: &'static str) -> Result<(), GgufError> {
        let left = self.file_len.saturating_sub(self.pos);
        if need > left {
            return Err(GgufError::Truncated {
                at: self.at.clone(),
                what,
                offset: self.pos,
                need,
                left,
            });
        }
        if need > MAX_GGUF_HEADER_LEN.saturating_sub(self.pos) {
            return Err(GgufError::HeaderTooLarge {
                at: self.at.clone(),
                what,
                offset: self.pos,
                need,
                limit: MAX_GGUF_HEADER_LEN,
            });
        }
        Ok(())
    }

    fn read_into(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), GgufError> {
        let offset = self.pos;
        self.reader
            .read_exact(buf)
            .map_err(|source| GgufError::Read {
                at: self.at.clone(),
                what,
                offset,
                source,
            })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        self.check(N as u64, what)?;
        let mut buf = [0u8; N];
        self.read_into(&mut buf, what)?;
        Ok(buf)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.num(what)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.num(what)
    }

    fn num<T: LeNumber>(&mut self, what: &'static str) -> Result<T, GgufError> {
        T::read(self, what)
    }

    fn bool(&mut self, what: &'static str) -> Result<bool, GgufError> {
        let offset = self.pos;
        match self.array::<1>(what)? {
            [0] => Ok(false),
            [1] => Ok(true),
            [byte] => Err(GgufError::BadBool {
                at: self.at.clone(),
                offset,
                byte,
            }),
        }
    }

    /// A u64 count of items of at least `min_bytes` each, checked against the bytes left after
    /// it.
    fn counted(&mut self, min_bytes: u64, what: &'static str) -> Result<u64, GgufError> {
        let offset = self.pos;
        let count = self.u64(what)?;
        let need = count.saturating_mul(min_bytes);
        if let Err(e) = self.check(need, what) {
            return Err(match e {
                GgufError::Truncated { at, left, .. } => GgufError::CountBeyondFile {
                    at,
                    what,
                    offset,
                    count,
                    min_bytes,
                    left,
                },
                other => other,
            });
        }
        Ok(count)
    }

    /// `n` raw bytes. Read in pieces so that memory grows with the bytes actually read.
    fn bytes(&mut self, n: u64, what: &'static str) -> Result<Vec<u8>, GgufError> {
        self.check(n, what)?;
        let mut out = Vec::new();
        let mut left = n;
        while left > 0 {
            let k = reserve(left).max(1);
            let filled = out.len();
            out.resize(filled + k, 0);
            self.read_into(out.get_mut(filled..).unwrap_or_default(), what)?;
            left = left.saturating_sub(k as u64);
        }
        Ok(out)
    }

    /// A string: a u64 length, then that many bytes of UTF-8.
    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let offset = self.pos;
        let bytes = self.bytes(len, what)?;
        String::from_utf8(bytes).map_err(|e| GgufError::NotUtf8 {
            at: self.at.clone(),
            what,
            offset,
            valid_up_to: e.utf8_error().valid_up_to() as u64,
        })
    }

    /// `n` elements read one by one, `n` already checked against the bytes left.
    fn elements<T>(
        &mut self,
        n: u64,
        mut one: impl FnMut(&mut Self) -> Result<T, GgufError>,
    ) -> Result<Vec<T>, GgufError> {
        let mut out = Vec::with_capacity(reserve(n));
        for _ in 0..n {
            out.push(one(self)?);
        }
        Ok(out)
    }
}

/// The fixed-width numbers of the format, each read little-endian from its own width of bytes.
trait LeNumber: Sized {
    fn read<R: Read>(c: &mut Cursor<R>, what: &'static str) -> Result<Self, GgufError>;
}

macro_rules! le_number {
    ($($t:ty),*) => {$(
        impl LeNumber for $t {
            fn read<R: Read>(c: &mut Cursor<R>, what: &'static str) -> Result<Self, GgufError> {
                c.array(what).map(<$t>::from_le_bytes)
            }
        }
    )*};
}

le_number!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

//! The JSON header of one safetensors file: parsing and validation, with no I/O.
//!
//! Everything here takes untrusted bytes and must never panic: no indexing, no unchecked
//! arithmetic, and every problem a [`HeaderError`] variant.

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::HeaderError;
use super::json::{first_duplicate, json_kind, Node};
use crate::dtype::DType;

/// The largest header accepted, as in the reference implementation: it bounds the one allocation
/// made from the length field before anything is validated.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor of a header, with offsets relative to the start of the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderEntry {
    /// The tensor's name, the key of its entry.
    pub name: String,
    /// Its dtype, from the entry's `dtype` string.
    pub dtype: DType,
    /// Elements along each dimension, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// First byte, relative to the data section.
    pub begin: u64,
    /// One past the last byte, relative to the data section.
    pub end: u64,
}

/// A validated header: the tensors in the order the file lists them, and `__metadata__`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    /// The `__metadata__` object's string pairs; empty when the header has none.
    pub metadata: BTreeMap<String, String>,
    /// Every tensor, in the order the file lists them.
    pub entries: Vec<HeaderEntry>,
}

/// Parses and validates a header's JSON, given the length of the data section that follows it.
///
/// On success every entry has a known dtype, a byte range inside `[0, data_len)` whose length is
/// exactly `numel x dtype size`, and no two ranges share a byte (gaps are allowed).
pub fn parse_header(header_json: &[u8], data_len: u64) -> Result<Header, HeaderError> {
    if let Err(e) = std::str::from_utf8(header_json) {
        return Err(HeaderError::NotUtf8 {
            offset: e.valid_up_to(),
        });
    }
    let top: Node<Node<Value>> =
        serde_json::from_slice(header_json).map_err(|e| HeaderError::NotJson {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
    let pairs = match top {
        Node::Object(pairs) => pairs,
        other => {
            return Err(HeaderError::NotObject {
                found: other.kind(),
            })
        }
    };
    if let Some(name) = first_duplicate(&pairs) {
        return Err(if name == "__metadata__" {
            HeaderError::DuplicateMetadata
        } else {
            HeaderError::DuplicateTensor {
                tensor: name.to_owned(),
            }
        });
    }

    let mut header = Header::default();
    for (name, node) in pairs {
        if name == "__metadata__" {
            header.metadata = parse_metadata(node)?;
        } else {
            header.entries.push(parse_entry(name, node, data_len)?);
        }
    }
    check_overlaps(&header.entries)?;
    Ok(header)
}

fn parse_metadata(node: Node<Value>) -> Result<BTreeMap<String, String>, HeaderError> {
    let pairs = match node {
        Node::Object(pairs) => pairs,
        other => {
            return Err(HeaderError::MetadataNotObject {
                found: other.kind(),
            })
        }
    };
    if let Some(key) = first_duplicate(&pairs) {
        return Err(HeaderError::DuplicateMetadataKey {
            key: key.to_owned(),
        });
    }
    pairs
        .into_iter()
        .map(|(key, value)| match value {
            Value::String(s) => Ok((key, s)),
            other => Err(HeaderError::MetadataValueNotString {
                found: json_kind(&other),
                key,
            }),
        })
        .collect()
}

fn parse_entry(name: String, node: Node<Value>, data_len: u64) -> Result<HeaderEntry, HeaderError> {
    let pairs = match node {
        Node::Object(pairs) => pairs,
        other => {
            return Err(HeaderError::EntryNotObject {
                tensor: name,
                found: other.kind(),
            })
        }
    };
    if let Some(field) = first_duplicate(&pairs) {
        return Err(HeaderError::DuplicateField {
            field: field.to_owned(),
            tensor: name,
        });
    }
    // Unknown fields are ignored, as the reference implementation does.
    let field = |key: &'static str| -> Result<&Value, HeaderError> {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| HeaderError::MissingField {
                tensor: name.clone(),
                field: key,
            })
    };
    let wrong =
        |field: &'static str, expected: &'static str, found: &Value| HeaderError::WrongFieldType {
            tensor: name.clone(),
            field,
            expected,
            found: preview(found),
        };

    let dtype_value = field("dtype")?;
    let shape_value = field("shape")?;
    let offsets_value = field("data_offsets")?;

    let dtype_name = dtype_value
        .as_str()
        .ok_or_else(|| wrong("dtype", "a string", dtype_value))?;
    let dtype =
        DType::from_safetensors_name(dtype_name).ok_or_else(|| HeaderError::UnknownDtype {
            tensor: name.clone(),
            dtype: dtype_name.to_owned(),
        })?;

    const SHAPE: &str = "an array of non-negative integers";
    let shape = shape_value
        .as_array()
        .ok_or_else(|| wrong("shape", SHAPE, shape_value))?
        .iter()
        .map(|d| {
            d.as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(|| wrong("shape", SHAPE, shape_value))
        })
        .collect::<Result<Vec<usize>, _>>()?;

    const OFFSETS: &str = "an array of 2 non-negative integers";
    let (begin, end) = match offsets_value.as_array().map(Vec::as_slice) {
        Some([b, e]) => match (b.as_u64(), e.as_u64()) {
            (Some(b), Some(e)) => (b, e),
            _ => return Err(wrong("data_offsets", OFFSETS, offsets_value)),
        },
        _ => return Err(wrong("data_offsets", OFFSETS, offsets_value)),
    };

    if begin > end {
        return Err(HeaderError::OffsetsReversed {
            tensor: name,
            begin,
            end,
        });
    }
    if end > data_len {
        return Err(HeaderError::OffsetsBeyondData {
            tensor: name,
            begin,
            end,
            data_len,
        });
    }
    let expected = byte_len(dtype, &shape).ok_or_else(|| HeaderError::ShapeOverflow {
        tensor: name.clone(),
        dtype,
        shape: shape.clone(),
    })?;
    // begin <= end was checked above, so this cannot wrap.
    let found = end - begin;
    if found != expected {
        return Err(HeaderError::SizeMismatch {
            tensor: name,
            begin,
            end,
            found,
            dtype,
            shape,
            expected,
        });
    }
    Ok(HeaderEntry {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

/// `numel x dtype size` in bytes, or `None` if it does not fit in 64 bits. The element count
/// must also fit in `usize`, since callers index tensors by it.
pub(crate) fn byte_len(dtype: DType, shape: &[usize]) -> Option<u64> {
    // A zero dimension makes the tensor empty however large the others are.
    if shape.contains(&0) {
        return Some(0);
    }
    let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    u64::try_from(numel).ok()?.checked_mul(dtype.size() as u64)
}

/// Ranges are sorted by start; each must begin at or after the end of the one before. Since a
/// range never ends before it begins, that end is also the furthest seen so far. An empty range
/// strictly inside another tensor counts as an overlap: no writer produces one.
fn check_overlaps(entries: &[HeaderEntry]) -> Result<(), HeaderError> {
    let mut by_start: Vec<&HeaderEntry> = entries.iter().collect();
    by_start.sort_by_key(|e| (e.begin, e.end));
    for pair in by_start.windows(2) {
        if let [prev, e] = pair {
            if e.begin < prev.end {
                return Err(HeaderError::Overlap {
                    tensor: e.name.clone(),
                    begin: e.begin,
                    end: e.end,
                    other: prev.name.clone(),
                    other_begin: prev.begin,
                    other_end: prev.end,
                });
            }
        }
    }
    Ok(())
}

/// A short JSON rendering of a bad value for a message: enough to recognise it, never megabytes.
fn preview(v: &Value) -> String {
    const MAX: usize = 60;
    let text = v.to_string();
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", text.get(..cut).unwrap_or_default()),
        None => text,
    }
}

//! The typed values of GGUF metadata.
//!
//! An array keeps its elements in one vector of their type (a vocabulary of 150k tokens is one
//! `Vec<String>`, not 150k tagged values), and an empty array keeps its element type, so a file
//! written back from what was read is the same bytes.

use std::fmt;

/// The type code of a metadata value or of an array's elements, as the file writes it (a u32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    /// 0: unsigned 8-bit integer.
    U8,
    /// 1: signed 8-bit integer.
    I8,
    /// 2: unsigned 16-bit integer.
    U16,
    /// 3: signed 16-bit integer.
    I16,
    /// 4: unsigned 32-bit integer.
    U32,
    /// 5: signed 32-bit integer.
    I32,
    /// 6: 32-bit IEEE float.
    F32,
    /// 7: bool, one byte that must be 0 or 1.
    Bool,
    /// 8: string: a u64 byte length, then that many bytes of UTF-8.
    String,
    /// 9: array: a u32 element type, a u64 element count, then the elements.
    Array,
    /// 10: unsigned 64-bit integer.
    U64,
    /// 11: signed 64-bit integer.
    I64,
    /// 12: 64-bit IEEE float.
    F64,
}

impl GgufValueType {
    /// Every type, in the order of their codes (0 to 12).
    pub const ALL: [GgufValueType; 13] = [
        GgufValueType::U8,
        GgufValueType::I8,
        GgufValueType::U16,
        GgufValueType::I16,
        GgufValueType::U32,
        GgufValueType::I32,
        GgufValueType::F32,
        GgufValueType::Bool,
        GgufValueType::String,
        GgufValueType::Array,
        GgufValueType::U64,
        GgufValueType::I64,
        GgufValueType::F64,
    ];

    /// The type's code in the file.
    pub const fn code(self) -> u32 {
        match self {
            GgufValueType::U8 => 0,
            GgufValueType::I8 => 1,
            GgufValueType::U16 => 2,
            GgufValueType::I16 => 3,
            GgufValueType::U32 => 4,
            GgufValueType::I32 => 5,
            GgufValueType::F32 => 6,
            GgufValueType::Bool => 7,
            GgufValueType::String => 8,
            GgufValueType::Array => 9,
            GgufValueType::U64 => 10,
            GgufValueType::I64 => 11,
            GgufValueType::F64 => 12,
        }
    }

    /// The type of a code, `None` for a code no GGUF version defines.
    pub fn from_code(code: u32) -> Option<GgufValueType> {
        usize::try_from(code)
            .ok()
            .and_then(|i| GgufValueType::ALL.get(i))
            .copied()
    }

    /// The type's name for messages (`"u32"`, `"string"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            GgufValueType::U8 => "u8",
            GgufValueType::I8 => "i8",
            GgufValueType::U16 => "u16",
            GgufValueType::I16 => "i16",
            GgufValueType::U32 => "u32",
            GgufValueType::I32 => "i32",
            GgufValueType::F32 => "f32",
            GgufValueType::Bool => "bool",
            GgufValueType::String => "string",
            GgufValueType::Array => "array",
            GgufValueType::U64 => "u64",
            GgufValueType::I64 => "i64",
            GgufValueType::F64 => "f64",
        }
    }

    /// The fewest bytes a value of this type takes in the file (without its type code): what a
    /// count of them is checked against before anything is allocated.
    pub const fn min_bytes(self) -> u64 {
        match self {
            GgufValueType::U8 | GgufValueType::I8 | GgufValueType::Bool => 1,
            GgufValueType::U16 | GgufValueType::I16 => 2,
            GgufValueType::U32 | GgufValueType::I32 | GgufValueType::F32 => 4,
            GgufValueType::U64 | GgufValueType::I64 | GgufValueType::F64 => 8,
            // The length field of an empty string.
            GgufValueType::String => 8,
            // The element type and count of an empty array.
            GgufValueType::Array => 12,
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Unsigned 8-bit integer.
    U8(u8),
    /// Signed 8-bit integer.
    I8(i8),
    /// Unsigned 16-bit integer.
    U16(u16),
    /// Signed 16-bit integer.
    I16(i16),
    /// Unsigned 32-bit integer.
    U32(u32),
    /// Signed 32-bit integer.
    I32(i32),
    /// 32-bit float.
    F32(f32),
    /// Bool.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array of values of one type.
    Array(GgufArray),
    /// Unsigned 64-bit integer.
    U64(u64),
    /// Signed 64-bit integer.
    I64(i64),
    /// 64-bit float.
    F64(f64),
}

impl GgufValue {
    /// The value's type.
    pub const fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// An integer of any width or sign, when it is not negative: writers differ in the integer
    /// type they give a count (`u32` or `u64`), so readers ask for the number.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An integer of any width or sign, when it fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float of either width. Integers give `None`: a key written as an integer is not a
    /// float a reader should silently accept.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// An array: elements of one type, kept in one vector of that type. Arrays of arrays hold
/// arrays of any element types (each inner array says its own).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    /// Unsigned 8-bit integers.
    U8(Vec<u8>),
    /// Signed 8-bit integers.
    I8(Vec<i8>),
    /// Unsigned 16-bit integers.
    U16(Vec<u16>),
    /// Signed 16-bit integers.
    I16(Vec<i16>),
    /// Unsigned 32-bit integers.
    U32(Vec<u32>),
    /// Signed 32-bit integers.
    I32(Vec<i32>),
    /// 32-bit floats.
    F32(Vec<f32>),
    /// Bools.
    Bool(Vec<bool>),
    /// Strings (a tokenizer's vocabulary, its merges).
    String(Vec<String>),
    /// Arrays.
    Array(Vec<GgufArray>),
    /// Unsigned 64-bit integers.
    U64(Vec<u64>),
    /// Signed 64-bit integers.
    I64(Vec<i64>),
    /// 64-bit floats.
    F64(Vec<f64>),
}

impl GgufArray {
    /// The type of the elements.
    pub const fn element_type(&self) -> GgufValueType {
        match self {
            GgufArray::U8(_) => GgufValueType::U8,
            GgufArray::I8(_) => GgufValueType::I8,
            GgufArray::U16(_) => GgufValueType::U16,
            GgufArray::I16(_) => GgufValueType::I16,
            GgufArray::U32(_) => GgufValueType::U32,
            GgufArray::I32(_) => GgufValueType::I32,
            GgufArray::F32(_) => GgufValueType::F32,
            GgufArray::Bool(_) => GgufValueType::Bool,
            GgufArray::String(_) => GgufValueType::String,
            GgufArray::Array(_) => GgufValueType::Array,
            GgufArray::U64(_) => GgufValueType::U64,
            GgufArray::I64(_) => GgufValueType::I64,
            GgufArray::F64(_) => GgufValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One element as a value (a copy), `None` past the end.
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        match self {
            GgufArray::U8(v) => v.get(i).copied().map(GgufValue::U8),
            GgufArray::I8(v) => v.get(i).copied().map(GgufValue::I8),
            GgufArray::U16(v) => v.get(i).copied().map(GgufValue::U16),
            GgufArray::I16(v) => v.get(i).copied().map(GgufValue::I16),
            GgufArray::U32(v) => v.get(i).copied().map(GgufValue::U32),
            GgufArray::I32(v) => v.get(i).copied().map(GgufValue::I32),
            GgufArray::F32(v) => v.get(i).copied().map(GgufValue::F32),
            GgufArray::Bool(v) => v.get(i).copied().map(GgufValue::Bool),
            GgufArray::String(v) => v.get(i).cloned().map(GgufValue::String),
            GgufArray::Array(v) => v.get(i).cloned().map(GgufValue::Array),
            GgufArray::U64(v) => v.get(i).copied().map(GgufValue::U64),
            GgufArray::I64(v) => v.get(i).copied().map(GgufValue::I64),
            GgufArray::F64(v) => v.get(i).copied().map(GgufValue::F64),
        }
    }

    /// The elements of an array of strings.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }
}

//! The element types a checkpoint can hold, with their names in safetensors headers and in
//! user-facing options.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::DtypeError;

/// An element type of a stored tensor.
///
/// Floating-point types can be converted by the kernels of this module; integer and bool
/// tensors are read and moved as bytes but never converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// 64-bit IEEE float.
    #[serde(rename = "F64")]
    F64,
    /// 32-bit IEEE float.
    #[serde(rename = "F32")]
    F32,
    /// 16-bit IEEE half float.
    #[serde(rename = "F16")]
    F16,
    /// bfloat16: f32's exponent with a 7-bit mantissa.
    #[serde(rename = "BF16")]
    BF16,
    /// 8-bit float e4m3fn (4 exponent bits, 3 mantissa bits, no infinities; max 448).
    #[serde(rename = "F8_E4M3")]
    F8E4M3,
    /// 8-bit float e5m2 (5 exponent bits, 2 mantissa bits).
    #[serde(rename = "F8_E5M2")]
    F8E5M2,
    /// Signed 64-bit integer.
    #[serde(rename = "I64")]
    I64,
    /// Signed 32-bit integer.
    #[serde(rename = "I32")]
    I32,
    /// Signed 16-bit integer.
    #[serde(rename = "I16")]
    I16,
    /// Signed 8-bit integer.
    #[serde(rename = "I8")]
    I8,
    /// Unsigned 64-bit integer.
    #[serde(rename = "U64")]
    U64,
    /// Unsigned 32-bit integer.
    #[serde(rename = "U32")]
    U32,
    /// Unsigned 16-bit integer.
    #[serde(rename = "U16")]
    U16,
    /// Unsigned 8-bit integer.
    #[serde(rename = "U8")]
    U8,
    /// Boolean, one byte per element.
    #[serde(rename = "BOOL")]
    Bool,
}

/// Every dtype, in the order of the enum.
pub const ALL_DTYPES: [DType; 15] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8E4M3,
    DType::F8E5M2,
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U64,
    DType::U32,
    DType::U16,
    DType::U8,
    DType::Bool,
];

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The name used in safetensors headers (`"BF16"`, `"F8_E4M3"`, ...).
    pub const fn safetensors_name(self) -> &'static str {
        match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U64 => "U64",
            DType::U32 => "U32",
            DType::U16 => "U16",
            DType::U8 => "U8",
            DType::Bool => "BOOL",
        }
    }

    /// The short name users write in options (`"bf16"`, `"fp8_e4m3fn"`, ...).
    pub const fn short_name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "fp8_e4m3fn",
            DType::F8E5M2 => "fp8_e5m2",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// Parses a dtype as written in a safetensors header. Only the exact header spellings are
    /// accepted; anything else is `None` so the caller can name the file and tensor.
    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        ALL_DTYPES
            .into_iter()
            .find(|d| d.safetensors_name() == name)
    }

    /// Floating-point types: the ones the conversion kernels accept.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    /// The two 8-bit float types.
    pub const fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::F8E5M2)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// What `DType::from_str` accepts, for error messages.
pub const ACCEPTED_DTYPE_NAMES: &str = "f32/fp32/float32, f16/fp16/float16/half, bf16/bfloat16, \
     fp8/fp8_e4m3fn/float8_e4m3fn/F8_E4M3, fp8_e5m2/float8_e5m2/F8_E5M2, f64/float64, \
     and the integer types i8..i64, u8..u64, bool";

impl FromStr for DType {
    type Err = DtypeError;

    /// Parses a user-facing dtype name, case-insensitively: short names, torch names (with or
    /// without `torch.`) and safetensors header names.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let key = lower.strip_prefix("torch.").unwrap_or(&lower);
        let d = match key {
            "f64" | "fp64" | "float64" | "double" => DType::F64,
            "f32" | "fp32" | "float32" | "float" => DType::F32,
            "f16" | "fp16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "fp8" | "f8" | "fp8_e4m3fn" | "float8_e4m3fn" | "f8_e4m3" | "e4m3" | "e4m3fn" => {
                DType::F8E4M3
            }
            "fp8_e5m2" | "float8_e5m2" | "f8_e5m2" | "e5m2" => DType::F8E5M2,
            "i64" | "int64" | "long" => DType::I64,
            "i32" | "int32" | "int" => DType::I32,
            "i16" | "int16" | "short" => DType::I16,
            "i8" | "int8" => DType::I8,
            "u64" | "uint64" => DType::U64,
            "u32" | "uint32" => DType::U32,
            "u16" | "uint16" => DType::U16,
            "u8" | "uint8" => DType::U8,
            "bool" => DType::Bool,
            _ => {
                return Err(DtypeError::UnknownName {
                    name: s.to_string(),
                    accepted: ACCEPTED_DTYPE_NAMES,
                })
            }
        };
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_round_trip() {
        for d in ALL_DTYPES {
            assert_eq!(DType::from_safetensors_name(d.safetensors_name()), Some(d));
            assert_eq!(d.safetensors_name().parse::<DType>().unwrap(), d);
            assert_eq!(d.short_name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::from_safetensors_name("bf16"), None);
    }

    #[test]
    fn user_names() {
        assert_eq!("torch.bfloat16".parse::<DType>().unwrap(), DType::BF16);
        assert_eq!("FP8".parse::<DType>().unwrap(), DType::F8E4M3);
        let err = "bf17".parse::<DType>().unwrap_err().to_string();
        assert!(err.contains("bf17") && err.contains("bfloat16"), "{err}");
    }
}

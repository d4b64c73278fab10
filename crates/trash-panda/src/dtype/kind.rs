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
    /// GGML Q4_0: blocks of 32 weights, an f16 scale and 4-bit codes offset by 8 (18 bytes).
    #[serde(rename = "Q4_0")]
    Q4_0,
    /// GGML Q4_1: blocks of 32 weights, f16 scale and minimum, 4-bit codes (20 bytes).
    #[serde(rename = "Q4_1")]
    Q4_1,
    /// GGML Q5_0: blocks of 32 weights, an f16 scale and 5-bit codes offset by 16 (22 bytes).
    #[serde(rename = "Q5_0")]
    Q5_0,
    /// GGML Q5_1: blocks of 32 weights, f16 scale and minimum, 5-bit codes (24 bytes).
    #[serde(rename = "Q5_1")]
    Q5_1,
    /// GGML Q8_0: blocks of 32 weights, an f16 scale and signed 8-bit codes (34 bytes).
    #[serde(rename = "Q8_0")]
    Q8_0,
    /// GGML Q2_K: super-blocks of 256 weights, 16 groups with 4-bit scales and minimums (84 bytes).
    #[serde(rename = "Q2_K")]
    Q2K,
    /// GGML Q3_K: super-blocks of 256 weights, 16 groups with 6-bit scales, 3-bit codes (110 bytes).
    #[serde(rename = "Q3_K")]
    Q3K,
    /// GGML Q4_K: super-blocks of 256 weights, 8 groups with 6-bit scales and minimums (144 bytes).
    #[serde(rename = "Q4_K")]
    Q4K,
    /// GGML Q5_K: Q4_K's layout with a fifth bit per code (176 bytes).
    #[serde(rename = "Q5_K")]
    Q5K,
    /// GGML Q6_K: super-blocks of 256 weights, 16 groups with 8-bit scales, 6-bit codes (210 bytes).
    #[serde(rename = "Q6_K")]
    Q6K,
}

/// Every element type (one element, a whole number of bytes), in the order of the enum: the types
/// a safetensors header can name.
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

/// The GGML block-quantized types, in the order of the enum: stored in blocks of
/// [`DType::block_elems`] weights, [`DType::size`] bytes each.
pub const BLOCK_DTYPES: [DType; 10] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

impl DType {
    /// Bytes of one storage unit: an element, or for a block-quantized type one block of
    /// [`DType::block_elems`] elements. [`DType::bytes_for`] counts a tensor's bytes either way.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 | DType::Bool => 1,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
        }
    }

    /// Elements per storage unit: 1 for an element type, 32 or 256 for the GGML blocks.
    pub const fn block_elems(self) -> usize {
        match self {
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => 256,
            _ => 1,
        }
    }

    /// The GGML block-quantized types: whole blocks only, expanded by `dequantize`.
    pub const fn is_block(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of `elements` elements, `None` when they are not a whole number of blocks or the
    /// count overflows.
    pub const fn bytes_for(self, elements: u64) -> Option<u64> {
        let per = self.block_elems() as u64;
        if !elements.is_multiple_of(per) {
            return None;
        }
        (elements / per).checked_mul(self.size() as u64)
    }

    /// The name used in safetensors headers (`"BF16"`, `"F8_E4M3"`, ...), and for the block types
    /// their GGML name (`"Q4_K"`), which no safetensors header may use. The binding passes dtypes
    /// by these names.
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
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q8_0 => "Q8_0",
            DType::Q2K => "Q2_K",
            DType::Q3K => "Q3_K",
            DType::Q4K => "Q4_K",
            DType::Q5K => "Q5_K",
            DType::Q6K => "Q6_K",
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
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }

    /// Parses a dtype as written in a safetensors header. Only the exact header spellings of the
    /// element types are accepted; anything else is `None` so the caller can name the file and
    /// tensor.
    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        ALL_DTYPES
            .into_iter()
            .find(|d| d.safetensors_name() == name)
    }

    /// Parses any dtype's [`DType::safetensors_name`], the block types' GGML names included: how
    /// the binding receives dtypes.
    pub fn from_name(name: &str) -> Option<DType> {
        ALL_DTYPES
            .into_iter()
            .chain(BLOCK_DTYPES)
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
     the integer types i8/int8..i64, u8..u64, bool, and the GGML blocks q4_0, q4_1, q5_0, q5_1, \
     q8_0, q2_k, q3_k, q4_k, q5_k, q6_k";

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
            _ => match BLOCK_DTYPES.into_iter().find(|d| d.short_name() == key) {
                Some(d) => d,
                None => {
                    return Err(DtypeError::UnknownName {
                        name: s.to_string(),
                        accepted: ACCEPTED_DTYPE_NAMES,
                    })
                }
            },
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
        for d in BLOCK_DTYPES {
            assert_eq!(DType::from_safetensors_name(d.safetensors_name()), None);
            assert_eq!(DType::from_name(d.safetensors_name()), Some(d));
            assert_eq!(d.short_name().parse::<DType>().unwrap(), d);
            assert!(d.is_block() && !d.is_float());
        }
    }

    #[test]
    fn block_byte_counts() {
        assert_eq!(DType::Q4K.bytes_for(4096 * 256), Some(4096 * 144));
        assert_eq!(DType::Q8_0.bytes_for(33), None);
        assert_eq!(DType::BF16.bytes_for(3), Some(6));
        assert_eq!(DType::F32.bytes_for(u64::MAX), None);
    }

    #[test]
    fn user_names() {
        assert_eq!("torch.bfloat16".parse::<DType>().unwrap(), DType::BF16);
        assert_eq!("FP8".parse::<DType>().unwrap(), DType::F8E4M3);
        let err = "bf17".parse::<DType>().unwrap_err().to_string();
        assert!(err.contains("bf17") && err.contains("bfloat16"), "{err}");
    }
}

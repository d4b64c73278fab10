//! What `storage_dtype` does to a tensor on load, and which tensors are expanded to the compute
//! dtype before their block runs. The planner counts by these rules, the engine converts by them
//! and the CPU and CUDA backends expand by them: one rule for all.

use super::block::StreamTensor;
use super::error::RuleError;
use super::tensor::TensorSizes;
use crate::DType;

/// The storage dtypes the engine converts to, for error messages.
pub const STORAGE_DTYPES: &str =
    "none (as stored), bf16, fp8 (e4m3fn), int8 (one scale per row), q8_0 (GGML blocks)";

/// The smallest 2-D weight the 8-bit storage dtypes (`fp8`, `int8`, `q8_0`) quantize (1 Mi
/// elements, e.g. 1024 x 1024): below that the scales and the precision loss buy little.
pub const FP8_MIN_ELEMENTS: u64 = 1 << 20;

/// What `storage_dtype` does to one tensor on load. The planner counts by it, the engine and the
/// Python loader convert by it: one rule for all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// Left in its file dtype.
    Keep,
    /// Cast to bf16, rounding to nearest even.
    ToBf16,
    /// Quantized to e4m3fn with one f32 scale per row.
    ToFp8 {
        /// The weight's first dimension: one scale per row.
        rows: usize,
        /// The weight's second dimension (elements per row).
        cols: usize,
    },
    /// Quantized to int8 codes with one f32 scale per row (symmetric, amax / 127).
    ToInt8 {
        /// The weight's first dimension: one scale per row.
        rows: usize,
        /// The weight's second dimension (elements per row).
        cols: usize,
    },
    /// Quantized to GGML Q8_0 blocks (32 weights, an f16 scale each, along the rows).
    ToQ8_0,
}

/// Float tensors wider than the storage dtype are converted, never a checkpoint's scale tensors;
/// for the 8-bit dtypes, only 2-D weights of at least [`FP8_MIN_ELEMENTS`] (for q8_0, with rows
/// of whole blocks of 32).
pub fn storage_conversion(t: &TensorSizes, storage: DType) -> Conversion {
    let eight_bit = storage.is_fp8() || matches!(storage, DType::I8 | DType::Q8_0);
    if !t.dtype.is_float()
        || t.is_scale()
        || t.dtype.size() <= if eight_bit { 1 } else { storage.size() }
    {
        return Conversion::Keep;
    }
    if !eight_bit {
        return Conversion::ToBf16;
    }
    match t.shape[..] {
        [rows, cols] if t.numel() >= FP8_MIN_ELEMENTS => match storage {
            DType::I8 => Conversion::ToInt8 { rows, cols },
            DType::Q8_0 if cols.is_multiple_of(32) => Conversion::ToQ8_0,
            DType::Q8_0 => Conversion::Keep,
            _ => Conversion::ToFp8 { rows, cols },
        },
        _ => Conversion::Keep,
    }
}

/// The dtype a tensor is held in on the device and in RAM after `storage_dtype`, and whether the
/// conversion gave it per-row scales.
pub fn stored_form(t: &TensorSizes, storage: Option<DType>) -> (DType, bool) {
    match storage.map(|s| storage_conversion(t, s)) {
        None | Some(Conversion::Keep) => (t.dtype, false),
        Some(Conversion::ToBf16) => (DType::BF16, false),
        Some(Conversion::ToFp8 { .. }) => (DType::F8E4M3, true),
        Some(Conversion::ToInt8 { .. }) => (DType::I8, true),
        Some(Conversion::ToQ8_0) => (DType::Q8_0, false),
    }
}

/// Whether a weight held as `held` (its dtype in the tier) is expanded into the expansion buffer
/// before its block runs, rather than used in place: a float tensor in another dtype than the
/// compute dtype, or one with a scale to apply; GGML blocks always; int8 codes with their
/// scale. The CPU and CUDA backends follow this rule and the planner counts by it.
pub fn needs_expansion(held: DType, compute: DType, scaled: bool) -> bool {
    held.is_block()
        || (held == DType::I8 && scaled)
        || (held.is_float() && (held != compute || scaled))
}

/// One tensor as the expansion layout sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpansionInput {
    /// The dtype the tensor is held in (file, or storage dtype).
    pub held: DType,
    /// Elements in the tensor (the product of its shape).
    pub elements: u64,
    /// Whether a scale applies (a checkpoint scale tensor, or per-row scales from a storage
    /// conversion to fp8).
    pub scaled: bool,
    /// Whether the model takes its rows in another order than the stored one: it is then
    /// expanded whatever its dtype.
    pub reordered: bool,
}

/// Where each expanded tensor of a block goes in the expansion buffer (`None`: used in place),
/// and the bytes the block needs: tensors in the compute dtype, one after the other, each taking
/// whole `align` units so that the total does not depend on the order of the tensors.
pub fn expansion_layout(
    tensors: &[ExpansionInput],
    compute: DType,
    align: usize,
) -> (Vec<Option<u64>>, u64) {
    let mut end = 0u64;
    let offsets = tensors
        .iter()
        .map(|t| {
            (t.reordered || needs_expansion(t.held, compute, t.scaled)).then(|| {
                let at = end;
                end += (t.elements * compute.size() as u64).next_multiple_of(align as u64);
                at
            })
        })
        .collect();
    (offsets, end)
}

/// The rule of [`storage_conversion`], applied to a staged tensor.
pub(crate) fn tensor_conversion(t: &StreamTensor, storage: DType) -> Conversion {
    storage_conversion(
        &TensorSizes::new(t.name.as_str(), t.dtype, &t.shape),
        storage,
    )
}

/// The storage dtypes the engine converts to ([`STORAGE_DTYPES`]).
pub fn is_storage_dtype(d: DType) -> bool {
    matches!(d, DType::BF16 | DType::F8E4M3 | DType::I8 | DType::Q8_0)
}

/// Refuses storage dtypes the engine has no conversion for.
pub(crate) fn check_storage(storage: Option<DType>) -> Result<(), RuleError> {
    match storage {
        None => Ok(()),
        Some(d) if is_storage_dtype(d) => Ok(()),
        Some(other) => Err(RuleError::InvalidOptions {
            option: "storage",
            value: other.to_string(),
            expected: STORAGE_DTYPES,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, dtype: DType, shape: &[usize]) -> StreamTensor {
        let n: usize = shape.iter().product();
        StreamTensor {
            name: name.into(),
            file: 0,
            start: 0,
            end: (n * dtype.size()) as u64,
            dtype,
            shape: shape.to_vec(),
            rows: None,
        }
    }

    #[test]
    fn the_rule_is_the_planners() {
        use Conversion::*;
        let big = [1024, 1024];
        let cases = [
            (t("a.weight", DType::F32, &[8]), Keep, ToBf16),
            (t("a.weight", DType::F64, &[8]), Keep, ToBf16),
            (
                t("a.weight", DType::BF16, &big),
                ToFp8 {
                    rows: 1024,
                    cols: 1024,
                },
                Keep,
            ),
            (t("a.weight", DType::F16, &[1023, 1024]), Keep, Keep),
            (t("a.weight", DType::F32, &[1 << 20]), Keep, ToBf16),
            (t("a.weight", DType::F32, &[2, 512, 1024]), Keep, ToBf16),
            (t("a.weight", DType::F8E5M2, &big), Keep, Keep),
            (t("a.weight", DType::I32, &big), Keep, Keep),
            (t("a.weight_scale", DType::F32, &big), Keep, Keep),
            (t("a.input_scale", DType::F32, &[]), Keep, Keep),
        ];
        for (tensor, fp8, bf16) in cases {
            assert_eq!(tensor_conversion(&tensor, DType::F8E4M3), fp8, "{tensor:?}");
            assert_eq!(tensor_conversion(&tensor, DType::BF16), bf16, "{tensor:?}");
        }
        assert!(check_storage(None).is_ok() && check_storage(Some(DType::BF16)).is_ok());
        let e = check_storage(Some(DType::F16)).unwrap_err().to_string();
        assert!(
            e.contains("storage = f16") && e.contains(STORAGE_DTYPES),
            "{e}"
        );
    }
}

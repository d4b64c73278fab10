//! Element types and the conversion kernels between them.
//!
//! Every kernel takes little-endian bytes (`&[u8]` in, `&mut [u8]` out, any alignment), so the
//! same calls serve mapped files, staging buffers and tensor storage. Lengths, dtypes and scale
//! shapes are checked up front and reported as [`DtypeError`]; the kernels never panic.
//!
//! - [`cast`]: between f64, f32, f16 and bf16 (and from fp8), rounding once to nearest even.
//! - [`expand`]: fp8 (or any float) times an optional f32 scale, to bf16, f16 or f32, the way
//!   `(w.to(torch.float32) * scale).to(dst)` does.
//! - [`quantize_fp8`]: a float tensor to e4m3fn with a per-tensor or per-row scale.
//! - Scalar reference codecs ([`fp8_e4m3fn_to_f32`], [`f32_to_bf16_bits`], ...) written from the
//!   format definitions; the fast kernels are tested against them bit for bit.
//!
//! Large jobs (a million elements or more) are split over `threads` scoped threads (`0` means
//! every core); smaller ones run on the calling thread.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod cast;
mod fp8;
mod kind;
mod parallel;
mod quant;
mod scale;
mod simd;

pub use cast::{bf16_bits_to_f32, cast, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits};
pub use fp8::{f32_to_fp8_e4m3fn, fp8_e4m3fn_to_f32, fp8_e5m2_to_f32, FP8_E4M3FN_MAX};
pub use kind::{DType, ACCEPTED_DTYPE_NAMES, ALL_DTYPES};
pub use quant::{quantize_fp8, QuantGranularity};
pub use scale::{classify_scale, expand, rows_cols, Scale, ScaleLayout, SCALE_BLOCK};
pub use simd::{
    best_simd_level, simd_level, supported_simd_levels, with_simd_level, SimdLevel, SIMD_CHOICES,
};

/// Errors of the dtype module.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DtypeError {
    #[error("unknown dtype {name:?}: expected one of {accepted}")]
    UnknownName {
        name: String,
        accepted: &'static str,
    },
    #[error("{op} from {src} to {dst} is not supported: expected {expected}")]
    Unsupported {
        op: &'static str,
        src: DType,
        dst: DType,
        expected: &'static str,
    },
    #[error(
        "{what} holds {actual_bytes} bytes: expected {expected_elems} {dtype} elements \
         ({expected_bytes} bytes)"
    )]
    LengthMismatch {
        what: &'static str,
        dtype: DType,
        expected_elems: usize,
        expected_bytes: usize,
        actual_bytes: usize,
    },
    #[error("{what} holds {bytes} bytes, not a whole number of {dtype} elements")]
    RaggedBytes {
        what: &'static str,
        dtype: DType,
        bytes: usize,
    },
    #[error("shape ({rows}, {cols}) has more elements than memory can address")]
    ShapeOverflow { rows: usize, cols: usize },
    #[error("{kind} scales for shape ({rows}, {cols}) hold {actual} values: expected {expected}")]
    ScaleLength {
        kind: &'static str,
        rows: usize,
        cols: usize,
        expected: usize,
        actual: usize,
    },
    #[error("{0}")]
    SimdSetting(String),
    #[error(
        "{origin} asks for the {level} kernels, which this CPU cannot run: it runs {supported}"
    )]
    SimdUnsupported {
        origin: &'static str,
        level: SimdLevel,
        supported: String,
    },
    #[error("block scales need a block size of at least 1, got 0")]
    ZeroBlock,
    #[error(
        "scale tensor {name:?} has shape {scale:?}, which fits none of: one value, one per row \
         ({rows}), or one per {block}x{block} block of a weight of shape {weight:?}"
    )]
    ScaleShape {
        name: String,
        weight: Vec<usize>,
        scale: Vec<usize>,
        rows: usize,
        block: usize,
    },
}

/// Checks that `actual_bytes` holds exactly `elems` elements of `dtype`.
pub(crate) fn check_bytes(
    what: &'static str,
    dtype: DType,
    elems: usize,
    actual_bytes: usize,
) -> Result<(), DtypeError> {
    let expected_bytes = elems.checked_mul(dtype.size());
    if expected_bytes == Some(actual_bytes) {
        Ok(())
    } else {
        Err(DtypeError::LengthMismatch {
            what,
            dtype,
            expected_elems: elems,
            expected_bytes: expected_bytes.unwrap_or(usize::MAX),
            actual_bytes,
        })
    }
}

/// The element count of a `(rows, cols)` shape, checked.
pub(crate) fn elements(shape: (usize, usize)) -> Result<usize, DtypeError> {
    shape
        .0
        .checked_mul(shape.1)
        .ok_or(DtypeError::ShapeOverflow {
            rows: shape.0,
            cols: shape.1,
        })
}

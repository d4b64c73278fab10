//! Element types and the conversion kernels between them.
//!
//! Every kernel takes little-endian bytes (`&[u8]` in, `&mut [u8]` out, any alignment), so the
//! same calls serve mapped files, staging buffers and tensor storage. Lengths, dtypes and scale
//! shapes are checked up front and reported as [`DtypeError`]; the kernels never panic.
//!
//! - [`cast`]: between f64, f32, f16 and bf16 (and from fp8), rounding once to nearest even.
//! - [`expand`]: fp8 (or any float) times an optional f32 scale, to bf16, f16 or f32, the way
//!   `(w.to(torch.float32) * scale).to(dst)` does.
//! - [`quantize_fp8`]: a float tensor to e4m3fn with per-tensor, per-row or block-wise scales.
//! - [`ggml`]: GGML's block types ([`dequantize`] to the compute dtype, [`quantize_q8_0`]), and
//!   [`quantize_int8`]: int8 codes with one scale per row, expanded back by [`expand`].
//! - Scalar reference codecs ([`fp8_e4m3fn_to_f32`], [`f32_to_bf16_bits`], ...) written from the
//!   format definitions; the fast kernels are tested against them bit for bit.
//!
//! Large jobs (a million elements or more) are split over `threads` scoped threads (`0` means
//! every core); smaller ones run on the calling thread.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod cast;
mod convert;
mod fp8;
pub mod ggml;
mod half;
mod int8;
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod kernel_tests;
mod kind;
mod level;
#[cfg(target_arch = "aarch64")]
mod neon;
mod parallel;
mod quant;
mod rounding;
mod scale;
mod stores;

pub use cast::cast;
pub use convert::kernel_path;
pub use fp8::{f32_to_fp8_e4m3fn, fp8_e4m3fn_to_f32, fp8_e5m2_to_f32, FP8_E4M3FN_MAX};
pub use ggml::{dequantize, quantize_q8_0};
pub use half::{bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits};
pub use int8::{quantize_int8, INT8_MAX};
pub use kind::{DType, ACCEPTED_DTYPE_NAMES, ALL_DTYPES, BLOCK_DTYPES};
pub use level::{
    best_simd_level, simd_level, supported_simd_levels, with_simd_level, SimdLevel, SIMD_CHOICES,
};
pub use quant::{quantize_fp8, QuantGranularity};
pub use scale::{
    classify_scale, expand, expand_reordered, rows_cols, Scale, ScaleLayout, SCALE_BLOCK,
};

/// Errors of the dtype module.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DtypeError {
    /// A dtype name (from a user or a setting) names no dtype.
    ///
    /// What to do: use one of the names the message lists (`"bf16"`, `"fp8"`, `torch.bfloat16`,
    /// ...).
    #[error("unknown dtype {name:?}: expected one of {accepted}")]
    UnknownName {
        /// The name as given.
        name: String,
        /// The names accepted ([`ACCEPTED_DTYPE_NAMES`]).
        accepted: &'static str,
    },
    /// A kernel was asked for a pair of dtypes it does not convert (an integer source, an fp8
    /// destination of `cast`, ...).
    ///
    /// What to do: convert between the pairs the message names: float to float with `cast`, fp8 to
    /// a float with `expand`, a float to e4m3 with `quantize_fp8`.
    #[error("{op} from {src} to {dst} is not supported: expected {expected}")]
    Unsupported {
        /// The kernel: "cast", "expand" or "quantize_fp8".
        op: &'static str,
        /// The source dtype.
        src: DType,
        /// The destination dtype.
        dst: DType,
        /// What the kernel accepts, in words.
        expected: &'static str,
    },
    /// A buffer given to a kernel is not exactly the size its element count and dtype need.
    ///
    /// What to do: pass buffers of the sizes the message gives: as many elements as the shape, of
    /// the dtype named.
    #[error(
        "{what} holds {actual_bytes} bytes: expected {expected_elems} {dtype} elements \
         ({expected_bytes} bytes)"
    )]
    LengthMismatch {
        /// Which buffer, e.g. "cast destination".
        what: &'static str,
        /// The dtype its elements have.
        dtype: DType,
        /// Elements it should hold.
        expected_elems: usize,
        /// Bytes it should hold (`usize::MAX` when that overflows).
        expected_bytes: usize,
        /// Bytes it holds.
        actual_bytes: usize,
    },
    /// A row order names a row past the end of the tensor it reorders.
    ///
    /// What to do: the row order was made for another shape: make it from the tensor's own rows.
    #[error("a row order names row {row} of a tensor of {rows} rows")]
    RowOutOfRange {
        /// The row named.
        row: usize,
        /// Rows the tensor has.
        rows: usize,
    },
    /// A tensor of a GGML block type has an element count that is not a whole number of its
    /// blocks (ggml stores whole blocks along each row).
    ///
    /// What to do: the tensor's shape does not fit its type: its rows must be a multiple of the
    /// block (32 or 256 elements). Check the shape the file gives, or report the file.
    #[error("{what}: {elems} elements are not a whole number of {dtype} blocks of {block}")]
    PartialBlock {
        /// Which buffer, e.g. "expand source".
        what: &'static str,
        /// The block type.
        dtype: DType,
        /// Elements asked for.
        elems: usize,
        /// Elements per block.
        block: usize,
    },
    /// A buffer whose element count is taken from its length holds a partial element.
    ///
    /// What to do: pass a buffer whose length is a multiple of the element size (a tensor's own
    /// bytes are).
    #[error("{what} holds {bytes} bytes, not a whole number of {dtype} elements")]
    RaggedBytes {
        /// Which buffer, e.g. "cast source".
        what: &'static str,
        /// The dtype its elements have.
        dtype: DType,
        /// Bytes it holds.
        bytes: usize,
    },
    /// `rows x cols` does not fit in a `usize`.
    ///
    /// What to do: the shape is wrong (a stray huge dimension): pass the weight's real shape.
    #[error("shape ({rows}, {cols}) has more elements than memory can address")]
    ShapeOverflow {
        /// Rows of the shape.
        rows: usize,
        /// Columns of the shape.
        cols: usize,
    },
    /// A per-row or block scale holds another number of values than the weight's shape needs.
    ///
    /// What to do: pass one scale per row (per-row) or one per tile of the block grid (block) of
    /// the weight's shape.
    #[error("{kind} scales for shape ({rows}, {cols}) hold {actual} values: expected {expected}")]
    ScaleLength {
        /// "per-row" or "block".
        kind: &'static str,
        /// Rows of the weight.
        rows: usize,
        /// Columns of the weight.
        cols: usize,
        /// Values the scale should hold (rows, or tiles of the block grid).
        expected: usize,
        /// Values it holds.
        actual: usize,
    },
    /// `TRASH_PANDA_SIMD` (or a level forced in code) names no kernel level; the message lists
    /// the accepted values.
    ///
    /// What to do: set `TRASH_PANDA_SIMD` to one of the levels the message lists, or unset it
    /// (`auto`).
    #[error("{0}")]
    SimdSetting(String),
    /// A kernel level was asked for (by `TRASH_PANDA_SIMD` or in code) that this CPU cannot
    /// run; conversions fail rather than quietly run another path.
    ///
    /// What to do: unset `TRASH_PANDA_SIMD` (or set it to a level the message says this CPU runs);
    /// `auto` picks the fastest one.
    #[error(
        "{origin} asks for the {level} kernels, which this CPU cannot run: it runs {supported}"
    )]
    SimdUnsupported {
        /// Who asked: the setting or the code that forced it.
        origin: &'static str,
        /// The level asked for.
        level: SimdLevel,
        /// The levels this CPU runs, best first.
        supported: String,
    },
    /// A block scale (or [`classify_scale`]) was given a block size of 0.
    ///
    /// What to do: give a block size of 1 or more (checkpoints use 128).
    #[error("block scales need a block size of at least 1, got 0")]
    ZeroBlock,
    /// A checkpoint's scale tensor has a shape that is neither one value, one per row, nor one
    /// per tile of the block grid of its weight.
    ///
    /// What to do: the checkpoint pairs this weight with a scale of a layout the library does not
    /// read (not one value, one per row or one per square tile). Report it with the model's name;
    /// or load a checkpoint of the model without fp8 scales.
    #[error(
        "scale tensor {name:?} has shape {scale:?}, which fits none of: one value, one per row \
         ({rows}), or one per {block}x{block} block of a weight of shape {weight:?}"
    )]
    ScaleShape {
        /// The scale tensor's name.
        name: String,
        /// The weight's shape.
        weight: Vec<usize>,
        /// The scale's shape.
        scale: Vec<usize>,
        /// Rows of the weight (its first dimension).
        rows: usize,
        /// The tile size tried, in elements per side.
        block: usize,
    },
}

/// Checks that `actual_bytes` holds exactly `elems` elements of `dtype`, a block type's whole
/// blocks included.
pub(crate) fn check_bytes(
    what: &'static str,
    dtype: DType,
    elems: usize,
    actual_bytes: usize,
) -> Result<(), DtypeError> {
    if !elems.is_multiple_of(dtype.block_elems()) {
        return Err(DtypeError::PartialBlock {
            what,
            dtype,
            elems,
            block: dtype.block_elems(),
        });
    }
    let expected = dtype
        .bytes_for(elems as u64)
        .and_then(|b| usize::try_from(b).ok());
    if expected == Some(actual_bytes) {
        Ok(())
    } else {
        Err(DtypeError::LengthMismatch {
            what,
            dtype,
            expected_elems: elems,
            expected_bytes: expected.unwrap_or(usize::MAX),
            actual_bytes,
        })
    }
}

/// Checks that a quantizer (`op`, making `dst`) is given a float source, and that this thread's
/// kernel level is usable.
pub(crate) fn check_quantizer_source(
    op: &'static str,
    src: DType,
    dst: DType,
) -> Result<(), DtypeError> {
    if !src.is_float() {
        return Err(DtypeError::Unsupported {
            op,
            src,
            dst,
            expected: "a float source (f64, f32, f16, bf16 or fp8)",
        });
    }
    simd_level().map(|_| ())
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

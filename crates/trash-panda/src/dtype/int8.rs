//! Weight-only int8 with one f32 scale per output channel (row), symmetric: the layout torchao's
//! and bitsandbytes' int8 weights use. Expanding it back is [`super::expand`] with the per-row
//! scales, as for an fp8 weight.

use super::convert::{decode, CHUNK};
use super::level::multiversion;
use super::rounding::{lane_amax, round_even};
use super::{check_bytes, check_quantizer_source, elements, parallel, DType, DtypeError};

/// The largest code: the range is symmetric, so -128 is never used.
pub const INT8_MAX: f32 = 127.0;

/// Quantizes `src` (`shape` = `(rows, cols)` of the float `src_dtype`) to int8 codes in `dst`,
/// with one dequantization scale per row in `scales` (a weight is `code * scale`).
///
/// Per row, in f32 (an f64 source first rounded to f32): `amax` = the largest `|x|` over the
/// non-NaN elements; `scale = amax / 127`, replaced by `1.0` when it is not a positive finite
/// number (an all-zero row, an infinite amax), so no division by zero happens; `q = round(x /
/// scale)` to nearest even, a true f32 division, clamped to ±127; a NaN gives 0. The torch
/// reference:
///
/// ```text
/// x = w.float()
/// amax = torch.where(x.isnan(), 0.0, x.abs()).amax(dim=1, keepdim=True)
/// scale = amax / 127
/// scale = torch.where((scale > 0) & scale.isfinite(), scale, torch.ones_like(scale))
/// q = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
/// ```
///
/// `threads` = 0 uses every core; jobs under a million elements run inline.
pub fn quantize_int8(
    src: &[u8],
    src_dtype: DType,
    shape: (usize, usize),
    dst: &mut [u8],
    scales: &mut [f32],
    threads: usize,
) -> Result<(), DtypeError> {
    check_quantizer_source("quantize_int8", src_dtype, DType::I8)?;
    let (rows, cols) = shape;
    let n = elements(shape)?;
    check_bytes("quantize_int8 source", src_dtype, n, src.len())?;
    check_bytes("quantize_int8 destination", DType::I8, n, dst.len())?;
    if scales.len() != rows {
        return Err(DtypeError::ScaleLength {
            kind: "per-row",
            rows,
            cols,
            expected: rows,
            actual: scales.len(),
        });
    }
    if n == 0 {
        scales.fill(1.0);
        return Ok(());
    }
    let threads = parallel::effective_threads(threads, n);
    let ss = src_dtype.size();
    parallel::split_run(rows, 1, threads, (dst, cols), (scales, 1), |r, d, k| {
        let s = &src[r.start * cols * ss..r.end * cols * ss];
        int8_rows(s, src_dtype, cols, d, k);
    });
    Ok(())
}

/// `x` clamped to ±127 and rounded to the nearest integer, halves to even; NaN gives 0.
#[inline(always)]
fn round_clamped(x: f32) -> i8 {
    let c = if x.is_nan() {
        0.0
    } else {
        x.clamp(-INT8_MAX, INT8_MAX)
    };
    round_even(c).1 as i8
}

multiversion! {
    /// Quantizes whole rows of `cols` weights, one scale each.
    fn int8_rows(src: &[u8], src_t: DType, cols: usize, dst: &mut [u8], scales: &mut [f32]) {
        let ss = src_t.size();
        let mut buf = [0f32; CHUNK];
        let rows = src.chunks_exact(cols * ss).zip(dst.chunks_exact_mut(cols)).zip(scales);
        for ((row, out), scale) in rows {
            let mut amax = 0f32;
            for s in row.chunks(CHUNK * ss) {
                let b = &mut buf[..s.len() / ss];
                decode(s, src_t, false, b);
                // `max` skips NaN, as the reference's `where` does.
                amax = amax.max(lane_amax(b));
            }
            let k = amax / INT8_MAX;
            let k = if k > 0.0 && k.is_finite() { k } else { 1.0 };
            *scale = k;
            for (s, o) in row.chunks(CHUNK * ss).zip(out.chunks_mut(CHUNK)) {
                let b = &mut buf[..s.len() / ss];
                decode(s, src_t, false, b);
                for (q, v) in o.iter_mut().zip(b.iter()) {
                    *q = round_clamped(v / k) as u8;
                }
            }
        }
    }
}

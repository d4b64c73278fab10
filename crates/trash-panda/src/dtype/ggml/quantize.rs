//! Quantization of float weights to GGML's Q8_0, as ggml's reference quantizer (and the `gguf`
//! package's) does it, so a checkpoint quantized on load equals one quantized by `gguf`.

use super::super::convert::decode;
use super::super::half::f32_bits_to_f16_bf;
use super::super::level::multiversion;
use super::super::rounding::{lane_amax, round_even};
use super::super::{check_bytes, check_quantizer_source, parallel, DType, DtypeError};

/// Quantizes `src` (floats of `src_dtype`, a multiple of 32 of them, in row-major order so each
/// run of 32 lies in one row when rows are a multiple of 32 long) to Q8_0 blocks in `dst`.
///
/// Per block of 32, in f32: `d = max|x| / 127`, `q = round(x * (1 / d))` rounding halves away
/// from zero (0 when `d` is 0), and `d` stored as f16 rounded to nearest even: the `gguf`
/// package's `quants.quantize(x, Q8_0)` bit for bit for finite weights. A NaN weight is left out
/// of its block's maximum and gets the code 0 (the `gguf` package makes that block all NaN).
///
/// `threads` = 0 uses every core; jobs under a million elements run on the calling thread.
pub fn quantize_q8_0(
    src: &[u8],
    src_dtype: DType,
    dst: &mut [u8],
    threads: usize,
) -> Result<(), DtypeError> {
    check_quantizer_source("quantize_q8_0", src_dtype, DType::Q8_0)?;
    let ss = src_dtype.size();
    if !src.len().is_multiple_of(ss * 32) {
        return Err(DtypeError::RaggedBytes {
            what: "quantize_q8_0 source (whole blocks of 32 weights)",
            dtype: src_dtype,
            bytes: src.len(),
        });
    }
    let blocks = src.len() / (ss * 32);
    check_bytes(
        "quantize_q8_0 destination",
        DType::Q8_0,
        blocks * 32,
        dst.len(),
    )?;
    let threads = parallel::effective_threads(threads, blocks * 32);
    let none: &mut [u8] = &mut [];
    parallel::split_run(blocks, 8, threads, (dst, 34), (none, 0), |r, d, _| {
        q8_0_blocks(&src[r.start * 32 * ss..r.end * 32 * ss], src_dtype, d);
    });
    Ok(())
}

multiversion! {
    /// Quantizes whole blocks of 32 weights to Q8_0.
    fn q8_0_blocks(src: &[u8], src_t: DType, dst: &mut [u8]) {
        let ss = src_t.size();
        let mut x = [0f32; 32];
        for (s, o) in src.chunks_exact(32 * ss).zip(dst.chunks_exact_mut(34)) {
            decode(s, src_t, false, &mut x);
            let d = lane_amax(&x) / 127.0;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            o[..2].copy_from_slice(&f32_bits_to_f16_bf(d.to_bits()).to_le_bytes());
            let mut q = [0i8; 32];
            for (q, v) in q.iter_mut().zip(&x) {
                *q = round_half_away(v * id);
            }
            for (o, q) in o[2..].iter_mut().zip(q) {
                *o = q as u8;
            }
        }
    }
}

/// `x` rounded to the nearest integer, halves away from zero (C's `roundf`, as ggml rounds) and
/// clamped to i8; NaN gives 0.
#[inline(always)]
fn round_half_away(x: f32) -> i8 {
    let x = if x.is_nan() {
        0.0
    } else {
        x.clamp(-128.0, 127.0)
    };
    let (r, i) = round_even(x);
    // Nearest even and halves away differ only at a half that the former took toward zero.
    let diff = x - r;
    let i = if diff == 0.5 && x > 0.0 {
        i + 1
    } else if diff == -0.5 && x < 0.0 {
        i - 1
    } else {
        i
    };
    i.clamp(-128, 127) as i8
}

//! Quantization of float tensors to fp8 e4m3fn with per-tensor, per-row or block-wise scales.

use super::convert::{decode, Stores, CHUNK};
use super::fp8::{f32_bits_to_e4m3, FP8_E4M3FN_MAX};
use super::level::multiversion;
use super::{check_bytes, check_quantizer_source, elements, parallel, DType, DtypeError};

/// Which values share one quantization scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantGranularity {
    /// One scale for the whole tensor (`scales` holds 1 value).
    PerTensor,
    /// One scale per row (output channel) of a `[rows, cols]` weight (`scales` holds `rows`).
    PerRow,
    /// One scale per `block x block` tile (`scales` holds `ceil(rows / block) * ceil(cols /
    /// block)`, row-major over the tile grid: the `weight_scale_inv` layout that
    /// [`super::Scale::Block`] expands). Edge tiles may be partial.
    Block {
        /// The tile's side, in elements; at least 1.
        block: usize,
    },
}

/// Quantizes `src` (`shape` = `(rows, cols)` of the float `src_dtype`) to e4m3fn in `dst`,
/// writing the dequantization scales (multiply to get the values back) to `scales`.
///
/// For each group (the tensor, a row, or a tile), in f32 (an f64 source is first rounded to f32):
/// - `amax` = the largest `|x|` over the non-NaN elements (0 for an empty or all-NaN group);
/// - `scale = amax / 448`, replaced by `1.0` when it is not a positive finite number (a zero or
///   all-NaN group, an infinite amax, or an amax so small that the division underflows), so no
///   division by zero or by infinity ever happens;
/// - `q = e4m3fn(clamp(x / scale, -448, 448))`, a true f32 division rounded to nearest even; a
///   NaN stays NaN (`0x7F | sign`), an infinity becomes ±448.
///
/// The torch reference, for `w` of shape `(rows, cols)` (use `amax()` over everything, with a
/// shape-`(1,)` result, for [`QuantGranularity::PerTensor`]; the amax over each tile, repeated
/// over the tile's elements for the division, for [`QuantGranularity::Block`]):
///
/// ```text
/// x = w.float()
/// amax = torch.where(x.isnan(), 0.0, x.abs()).amax(dim=1, keepdim=True)
/// scale = amax / 448
/// scale = torch.where((scale > 0) & scale.isfinite(), scale, torch.ones_like(scale))
/// q = torch.clamp(x / scale, -448, 448).to(torch.float8_e4m3fn)
/// ```
///
/// `threads` = 0 uses every core; jobs under a million elements run inline.
pub fn quantize_fp8(
    src: &[u8],
    src_dtype: DType,
    shape: (usize, usize),
    granularity: QuantGranularity,
    dst: &mut [u8],
    scales: &mut [f32],
    threads: usize,
) -> Result<(), DtypeError> {
    check_quantizer_source("quantize_fp8", src_dtype, DType::F8E4M3)?;
    let (rows, cols) = shape;
    let n = elements(shape)?;
    check_bytes("quantize_fp8 source", src_dtype, n, src.len())?;
    check_bytes("quantize_fp8 destination", DType::F8E4M3, n, dst.len())?;
    let (kind, expected) = match granularity {
        QuantGranularity::PerTensor => ("per-tensor", 1),
        QuantGranularity::PerRow => ("per-row", rows),
        QuantGranularity::Block { block: 0 } => return Err(DtypeError::ZeroBlock),
        QuantGranularity::Block { block } => {
            let tiles = rows.div_ceil(block).checked_mul(cols.div_ceil(block));
            ("block", tiles.unwrap_or(usize::MAX))
        }
    };
    if scales.len() != expected {
        return Err(DtypeError::ScaleLength {
            kind,
            rows,
            cols,
            expected,
            actual: scales.len(),
        });
    }
    let threads = parallel::effective_threads(threads, n);
    let stores = Stores::for_output(dst.len());
    let ss = src_dtype.size();
    match granularity {
        QuantGranularity::PerTensor => {
            let grain = parallel::ELEMENT_GRAIN;
            let partial = parallel::map_ranges(n, grain, threads, |r| {
                amax_bits(&src[r.start * ss..r.end * ss], src_dtype)
            });
            let s = scale_for(partial.into_iter().max().unwrap_or(0));
            scales[0] = s;
            let none: &mut [u8] = &mut [];
            parallel::split_run(n, grain, threads, (dst, 1), (none, 0), |r, d, _| {
                encode_scaled(&src[r.start * ss..r.end * ss], src_dtype, d, s, stores);
                stores.fence();
            });
        }
        QuantGranularity::PerRow => {
            parallel::split_run(rows, 1, threads, (dst, cols), (scales, 1), |r, d, sc| {
                let s = &src[r.start * cols * ss..r.end * cols * ss];
                quantize_rows(s, src_dtype, d, sc, cols, stores);
                stores.fence();
            });
        }
        QuantGranularity::Block { block } => {
            // One job per band of `block` rows (a band's tiles share no element or scale with
            // another band's); a last, shorter band runs after the whole ones.
            let (whole, tiles, band) = (
                rows / block,
                cols.div_ceil(block),
                block.saturating_mul(cols),
            );
            let (dst, dst_tail) = dst.split_at_mut(whole * band);
            let (scales, scales_tail) = scales.split_at_mut(whole * tiles);
            parallel::split_run(
                whole,
                1,
                threads,
                (dst, band),
                (scales, tiles),
                |r, d, sc| {
                    let s = &src[r.start * band * ss..r.end * band * ss];
                    quantize_bands(s, src_dtype, d, sc, (block, cols), stores);
                    stores.fence();
                },
            );
            if !dst_tail.is_empty() {
                let s = &src[whole * band * ss..];
                quantize_bands(s, src_dtype, dst_tail, scales_tail, (block, cols), stores);
                stores.fence();
            }
        }
    }
    Ok(())
}

/// The scale rule of [`quantize_fp8`] from the bits of `amax` (a non-negative, non-NaN f32).
fn scale_for(amax_bits: u32) -> f32 {
    let s = f32::from_bits(amax_bits) / FP8_E4M3FN_MAX;
    if s > 0.0 && s.is_finite() {
        s
    } else {
        1.0
    }
}

multiversion! {
    /// The bits of max |x| over the non-NaN elements. For non-negative floats the bit patterns
    /// order like the values, so an integer max (which vectorizes, unlike a float max with NaN
    /// rules) is enough.
    fn amax_bits(src: &[u8], src_t: DType) -> u32 {
        #[cfg(target_arch = "x86_64")]
        if let Some(half) = half_kernels(src_t) {
            // SAFETY: `half_kernels` answers only at a level whose CPU has AVX2, FMA and F16C,
            // the features the kernel is compiled with.
            return unsafe { super::avx2::quant::amax_bits_16::<true>(src, half) }.bits;
        }
        #[cfg(target_arch = "aarch64")]
        if neon_kernels(src_t) {
            // SAFETY: `neon_kernels` holds only at the Neon level, which this CPU runs.
            return unsafe { super::neon::half_amax_bits(src, src_t) };
        }
        let mut buf = [0f32; CHUNK];
        let mut best = 0u32;
        let ss = src_t.size();
        for s in src.chunks(CHUNK * ss) {
            let b = &mut buf[..s.len() / ss];
            decode(s, src_t, false, b);
            for x in b.iter() {
                let a = x.to_bits() & 0x7FFF_FFFF;
                let a = if a > 0x7F80_0000 { 0 } else { a };
                best = best.max(a);
            }
        }
        best
    }
}

multiversion! {
    /// `e4m3fn(clamp(x / scale, -448, 448))` for every element.
    fn encode_scaled(src: &[u8], src_t: DType, dst: &mut [u8], scale: f32, stores: Stores) {
        encode_scaled_inline(src, src_t, dst, scale, stores)
    }
}

/// Which 16-bit source the AVX2 kernels quantize, if `src_t` is one (bf16, the usual source,
/// or f16), at a level that runs them: their staged loops reach a few percent of memory speed
/// on AVX2 and AVX-512 alike (the division and the encoder's subnormal shifts do not vectorize
/// well through the f32 buffer).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn half_kernels(src_t: DType) -> Option<super::avx2::quant::Half> {
    use super::avx2::quant::Half;
    use super::level::{level, SimdLevel};
    if !matches!(level(), SimdLevel::Avx2 | SimdLevel::Avx512) {
        return None;
    }
    match src_t {
        DType::BF16 => Some(Half::Bf16),
        DType::F16 => Some(Half::F16),
        _ => None,
    }
}

/// Whether the NEON kernels quantize `src_t`: bf16 and f16, whose staged loops divide and
/// encode through the f32 buffer (see `dtype/neon`).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn neon_kernels(src_t: DType) -> bool {
    use super::level::{level, SimdLevel};
    matches!(src_t, DType::BF16 | DType::F16) && level() == SimdLevel::Neon
}

#[inline(always)]
fn encode_scaled_inline(src: &[u8], src_t: DType, dst: &mut [u8], scale: f32, stores: Stores) {
    #[cfg(target_arch = "aarch64")]
    if neon_kernels(src_t) {
        // SAFETY: `neon_kernels` holds only at the Neon level, which this CPU runs.
        unsafe { super::neon::half_to_e4m3(src, src_t, dst, scale) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(half) = half_kernels(src_t) {
        // The source is prefetched 4 KiB ahead (one core's demand loads alone fall short of
        // memory speed, see `avx2`); NaNs were not looked for.
        let mut q = super::avx2::quant::Quantizer::new(half, stores, 4096);
        // SAFETY: `half_kernels` answers only at a level whose CPU has AVX2, FMA and F16C, the
        // features the kernel is compiled with.
        unsafe { q.divided(src, dst, scale, false) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = stores;
    let mut buf = [0f32; CHUNK];
    let ss = src_t.size();
    for (s, d) in src.chunks(CHUNK * ss).zip(dst.chunks_mut(CHUNK)) {
        let b = &mut buf[..s.len() / ss];
        decode(s, src_t, false, b);
        for (x, q) in b.iter().zip(d.iter_mut()) {
            let v = *x / scale;
            // Comparisons, not f32::clamp, so a NaN passes through unchanged.
            let v = if v > FP8_E4M3FN_MAX {
                FP8_E4M3FN_MAX
            } else {
                v
            };
            let v = if v < -FP8_E4M3FN_MAX {
                -FP8_E4M3FN_MAX
            } else {
                v
            };
            *q = f32_bits_to_e4m3(v.to_bits());
        }
    }
}

multiversion! {
    /// Per-row quantization of whole rows.
    fn quantize_rows(
        src: &[u8],
        src_t: DType,
        dst: &mut [u8],
        scales: &mut [f32],
        cols: usize,
        stores: Stores,
    ) {
        let ss = src_t.size();
        if cols == 0 {
            scales.fill(1.0);
            return;
        }
        let rows = src.chunks_exact(cols * ss).zip(dst.chunks_exact_mut(cols));
        // The next row is prefetched for its amax pass.
        #[cfg(target_arch = "x86_64")]
        let mut fused = half_kernels(src_t)
            .map(|half| super::avx2::quant::Quantizer::new(half, stores, cols * ss));
        for ((s, d), out) in rows.zip(scales.iter_mut()) {
            #[cfg(target_arch = "x86_64")]
            if let Some(q) = fused.as_mut() {
                // SAFETY: `half_kernels` answers only at a level whose CPU has AVX2, FMA and
                // F16C, the features these kernels are compiled with.
                let amax = unsafe { q.amax(s) };
                let k = scale_for(amax.bits);
                *out = k;
                // SAFETY: as above.
                unsafe { q.divided(s, d, k, !amax.nan) };
                continue;
            }
            #[cfg(target_arch = "aarch64")]
            if neon_kernels(src_t) {
                // SAFETY: `neon_kernels` holds only at the Neon level, which this CPU runs.
                let k = scale_for(unsafe { super::neon::half_amax_bits(s, src_t) });
                *out = k;
                encode_scaled_inline(s, src_t, d, k, stores);
                continue;
            }
            let mut buf = [0f32; CHUNK];
            let mut best = 0u32;
            for c in s.chunks(CHUNK * ss) {
                let b = &mut buf[..c.len() / ss];
                decode(c, src_t, false, b);
                for x in b.iter() {
                    let a = x.to_bits() & 0x7FFF_FFFF;
                    best = best.max(if a > 0x7F80_0000 { 0 } else { a });
                }
            }
            let k = scale_for(best);
            *out = k;
            encode_scaled_inline(s, src_t, d, k, stores);
        }
    }
}

/// Block-wise quantization of whole bands of `block` rows (the last band may be shorter): for
/// each tile, the amax over its rows' slices, then each slice encoded with the tile's scale.
fn quantize_bands(
    src: &[u8],
    src_t: DType,
    dst: &mut [u8],
    scales: &mut [f32],
    (block, cols): (usize, usize),
    stores: Stores,
) {
    let ss = src_t.size();
    if cols == 0 {
        scales.fill(1.0);
        return;
    }
    let tiles = cols.div_ceil(block);
    let band = block.saturating_mul(cols);
    for ((s, d), sc) in src
        .chunks(band.saturating_mul(ss))
        .zip(dst.chunks_mut(band))
        .zip(scales.chunks_mut(tiles))
    {
        let rows = d.len() / cols;
        for (t, out) in sc.iter_mut().enumerate() {
            let (c0, c1) = (t * block, ((t + 1) * block).min(cols));
            let slice = |r: usize| (r * cols + c0)..(r * cols + c1);
            let amax = (0..rows)
                .map(|r| {
                    let e = slice(r);
                    amax_bits(&s[e.start * ss..e.end * ss], src_t)
                })
                .max()
                .unwrap_or(0);
            let k = scale_for(amax);
            *out = k;
            for r in 0..rows {
                let e = slice(r);
                encode_scaled(&s[e.start * ss..e.end * ss], src_t, &mut d[e], k, stores);
            }
        }
    }
}

//! bf16 and f16 -> e4m3fn quantization kernels (f16 widened by F16C, bf16 by a shift).
//!
//! The amax runs on the 16-bit patterns, sixteen to a register. The encode divides (a true
//! f32 division, as the reference does) and rounds in integers; for the positive finite scales
//! quantization makes, it works on magnitudes, puts the signs back a byte at a time and sends
//! the rare 32 values holding a NaN to the scalar code, which took the loop from about 2.0 to
//! 2.4 GB/s of codes in cache on this Xeon. It stays bound by the divider (four `vdivps` per
//! 32 codes) and the 32-bit lanes of the encoder: a multiply by the reciprocal is not the
//! division's rounding, and exact ways round that (a per-row table of the 128 bf16 mantissas'
//! quotients, or a reciprocal with a check for quotients next to an e4m3 rounding edge) are
//! left for later (issue 24).

use core::arch::x86_64::*;

use super::{store, Stores};
use crate::dtype::cast::f16_to_f32_bits_bf;
use crate::dtype::fp8::f32_bits_to_e4m3;

/// The 16-bit float sources the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Half {
    /// bf16: widened by appending zero bits.
    Bf16,
    /// f16: widened by F16C (exactly; a NaN quieted, which the quantizer does not look at).
    F16,
}

impl Half {
    /// The infinity's magnitude pattern: above it lie the NaNs.
    fn inf(self) -> i16 {
        match self {
            Half::Bf16 => 0x7F80,
            Half::F16 => 0x7C00,
        }
    }

    /// One value's f32 bits.
    fn widen(self, h: u16) -> u32 {
        match self {
            Half::Bf16 => u32::from(h) << 16,
            Half::F16 => f16_to_f32_bits_bf(h),
        }
    }

    /// Eight values (a 128-bit register of them) as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn widen_8(self, h: __m128i) -> __m256 {
        match self {
            Half::Bf16 => _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)),
            Half::F16 => _mm256_cvtph_ps(h),
        }
    }
}

/// The bits of max |x| over the non-NaN values (bf16 or f16, `half`) of `src` as f32 bits (0
/// when there are none): what `amax_bits` gives for such a source. Works on the 16-bit
/// patterns directly, sixteen to a register: their magnitudes order like the values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn amax_bits_16(src: &[u8], half: Half) -> u32 {
    let n = src.len() / 2;
    let mut best = _mm256_setzero_si256();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 2 * (i + 16) <= 2 * n <= src.len(): the 32 bytes at src[2 * i..] are in
        // bounds; loadu has no alignment requirement.
        let h = unsafe { _mm256_loadu_si256(src.as_ptr().add(2 * i).cast()) };
        let a = _mm256_and_si256(h, _mm256_set1_epi16(0x7FFF));
        // NaNs count as 0; `a` is below 0x8000, so the signed compare is the unsigned one.
        let nan = _mm256_cmpgt_epi16(a, _mm256_set1_epi16(half.inf()));
        best = _mm256_max_epu16(best, _mm256_andnot_si256(nan, a));
        i += 16;
    }
    let mut lanes = [0u16; 16];
    // SAFETY: `lanes` is 32 bytes, the size of the unaligned store.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), best) };
    let mut m = lanes.into_iter().max().unwrap_or(0);
    for s in src[2 * i..2 * n].chunks_exact(2) {
        let a = u16::from_le_bytes([s[0], s[1]]) & 0x7FFF;
        m = m.max(if a > half.inf() as u16 { 0 } else { a });
    }
    half.widen(m)
}

/// Eight f32 values (already divided by the scale) to e4m3fn codes, one per 32-bit lane, as
/// `f32_bits_to_e4m3` gives them.
#[target_feature(enable = "avx2,fma")]
fn encode_e4m3(v: __m256) -> __m256i {
    let w = _mm256_castps_si256(v);
    let a = _mm256_and_si256(w, _mm256_set1_epi32(0x7FFF_FFFF));
    let sign = _mm256_and_si256(_mm256_srli_epi32(w, 24), _mm256_set1_epi32(0x80));
    // Normal range, as the scalar code: round to nearest even by adding just under half an ulp
    // plus the kept lsb, truncate, rebias 127 -> 7.
    let lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7_FFFF)), lsb);
    let normal = _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3));
    // Codes rise with the magnitude and 448 (or anything rounding to it) is 0x7E, so a min is
    // the saturation of everything at or above 448, infinity included.
    let normal = _mm256_min_epu32(normal, _mm256_set1_epi32(0x7E));
    // Subnormal range (< 2^-6): the count of 2^-9 steps rounded to nearest even, which the
    // multiply (exact: a power of two) and the conversion (MXCSR's default rounding) give, as
    // in the reference encoder.
    let steps = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0));
    let sub = _mm256_cvtps_epi32(steps);
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C80_0000), a);
    let code = _mm256_blendv_epi8(normal, sub, is_sub);
    // NaN: 0x7E | 1 = 0x7F (a NaN's `normal` saturated to 0x7E above).
    let nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F80_0000));
    let code = _mm256_or_si256(code, _mm256_and_si256(nan, _mm256_set1_epi32(1)));
    _mm256_or_si256(code, sign)
}

/// The e4m3fn code of eight non-negative, non-NaN f32 values (already divided by the scale), one
/// per 32-bit lane, as `f32_bits_to_e4m3` gives it but without the saturation at 0x7E (the
/// caller takes a min once the codes are 16-bit) and without the sign.
#[target_feature(enable = "avx2,fma")]
fn encode_magnitude(v: __m256) -> __m256i {
    let a = _mm256_castps_si256(v);
    // Normal range: round to nearest even at bit 20 and rebias 127 -> 7, the rebias folded into
    // the constant; an arithmetic shift keeps what falls below 2^-6 negative (the subnormal
    // code replaces it), and what rounds past 448 large (the min saturates it).
    let lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    let biased = _mm256_add_epi32(a, _mm256_set1_epi32(0x7_FFFF - (960 << 20)));
    let normal = _mm256_srai_epi32(_mm256_add_epi32(biased, lsb), 20);
    // Subnormal range (< 2^-6): the count of 2^-9 steps rounded to nearest even, which the
    // multiply (exact: a power of two) and the conversion (MXCSR's default rounding) give, as
    // in the reference encoder.
    let sub = _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(512.0)));
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C80_0000), a);
    _mm256_blendv_epi8(normal, sub, is_sub)
}

/// `e4m3fn(clamp(x / k, -448, 448))` for the bf16 or f16 (`half`) values of `src` into `dst`
/// (one byte each): what `encode_scaled` gives for such a source. The division is a true one, so `k` need not be
/// a power of two; the clamp is the encoder's saturation.
///
/// For the scales quantization makes (positive and finite) the quotient's sign is the value's
/// and only a NaN value gives a NaN, so the loop divides magnitudes, puts the signs back a byte
/// at a time, and sends the rare 32 values holding a NaN to the scalar code; other scales take
/// the general loop.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn divided_16(src: &[u8], dst: &mut [u8], k: f32, stores: Stores, half: Half) {
    let n = (src.len() / 2).min(dst.len());
    let (head, stores) = stores.head(dst.as_ptr(), 1, n);
    scalar(&src[..2 * head], &mut dst[..head], k, half);
    let (s, d) = (&src[2 * head..2 * n], &mut dst[head..n]);
    let i = head
        + if k > 0.0 && k.is_finite() {
            divided_positive(s, d, k, stores, half)
        } else {
            divided_any(s, d, k, stores, half)
        };
    scalar(&src[2 * i..2 * n], &mut dst[i..n], k, half);
}

fn scalar(src: &[u8], dst: &mut [u8], k: f32, half: Half) {
    for (s, d) in src.chunks_exact(2).zip(dst) {
        let x = f32::from_bits(half.widen(u16::from_le_bytes([s[0], s[1]])));
        *d = f32_bits_to_e4m3((x / k).to_bits());
    }
}

/// Two registers of 16 values each (64 source bytes at `p`).
///
/// # Safety
/// The 64 bytes at `p` are readable.
#[inline(always)]
unsafe fn load_64(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract; loadu has no alignment requirement.
    unsafe {
        (
            _mm256_loadu_si256(p.cast()),
            _mm256_loadu_si256(p.add(32).cast()),
        )
    }
}

/// Four registers of eight 32-bit codes (elements 0-7, 8-15, 16-23, 24-31) as 32 bytes in
/// element order. Codes fit a byte, so the saturating packs are exact; they leave the four-code
/// groups in the order a0 b0 c0 d0 a1 b1 c1 d1, which the dword permute undoes.
#[target_feature(enable = "avx2,fma")]
fn pack_codes(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m256i {
    let bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// The vector loop of [`divided_16`] for a positive finite `k`; returns how many
/// values it did (from the start; the rest, under 32, is the caller's).
#[target_feature(enable = "avx2,fma,f16c")]
fn divided_positive(src: &[u8], dst: &mut [u8], k: f32, stores: Stores, half: Half) -> usize {
    let n = (src.len() / 2).min(dst.len());
    let kv = _mm256_set1_ps(k);
    let quarter = |m: __m128i| encode_magnitude(_mm256_div_ps(half.widen_8(m), kv));
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len(): the 64 bytes at src[2 * i..] are in bounds.
        let (h0, h1) = unsafe { load_64(src.as_ptr().add(2 * i)) };
        let m0 = _mm256_and_si256(h0, _mm256_set1_epi16(0x7FFF));
        let m1 = _mm256_and_si256(h1, _mm256_set1_epi16(0x7FFF));
        // NaNs are above the infinity (magnitudes are below 0x8000: the signed compare works).
        let inf = _mm256_set1_epi16(half.inf());
        let nan = _mm256_or_si256(_mm256_cmpgt_epi16(m0, inf), _mm256_cmpgt_epi16(m1, inf));
        if _mm256_movemask_epi8(nan) != 0 {
            scalar(&src[2 * i..2 * i + 64], &mut dst[i..i + 32], k, half);
            i += 32;
            continue;
        }
        let codes = pack_codes(
            quarter(_mm256_castsi256_si128(m0)),
            quarter(_mm256_extracti128_si256(m0, 1)),
            quarter(_mm256_castsi256_si128(m1)),
            quarter(_mm256_extracti128_si256(m1, 1)),
        );
        // Saturation at 448 (anything rounding to it or above, infinity included), then the
        // signs: the high bytes of the values, packed in the same order the codes are in.
        let codes = _mm256_min_epu8(codes, _mm256_set1_epi8(0x7E));
        let high = _mm256_packus_epi16(_mm256_srli_epi16(h0, 8), _mm256_srli_epi16(h1, 8));
        let high = _mm256_permute4x64_epi64(high, 0b11_01_10_00);
        let codes = _mm256_or_si256(codes, _mm256_and_si256(high, _mm256_set1_epi8(i8::MIN)));
        // SAFETY: i + 32 <= n <= dst.len(): the 32 bytes at dst[i..] are in bounds, and aligned
        // when streaming (the caller aligned dst; each step adds 32).
        unsafe { store(dst.as_mut_ptr().add(i), codes, stores) };
        i += 32;
    }
    i
}

/// The vector loop of [`divided_16`] for any `k` (negative, zero or infinite ones
/// only reach here from tests), with [`encode_e4m3`]'s full encoder.
#[target_feature(enable = "avx2,fma,f16c")]
fn divided_any(src: &[u8], dst: &mut [u8], k: f32, stores: Stores, half: Half) -> usize {
    let n = (src.len() / 2).min(dst.len());
    let kv = _mm256_set1_ps(k);
    let quarter = |h: __m128i| encode_e4m3(_mm256_div_ps(half.widen_8(h), kv));
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len(): the 64 bytes at src[2 * i..] are in bounds.
        let (h0, h1) = unsafe { load_64(src.as_ptr().add(2 * i)) };
        let bytes = pack_codes(
            quarter(_mm256_castsi256_si128(h0)),
            quarter(_mm256_extracti128_si256(h0, 1)),
            quarter(_mm256_castsi256_si128(h1)),
            quarter(_mm256_extracti128_si256(h1, 1)),
        );
        // SAFETY: i + 32 <= n <= dst.len(): the 32 bytes at dst[i..] are in bounds, and aligned
        // when streaming.
        unsafe { store(dst.as_mut_ptr().add(i), bytes, stores) };
        i += 32;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::SimdLevel;

    /// A 16-bit pattern's value, by the scalar references.
    fn value(half: Half, h: u16) -> f32 {
        match half {
            Half::Bf16 => crate::dtype::bf16_bits_to_f32(h),
            Half::F16 => crate::dtype::f16_bits_to_f32(h),
        }
    }

    #[test]
    fn amax_equals_the_reference() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        let mut pats = crate::dtype::kernel_tests::patterns_16(1000);
        pats.extend([
            0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x7F81, 0x0001, 0x8000, 0x7C00, 0x7C01,
        ]);
        for half in [Half::Bf16, Half::F16] {
            for len in [0, 1, 15, 16, 17, 100, pats.len()] {
                for start in [0, 5] {
                    let v = &pats[start.min(len)..len.max(start.min(len))];
                    let bytes: Vec<u8> = v.iter().flat_map(|h| h.to_le_bytes()).collect();
                    let want = v
                        .iter()
                        .map(|h| value(half, *h).abs())
                        .filter(|a| !a.is_nan())
                        .fold(0f32, f32::max)
                        .to_bits();
                    // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
                    let got = unsafe { amax_bits_16(&bytes, half) };
                    assert_eq!(got, want, "{half:?} len {len} start {start}");
                }
            }
        }
    }

    #[test]
    fn quantize_16_equals_the_reference_on_every_pattern() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        // Every 16-bit pattern, plus 7 so the tail sees some too.
        let src: Vec<u8> = (0..=u16::MAX)
            .chain(0x3C00..0x3C07)
            .flat_map(u16::to_le_bytes)
            .collect();
        let mut ks = vec![
            1.0f32,
            1.0 / 448.0,
            0.37,
            3.0,
            // Results far below the e4m3 subnormals and into f32 subnormals.
            1.0e30,
            3.0e38,
            // Results that overflow f32 and saturate.
            1.0e-30,
            f32::from_bits(1),
            f32::MIN_POSITIVE,
            -0.5,
            0.0,
            f32::INFINITY,
        ];
        // Positive finite scales as quantization makes them (amax / 448), over many binades.
        ks.extend(
            crate::dtype::avx2::test_scales()
                .into_iter()
                .filter(|k| k.is_finite() && *k > 0.0)
                .step_by(3),
        );
        for half in [Half::Bf16, Half::F16] {
            for (j, &k) in ks.iter().enumerate() {
                // Alternate the stores and the output's alignment (the head before them).
                let stores = [Stores::Cached, Stores::Streaming][j % 2];
                let off = j % 5;
                let mut buf = vec![0u8; src.len() / 2 + 64];
                let got = &mut buf[off..off + src.len() / 2];
                // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
                unsafe { divided_16(&src, got, k, stores, half) };
                for (s, g) in src.chunks_exact(2).zip(got.iter()) {
                    let h = u16::from_le_bytes([s[0], s[1]]);
                    let v = value(half, h) / k;
                    let v = if v > 448.0 { 448.0 } else { v };
                    let v = if v < -448.0 { -448.0 } else { v };
                    let want = crate::dtype::f32_to_fp8_e4m3fn(v);
                    // A NaN's sign after a division is not defined; its shape is.
                    if v.is_nan() {
                        assert_eq!(g & 0x7F, 0x7F, "{half:?} {h:#06x} scale {k:e}");
                        continue;
                    }
                    assert_eq!(*g, want, "{half:?} {h:#06x} scale {k:e}");
                }
            }
        }
    }
}

//! bf16 and f16 -> e4m3fn quantization kernels (f16 widened by F16C, bf16 by a shift).
//!
//! The amax runs on the 16-bit patterns, sixteen to a register. The encode gives, bit for bit,
//! the reference's `e4m3fn(RN(x / k))` (an f32 division, then round to nearest even with
//! saturation) without dividing, for every scale `k` in [2^-90, f32::MAX] (every `amax / 448`
//! above 2^-81); other scales, which quantization never makes, take the `vdivps` loop.
//!
//! The quotient (`Reciprocal::quotient`) is Markstein's correction of the reciprocal product:
//! with y = RN(1/k') once per scale, q0 = RN(x * y), r = fma(-q0, k', x) and
//! q = fma(r, y, q0). Exactness: an ignored test (`--release --ignored`, half a minute) checks
//! q == RN(x / k') for every 11-bit significand x in [1, 2) (every bf16 and f16 significand)
//! and every 24-bit significand k' in [1, 2) — 2^33 pairs, all equal; the non-ignored test
//! samples them. Each step commutes with multiplying x or k' by a power of two as long as its
//! result stays in f32's normal range (RN does), so this covers every value and scale where
//! the code depends on the quotient, q >= 2^-11: there k' = k / 512 >= 2^-99 keeps x, y, q0
//! and q normal, and the remainder a multiple of ulp(q0) * ulp(k') >= 2^-148, so exact even
//! when subnormal. Below, every error is far under the 2^-11 between such a quotient and the
//! first nonzero code's edge at 2^-10 (2^-10 itself, a tie, rounds to 0 in both), and values
//! whose `x * y` could reach 2^127 (infinities, NaNs, huge values for small scales) are found
//! per block and written directly: 0x7E, NaN 0x7F, as the division saturates them.
//!
//! The encoder works on 512 * q (the 512 folded into k' = k / 512, exact), where the subnormal
//! codes are the integers that `vcvtps2dq` rounds to (nearest even), and the normal ones come
//! from integer rounding of the bits; below 2^-6 the normal formula is never above the
//! subnormal code, from 2^-6 on the subnormal one capped at 8 is never above the normal, so a
//! max picks the right one, on 16-bit lanes. bf16 widens the even and odd values apart (a
//! shift, a mask), which one byte shuffle undoes.
//!
//! Runs of at least 2048 values take a table instead (`table` for bf16, `table16` for f16, see
//! their comments): one binade's codes per scale, the rest by shifting the exponent, no float
//! arithmetic in the loop. Blocks with a value in the five binades of subnormal codes (or an
//! f16 subnormal) take the reciprocal code; where such blocks are common (values that were
//! fp8, random bits) the loop computes those lanes beside the table instead (`lanes`): by one
//! fused multiply-add for the seven scales in ten where a check of the scale finds that exact,
//! else by the quotient and one conversion. A [`Quantizer`] keeps the tables of the scales it
//! met, so a tensor's bf16 rows, whose scales repeat, build few.
//!
//! Two costs the loops avoid. A subnormal f32 input or result costs x86 a microcode assist of
//! about a hundred cycles; values too small to have a nonzero code are zeroed before the
//! quotient, which kept random bf16 bits at 0.13 GB/s before. And a call inside a loop makes
//! the compiler spill its registers around it, so each loop is out of line, call-free, and
//! compiled once per kind of stores and source.
//!
//! Speed on this Xeon (one thread, AVX2 forced, 8192-value rows in cache): the bf16 table
//! about 7.5 GB/s of codes on weights whose exponents cluster (real ones); on values that were
//! fp8, 5.2 with its lanes computed by one product, 4.5 by the quotient; the f16 table about
//! 5.5 on weights (a block in thirteen holds an f16 subnormal); the reciprocal loop about 3.7;
//! the `vdivps` loop 2.4. The per-row loop
//! prefetches the next row into L2 so its amax pass does not wait on memory.

use core::arch::x86_64::*;

use super::{store, Stores};
use crate::dtype::fp8::f32_bits_to_e4m3;
use crate::dtype::half::f16_to_f32_bits_bf;
use reciprocal::{reciprocal, Reciprocal};

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

    /// The largest pattern whose value is at most `x` (non-negative and finite), which may be
    /// negative where `x` is under the smallest positive value's half (f16) or out of range.
    fn floor_pattern(self, x: f32) -> i32 {
        let bits = x.to_bits() as i32;
        match self {
            Half::Bf16 => bits >> 16,
            // Under 2^-14 the f16 subnormals, multiples of 2^-24 (the product is exact).
            Half::F16 if x < f32::from_bits(0x3880_0000) => (x * 16_777_216.0) as i32,
            Half::F16 => (bits >> 13) - (112 << 10),
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

/// What the amax pass over a 16-bit source found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amax {
    /// The bits of max |x| over the non-NaN values as f32 bits (0 when there are none).
    pub(crate) bits: u32,
    /// Whether the source holds a NaN: where it does not, the table loops skip their NaN test
    /// (an infinity comes out of a table saturated, as the division gives it).
    pub(crate) nan: bool,
}

/// The bits of max |x| over the non-NaN values (bf16 or f16, `half`) of `src` as f32 bits (0
/// when there are none): what `amax_bits` gives for such a source, and whether a NaN is among
/// them. Works on the 16-bit patterns directly, sixteen to a register: their magnitudes order
/// like the values. The loop takes NaNs as the largest magnitudes; only when one comes out on
/// top does a second pass leave them out. `PREFETCH`: ask for `src` in L2 ahead of the loads
/// (see `prefetch_l2`), as a whole tensor's pass needs: on a Xeon KVM guest it took
/// per-tensor quantizing from 0.33-0.36x memcpy to 0.37-0.40x, where a row the per-row
/// quantizer had prefetched lost 6% to the extra hints.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn amax_bits_16<const PREFETCH: bool>(src: &[u8], half: Half) -> Amax {
    let top = max_magnitude::<PREFETCH>(src, half, false);
    if top <= half.inf() as u16 {
        return Amax {
            bits: half.widen(top),
            nan: false,
        };
    }
    Amax {
        bits: half.widen(max_magnitude::<PREFETCH>(src, half, true)),
        nan: true,
    }
}

/// The largest 16-bit magnitude pattern in `src`, NaNs counted as 0 if `skip_nan`, as the
/// largest patterns otherwise.
#[target_feature(enable = "avx2,fma,f16c")]
fn max_magnitude<const PREFETCH: bool>(src: &[u8], half: Half, skip_nan: bool) -> u16 {
    let n = src.len() / 2;
    let magnitude = _mm256_set1_epi16(0x7FFF);
    let inf = _mm256_set1_epi16(half.inf());
    let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let mut i = 0;
    while i + 32 <= n {
        if PREFETCH {
            super::primitives::prefetch_l2(src, 2 * i);
        }
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len(): the 64 bytes at src[2 * i..] are in
        // bounds.
        let (h0, h1) = unsafe { load_64(src.as_ptr().add(2 * i)) };
        let (mut m0, mut m1) = (
            _mm256_and_si256(h0, magnitude),
            _mm256_and_si256(h1, magnitude),
        );
        if skip_nan {
            // Magnitudes are below 0x8000, so the signed compare is the unsigned one.
            m0 = _mm256_andnot_si256(_mm256_cmpgt_epi16(m0, inf), m0);
            m1 = _mm256_andnot_si256(_mm256_cmpgt_epi16(m1, inf), m1);
        }
        // Two accumulators: each max waits only on its own.
        a = _mm256_max_epu16(a, m0);
        b = _mm256_max_epu16(b, m1);
        i += 32;
    }
    let mut lanes = [0u16; 16];
    // SAFETY: `lanes` is 32 bytes, the size of the unaligned store.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), _mm256_max_epu16(a, b)) };
    let mut m = lanes.into_iter().max().unwrap_or(0);
    for s in src[2 * i..2 * n].chunks_exact(2) {
        let a = u16::from_le_bytes([s[0], s[1]]) & 0x7FFF;
        m = m.max(if skip_nan && a > half.inf() as u16 {
            0
        } else {
            a
        });
    }
    m
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

/// A thread's quantizing of one tensor's 16-bit values: how it writes and prefetches, and the
/// tables of the scales it has met, which later rows with the same scale reuse (the rows of a
/// bf16 weight share few scales: a row's amax is a bf16 value and rows' amax values cluster).
pub(crate) struct Quantizer {
    half: Half,
    stores: Stores,
    ahead: usize,
    tables: Tables,
}

/// The tables a [`Quantizer`] keeps, of its source's kind (boxed: 64 tables are 8-10 KiB).
enum Tables {
    Bf16(Box<table::Tables<table::Bf16Table>>),
    F16(Box<table::Tables<table16::F16Table>>),
}

impl Quantizer {
    /// `ahead` (bytes) is how far past each block to prefetch into L2: the next row's distance
    /// for the per-row quantizer, whose amax pass then reads it from L2, a few KiB otherwise.
    pub(crate) fn new(half: Half, stores: Stores, ahead: usize) -> Quantizer {
        Quantizer {
            half,
            stores,
            ahead,
            tables: match half {
                Half::Bf16 => Tables::Bf16(Box::new(table::Tables::new())),
                Half::F16 => Tables::F16(Box::new(table::Tables::new())),
            },
        }
    }

    /// [`amax_bits_16`] of `src`, of this quantizer's kind.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn amax(&self, src: &[u8]) -> Amax {
        // The per-row quantizer prefetched this row while it quantized the one before.
        amax_bits_16::<false>(src, self.half)
    }

    /// `e4m3fn(clamp(x / k, -448, 448))` for the values of `src` into `dst` (one byte each):
    /// what `encode_scaled` gives for such a source, for any `k`; the clamp is the encoder's
    /// saturation. `nan_free` says the caller knows `src` holds no NaN ([`Amax::nan`]), which
    /// spares the table loops a test.
    ///
    /// For the scales quantization makes (positive and finite) the quotient's sign is the
    /// value's and only a NaN value gives a NaN, so the loops work on magnitudes and put the
    /// signs back a byte at a time; other scales take the general loop, which divides.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn divided(&mut self, src: &[u8], dst: &mut [u8], k: f32, nan_free: bool) {
        let (half, ahead) = (self.half, self.ahead);
        let n = (src.len() / 2).min(dst.len());
        let (head, stores) = self.stores.head(dst.as_ptr(), 1, n);
        scalar(&src[..2 * head], &mut dst[..head], k, half);
        let (s, d) = (&src[2 * head..2 * n], &mut dst[head..n]);
        let long = s.len() / 2 >= table::MIN_VALUES;
        let i = head
            + match Reciprocal::new(k) {
                Some(r) => {
                    // The table loop (where the rows are long enough to pay for a table), then
                    // the reciprocal one for what it leaves.
                    let j = match &mut self.tables {
                        Tables::Bf16(tables) if long => {
                            match tables.get(k, |k| table::Bf16Table::new(k)) {
                                Some(t) => table::by_table(s, d, t, r, stores, ahead, nan_free),
                                None => 0,
                            }
                        }
                        Tables::F16(tables) if long => {
                            match tables.get(k, |k| table16::F16Table::new(k)) {
                                Some(t) => table::by_table(s, d, t, r, stores, ahead, nan_free),
                                None => 0,
                            }
                        }
                        _ => 0,
                    };
                    j + reciprocal(&s[2 * j..], &mut d[j..], r, stores, ahead, half)
                }
                None => divided_any(s, d, k, stores, half),
            };
        scalar(&src[2 * i..2 * n], &mut dst[i..n], k, half);
    }
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

/// The vector loop of [`Quantizer::divided`] for any `k` (negative, zero or infinite ones
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

mod lanes;
mod reciprocal;
mod table;
mod table16;
#[cfg(test)]
mod tests;

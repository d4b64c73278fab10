//! The codes the table loops compute beside their tables where values in the five binades under
//! the table's are common (values that were fp8, random bits). Those quotients are under 2^-5,
//! where a code is 512 times the quotient rounded to an integer (to nearest even), so the
//! reference's code is `v = 512 * x / k` rounded once to f32, then to an integer.
//!
//! Two ways to get it. The exact quotient (Markstein's three operations, see `quant`) and a
//! conversion, for every scale. Or one fused multiply-add, `RN(x * m + 2^23)`, which leaves the
//! exact product `x * m` rounded to an integer in the low bits: a third of the arithmetic, but
//! it rounds once where the reference rounds twice, so it is taken only for the scales where a
//! multiplier m next to `512 / k` gives every code, which [`Lanes::new`] checks once per table.
//! Quantization's own scales, `amax / 448` of a bf16 or f16 amax, pass about seven times in ten;
//! the others are the scales where some value's `v` lies so close to a half-integer that the
//! reference rounds it to the half-integer itself and then to even, which no single product
//! reproduces for every value.

use core::arch::x86_64::*;
use core::ops::RangeInclusive;

use super::reciprocal::{bf16_order, bf16_quotients, f16_order, f16_quotients, Reciprocal};
use super::Half;
use crate::dtype::fp8::f32_bits_to_e4m3;

/// 2^23: added to a product under 2^22 in one fused multiply-add, it leaves the product rounded
/// to an integer (to nearest even) in the sum's low mantissa bits.
const ROUND_TO_INTEGER: f32 = 8_388_608.0;

/// How a table loop computes the codes of the binades under its table's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Lanes {
    /// By the exact quotient and a conversion.
    Quotient,
    /// By one fused multiply-add with this multiplier.
    Product(f32),
}

impl Lanes {
    /// How to compute, for the scale of `r`, the codes of the values of `half` whose patterns
    /// lie in `patterns` (all with quotients under 2^-5): by one product where `512 / k`
    /// correctly rounded, or the f32 just above or below it, gives every one of them (a search
    /// of 64 ulps each way found no farther multiplier that helps), else by the quotient.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn new(r: Reciprocal, half: Half, patterns: RangeInclusive<i32>) -> Lanes {
        let y = r.y.to_bits();
        [y, y + 1, y - 1]
            .map(f32::from_bits)
            .into_iter()
            .find(|&m| gives_every_code(r, m, half, &patterns))
            .map_or(Lanes::Quotient, Lanes::Product)
    }
}

/// Whether `RN(x * m + 2^23)`'s low byte is the reference's code `e4m3(RN(x / k))` for every
/// value of `half` whose pattern lies in `patterns`, with m within an ulp of `y`.
///
/// Why a few patterns decide it. `x * m` and `RN(v)` both lie within a relative 2^-22 of `v`
/// (m is `512 / k` to within an ulp and a half), so within 2^-18 as `v < 16`, and their
/// integers differ only where a half-integer h lies that close to `v`: x within a relative
/// 2^-17 of `x_h = h * k / 512`. Neighbouring bf16 and f16 values lie at least a relative
/// 2^-11 apart, so only g, the pattern at or under `x_h`, and g + 1 can be that close. The
/// computed `x_h` (rounded once, a relative 2^-24 off) has g under it; or g + 1 where it rounded
/// up to g + 1 (`x_h` then lies just under g + 1, and g is far); or g - 1 where it rounded down
/// under g (`x_h` then lies on or just over g, and g + 1 is far). So the pattern under the
/// computed `x_h` and the next cover the close ones; those, for the sixteen half-integers under
/// 16, are checked against the reference.
#[target_feature(enable = "avx2,fma")]
fn gives_every_code(r: Reciprocal, m: f32, half: Half, patterns: &RangeInclusive<i32>) -> bool {
    let k = r.k * 512.0;
    (0..16u8).all(|n| {
        let p = half.floor_pattern((f32::from(n) + 0.5) * r.k);
        (p..=p + 1).filter(|p| patterns.contains(p)).all(|p| {
            let x = f32::from_bits(half.widen(p as u16));
            rounded_product(x, m) == u32::from(f32_bits_to_e4m3((x / k).to_bits()))
        })
    })
}

/// One value's [`rounded_products`], the low byte: by the instruction the loops use, not
/// `f32::mul_add`, which outside an FMA function calls the C library's `fmaf` (MinGW's rounds
/// twice).
#[target_feature(enable = "avx2,fma")]
pub(super) fn rounded_product(x: f32, m: f32) -> u32 {
    let (x, m, c) = (_mm_set_ss(x), _mm_set_ss(m), _mm_set_ss(ROUND_TO_INTEGER));
    _mm_cvtss_f32(_mm_fmadd_ss(x, m, c)).to_bits() & 0xFF
}

/// `RN(x * m + 2^23)` of eight non-negative values, as bits: for `x * m` under 256, the exact
/// product rounded to an integer is the low byte; above, or for an infinite or NaN `x`, that
/// byte means nothing.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn rounded_products(x: __m256, m: __m256) -> __m256i {
    _mm256_castps_si256(_mm256_fmadd_ps(x, m, _mm256_set1_ps(ROUND_TO_INTEGER)))
}

/// The codes of the 32 bf16 values `h0`, `h1` whose quotients are under 2^-5 (others' are
/// meaningless), unsigned, in `packs`' lane order, by the quotient. Tiny values are zeroed
/// first, as in the reciprocal code, so that nothing is subnormal.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn bf16_by_quotient(h0: __m256i, h1: __m256i, r: Reciprocal) -> __m256i {
    let sixteen = |h: __m256i| {
        let (even, odd) = bf16_quotients(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)), r);
        // A quotient of 2^31 or more converts to i32::MIN, which saturates to 0 below (and is
        // not used).
        _mm256_packs_epi32(_mm256_cvtps_epi32(even), _mm256_cvtps_epi32(odd))
    };
    _mm256_shuffle_epi8(_mm256_packus_epi16(sixteen(h0), sixteen(h1)), bf16_order())
}

/// [`bf16_by_quotient`] by one product with the multiplier `m` ([`Lanes::Product`]), for the
/// lanes whose magnitude patterns are at least `first`. Smaller magnitudes are raised to
/// `first`, so that no input is subnormal (a microcode assist).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn bf16_by_product(h0: __m256i, h1: __m256i, first: i16, m: f32) -> __m256i {
    let (first, m) = (_mm256_set1_epi16(first), _mm256_set1_ps(m));
    let sixteen = |h: __m256i| {
        let x = _mm256_max_epu16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)), first);
        // The even values widened by a shift, the odd ones by a mask; each code comes back in
        // its value's 16-bit lane, the even ones' from the low byte, the odd ones' shifted up
        // to theirs.
        let even = rounded_products(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), m);
        let odd = _mm256_and_si256(x, _mm256_set1_epi32(-0x1_0000));
        let odd = rounded_products(_mm256_castsi256_ps(odd), m);
        _mm256_or_si256(
            _mm256_and_si256(even, _mm256_set1_epi32(0xFF)),
            _mm256_slli_epi32(odd, 16),
        )
    };
    // The lanes used are under 256; packus saturates the others to some byte.
    _mm256_packus_epi16(sixteen(h0), sixteen(h1))
}

/// The codes of the 32 f16 values `h0`, `h1` whose quotients are under 2^-5 (others' are
/// meaningless), unsigned, in `packs`' lane order, by the quotient.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn f16_by_quotient(h0: __m256i, h1: __m256i, r: Reciprocal) -> __m256i {
    let sixteen = |h: __m256i| {
        let (lo, hi) = f16_quotients(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)), r);
        _mm256_packs_epi32(_mm256_cvtps_epi32(lo), _mm256_cvtps_epi32(hi))
    };
    let codes = _mm256_packus_epi16(sixteen(h0), sixteen(h1));
    _mm256_permutevar8x32_epi32(codes, f16_order())
}

/// [`f16_by_quotient`] by one product with the multiplier `m` ([`Lanes::Product`]). F16C
/// widens every f16 value to a normal f32 (or zero), and the sum is near 2^23, so nothing is
/// subnormal.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn f16_by_product(h0: __m256i, h1: __m256i, m: f32) -> __m256i {
    let m = _mm256_set1_ps(m);
    let eight = |h: __m128i| {
        let codes = rounded_products(_mm256_cvtph_ps(h), m);
        _mm256_and_si256(codes, _mm256_set1_epi32(0xFF))
    };
    let sixteen = |h: __m256i| {
        let h = _mm256_and_si256(h, _mm256_set1_epi16(0x7FFF));
        let lo = eight(_mm256_castsi256_si128(h));
        _mm256_packs_epi32(lo, eight(_mm256_extracti128_si256(h, 1)))
    };
    let codes = _mm256_packus_epi16(sixteen(h0), sixteen(h1));
    _mm256_permutevar8x32_epi32(codes, f16_order())
}

//! The two 8-bit float formats: scalar reference codecs written from the format definitions, and
//! branch-free variants that the kernels use because LLVM vectorizes them.
//!
//! e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; `S.1111.111` is NaN;
//! largest finite value 448; subnormals are `m * 2^-9`.
//! e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like with infinities and NaNs: it
//! is the upper byte of an IEEE binary16.
//!
//! NaN bit patterns follow torch where it is cheap: e4m3fn NaN decodes to `sign | 0x7FF0_0000`,
//! an e5m2 NaN decodes like the f16 it is the upper byte of (payload kept, quiet bit set).

use super::half::f16_bits_to_f32;

/// Largest finite e4m3fn value.
pub const FP8_E4M3FN_MAX: f32 = 448.0;

/// The f32 that torch produces for an e4m3fn NaN (sign added separately).
const E4M3_NAN_F32: u32 = 0x7FF0_0000;

/// Decodes one e4m3fn code to f32, exactly.
pub fn fp8_e4m3fn_to_f32(code: u8) -> f32 {
    let negative = code & 0x80 != 0;
    let exponent = i32::from((code >> 3) & 0x0F);
    let mantissa = f32::from(code & 0x07);
    let magnitude = if exponent == 0x0F && code & 0x07 == 0x07 {
        f32::from_bits(E4M3_NAN_F32)
    } else if exponent == 0 {
        mantissa * (2.0f32).powi(-9)
    } else {
        (1.0 + mantissa / 8.0) * (2.0f32).powi(exponent - 7)
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// Decodes one e5m2 code to f32, exactly (a NaN keeps its payload and becomes quiet).
pub fn fp8_e5m2_to_f32(code: u8) -> f32 {
    // An e5m2 code is the upper byte of the f16 with the same value; the f16 decoder is the
    // reference for that format.
    f16_bits_to_f32(u16::from(code) << 8)
}

/// Encodes an f32 as e4m3fn with round-to-nearest-even, the way torch's `.to(float8_e4m3fn)`
/// does: finite values and infinities beyond the range saturate to ±448, NaN becomes
/// `0x7F | sign`, values below half the smallest subnormal become ±0.
pub fn f32_to_fp8_e4m3fn(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    if x.is_nan() {
        return 0x7F | sign;
    }
    let a = x.abs();
    if a >= FP8_E4M3FN_MAX {
        return 0x7E | sign;
    }
    let min_normal = (2.0f32).powi(-6);
    let code = if a < min_normal {
        // Scaling by a power of two is exact, so one rounding to an integer count of the
        // subnormal step 2^-9 is the whole conversion; 8 steps is the smallest normal's code.
        (a * 512.0).round_ties_even() as u8
    } else {
        let exponent = a.log2().floor() as i32;
        // log2 may be off by one near powers of two; fix it with an exact comparison.
        let exponent = if (2.0f32).powi(exponent) > a {
            exponent - 1
        } else if (2.0f32).powi(exponent + 1) <= a {
            exponent + 1
        } else {
            exponent
        };
        let steps = (a / (2.0f32).powi(exponent - 3)).round_ties_even() as i32; // 8..=16
        ((exponent + 7) * 8 + steps - 8) as u8
    };
    // Rounding up from just below 448 cannot pass it (464 is the tie, and it saturates above).
    code.min(0x7E) | sign
}

/// Branch-free e4m3fn -> f32 bits, equal to [`fp8_e4m3fn_to_f32`].
#[inline(always)]
pub(crate) fn e4m3_to_f32_bits(code: u8) -> u32 {
    let c = u32::from(code);
    let sign = (c & 0x80) << 24;
    let mag = c & 0x7F;
    // Rebias the exponent from 7 to 127 in place: (127 - 7) << 23.
    let normal = (mag << 20) + (120 << 23);
    // Subnormals are an integer count of 2^-9; int->float and a power-of-two multiply are
    // exact and never touch f32 denormals (the slow path of some CPUs).
    let sub = ((mag as f32) * (1.0 / 512.0)).to_bits();
    let v = if mag < 8 { sub } else { normal };
    let v = if mag == 0x7F { E4M3_NAN_F32 } else { v };
    sign | v
}

/// Branch-free e4m3fn -> bf16 bits, equal to `f32_to_bf16_bits(fp8_e4m3fn_to_f32(code))`
/// (every e4m3fn value is a bf16 value; NaN becomes `0x7FC0 | sign`).
#[inline(always)]
pub(crate) fn e4m3_to_bf16_bits(code: u8) -> u16 {
    let c = u16::from(code);
    let sign = (c & 0x80) << 8;
    let mag = c & 0x7F;
    let normal = (mag << 4) + (120 << 7);
    // The seven subnormals m * 2^-9 as bf16: m = 1, 2, 4 are powers of two (exponents 118..120),
    // 3, 5, 6, 7 add one or two mantissa bits. Derive them from the float of m, shifted down by
    // 9 binades, which LLVM turns into a vector int->float conversion.
    let m_bits = ((mag as f32).to_bits() >> 16) as u16;
    let sub = if mag == 0 {
        0
    } else {
        m_bits.wrapping_sub(9 << 7)
    };
    let v = if mag < 8 { sub } else { normal };
    let v = if mag == 0x7F { 0x7FC0 } else { v };
    sign | v
}

/// Branch-free e5m2 -> bf16 bits, equal to `f32_to_bf16_bits(fp8_e5m2_to_f32(code))`.
#[inline(always)]
pub(crate) fn e5m2_to_bf16_bits(code: u8) -> u16 {
    let c = u16::from(code);
    let sign = (c & 0x80) << 8;
    let mag = c & 0x7F;
    // Rebias from 15 to 127: (127 - 15) << 7.
    let normal = (mag << 5) + (112 << 7);
    let m_bits = ((mag as f32).to_bits() >> 16) as u16;
    // Subnormals are m * 2^-16.
    let sub = if mag == 0 {
        0
    } else {
        m_bits.wrapping_sub(16 << 7)
    };
    let v = if mag < 4 { sub } else { normal };
    let v = if mag >= 0x7C { 0x7F80 } else { v };
    let v = if mag > 0x7C { 0x7FC0 } else { v };
    sign | v
}

/// Branch-free e5m2 -> f32 bits, equal to [`fp8_e5m2_to_f32`].
#[inline(always)]
pub(crate) fn e5m2_to_f32_bits(code: u8) -> u32 {
    super::half::f16_to_f32_bits_bf(u16::from(code) << 8)
}

/// Branch-free f32 bits -> e4m3fn with torch's saturation, equal to [`f32_to_fp8_e4m3fn`].
#[inline(always)]
pub(crate) fn f32_bits_to_e4m3(w: u32) -> u8 {
    let sign = ((w >> 24) & 0x80) as u8;
    let a = w & 0x7FFF_FFFF;
    // Normal range: add just under half an e4m3 ulp (bit 20 is the last kept mantissa bit),
    // plus one on odd results, so the truncation rounds to nearest even; a carry moves into the
    // exponent as it should.
    let rounded = a + 0x7_FFFF + ((a >> 20) & 1);
    let normal = (rounded >> 20).wrapping_sub(120 << 3);
    // Subnormal range (< 2^-6): shift the full significand down to units of 2^-9 and round
    // to nearest even by hand; a result of 8 is the smallest normal's code.
    let e = (a >> 23) as i32;
    let significand = (a & 0x7F_FFFF) | if e > 0 { 0x80_0000 } else { 0 };
    let shift = (141 - e.max(1)).clamp(1, 31) as u32;
    let q = significand >> shift;
    let rem = significand & ((1u32 << shift) - 1);
    let half = 1u32 << (shift - 1);
    let round_up = rem > half || (rem == half && q & 1 == 1);
    let sub = q + u32::from(round_up);
    let v = if a < 0x3C80_0000 { sub } else { normal };
    // 448 = 0x43E0_0000: everything at or above it (infinity included) saturates.
    let v = if a >= 0x43E0_0000 { 0x7E } else { v };
    let v = if a > 0x7F80_0000 { 0x7F } else { v };
    (v as u8) | sign
}

#[cfg(test)]
mod tests {
    use super::super::half::{
        f16_to_f32_bits_bf, f32_bits_to_bf16_bf, f32_bits_to_f16_bf, f32_to_bf16_bits,
        f32_to_f16_bits,
    };
    use super::*;

    #[test]
    fn branch_free_decoders_equal_the_reference() {
        for c in 0..=255u8 {
            assert_eq!(
                e4m3_to_f32_bits(c),
                fp8_e4m3fn_to_f32(c).to_bits(),
                "{c:#04x}"
            );
            assert_eq!(
                e5m2_to_f32_bits(c),
                fp8_e5m2_to_f32(c).to_bits(),
                "{c:#04x}"
            );
            assert_eq!(e4m3_to_bf16_bits(c), f32_to_bf16_bits(fp8_e4m3fn_to_f32(c)));
            assert_eq!(e5m2_to_bf16_bits(c), f32_to_bf16_bits(fp8_e5m2_to_f32(c)));
        }
        for h in 0..=u16::MAX {
            let want = super::super::half::f16_bits_to_f32(h).to_bits();
            assert_eq!(f16_to_f32_bits_bf(h), want, "{h:#06x}");
        }
    }

    /// Checks the branch-free encoders on f32 patterns spaced by `step` (every pattern with 1).
    fn encoders_on_patterns(step: usize) {
        for w in (0..=u32::MAX)
            .step_by(step)
            .chain([0x43E0_0000, 0x43E8_0000, 0x3C80_0000])
        {
            let x = f32::from_bits(w);
            assert_eq!(
                f32_bits_to_bf16_bf(w),
                f32_to_bf16_bits(x),
                "bf16 {w:#010x}"
            );
            assert_eq!(f32_bits_to_f16_bf(w), f32_to_f16_bits(x), "f16 {w:#010x}");
            assert_eq!(f32_bits_to_e4m3(w), f32_to_fp8_e4m3fn(x), "e4m3 {w:#010x}");
        }
    }

    #[test]
    fn branch_free_encoders_equal_the_reference() {
        // A prime stride touches every exponent and many rounding positions in debug-fast time.
        encoders_on_patterns(4099);
        // Dense near the fp8 range's boundaries, where subnormal and saturation logic meet.
        for base in [
            0x3A00_0000u32,
            0x3C7F_0000,
            0x43D0_0000,
            0x3880_0000 - 0x8000,
        ] {
            for w in base..base + 0x1_0000 {
                for w in [w, w | 0x8000_0000] {
                    let x = f32::from_bits(w);
                    assert_eq!(f32_bits_to_e4m3(w), f32_to_fp8_e4m3fn(x), "e4m3 {w:#010x}");
                    assert_eq!(f32_bits_to_f16_bf(w), f32_to_f16_bits(x), "f16 {w:#010x}");
                }
            }
        }
    }

    #[test]
    #[ignore = "all 2^32 patterns: run with --release --ignored"]
    fn branch_free_encoders_equal_the_reference_exhaustively() {
        encoders_on_patterns(1);
    }
}

//! The 16-bit float formats bf16 and f16: scalar reference codecs written from the format
//! definitions, their branch-free twins that the kernels use (LLVM vectorizes them), and the
//! round-to-odd narrowing of f64 that lets one rounding through f32 equal a direct one.
//!
//! Rounding is to nearest even, infinities stay infinities, overflow gives infinity, subnormals
//! are kept. NaN stays NaN and is quiet: f32 -> bf16 gives `0x7FC0 | sign` (the canonical NaN of
//! torch's scalar path, with the sign kept); f32 -> f16 keeps the sign and the upper payload bits
//! and sets the quiet bit, as torch and F16C do; f16 -> f32 sets the quiet bit; bf16 -> f32 is
//! the exact widening (payload kept, as in torch).

/// Widens bf16 bits to f32 (exact: bf16 is the upper half of an f32).
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Rounds an f32 to bf16 bits (nearest even; NaN -> `0x7FC0 | sign`).
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let w = x.to_bits();
    if x.is_nan() {
        return ((w >> 16) as u16 & 0x8000) | 0x7FC0;
    }
    let kept = (w >> 16) as u16;
    let dropped = w & 0xFFFF;
    let round_up = dropped > 0x8000 || (dropped == 0x8000 && kept & 1 == 1);
    // A carry out of the mantissa bumps the exponent, up to infinity: that is the IEEE result.
    kept + u16::from(round_up)
}

/// Decodes f16 bits to f32, exactly (a NaN keeps its payload and becomes quiet).
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    let negative = bits & 0x8000 != 0;
    let exponent = i32::from((bits >> 10) & 0x1F);
    let mantissa = bits & 0x03FF;
    let magnitude = match exponent {
        0 => f32::from(mantissa) * (2.0f32).powi(-24),
        0x1F if mantissa == 0 => f32::INFINITY,
        0x1F => f32::from_bits(0x7FC0_0000 | (u32::from(mantissa) << 13)),
        _ => (1.0 + f32::from(mantissa) / 1024.0) * (2.0f32).powi(exponent - 15),
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// Rounds an f32 to f16 bits (nearest even, overflow to infinity, subnormals kept).
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let w = x.to_bits();
    let sign = ((w >> 16) & 0x8000) as u16;
    let a = w & 0x7FFF_FFFF;
    if a > 0x7F80_0000 {
        return sign | 0x7E00 | ((a >> 13) & 0x03FF) as u16;
    }
    let magnitude = f32::from_bits(a);
    if magnitude >= 65520.0 {
        // 65520 is halfway between the largest f16 (65504) and the next step: it rounds to even,
        // which is infinity.
        return sign | 0x7C00;
    }
    if magnitude < (2.0f32).powi(-14) {
        // Subnormal range: an exact power-of-two scaling, then one rounding to the 2^-24 step.
        // A count of 1024 steps is the smallest normal's code, so no special case is needed.
        return sign | (magnitude * (2.0f32).powi(24)).round_ties_even() as u16;
    }
    let exponent = (a >> 23) as i32 - 127 + 15;
    let mantissa = a & 0x7F_FFFF;
    let kept = (exponent as u32) << 10 | (mantissa >> 13);
    let dropped = mantissa & 0x1FFF;
    let round_up = dropped > 0x1000 || (dropped == 0x1000 && kept & 1 == 1);
    sign | (kept + u32::from(round_up)) as u16
}

/// Branch-free f32 bits -> bf16 bits, equal to [`f32_to_bf16_bits`].
#[inline(always)]
pub(crate) fn f32_bits_to_bf16_bf(w: u32) -> u16 {
    let rounded = (w.wrapping_add(0x7FFF + ((w >> 16) & 1)) >> 16) as u16;
    let nan = ((w >> 16) as u16 & 0x8000) | 0x7FC0;
    if w & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }
}

/// Branch-free f32 bits -> f16 bits, equal to [`f32_to_f16_bits`].
#[inline(always)]
pub(crate) fn f32_bits_to_f16_bf(w: u32) -> u16 {
    let sign = ((w >> 16) & 0x8000) as u16;
    let a = w & 0x7FFF_FFFF;
    // Normal range: round the 13 dropped bits to nearest even, then rebias 127 -> 15.
    let normal = ((a + 0x0FFF + ((a >> 13) & 1)) >> 13).wrapping_sub(112 << 10);
    // Subnormal range (< 2^-14): shift the significand to units of 2^-24 with a hand-made
    // nearest-even rounding; integer shifts vectorize and never touch f32 denormal arithmetic.
    let e = (a >> 23) as i32;
    let significand = (a & 0x7F_FFFF) | if e > 0 { 0x80_0000 } else { 0 };
    let shift = (126 - e.max(1)).clamp(1, 31) as u32;
    let q = significand >> shift;
    let rem = significand & ((1u32 << shift) - 1);
    let half = 1u32 << (shift - 1);
    let sub = q + u32::from(rem > half || (rem == half && q & 1 == 1));
    let v = if a < 0x3880_0000 { sub } else { normal };
    let v = if a >= 0x477F_F000 { 0x7C00 } else { v };
    let v = if a > 0x7F80_0000 {
        0x7E00 | ((a >> 13) & 0x03FF)
    } else {
        v
    };
    sign | v as u16
}

/// Branch-free f16 bits -> f32 bits, equal to [`f16_bits_to_f32`].
#[inline(always)]
pub(crate) fn f16_to_f32_bits_bf(h: u16) -> u32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let mag = h & 0x7FFF;
    let normal = (mag << 13) + (112 << 23);
    // Subnormals are an integer count of 2^-24: exact int->float and power-of-two multiply.
    let sub = ((mag as f32) * (1.0 / 16_777_216.0)).to_bits();
    let special = 0x7F80_0000 | ((mag & 0x03FF) << 13) | if mag > 0x7C00 { 0x40_0000 } else { 0 };
    let v = if mag < 0x0400 { sub } else { normal };
    let v = if mag >= 0x7C00 { special } else { v };
    sign | v
}

/// Narrows an f64 to f32 with round-to-odd: truncate, and set the last bit when anything was
/// dropped. Rounding that to bf16 or f16 (nearest even) then equals one direct rounding of the
/// f64, because f32 keeps more than two extra bits over both at every exponent.
#[inline(always)]
pub(crate) fn f64_to_f32_odd(x: f64) -> f32 {
    let t = x as f32;
    if f64::from(t) == x || x.is_nan() {
        return t;
    }
    let mut bits = t.to_bits();
    if f64::from(t).abs() > x.abs() {
        // Rounded away from zero (possibly to infinity): step back towards zero.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

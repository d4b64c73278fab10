//! Rounding and maximum steps the 8-bit quantizers share (Q8_0 and int8), written as float and
//! integer operations that vectorize, where `f32::round_ties_even`, `f32::max` and the
//! saturating `as` are library calls or scalar code on the baseline target.

/// The largest `|x|` over the non-NaN values (0 for none). Compared as bit patterns: for
/// magnitudes the integer order is the float order, and an integer maximum vectorizes where
/// `f32::max`, which must skip NaNs, does not.
#[inline(always)]
pub(crate) fn lane_amax(x: &[f32]) -> f32 {
    let mut acc = [0u32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    let mag = |v: &f32| {
        let a = v.to_bits() & 0x7FFF_FFFF;
        if a > 0x7F80_0000 {
            0
        } else {
            a
        }
    };
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = (*a).max(mag(v));
        }
    }
    let m = tail.iter().map(mag).fold(0, u32::max);
    f32::from_bits(acc.into_iter().fold(m, u32::max))
}

/// 1.5 * 2^23: adding it rounds a value of magnitude under 2^22 to an integer (nearest even, the
/// current mode), which then sits in the low bits of the sum's mantissa, offset by 2^22.
const MAGIC: f32 = 12_582_912.0;

/// `x` (a magnitude under 2^22, not NaN) rounded to the nearest integer, halves to even: as a
/// float and as an integer. Float operations that vectorize, where `round_ties_even` and the
/// saturating `as` are library calls or scalar code on the baseline target.
#[inline(always)]
pub(crate) fn round_even(x: f32) -> (f32, i32) {
    let sum = x + MAGIC;
    (sum - MAGIC, (sum.to_bits() & 0x7F_FFFF) as i32 - 0x40_0000)
}

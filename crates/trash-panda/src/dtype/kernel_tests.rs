//! What the tests of the hand-written kernels share, on x86-64 and aarch64 alike: the scales they
//! run every code over, and the 16-bit patterns they quantize. One list, so a scale that caught a
//! bug on one architecture is tried on the other.

/// The special scales (signed zeros, infinities, NaNs, the edges of f32, products that fall
/// below 2^-126 for the smallest fp8 values, awkward reciprocals, the ends of ranges kernels
/// treat apart), then `spread` pseudo-random finite scales, most in
/// the range real scales live in.
pub(crate) fn scales(spread: usize) -> Vec<f32> {
    let mut k = vec![
        1.0,
        -1.0,
        0.0,
        -0.0,
        0.37,
        1e-3,
        448.0,
        3.0e38,
        1.0e-30,
        1.0e-36,
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MAX,
        // Powers of two, and the lower end of the range the x86 quantizer's reciprocal takes
        // (2^-90) and just under it, where it divides.
        0.5,
        2.0f32.powi(-20),
        1024.0,
        2.0f32.powi(-64),
        2.0f32.powi(64),
        2.0f32.powi(-90),
        f32::from_bits(0x0A7F_FFFF),
        // Significands whose reciprocals round badly (all ones, one past a power of two, 4/3).
        f32::from_bits(0x3FFF_FFFF),
        f32::from_bits(0x3C7F_FFFF),
        f32::from_bits(0x3F80_0001),
        f32::from_bits(0x3FAA_AAAB),
        3.0 / 1024.0,
        // amax / 448 of rows whose largest value is these bf16 or f16 values.
        f32::from_bits(0x4049_0000) / 448.0,
        f32::from_bits(0x3D4C_0000) / 448.0,
        f32::from_bits(0x3BFF_0000) / 448.0,
        f32::from_bits(0x4B7F_0000) / 448.0,
        65504.0 / 448.0,
        0.000_123_4 / 448.0,
    ];
    let mut x = 0x9E37_79B9u32;
    for _ in 0..spread {
        x = xorshift(x);
        k.push(f32::from_bits(
            (x & 0x807F_FFFF) | ((100 + (x >> 23) % 40) << 23),
        ));
    }
    k
}

/// `n` pseudo-random 16-bit patterns (every class of bf16 and f16 value turns up among 1000).
pub(crate) fn patterns_16(n: usize) -> Vec<u16> {
    let mut x = 0x2545_F491u32;
    (0..n)
        .map(|_| {
            x = xorshift(x);
            x as u16
        })
        .collect()
}

fn xorshift(mut x: u32) -> u32 {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x
}

/// Checks a kernel's amax of 16-bit floats (`amax(bytes, bf16)`, bf16 when true, else f16; the
/// f32 bits of the largest magnitude, NaNs left out, 0 when none) against the scalar
/// references, on patterns with every special value, at lengths around the vector widths and
/// from an odd start.
pub(crate) fn check_amax_16(amax: impl Fn(&[u8], bool) -> u32) {
    use crate::dtype::{bf16_bits_to_f32, f16_bits_to_f32};

    let mut pats = patterns_16(1000);
    pats.extend([
        0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x7F81, 0x7C00, 0x7C01, 0xFC01, 0x0001, 0x8000,
    ]);
    for bf16 in [true, false] {
        for len in [0, 1, 15, 16, 17, 100, pats.len()] {
            for start in [0, 5] {
                let v = &pats[start.min(len)..len.max(start.min(len))];
                let bytes: Vec<u8> = v.iter().flat_map(|h| h.to_le_bytes()).collect();
                let want = v
                    .iter()
                    .map(|&h| {
                        let x = if bf16 {
                            bf16_bits_to_f32(h)
                        } else {
                            f16_bits_to_f32(h)
                        };
                        if x.is_nan() {
                            0
                        } else {
                            x.to_bits() & 0x7FFF_FFFF
                        }
                    })
                    .max()
                    .unwrap_or(0);
                let what = if bf16 { "bf16" } else { "f16" };
                assert_eq!(amax(&bytes, bf16), want, "{what} len {len} start {start}");
            }
        }
    }
}

/// Every 16-bit pattern, then seven more so a kernel's tail sees some too, as little-endian
/// bytes: the source of the quantize tests.
pub(crate) fn every_pattern_16() -> Vec<u8> {
    (0..=u16::MAX)
        .chain(0x3C00..0x3C07)
        .flat_map(u16::to_le_bytes)
        .collect()
}

/// The scales every quantize test runs: ordinary ones, results far below the e4m3 subnormals
/// and into f32's, results that overflow f32 and saturate, and the invalid ones the reference
/// turns into NaN codes.
pub(crate) fn quantize_scales() -> Vec<f32> {
    vec![
        1.0f32,
        1.0 / 448.0,
        0.37,
        3.0,
        1.0e30,
        3.0e38,
        1.0e-30,
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        -0.5,
        0.0,
        f32::INFINITY,
    ]
}

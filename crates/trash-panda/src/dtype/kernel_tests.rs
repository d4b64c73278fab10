//! What the tests of the hand-written kernels share, on x86-64 and aarch64 alike: the scales they
//! run every code over, and the 16-bit patterns they quantize. One list, so a scale that caught a
//! bug on one architecture is tried on the other.

/// The special scales (signed zeros, infinities, NaNs, the edges of f32, products that fall
/// below 2^-126 for the smallest fp8 values), then `spread` pseudo-random finite scales, most in
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

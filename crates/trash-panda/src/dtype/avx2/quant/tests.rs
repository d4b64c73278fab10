//! The quantization kernels against the scalar references: every 16-bit pattern over many
//! scales, and the reciprocal quotient against the division on every significand pair that
//! decides it.

use super::*;
use crate::dtype::fp8::f32_bits_to_e4m3;
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
    crate::dtype::kernel_tests::check_amax_16(|bytes, bf16| {
        let half = if bf16 { Half::Bf16 } else { Half::F16 };
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        let got = unsafe { amax_bits_16::<false>(bytes, half) };
        // The prefetching loop (a whole tensor's pass) finds the same.
        // SAFETY: as above.
        let prefetched = unsafe { amax_bits_16::<true>(bytes, half) };
        assert_eq!(
            (prefetched.bits, prefetched.nan),
            (got.bits, got.nan),
            "{half:?}: with prefetches"
        );
        let nan = bytes
            .chunks_exact(2)
            .any(|s| value(half, u16::from_le_bytes([s[0], s[1]])).is_nan());
        assert_eq!(got.nan, nan, "{half:?}: whether a NaN is there");
        got.bits
    });
}

#[test]
fn quantize_16_equals_the_reference_on_every_pattern() {
    if !SimdLevel::Avx2.is_supported() {
        return;
    }
    let src = crate::dtype::kernel_tests::every_pattern_16();
    let mut ks = crate::dtype::kernel_tests::quantize_scales();
    // Positive finite scales as quantization makes them (amax / 448), over many binades.
    ks.extend(
        crate::dtype::avx2::test_scales()
            .into_iter()
            .filter(|k| k.is_finite() && *k > 0.0),
    );
    // Every pattern in an order that mixes the binades in each block: the bf16 table loop then
    // meets values in the subnormal binades in most blocks and computes them beside the table.
    let mixed: Vec<u8> = (0..=u16::MAX)
        .map(|j| j.wrapping_mul(40503))
        .flat_map(u16::to_le_bytes)
        .collect();
    for half in [Half::Bf16, Half::F16] {
        // Every pattern, and every one but the NaNs, which the caller says when it knows.
        let no_nans = |src: &[u8]| -> Vec<u8> {
            src.chunks_exact(2)
                .filter(|s| !value(half, u16::from_le_bytes([s[0], s[1]])).is_nan())
                .flatten()
                .copied()
                .collect()
        };
        let (src_no_nans, mixed_no_nans) = (no_nans(&src), no_nans(&mixed));
        let sources = [
            (&src, false),
            (&src_no_nans, true),
            (&mixed, false),
            (&mixed_no_nans, true),
        ];
        for (src, nan_free) in sources {
            for (j, &k) in ks.iter().enumerate() {
                check_every_pattern(src, half, k, j, nan_free);
            }
        }
    }
}

/// One scale's codes of `src` against the scalar reference, by the table (where it applies)
/// and by runs too short for it; `j` picks the stores, alignment and prefetch distance.
fn check_every_pattern(src: &[u8], half: Half, k: f32, j: usize, nan_free: bool) {
    // Alternate the stores and the output's alignment (the head before them).
    let stores = [Stores::Cached, Stores::Streaming][j % 2];
    let off = j % 5;
    let mut buf = vec![0u8; src.len() / 2 + 64];
    let got = &mut buf[off..off + src.len() / 2];
    // SAFETY: the CPU has AVX2, FMA and F16C (the caller checked).
    unsafe { Quantizer::new(half, stores, 64 * (j % 3)).divided(src, got, k, nan_free) };
    // Runs of 1000 values, too few for the bf16 table: the reciprocal loop does them.
    let mut small = vec![0u8; src.len() / 2];
    let mut q = Quantizer::new(half, Stores::Cached, 0);
    for (s, d) in src.chunks(2000).zip(small.chunks_mut(1000)) {
        // SAFETY: as above.
        unsafe { q.divided(s, d, k, nan_free) };
    }
    for ((s, g), g_small) in src.chunks_exact(2).zip(got.iter()).zip(small) {
        assert_eq!(
            *g,
            g_small,
            "{half:?} table or not, scale {k:e} {:#06x} nf {nan_free}",
            u16::from_le_bytes([s[0], s[1]])
        );
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
        assert_eq!(
            *g, want,
            "{half:?} {h:#06x} scale {k:e} nan_free {nan_free}"
        );
    }
}

/// Checks [`Reciprocal::quotient`] against the division for every 11-bit significand x (all
/// bf16 and f16 significands) in [1, 2) and every `step`-th 24-bit significand k in [1, 2),
/// plus the extreme ones. Both computations commute with powers of two as long as nothing
/// leaves f32's normal range, which the kernel's range of scales guarantees where the code
/// depends on the quotient (see the module comment), so this covers every value and scale.
fn quotients_equal_the_division(step: usize) {
    let xs: Vec<f32> = (0..1024u32)
        .map(|j| f32::from_bits(0x3F80_0000 | (j << 13)))
        .collect();
    let mantissas = (0..1u32 << 23)
        .step_by(step)
        .chain([1, 2, 0x7F_FFFF, 0x7F_FFFE, 0x40_0000, 0x3F_FFFF]);
    for km in mantissas {
        let k = f32::from_bits(0x3F80_0000 | km);
        let r = Reciprocal {
            k,
            y: 1.0 / k,
            bf16_limit: 0x7F7F,
            bf16_tiny: 0,
        };
        for x8 in xs.chunks_exact(8) {
            // SAFETY: the caller checked that the CPU has AVX2 and FMA; `x8` is 8 floats.
            let (got, want) = unsafe {
                let x = _mm256_loadu_ps(x8.as_ptr());
                (r.quotient(x), _mm256_div_ps(x, _mm256_set1_ps(k)))
            };
            let (mut g, mut w) = ([0f32; 8], [0f32; 8]);
            // SAFETY: each array is 32 bytes, the size of the unaligned stores.
            unsafe {
                _mm256_storeu_ps(g.as_mut_ptr(), got);
                _mm256_storeu_ps(w.as_mut_ptr(), want);
            }
            for j in 0..8 {
                assert_eq!(
                    g[j].to_bits(),
                    w[j].to_bits(),
                    "{} / {k:e} ({km:#x})",
                    x8[j]
                );
            }
        }
    }
}

#[test]
fn reciprocal_quotients_equal_the_division() {
    if !SimdLevel::Avx2.is_supported() {
        return;
    }
    quotients_equal_the_division(997);
}

#[test]
#[ignore = "2^33 quotients: run with --release --ignored (about a minute)"]
fn reciprocal_quotients_equal_the_division_exhaustively() {
    if !SimdLevel::Avx2.is_supported() {
        return;
    }
    quotients_equal_the_division(1);
}

/// The table's build declines it when its model fails, which keeps the output exact but would
/// hide a broken build behind the reciprocal loop: check that every scale a real tensor has
/// gets one.
#[test]
fn the_bf16_table_is_built_for_every_ordinary_scale() {
    if !SimdLevel::Avx2.is_supported() {
        return;
    }
    let ordinary = |k: &f32| (2.0f32.powi(-100)..=2.0f32.powi(100)).contains(k);
    for k in crate::dtype::avx2::test_scales()
        .iter()
        .filter(|k| ordinary(k))
    {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        let t = unsafe { super::table::Bf16Table::new(*k) };
        assert!(t.is_some(), "scale {k:e}");
    }
}

/// As for bf16: every scale an f16 tensor can have (its amax is at most 65504) gets its table.
#[test]
fn the_f16_table_is_built_for_every_ordinary_scale() {
    if !SimdLevel::Avx2.is_supported() {
        return;
    }
    let ordinary = |k: &f32| (2.0f32.powi(-100)..=65504.0 / 448.0).contains(k);
    for k in crate::dtype::avx2::test_scales()
        .iter()
        .chain(&crate::dtype::kernel_tests::quantize_scales())
        .filter(|k| ordinary(k))
    {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        let t = unsafe { super::table16::F16Table::new(*k) };
        assert!(t.is_some(), "scale {k:e}");
    }
}

/// The loops compute the codes of the binades under their table's by one product only with a
/// multiplier that [`lanes::Lanes::new`] found to give every code by looking at a few patterns
/// near each code's edge: check its answer against every pattern of those binades, for every
/// scale of a bf16 amax from 2^-40 to 2^40 and a sample of f16 ones (where it declines, none
/// of the three multipliers it tries may give every code), and that both answers are common.
#[test]
fn one_product_is_taken_exactly_where_it_gives_every_code() {
    use super::lanes::Lanes;
    use super::table::{Bf16Table, Table};
    use super::table16::F16Table;
    if !SimdLevel::Avx2.is_supported() {
        return;
    }
    let every = |half: Half, r: Reciprocal, m: f32, lanes: core::ops::RangeInclusive<i32>| {
        let k = r.k * 512.0;
        lanes.into_iter().all(|p| {
            let x = f32::from_bits(half.widen(p as u16));
            // SAFETY: the CPU has AVX2 and FMA (checked below, before any call).
            let product = unsafe { super::lanes::rounded_product(x, m) };
            product == u32::from(f32_bits_to_e4m3((x / k).to_bits()))
        })
    };
    // Scales within two ulps of putting a value of `half` at each half-integer: the near ties
    // where the check must find the right patterns.
    let near_ties = |half: Half, values: core::ops::Range<u16>| -> Vec<f32> {
        let mut ks = Vec::new();
        for x in values.step_by(9).map(|p| f32::from_bits(half.widen(p))) {
            for h in (0..16u8).map(|n| f32::from(n) + 0.5) {
                let k = (512.0 * x / h).to_bits();
                ks.extend((k - 2..=k + 2).map(f32::from_bits));
            }
        }
        ks
    };
    // Quantization's scales, a bf16 amax's from 2^-40 to 2^40 and a sample of f16 ones, and
    // the near ties.
    let bf16: Vec<f32> = (87u32 << 7..168 << 7)
        .map(|a| f32::from_bits(a << 16) / 448.0)
        .chain(near_ties(Half::Bf16, 0x3F80..0x4000))
        .collect();
    let f16: Vec<f32> = (0x0001u16..0x7C00)
        .step_by(97)
        .map(|a| f32::from_bits(Half::F16.widen(a)) / 448.0)
        .chain(near_ties(Half::F16, 0x3C00..0x4000))
        .collect();
    let mut seen = [[0usize; 2]; 2];
    for (half, ks) in [(Half::Bf16, bf16), (Half::F16, f16)] {
        for k in ks {
            let Some(r) = Reciprocal::new(k) else {
                continue;
            };
            // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
            let (lanes, patterns) = unsafe {
                match half {
                    Half::Bf16 => match Bf16Table::new(k) {
                        Some(t) => (t.lanes(r), t.lane_patterns()),
                        None => continue,
                    },
                    // Where a quotient under the table's binade reaches 2^-5 the loop computes
                    // no codes (the every-pattern test covers that).
                    Half::F16 => match F16Table::new(k) {
                        Some(t) if t.small_below => (t.lanes(r), t.lane_patterns()),
                        _ => continue,
                    },
                }
            };
            let product = match lanes {
                Some(Lanes::Product(m)) => {
                    assert!(every(half, r, m, patterns), "{half:?} scale {k:e} by {m:e}");
                    true
                }
                Some(Lanes::Quotient) => {
                    let y = r.y.to_bits();
                    for m in [y, y + 1, y - 1].map(f32::from_bits) {
                        let gives = every(half, r, m, patterns.clone());
                        assert!(!gives, "{half:?} scale {k:e}: {m:e} gives every code");
                    }
                    false
                }
                None => panic!("{half:?} scale {k:e}: no lanes"),
            };
            seen[usize::from(half == Half::F16)][usize::from(product)] += 1;
        }
    }
    for (half, [quotient, product]) in ["bf16", "f16"].iter().zip(seen) {
        assert!(
            quotient > 0 && product > quotient,
            "{half}: {quotient} by the quotient, {product} by one product"
        );
    }
}

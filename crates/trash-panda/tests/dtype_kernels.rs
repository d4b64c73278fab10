//! The conversion kernels against the scalar reference codecs, and the reference codecs against
//! the format definitions and the `half` crate.

use half::{bf16, f16};
mod common;
use common::on_every_level;
use trash_panda::dtype::{
    bf16_bits_to_f32, cast, expand, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits,
    f32_to_fp8_e4m3fn, fp8_e4m3fn_to_f32, fp8_e5m2_to_f32, DType, Scale,
};

const WIDE: [DType; 4] = [DType::F64, DType::F32, DType::F16, DType::BF16];
const SOURCES: [DType; 6] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8E4M3,
    DType::F8E5M2,
];

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// One element of `t` at index `i` of `b`, decoded exactly (f64 kept as f64).
fn ref_value(b: &[u8], t: DType, i: usize) -> f64 {
    let s = &b[i * t.size()..(i + 1) * t.size()];
    match t {
        DType::F8E4M3 => f64::from(fp8_e4m3fn_to_f32(s[0])),
        DType::F8E5M2 => f64::from(fp8_e5m2_to_f32(s[0])),
        DType::BF16 => f64::from(bf16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]))),
        DType::F16 => f64::from(f16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]))),
        DType::F32 => f64::from(f32::from_le_bytes([s[0], s[1], s[2], s[3]])),
        DType::F64 => f64::from_le_bytes(s.try_into().unwrap()),
        _ => unreachable!(),
    }
}

/// Decoder, encoder, infinity code and the magnitude that rounds to infinity.
type Codec = (fn(u16) -> f32, fn(f32) -> u16, u16, f64);

/// The scale of element `i`, if any.
type ScaleOf<'a> = Box<dyn Fn(usize) -> Option<f32> + 'a>;

/// An f64 rounded once to bf16 or f16 bits, by brute force: the nearest of the three codes around
/// the f32 rounding, ties to the even code. (`half`'s `bf16::from_f64` rounds through f32, twice.)
fn ref_f64_to_16(v: f64, bf: bool) -> u16 {
    let (dec, enc, inf, inf_at): Codec = if bf {
        (
            bf16_bits_to_f32,
            f32_to_bf16_bits,
            0x7F80,
            (2.0 - 2f64.powi(-8)) * 2f64.powi(127),
        )
    } else {
        (f16_bits_to_f32, f32_to_f16_bits, 0x7C00, 65520.0)
    };
    let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
    let a = v.abs();
    if a >= inf_at {
        return sign | inf;
    }
    let m = enc(a as f32).min(inf - 1);
    let mut best = m;
    for c in [m.saturating_sub(1), m + 1] {
        if c >= inf {
            continue;
        }
        let (dc, db) = (
            (f64::from(dec(c)) - a).abs(),
            (f64::from(dec(best)) - a).abs(),
        );
        if dc < db || (dc == db && c & 1 == 0) {
            best = c;
        }
    }
    sign | best
}

/// The bytes of `v` in `t`, rounded once.
fn ref_encode(v: f64, from_f64: bool, t: DType) -> Vec<u8> {
    let f = v as f32;
    match t {
        DType::F64 => v.to_le_bytes().to_vec(),
        DType::F32 => f.to_le_bytes().to_vec(),
        DType::BF16 if from_f64 && !v.is_nan() => ref_f64_to_16(v, true).to_le_bytes().to_vec(),
        DType::F16 if from_f64 && !v.is_nan() => ref_f64_to_16(v, false).to_le_bytes().to_vec(),
        DType::BF16 => f32_to_bf16_bits(f).to_le_bytes().to_vec(),
        DType::F16 => f32_to_f16_bits(f).to_le_bytes().to_vec(),
        _ => unreachable!(),
    }
}

/// Element-wise comparison that names the first difference; NaN must meet NaN.
fn assert_same(got: &[u8], want: &[u8], t: DType, ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: lengths");
    for (i, (g, w)) in got.chunks(t.size()).zip(want.chunks(t.size())).enumerate() {
        if g != w {
            let gv = ref_value(g, t, 0);
            let wv = ref_value(w, t, 0);
            assert!(
                gv.is_nan() && wv.is_nan(),
                "{ctx}: element {i}: got {g:02x?} ({gv}), want {w:02x?} ({wv})"
            );
        }
    }
}

/// The reference conversion of a whole buffer.
fn ref_convert(src: &[u8], st: DType, dt: DType, scale: impl Fn(usize) -> Option<f32>) -> Vec<u8> {
    let n = src.len() / st.size();
    let mut out = Vec::with_capacity(n * dt.size());
    for i in 0..n {
        let v = ref_value(src, st, i);
        match scale(i) {
            // The torch reference: to f32 (one rounding for f64), times the scale in f32.
            Some(k) => out.extend(ref_encode(f64::from((v as f32) * k), false, dt)),
            None => out.extend(ref_encode(v, st == DType::F64, dt)),
        }
    }
    out
}

#[test]
fn fp8_decoders_follow_the_definitions() {
    for code in 0..=255u8 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = (i32::from((code >> 3) & 15), f64::from(code & 7));
        let want = if e == 0 {
            m / 8.0 * 2f64.powi(-6)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - 7)
        };
        let got = fp8_e4m3fn_to_f32(code);
        if code & 0x7F == 0x7F {
            assert!(got.is_nan());
            assert_eq!(
                got.to_bits() & 0x7FFF_FFFF,
                0x7FF0_0000,
                "torch's NaN pattern"
            );
        } else {
            assert_eq!(f64::from(got), sign * want, "e4m3 {code:#04x}");
        }
        let (e, m) = (i32::from((code >> 2) & 31), f64::from(code & 3));
        let got = fp8_e5m2_to_f32(code);
        match e {
            31 if m == 0.0 => assert_eq!(f64::from(got), sign * f64::INFINITY),
            31 => assert!(got.is_nan() && got.to_bits() & 0x40_0000 != 0, "quiet NaN"),
            0 => assert_eq!(f64::from(got), sign * m / 4.0 * 2f64.powi(-14)),
            _ => assert_eq!(f64::from(got), sign * (1.0 + m / 4.0) * 2f64.powi(e - 15)),
        }
    }
    assert_eq!(fp8_e4m3fn_to_f32(0x7E), 448.0);
    assert_eq!(fp8_e5m2_to_f32(0x7B), 57344.0);
}

#[test]
fn every_fp8_code_to_every_destination() {
    on_every_level(|| {
        let codes: Vec<u8> = (0..=255).collect();
        for st in [DType::F8E4M3, DType::F8E5M2] {
            for dt in WIDE {
                let want = ref_convert(&codes, st, dt, |_| None);
                let mut got = vec![0u8; 256 * dt.size()];
                cast(&codes, st, &mut got, dt, 1).unwrap();
                assert_same(&got, &want, dt, &format!("cast {st}->{dt}"));
                if dt != DType::F64 {
                    let mut got2 = vec![0u8; 256 * dt.size()];
                    expand(&codes, st, &mut got2, dt, (1, 256), &Scale::None, 1).unwrap();
                    assert_eq!(got, got2, "expand {st}->{dt} with no scale equals cast");
                }
            }
        }
        // The fp8 -> bf16 NaN is the canonical quiet NaN with the sign kept.
        let mut out = [0u8; 4];
        expand(
            &[0x7F, 0xFF],
            DType::F8E4M3,
            &mut out,
            DType::BF16,
            (1, 2),
            &Scale::None,
            1,
        )
        .unwrap();
        assert_eq!(out, [0xC0, 0x7F, 0xC0, 0xFF]);
    });
}

#[test]
fn every_16_bit_code_to_f32_and_back() {
    on_every_level(|| {
        let codes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        for t in [DType::BF16, DType::F16] {
            for h in 0..=u16::MAX {
                let (v, want) = match t {
                    DType::BF16 => (bf16_bits_to_f32(h), bf16::from_bits(h).to_f32()),
                    _ => (f16_bits_to_f32(h), f16::from_bits(h).to_f32()),
                };
                let back = match t {
                    DType::BF16 => f32_to_bf16_bits(v),
                    _ => f32_to_f16_bits(v),
                };
                if want.is_nan() {
                    assert!(v.is_nan());
                    assert_eq!(
                        v.is_sign_negative(),
                        h & 0x8000 != 0,
                        "NaN sign of {h:#06x}"
                    );
                    let want_back = match t {
                        DType::F16 => h | 0x0200,
                        _ => (h & 0x8000) | 0x7FC0,
                    };
                    assert_eq!(back, want_back, "{t} NaN {h:#06x} round trip (quieted)");
                } else {
                    assert_eq!(v.to_bits(), want.to_bits(), "{t} {h:#06x}");
                    assert_eq!(back, h, "{t} {h:#06x} round trip");
                }
            }
            let mut wide = vec![0u8; codes.len() * 2];
            cast(&codes, t, &mut wide, DType::F32, 1).unwrap();
            assert_same(
                &wide,
                &ref_convert(&codes, t, DType::F32, |_| None),
                DType::F32,
                "to f32",
            );
            let mut narrow = vec![0u8; codes.len()];
            cast(&wide, DType::F32, &mut narrow, t, 1).unwrap();
            assert_same(
                &narrow,
                &ref_convert(&wide, DType::F32, t, |_| None),
                t,
                "back",
            );
        }
    });
}

#[test]
fn f32_rounding_edge_cases() {
    on_every_level(|| {
        let b = |x: f32| f32_to_bf16_bits(x);
        let h = |x: f32| f32_to_f16_bits(x);
        let f = f32::from_bits;
        // bf16 ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1); the next tie up -> odd+1.
        assert_eq!(b(f(0x3F80_8000)), 0x3F80);
        assert_eq!(b(f(0x3F81_8000)), 0x3F82);
        assert_eq!(b(f(0x3F80_8001)), 0x3F81);
        assert_eq!(b(f32::MAX), 0x7F80, "max f32 rounds up to infinity in bf16");
        assert_eq!(b(f(0x7F7F_7FFF)), 0x7F7F, "largest value that stays finite");
        assert_eq!(b(f32::NEG_INFINITY), 0xFF80);
        assert_eq!(b(f(0x0000_8000)), 0x0000, "subnormal tie to even zero");
        assert_eq!(b(f(0x0001_8000)), 0x0002);
        assert_eq!(b(f(0x8000_0001)), 0x8000, "negative tiny -> -0");
        assert_eq!(b(f32::NAN), 0x7FC0);
        assert_eq!(
            b(f(0xFF80_0001)),
            0xFFC0,
            "signalling NaN -> quiet, sign kept"
        );
        assert_eq!(
            b(f(0x7FFF_FFFF)),
            0x7FC0,
            "a payload never rounds into infinity or the sign"
        );
        // f16: max finite, the overflow threshold, subnormal boundaries, ties.
        assert_eq!(h(65504.0), 0x7BFF);
        assert_eq!(h(65519.99), 0x7BFF);
        assert_eq!(h(65520.0), 0x7C00);
        assert_eq!(h(-1e10), 0xFC00);
        assert_eq!(h(2f32.powi(-14)), 0x0400, "smallest normal");
        assert_eq!(h(2f32.powi(-24)), 0x0001, "smallest subnormal");
        assert_eq!(
            h(2f32.powi(-25)),
            0x0000,
            "half the smallest subnormal ties to zero"
        );
        assert_eq!(h(f(0x3300_0001)), 0x0001, "just above the tie rounds up");
        assert_eq!(h(3.0 * 2f32.powi(-25)), 0x0002, "1.5 steps ties to 2");
        assert_eq!(
            h(2f32.powi(-14) - 2f32.powi(-25)),
            0x0400,
            "rounds up into the normals"
        );
        assert_eq!(h(1.0 + 2f32.powi(-11)), 0x3C00, "tie to even");
        assert_eq!(h(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
        assert_eq!(h(f32::from_bits(1)), 0x0000, "f32 subnormal");
        assert_eq!(h(f(0x7FC0_0000)), 0x7E00);
        assert_eq!(
            h(f(0xFFA0_0000)),
            0xFF00,
            "payload's upper bits kept, quieted (as torch)"
        );
        assert_eq!(h(f(0x7F80_0001)), 0x7E00);
    });
}

#[test]
fn random_f32_patterns_match_half() {
    on_every_level(|| {
        let bytes = random_bytes(4 * 300_000, 11);
        let mut want_b = Vec::new();
        let mut want_h = Vec::new();
        for c in bytes.chunks(4) {
            let x = f32::from_le_bytes(c.try_into().unwrap());
            let (rb, rh) = (f32_to_bf16_bits(x), f32_to_f16_bits(x));
            if x.is_nan() {
                assert!(bf16::from_bits(rb).is_nan() && f16::from_bits(rh).is_nan());
            } else {
                assert_eq!(
                    rb,
                    bf16::from_f32(x).to_bits(),
                    "bf16 of {:#010x}",
                    x.to_bits()
                );
                assert_eq!(
                    rh,
                    f16::from_f32(x).to_bits(),
                    "f16 of {:#010x}",
                    x.to_bits()
                );
            }
            want_b.extend(rb.to_le_bytes());
            want_h.extend(rh.to_le_bytes());
        }
        let mut got = vec![0u8; bytes.len() / 2];
        cast(&bytes, DType::F32, &mut got, DType::BF16, 1).unwrap();
        assert_eq!(got, want_b);
        cast(&bytes, DType::F32, &mut got, DType::F16, 1).unwrap();
        assert_eq!(got, want_h);
    });
}

#[test]
fn every_pair_threads_and_alignment_match_the_reference() {
    on_every_level(|| {
        // Over a million elements so the threaded split runs; offsets make every slice unaligned.
        let n = (1 << 20) + 333;
        for st in SOURCES {
            let raw = random_bytes(n * st.size() + 1, st.size() as u64 + 5);
            let src = &raw[1..];
            for dt in WIDE {
                let want = ref_convert(src, st, dt, |_| None);
                for threads in [1, 3] {
                    let mut out = vec![0u8; n * dt.size() + 1];
                    cast(src, st, &mut out[1..], dt, threads).unwrap();
                    assert_same(
                        &out[1..],
                        &want,
                        dt,
                        &format!("{st}->{dt} threads {threads}"),
                    );
                }
            }
        }
    });
}

#[test]
fn scaled_expansion_matches_the_formula() {
    on_every_level(|| {
        let (rows, cols): (usize, usize) = (300, 200);
        let n = rows * cols;
        let row_scales: Vec<f32> = (0..rows).map(|r| 0.5 + r as f32 * 0.013).collect();
        let tiles_c = cols.div_ceil(128);
        let block_scales: Vec<f32> = (0..rows.div_ceil(128) * tiles_c)
            .map(|i| 1.7f32.powi(i as i32 - 2))
            .collect();
        for st in SOURCES {
            let raw = random_bytes(n * st.size() + 1, 99);
            let src = &raw[1..];
            for dt in [DType::BF16, DType::F16, DType::F32] {
                let cases: [(Scale, ScaleOf); 3] = [
                    (Scale::PerTensor(3.0e-3), Box::new(|_| Some(3.0e-3))),
                    (
                        Scale::PerRow(&row_scales),
                        Box::new(|i| Some(row_scales[i / cols])),
                    ),
                    (
                        Scale::Block {
                            scales: &block_scales,
                            block: 128,
                        },
                        Box::new(|i| {
                            Some(block_scales[(i / cols) / 128 * tiles_c + (i % cols) / 128])
                        }),
                    ),
                ];
                for (scale, f) in &cases {
                    let want = ref_convert(src, st, dt, f);
                    let mut out = vec![0u8; n * dt.size() + 1];
                    expand(src, st, &mut out[1..], dt, (rows, cols), scale, 2).unwrap();
                    assert_same(&out[1..], &want, dt, &format!("{st}->{dt} {scale:?}"));
                }
            }
        }
    });
}

#[test]
fn scaled_expansion_threads_split_on_rows() {
    on_every_level(|| {
        let (rows, cols): (usize, usize) = (1030, 1100);
        let n = rows * cols;
        let src = random_bytes(n, 5);
        let row_scales: Vec<f32> = (0..rows).map(|r| 1.0 + r as f32).collect();
        let tiles_c = cols.div_ceil(128);
        let block_scales: Vec<f32> = (0..rows.div_ceil(128) * tiles_c)
            .map(|i| i as f32 * 0.25)
            .collect();
        for scale in [
            Scale::PerRow(&row_scales),
            Scale::Block {
                scales: &block_scales,
                block: 128,
            },
            Scale::PerTensor(0.75),
        ] {
            let mut one = vec![0u8; n * 2];
            expand(
                &src,
                DType::F8E4M3,
                &mut one,
                DType::BF16,
                (rows, cols),
                &scale,
                1,
            )
            .unwrap();
            for threads in [0, 2, 5] {
                let mut many = vec![0u8; n * 2];
                expand(
                    &src,
                    DType::F8E4M3,
                    &mut many,
                    DType::BF16,
                    (rows, cols),
                    &scale,
                    threads,
                )
                .unwrap();
                assert!(one == many, "threads {threads} {scale:?}");
            }
            let want = ref_convert(&src, DType::F8E4M3, DType::BF16, |i| {
                Some(match scale {
                    Scale::PerRow(s) => s[i / cols],
                    Scale::Block { scales, .. } => {
                        scales[(i / cols) / 128 * tiles_c + (i % cols) / 128]
                    }
                    Scale::PerTensor(k) => k,
                    Scale::None => 1.0,
                })
            });
            assert_same(&one, &want, DType::BF16, "threaded scaled");
        }
    });
}

#[test]
fn reference_fp8_encoder_is_nearest_even_and_saturates() {
    for code in 0..=255u8 {
        let v = fp8_e4m3fn_to_f32(code);
        if !v.is_nan() {
            assert_eq!(f32_to_fp8_e4m3fn(v), code, "{code:#04x} round trip");
        }
    }
    let finite: Vec<f32> = (0..=255u8)
        .map(fp8_e4m3fn_to_f32)
        .filter(|v| !v.is_nan())
        .collect();
    let raw = random_bytes(4 * 20_000, 3);
    for c in raw.chunks(4) {
        // Values spread over the fp8 range: random mantissa, exponent in [-12, 9].
        let bits = u32::from_le_bytes(c.try_into().unwrap());
        let x = f32::from_bits((bits & 0x807F_FFFF) | ((115 + (bits >> 23) % 22) << 23));
        let q = fp8_e4m3fn_to_f32(f32_to_fp8_e4m3fn(x));
        if x.abs() >= 448.0 {
            assert_eq!(q, 448f32.copysign(x), "saturates");
            continue;
        }
        let best = finite
            .iter()
            .map(|c| (c - x).abs())
            .fold(f32::INFINITY, f32::min);
        assert_eq!((q - x).abs(), best, "nearest for {x:e}");
    }
    // Ties go to the even code: 0.5 step between subnormals 1 and 2 (x = 1.5 * 2^-9) -> 2.
    assert_eq!(f32_to_fp8_e4m3fn(1.5 * 2f32.powi(-9)), 0x02);
    assert_eq!(f32_to_fp8_e4m3fn(2.5 * 2f32.powi(-9)), 0x02);
    assert_eq!(f32_to_fp8_e4m3fn(2f32.powi(-10)), 0x00);
    assert_eq!(f32_to_fp8_e4m3fn(-2f32.powi(-10)), 0x80);
    assert_eq!(f32_to_fp8_e4m3fn(464.0), 0x7E);
    assert_eq!(f32_to_fp8_e4m3fn(f32::INFINITY), 0x7E);
    assert_eq!(f32_to_fp8_e4m3fn(f32::NEG_INFINITY), 0xFE);
    assert_eq!(f32_to_fp8_e4m3fn(f32::NAN), 0x7F);
    assert_eq!(f32_to_fp8_e4m3fn(-f32::NAN), 0xFF);
    assert_eq!(f32_to_fp8_e4m3fn(1.0 + 1.0 / 16.0), 0x38, "tie to even");
    assert_eq!(f32_to_fp8_e4m3fn(1.0 + 3.0 / 16.0), 0x3A);
}

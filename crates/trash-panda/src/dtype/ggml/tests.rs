use super::reference::{dequantize_reference, scale_fields};
use super::*;
use crate::dtype::half::{f32_to_bf16_bits, f32_to_f16_bits};
use crate::dtype::level::{supported_simd_levels, with_simd_level};
use crate::dtype::BLOCK_DTYPES;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The f16 scales tried: zero, subnormals, the largest finite, both signs, ordinary values.
const SCALES: [u16; 8] = [
    0x0000, 0x0001, 0x03FF, 0x7BFF, 0x8000, 0x3C00, 0xB555, 0x2E66,
];

/// `blocks` random blocks of `t`, with their f16 scales drawn from [`SCALES`] or at random
/// (finite).
fn random_blocks(t: DType, blocks: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut out: Vec<u8> = (0..blocks * t.size()).map(|_| rng.next() as u8).collect();
    for b in out.chunks_exact_mut(t.size()) {
        for &at in scale_fields(t) {
            let r = rng.next();
            let mut h = if r.is_multiple_of(3) {
                SCALES[(r >> 8) as usize % SCALES.len()]
            } else {
                (r >> 16) as u16
            };
            if h & 0x7C00 == 0x7C00 {
                h &= 0xBBFF; // no infinities or NaNs: their bits are not a reference's business
            }
            b[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    out
}

fn run(t: DType, src: &[u8], dt: DType, threads: usize) -> Vec<u8> {
    let n = src.len() / t.size() * t.block_elems();
    let mut out = vec![0u8; n * dt.size() + 1];
    // Odd offsets: the kernels take unaligned slices.
    dequantize(src, t, &mut out[1..], dt, threads).unwrap();
    out.remove(0);
    out
}

fn expected(reference: &[f32], dt: DType) -> Vec<u8> {
    let mut out = Vec::new();
    for x in reference {
        match dt {
            DType::BF16 => out.extend(f32_to_bf16_bits(*x).to_le_bytes()),
            DType::F16 => out.extend(f32_to_f16_bits(*x).to_le_bytes()),
            _ => out.extend(x.to_le_bytes()),
        }
    }
    out
}

#[test]
fn every_level_gives_the_reference_bits() {
    for (k, t) in BLOCK_DTYPES.into_iter().enumerate() {
        let src = random_blocks(t, 37, 0x9E37_79B9 + k as u64);
        let reference = dequantize_reference(&src, t).unwrap();
        for dt in [DType::F32, DType::BF16, DType::F16] {
            let want = expected(&reference, dt);
            for level in supported_simd_levels() {
                let got = with_simd_level(level, || run(t, &src, dt, 1)).unwrap();
                let bad = got
                    .chunks(dt.size())
                    .zip(want.chunks(dt.size()))
                    .position(|(g, w)| g != w);
                assert!(
                    bad.is_none(),
                    "{t} -> {dt} at {level}: element {bad:?} differs"
                );
            }
        }
    }
}

#[test]
fn threads_split_on_blocks() {
    for t in [DType::Q8_0, DType::Q4K, DType::Q6K] {
        let blocks = (1 << 21) / t.block_elems() + 3;
        let src = random_blocks(t, blocks, 77);
        assert_eq!(
            run(t, &src, DType::BF16, 2),
            run(t, &src, DType::BF16, 1),
            "{t}"
        );
    }
}

#[test]
fn known_values() {
    // Q8_0: d = 0.5, codes -128, -1, 0, 127.
    let mut b = vec![0u8; 34];
    b[..2].copy_from_slice(&0x3800u16.to_le_bytes());
    b[2..6].copy_from_slice(&[0x80, 0xFF, 0x00, 0x7F]);
    let r = dequantize_reference(&b, DType::Q8_0).unwrap();
    assert_eq!(&r[..4], &[-64.0, -0.5, 0.0, 63.5]);
    // Q4_0: d = 2, first byte 0xF0: element 0 = (0 - 8) * 2, element 16 = (15 - 8) * 2.
    let mut b = vec![0u8; 18];
    b[..2].copy_from_slice(&0x4000u16.to_le_bytes());
    b[2] = 0xF0;
    let r = dequantize_reference(&b, DType::Q4_0).unwrap();
    assert_eq!((r[0], r[16], r[1]), (-16.0, 14.0, -16.0));
    // Q4_K: d = 1, dmin = 1, group 0 scale 3 and min 2, code 5 at element 0: 3 * 5 - 2.
    let mut b = vec![0u8; 144];
    b[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
    b[2..4].copy_from_slice(&0x3C00u16.to_le_bytes());
    b[4] = 3;
    b[8] = 2;
    b[16] = 0x05;
    let r = dequantize_reference(&b, DType::Q4K).unwrap();
    assert_eq!(r[0], 13.0);
}

#[test]
fn bad_arguments_are_errors() {
    let mut out = vec![0u8; 64];
    let e = dequantize(&[0u8; 35], DType::Q8_0, &mut out, DType::BF16, 1).unwrap_err();
    assert!(e.to_string().contains("35 bytes"), "{e}");
    let e = dequantize(&[0u8; 34], DType::Q8_0, &mut out[..63], DType::BF16, 1).unwrap_err();
    assert!(e.to_string().contains("63"), "{e}");
    let e = dequantize(&[0u8; 34], DType::BF16, &mut out, DType::BF16, 1).unwrap_err();
    assert!(e.to_string().contains("GGML block type"), "{e}");
    let e = dequantize(&[0u8; 34], DType::Q8_0, &mut out, DType::F8E4M3, 1).unwrap_err();
    assert!(e.to_string().contains("destination"), "{e}");
    let e = crate::dtype::expand(
        &[0u8; 34],
        DType::Q8_0,
        &mut out,
        DType::BF16,
        (1, 33),
        &crate::dtype::Scale::None,
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("whole number of q8_0 blocks"), "{e}");
}

#[test]
fn q8_0_quantization_round_trips_its_grid() {
    // Weights already on a block's grid come back exactly.
    let d = 0.25f32;
    let w: Vec<f32> = (0..64)
        .map(|i| ((i * 37) % 255) as f32 - 127.0)
        .map(|q| q * d)
        .collect();
    let src: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    for level in supported_simd_levels() {
        let mut q = vec![0u8; 68];
        with_simd_level(level, || {
            quantize_q8_0(&src, DType::F32, &mut q, 1).unwrap()
        })
        .unwrap();
        assert_eq!(dequantize_reference(&q, DType::Q8_0).unwrap(), w, "{level}");
    }
    let mut q = vec![0u8; 34];
    let e = quantize_q8_0(&[0u8; 60], DType::F16, &mut q, 1).unwrap_err();
    assert!(e.to_string().contains("whole blocks"), "{e}");
}

/// Random f32 weights with exact halves and ties after scaling sprinkled in.
fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed | 1);
    (0..n)
        .map(|i| {
            let r = rng.next();
            match i % 7 {
                0 => ((r % 255) as f32 - 127.0) * 0.5,
                1 => 0.0,
                _ => ((r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * 3.0,
            }
        })
        .collect()
}

#[test]
fn q8_0_quantization_equals_the_formula_at_every_level() {
    let w = weights(32 * 200, 5);
    let src: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut want = Vec::new();
    for b in w.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        want.extend(f32_to_f16_bits(d).to_le_bytes());
        want.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
    }
    for level in supported_simd_levels() {
        let mut q = vec![0u8; want.len()];
        with_simd_level(level, || {
            quantize_q8_0(&src, DType::F32, &mut q, 1).unwrap()
        })
        .unwrap();
        assert!(q == want, "{level}");
    }
}

#[test]
fn int8_quantization_equals_the_formula_at_every_level() {
    use crate::dtype::quantize_int8;
    let (rows, cols) = (37, 300);
    let mut w = weights(rows * cols, 9);
    w[cols..2 * cols].fill(0.0); // an all-zero row: scale 1
    w[5] = f32::NAN;
    let src: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let (mut want_q, mut want_k) = (Vec::new(), Vec::new());
    for r in w.chunks(cols) {
        let amax = r
            .iter()
            .filter(|v| !v.is_nan())
            .fold(0f32, |m, v| m.max(v.abs()));
        let k = amax / 127.0;
        let k = if k > 0.0 && k.is_finite() { k } else { 1.0 };
        want_k.push(k);
        want_q.extend(r.iter().map(|v| {
            if v.is_nan() {
                0
            } else {
                (v / k).round_ties_even().clamp(-127.0, 127.0) as i8 as u8
            }
        }));
    }
    for level in supported_simd_levels() {
        let (mut q, mut k) = (vec![0u8; rows * cols], vec![0f32; rows]);
        with_simd_level(level, || {
            quantize_int8(&src, DType::F32, (rows, cols), &mut q, &mut k, 1).unwrap()
        })
        .unwrap();
        assert!(q == want_q && k == want_k, "{level}");
    }
}

#[test]
fn non_finite_scales_agree_across_levels() {
    for t in BLOCK_DTYPES {
        let mut src = random_blocks(t, 9, 3);
        for (i, b) in src.chunks_exact_mut(t.size()).enumerate() {
            let at = scale_fields(t)[i % scale_fields(t).len()];
            let h: u16 = [0x7C00, 0xFC00, 0x7E01, 0xFD00][i % 4];
            b[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
        for dt in [DType::BF16, DType::F16, DType::F32] {
            let portable =
                with_simd_level(crate::dtype::SimdLevel::Portable, || run(t, &src, dt, 1)).unwrap();
            for level in supported_simd_levels() {
                let got = with_simd_level(level, || run(t, &src, dt, 1)).unwrap();
                assert!(got == portable, "{t} -> {dt} at {level}");
            }
        }
    }
}

#[test]
fn reordered_rows_are_the_plain_expansions_rows() {
    use crate::dtype::{expand, expand_reordered, Scale};
    let (rows, cols) = (12usize, 512usize);
    let order: Vec<u32> = [3u32, 0, 11, 4, 4, 7].to_vec();
    let cases: Vec<(DType, Vec<u8>, Vec<f32>)> = vec![
        (DType::Q4K, random_blocks(DType::Q4K, rows * 2, 5), vec![]),
        (
            DType::Q8_0,
            random_blocks(DType::Q8_0, rows * 16, 6),
            vec![],
        ),
        (
            DType::F8E4M3,
            (0..rows * cols).map(|i| (i * 37 % 119) as u8).collect(),
            (0..rows).map(|i| 0.5 + i as f32).collect(),
        ),
    ];
    for (t, src, k) in cases {
        let scale = if k.is_empty() {
            Scale::None
        } else {
            Scale::PerRow(&k)
        };
        let mut plain = vec![0u8; rows * cols * 2];
        expand(&src, t, &mut plain, DType::BF16, (rows, cols), &scale, 1).unwrap();
        let mut got = vec![0u8; order.len() * cols * 2];
        expand_reordered(
            &src,
            t,
            &mut got,
            DType::BF16,
            (rows, cols),
            &scale,
            Some(&order),
            2,
        )
        .unwrap();
        for (r, &s) in order.iter().enumerate() {
            let want = &plain[s as usize * cols * 2..][..cols * 2];
            assert!(&got[r * cols * 2..][..cols * 2] == want, "{t} row {r}");
        }
    }
    let mut out = vec![0u8; cols * 2];
    let src = random_blocks(DType::Q8_0, rows * 16, 6);
    let e = expand_reordered(
        &src,
        DType::Q8_0,
        &mut out,
        DType::BF16,
        (rows, cols),
        &Scale::None,
        Some(&[12]),
        1,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("row 12 of a tensor of 12 rows"),
        "{e}"
    );
}

//! fp8 quantization round trips, and every error path of the dtype kernels.

mod common;
use common::on_every_level;
use trash_panda::dtype::{
    cast, expand, f32_to_fp8_e4m3fn, fp8_e4m3fn_to_f32, quantize_fp8, DType, DtypeError,
    QuantGranularity, Scale,
};

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let unit = (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            unit * (1 + i % 7) as f32 * 0.01
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The documented formula, element by element.
fn reference(x: &[f32], rows: usize, cols: usize, per_row: bool) -> (Vec<u8>, Vec<f32>) {
    let groups: Vec<&[f32]> = if per_row {
        x.chunks(cols.max(1)).take(rows).collect()
    } else {
        vec![x]
    };
    let mut q = Vec::new();
    let mut scales = Vec::new();
    for g in groups {
        let amax = g
            .iter()
            .filter(|v| !v.is_nan())
            .fold(0f32, |m, v| m.max(v.abs()));
        let s = amax / 448.0;
        let s = if s > 0.0 && s.is_finite() { s } else { 1.0 };
        scales.push(s);
        q.extend(
            g.iter()
                .map(|v| f32_to_fp8_e4m3fn((v / s).clamp(-448.0, 448.0))),
        );
    }
    (q, scales)
}

/// The documented formula for block-wise scales: the amax over each tile (edge tiles partial).
fn block_reference(x: &[f32], rows: usize, cols: usize, block: usize) -> (Vec<u8>, Vec<f32>) {
    let tiles = cols.div_ceil(block);
    let mut scales = vec![0f32; rows.div_ceil(block) * tiles];
    for (i, s) in scales.iter_mut().enumerate() {
        let (tr, tc) = (i / tiles, i % tiles);
        let amax = (tr * block..((tr + 1) * block).min(rows))
            .flat_map(|r| (tc * block..((tc + 1) * block).min(cols)).map(move |c| r * cols + c))
            .map(|e| x[e])
            .filter(|v| !v.is_nan())
            .fold(0f32, |m, v| m.max(v.abs()));
        let k = amax / 448.0;
        *s = if k > 0.0 && k.is_finite() { k } else { 1.0 };
    }
    let q = (0..rows * cols)
        .map(|e| {
            let s = scales[(e / cols / block) * tiles + (e % cols) / block];
            f32_to_fp8_e4m3fn((x[e] / s).clamp(-448.0, 448.0))
        })
        .collect();
    (q, scales)
}

#[test]
fn block_wise_quantization_matches_the_formula_and_expands_back() {
    on_every_level(|| {
        // Whole and partial tiles, a band split over threads, a tensor smaller than one tile.
        for (rows, cols, block, threads) in [
            (300, 200, 128, 2),
            (1100, 1000, 128, 2),
            (256, 256, 128, 1),
            (5, 3, 128, 1),
            (37, 129, 16, 2),
        ] {
            let mut x = values(rows * cols, 11);
            x[cols + 1] = f32::NAN;
            let src = f32_bytes(&x);
            let tiles = rows.div_ceil(block) * cols.div_ceil(block);
            let (mut q, mut s) = (vec![0u8; rows * cols], vec![0f32; tiles]);
            let g = QuantGranularity::Block { block };
            quantize_fp8(&src, DType::F32, (rows, cols), g, &mut q, &mut s, threads).unwrap();
            let (wq, ws) = block_reference(&x, rows, cols, block);
            assert_eq!(s, ws, "scales {rows}x{cols} block {block}");
            assert!(q == wq, "codes {rows}x{cols} block {block}");
            // The expansion of the same layout multiplies each code by its tile's scale.
            let mut back = vec![0u8; rows * cols * 4];
            let scale = Scale::Block { scales: &s, block };
            expand(
                &q,
                DType::F8E4M3,
                &mut back,
                DType::F32,
                (rows, cols),
                &scale,
                1,
            )
            .unwrap();
            for (e, b) in back.chunks_exact(4).enumerate() {
                let got = f32::from_le_bytes(b.try_into().unwrap());
                let want = fp8_e4m3fn_to_f32(q[e])
                    * s[(e / cols / block) * cols.div_ceil(block) + (e % cols) / block];
                assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
            }
        }
        let (mut q, mut s) = (vec![0u8; 4], vec![0f32; 1]);
        let zero = QuantGranularity::Block { block: 0 };
        let err = quantize_fp8(&[0u8; 16], DType::F32, (2, 2), zero, &mut q, &mut s, 1);
        assert!(matches!(err, Err(DtypeError::ZeroBlock)));
        let wrong = quantize_fp8(
            &[0u8; 16],
            DType::F32,
            (2, 2),
            QuantGranularity::Block { block: 1 },
            &mut q,
            &mut s,
            1,
        );
        assert!(matches!(
            wrong,
            Err(DtypeError::ScaleLength {
                expected: 4,
                actual: 1,
                ..
            })
        ));
    });
}

#[test]
fn quantize_matches_the_formula_and_round_trips() {
    on_every_level(|| {
        for (rows, cols, threads) in [(37, 129, 1), (1100, 1000, 2), (1, 5000, 1)] {
            let x = values(rows * cols, 7);
            let src = f32_bytes(&x);
            for per_row in [false, true] {
                let g = if per_row {
                    QuantGranularity::PerRow
                } else {
                    QuantGranularity::PerTensor
                };
                let mut q = vec![0u8; rows * cols];
                let mut s = vec![0f32; if per_row { rows } else { 1 }];
                quantize_fp8(&src, DType::F32, (rows, cols), g, &mut q, &mut s, threads).unwrap();
                let (wq, ws) = reference(&x, rows, cols, per_row);
                assert_eq!(s, ws, "scales {rows}x{cols} per_row={per_row}");
                assert!(q == wq, "codes {rows}x{cols} per_row={per_row}");
                for (i, (&c, &v)) in q.iter().zip(&x).enumerate() {
                    let k = s[if per_row { i / cols } else { 0 }];
                    let scaled = v / k;
                    let back = fp8_e4m3fn_to_f32(c);
                    // Half an fp8 ulp at the value's binade (subnormal step 2^-9 below 2^-6).
                    let e = scaled.abs().log2().floor().max(-6.0);
                    let half_ulp = 2f32.powf(e - 3.0) / 2.0;
                    assert!(
                        (back - scaled).abs() <= half_ulp * 1.0001,
                        "{i}: {scaled} -> {back}"
                    );
                }
            }
        }
    });
}

#[test]
fn quantize_keeps_nan_and_handles_zero_and_inf() {
    on_every_level(|| {
        let x = [
            0.0f32,
            f32::NAN,
            -f32::NAN,
            1.0,
            -2.0,
            f32::INFINITY,
            0.0,
            0.0,
        ];
        let mut q = [0u8; 8];
        let mut s = [0f32; 2];
        quantize_fp8(
            &f32_bytes(&x),
            DType::F32,
            (2, 4),
            QuantGranularity::PerRow,
            &mut q,
            &mut s,
            1,
        )
        .unwrap();
        assert_eq!(s[0], 1.0 / 448.0);
        assert_eq!(&q[..4], &[0x00, 0x7F, 0xFF, 0x7E]);
        assert_eq!(s[1], 1.0, "an infinite amax falls back to scale 1");
        assert_eq!(
            &q[4..],
            &[0xC0, 0x7E, 0x00, 0x00],
            "-2 stays -2, inf saturates"
        );
        let zeros = [0u8; 64];
        let mut s = [0f32];
        quantize_fp8(
            &zeros,
            DType::BF16,
            (4, 8),
            QuantGranularity::PerTensor,
            &mut q[..0].to_vec(),
            &mut s,
            1,
        )
        .unwrap_err();
        let mut q = [1u8; 32];
        quantize_fp8(
            &zeros,
            DType::BF16,
            (4, 8),
            QuantGranularity::PerTensor,
            &mut q,
            &mut s,
            1,
        )
        .unwrap();
        assert_eq!(
            (s[0], q),
            (1.0, [0u8; 32]),
            "zero tensor: scale 1, zero codes"
        );
    });
}

#[test]
fn quantize_other_sources_match_f32() {
    on_every_level(|| {
        let x = values(4096, 3);
        let mut bf = vec![0u8; 4096 * 2];
        cast(&f32_bytes(&x), DType::F32, &mut bf, DType::BF16, 1).unwrap();
        let mut wide = vec![0u8; 4096 * 4];
        cast(&bf, DType::BF16, &mut wide, DType::F32, 1).unwrap();
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
        let (mut sa, mut sb) = ([0f32; 64], [0f32; 64]);
        quantize_fp8(
            &bf,
            DType::BF16,
            (64, 64),
            QuantGranularity::PerRow,
            &mut a,
            &mut sa,
            1,
        )
        .unwrap();
        quantize_fp8(
            &wide,
            DType::F32,
            (64, 64),
            QuantGranularity::PerRow,
            &mut b,
            &mut sb,
            1,
        )
        .unwrap();
        assert_eq!((a, sa), (b, sb));
    });
}

/// Rows long enough for the bf16 table, whose scales repeat (the quantizer keeps the tables of
/// the scales it met) and differ, some holding a NaN, an infinity, subnormal values or only
/// zeros: the 16-bit kernels against the formula on the widened values, on 1 and 2 threads.
#[test]
fn half_rows_with_repeating_scales_match_the_formula() {
    let (rows, cols) = (240, 2100);
    let mut x = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        // 120 rows of different scales (more than the quantizer keeps, so some share a slot),
        // then the same 120 again.
        let scale = (1.0 + (i % 40) as f32 / 64.0) * 2f32.powi((i / 40 % 3) as i32 - 1);
        let mut row: Vec<f32> = values(cols, (i % 6) as u32 + 1)
            .into_iter()
            .map(|v| v * scale)
            .collect();
        match i % 40 {
            7 => row[100] = f32::NAN,
            11 => row[5] = f32::INFINITY,
            13 => row.iter_mut().step_by(3).for_each(|v| *v = 1e-40),
            17 => row.fill(0.0),
            19 => row[..2].copy_from_slice(&[f32::NEG_INFINITY, -f32::NAN]),
            _ => {}
        }
        x.extend(row);
    }
    on_every_level(|| {
        for dt in [DType::BF16, DType::F16] {
            let mut half = vec![0u8; rows * cols * 2];
            cast(&f32_bytes(&x), DType::F32, &mut half, dt, 1).unwrap();
            let mut wide = vec![0u8; rows * cols * 4];
            cast(&half, dt, &mut wide, DType::F32, 1).unwrap();
            let widened: Vec<f32> = wide
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let (want_q, want_s) = reference(&widened, rows, cols, true);
            for threads in [1, 2] {
                let (mut q, mut s) = (vec![0u8; rows * cols], vec![0f32; rows]);
                let g = QuantGranularity::PerRow;
                quantize_fp8(&half, dt, (rows, cols), g, &mut q, &mut s, threads).unwrap();
                assert_eq!(s, want_s, "{dt} scales, {threads} threads");
                for (i, (g, w)) in q.iter().zip(&want_q).enumerate() {
                    // A NaN's sign after a division is not defined; its shape is.
                    if widened[i].is_nan() {
                        assert_eq!(g & 0x7F, 0x7F, "{dt} row {} col {}", i / cols, i % cols);
                    } else {
                        assert_eq!(g, w, "{dt} row {} col {}", i / cols, i % cols);
                    }
                }
            }
        }
    });
}

#[test]
fn error_paths() {
    let src = [0u8; 12];
    let mut dst = [0u8; 24];
    let e = expand(
        &src,
        DType::F8E4M3,
        &mut dst,
        DType::F8E5M2,
        (1, 12),
        &Scale::None,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(e, DtypeError::Unsupported { op: "expand", .. }),
        "{e}"
    );
    let e = expand(
        &src,
        DType::I8,
        &mut dst,
        DType::BF16,
        (1, 12),
        &Scale::None,
        1,
    )
    .unwrap_err();
    assert!(matches!(e, DtypeError::Unsupported { .. }), "{e}");
    let e = expand(
        &src,
        DType::F8E4M3,
        &mut dst,
        DType::BF16,
        (3, 5),
        &Scale::None,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::LengthMismatch {
                what: "expand source",
                expected_elems: 15,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("expected 15 fp8_e4m3fn elements"),
        "{e}"
    );
    let e = expand(
        &src,
        DType::F8E4M3,
        &mut dst[..23],
        DType::BF16,
        (3, 4),
        &Scale::None,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::LengthMismatch {
                what: "expand destination",
                expected_bytes: 24,
                actual_bytes: 23,
                ..
            }
        ),
        "{e}"
    );
    let e = expand(
        &src,
        DType::F8E4M3,
        &mut dst,
        DType::BF16,
        (3, 4),
        &Scale::PerRow(&[1.0; 4]),
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::ScaleLength {
                kind: "per-row",
                expected: 3,
                actual: 4,
                ..
            }
        ),
        "{e}"
    );
    let block = Scale::Block {
        scales: &[1.0; 2],
        block: 2,
    };
    let e = expand(
        &src,
        DType::F8E4M3,
        &mut dst,
        DType::BF16,
        (3, 4),
        &block,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::ScaleLength {
                kind: "block",
                expected: 4,
                actual: 2,
                ..
            }
        ),
        "{e}"
    );
    let block = Scale::Block {
        scales: &[],
        block: 0,
    };
    let e = expand(
        &src,
        DType::F8E4M3,
        &mut dst,
        DType::BF16,
        (3, 4),
        &block,
        1,
    )
    .unwrap_err();
    assert!(matches!(e, DtypeError::ZeroBlock), "{e}");
    let e = expand(
        &src,
        DType::F8E4M3,
        &mut dst,
        DType::BF16,
        (usize::MAX, 2),
        &Scale::None,
        1,
    )
    .unwrap_err();
    assert!(matches!(e, DtypeError::ShapeOverflow { .. }), "{e}");
    let e = cast(&src[..3], DType::F16, &mut dst, DType::F32, 1).unwrap_err();
    assert!(matches!(e, DtypeError::RaggedBytes { bytes: 3, .. }), "{e}");
    let e = cast(&src, DType::F16, &mut dst[..20], DType::F32, 1).unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::LengthMismatch {
                what: "cast destination",
                expected_bytes: 24,
                ..
            }
        ),
        "{e}"
    );
    let e = cast(&src, DType::F32, &mut dst, DType::F8E4M3, 1).unwrap_err();
    assert!(
        matches!(e, DtypeError::Unsupported { op: "cast", .. }),
        "{e}"
    );
    let e = cast(&src, DType::U8, &mut dst, DType::F32, 1).unwrap_err();
    assert!(matches!(e, DtypeError::Unsupported { .. }), "{e}");
    let (mut q, mut s) = ([0u8; 12], [0f32; 3]);
    let e = quantize_fp8(
        &src,
        DType::I32,
        (3, 1),
        QuantGranularity::PerRow,
        &mut q[..3],
        &mut s,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::Unsupported {
                op: "quantize_fp8",
                ..
            }
        ),
        "{e}"
    );
    let e = quantize_fp8(
        &src,
        DType::F32,
        (3, 1),
        QuantGranularity::PerRow,
        &mut q,
        &mut s,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::LengthMismatch {
                what: "quantize_fp8 destination",
                ..
            }
        ),
        "{e}"
    );
    let e = quantize_fp8(
        &src,
        DType::F32,
        (3, 1),
        QuantGranularity::PerTensor,
        &mut q[..3],
        &mut s,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::ScaleLength {
                kind: "per-tensor",
                expected: 1,
                actual: 3,
                ..
            }
        ),
        "{e}"
    );
    let e = quantize_fp8(
        &src,
        DType::F32,
        (2, 1),
        QuantGranularity::PerRow,
        &mut q[..2],
        &mut s,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DtypeError::LengthMismatch {
                what: "quantize_fp8 source",
                ..
            }
        ),
        "{e}"
    );
    // Empty tensors are fine.
    expand(
        &[],
        DType::F8E4M3,
        &mut [],
        DType::BF16,
        (0, 128),
        &Scale::PerRow(&[]),
        1,
    )
    .unwrap();
    quantize_fp8(
        &[],
        DType::F32,
        (2, 0),
        QuantGranularity::PerRow,
        &mut [],
        &mut s[..2],
        1,
    )
    .unwrap();
    assert_eq!(&s[..2], &[1.0, 1.0]);
}

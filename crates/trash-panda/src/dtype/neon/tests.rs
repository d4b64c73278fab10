//! The NEON kernels against the scalar references, every code or pattern over a set of scales.
//! Under QEMU (`make test`'s qemu-arm-tests) these run on an emulated aarch64 CPU.

use super::expand::{fp8_to_f32, fp8_to_half, half_run};
use super::narrow::{f32_to_half, half_to_f32, Reciprocal};
use super::table::Bf16Table;
use super::table16::F16Table;
use super::*;
use crate::dtype::{
    best_simd_level, bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits,
    f32_to_fp8_e4m3fn, fp8_e4m3fn_to_f32, fp8_e5m2_to_f32, supported_simd_levels, SimdLevel,
};

const FP8: [DType; 2] = [DType::F8E4M3, DType::F8E5M2];

fn scales() -> Vec<f32> {
    crate::dtype::kernel_tests::scales(24)
}

fn decode(c: u8, t: DType) -> f32 {
    if t == DType::F8E5M2 {
        fp8_e5m2_to_f32(c)
    } else {
        fp8_e4m3fn_to_f32(c)
    }
}

/// The reference result of code `c` times `k` in `dst_t`, as the destination's bits.
fn want(c: u8, t: DType, dst_t: DType, k: Option<f32>) -> u32 {
    let x = match k {
        Some(k) => decode(c, t) * k,
        None => decode(c, t),
    };
    match dst_t {
        DType::BF16 => u32::from(f32_to_bf16_bits(x)),
        DType::F16 => u32::from(f32_to_f16_bits(x)),
        _ => x.to_bits(),
    }
}

fn got(bytes: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b[..bytes.len()].copy_from_slice(bytes);
    u32::from_le_bytes(b)
}

/// Compares the expansion of every code in `src` (at column `i` of a run whose scale
/// `k_of(i)` gives) with the reference, naming the first difference.
fn check(src: &[u8], t: DType, out: &[u8], dst_t: DType, k_of: impl Fn(usize) -> Option<f32>) {
    for (i, (c, g)) in src.iter().zip(out.chunks_exact(dst_t.size())).enumerate() {
        let k = k_of(i);
        let (x, g) = (decode(*c, t), got(g));
        // Which NaN a product of two NaNs gives is not defined; only that it is one.
        if x.is_nan() && k.is_some_and(f32::is_nan) {
            let nan = match dst_t {
                DType::F32 => f32::from_bits(g).is_nan(),
                DType::BF16 => bf16_bits_to_f32(g as u16).is_nan(),
                _ => f16_bits_to_f32(g as u16).is_nan(),
            };
            assert!(nan, "{t}->{dst_t} code {c:#04x}: {g:#x} is no NaN");
            continue;
        }
        let ctx = format!("{t}->{dst_t} at {i}: code {c:#04x} scale {k:?}");
        assert_eq!(g, want(*c, t, dst_t, k), "{ctx}");
    }
}

#[test]
fn the_neon_level_runs_here() {
    // The qemu-arm-tests check of `make test` relies on this: the emulated CPU has NEON, so
    // every test that loops over the levels runs these kernels.
    eprintln!("simd levels on this CPU: {:?}", supported_simd_levels());
    assert!(SimdLevel::Neon.is_supported());
    assert_eq!(
        supported_simd_levels(),
        [SimdLevel::Portable, SimdLevel::Neon]
    );
    assert_eq!(best_simd_level(), SimdLevel::Neon);
}

#[test]
fn fp8_expansion_equals_the_reference_on_every_code() {
    // Every code several times over (past the table threshold), shifted by 0 and 3, so the
    // vector body, the tail and every lane see every code; and a short run, computed.
    let codes: Vec<u8> = (0..=255u8).cycle().take(256 * 3 + 35).collect();
    let mut ks: Vec<Option<f32>> = scales().into_iter().map(Some).collect();
    ks.push(None);
    for t in FP8 {
        for k in ks.iter().copied() {
            for src in [&codes[..], &codes[3..], &codes[5..300]] {
                for dst_t in [DType::BF16, DType::F16, DType::F32] {
                    let mut out = vec![0u8; src.len() * dst_t.size()];
                    // SAFETY: the test runs on aarch64, whose every CPU has NEON.
                    assert!(unsafe { convert(src, t, &mut out, dst_t, k) });
                    check(src, t, &out, dst_t, |_| k);
                }
                // The computed path alone, table-sized runs included.
                if let Some(k) = k {
                    for dst_t in [DType::BF16, DType::F16] {
                        let mut out = vec![0u8; src.len() * 2];
                        // SAFETY: the test runs on aarch64, whose every CPU has NEON.
                        unsafe { half_run(src, t, &mut out, dst_t, Some(k), None) };
                        check(src, t, &out, dst_t, |_| Some(k));
                    }
                }
            }
        }
    }
}

#[test]
fn fp8_direct_kernels_handle_unaligned_and_short_slices() {
    let codes: Vec<u8> = (0..=255u8).collect();
    for t in FP8 {
        for len in [0, 1, 15, 16, 17, 33] {
            let src = &codes[7..7 + len];
            let mut out = vec![0u8; 4 * len + 1];
            // SAFETY: the test runs on aarch64, whose every CPU has NEON.
            unsafe { fp8_to_f32(src, t, &mut out[1..], None) };
            check(src, t, &out[1..], DType::F32, |_| None);
            // SAFETY: as above.
            unsafe { fp8_to_half(src, t, &mut out[1..=2 * len], DType::F16, Some(0.5)) };
            check(src, t, &out[1..=2 * len], DType::F16, |_| Some(0.5));
        }
    }
}

#[test]
fn fp8_blocks_equal_the_reference() {
    let all = scales();
    for (rows, cols, block, first_row) in [
        (300usize, 200usize, 128usize, 0usize),
        (70, 333, 64, 37),
        (5, 40, 128, 250),
        (9, 10, 3, 1),
    ] {
        let tiles = cols.div_ceil(block);
        let grid = (first_row + rows).div_ceil(block) * tiles;
        // Cycle through the scale set (NaN and infinity included) over the tiles.
        let ks: Vec<f32> = (0..grid).map(|t| all[(t * 7) % all.len()]).collect();
        let src: Vec<u8> = (0..rows * cols).map(|i| (i * 37 + i / 255) as u8).collect();
        for t in FP8 {
            for dst_t in [DType::BF16, DType::F16, DType::F32] {
                let mut out = vec![0u8; src.len() * dst_t.size()];
                // SAFETY: the test runs on aarch64, whose every CPU has NEON.
                unsafe { fp8_blocks(&src, t, &mut out, dst_t, cols, first_row, &ks, block) };
                check(&src, t, &out, dst_t, |i| {
                    let (r, c) = (first_row + i / cols, i % cols);
                    Some(ks[r / block * tiles + c / block])
                });
            }
        }
    }
}

#[test]
fn every_16_bit_pattern_widens_exactly() {
    // Every pattern, from an odd offset, plus 5 so the tail sees some.
    let pats: Vec<u16> = (0..=u16::MAX).chain(0x7C00..0x7C05).collect();
    let mut src: Vec<u8> = vec![0];
    src.extend(pats.iter().flat_map(|h| h.to_le_bytes()));
    for t in [DType::BF16, DType::F16] {
        let mut out = vec![0u8; pats.len() * 4];
        // SAFETY: the test runs on aarch64, whose every CPU has NEON.
        unsafe { half_to_f32(&src[1..], t, &mut out) };
        for (h, g) in pats.iter().zip(out.chunks_exact(4)) {
            let want = match t {
                DType::BF16 => bf16_bits_to_f32(*h),
                _ => f16_bits_to_f32(*h),
            };
            assert_eq!(got(g), want.to_bits(), "{t} {h:#06x}");
        }
    }
}

#[test]
fn f32_narrows_like_the_reference() {
    // A prime stride over every exponent, and dense runs at the f16 subnormal, overflow and
    // rounding boundaries and among the NaNs.
    let mut pats: Vec<u32> = (0..=u32::MAX).step_by(65_537).collect();
    for base in [
        0x3300_0000u32,
        0x3880_0000 - 0x800,
        0x477F_E000,
        0x7F80_0000,
        0x3F80_7FF0,
        // bf16 ties with an odd kept lsb, and the largest finite values rounding to infinity.
        0x3F81_7FF0,
        0x7F7F_7FF0,
    ] {
        pats.extend(base..base + 0x1000);
    }
    let neg: Vec<u32> = pats.iter().map(|w| w ^ 0x8000_0000).collect();
    pats.extend(neg);
    let src: Vec<u8> = pats.iter().flat_map(|w| w.to_le_bytes()).collect();
    for dst_t in [DType::BF16, DType::F16] {
        let mut out = vec![0u8; pats.len() * 2 + 1];
        // SAFETY: the test runs on aarch64, whose every CPU has NEON.
        unsafe { f32_to_half(&src, &mut out[1..], dst_t) };
        for (w, g) in pats.iter().zip(out[1..].chunks_exact(2)) {
            let x = f32::from_bits(*w);
            let want = match dst_t {
                DType::BF16 => f32_to_bf16_bits(x),
                _ => f32_to_f16_bits(x),
            };
            assert_eq!(got(g), u32::from(want), "{dst_t} of {w:#010x}");
        }
    }
}

#[test]
fn half_amax_equals_the_reference() {
    crate::dtype::kernel_tests::check_amax_16(|bytes, bf16| {
        let t = if bf16 { DType::BF16 } else { DType::F16 };
        // SAFETY: the test runs on aarch64, whose every CPU has NEON.
        unsafe { half_amax_bits(bytes, t) }
    });
}

/// Checks e4m3 codes `out` of the bf16 or f16 values of `src` against the reference with
/// scale `k`.
fn check_e4m3(src: &[u8], t: DType, out: &[u8], k: f32) {
    for (s, g) in src.chunks_exact(2).zip(out) {
        let h = u16::from_le_bytes([s[0], s[1]]);
        let x = match t {
            DType::BF16 => bf16_bits_to_f32(h),
            _ => f16_bits_to_f32(h),
        };
        let v = (x / k).clamp(-448.0, 448.0);
        // A NaN's sign after a division is not defined; its shape is.
        if v.is_nan() {
            assert_eq!(g & 0x7F, 0x7F, "{t} {h:#06x} scale {k:e}");
            continue;
        }
        assert_eq!(*g, f32_to_fp8_e4m3fn(v), "{t} {h:#06x} scale {k:e}");
    }
}

/// The quantize scales of the shared lists and of `kernel_tests`.
fn quantize_scales() -> Vec<f32> {
    let mut ks = crate::dtype::kernel_tests::quantize_scales();
    // The shared list: both ends of the divide-free range and just outside it, the worst
    // reciprocals, and scales as quantization makes them.
    ks.extend(scales());
    ks
}

#[test]
fn half_to_e4m3_equals_the_reference_on_every_pattern() {
    let src = crate::dtype::kernel_tests::every_pattern_16();
    for t in [DType::BF16, DType::F16] {
        for k in quantize_scales() {
            let mut out = vec![0u8; src.len() / 2];
            // SAFETY: the test runs on aarch64, whose every CPU has NEON.
            unsafe { half_to_e4m3(&src, t, &mut out, k) };
            check_e4m3(&src, t, &out, k);
        }
    }
}

/// Every 16-bit pattern in order (blocks of sixteen from one binade) and shuffled (blocks
/// that mix binades, zeros, infinities and NaNs).
fn patterns_twice() -> [Vec<u8>; 2] {
    // 40503 is odd: multiplying by it permutes the 16-bit patterns.
    let shuffled = (0..=u16::MAX)
        .flat_map(|i| i.wrapping_mul(40503).to_le_bytes())
        .collect();
    [crate::dtype::kernel_tests::every_pattern_16(), shuffled]
}

/// The block function the quantize tables take: the computed codes of the 16 bf16 or f16
/// values at a pointer, with scale `k`.
fn computed_block(t: DType, k: f32) -> impl Fn(*const u8) -> uint8x16_t + Copy {
    move |p| {
        let mut codes = [0u8; 16];
        // SAFETY: the tables pass pointers to 32 readable bytes; the test runs on aarch64,
        // whose every CPU has NEON. Sixteen values are a computed block.
        unsafe {
            half_to_e4m3(core::slice::from_raw_parts(p, 32), t, &mut codes, k);
            vld1q_u8(codes.as_ptr())
        }
    }
}

/// The bf16 table loop itself, which `half_to_e4m3` may decline without a test noticing: for
/// every scale of the lists from 2^-110 up (under about 2^-116 no binade's quotients start at
/// the normal codes from exponent field 6 on), a table is built, and its codes equal the
/// reference's on every bf16 pattern, in order (blocks of one binade each) and shuffled (blocks
/// that mix tabled values with zeros, the binades of the subnormal codes, infinities and NaNs).
#[test]
fn bf16_table_codes_equal_the_reference() {
    let [in_order, shuffled] = patterns_twice();
    let mut ks = quantize_scales();
    ks.extend([2f32.powi(-110), 0.02 / 448.0, 7.5 / 448.0, f32::MAX]);
    let smallest = 2f32.powi(-110);
    for k in ks {
        // SAFETY: the test runs on aarch64, whose every CPU has NEON.
        let table = unsafe { Bf16Table::new(k) };
        if !(k.is_finite() && k >= smallest) {
            assert!(table.is_none(), "a table for scale {k:e}");
            continue;
        }
        let table = table.unwrap_or_else(|| panic!("no table for scale {k:e}"));
        let block = computed_block(DType::BF16, k);
        for src in [&in_order, &shuffled] {
            let mut out = vec![0u8; src.len() / 2];
            // SAFETY: the test runs on aarch64, whose every CPU has NEON.
            let done = unsafe { table.encode(src, &mut out, block) };
            assert_eq!(done, out.len() / 16 * 16, "scale {k:e}");
            check_e4m3(&src[..2 * done], DType::BF16, &out[..done], k);
        }
    }
}

/// The f16 table loop itself: for every positive scale of the lists up to 2^21 (above it no
/// f16 binade's quotients reach the normal codes), a table is built, and its codes, with the
/// blocks it hands to the computed loop, equal the reference's on every f16 pattern, in order
/// and shuffled. Each run of 1024 values is a call of its own: the loop gives the rest of a run
/// back to the computed loop once blocks to compute grow common, and the first 1024 values of a
/// call always go through the table.
#[test]
fn f16_table_codes_equal_the_reference() {
    let [in_order, shuffled] = patterns_twice();
    let mut ks = quantize_scales();
    // 0.1 and 0.2: e_lo is 6 and 7, either side of the zeros under binade e_lo - 5.
    ks.extend([
        2f32.powi(-110),
        0.02 / 448.0,
        7.5 / 448.0,
        0.1,
        0.2,
        2f32.powi(21),
        2.1e6,
    ]);
    for k in ks {
        // SAFETY: the test runs on aarch64, whose every CPU has NEON.
        let table = unsafe { F16Table::new(k, &[]) };
        if !(k.is_normal() && k > 0.0 && k <= 2f32.powi(21)) {
            assert!(table.is_none(), "a table for scale {k:e}");
            continue;
        }
        let table = table.unwrap_or_else(|| panic!("no table for scale {k:e}"));
        let block = computed_block(DType::F16, k);
        for src in [&in_order, &shuffled] {
            for run in src.chunks_exact(2048) {
                let mut out = [0u8; 1024];
                // SAFETY: the test runs on aarch64, whose every CPU has NEON.
                let done = unsafe { table.encode(run, &mut out, block) };
                assert_eq!(done, 1024, "scale {k:e}");
                check_e4m3(run, DType::F16, &out, k);
            }
        }
    }
}

/// The f16 table is declined where the start of the run has more than one block in four that
/// it would hand to the computed loop (with scale 1, exponent fields 4 to 8 are such values),
/// and built where it has no more.
#[test]
fn f16_table_declines_runs_it_would_give_back() {
    let run = |computed_blocks: usize| -> Vec<u8> {
        (0..64 * 16)
            .map(|i| {
                if i / 16 < computed_blocks {
                    0x1555u16
                } else {
                    0x2955
                }
            })
            .flat_map(u16::to_le_bytes)
            .collect()
    };
    // SAFETY: the test runs on aarch64, whose every CPU has NEON (every call).
    unsafe {
        assert!(F16Table::new(1.0, &run(0)).is_some());
        assert!(F16Table::new(1.0, &run(16)).is_some());
        assert!(F16Table::new(1.0, &run(17)).is_none());
        assert!(F16Table::new(1.0, &run(64)).is_none());
    }
}

/// Checks [`Reciprocal::quotient`] against `FDIV` for every 11-bit significand x in [1, 2)
/// (every bf16 and f16 significand), both signs, and every `step`-th 24-bit significand k in
/// [1, 2) plus the extreme ones: the NEON instructions against the division on the pairs that
/// decide the quotient. That the correction is exact on all 2^33 of them, and why that covers
/// every value and scale, is the AVX2 kernel's test and comment (`dtype/avx2/quant.rs`).
#[test]
fn reciprocal_quotients_equal_the_division() {
    let xs: Vec<f32> = (0..2048u32)
        .map(|j| f32::from_bits(0x3F80_0000 | ((j & 1) << 31) | ((j >> 1) << 13)))
        .collect();
    let mantissas = (0..1u32 << 23)
        .step_by(997)
        .chain([1, 2, 0x7F_FFFF, 0x7F_FFFE, 0x40_0000, 0x3F_FFFF]);
    for km in mantissas {
        let k = f32::from_bits(0x3F80_0000 | km);
        // The stored scale is k / 512 (exact): this one stores k itself.
        let r = Reciprocal::new(512.0 * k).expect("in range");
        for x4 in xs.chunks_exact(4) {
            let (mut g, mut w) = ([0f32; 4], [0f32; 4]);
            // SAFETY: the test runs on aarch64, whose every CPU has NEON; `x4`, `g` and `w` are
            // four floats each, what the unaligned load and stores move.
            unsafe {
                let x = vld1q_f32(x4.as_ptr());
                vst1q_f32(g.as_mut_ptr(), r.quotient(x));
                vst1q_f32(w.as_mut_ptr(), vdivq_f32(x, vdupq_n_f32(k)));
            }
            for j in 0..4 {
                assert_eq!(g[j].to_bits(), w[j].to_bits(), "{} / {k:e}", x4[j]);
            }
        }
    }
}

/// The divide-free loop declines scales outside its range, which keeps the codes exact but
/// would hide a wrong range check behind the division: every scale of the shared list inside
/// [2^-90, f32::MAX] must get a reciprocal, the others none.
#[test]
fn the_reciprocal_takes_exactly_its_range() {
    let range = f32::from_bits(0x0A80_0000)..=f32::MAX;
    for k in scales() {
        assert_eq!(
            Reciprocal::new(k).is_some(),
            range.contains(&k),
            "scale {k:e}"
        );
    }
    assert!(Reciprocal::new(2.0f32.powi(-90)).is_some());
    assert!(Reciprocal::new(f32::from_bits(0x0A7F_FFFF)).is_none());
}

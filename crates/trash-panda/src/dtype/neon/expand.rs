//! fp8 (e4m3fn, e5m2) to bf16, f16 and f32 on NEON, scaled or not: by table where one scale's
//! 128 results can be tabled, else decoded by table and scaled and rounded in registers.

use core::arch::aarch64::*;
use std::sync::OnceLock;

use super::{bf16x8, f16x8, fp8_bits, fp8_to_half_one, half_bits, Lut};
use crate::dtype::DType;

/// Below this many codes a per-scale table costs more than it saves: building one is eight
/// computed steps of 16 codes, and a lookup step is about a third of a computed one (an
/// estimate from the instruction counts; no Arm machine measured it). Runs of 128 (block
/// scales) share one table over a tile's rows instead.
const TABLE_MIN: usize = 512;

/// Whether the results of one scale `k` are symmetric in the code's sign (the negative code's
/// result is the positive one's with bit 15 flipped), so 128 magnitudes hold them all. The
/// product's sign is the XOR of the signs, and rounding to nearest even is symmetric; what
/// breaks it is a product that is the one default NaN whatever the signs (0 x infinity: e4m3fn
/// has no infinity code but `k` may be infinite, e5m2 has them, so `k` = 0 too) and a NaN `k`,
/// whose own NaN comes out for every number code.
fn symmetric(src_t: DType, k: f32) -> bool {
    k.is_finite() && (src_t == DType::F8E4M3 || k != 0.0)
}

/// The unscaled results by magnitude, as little-endian u16: to bf16 or f16, or the high half
/// of the f32 (every fp8 value's f32 has a zero low half, NaNs included). Built once from the
/// scalar references.
fn unscaled(src_t: DType, dst_t: DType) -> &'static [u8; 256] {
    static TABLES: OnceLock<[[u8; 256]; 6]> = OnceLock::new();
    let all = TABLES.get_or_init(|| {
        let mut all = [[0u8; 256]; 6];
        for (i, table) in all.iter_mut().enumerate() {
            let src = [DType::F8E4M3, DType::F8E5M2][i / 3];
            for (m, r) in (0..128u8).zip(table.chunks_exact_mut(2)) {
                let w = fp8_bits(m, src);
                let v = match i % 3 {
                    0 => half_bits(w, DType::BF16),
                    1 => half_bits(w, DType::F16),
                    _ => (w >> 16) as u16,
                };
                r.copy_from_slice(&v.to_le_bytes());
            }
        }
        all
    });
    let column = match dst_t {
        DType::BF16 => 0,
        DType::F16 => 1,
        _ => 2,
    };
    &all[3 * usize::from(src_t == DType::F8E5M2) + column]
}

/// fp8 codes of `src` (times `k` when given) into the bf16 or f16 `dst`, two bytes per code.
#[target_feature(enable = "neon")]
pub(super) fn fp8_to_half(src: &[u8], src_t: DType, dst: &mut [u8], dst_t: DType, k: Option<f32>) {
    let table = match k {
        None => Some(Lut::new(unscaled(src_t, dst_t))),
        Some(k) if src.len() >= TABLE_MIN && symmetric(src_t, k) => {
            Some(scaled_table(src_t, dst_t, k))
        }
        Some(_) => None,
    };
    half_run(src, src_t, dst, dst_t, k, table.as_ref());
}

/// [`fp8_to_half`] with the table chosen: looked up when there is one (it must hold the
/// results for `k`), else computed; the tail by the scalar reference.
#[target_feature(enable = "neon")]
pub(super) fn half_run(
    src: &[u8],
    src_t: DType,
    dst: &mut [u8],
    dst_t: DType,
    k: Option<f32>,
    table: Option<&Lut>,
) {
    let n = src.len().min(dst.len() / 2);
    let (src, dst) = (&src[..n], &mut dst[..2 * n]);
    let done = match (table, k) {
        (Some(t), _) => lookup(src, dst, t),
        (None, Some(k)) => computed_half(src, src_t, dst, dst_t, k),
        (None, None) => 0,
    };
    for (c, d) in src[done..].iter().zip(dst[2 * done..].chunks_exact_mut(2)) {
        d.copy_from_slice(&fp8_to_half_one(*c, src_t, dst_t, k).to_le_bytes());
    }
}

/// The table of the 128 results of `k` (which must be [`symmetric`]), computed in registers.
#[target_feature(enable = "neon")]
fn scaled_table(src_t: DType, dst_t: DType, k: f32) -> Lut {
    let mut codes = [0u8; 128];
    for (i, c) in codes.iter_mut().enumerate() {
        *c = i as u8;
    }
    let mut results = [0u8; 256];
    let done = computed_half(&codes, src_t, &mut results, dst_t, k);
    debug_assert_eq!(done, 128, "128 codes are eight whole steps");
    Lut::new(&results)
}

/// Looks the codes of `src` up in `table` into `dst` (two bytes each), 16 at a time; returns
/// how many it did (the rest, under 16, is the caller's).
#[target_feature(enable = "neon")]
fn lookup(src: &[u8], dst: &mut [u8], table: &Lut) -> usize {
    let n = src.len().min(dst.len() / 2);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= src.len(): the 16 bytes at src[i..] are in bounds (u8 loads
        // need no alignment).
        let codes = unsafe { vld1q_u8(src.as_ptr().add(i)) };
        let (lo, hi) = table.look(codes);
        // SAFETY: 2 * (i + 16) <= 2 * n <= dst.len(): the 32 bytes at dst[2 * i..] are in
        // bounds. The interleaving store writes lo0 hi0 lo1 hi1 ...: little-endian u16s.
        unsafe { vst2q_u8(dst.as_mut_ptr().add(2 * i), uint8x16x2_t(lo, hi)) };
        i += 16;
    }
    i
}

/// The f32 bits of 16 codes from the low and high bytes of their f32's high halves.
#[target_feature(enable = "neon")]
#[inline]
fn widen(lo: uint8x16_t, hi: uint8x16_t) -> [uint32x4_t; 4] {
    let first = vreinterpretq_u16_u8(vzip1q_u8(lo, hi));
    let second = vreinterpretq_u16_u8(vzip2q_u8(lo, hi));
    [
        vshll_n_u16::<16>(vget_low_u16(first)),
        vshll_high_n_u16::<16>(first),
        vshll_n_u16::<16>(vget_low_u16(second)),
        vshll_high_n_u16::<16>(second),
    ]
}

/// 16 codes decoded (by the constant table `dec`) and multiplied by `kv` in f32.
#[target_feature(enable = "neon")]
#[inline]
fn scaled(dec: &Lut, codes: uint8x16_t, kv: float32x4_t) -> [float32x4_t; 4] {
    let (lo, hi) = dec.look(codes);
    // A NaN code keeps its NaN through the multiply (the first operand's, with a NaN `k` too).
    widen(lo, hi).map(|w| vmulq_f32(vreinterpretq_f32_u32(w), kv))
}

/// Codes of `src` times `k`, rounded to bf16 or f16, into `dst`, 16 at a time (any `k`);
/// returns how many it did.
#[target_feature(enable = "neon")]
fn computed_half(src: &[u8], src_t: DType, dst: &mut [u8], dst_t: DType, k: f32) -> usize {
    let n = src.len().min(dst.len() / 2);
    let dec = Lut::new(unscaled(src_t, DType::F32));
    let kv = vdupq_n_f32(k);
    let bf = dst_t == DType::BF16;
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= src.len(): the 16 bytes at src[i..] are in bounds.
        let codes = unsafe { vld1q_u8(src.as_ptr().add(i)) };
        let [a, b, c, d] = scaled(&dec, codes, kv);
        let (first, second) = if bf {
            let u = vreinterpretq_u32_f32;
            (bf16x8(u(a), u(b)), bf16x8(u(c), u(d)))
        } else {
            (f16x8(a, b), f16x8(c, d))
        };
        // SAFETY: 2 * (i + 16) <= 2 * n <= dst.len(): the 32 bytes at dst[2 * i..] are in
        // bounds; byte stores need no alignment.
        unsafe {
            let p = dst.as_mut_ptr().add(2 * i);
            vst1q_u8(p, vreinterpretq_u8_u16(first));
            vst1q_u8(p.add(16), vreinterpretq_u8_u16(second));
        }
        i += 16;
    }
    i
}

/// fp8 codes of `src` (times `k` when given) into the f32 `dst`, four bytes per code.
#[target_feature(enable = "neon")]
pub(super) fn fp8_to_f32(src: &[u8], src_t: DType, dst: &mut [u8], k: Option<f32>) {
    f32_run(src, src_t, dst, k, &Lut::new(unscaled(src_t, DType::F32)));
}

/// [`fp8_to_f32`] with the decoding table given (`unscaled(src_t, F32)`'s).
#[target_feature(enable = "neon")]
fn f32_run(src: &[u8], src_t: DType, dst: &mut [u8], k: Option<f32>, dec: &Lut) {
    let n = src.len().min(dst.len() / 4);
    let zero = vdupq_n_u8(0);
    let kv = vdupq_n_f32(k.unwrap_or(1.0));
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= src.len(): the 16 bytes at src[i..] are in bounds.
        let codes = unsafe { vld1q_u8(src.as_ptr().add(i)) };
        // SAFETY (both arms): 4 * (i + 16) <= 4 * n <= dst.len(): the 64 bytes at dst[4 * i..]
        // are in bounds; byte stores need no alignment.
        match k {
            None => {
                // Each f32 is two zero bytes and its high half: one four-way interleaving store.
                let (lo, hi) = dec.look(codes);
                let bytes = uint8x16x4_t(zero, zero, lo, hi);
                // SAFETY: see above.
                unsafe { vst4q_u8(dst.as_mut_ptr().add(4 * i), bytes) };
            }
            Some(_) => {
                let v = scaled(dec, codes, kv);
                for (j, x) in v.into_iter().enumerate() {
                    // SAFETY: see above; this is bytes 16 j..16 j + 16 of the 64.
                    unsafe {
                        vst1q_u8(
                            dst.as_mut_ptr().add(4 * i + 16 * j),
                            vreinterpretq_u8_f32(x),
                        )
                    };
                }
            }
        }
        i += 16;
    }
    for (c, d) in src[i..n].iter().zip(dst[4 * i..].chunks_exact_mut(4)) {
        let w = fp8_bits(*c, src_t);
        let w = k.map_or(w, |k| (f32::from_bits(w) * k).to_bits());
        d.copy_from_slice(&w.to_le_bytes());
    }
}

/// Whole rows `first_row..` of an fp8 expansion to bf16, f16 or f32 with `block` x `block`
/// scales (`scales` row-major over the tile grid, as `Scale::Block`). A tile's 128 results
/// serve `block` rows, so to a 16-bit destination each block row builds one table per tile
/// (for the symmetric scales) that all its rows look their segments up in.
///
/// # Safety
/// The CPU must have NEON.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "neon")]
pub(crate) unsafe fn fp8_blocks(
    src: &[u8],
    src_t: DType,
    dst: &mut [u8],
    dst_t: DType,
    cols: usize,
    first_row: usize,
    scales: &[f32],
    block: usize,
) {
    if cols == 0 || block == 0 {
        return;
    }
    let ds = dst_t.size();
    // A table serves block x block codes; tiny tiles compute instead.
    let tabled = ds == 2 && block * block >= TABLE_MIN;
    let tiles = cols.div_ceil(block);
    let dec = Lut::new(unscaled(src_t, DType::F32));
    let mut tables: Vec<Option<Lut>> = Vec::new();
    let mut tables_of = usize::MAX;
    let rows = src.chunks_exact(cols).zip(dst.chunks_exact_mut(cols * ds));
    for (i, (s, d)) in rows.enumerate() {
        let block_row = (first_row + i) / block;
        let ks = &scales[block_row * tiles..][..tiles];
        if tabled && block_row != tables_of {
            tables = ks
                .iter()
                .map(|&k| symmetric(src_t, k).then(|| scaled_table(src_t, dst_t, k)))
                .collect();
            tables_of = block_row;
        }
        let segments = s.chunks(block).zip(d.chunks_mut(block * ds));
        for (j, ((s, d), &k)) in segments.zip(ks).enumerate() {
            if ds == 4 {
                f32_run(s, src_t, d, Some(k), &dec);
            } else {
                let table = tables.get(j).and_then(Option::as_ref);
                half_run(s, src_t, d, dst_t, Some(k), table);
            }
        }
    }
}

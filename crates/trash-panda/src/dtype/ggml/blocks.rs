//! The GGML block decoders the kernels run: one block to f32, laid out so that LLVM vectorizes
//! each inner loop (fixed lengths, constant shifts, one scale per run of 16 or 32 elements). They
//! compute the reference's f32 operations in its order (a product, then a separate sum or
//! difference; never a fused multiply-add), so every level gives the reference's bits.

use super::super::half::f16_to_f32_bits_bf;
use super::super::DType;
use super::reference::{k_scale_min, q3k_scale};

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f32::from_bits(f16_to_f32_bits_bf(u16::from_le_bytes([b[at], b[at + 1]])))
}

#[inline(always)]
fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let (qs, out) = (&b[2..34], &mut out[..32]);
    for (o, q) in out.iter_mut().zip(qs) {
        *o = f32::from(*q as i8) * d;
    }
}

#[inline(always)]
fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let (qs, (lo, hi)) = (&b[2..18], out[..32].split_at_mut(16));
    for ((l, h), q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
        *l = d * f32::from((q & 0x0F) as i8 - 8);
        *h = d * f32::from((q >> 4) as i8 - 8);
    }
}

#[inline(always)]
fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let (qs, (lo, hi)) = (&b[4..20], out[..32].split_at_mut(16));
    for ((l, h), q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
        *l = d * f32::from(q & 0x0F) + m;
        *h = d * f32::from(q >> 4) + m;
    }
}

/// The 32 five-bit codes of a Q5_0 or Q5_1 block (`qh` the high bits, `qs` the low nibbles).
#[inline(always)]
fn five_bit_codes(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    let (lo, hi) = q.split_at_mut(16);
    for (j, ((l, h), s)) in lo.iter_mut().zip(hi.iter_mut()).zip(&qs[..16]).enumerate() {
        *l = (s & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        *h = (s >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

#[inline(always)]
fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let q = five_bit_codes(u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &b[6..22]);
    for (o, q) in out[..32].iter_mut().zip(q) {
        *o = d * f32::from(q as i8 - 16);
    }
}

#[inline(always)]
fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let q = five_bit_codes(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24]);
    for (o, q) in out[..32].iter_mut().zip(q) {
        *o = d * f32::from(q) + m;
    }
}

#[inline(always)]
fn q2_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for half in 0..2 {
        let qs = &b[16 + half * 32..][..32];
        for shift in 0..4 {
            let base = half * 128 + shift * 32;
            for sub in 0..2 {
                let sc = b[(base + sub * 16) / 16];
                let dl = d * f32::from(sc & 0x0F);
                let ml = dmin * f32::from(sc >> 4);
                let o = &mut out[base + sub * 16..][..16];
                for (o, q) in o.iter_mut().zip(&qs[sub * 16..][..16]) {
                    *o = dl * f32::from((q >> (2 * shift)) & 3) - ml;
                }
            }
        }
    }
}

#[inline(always)]
fn q3_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 108);
    let (hmask, scales) = (&b[..32], &b[96..108]);
    for half in 0..2 {
        let qs = &b[32 + half * 32..][..32];
        for shift in 0..4 {
            let base = half * 128 + shift * 32;
            let bit = base / 32;
            for sub in 0..2 {
                let dl = d * f32::from(q3k_scale(scales, (base + sub * 16) / 16));
                let o = &mut out[base + sub * 16..][..16];
                let (q, h) = (&qs[sub * 16..][..16], &hmask[sub * 16..][..16]);
                for ((o, q), h) in o.iter_mut().zip(q).zip(h) {
                    let low = ((q >> (2 * shift)) & 3) as i8;
                    let minus = (((h >> bit) & 1) ^ 1) as i8 * 4;
                    *o = dl * f32::from(low - minus);
                }
            }
        }
    }
}

/// Q4_K, and Q5_K when `qh` gives the fifth bits.
#[inline(always)]
fn q45_k(b: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for chunk in 0..4 {
        let q = &qs[chunk * 32..][..32];
        for nib in 0..2 {
            let g = chunk * 2 + nib;
            let (sc, m) = k_scale_min(scales, g);
            let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
            let o = &mut out[g * 32..][..32];
            match qh {
                None => {
                    for (o, q) in o.iter_mut().zip(q) {
                        *o = dl * f32::from((q >> (4 * nib)) & 0x0F) - ml;
                    }
                }
                Some(qh) => {
                    for ((o, q), h) in o.iter_mut().zip(q).zip(&qh[..32]) {
                        let v = ((q >> (4 * nib)) & 0x0F) | (((h >> g) & 1) << 4);
                        *o = dl * f32::from(v) - ml;
                    }
                }
            }
        }
    }
}

#[inline(always)]
fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let (ql, qh) = (&b[half * 64..][..64], &b[128 + half * 32..][..32]);
        for s in 0..4 {
            let base = half * 128 + s * 32;
            let (nib, k0) = (s / 2, (s % 2) * 32);
            for sub in 0..2 {
                let dl = d * f32::from(b[192 + (base + sub * 16) / 16] as i8);
                let o = &mut out[base + sub * 16..][..16];
                let low = &ql[k0 + sub * 16..][..16];
                let high = &qh[sub * 16..][..16];
                for ((o, l), h) in o.iter_mut().zip(low).zip(high) {
                    let v = ((l >> (4 * nib)) & 0x0F) | (((h >> (2 * s)) & 3) << 4);
                    *o = dl * f32::from(v as i8 - 32);
                }
            }
        }
    }
}

/// Decodes the whole blocks of `src` (of the block type `dtype`) into `out`, which holds exactly
/// their elements. The caller has checked both lengths.
#[inline(always)]
pub(crate) fn decode(src: &[u8], dtype: DType, out: &mut [f32]) {
    let (bs, n) = (dtype.size(), dtype.block_elems());
    let blocks = src.chunks_exact(bs).zip(out.chunks_exact_mut(n));
    match dtype {
        DType::Q8_0 => blocks.for_each(|(b, o)| q8_0(b, o)),
        DType::Q4_0 => blocks.for_each(|(b, o)| q4_0(b, o)),
        DType::Q4_1 => blocks.for_each(|(b, o)| q4_1(b, o)),
        DType::Q5_0 => blocks.for_each(|(b, o)| q5_0(b, o)),
        DType::Q5_1 => blocks.for_each(|(b, o)| q5_1(b, o)),
        DType::Q2K => blocks.for_each(|(b, o)| q2_k(b, o)),
        DType::Q3K => blocks.for_each(|(b, o)| q3_k(b, o)),
        DType::Q4K => blocks.for_each(|(b, o)| q45_k(b, None, &b[16..144], o)),
        DType::Q5K => blocks.for_each(|(b, o)| q45_k(b, Some(&b[16..48]), &b[48..176], o)),
        DType::Q6K => blocks.for_each(|(b, o)| q6_k(b, o)),
        // Unreachable after validation; zeros rather than a panic keep the kernels total.
        _ => out.fill(0.0),
    }
}

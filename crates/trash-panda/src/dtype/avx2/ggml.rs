//! GGML blocks -> bf16, f16 or f32 in one pass: codes widened eight at a time from memory
//! (`vpmovzxbd`), shifted and masked in 32-bit lanes, converted, multiplied by the group's
//! f32 scale and, for the types with a minimum, the product then added to or reduced by it in
//! a second operation (never fused: the reference rounds twice), then rounded and stored
//! sixteen at a time.
//!
//! The generic path decodes a block into an f32 buffer and rounds the buffer: two loops, and
//! about half of memcpy on one core of this Xeon. A block whose f16 scales hold an infinity or a
//! NaN (no real file has one) goes that way, so the vector path never meets a NaN.

use core::arch::x86_64::*;

use super::primitives::{pack_16, prefetch_l2, round_bf16};
use super::{store, Stores};
use crate::dtype::ggml::reference::scale_fields;
use crate::dtype::half::f16_to_f32_bits_bf;
use crate::dtype::DType;

/// The destination's encoding.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    Bf16,
    F16,
    F32,
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f32::from_bits(f16_to_f32_bits_bf(u16::from_le_bytes([b[at], b[at + 1]])))
}

/// Whether every f16 field of the block is finite.
fn finite_scales(b: &[u8], t: DType) -> bool {
    scale_fields(t).iter().all(|&at| b[at + 1] & 0x7C != 0x7C)
}

/// Eight bytes at `b[at..]` widened to 32-bit lanes (zero-extended).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn u8x8(b: &[u8], at: usize) -> __m256i {
    let s = &b[at..at + 8];
    // SAFETY: `s` holds the 8 bytes read; loadl has no alignment requirement.
    _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(s.as_ptr().cast()) })
}

/// `(v >> shift) & mask` in each 32-bit lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bits(v: __m256i, shift: u32, mask: i32) -> __m256i {
    let s = _mm_cvtsi32_si128(shift as i32);
    _mm256_and_si256(_mm256_srl_epi32(v, s), _mm256_set1_epi32(mask))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn float(v: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(v)
}

/// Writes 16 values (`a` then `b`) at `dst[at * size..]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn put16(dst: &mut [u8], at: usize, a: __m256, b: __m256, out: Out, stores: Stores) {
    match out {
        Out::Bf16 | Out::F16 => {
            let d = &mut dst[at * 2..at * 2 + 32];
            let v = if out == Out::Bf16 {
                pack_16(
                    round_bf16(_mm256_castps_si256(a)),
                    round_bf16(_mm256_castps_si256(b)),
                )
            } else {
                let lo = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(a);
                let hi = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(b);
                _mm256_set_m128i(hi, lo)
            };
            // SAFETY: `d` is the 32 bytes written; when streaming, the caller aligned `dst`
            // to 32 bytes and `at` is a multiple of 16.
            unsafe { store(d.as_mut_ptr(), v, stores) };
        }
        Out::F32 => {
            let d = &mut dst[at * 4..at * 4 + 64];
            // SAFETY: as above, for the 64 bytes written.
            unsafe {
                store(d.as_mut_ptr(), _mm256_castps_si256(a), stores);
                store(d.as_mut_ptr().add(32), _mm256_castps_si256(b), stores);
            }
        }
    }
}

/// Dequantizes the whole blocks of `src` (block type `t`) into `dst` (`dst_t` bf16, f16 or
/// f32, exactly their elements), calling `fallback` for a block with a non-finite scale.
/// Returns false, writing nothing, for a type this file has no kernel for.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dequantize(
    src: &[u8],
    t: DType,
    dst: &mut [u8],
    dst_t: DType,
    stores: Stores,
    fallback: &dyn Fn(&[u8], &mut [u8]),
) -> bool {
    let out = match dst_t {
        DType::BF16 => Out::Bf16,
        DType::F16 => Out::F16,
        DType::F32 => Out::F32,
        _ => return false,
    };
    if !t.is_block() {
        return false;
    }
    // Streaming stores need 32-byte aligned destinations; every block's output is a multiple
    // of 32 bytes, so an aligned start keeps every store aligned.
    let stores = if (dst.as_ptr() as usize).is_multiple_of(32) {
        stores
    } else {
        Stores::Cached
    };
    let (bs, per, ds) = (t.size(), t.block_elems(), dst_t.size());
    let blocks = src.chunks_exact(bs).zip(dst.chunks_exact_mut(per * ds));
    for (i, (b, d)) in blocks.enumerate() {
        prefetch_l2(src, i * bs);
        if !finite_scales(b, t) {
            fallback(b, d);
            continue;
        }
        match t {
            DType::Q8_0 => q8_0(b, d, out, stores),
            DType::Q4_0 | DType::Q4_1 => q4(b, t == DType::Q4_1, d, out, stores),
            DType::Q5_0 | DType::Q5_1 => q5(b, t == DType::Q5_1, d, out, stores),
            DType::Q2K => q2_k(b, d, out, stores),
            DType::Q3K => q3_k(b, d, out, stores),
            DType::Q4K | DType::Q5K => q45_k(b, t == DType::Q5K, d, out, stores),
            _ => q6_k(b, d, out, stores),
        }
    }
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0(b: &[u8], d: &mut [u8], out: Out, stores: Stores) {
    let k = _mm256_set1_ps(f16_at(b, 0));
    for half in 0..2 {
        let at = 2 + half * 16;
        // SAFETY: bytes at..at + 16 of the 34-byte block, 8 per load.
        let (lo, hi) = unsafe {
            (
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(b[at..at + 8].as_ptr().cast())),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(b[at + 8..at + 16].as_ptr().cast())),
            )
        };
        let (x, y) = (_mm256_mul_ps(float(lo), k), _mm256_mul_ps(float(hi), k));
        put16(d, half * 16, x, y, out, stores);
    }
}

/// Q4_0 (codes offset by 8) and, with `min`, Q4_1 (`d * q + m`).
#[target_feature(enable = "avx2,fma,f16c")]
fn q4(b: &[u8], min: bool, d: &mut [u8], out: Out, stores: Stores) {
    let k = _mm256_set1_ps(f16_at(b, 0));
    let (qs, m) = if min { (4, f16_at(b, 2)) } else { (2, 0.0) };
    let m = _mm256_set1_ps(m);
    let value = |c: __m256i| {
        if min {
            _mm256_add_ps(_mm256_mul_ps(float(c), k), m)
        } else {
            _mm256_mul_ps(float(_mm256_sub_epi32(c, _mm256_set1_epi32(8))), k)
        }
    };
    let (c0, c1) = (u8x8(b, qs), u8x8(b, qs + 8));
    put16(
        d,
        0,
        value(bits(c0, 0, 15)),
        value(bits(c1, 0, 15)),
        out,
        stores,
    );
    put16(
        d,
        16,
        value(bits(c0, 4, 15)),
        value(bits(c1, 4, 15)),
        out,
        stores,
    );
}

/// Q5_0 (codes offset by 16) and, with `min`, Q5_1 (`d * q + m`).
#[target_feature(enable = "avx2,fma,f16c")]
fn q5(b: &[u8], min: bool, d: &mut [u8], out: Out, stores: Stores) {
    let k = _mm256_set1_ps(f16_at(b, 0));
    let (h, qs, m) = if min {
        (4, 8, f16_at(b, 2))
    } else {
        (2, 6, 0.0)
    };
    let m = _mm256_set1_ps(m);
    let qh = _mm256_set1_epi32(i32::from_le_bytes([b[h], b[h + 1], b[h + 2], b[h + 3]]));
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    // The fifth bits of elements first..first + 8, at bit 4.
    let high = |first: i32| {
        let s = _mm256_add_epi32(lanes, _mm256_set1_epi32(first));
        let bit = _mm256_and_si256(_mm256_srlv_epi32(qh, s), _mm256_set1_epi32(1));
        _mm256_slli_epi32(bit, 4)
    };
    let value = |c: __m256i| {
        if min {
            _mm256_add_ps(_mm256_mul_ps(float(c), k), m)
        } else {
            _mm256_mul_ps(float(_mm256_sub_epi32(c, _mm256_set1_epi32(16))), k)
        }
    };
    let (c0, c1) = (u8x8(b, qs), u8x8(b, qs + 8));
    let (l0, l1) = (
        _mm256_or_si256(bits(c0, 0, 15), high(0)),
        _mm256_or_si256(bits(c1, 0, 15), high(8)),
    );
    put16(d, 0, value(l0), value(l1), out, stores);
    let (h0, h1) = (
        _mm256_or_si256(bits(c0, 4, 15), high(16)),
        _mm256_or_si256(bits(c1, 4, 15), high(24)),
    );
    put16(d, 16, value(h0), value(h1), out, stores);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q2_k(b: &[u8], d: &mut [u8], out: Out, stores: Stores) {
    let (dd, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for half in 0..2 {
        for shift in 0..4u32 {
            for sub in 0..2 {
                let first = half * 128 + shift as usize * 32 + sub * 16;
                let sc = b[first / 16];
                let dl = _mm256_set1_ps(dd * f32::from(sc & 0x0F));
                let ml = _mm256_set1_ps(dmin * f32::from(sc >> 4));
                let at = 16 + half * 32 + sub * 16;
                let v =
                    |c: __m256i| _mm256_sub_ps(_mm256_mul_ps(float(bits(c, 2 * shift, 3)), dl), ml);
                put16(d, first, v(u8x8(b, at)), v(u8x8(b, at + 8)), out, stores);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q3_k(b: &[u8], d: &mut [u8], out: Out, stores: Stores) {
    let dd = f16_at(b, 108);
    let scales = &b[96..108];
    for half in 0..2 {
        for shift in 0..4u32 {
            let bit = (half * 4) as u32 + shift;
            for sub in 0..2 {
                let first = half * 128 + shift as usize * 32 + sub * 16;
                let sc = crate::dtype::ggml::reference::q3k_scale(scales, first / 16);
                let dl = _mm256_set1_ps(dd * f32::from(sc));
                let (at, hm) = (32 + half * 32 + sub * 16, sub * 16);
                let v = |c: __m256i, h: __m256i| {
                    let low = bits(c, 2 * shift, 3);
                    // A clear mask bit subtracts 4.
                    let minus = _mm256_slli_epi32(
                        _mm256_xor_si256(bits(h, bit, 1), _mm256_set1_epi32(1)),
                        2,
                    );
                    _mm256_mul_ps(float(_mm256_sub_epi32(low, minus)), dl)
                };
                let x = v(u8x8(b, at), u8x8(b, hm));
                let y = v(u8x8(b, at + 8), u8x8(b, hm + 8));
                put16(d, first, x, y, out, stores);
            }
        }
    }
}

/// Q4_K and, with `fifth`, Q5_K (whose fifth bits lie in bytes 16..48).
#[target_feature(enable = "avx2,fma,f16c")]
fn q45_k(b: &[u8], fifth: bool, d: &mut [u8], out: Out, stores: Stores) {
    let (dd, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let qs = if fifth { 48 } else { 16 };
    for chunk in 0..4 {
        for nib in 0..2u32 {
            let g = chunk * 2 + nib as usize;
            let (sc, m) = crate::dtype::ggml::reference::k_scale_min(&b[4..16], g);
            let dl = _mm256_set1_ps(dd * f32::from(sc));
            let ml = _mm256_set1_ps(dmin * f32::from(m));
            for part in 0..2 {
                let mut c = [_mm256_setzero_si256(); 2];
                for (j, c) in c.iter_mut().enumerate() {
                    let l = part * 16 + j * 8;
                    *c = bits(u8x8(b, qs + chunk * 32 + l), 4 * nib, 15);
                    if fifth {
                        let h = bits(u8x8(b, 16 + l), g as u32, 1);
                        *c = _mm256_or_si256(*c, _mm256_slli_epi32(h, 4));
                    }
                }
                let v = |c: __m256i| _mm256_sub_ps(_mm256_mul_ps(float(c), dl), ml);
                put16(d, g * 32 + part * 16, v(c[0]), v(c[1]), out, stores);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k(b: &[u8], d: &mut [u8], out: Out, stores: Stores) {
    let dd = f16_at(b, 208);
    for half in 0..2 {
        for s in 0..4u32 {
            let (nib, k0) = (4 * (s / 2), (s as usize % 2) * 32);
            for sub in 0..2 {
                let first = half * 128 + s as usize * 32 + sub * 16;
                let dl = _mm256_set1_ps(dd * f32::from(b[192 + first / 16] as i8));
                let v = |j: usize| {
                    let low = bits(u8x8(b, half * 64 + k0 + sub * 16 + j), nib, 15);
                    let high = bits(u8x8(b, 128 + half * 32 + sub * 16 + j), 2 * s, 3);
                    let q = _mm256_or_si256(low, _mm256_slli_epi32(high, 4));
                    _mm256_mul_ps(float(_mm256_sub_epi32(q, _mm256_set1_epi32(32))), dl)
                };
                put16(d, first, v(0), v(8), out, stores);
            }
        }
    }
}

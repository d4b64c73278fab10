//! f32 -> bf16 and f16 without a scale: pure streaming kernels.
//!
//! The autovectorized loop reaches about a third of memcpy on AVX2: it is bound by the vector
//! ports (the NaN select costs as much as the rounding). Here eight values round in five integer
//! operations, two registers narrow with one saturating pack and one lane-fixing permute, and
//! NaNs (which real tensors hardly hold) are found by one compare per sixteen values and sent to
//! the scalar code.

use core::arch::x86_64::*;

use super::primitives::{pack_16, prefetch_l2, round_bf16};
use super::{store, Stores};
use crate::dtype::half::{f32_bits_to_bf16_bf, f32_bits_to_f16_bf};

/// The f32 values of `src` (four bytes each) to bf16 in `dst` (two bytes each), as
/// `f32_bits_to_bf16_bf` rounds them.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn f32_to_bf16(src: &[u8], dst: &mut [u8], stores: Stores) {
    let n = (src.len() / 4).min(dst.len() / 2);
    let (head, stores) = stores.head(dst.as_ptr(), 2, n);
    scalar(&src[..4 * head], &mut dst[..2 * head]);
    let mut i = head;
    while i + 16 <= n {
        prefetch_l2(src, 4 * i);
        // SAFETY: 4 * (i + 16) <= 4 * n <= src.len(): the 64 bytes at src[4 * i..] are in
        // bounds; loadu has no alignment requirement.
        let (a, b) = unsafe {
            let p = src.as_ptr().add(4 * i);
            (
                _mm256_loadu_si256(p.cast()),
                _mm256_loadu_si256(p.add(32).cast()),
            )
        };
        let (fa, fb) = (_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
        // Unordered is true where either operand is NaN: one compare checks both registers.
        if _mm256_movemask_ps(_mm256_cmp_ps(fa, fb, _CMP_UNORD_Q)) != 0 {
            // A NaN (rare): these 16 go the scalar way, which gives `0x7FC0 | sign`.
            scalar(&src[4 * i..4 * i + 64], &mut dst[2 * i..2 * i + 32]);
            i += 16;
            continue;
        }
        let v = pack_16(round_bf16(a), round_bf16(b));
        // SAFETY: 2 * (i + 16) <= 2 * n <= dst.len(): the 32 bytes at dst[2 * i..] are in
        // bounds, and 32-byte aligned when streaming (`head` aligned them: dst + 2 * head is,
        // and every step adds 32).
        unsafe { store(dst.as_mut_ptr().add(2 * i), v, stores) };
        i += 16;
    }
    scalar(&src[4 * i..4 * n], &mut dst[2 * i..2 * n]);
}

/// The f32 values of `src` to f16 in `dst`, by the F16C conversion with its rounding set to
/// nearest even in the instruction: the same bits as `f32_bits_to_f16_bf` (overflow to
/// infinity, f16 subnormals rounded once, a NaN quieted with its top payload bits kept), where
/// the generic loop's variable shifts for the subnormals run at a few percent of memcpy.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f32_to_f16(src: &[u8], dst: &mut [u8], stores: Stores) {
    let n = (src.len() / 4).min(dst.len() / 2);
    let (head, stores) = stores.head(dst.as_ptr(), 2, n);
    scalar_f16(&src[..4 * head], &mut dst[..2 * head]);
    let mut i = head;
    while i + 16 <= n {
        prefetch_l2(src, 4 * i);
        // SAFETY: 4 * (i + 16) <= 4 * n <= src.len(): the 64 bytes at src[4 * i..] are in
        // bounds; loadu has no alignment requirement.
        let (a, b) = unsafe {
            let p = src.as_ptr().add(4 * i);
            (_mm256_loadu_ps(p.cast()), _mm256_loadu_ps(p.add(32).cast()))
        };
        let a = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(a);
        let b = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(b);
        // SAFETY: 2 * (i + 16) <= 2 * n <= dst.len(): the 32 bytes at dst[2 * i..] are in
        // bounds, and aligned when streaming (as in `f32_to_bf16`).
        unsafe { store(dst.as_mut_ptr().add(2 * i), _mm256_set_m128i(b, a), stores) };
        i += 16;
    }
    scalar_f16(&src[4 * i..4 * n], &mut dst[2 * i..2 * n]);
}

fn scalar_f16(src: &[u8], dst: &mut [u8]) {
    for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(2)) {
        let w = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        d.copy_from_slice(&f32_bits_to_f16_bf(w).to_le_bytes());
    }
}

fn scalar(src: &[u8], dst: &mut [u8]) {
    for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(2)) {
        let w = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        d.copy_from_slice(&f32_bits_to_bf16_bf(w).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{f32_to_bf16_bits, f32_to_f16_bits, SimdLevel};

    #[test]
    fn f32_to_16_bits_equals_the_reference() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        // Every exponent and sign with the rounding-relevant low bits varied (ties, just above
        // and below, the carry into the exponent), NaNs with payloads and the infinities.
        let mut pats: Vec<u32> = Vec::new();
        // (The f16 edges, overflow at 65520 and the subnormals, sit among these exponents.)
        for hi in 0..=0x1FFu32 {
            for lo in [
                0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1_0000, 0x1_7FFF, 0x1_8000, 0x7F_FFFF,
            ] {
                pats.push((hi << 23) | lo);
            }
        }
        pats.extend([
            0x7F80_0001,
            0xFFC0_0000,
            0x7FFF_FFFF,
            0xFF80_0000,
            0x7F7F_FFFF,
        ]);
        // A stretch without NaNs, so whole vectors take the fast path.
        pats.extend((0..100u32).map(|i| (i * 0x0123_4567) & 0xBF7F_FFFF));
        let mut x = 0x2545_F491u32;
        pats.extend((0..5000).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        }));
        let src: Vec<u8> = pats.iter().flat_map(|w| w.to_le_bytes()).collect();
        for stores in [Stores::Cached, Stores::Streaming] {
            // Offsets 0..4 of the output move the aligned head and the tail.
            for off in [0usize, 1, 2, 6] {
                let mut buf = vec![0u8; pats.len() * 2 + 64];
                let dst = &mut buf[off..off + pats.len() * 2];
                // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
                unsafe { f32_to_bf16(&src, dst, stores) };
                for (w, g) in pats.iter().zip(dst.chunks_exact(2)) {
                    let want = f32_to_bf16_bits(f32::from_bits(*w));
                    let g = u16::from_le_bytes([g[0], g[1]]);
                    assert_eq!(g, want, "bf16 {w:#010x} {stores:?} offset {off}");
                }
                // SAFETY: as above.
                unsafe { f32_to_f16(&src, dst, stores) };
                for (w, g) in pats.iter().zip(dst.chunks_exact(2)) {
                    let want = f32_to_f16_bits(f32::from_bits(*w));
                    let g = u16::from_le_bytes([g[0], g[1]]);
                    assert_eq!(g, want, "f16 {w:#010x} {stores:?} offset {off}");
                }
            }
        }
    }
}

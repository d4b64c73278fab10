//! The small vector steps the hand-written x86-64 kernels share: rounding f32 patterns to
//! bf16, packing two registers of 16-bit results in element order, and prefetching the source
//! ahead of the loads. Each kernel file builds on these; none of them reaches back.

use core::arch::x86_64::*;

/// Eight f32 patterns rounded to nearest even bf16 in the low half of each 32-bit lane, as
/// `f32_bits_to_bf16_bf` rounds them; NaNs are not handled (their lanes hold garbage).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn round_bf16(w: __m256i) -> __m256i {
    let lsb = _mm256_and_si256(_mm256_srli_epi32(w, 16), _mm256_set1_epi32(1));
    let bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
    // Below a NaN's pattern the sum cannot pass 0xFFFF_FFFF, so the shift is exact.
    _mm256_srli_epi32(_mm256_add_epi32(w, bias), 16)
}

/// Packs the 16-bit results in the low halves of `a` (elements 0-7) and `b` (8-15) into one
/// register in element order.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn pack_16(a: __m256i, b: __m256i) -> __m256i {
    // Every lane is below 0x1_0000, so the unsigned-saturating pack is exact; it interleaves
    // 128-bit halves (a0 b0 a1 b1), which the 64-bit permute puts back in order.
    _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0b11_01_10_00)
}

/// How far ahead of their loads the hand-written loops prefetch their source, in bytes.
///
/// On a Xeon KVM guest (BENCHMARK.md's AVX2 kernels) one core's demand loads and the hardware prefetcher
/// read about 7 GB/s, which held f32 -> bf16 at 0.30-0.34x memcpy; software prefetches 2-4 KiB
/// ahead (one per 64-byte line) brought it to 0.45-0.51x; 8 KiB ahead into L1 fell back (see
/// BENCHMARK.md).
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Asks for the source line `PREFETCH_AHEAD` bytes past `src[at]` in L1, for the fp8 table
/// loops, which read half as many bytes as they write (a hint: past the end of `src` it is
/// dropped without a fault, and the address is never dereferenced).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn prefetch(src: &[u8], at: usize) {
    // `wrapping_add`: the address may lie past the slice, where `add` would be undefined.
    let p = src.as_ptr().wrapping_add(at + PREFETCH_AHEAD);
    // A prefetch never faults and reads nothing into the program: any address will do (the
    // intrinsic is safe inside this AVX2 function).
    _mm_prefetch::<_MM_HINT_T0>(p.cast());
}

/// As [`prefetch`], into L2, for the loops bound by their reads (f32 -> bf16 and f16 read two
/// bytes per byte written; the amax pass only reads).
///
/// A prefetch into L1 holds one of the core's few line fill buffers until its line arrives, so
/// only a dozen or so lines are on their way at once; into L2 it leaves them to the L2's
/// larger queue. On that Xeon this took f32 -> bf16 from 0.69-0.73x memcpy to
/// 0.83-0.86x and f32 -> f16 from 0.78-0.82x to 0.93-0.97x (one thread, 2026-12-03), above a
/// plain read of the source with L1 prefetches; the fp8 table loops went no faster with it.
/// AMD's cores before Zen 4 take the T1 hint as T0 (into L1), so there it is the prefetch it
/// replaced; Zen 4 places it in L2 as Intel does.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn prefetch_l2(src: &[u8], at: usize) {
    // As in `prefetch`: any address will do.
    let p = src.as_ptr().wrapping_add(at + PREFETCH_AHEAD);
    _mm_prefetch::<_MM_HINT_T1>(p.cast());
}

//! f16 -> e4m3fn by a per-scale table of one binade's codes, as `table` does for bf16 (see
//! there for why moving the exponent is exact). What f16 changes:
//!
//! - Ten mantissa bits: T has 1024 entries, described by sixteen runs of 64 (one e4m3 step is
//!   at least 1/16 of the value, a run spans under 1/16), a base and the position of the rise,
//!   which the build finds by binary search rather than by computing all of T.
//! - Five exponent bits and f16's own subnormals. The reference binade e_ref is the first whose
//!   quotients are all normal in e4m3, or f16's first binade when the scale is small enough
//!   that they all are (the usual case: a weight's `amax / 448` is around 1e-4); then the f16
//!   subnormals, whose codes are not shifts of T, and the zeros, which the shift would not
//!   send to 0, are looked at apart: a zero's code is forced to 0, a subnormal's block goes to
//!   the reciprocal code, as do the blocks with a value in the five binades under e_ref.
//! - Where those blocks are common the loop computes such lanes itself (512 times the quotient
//!   rounded to an integer, as for bf16, see `lanes`), but only when every value under e_ref has a quotient
//!   under 2^-5: with e_ref at f16's first binade and a small scale, a subnormal's is not.

use core::arch::x86_64::*;
use core::ops::RangeInclusive;

use super::lanes::{self, Lanes};
use super::reciprocal::{load_32, reciprocal_f16_block, Block, Reciprocal};
use super::table::{put, split_bytes, Table};
use super::{encode_e4m3, Half, Stores};

/// One scale's codes, as the loop uses them.
#[derive(Clone, Copy)]
pub(super) struct F16Table {
    /// T at the start of each run of 64 mantissas, both lanes.
    base: __m256i,
    /// For each run, the offset in it (0..62) after which T is one more, 63 if it does not.
    rise: __m256i,
    /// e_ref, the binade T is of: the first exponent field (1..=30) whose quotients are all
    /// normal in e4m3.
    e_ref: u8,
    /// Whether every value under binade e_ref has a quotient under 2^-5, so that the loop may
    /// compute their codes as an integer.
    pub(super) small_below: bool,
}

impl F16Table {
    /// The table for `k`, or `None` where it does not apply.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn new(k: f32) -> Option<F16Table> {
        // The f32 bits of 2^(e - 15), an f16 binade's first value.
        let edge = |e: u8| f32::from_bits((u32::from(e) + 112) << 23);
        let min_normal = f32::from_bits(0x3C80_0000);
        let e_ref = (1..=30).find(|&e| edge(e) / k >= min_normal)?;
        // The codes of eight mantissas (i32 lanes) of the binade e_ref, as the reference
        // divides.
        let kv = _mm256_set1_ps(k);
        let codes = |m: __m256i| {
            let x = _mm256_or_si256(
                _mm256_set1_epi32((i32::from(e_ref) + 112) << 23),
                _mm256_slli_epi32(m, 13),
            );
            encode_e4m3(_mm256_div_ps(_mm256_castsi256_ps(x), kv))
        };
        // Codes rise with the value, so each run's base and rise come from its first code, a
        // binary search for the last offset with that code, and its last code, which must be
        // at most one more (the claim the loop rests on): 16 divisions of eight values, where
        // the whole of T would take 128 (a weight's rows seldom share an f16 amax, so most
        // rows build their table).
        let (mut base, mut rise) = ([0u32; 16], [0u32; 16]);
        for (g, (base, rise)) in base
            .chunks_exact_mut(8)
            .zip(rise.chunks_exact_mut(8))
            .enumerate()
        {
            let g = 512 * g as i32;
            let starts = _mm256_setr_epi32(
                g,
                g + 64,
                g + 128,
                g + 192,
                g + 256,
                g + 320,
                g + 384,
                g + 448,
            );
            let first = codes(starts);
            let mut j = _mm256_setzero_si256();
            for step in [32, 16, 8, 4, 2, 1] {
                let cand = _mm256_add_epi32(j, _mm256_set1_epi32(step));
                let same = _mm256_cmpeq_epi32(codes(_mm256_add_epi32(starts, cand)), first);
                j = _mm256_blendv_epi8(j, cand, same);
            }
            let last = codes(_mm256_add_epi32(starts, _mm256_set1_epi32(63)));
            let ok = _mm256_cmpgt_epi32(_mm256_add_epi32(first, _mm256_set1_epi32(2)), last);
            if _mm256_movemask_epi8(ok) != -1 {
                return None;
            }
            // SAFETY: `base` and `rise` are eight u32s each, the 32 bytes each store writes.
            unsafe {
                _mm256_storeu_si256(base.as_mut_ptr().cast(), first);
                _mm256_storeu_si256(rise.as_mut_ptr().cast(), j);
            }
        }
        // Codes are at most 0x7E and offsets at most 63: bytes.
        let base = base.map(|c| c as u8);
        let rise = rise.map(|j| j as u8);
        // SAFETY: each array is 16 bytes, the size of the unaligned loads.
        let (base, rise) = unsafe {
            (
                _mm_loadu_si128(base.as_ptr().cast()),
                _mm_loadu_si128(rise.as_ptr().cast()),
            )
        };
        Some(F16Table {
            base: _mm256_broadcastsi128_si256(base),
            rise: _mm256_broadcastsi128_si256(rise),
            e_ref,
            // Quotients rise with the value, and every value under e_ref is under its edge.
            small_below: edge(e_ref) / k < f32::from_bits(0x3D00_0000),
        })
    }
}

impl F16Table {
    /// The magnitude patterns whose codes the loop computes beside the table: the nonzero
    /// values of the five binades under e_ref (f16's subnormals among them when e_ref is at
    /// most 5).
    pub(super) fn lane_patterns(&self) -> RangeInclusive<i32> {
        let e = i32::from(self.e_ref);
        ((e - 5).max(0) << 10).max(1)..=(e << 10) - 1
    }
}

impl Table for F16Table {
    fn limit(&self, _: Reciprocal) -> i16 {
        // Infinities (0x7C00) and NaNs are above it.
        0x7BFF
    }

    fn top_saturates(&self) -> bool {
        self.e_ref <= 31 - 22
    }

    unsafe fn lanes(&self, r: Reciprocal) -> Option<Lanes> {
        let patterns = self.lane_patterns();
        // SAFETY: the caller's contract.
        self.small_below
            .then(|| unsafe { Lanes::new(r, Half::F16, patterns) })
    }

    #[inline]
    unsafe fn reciprocal(&self, b: Block, r: Reciprocal) -> __m256i {
        // SAFETY: the caller's contract.
        unsafe { reciprocal_f16_block(b, r) }
    }

    #[inline]
    unsafe fn run<const STREAM: bool, const NAN: bool, const MIXED: bool, const PRODUCT: bool>(
        &self,
        src: &[u8],
        dst: &mut [u8],
        r: Reciprocal,
        m: f32,
        ahead: usize,
    ) -> usize {
        // SAFETY: the caller's contract.
        unsafe { table_run::<STREAM, NAN, MIXED, PRODUCT>(src, dst, self, r, m, ahead) }
    }
}

/// The table's blocks of 32 from the start of `src` until the end or a block it leaves to the
/// caller: with `NAN` one holding an infinity or a NaN, and unless `MIXED` one holding a value
/// under e_ref with a nonzero code (in the five binades under it, or an f16 subnormal when
/// e_ref is within five of f16's first binade), whose codes it otherwise computes (by one
/// product with `m` if `PRODUCT`). Returns how many values it wrote; out of line and call-free,
/// as the bf16 loop.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
fn table_run<const STREAM: bool, const NAN: bool, const MIXED: bool, const PRODUCT: bool>(
    src: &[u8],
    dst: &mut [u8],
    t: &F16Table,
    r: Reciprocal,
    m: f32,
    ahead: usize,
) -> usize {
    let n = (src.len() / 2).min(dst.len());
    let byte = |v: u8| _mm256_set1_epi8(v as i8);
    let stores = if STREAM {
        Stores::Streaming
    } else {
        Stores::Cached
    };
    // 4 * (e - e_ref + 6), clamped at 0, is e4 plus `up` less `down` (one of them is 0).
    let up = 4 * 6u8.saturating_sub(t.e_ref);
    let down = 4 * t.e_ref.saturating_sub(6);
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len().
        let (h0, h1) = unsafe { load_32(src, i, ahead) };
        // The low bytes (mantissa bits 0-7) and high bytes (sign, exponent, mantissa bits 8-9).
        let (lo, hi) = split_bytes(h0, h1);
        // Four times the exponent field.
        let e4 = _mm256_and_si256(hi, byte(0x7C));
        let zero = _mm256_cmpeq_epi8(
            _mm256_or_si256(lo, _mm256_and_si256(hi, byte(0x7F))),
            _mm256_setzero_si256(),
        );
        // Under e_ref by one to five binades (wrapping: e = 0 is among them when e_ref <= 5):
        // 4 * (e - e_ref + 5) in 0..=16, which less 128 are the signed bytes -128..=-112.
        let from_sub = _mm256_sub_epi8(e4, byte((4 * t.e_ref).wrapping_add(108)));
        let sub = _mm256_andnot_si256(zero, _mm256_cmpgt_epi8(byte(145), from_sub));
        let mut special = if MIXED { _mm256_setzero_si256() } else { sub };
        if NAN {
            special = _mm256_or_si256(special, _mm256_cmpeq_epi8(e4, byte(0x7C)));
        }
        if _mm256_movemask_epi8(special) != 0 {
            return i;
        }
        // 8 * (e - e_ref + 6), 0 under e_ref - 6, capped at 8 * 28 (saturated long before).
        let d4 = _mm256_subs_epu8(_mm256_adds_epu8(e4, byte(up)), byte(down));
        let d4 = _mm256_min_epu8(d4, byte(4 * 28));
        let d8 = _mm256_add_epi8(d4, d4);
        // The run: mantissa bits 6-9, from both bytes (the shifts' strays masked off).
        let run = _mm256_or_si256(
            _mm256_slli_epi16(_mm256_and_si256(hi, byte(3)), 2),
            _mm256_and_si256(_mm256_srli_epi16(lo, 6), byte(3)),
        );
        let rises = _mm256_cmpgt_epi8(
            _mm256_and_si256(lo, byte(63)),
            _mm256_shuffle_epi8(t.rise, run),
        );
        let tm = _mm256_sub_epi8(_mm256_shuffle_epi8(t.base, run), rises);
        // T + 8 * (e - e_ref), floored at 0 and saturated at 448 (T itself may be saturated
        // when e_ref is f16's first binade, hence the saturating add); zeros to 0.
        let code = _mm256_subs_epu8(_mm256_adds_epu8(d8, tm), byte(48));
        let mut code = _mm256_andnot_si256(zero, _mm256_min_epu8(code, byte(0x7E)));
        if MIXED {
            let small = if PRODUCT {
                lanes::f16_by_product(h0, h1, m)
            } else {
                lanes::f16_by_quotient(h0, h1, r)
            };
            code = _mm256_blendv_epi8(code, small, sub);
        }
        // SAFETY: i + 32 <= n <= dst.len(): the 32 bytes at dst[i..] are in bounds, and aligned
        // when streaming (the caller aligned dst; each step adds 32).
        unsafe { put(dst, i, code, hi, stores) };
        i += 32;
    }
    i
}

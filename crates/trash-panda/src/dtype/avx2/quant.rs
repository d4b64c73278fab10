//! bf16 and f16 -> e4m3fn quantization kernels (f16 widened by F16C, bf16 by a shift).
//!
//! The amax runs on the 16-bit patterns, sixteen to a register. The encode gives, bit for bit,
//! the reference's `e4m3fn(RN(x / k))` (an f32 division, then round to nearest even with
//! saturation) without dividing, for every scale `k` in [2^-90, f32::MAX] (every `amax / 448`
//! above 2^-81); other scales, which quantization never makes, take the `vdivps` loop.
//!
//! The quotient (`Reciprocal::quotient`) is Markstein's correction of the reciprocal product:
//! with y = RN(1/k') once per scale, q0 = RN(x * y), r = fma(-q0, k', x) and
//! q = fma(r, y, q0). Exactness: an ignored test (`--release --ignored`, half a minute) checks
//! q == RN(x / k') for every 11-bit significand x in [1, 2) (every bf16 and f16 significand)
//! and every 24-bit significand k' in [1, 2) — 2^33 pairs, all equal; the non-ignored test
//! samples them. Each step commutes with multiplying x or k' by a power of two as long as its
//! result stays in f32's normal range (RN does), so this covers every value and scale where
//! the code depends on the quotient, q >= 2^-11: there k' = k / 512 >= 2^-99 keeps x, y, q0
//! and q normal, and the remainder a multiple of ulp(q0) * ulp(k') >= 2^-148, so exact even
//! when subnormal. Below, every error is far under the 2^-11 between such a quotient and the
//! first nonzero code's edge at 2^-10 (2^-10 itself, a tie, rounds to 0 in both), and values
//! whose `x * y` could reach 2^127 (infinities, NaNs, huge values for small scales) are found
//! per block and written directly: 0x7E, NaN 0x7F, as the division saturates them.
//!
//! The encoder works on 512 * q (the 512 folded into k' = k / 512, exact), where the subnormal
//! codes are the integers that `vcvtps2dq` rounds to (nearest even), and the normal ones come
//! from integer rounding of the bits; below 2^-6 the normal formula is never above the
//! subnormal code, from 2^-6 on the subnormal one capped at 8 is never above the normal, so a
//! max picks the right one, on 16-bit lanes. bf16 widens the even and odd values apart (a
//! shift, a mask), which one byte shuffle undoes.
//!
//! Runs of at least 2048 values take a table instead (`table` for bf16, `table16` for f16, see
//! their comments): one binade's codes per scale, the rest by shifting the exponent, no float
//! arithmetic in the loop. Blocks with a value in the five binades of subnormal codes (or an
//! f16 subnormal) take the reciprocal code; where such blocks are common (values that were
//! fp8, random bits) the loop computes those lanes beside the table instead, by the quotient
//! and one conversion. A [`Quantizer`] keeps the tables of the scales it met, so a tensor's
//! bf16 rows, whose scales repeat, build few.
//!
//! Two costs the loops avoid. A subnormal f32 input or result costs x86 a microcode assist of
//! about a hundred cycles; values too small to have a nonzero code are zeroed before the
//! quotient, which kept random bf16 bits at 0.13 GB/s before. And a call inside a loop makes
//! the compiler spill its registers around it, so each loop is out of line, call-free, and
//! compiled once per kind of stores and source.
//!
//! Speed on this Xeon (one thread, AVX2 forced, 8192-value rows in cache): the bf16 table
//! about 7 GB/s of codes on weights whose exponents cluster (real ones), 4 with its computed
//! lanes on values that were fp8; the f16 table about 5 on weights (a block in thirteen holds
//! an f16 subnormal); the reciprocal loop about 3.7; the `vdivps` loop 2.4. The per-row loop
//! prefetches the next row into L2 so its amax pass does not wait on memory.

use core::arch::x86_64::*;

use super::{store, Stores};
use crate::dtype::cast::f16_to_f32_bits_bf;
use crate::dtype::fp8::f32_bits_to_e4m3;

/// The 16-bit float sources the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Half {
    /// bf16: widened by appending zero bits.
    Bf16,
    /// f16: widened by F16C (exactly; a NaN quieted, which the quantizer does not look at).
    F16,
}

impl Half {
    /// The infinity's magnitude pattern: above it lie the NaNs.
    fn inf(self) -> i16 {
        match self {
            Half::Bf16 => 0x7F80,
            Half::F16 => 0x7C00,
        }
    }

    /// One value's f32 bits.
    fn widen(self, h: u16) -> u32 {
        match self {
            Half::Bf16 => u32::from(h) << 16,
            Half::F16 => f16_to_f32_bits_bf(h),
        }
    }

    /// Eight values (a 128-bit register of them) as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn widen_8(self, h: __m128i) -> __m256 {
        match self {
            Half::Bf16 => _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)),
            Half::F16 => _mm256_cvtph_ps(h),
        }
    }
}

/// What the amax pass over a 16-bit source found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amax {
    /// The bits of max |x| over the non-NaN values as f32 bits (0 when there are none).
    pub(crate) bits: u32,
    /// Whether the source holds a NaN: where it does not, the bf16 table loop skips its NaN
    /// test (an infinity comes out of the table saturated, as the division gives it).
    pub(crate) nan: bool,
}

/// The bits of max |x| over the non-NaN values (bf16 or f16, `half`) of `src` as f32 bits (0
/// when there are none): what `amax_bits` gives for such a source, and whether a NaN is among
/// them. Works on the 16-bit patterns directly, sixteen to a register: their magnitudes order
/// like the values. The loop takes NaNs as the largest magnitudes; only when one comes out on
/// top does a second pass leave them out.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn amax_bits_16(src: &[u8], half: Half) -> Amax {
    let top = max_magnitude(src, half, false);
    if top <= half.inf() as u16 {
        return Amax {
            bits: half.widen(top),
            nan: false,
        };
    }
    Amax {
        bits: half.widen(max_magnitude(src, half, true)),
        nan: true,
    }
}

/// The largest 16-bit magnitude pattern in `src`, NaNs counted as 0 if `skip_nan`, as the
/// largest patterns otherwise.
#[target_feature(enable = "avx2,fma,f16c")]
fn max_magnitude(src: &[u8], half: Half, skip_nan: bool) -> u16 {
    let n = src.len() / 2;
    let magnitude = _mm256_set1_epi16(0x7FFF);
    let inf = _mm256_set1_epi16(half.inf());
    let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len(): the 64 bytes at src[2 * i..] are in
        // bounds.
        let (h0, h1) = unsafe { load_64(src.as_ptr().add(2 * i)) };
        let (mut m0, mut m1) = (
            _mm256_and_si256(h0, magnitude),
            _mm256_and_si256(h1, magnitude),
        );
        if skip_nan {
            // Magnitudes are below 0x8000, so the signed compare is the unsigned one.
            m0 = _mm256_andnot_si256(_mm256_cmpgt_epi16(m0, inf), m0);
            m1 = _mm256_andnot_si256(_mm256_cmpgt_epi16(m1, inf), m1);
        }
        // Two accumulators: each max waits only on its own.
        a = _mm256_max_epu16(a, m0);
        b = _mm256_max_epu16(b, m1);
        i += 32;
    }
    let mut lanes = [0u16; 16];
    // SAFETY: `lanes` is 32 bytes, the size of the unaligned store.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), _mm256_max_epu16(a, b)) };
    let mut m = lanes.into_iter().max().unwrap_or(0);
    for s in src[2 * i..2 * n].chunks_exact(2) {
        let a = u16::from_le_bytes([s[0], s[1]]) & 0x7FFF;
        m = m.max(if skip_nan && a > half.inf() as u16 {
            0
        } else {
            a
        });
    }
    m
}

/// Eight f32 values (already divided by the scale) to e4m3fn codes, one per 32-bit lane, as
/// `f32_bits_to_e4m3` gives them.
#[target_feature(enable = "avx2,fma")]
fn encode_e4m3(v: __m256) -> __m256i {
    let w = _mm256_castps_si256(v);
    let a = _mm256_and_si256(w, _mm256_set1_epi32(0x7FFF_FFFF));
    let sign = _mm256_and_si256(_mm256_srli_epi32(w, 24), _mm256_set1_epi32(0x80));
    // Normal range, as the scalar code: round to nearest even by adding just under half an ulp
    // plus the kept lsb, truncate, rebias 127 -> 7.
    let lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7_FFFF)), lsb);
    let normal = _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3));
    // Codes rise with the magnitude and 448 (or anything rounding to it) is 0x7E, so a min is
    // the saturation of everything at or above 448, infinity included.
    let normal = _mm256_min_epu32(normal, _mm256_set1_epi32(0x7E));
    // Subnormal range (< 2^-6): the count of 2^-9 steps rounded to nearest even, which the
    // multiply (exact: a power of two) and the conversion (MXCSR's default rounding) give, as
    // in the reference encoder.
    let steps = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0));
    let sub = _mm256_cvtps_epi32(steps);
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C80_0000), a);
    let code = _mm256_blendv_epi8(normal, sub, is_sub);
    // NaN: 0x7E | 1 = 0x7F (a NaN's `normal` saturated to 0x7E above).
    let nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F80_0000));
    let code = _mm256_or_si256(code, _mm256_and_si256(nan, _mm256_set1_epi32(1)));
    _mm256_or_si256(code, sign)
}

/// A thread's quantizing of one tensor's 16-bit values: how it writes and prefetches, and the
/// bf16 tables of the scales it has met, which later rows with the same scale reuse (rows of
/// one weight share few scales: a row's amax is a bf16 value and rows' amax values cluster).
pub(crate) struct Quantizer {
    half: Half,
    stores: Stores,
    ahead: usize,
    tables: Tables,
}

/// The tables a [`Quantizer`] keeps, of its source's kind (boxed: 64 tables are 8-10 KiB).
enum Tables {
    Bf16(Box<table::Tables<table::Bf16Table>>),
    F16(Box<table::Tables<table16::F16Table>>),
}

impl Quantizer {
    /// `ahead` (bytes) is how far past each block to prefetch into L2: the next row's distance
    /// for the per-row quantizer, whose amax pass then reads it from L2, a few KiB otherwise.
    pub(crate) fn new(half: Half, stores: Stores, ahead: usize) -> Quantizer {
        Quantizer {
            half,
            stores,
            ahead,
            tables: match half {
                Half::Bf16 => Tables::Bf16(Box::new(table::Tables::new())),
                Half::F16 => Tables::F16(Box::new(table::Tables::new())),
            },
        }
    }

    /// `e4m3fn(clamp(x / k, -448, 448))` for the values of `src` into `dst` (one byte each):
    /// what `encode_scaled` gives for such a source, for any `k`; the clamp is the encoder's
    /// saturation. `nan_free` says the caller knows `src` holds no NaN ([`Amax::nan`]), which
    /// spares the bf16 table loop a test.
    ///
    /// For the scales quantization makes (positive and finite) the quotient's sign is the
    /// value's and only a NaN value gives a NaN, so the loops work on magnitudes and put the
    /// signs back a byte at a time; other scales take the general loop, which divides.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn divided(&mut self, src: &[u8], dst: &mut [u8], k: f32, nan_free: bool) {
        let (half, ahead) = (self.half, self.ahead);
        let n = (src.len() / 2).min(dst.len());
        let (head, stores) = self.stores.head(dst.as_ptr(), 1, n);
        scalar(&src[..2 * head], &mut dst[..head], k, half);
        let (s, d) = (&src[2 * head..2 * n], &mut dst[head..n]);
        let long = s.len() / 2 >= table::MIN_VALUES;
        let i = head
            + match Reciprocal::new(k) {
                Some(r) => {
                    // The table loop (where the rows are long enough to pay for a table), then
                    // the reciprocal one for what it leaves.
                    let j = match &mut self.tables {
                        Tables::Bf16(tables) if long => {
                            match tables.get(k, |k| table::Bf16Table::new(k)) {
                                Some(t) => {
                                    table::bf16_by_table(s, d, t, r, stores, ahead, nan_free)
                                }
                                None => 0,
                            }
                        }
                        Tables::F16(tables) if long => {
                            match tables.get(k, |k| table16::F16Table::new(k)) {
                                Some(t) => {
                                    table16::f16_by_table(s, d, t, r, stores, ahead, nan_free)
                                }
                                None => 0,
                            }
                        }
                        _ => 0,
                    };
                    j + reciprocal(&s[2 * j..], &mut d[j..], r, stores, ahead, half)
                }
                None => divided_any(s, d, k, stores, half),
            };
        scalar(&src[2 * i..2 * n], &mut dst[i..n], k, half);
    }
}

fn scalar(src: &[u8], dst: &mut [u8], k: f32, half: Half) {
    for (s, d) in src.chunks_exact(2).zip(dst) {
        let x = f32::from_bits(half.widen(u16::from_le_bytes([s[0], s[1]])));
        *d = f32_bits_to_e4m3((x / k).to_bits());
    }
}

/// Two registers of 16 values each (64 source bytes at `p`).
///
/// # Safety
/// The 64 bytes at `p` are readable.
#[inline(always)]
unsafe fn load_64(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract; loadu has no alignment requirement.
    unsafe {
        (
            _mm256_loadu_si256(p.cast()),
            _mm256_loadu_si256(p.add(32).cast()),
        )
    }
}

/// Four registers of eight 32-bit codes (elements 0-7, 8-15, 16-23, 24-31) as 32 bytes in
/// element order. Codes fit a byte, so the saturating packs are exact; they leave the four-code
/// groups in the order a0 b0 c0 d0 a1 b1 c1 d1, which the dword permute undoes.
#[target_feature(enable = "avx2,fma")]
fn pack_codes(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m256i {
    let bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// A scale in the range the reciprocal loops take, prepared for [`Reciprocal::quotient`]: the
/// loops compute `v = 512 * (x / k)` (the 512 puts the subnormal codes at the integers), as the
/// quotient by `k / 512`, which is exact (a power of two, far from the ends of the f32 range).
#[derive(Clone, Copy)]
struct Reciprocal {
    /// `k / 512`.
    k: f32,
    /// `RN(1 / (k / 512))`: correctly rounded, as an IEEE division gives it.
    y: f32,
    /// The largest bf16 magnitude pattern whose quotient the loop computes: above it lie
    /// infinities, NaNs and values whose `x * y` could overflow, all of which saturate or are
    /// NaN, which the loop writes directly.
    bf16_limit: i16,
    /// The largest bf16 magnitude pattern at most `k / 8` (as stored: a quotient at most 1/8
    /// of the smallest subnormal code, so code 0, whatever the rounding). The bf16 loop zeroes
    /// such values before dividing: a subnormal input or product costs a microcode assist of
    /// about a hundred cycles on x86 (random bit patterns ran 40x slower), and from this size
    /// on neither `x * y` nor, for any scale that is not itself tiny, the remainder is one.
    bf16_tiny: i16,
}

impl Reciprocal {
    /// `k` if it is finite and at least 2^-90 (every scale `amax / 448` above 2^-81 is): there
    /// every step of the quotient stays clear of f32's subnormals and overflow where the code
    /// depends on it (see the module comment). Other scales divide.
    fn new(k: f32) -> Option<Reciprocal> {
        if !(k >= f32::from_bits(0x0A80_0000) && k <= f32::MAX) {
            return None;
        }
        let k = k / 512.0;
        let y = 1.0 / k;
        // x * y < 2^127 for every x at or under the limit (a bf16 truncation of 2^126 / y), so
        // the quotient is finite; f16 values (at most 65504) are always under it.
        let lim = (f32::from_bits(0x7E80_0000) / y).to_bits() >> 16;
        let bf16_limit = lim.min(0x7F7F) as i16;
        // k >= 2^-99 here, so k / 8 is normal and its pattern above every subnormal one.
        let bf16_tiny = ((k / 8.0).to_bits() >> 16) as i16;
        Some(Reciprocal {
            k,
            y,
            bf16_limit,
            bf16_tiny,
        })
    }

    /// `RN(x / k)` (k as stored: the scale / 512) for eight non-negative f32 values whose
    /// product with `y` stays under 2^127, where it matters to the code; see the module comment
    /// for why.
    ///
    /// Markstein's correction: `q0 = RN(x * y)`, `r = x - q0 * k` (exact, by the fma),
    /// `q = RN(q0 + r * y)`.
    #[target_feature(enable = "avx2,fma")]
    fn quotient(self, x: __m256) -> __m256 {
        let (k, y) = (_mm256_set1_ps(self.k), _mm256_set1_ps(self.y));
        let q0 = _mm256_mul_ps(x, y);
        let r = _mm256_fnmadd_ps(q0, k, x);
        _mm256_fmadd_ps(r, y, q0)
    }
}

/// The e4m3fn codes of eight values `v = 512 * q` (q a non-negative, non-NaN quotient, possibly
/// infinite), unsigned and not saturated, as two parts that [`combine`] joins: the normal code
/// (right for q >= 2^-6, below it no more than the subnormal code) and the subnormal one (the
/// count of 2^-9 steps, right for q < 2^-6, from 2^-6 on at least 8 or negative).
#[target_feature(enable = "avx2,fma")]
fn encode_parts(v: __m256) -> (__m256i, __m256i) {
    let a = _mm256_castps_si256(v);
    // Round to nearest even at bit 20 and rebias 127 + 9 -> 7 (the rebias in the constant); an
    // arithmetic shift keeps what lies under 2^-6 negative or small.
    let lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    let biased = _mm256_add_epi32(a, _mm256_set1_epi32(0x7_FFFF - (1032 << 20)));
    let normal = _mm256_srai_epi32(_mm256_add_epi32(biased, lsb), 20);
    // MXCSR's default rounding is to nearest even; 2^31 and above give i32::MIN.
    (normal, _mm256_cvtps_epi32(v))
}

/// The 16-bit codes from [`encode_parts`]' halves (packed, signed-saturating, in `packs`' lane
/// order): the larger of the normal code and the subnormal one capped at 8. Under 2^-6 the
/// subnormal code (at most 8) is the larger; from 2^-6 on the normal code (at least 8) is, the
/// capped subnormal one being 8 or negative.
#[target_feature(enable = "avx2,fma")]
fn combine(a: (__m256i, __m256i), b: (__m256i, __m256i)) -> __m256i {
    let normal = _mm256_packs_epi32(a.0, b.0);
    let sub = _mm256_min_epi16(_mm256_packs_epi32(a.1, b.1), _mm256_set1_epi16(8));
    _mm256_max_epi16(normal, sub)
}

/// One block of 32 values as the reciprocal loops take it.
#[derive(Clone, Copy)]
struct Block {
    /// The values' signs, in `packs_epi16`'s lane order, as 0x80 bits ([`signs`]).
    signs: __m256i,
    /// Their magnitudes, sixteen to a register.
    m: [__m256i; 2],
    /// Whether any magnitude is above the limit the loader was given.
    over: bool,
}

/// The block of 32 values at `src[2 * i..]` (64 bytes), `over` telling whether any magnitude
/// is above `limit` (a signed compare: magnitudes are below 0x8000). The signs are taken at
/// once, so that the loaded registers die early. Prefetches the line `ahead` bytes further
/// into L2: the per-row quantizer asks for the next row, whose amax pass then reads it from L2
/// instead of waiting on memory.
///
/// # Safety
/// `src` holds 64 bytes from `2 * i`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load_block(src: &[u8], i: usize, limit: i16, ahead: usize) -> Block {
    // A prefetch never faults, whatever the address; `wrapping_add` computes one past the
    // slice without `add`'s in-bounds requirement.
    _mm_prefetch::<_MM_HINT_T1>(src.as_ptr().wrapping_add(2 * i + ahead).cast());
    // SAFETY: the caller's contract.
    let (h0, h1) = unsafe { load_64(src.as_ptr().add(2 * i)) };
    let m0 = _mm256_and_si256(h0, _mm256_set1_epi16(0x7FFF));
    let m1 = _mm256_and_si256(h1, _mm256_set1_epi16(0x7FFF));
    let top = _mm256_max_epu16(m0, m1);
    let over = _mm256_cmpgt_epi16(top, _mm256_set1_epi16(limit));
    Block {
        signs: signs([h0, h1]),
        m: [m0, m1],
        over: _mm256_movemask_epi8(over) != 0,
    }
}

/// The codes of 32 values whose magnitudes `m` are above `limit` (the rest are left as
/// `codes` has them), in `packs_epi16`'s lane order: NaNs (above `inf`) 0x7F, the rest 0x7E,
/// as the division would saturate them.
#[target_feature(enable = "avx2,fma")]
fn saturated(codes: __m256i, m: [__m256i; 2], limit: i16, inf: i16) -> __m256i {
    let over = |m: __m256i| _mm256_cmpgt_epi16(m, _mm256_set1_epi16(limit));
    let nan = |m: __m256i| _mm256_cmpgt_epi16(m, _mm256_set1_epi16(inf));
    // Signed saturation turns each 16-bit mask into a byte mask.
    let over = _mm256_packs_epi16(over(m[0]), over(m[1]));
    let nan = _mm256_packs_epi16(nan(m[0]), nan(m[1]));
    let fix = _mm256_sub_epi8(_mm256_set1_epi8(0x7E), nan);
    _mm256_blendv_epi8(codes, fix, over)
}

/// The signs of 32 values (the high bytes of `h`), in `packs_epi16`'s lane order, as 0x80 bits.
#[target_feature(enable = "avx2,fma")]
fn signs(h: [__m256i; 2]) -> __m256i {
    // Signed saturation keeps each value's sign in its byte.
    let s = _mm256_packs_epi16(h[0], h[1]);
    _mm256_and_si256(s, _mm256_set1_epi8(i8::MIN))
}

/// The codes of one block of 32 bf16 values (loaded with the limit `r.bf16_limit`) by the
/// reciprocal, in order. Widens the even and the odd values of a register apart (a shift and a
/// mask) and puts them back in order with one byte shuffle.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn reciprocal_bf16_block(b: Block, r: Reciprocal) -> __m256i {
    let sixteen = |m: __m256i| {
        // Tiny values to 0 (their code), so that nothing below is subnormal.
        let m = _mm256_and_si256(m, _mm256_cmpgt_epi16(m, _mm256_set1_epi16(r.bf16_tiny)));
        let even = r.quotient(_mm256_castsi256_ps(_mm256_slli_epi32(m, 16)));
        let odd = r.quotient(_mm256_castsi256_ps(_mm256_and_si256(
            m,
            _mm256_set1_epi32(-0x1_0000),
        )));
        // Each lane: 0 2 4 6 1 3 5 7 of its eight values.
        combine(encode_parts(even), encode_parts(odd))
    };
    // Each eight bytes 0 2 4 6 1 3 5 7 back to 0..7.
    let order = _mm256_setr_epi8(
        0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13,
        10, 14, 11, 15,
    );
    // Lane 0: values 0-7 and 16-23, lane 1: 8-15 and 24-31, as `packs_epi16` leaves the
    // signs; codes saturate at 448 (0x7E) there, everything above rounding to it.
    let codes = _mm256_packus_epi16(sixteen(b.m[0]), sixteen(b.m[1]));
    let codes = _mm256_min_epu8(codes, _mm256_set1_epi8(0x7E));
    let mut codes = _mm256_shuffle_epi8(codes, order);
    if b.over {
        codes = saturated(codes, b.m, r.bf16_limit, 0x7F80);
    }
    let codes = _mm256_or_si256(codes, b.signs);
    _mm256_permute4x64_epi64(codes, 0b11_01_10_00)
}

/// The codes of one block of 32 f16 values (loaded with the limit 0x7BFF, under which lie the
/// finite values) by the reciprocal, in order, widened by F16C eight at a time.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn reciprocal_f16_block(b: Block, r: Reciprocal) -> __m256i {
    let eight = |m: __m128i| encode_parts(r.quotient(_mm256_cvtph_ps(m)));
    let sixteen = |m: __m256i| {
        let lo = eight(_mm256_castsi256_si128(m));
        let hi = eight(_mm256_extracti128_si256(m, 1));
        // Lane 0: values 0-3 and 8-11, lane 1: 4-7 and 12-15.
        combine(lo, hi)
    };
    // Four-byte groups of values 0, 8, 16, 24 in lane 0 and 4, 12, 20, 28 in lane 1: the
    // dword permute puts them in the `packs_epi16` order of the signs (0-7, 16-23, 8-15,
    // 24-31), the qword one in order.
    let codes = _mm256_packus_epi16(sixteen(b.m[0]), sixteen(b.m[1]));
    let codes = _mm256_min_epu8(codes, _mm256_set1_epi8(0x7E));
    let perm = _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7);
    let mut codes = _mm256_permutevar8x32_epi32(codes, perm);
    if b.over {
        // Infinities (0x7C00) and NaNs are above 0x7BFF.
        codes = saturated(codes, b.m, 0x7BFF, 0x7C00);
    }
    let codes = _mm256_or_si256(codes, b.signs);
    _mm256_permute4x64_epi64(codes, 0b11_01_10_00)
}

/// The reciprocal loop of [`Quantizer::divided`]; returns how many values it did (from the
/// start; the rest, under 32, is the caller's).
#[target_feature(enable = "avx2,fma,f16c")]
fn reciprocal(
    src: &[u8],
    dst: &mut [u8],
    r: Reciprocal,
    stores: Stores,
    ahead: usize,
    half: Half,
) -> usize {
    match (stores, half) {
        (Stores::Cached, Half::Bf16) => reciprocal_run::<false, true>(src, dst, r, ahead),
        (Stores::Cached, Half::F16) => reciprocal_run::<false, false>(src, dst, r, ahead),
        (Stores::Streaming, Half::Bf16) => reciprocal_run::<true, true>(src, dst, r, ahead),
        (Stores::Streaming, Half::F16) => reciprocal_run::<true, false>(src, dst, r, ahead),
    }
}

/// [`reciprocal`] for one kind of stores and source, picked at compile time so that the loop
/// branches on neither (`BF16`: bf16, else f16).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
fn reciprocal_run<const STREAM: bool, const BF16: bool>(
    src: &[u8],
    dst: &mut [u8],
    r: Reciprocal,
    ahead: usize,
) -> usize {
    let n = (src.len() / 2).min(dst.len());
    let stores = if STREAM {
        Stores::Streaming
    } else {
        Stores::Cached
    };
    let limit = if BF16 { r.bf16_limit } else { 0x7BFF };
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len().
        let b = unsafe { load_block(src, i, limit, ahead) };
        let codes = if BF16 {
            reciprocal_bf16_block(b, r)
        } else {
            reciprocal_f16_block(b, r)
        };
        // SAFETY: i + 32 <= n <= dst.len(): the 32 bytes at dst[i..] are in bounds, and aligned
        // when streaming (the caller aligned dst; each step adds 32).
        unsafe { store(dst.as_mut_ptr().add(i), codes, stores) };
        i += 32;
    }
    i
}

/// The vector loop of [`Quantizer::divided`] for any `k` (negative, zero or infinite ones
/// only reach here from tests), with [`encode_e4m3`]'s full encoder.
#[target_feature(enable = "avx2,fma,f16c")]
fn divided_any(src: &[u8], dst: &mut [u8], k: f32, stores: Stores, half: Half) -> usize {
    let n = (src.len() / 2).min(dst.len());
    let kv = _mm256_set1_ps(k);
    let quarter = |h: __m128i| encode_e4m3(_mm256_div_ps(half.widen_8(h), kv));
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len(): the 64 bytes at src[2 * i..] are in bounds.
        let (h0, h1) = unsafe { load_64(src.as_ptr().add(2 * i)) };
        let bytes = pack_codes(
            quarter(_mm256_castsi256_si128(h0)),
            quarter(_mm256_extracti128_si256(h0, 1)),
            quarter(_mm256_castsi256_si128(h1)),
            quarter(_mm256_extracti128_si256(h1, 1)),
        );
        // SAFETY: i + 32 <= n <= dst.len(): the 32 bytes at dst[i..] are in bounds, and aligned
        // when streaming.
        unsafe { store(dst.as_mut_ptr().add(i), bytes, stores) };
        i += 32;
    }
    i
}

mod table;
mod table16;
#[cfg(test)]
mod tests;

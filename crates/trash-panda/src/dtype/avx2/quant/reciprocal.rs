//! The reciprocal code of the quantizer: the exact quotient by Markstein's correction (see
//! `quant`'s module comment for why it is exact), the encoder on 512 times it, and the loops
//! that run them on blocks of 32 bf16 or f16 values.

use core::arch::x86_64::*;

use super::{load_64, store, Half, Stores};

/// A scale in the range the reciprocal loops take, prepared for [`Reciprocal::quotient`]: the
/// loops compute `v = 512 * (x / k)` (the 512 puts the subnormal codes at the integers), as the
/// quotient by `k / 512`, which is exact (a power of two, far from the ends of the f32 range).
#[derive(Clone, Copy)]
pub(super) struct Reciprocal {
    /// `k / 512`.
    pub(super) k: f32,
    /// `RN(1 / (k / 512))`: correctly rounded, as an IEEE division gives it.
    pub(super) y: f32,
    /// The largest bf16 magnitude pattern whose quotient the loop computes: above it lie
    /// infinities, NaNs and values whose `x * y` could overflow, all of which saturate or are
    /// NaN, which the loop writes directly.
    pub(super) bf16_limit: i16,
    /// The largest bf16 magnitude pattern at most `k / 8` (as stored: a quotient at most 1/8
    /// of the smallest subnormal code, so code 0, whatever the rounding). The bf16 loop zeroes
    /// such values before dividing: a subnormal input or product costs a microcode assist of
    /// about a hundred cycles on x86 (random bit patterns ran 40x slower), and from this size
    /// on neither `x * y` nor, for any scale that is not itself tiny, the remainder is one.
    pub(super) bf16_tiny: i16,
}

impl Reciprocal {
    /// `k` if it is finite and at least 2^-90 (every scale `amax / 448` above 2^-81 is): there
    /// every step of the quotient stays clear of f32's subnormals and overflow where the code
    /// depends on it (see the module comment). Other scales divide.
    pub(super) fn new(k: f32) -> Option<Reciprocal> {
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
    pub(super) fn quotient(self, x: __m256) -> __m256 {
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

/// The 32 values at `src[2 * i..]` (64 bytes), prefetching the line `ahead` bytes further into
/// L2.
///
/// # Safety
/// `src` holds 64 bytes from `2 * i`.
#[inline(always)]
pub(super) unsafe fn load_32(src: &[u8], i: usize, ahead: usize) -> (__m256i, __m256i) {
    // A prefetch never faults, whatever the address; `wrapping_add` computes one past the
    // slice without `add`'s in-bounds requirement.
    // SAFETY: prefetching needs SSE, which every x86_64 CPU has.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(src.as_ptr().wrapping_add(2 * i + ahead).cast()) };
    // SAFETY: the caller's contract.
    unsafe { load_64(src.as_ptr().add(2 * i)) }
}

/// One block of 32 values as the reciprocal loops take it.
#[derive(Clone, Copy)]
pub(super) struct Block {
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
pub(super) unsafe fn load_block(src: &[u8], i: usize, limit: i16, ahead: usize) -> Block {
    // SAFETY: the caller's contract.
    let (h0, h1) = unsafe { load_32(src, i, ahead) };
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
pub(super) fn reciprocal_bf16_block(b: Block, r: Reciprocal) -> __m256i {
    let sixteen = |m: __m256i| {
        let (even, odd) = bf16_quotients(m, r);
        combine(encode_parts(even), encode_parts(odd))
    };
    // Lane 0: values 0-7 and 16-23, lane 1: 8-15 and 24-31, as `packs_epi16` leaves the
    // signs; codes saturate at 448 (0x7E) there, everything above rounding to it.
    let codes = _mm256_packus_epi16(sixteen(b.m[0]), sixteen(b.m[1]));
    let codes = _mm256_min_epu8(codes, _mm256_set1_epi8(0x7E));
    let mut codes = _mm256_shuffle_epi8(codes, bf16_order());
    if b.over {
        codes = saturated(codes, b.m, r.bf16_limit, 0x7F80);
    }
    let codes = _mm256_or_si256(codes, b.signs);
    _mm256_permute4x64_epi64(codes, 0b11_01_10_00)
}

/// The quotients (512 times `x / k`) of sixteen bf16 magnitudes `m`, the even and the odd
/// values apart (a shift, a mask): each lane of the pair holds 0 2 4 6 | 1 3 5 7 of its eight.
/// Tiny values are zeroed first (their code is 0), so that nothing below is subnormal.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn bf16_quotients(m: __m256i, r: Reciprocal) -> (__m256, __m256) {
    let m = _mm256_and_si256(m, _mm256_cmpgt_epi16(m, _mm256_set1_epi16(r.bf16_tiny)));
    let even = r.quotient(_mm256_castsi256_ps(_mm256_slli_epi32(m, 16)));
    let odd = _mm256_and_si256(m, _mm256_set1_epi32(-0x1_0000));
    (even, r.quotient(_mm256_castsi256_ps(odd)))
}

/// The byte shuffle that puts each eight codes of [`bf16_quotients`]' order (0 2 4 6 1 3 5 7)
/// back in order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn bf16_order() -> __m256i {
    _mm256_setr_epi8(
        0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13,
        10, 14, 11, 15,
    )
}

/// The quotients (512 times `x / k`) of sixteen f16 magnitudes `m`, widened by F16C: values
/// 0-7 and 8-15.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn f16_quotients(m: __m256i, r: Reciprocal) -> (__m256, __m256) {
    let lo = r.quotient(_mm256_cvtph_ps(_mm256_castsi256_si128(m)));
    (
        lo,
        r.quotient(_mm256_cvtph_ps(_mm256_extracti128_si256(m, 1))),
    )
}

/// The dword permute that puts the codes of two packed pairs of [`f16_quotients`] (four-byte
/// groups of values 0, 8, 16, 24 in lane 0 and 4, 12, 20, 28 in lane 1) in `packs`' order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn f16_order() -> __m256i {
    _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7)
}

/// The codes of one block of 32 f16 values (loaded with the limit 0x7BFF, under which lie the
/// finite values) by the reciprocal, in order, widened by F16C eight at a time.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn reciprocal_f16_block(b: Block, r: Reciprocal) -> __m256i {
    let sixteen = |m: __m256i| {
        let (lo, hi) = f16_quotients(m, r);
        // Lane 0: values 0-3 and 8-11, lane 1: 4-7 and 12-15.
        combine(encode_parts(lo), encode_parts(hi))
    };
    // Four-byte groups of values 0, 8, 16, 24 in lane 0 and 4, 12, 20, 28 in lane 1: the
    // dword permute puts them in the `packs_epi16` order of the signs (0-7, 16-23, 8-15,
    // 24-31), the qword one in order.
    let codes = _mm256_packus_epi16(sixteen(b.m[0]), sixteen(b.m[1]));
    let codes = _mm256_min_epu8(codes, _mm256_set1_epi8(0x7E));
    let mut codes = _mm256_permutevar8x32_epi32(codes, f16_order());
    if b.over {
        // Infinities (0x7C00) and NaNs are above 0x7BFF.
        codes = saturated(codes, b.m, 0x7BFF, 0x7C00);
    }
    let codes = _mm256_or_si256(codes, b.signs);
    _mm256_permute4x64_epi64(codes, 0b11_01_10_00)
}

/// The reciprocal loop of [`super::Quantizer::divided`]; returns how many values it did (from the
/// start; the rest, under 32, is the caller's).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn reciprocal(
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

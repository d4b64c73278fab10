//! bf16 -> e4m3fn by a per-scale table of one binade's codes: no arithmetic on floats at all in
//! the loop, byte operations on 32 values at a time.
//!
//! Why it is exact. For a fixed scale k, the code of a bf16 magnitude (exponent field e,
//! mantissa m) depends on e only by a shift once the quotient is a normal e4m3 value: doubling x
//! doubles RN(x / k) exactly (no f32 overflow or underflow there) and adds 8 to its e4m3 code.
//! So with e_lo the first binade whose quotients are all at least 2^-6 (the smallest normal),
//! code(e, m) = T\[m\] + 8 * (e - e_lo) for e >= e_lo, saturated at 0x7E (the codes rise with the
//! value, so everything that would pass 448 does). Five binades under e_lo reach the subnormal
//! codes; below them every quotient is under 2^-10 and rounds to 0 (e_lo being the first normal
//! binade, 2^(e_lo - 1) / k < 2^-6). T is computed per scale by the true division and the full
//! encoder. It is monotone, and one e4m3 step is at least 1/16 of the value while eight bf16
//! mantissas span under 7/128 of it, so T rises at most once in each run of eight mantissas:
//! a 16-entry base and a 16-entry position (of the rise) describe it, two `vpshufb`. The build
//! checks that claim on the computed T and declines the table (the reciprocal loop runs) if it
//! ever failed. Blocks holding a value in the five subnormal binades, or a NaN, take the
//! reciprocal code (an infinity too unless the caller knows there is no NaN: it saturates in
//! the table but for the largest scales), or where the first are common, their codes computed
//! beside the table's: under 2^-5 a code is 512 times the quotient rounded to an integer
//! (`lanes`).

use core::arch::x86_64::*;
use core::cell::OnceCell;
use core::ops::RangeInclusive;

use super::lanes::{self, Lanes};
use super::reciprocal::{load_32, load_block, reciprocal_bf16_block, Block, Reciprocal};
use super::{encode_e4m3, store, Half, Stores};

/// Below this many values a table's build (16 divisions of eight values and a scan or a
/// search) costs more than it saves.
pub(super) const MIN_VALUES: usize = 2048;

/// The tables of the scales a [`super::Quantizer`] has met (bf16 or f16 ones), direct-mapped by
/// the scale's bits: a table's build costs as much as quantizing a few hundred values, a lookup
/// nothing.
pub(super) struct Tables<T> {
    slots: [Option<Slot<T>>; SLOTS],
}

const SLOTS: usize = 64;

/// What [`Tables`] keeps of one scale.
struct Slot<T> {
    /// The scale's bits.
    bits: u32,
    /// Its table, `None` where the table does not apply.
    table: Option<T>,
    /// How the loop computes the lanes under the table's binade, `None` where it may not;
    /// found when it first wants to. Kept beside the table rather than in it: a cell in the
    /// table would make the compiler reload the table's fields in every iteration of the loop.
    lanes: OnceCell<Option<Lanes>>,
}

/// A scale's table and how its loop computes the lanes under it, as [`Tables::get`] gives them.
pub(super) struct Scale<'a, T> {
    table: &'a T,
    lanes: &'a OnceCell<Option<Lanes>>,
}

impl<T> Tables<T> {
    pub(super) fn new() -> Tables<T> {
        Tables {
            slots: core::array::from_fn(|_| None),
        }
    }

    /// The table for `k`, built by `build` on the first call for it.
    pub(super) fn get(
        &mut self,
        k: f32,
        build: impl FnOnce(f32) -> Option<T>,
    ) -> Option<Scale<'_, T>> {
        let bits = k.to_bits();
        // The top mantissa bits vary most between the scales of one tensor's rows.
        let slot = &mut self.slots[((bits >> 16) ^ (bits >> 22)) as usize % SLOTS];
        if !matches!(slot, Some(s) if s.bits == bits) {
            *slot = Some(Slot {
                bits,
                table: build(k),
                lanes: OnceCell::new(),
            });
        }
        let slot = slot.as_ref()?;
        Some(Scale {
            table: slot.table.as_ref()?,
            lanes: &slot.lanes,
        })
    }
}

/// One scale's codes, as the loop uses them.
#[derive(Clone, Copy)]
pub(super) struct Bf16Table {
    /// T at the start of each run of eight mantissas (m = 8b), both lanes.
    base: __m256i,
    /// For each run, the offset in it (0..6) after which T is one more, 7 if it does not rise.
    rise: __m256i,
    /// e_lo: the first exponent field whose quotients are all normal in e4m3, at least 6.
    e_lo: u8,
}

impl Bf16Table {
    /// The table for `k`, or `None` where it does not apply.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn new(k: f32) -> Option<Bf16Table> {
        let e_lo = first_normal_binade(k)?;
        // T for the binade e_lo: eight divisions of eight values, as the reference divides.
        let mut t = [0u32; 128];
        let kv = _mm256_set1_ps(k);
        for (j, out) in t.chunks_exact_mut(8).enumerate() {
            let m = _mm256_add_epi32(
                _mm256_set1_epi32((j * 8) as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            let x = _mm256_or_si256(
                _mm256_set1_epi32((e_lo as i32) << 23),
                _mm256_slli_epi32(m, 16),
            );
            let codes = encode_e4m3(_mm256_div_ps(_mm256_castsi256_ps(x), kv));
            // SAFETY: `out` is eight u32s, the 32 bytes the unaligned store writes.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), codes) };
        }
        let (mut base, mut rise) = ([0u8; 16], [7u8; 16]);
        for (b, run) in t.chunks_exact(8).enumerate() {
            base[b] = u8::try_from(run[0]).ok()?;
            if let Some(j) = run.iter().position(|&c| c != run[0]) {
                rise[b] = (j - 1) as u8;
            }
            // The claim the loop rests on: the run is base, then base + 1 after the rise.
            let fits = run
                .iter()
                .enumerate()
                .all(|(j, &c)| c == run[0] + u32::from(j as u8 > rise[b]));
            // T stays under 25 (its binade's quotients are under 2^-4), so 8 * 28 + T fits a byte.
            if !fits || run[7] > 24 {
                return None;
            }
        }
        // SAFETY: each array is 16 bytes, the size of the unaligned loads.
        let (base, rise) = unsafe {
            (
                _mm_loadu_si128(base.as_ptr().cast()),
                _mm_loadu_si128(rise.as_ptr().cast()),
            )
        };
        Some(Bf16Table {
            base: _mm256_broadcastsi128_si256(base),
            rise: _mm256_broadcastsi128_si256(rise),
            e_lo,
        })
    }

    /// The magnitude patterns whose codes the loop computes beside the table: the five binades
    /// under e_lo, where every quotient is under 2^-5 (see the module comment).
    pub(super) fn lane_patterns(&self) -> RangeInclusive<i32> {
        let e = i32::from(self.e_lo);
        (e - 5) << 7..=(e << 7) - 1
    }
}

/// The smallest exponent field e with RN(2^(e - 127) / k) >= 2^-6, if it is in 6..=254.
fn first_normal_binade(k: f32) -> Option<u8> {
    let pow = |e: u32| f32::from_bits(e << 23);
    let min_normal = f32::from_bits(0x3C80_0000);
    let mut e = (k.to_bits() >> 23).saturating_sub(6).clamp(1, 254);
    while e > 1 && pow(e - 1) / k >= min_normal {
        e -= 1;
    }
    while e <= 254 && pow(e) / k < min_normal {
        e += 1;
    }
    (6..=254).contains(&e).then_some(e as u8)
}

/// A table of one scale's codes, bf16's ([`Bf16Table`]) or f16's (`table16::F16Table`), as
/// [`by_table`] runs it.
pub(super) trait Table {
    /// The loader's limit for this format's reciprocal code ([`Block::over`]).
    fn limit(&self, r: Reciprocal) -> i16;
    /// Whether an infinity comes out of the table saturated, as the division gives it: when
    /// the top exponent lies at least 22 binades above the table's (8 * 22 - 48 >= 0x7E).
    fn top_saturates(&self) -> bool;
    /// How the loop computes the codes of the binades under the table's itself, if it may.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    unsafe fn lanes(&self, r: Reciprocal) -> Option<Lanes>;
    /// The reciprocal code of one block.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    unsafe fn reciprocal(&self, b: Block, r: Reciprocal) -> __m256i;
    /// The format's table loop, compiled for these stores (`STREAM`), NaN test (`NAN`) and
    /// computed lanes (`MIXED`, by one product with the multiplier `m` if `PRODUCT`, else by
    /// the quotient): it returns how many values it wrote, stopping at the end or at a block it
    /// leaves to the reciprocal code.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    unsafe fn run<const STREAM: bool, const NAN: bool, const MIXED: bool, const PRODUCT: bool>(
        &self,
        src: &[u8],
        dst: &mut [u8],
        r: Reciprocal,
        m: f32,
        ahead: usize,
    ) -> usize;
}

impl Table for Bf16Table {
    fn limit(&self, r: Reciprocal) -> i16 {
        r.bf16_limit
    }

    fn top_saturates(&self) -> bool {
        self.e_lo <= 255 - 22
    }

    unsafe fn lanes(&self, r: Reciprocal) -> Option<Lanes> {
        // SAFETY: the caller's contract.
        Some(unsafe { Lanes::new(r, Half::Bf16, self.lane_patterns()) })
    }

    #[inline]
    unsafe fn reciprocal(&self, b: Block, r: Reciprocal) -> __m256i {
        // SAFETY: the caller's contract.
        unsafe { reciprocal_bf16_block(b, r) }
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

/// The table loop of [`super::Quantizer::divided`]; returns how many values it did (a multiple
/// of 32), all but the last few unless blocks the table leaves are common and it may not
/// compute them, in which case it stops early and leaves the rest to the reciprocal loop.
/// `nan_free`: the caller knows `src` holds no NaN, so the top exponent is an infinity.
///
/// It starts with the plain loop, which leaves each block holding a value in the five binades
/// under the table's to the reciprocal code; where such blocks are common (more than one in
/// four: exponents spread wide, as random bits or values that were fp8 have) it goes on with
/// the loop that computes those lanes' codes beside the table's in every block, which costs
/// less than a block left to the reciprocal code.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn by_table<T: Table>(
    src: &[u8],
    dst: &mut [u8],
    scale: Scale<'_, T>,
    r: Reciprocal,
    stores: Stores,
    ahead: usize,
    nan_free: bool,
) -> usize {
    let n = (src.len() / 2).min(dst.len());
    let t = scale.table;
    let nan_test = !(nan_free && t.top_saturates());
    let (mut i, mut slow, mut lanes) = (0, 0, None);
    loop {
        let (s, d) = (&src[2 * i..2 * n], &mut dst[i..n]);
        let runner = Runner {
            streaming: matches!(stores, Stores::Streaming),
            nan_test,
            r,
            ahead,
        };
        i += match lanes {
            None => runner.run::<T, false, false>(t, s, d, 0.0),
            Some(Lanes::Quotient) => runner.run::<T, true, false>(t, s, d, 0.0),
            Some(Lanes::Product(m)) => runner.run::<T, true, true>(t, s, d, m),
        };
        if i + 32 > n {
            return i;
        }
        // The block at i holds a value the loop does not cover (a NaN or an infinity, or in
        // the plain loop a value under the table's binade with a nonzero code).
        slow += 1;
        if lanes.is_none() && slow > 16 && slow * 4 > i / 32 {
            // SAFETY: this function's features.
            lanes = *scale.lanes.get_or_init(|| unsafe { t.lanes(r) });
            if lanes.is_none() {
                return i;
            }
        }
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len().
        let b = unsafe { load_block(src, i, t.limit(r), ahead) };
        // SAFETY: this function's features.
        let codes = unsafe { t.reciprocal(b, r) };
        // SAFETY: i + 32 <= n <= dst.len(): the 32 bytes at dst[i..] are in bounds, and aligned
        // when streaming (the caller aligned dst; each step adds 32).
        unsafe { store(dst.as_mut_ptr().add(i), codes, stores) };
        i += 32;
    }
}

/// What picks one of a format's table loops, but for how it computes lanes.
struct Runner {
    streaming: bool,
    nan_test: bool,
    r: Reciprocal,
    ahead: usize,
}

impl Runner {
    /// `t`'s loop for these stores and NaN test, `MIXED` and `PRODUCT` as [`Table::run`] takes
    /// them. Out of line: the compiler inlines the bf16 loops here whatever their attribute
    /// says, and inside `by_table` the plain one ran 7% slower from memory.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline(never)]
    fn run<T: Table, const MIXED: bool, const PRODUCT: bool>(
        &self,
        t: &T,
        src: &[u8],
        dst: &mut [u8],
        m: f32,
    ) -> usize {
        let (r, ahead) = (self.r, self.ahead);
        // SAFETY: this function's features are the loops'.
        unsafe {
            match (self.streaming, self.nan_test) {
                (false, true) => t.run::<false, true, MIXED, PRODUCT>(src, dst, r, m, ahead),
                (false, false) => t.run::<false, false, MIXED, PRODUCT>(src, dst, r, m, ahead),
                (true, true) => t.run::<true, true, MIXED, PRODUCT>(src, dst, r, m, ahead),
                (true, false) => t.run::<true, false, MIXED, PRODUCT>(src, dst, r, m, ahead),
            }
        }
    }
}

/// The low and high bytes of the 32 16-bit values `h0`, `h1`, in `packs`' lane order: 0-7,
/// 16-23 | 8-15, 24-31.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn split_bytes(h0: __m256i, h1: __m256i) -> (__m256i, __m256i) {
    let low = _mm256_set1_epi16(0xFF);
    let lo = _mm256_packus_epi16(_mm256_and_si256(h0, low), _mm256_and_si256(h1, low));
    (
        lo,
        _mm256_packus_epi16(_mm256_srli_epi16(h0, 8), _mm256_srli_epi16(h1, 8)),
    )
}

/// Writes the 32 unsigned codes `code` (in `packs`' lane order) with the signs of `hi` (the
/// values' high bytes, same order) to `dst[i..]`, in order.
///
/// # Safety
/// `dst` holds 32 bytes from `i`, aligned when `stores` streams.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn put(dst: &mut [u8], i: usize, code: __m256i, hi: __m256i, stores: Stores) {
    let code = _mm256_or_si256(code, _mm256_and_si256(hi, _mm256_set1_epi8(i8::MIN)));
    let code = _mm256_permute4x64_epi64(code, 0b11_01_10_00);
    // SAFETY: the caller's contract.
    unsafe { store(dst.as_mut_ptr().add(i), code, stores) };
}

/// The table's blocks of 32 from the start of `src` until the end or a block it leaves to the
/// caller: with `NAN` one holding an infinity or a NaN (a NaN needs its own code; an infinity
/// saturates in the table for all but the largest scales), and unless `MIXED` one holding a
/// value in the five subnormal binades. With `MIXED` those values' codes are computed in every
/// block and blended in: under 2^-5 a code is the quotient times 512 rounded to an integer,
/// whether it is subnormal or in the first normal binade (see `lanes`), by one product with
/// `m` if `PRODUCT`. Returns how many values it wrote. Out of line and without calls, so that
/// its loop keeps everything in registers; `STREAM` picks the stores at compile time for the
/// same reason.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
fn table_run<const STREAM: bool, const NAN: bool, const MIXED: bool, const PRODUCT: bool>(
    src: &[u8],
    dst: &mut [u8],
    t: &Bf16Table,
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
    let first = *t.lane_patterns().start() as i16;
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len().
        let (h0, h1) = unsafe { load_32(src, i, ahead) };
        // The low bytes (exponent lsb, mantissa) and high bytes (sign, exponent >> 1).
        let (lo, hi) = split_bytes(h0, h1);
        // e = 2 * (e >> 1) + the lsb, which is the sign bit of `lo`; doubling `hi` drops the
        // sign (bytes wrap).
        let lsb = _mm256_cmpgt_epi8(_mm256_setzero_si256(), lo);
        let e = _mm256_sub_epi8(_mm256_add_epi8(hi, hi), lsb);
        // The five subnormal binades: e - (e_lo - 5) in 0..=4 (wrapping), which less 128 are
        // the signed bytes -128..=-124.
        let from_sub = _mm256_sub_epi8(e, byte(t.e_lo.wrapping_add(123)));
        let sub = _mm256_cmpgt_epi8(byte(133), from_sub);
        let mut special = if MIXED { _mm256_setzero_si256() } else { sub };
        if NAN {
            special = _mm256_or_si256(special, _mm256_cmpeq_epi8(e, byte(0xFF)));
        }
        if _mm256_movemask_epi8(special) != 0 {
            return i;
        }
        // 8 * (e - e_lo + 6), 0 for every e under e_lo - 6 (their codes are 0), capped at
        // 8 * 28 (saturated long before); the shift moves no bit across a byte.
        let d = _mm256_min_epu8(_mm256_subs_epu8(e, byte(t.e_lo - 6)), byte(28));
        let d8 = _mm256_slli_epi16(d, 3);
        let run = _mm256_and_si256(_mm256_srli_epi16(lo, 3), byte(0x0F));
        let rises = _mm256_cmpgt_epi8(
            _mm256_and_si256(lo, byte(7)),
            _mm256_shuffle_epi8(t.rise, run),
        );
        let tm = _mm256_sub_epi8(_mm256_shuffle_epi8(t.base, run), rises);
        // T + 8 * (e - e_lo), floored at 0 and saturated at 448.
        let code = _mm256_subs_epu8(_mm256_add_epi8(d8, tm), byte(48));
        let mut code = _mm256_min_epu8(code, byte(0x7E));
        if MIXED {
            let small = if PRODUCT {
                lanes::bf16_by_product(h0, h1, first, m)
            } else {
                lanes::bf16_by_quotient(h0, h1, r)
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

//! bf16 -> e4m3fn on NEON by a per-scale table of one binade's quotients: `TBL` looks a
//! mantissa's entry up, and every code comes from it by byte shifts and adds, sixteen values
//! to an operation (the computed loop takes about twenty vector operations per four values).
//!
//! Why it is exact (the AVX2 kernel's table rests on the same first step,
//! `dtype/avx2/quant/table.rs`). For a scale k let e_lo be the first bf16 exponent field whose
//! quotients `q = RN(x / k)` are all at least 2^-6, the smallest normal e4m3 value, and ask
//! that it be at least 6 (it is for every scale above about 2^-116): binade e_lo - 1 is then a
//! normal one whose quotients are under 2^-5, and binade e_lo's lie in [2^-6, 2^-4). From six
//! binades under e_lo up, scaling x by 2^d scales q by exactly 2^d (they stay f32 normals,
//! or overflow to infinity where every code saturates anyway). Write y = 512 q for binade
//! e_lo, in [8, 32). Where y < 16 the table holds, per mantissa m, `W = 2 floor(2y) + (2y not
//! an integer)` and where y >= 16, where the value one binade lower has y / 2 in [8, 16), the
//! same of y / 2 with a bit u that moves the value up a binade: e' = e + u. Either way W is in
//! [32, 64), and with RNE the rounding of the integer W / 2^s to nearest even, d = e' - e_lo:
//!
//! - d >= 0: the code is `RNE(W / 4) + 8 d`, saturated at 0x7E: at d = 0, 512 q is under 16,
//!   where e4m3 steps by 2^-9 (the code is 512 q rounded), and each binade up adds 8;
//! - d in -5..=-1: the code is 512 q rounded to an integer (the subnormal codes and the first
//!   normal binade continue that count), `RNE(W / 2^(2 - d))`;
//! - lower: every quotient is at most 2^-10 (five binades under binade e_lo - 1), whose code
//!   is 0, which the same formula gives for any shift of 8 or more.
//!
//! Rounding W / 2^s gives the value's rounding because every boundary between two results is
//! an integer in 2y (or y), and where that is not an integer W's low bit stands for its
//! fraction, which then lies strictly between the same two integers. The sign bit is the
//! value's. Exponent 255 (infinities, NaNs) is what the table does not give: a block of sixteen
//! values holding one is computed by the caller's loop, as is every value of a run whose scale
//! has no table.

use core::arch::aarch64::*;

/// Below this many values a table's build (128 divisions) costs more than its lookups save.
pub(super) const TABLE_MIN: usize = 1024;

/// Blocks of 16 values the table's loop runs before the blocks it could not give are computed.
pub(super) const CHUNK: usize = 64;

/// One scale's codes for bf16 sources.
#[derive(Clone, Copy)]
pub(super) struct Bf16Table {
    /// Per mantissa of binade `e_lo`: W, and u as bit 6, as two 64-byte `TBL` tables.
    w: [uint8x16x4_t; 2],
    /// The first exponent field whose quotients are all normal in e4m3 (at least 6).
    e_lo: u8,
}

impl Bf16Table {
    /// The table of `k`, or `None` where k is not a positive normal f32 or no exponent field
    /// from 6 up has quotients that are all normal in e4m3.
    #[target_feature(enable = "neon")]
    pub(super) fn new(k: f32) -> Option<Self> {
        if !(k.is_normal() && k > 0.0) {
            return None;
        }
        let quotient = |e: u32, m: u32| f32::from_bits((e << 23) | (m << 16)) / k;
        let smallest_normal = 2f32.powi(-6);
        // From k's exponent field less 8 down the quotients are under 2^-8: start there.
        let from = (k.to_bits() >> 23).saturating_sub(8).max(1);
        let e_lo = (from..=254).find(|&e| quotient(e, 0) >= smallest_normal)?;
        if e_lo < 6 {
            return None;
        }
        let mut w = [0u8; 128];
        for (m, w) in (0..128u32).zip(w.iter_mut()) {
            // 1024 q is exact: a power of two times a normal q far from the top of the range.
            let y2 = 1024.0 * quotient(e_lo, m);
            // 2y, or y for the values that move up a binade.
            let (v, u) = if y2 < 32.0 { (y2, 0) } else { (y2 / 2.0, 1) };
            let floor = v.floor();
            // [16, 32) is the argument's range; anything else would not be the reference's.
            if !(16.0..32.0).contains(&floor) {
                return None;
            }
            *w = (u << 6) | (2 * floor as u8 + u8::from(v != floor));
        }
        // SAFETY: `w` is 128 bytes; each load reads 64 of them.
        let w = unsafe { [vld1q_u8_x4(w.as_ptr()), vld1q_u8_x4(w.as_ptr().add(64))] };
        Some(Bf16Table {
            w,
            e_lo: e_lo as u8,
        })
    }

    /// The codes of the bf16 values of `src` into `dst` (one byte each), sixteen at a time,
    /// blocks holding an infinity or a NaN by `block` (the computed codes of the 16 values at
    /// a pointer to 32 readable bytes); returns how many it did (the rest, under 16, is the
    /// caller's).
    #[target_feature(enable = "neon")]
    pub(super) fn encode(
        &self,
        src: &[u8],
        dst: &mut [u8],
        block: impl Fn(*const u8) -> uint8x16_t,
    ) -> usize {
        let Bf16Table { w, e_lo } = *self;
        let e_lo = vdupq_n_u8(e_lo);
        run_chunks(src, dst, block, false, move |lo, hi| {
            Self::codes(w, e_lo, lo, hi)
        })
    }

    /// The codes of sixteen bf16 values from their low and high bytes, by the table `w` whose
    /// first binade is `e_lo` (in every lane), and whether any of them is infinite or NaN
    /// (where the codes are not the reference's).
    #[target_feature(enable = "neon")]
    #[inline]
    fn codes(
        w: [uint8x16x4_t; 2],
        e_lo: uint8x16_t,
        lo: uint8x16_t,
        hi: uint8x16_t,
    ) -> (uint8x16_t, bool) {
        let exponents = vsriq_n_u8::<7>(vshlq_n_u8::<1>(hi), lo);
        let m = vandq_u8(lo, vdupq_n_u8(0x7F));
        // The first lookup gives 0 past its 64 entries; the second, indexed by m - 64,
        // fills those in and keeps the first's bytes where m - 64 wrapped past 127.
        let b = vqtbl4q_u8(w[0], m);
        let b = vqtbx4q_u8(b, w[1], vsubq_u8(m, vdupq_n_u8(64)));
        let w = vandq_u8(b, vdupq_n_u8(63));
        // e' = e + u (255 + 1 wraps, but those blocks are computed).
        let e = vsraq_n_u8::<6>(exponents, b);
        // s = 2 + min(e_lo - e', 6) (0 from binade e_lo up), negated: a negative count
        // shifts right. A shift of 8 gives 0 for W < 128, as every code under d = -5 is.
        let below = vminq_u8(vqsubq_u8(e_lo, e), vdupq_n_u8(6));
        let right = vreinterpretq_s8_u8(vsubq_u8(vdupq_n_u8(0xFE), below));
        // RNE(W / 2^s) = (W - 1 + lsb + 2^(s - 1)) >> s, lsb that of W >> s; `URSHL`
        // adds the 2^(s - 1). W - 1 + lsb >= 31: no wrap.
        let even = vbicq_u8(vdupq_n_u8(1), vshlq_u8(w, right));
        let r = vrshlq_u8(vsubq_u8(w, even), right);
        let steps = vqshlq_n_u8::<3>(vqsubq_u8(e, e_lo));
        let c = vminq_u8(vqaddq_u8(r, steps), vdupq_n_u8(0x7E));
        // The sign bit is the value's.
        let codes = vbslq_u8(vdupq_n_u8(0x80), hi, c);
        (codes, vmaxvq_u8(exponents) == 0xFF)
    }
}

/// A table's loop over the whole blocks of `src` (16-bit values) and `dst` (codes), a chunk
/// of `CHUNK` blocks at a time: `codes` gives the table's codes of a block from its values'
/// low and high bytes, and whether the block needs computing instead, which `block` (the
/// computed codes of the 16 values at a pointer to 32 readable bytes) does after the chunk.
/// The table's loop only notes those blocks so that no computed code sits inside it: with it
/// (or a call to it) there, the compiler keeps the table on the stack and reloads it every
/// block. With `give_back`, stops after a chunk where more than one block in four needed
/// computing. Returns how many values it did.
#[target_feature(enable = "neon")]
pub(super) fn run_chunks(
    src: &[u8],
    dst: &mut [u8],
    block: impl Fn(*const u8) -> uint8x16_t,
    give_back: bool,
    codes: impl Fn(uint8x16_t, uint8x16_t) -> (uint8x16_t, bool),
) -> usize {
    let n = (src.len() / 2).min(dst.len()) / 16 * 16;
    let mut odd = [0usize; CHUNK];
    for start in (0..n).step_by(16 * CHUNK) {
        let end = n.min(start + 16 * CHUNK);
        let count = lookup(&src[..2 * end], &mut dst[..end], start, &mut odd, &codes);
        for &i in &odd[..count] {
            // SAFETY: i + 16 <= n: the 32 bytes at src[2 * i..] are in bounds.
            let codes = block(unsafe { src.as_ptr().add(2 * i) });
            // SAFETY: i + 16 <= n <= dst.len(): the 16 bytes at dst[i..] are in bounds.
            unsafe { vst1q_u8(dst.as_mut_ptr().add(i), codes) };
        }
        if give_back && 4 * count > CHUNK {
            return end;
        }
    }
    n
}

/// The table's codes of the blocks of 16 values from `start` to the end of `dst` (whole
/// blocks, at most `CHUNK`; `src` holds their values), into `dst`; returns how many blocks
/// need computing, their first indices in `odd`.
#[target_feature(enable = "neon")]
#[inline]
fn lookup(
    src: &[u8],
    dst: &mut [u8],
    start: usize,
    odd: &mut [usize; CHUNK],
    codes: &impl Fn(uint8x16_t, uint8x16_t) -> (uint8x16_t, bool),
) -> usize {
    let end = dst.len();
    let len = end.saturating_sub(start);
    assert!(2 * end == src.len() && len.is_multiple_of(16) && len <= 16 * CHUNK);
    let mut count = 0;
    for i in (start..end).step_by(16) {
        // SAFETY: i + 16 <= end and 2 * end == src.len(): the 32 bytes at src[2 * i..] are in
        // bounds; byte loads need no alignment. The de-interleaving load splits each value's
        // low byte from its high byte.
        let uint8x16x2_t(lo, hi) = unsafe { vld2q_u8(src.as_ptr().add(2 * i)) };
        let (c, computed) = codes(lo, hi);
        // SAFETY: i + 16 <= end == dst.len(): the 16 bytes at dst[i..] are in bounds.
        unsafe { vst1q_u8(dst.as_mut_ptr().add(i), c) };
        // Noted always, counted only when the block needs computing: no branch.
        odd[count] = i;
        count += usize::from(computed);
    }
    count
}

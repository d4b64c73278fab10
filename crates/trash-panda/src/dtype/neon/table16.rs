//! f16 -> e4m3fn on NEON by a per-scale table of one binade's codes, for the values from that
//! binade up: the AVX2 kernel's form (`dtype/avx2/quant/table16.rs` has the argument), with
//! `TBL` on sixteen entries.
//!
//! For a scale k let e_lo be the first f16 exponent field whose quotients `RN(x / k)` are all
//! at least 2^-6, the smallest normal e4m3 value. From e_lo up, doubling x doubles its quotient
//! exactly and adds 8 to its code, so `code(e, m) = min(T[m] + 8 (e - e_lo), 0x7E)` with T the
//! codes of binade e_lo. An f16 binade has 1024 mantissas, more than `TBL` reaches, but T
//! never falls, a step of e4m3 is more than a sixteenth of the value and 64 mantissas span at
//! most a sixteenth of it: in each run of 64 mantissas T is a base, then the base plus one
//! after at most one rise. Sixteen bases and sixteen rise places are two one-register
//! lookups. The build computes where each rise is from the midpoint between the two codes'
//! values and checks it with the reference's codes on either side (two to four divisions a
//! run, where all 1024 would cost as much as a row), and declines the table where a run does
//! not fit that form.
//!
//! Under e_lo the codes follow no shift. Where binade e_lo - 1 is a normal one (e_lo >= 7),
//! five binades lower every quotient is at most 2^-10 and its code 0, as for bf16
//! (`table.rs`); the five binades between, f16 subnormals while e_lo < 7, and exponent 31
//! (infinities, NaNs) are computed by the caller's loop, a block of sixteen values at a time.
//! On weights (k about amax / 448) e_lo is 1 and one block in about twenty-five holds an f16
//! subnormal; on values that were fp8 most blocks hold a value under e_lo, so the table is not
//! built for a run whose first 1024 values would have more than one block in four computed,
//! and a run that turns so later leaves the table for the computed loop.

use core::arch::aarch64::*;

use super::table::run_chunks;
use crate::dtype::fp8::{e4m3_to_f32_bits, f32_bits_to_e4m3};
use crate::dtype::half::f16_to_f32_bits_bf;

/// One scale's codes for f16 sources, from binade `e_lo` up.
#[derive(Clone, Copy)]
pub(super) struct F16Table {
    /// T at the start of each run of 64 mantissas (the run is the mantissa's top four bits).
    base: uint8x16_t,
    /// The offset in each run after which T is one more, 63 where it does not rise.
    rise: uint8x16_t,
    /// The first exponent field whose quotients are all normal in e4m3 (1 to 30).
    e_lo: u8,
    /// Under this exponent field every code is 0: `e_lo - 5` where e_lo >= 7, else 0.
    e_zero: u8,
}

impl F16Table {
    /// The table of `k`, or `None` where k is not a positive normal f32, no f16 binade's
    /// quotients are all normal in e4m3, a run of T does not fit its form, or more than one
    /// block in four of the f16 values in `head` (the start of the run, whole blocks of it)
    /// would need computing: there the table would cost its build and give the run back.
    #[target_feature(enable = "neon")]
    pub(super) fn new(k: f32, head: &[u8]) -> Option<Self> {
        if !(k.is_normal() && k > 0.0) {
            return None;
        }
        let value = |e: u16, m: u16| f32::from_bits(f16_to_f32_bits_bf((e << 10) | m));
        let e_lo = (1..=30u16).find(|&e| value(e, 0) / k >= 2f32.powi(-6))?;
        let e_zero = if e_lo >= 7 { e_lo - 5 } else { 0 };
        let (lo_v, zero_v) = (vdupq_n_u8(e_lo as u8), vdupq_n_u8(e_zero as u8));
        let blocks = head.chunks_exact(32);
        let total = blocks.len();
        let mut computed = 0;
        for b in blocks {
            // SAFETY: `b` is 32 bytes, what the de-interleaving load reads.
            let uint8x16x2_t(_, hi) = unsafe { vld2q_u8(b.as_ptr()) };
            computed += usize::from(vmaxvq_u8(Self::computed(hi, lo_v, zero_v)) != 0);
        }
        if 4 * computed > total {
            return None;
        }
        // The reference's code (its division and encoder) of mantissa m of binade e_lo.
        let code = |m: u16| f32_bits_to_e4m3((value(e_lo, m) / k).to_bits());
        let e4m3_to_f32 = |c: u8| f32::from_bits(e4m3_to_f32_bits(c));
        let (mut base, mut rise) = ([0u8; 16], [63u8; 16]);
        for r in 0..16u16 {
            let (first, last) = (code(64 * r), code(64 * r + 63));
            base[r as usize] = first;
            if last == first {
                continue;
            }
            // T never falls, so a last code of base + 1 means one rise; more is another form.
            if last != first + 1 {
                return None;
            }
            // Where the rise is: the first offset whose x / k passes the midpoint between the
            // two codes' values, estimated in f64, then moved until the reference's codes on
            // either side of it agree (a step or none: the estimate is off by rounding only).
            let mid = (f64::from(e4m3_to_f32(first)) + f64::from(e4m3_to_f32(first + 1))) / 2.0;
            let binade = f64::from(value(e_lo, 0));
            let guess = ((mid * f64::from(k) / binade - 1.0) * 1024.0).ceil() - f64::from(64 * r);
            let mut j = guess.clamp(1.0, 63.0) as u16;
            while j < 63 && code(64 * r + j) == first {
                j += 1;
            }
            while j > 1 && code(64 * r + j - 1) != first {
                j -= 1;
            }
            rise[r as usize] = (j - 1) as u8;
        }
        Some(F16Table {
            // SAFETY: each array is 16 bytes, what the unaligned load reads.
            base: unsafe { vld1q_u8(base.as_ptr()) },
            // SAFETY: as above.
            rise: unsafe { vld1q_u8(rise.as_ptr()) },
            e_lo: e_lo as u8,
            e_zero: e_zero as u8,
        })
    }

    /// The exponent fields of sixteen f16 values from their high bytes.
    #[target_feature(enable = "neon")]
    #[inline]
    fn exponents(hi: uint8x16_t) -> uint8x16_t {
        vandq_u8(vshrq_n_u8::<2>(hi), vdupq_n_u8(0x1F))
    }

    /// All ones in the lanes (of sixteen f16 values' high bytes) that the table does not give:
    /// exponent fields from `e_zero` to under `e_lo`, and 31.
    #[target_feature(enable = "neon")]
    #[inline]
    fn computed(hi: uint8x16_t, e_lo: uint8x16_t, e_zero: uint8x16_t) -> uint8x16_t {
        let e = Self::exponents(hi);
        vorrq_u8(
            vbicq_u8(vcgeq_u8(e, e_zero), vcgeq_u8(e, e_lo)),
            vceqq_u8(e, vdupq_n_u8(0x1F)),
        )
    }

    /// The codes of the f16 values of `src` into `dst` (one byte each), sixteen at a time,
    /// blocks the table does not give by `block` (the computed codes of the 16 values at a
    /// pointer to 32 readable bytes); returns how many it did: all whole blocks, or fewer
    /// where more than one block in four needed computing (the caller computes the rest).
    #[target_feature(enable = "neon")]
    pub(super) fn encode(
        &self,
        src: &[u8],
        dst: &mut [u8],
        block: impl Fn(*const u8) -> uint8x16_t,
    ) -> usize {
        let F16Table {
            base,
            rise,
            e_lo,
            e_zero,
        } = *self;
        let (e_lo, e_zero) = (vdupq_n_u8(e_lo), vdupq_n_u8(e_zero));
        run_chunks(src, dst, block, true, move |lo, hi| {
            Self::codes(base, rise, e_lo, e_zero, lo, hi)
        })
    }

    /// The codes of sixteen f16 values from their low bytes (the mantissa's low eight bits)
    /// and high bytes (sign, five exponent bits, the mantissa's top two), by the runs' `base`
    /// and `rise` from binade `e_lo` up and zeros under `e_zero` (each in every lane), and
    /// whether any of them is one the table does not give.
    #[target_feature(enable = "neon")]
    #[inline]
    fn codes(
        base: uint8x16_t,
        rise: uint8x16_t,
        e_lo: uint8x16_t,
        e_zero: uint8x16_t,
        lo: uint8x16_t,
        hi: uint8x16_t,
    ) -> (uint8x16_t, bool) {
        let e = Self::exponents(hi);
        let run = vandq_u8(vsriq_n_u8::<6>(vshlq_n_u8::<2>(hi), lo), vdupq_n_u8(0x0F));
        // Past the rise the compare gives all ones, which is -1: base - (-1).
        let past = vcgtq_u8(vandq_u8(lo, vdupq_n_u8(0x3F)), vqtbl1q_u8(rise, run));
        let t = vsubq_u8(vqtbl1q_u8(base, run), past);
        let steps = vqshlq_n_u8::<3>(vqsubq_u8(e, e_lo));
        let c = vminq_u8(vqaddq_u8(t, steps), vdupq_n_u8(0x7E));
        let tabled = vcgeq_u8(e, e_lo);
        // Zero under binade e_zero; the sign bit is the value's.
        let codes = vbslq_u8(vdupq_n_u8(0x80), hi, vandq_u8(c, tabled));
        (codes, vmaxvq_u8(Self::computed(hi, e_lo, e_zero)) != 0)
    }
}

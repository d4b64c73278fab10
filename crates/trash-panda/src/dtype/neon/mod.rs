//! Hand-written NEON kernels for aarch64 (Apple Silicon, Graviton): fp8 expansion, f32 <-> bf16
//! and f16, and bf16/f16 -> e4m3 quantization, run at the `neon` level.
//!
//! Why not leave these to LLVM, as the other conversions are: the portable loops are shaped by
//! what vectorizes on x86. Each branch-free element function computes every case (normal,
//! subnormal, NaN) and selects, and the scaled conversions stage a chunk through an f32 buffer
//! in three passes. NEON has better tools for exactly these cases, which LLVM does not reach
//! from the scalar code:
//!
//! - `TBL` with four registers looks up 64 bytes, so the 128 results of an fp8 magnitude (the
//!   sign is the code's) are two lookups per result byte. Unscaled fp8 uses one constant table
//!   per pair of formats; a scaled expansion to bf16 or f16 builds one table per scale (per tile
//!   shared over the tile's rows for block scales), which turns the decode, the multiply and the
//!   rounding into the lookups. A scaled expansion to f32, or one whose table would not pay,
//!   decodes by table, widens, multiplies in registers ([`expand`]).
//! - `FCVTN`/`FCVTL` convert four f32 <-> f16 in one instruction, where the portable encoder
//!   emulates the subnormal rounding with per-lane shifts. Rust's f16 vector types are not
//!   stable, so these two are inline assembly ([`f16x8`], [`f16_widen`]).
//! - Quantization finds the amax on the 16-bit patterns, eight to a register, and takes the
//!   quotients and encodes them in one pass, where `FCVTNU` does the subnormal rounding
//!   ([`narrow`]). As the AVX2 kernel does (where dropping `vdivps` was measured to pay; on
//!   Arm nothing was), scales in [2^-90, f32::MAX] get the quotient without `FDIV`, from the
//!   reciprocal by Markstein's correction with `FMUL`, `FMLS` and `FMLA` (fused): the correctly
//!   rounded quotient wherever the code depends on it (the proof and the exhaustive check are
//!   in `dtype/avx2/quant.rs`: the same IEEE operations on the same range); other scales
//!   divide. Runs of [`table::TABLE_MIN`] values or more take a per-scale table instead:
//!   for bf16 one binade's quotients, from which byte shifts and adds give every code but
//!   those of infinities and NaNs ([`table`]); for f16 one binade's codes in sixteen runs of
//!   a base and a rise, for the values from the first normal binade up ([`table16`]).
//!
//! None of this was timed (no Arm machine in this project); the tables follow the AVX2
//! kernels, which measured it on x86. What guided the f32 -> bf16 rounding and the quantize
//! tables is llvm-mca's model of the loops as compiled, on Neoverse N1, V1, V2 and Apple M1
//! (`make bench-neon-model`, BENCHMARK.md): about 1.4 times fewer cycles a block
//! for the rounding and 3 to 3.7 times for the tables than the loops they replaced.
//! bf16 -> f32 is only a widening shift, written here too so
//! the level runs no per-element loop for it; everything else (f64, scaled bf16/f16/f32
//! sources, quantization from f32 or fp8) runs the portable loops, which NEON vectorizes.
//!
//! Bit-exactness: every kernel computes what the scalar element functions compute (the same
//! integer rounding, the same f32 multiply or division, or a quotient by Markstein's correction
//! that equals the division where the code depends on it, and hardware conversions whose
//! IEEE-defined results, NaN payloads included, are the reference's under the default FPCR that
//! Rust assumes: round to nearest, no flush to zero, NaNs propagated). Tails shorter than a
//! vector run the scalar functions themselves. The tests check every code and every 16-bit
//! pattern against them. As on x86, which NaN a NaN code times a NaN scale gives is not defined.

use core::arch::aarch64::*;
use core::arch::asm;

use super::fp8::{e4m3_to_f32_bits, e5m2_to_f32_bits};
use super::half::{f32_bits_to_bf16_bf, f32_bits_to_f16_bf};
use super::DType;

mod expand;
mod narrow;
mod table;
mod table16;
#[cfg(test)]
mod tests;

pub(crate) use expand::fp8_blocks;
pub(crate) use narrow::{half_amax_bits, half_to_e4m3};

/// Converts `src` to `dst` as `convert_inline` does (same checked dtypes and lengths, `scale`
/// applied in f32), when a kernel here covers the pair: fp8 to bf16, f16 or f32, scaled or not;
/// bf16 or f16 to f32 and f32 to bf16 or f16, unscaled. Returns false, having done nothing,
/// for the other pairs.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn convert(
    src: &[u8],
    src_t: DType,
    dst: &mut [u8],
    dst_t: DType,
    scale: Option<f32>,
) -> bool {
    use DType::*;
    match (src_t, dst_t, scale) {
        (F8E4M3 | F8E5M2, BF16 | F16, k) => expand::fp8_to_half(src, src_t, dst, dst_t, k),
        (F8E4M3 | F8E5M2, F32, k) => expand::fp8_to_f32(src, src_t, dst, k),
        (BF16 | F16, F32, None) => narrow::half_to_f32(src, src_t, dst),
        (F32, BF16 | F16, None) => narrow::f32_to_half(src, dst, dst_t),
        _ => return false,
    }
    true
}

/// One fp8 code to f32 bits, by the scalar reference (for tails and tables).
#[inline(always)]
fn fp8_bits(code: u8, src_t: DType) -> u32 {
    if src_t == DType::F8E5M2 {
        e5m2_to_f32_bits(code)
    } else {
        e4m3_to_f32_bits(code)
    }
}

/// f32 bits to a 16-bit destination, by the scalar reference.
#[inline(always)]
fn half_bits(w: u32, dst_t: DType) -> u16 {
    if dst_t == DType::BF16 {
        f32_bits_to_bf16_bf(w)
    } else {
        f32_bits_to_f16_bf(w)
    }
}

/// One fp8 code, times `k` when given, in a 16-bit destination: the scalar reference of the
/// expansion kernels.
#[inline(always)]
fn fp8_to_half_one(code: u8, src_t: DType, dst_t: DType, k: Option<f32>) -> u16 {
    let w = fp8_bits(code, src_t);
    let w = match k {
        Some(k) => (f32::from_bits(w) * k).to_bits(),
        None => w,
    };
    half_bits(w, dst_t)
}

/// 128 16-bit results, one per fp8 magnitude, as the four 64-byte `TBL` tables that look them
/// up: the low bytes of magnitudes 0-63 and 64-127, then the high bytes.
struct Lut {
    lo: [uint8x16x4_t; 2],
    hi: [uint8x16x4_t; 2],
}

impl Lut {
    /// The table of `results`, the 128 results as little-endian u16 in magnitude order.
    #[target_feature(enable = "neon")]
    fn new(results: &[u8; 256]) -> Lut {
        let mut v = [vdupq_n_u8(0); 16];
        for q in 0..8 {
            // SAFETY: 32 * q + 32 <= 256 = results.len(); vld2q_u8 reads 32 bytes, unaligned.
            let pair = unsafe { vld2q_u8(results.as_ptr().add(32 * q)) };
            // The de-interleaving load splits low (even) and high (odd) bytes.
            v[q] = pair.0;
            v[8 + q] = pair.1;
        }
        Lut {
            lo: [
                uint8x16x4_t(v[0], v[1], v[2], v[3]),
                uint8x16x4_t(v[4], v[5], v[6], v[7]),
            ],
            hi: [
                uint8x16x4_t(v[8], v[9], v[10], v[11]),
                uint8x16x4_t(v[12], v[13], v[14], v[15]),
            ],
        }
    }

    /// The low and high bytes of the results of 16 codes, the code's sign bit flipping the
    /// result's (bit 15). The first lookup gives zero past its 64 entries; the second, indexed
    /// by the magnitude with bit 6 flipped, keeps the first's bytes for magnitudes below 64
    /// (whose flipped index is past its table) and fills in the others.
    #[target_feature(enable = "neon")]
    #[inline]
    fn look(&self, codes: uint8x16_t) -> (uint8x16_t, uint8x16_t) {
        let mag = vandq_u8(codes, vdupq_n_u8(0x7F));
        let upper = veorq_u8(mag, vdupq_n_u8(0x40));
        let lo = vqtbx4q_u8(vqtbl4q_u8(self.lo[0], mag), self.lo[1], upper);
        let hi = vqtbx4q_u8(vqtbl4q_u8(self.hi[0], mag), self.hi[1], upper);
        let hi = veorq_u8(hi, vandq_u8(codes, vdupq_n_u8(0x80)));
        (lo, hi)
    }
}

/// Rounds eight f32 (bits in `a`, then `b`) to bf16 as `f32_bits_to_bf16_bf`: the high half
/// plus the carry of `low half + 0x7FFF + the high half's lsb`, NaN -> `0x7FC0 | sign`.
///
/// On the halves split apart, eight lanes to a register: `URHADD` of the low half and
/// `0x7FFE + lsb` computes `(low + 0x7FFF + lsb) >> 1` without losing the carry, which is then
/// its top bit, and `USRA` adds it to the high half; eleven operations for eight values where
/// rounding in 32-bit lanes took seventeen.
#[target_feature(enable = "neon")]
#[inline]
fn bf16x8(a: uint32x4_t, b: uint32x4_t) -> uint16x8_t {
    let (a16, b16) = (vreinterpretq_u16_u32(a), vreinterpretq_u16_u32(b));
    let (low, high) = (vuzp1q_u16(a16, b16), vuzp2q_u16(a16, b16));
    // 0x7FFE with the high half's lsb as bit 0.
    let bias = vbslq_u16(vdupq_n_u16(1), high, vdupq_n_u16(0x7FFE));
    let rounded = vsraq_n_u16::<15>(high, vrhaddq_u16(low, bias));
    let ordered = |w: uint32x4_t| {
        let x = vreinterpretq_f32_u32(w);
        vreinterpretq_u16_u32(vceqq_f32(x, x))
    };
    let number = vuzp1q_u16(ordered(a), ordered(b));
    let nan = vbslq_u16(vdupq_n_u16(0x8000), high, vdupq_n_u16(0x7FC0));
    vbslq_u16(number, rounded, nan)
}

/// Rounds eight f32 (`a`, then `b`) to f16 bits with `FCVTN`/`FCVTN2`: nearest even, overflow
/// to infinity, subnormals kept, a NaN keeping its sign and upper payload and turning quiet,
/// which is `f32_bits_to_f16_bf` bit for bit.
#[target_feature(enable = "neon")]
#[inline]
fn f16x8(a: float32x4_t, b: float32x4_t) -> uint16x8_t {
    let r: uint16x8_t;
    // SAFETY: two register-only conversions: no memory, no stack; they may set FPSR's
    // cumulative exception bits, hence no `preserves_flags`. `r` is an `out` (not `lateout`)
    // operand, so it shares no register with `b`, which the second instruction still reads.
    unsafe {
        asm!(
            "fcvtn {r:v}.4h, {a:v}.4s",
            "fcvtn2 {r:v}.8h, {b:v}.4s",
            r = out(vreg) r,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack),
        );
    }
    r
}

/// Widens eight f16 to f32 with `FCVTL`/`FCVTL2`: exact, a NaN keeping its sign and payload and
/// turning quiet, which is `f16_to_f32_bits_bf` bit for bit.
#[target_feature(enable = "neon")]
#[inline]
fn f16_widen(h: uint16x8_t) -> (float32x4_t, float32x4_t) {
    let (a, b): (float32x4_t, float32x4_t);
    // SAFETY: two register-only conversions of `h`: no memory, no stack; FPSR's exception bits
    // may change, hence no `preserves_flags`. `a` is an `out` (not `lateout`) operand, so the
    // first instruction cannot overwrite `h` before the second reads it.
    unsafe {
        asm!(
            "fcvtl {a:v}.4s, {h:v}.4h",
            "fcvtl2 {b:v}.4s, {h:v}.8h",
            a = out(vreg) a,
            b = out(vreg) b,
            h = in(vreg) h,
            options(pure, nomem, nostack),
        );
    }
    (a, b)
}

/// Widens eight bf16 to f32 (appends sixteen zero bits).
#[target_feature(enable = "neon")]
#[inline]
fn bf16_widen(h: uint16x8_t) -> (float32x4_t, float32x4_t) {
    (
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
    )
}

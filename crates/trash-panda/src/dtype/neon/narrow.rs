//! The 16-bit formats on NEON: bf16/f16 <-> f32 without a scale, and bf16/f16 -> e4m3fn
//! quantization (the amax, and the quotient-and-encode pass, which for the scales quantization
//! makes takes the quotient without a division: see [`Reciprocal`]).

use core::arch::aarch64::*;

use super::table::{Bf16Table, TABLE_MIN};
use super::table16::F16Table;
use super::{bf16_widen, bf16x8, f16_widen, f16x8, half_bits};
use crate::dtype::fp8::f32_bits_to_e4m3;
use crate::dtype::half::f16_to_f32_bits_bf;
use crate::dtype::DType;

/// Eight bf16 or f16 values (little-endian at `p`) as f32.
///
/// # Safety
/// The 16 bytes at `p` must be readable.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn load8(p: *const u8, src_t: DType) -> (float32x4_t, float32x4_t) {
    // SAFETY: the caller guarantees 16 readable bytes; byte loads need no alignment.
    let h = vreinterpretq_u16_u8(unsafe { vld1q_u8(p) });
    if src_t == DType::BF16 {
        bf16_widen(h)
    } else {
        f16_widen(h)
    }
}

/// One bf16 or f16 value as f32 bits, by the scalar reference.
#[inline(always)]
fn widen_one(h: u16, src_t: DType) -> u32 {
    if src_t == DType::BF16 {
        u32::from(h) << 16
    } else {
        f16_to_f32_bits_bf(h)
    }
}

/// bf16 or f16 values of `src` to f32 in `dst`.
#[target_feature(enable = "neon")]
pub(super) fn half_to_f32(src: &[u8], src_t: DType, dst: &mut [u8]) {
    let n = (src.len() / 2).min(dst.len() / 4);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: 2 * (i + 8) <= 2 * n <= src.len(): 16 bytes at src[2 * i..] are in bounds.
        let (a, b) = unsafe { load8(src.as_ptr().add(2 * i), src_t) };
        // SAFETY: 4 * (i + 8) <= 4 * n <= dst.len(): the 32 bytes at dst[4 * i..] are in
        // bounds; byte stores need no alignment.
        unsafe {
            let p = dst.as_mut_ptr().add(4 * i);
            vst1q_u8(p, vreinterpretq_u8_f32(a));
            vst1q_u8(p.add(16), vreinterpretq_u8_f32(b));
        }
        i += 8;
    }
    let rest = src[2 * i..2 * n].chunks_exact(2);
    for (s, d) in rest.zip(dst[4 * i..].chunks_exact_mut(4)) {
        let w = widen_one(u16::from_le_bytes([s[0], s[1]]), src_t);
        d.copy_from_slice(&w.to_le_bytes());
    }
}

/// f32 values of `src` rounded to bf16 or f16 in `dst`.
#[target_feature(enable = "neon")]
pub(super) fn f32_to_half(src: &[u8], dst: &mut [u8], dst_t: DType) {
    let n = (src.len() / 4).min(dst.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: 4 * (i + 8) <= 4 * n <= src.len(): the 32 bytes at src[4 * i..] are in
        // bounds; byte loads need no alignment.
        let (a, b) = unsafe {
            let p = src.as_ptr().add(4 * i);
            (
                vreinterpretq_u32_u8(vld1q_u8(p)),
                vreinterpretq_u32_u8(vld1q_u8(p.add(16))),
            )
        };
        let h = if dst_t == DType::BF16 {
            bf16x8(a, b)
        } else {
            f16x8(vreinterpretq_f32_u32(a), vreinterpretq_f32_u32(b))
        };
        // SAFETY: 2 * (i + 8) <= 2 * n <= dst.len(): the 16 bytes at dst[2 * i..] are in bounds.
        unsafe { vst1q_u8(dst.as_mut_ptr().add(2 * i), vreinterpretq_u8_u16(h)) };
        i += 8;
    }
    for (s, d) in src[4 * i..4 * n]
        .chunks_exact(4)
        .zip(dst[2 * i..].chunks_exact_mut(2))
    {
        let h = half_bits(u32::from_le_bytes([s[0], s[1], s[2], s[3]]), dst_t);
        d.copy_from_slice(&h.to_le_bytes());
    }
}

/// The bits of max |x| over the non-NaN bf16 or f16 values of `src`, as f32 bits (0 when there
/// are none): what `amax_bits` gives for these sources. Both formats order like their bit
/// patterns once the sign is cleared, so the max runs on the 16-bit patterns, eight to a
/// register, and only the winner is widened.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn half_amax_bits(src: &[u8], src_t: DType) -> u32 {
    // The largest non-NaN magnitude: infinity.
    let inf: u16 = if src_t == DType::BF16 { 0x7F80 } else { 0x7C00 };
    let n = src.len() / 2;
    let (mut best0, mut best1) = (vdupq_n_u16(0), vdupq_n_u16(0));
    let keep = |h: uint16x8_t| {
        let a = vandq_u16(h, vdupq_n_u16(0x7FFF));
        // NaNs count as 0.
        vbicq_u16(a, vcgtq_u16(a, vdupq_n_u16(inf)))
    };
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 2 * (i + 16) <= 2 * n <= src.len(): the 32 bytes at src[2 * i..] are in
        // bounds; byte loads need no alignment.
        let (h0, h1) = unsafe {
            let p = src.as_ptr().add(2 * i);
            (
                vreinterpretq_u16_u8(vld1q_u8(p)),
                vreinterpretq_u16_u8(vld1q_u8(p.add(16))),
            )
        };
        // Two accumulators, so consecutive maxes do not wait on each other.
        best0 = vmaxq_u16(best0, keep(h0));
        best1 = vmaxq_u16(best1, keep(h1));
        i += 16;
    }
    let mut m = vmaxvq_u16(vmaxq_u16(best0, best1));
    for s in src[2 * i..2 * n].chunks_exact(2) {
        let a = u16::from_le_bytes([s[0], s[1]]) & 0x7FFF;
        m = m.max(if a > inf { 0 } else { a });
    }
    widen_one(m, src_t)
}

/// The e4m3fn codes of four quotients q, given as `v = 512 * q` (at that scale the subnormal
/// codes are the integers `FCVTNU` rounds to), one per 32-bit lane, as `f32_bits_to_e4m3`
/// gives them for q, each with the sign bit of its lane of `s`. `v` may be infinite where
/// 512 * q overflows: everything from 448 on saturates alike.
#[target_feature(enable = "neon")]
#[inline]
fn e4m3x4(v: float32x4_t, s: float32x4_t) -> uint32x4_t {
    let a = vandq_u32(vreinterpretq_u32_f32(v), vdupq_n_u32(0x7FFF_FFFF));
    let sign = vandq_u32(
        vshrq_n_u32::<24>(vreinterpretq_u32_f32(s)),
        vdupq_n_u32(0x80),
    );
    // Normal range, as the scalar code: add just under half an ulp plus the kept lsb, truncate,
    // rebias 127 + 9 -> 7 (wrapping for the small values the subnormal branch replaces).
    let lsb = vandq_u32(vshrq_n_u32::<20>(a), vdupq_n_u32(1));
    let rounded = vaddq_u32(vaddq_u32(a, vdupq_n_u32(0x7_FFFF)), lsb);
    let normal = vsubq_u32(vshrq_n_u32::<20>(rounded), vdupq_n_u32(129 << 3));
    // Codes rise with the magnitude and 448 (or anything rounding to it) is 0x7E, so a min is
    // the saturation of everything at or above it, infinity and NaN included.
    let normal = vminq_u32(normal, vdupq_n_u32(0x7E));
    // Below 2^-6 (v < 8): the count of 2^-9 steps is v itself, rounded to nearest even by
    // `FCVTNU`, as the scalar shift-and-round does.
    let sub = vcvtnq_u32_f32(vreinterpretq_f32_u32(a));
    let code = vbslq_u32(vcltq_u32(a, vdupq_n_u32(0x4100_0000)), sub, normal);
    // NaN: the saturated 0x7E | 1 = 0x7F.
    let nan = vcgtq_u32(a, vdupq_n_u32(0x7F80_0000));
    let code = vorrq_u32(code, vandq_u32(nan, vdupq_n_u32(1)));
    vorrq_u32(code, sign)
}

/// A scale the divide-free loop takes, prepared for [`Reciprocal::quotient`]: `k / 512`
/// (exact: a power of two, far from the ends of the f32 range) and its correctly rounded
/// reciprocal, so the loop computes `v = 512 * (x / k)` as the quotient by `k / 512`.
#[derive(Clone, Copy)]
pub(super) struct Reciprocal {
    k: f32,
    y: f32,
}

impl Reciprocal {
    /// `k` if it is finite and at least 2^-90 (every scale `amax / 448` above 2^-81 is), the
    /// range of the AVX2 kernel's reciprocal, where its proof holds; other scales divide.
    pub(super) fn new(k: f32) -> Option<Reciprocal> {
        if !(k >= f32::from_bits(0x0A80_0000) && k <= f32::MAX) {
            return None;
        }
        let k = k / 512.0;
        Some(Reciprocal { k, y: 1.0 / k })
    }

    /// `RN(x / k)` (k as stored: the scale / 512) for four values, by Markstein's correction:
    /// `q0 = RN(x * y)`, `r = x - q0 * k` (exact: `FMLS` is fused), `q = RN(q0 + r * y)`
    /// (`FMLA`). Exact wherever the code depends on it, as the AVX2 kernel's module comment
    /// (`dtype/avx2/quant.rs`) shows for these same IEEE operations. The one sign it can lose
    /// is a zero's: -0 gives +0 (the caller takes the signs from x).
    ///
    /// Where q0 is infinite (x infinite, or a product that overflows) the correction would be
    /// inf - inf, a NaN: q0 is kept there, which saturates as the division does; a NaN x
    /// stays NaN.
    #[target_feature(enable = "neon")]
    #[inline]
    pub(super) fn quotient(self, x: float32x4_t) -> float32x4_t {
        let (k, y) = (vdupq_n_f32(self.k), vdupq_n_f32(self.y));
        let q0 = vmulq_f32(x, y);
        let r = vfmsq_f32(x, q0, k);
        let q = vfmaq_f32(q0, r, y);
        vbslq_f32(vcaltq_f32(q0, vdupq_n_f32(f32::INFINITY)), q, q0)
    }
}

/// `e4m3fn(clamp(x / k, -448, 448))` for the bf16 or f16 values of `src` into `dst` (one byte
/// each): what `encode_scaled` gives for these sources; the clamp is the encoder's saturation.
/// Scales in [2^-90, f32::MAX] (all that quantization makes in practice) take the quotient
/// without a division ([`Reciprocal`]); the others, and the scalar tail, divide.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn half_to_e4m3(src: &[u8], src_t: DType, dst: &mut [u8], k: f32) {
    let n = (src.len() / 2).min(dst.len());
    let (src, dst) = (&src[..2 * n], &mut dst[..n]);
    let i = match Reciprocal::new(k) {
        // x, not the quotient, carries the sign: k is positive, and a -0 quotient comes out +0.
        Some(r) => encode_16(src, src_t, dst, k, |x| e4m3x4(r.quotient(x), x)),
        None => {
            let kv = vdupq_n_f32(k);
            encode_16(src, src_t, dst, k, |x| {
                // Multiplying by 512 is exact, or overflows where the code saturates anyway.
                let q = vdivq_f32(x, kv);
                e4m3x4(vmulq_n_f32(q, 512.0), q)
            })
        }
    };
    for (s, d) in src[2 * i..].chunks_exact(2).zip(&mut dst[i..]) {
        let x = f32::from_bits(widen_one(u16::from_le_bytes([s[0], s[1]]), src_t));
        *d = f32_bits_to_e4m3((x / k).to_bits());
    }
}

/// The codes that `code` gives for four widened values, for the 16 bf16 or f16 values at `p`.
///
/// # Safety
/// The 32 bytes at `p` must be readable.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn codes_16(
    p: *const u8,
    src_t: DType,
    code: &impl Fn(float32x4_t) -> uint32x4_t,
) -> uint8x16_t {
    // SAFETY: the caller's 32 bytes, 16 for each call.
    let ((a, b), (c, d)) = unsafe { (load8(p, src_t), load8(p.add(16), src_t)) };
    // Four calls, not `map(code)`: through the reference LLVM left the closure out of line.
    let q = [code(a), code(b), code(c), code(d)];
    // Codes fit a byte: the narrowing moves are exact.
    let first = vmovn_high_u32(vmovn_u32(q[0]), q[1]);
    let second = vmovn_high_u32(vmovn_u32(q[2]), q[3]);
    vmovn_high_u16(vmovn_u16(first), second)
}

/// The codes that `code` gives for four widened values, for the bf16 or f16 values of `src`
/// into `dst`, sixteen at a time: looked up in the scale's table where `src` is a long run and
/// `k` has one ([`Bf16Table`], [`F16Table`], which may hand the rest of the run back), else
/// computed. Returns how many it did (the rest, under 16, is the caller's).
#[target_feature(enable = "neon")]
#[inline]
fn encode_16(
    src: &[u8],
    src_t: DType,
    dst: &mut [u8],
    k: f32,
    code: impl Fn(float32x4_t) -> uint32x4_t,
) -> usize {
    let n = (src.len() / 2).min(dst.len());
    let block = |p: *const u8| {
        // SAFETY: every caller of `block` (the loops below and the table's) passes a pointer
        // to 32 readable bytes.
        unsafe { codes_16(p, src_t, &code) }
    };
    let mut i = 0;
    if n >= TABLE_MIN {
        if src_t == DType::BF16 {
            if let Some(table) = Bf16Table::new(k) {
                return table.encode(src, dst, block);
            }
        } else if let Some(table) = F16Table::new(k, &src[..src.len().min(2 * TABLE_MIN)]) {
            i = table.encode(src, dst, block);
        }
    }
    while i + 16 <= n {
        // SAFETY: 2 * (i + 16) <= 2 * n <= src.len(): the 32 bytes at src[2 * i..] are in
        // bounds.
        let bytes = block(unsafe { src.as_ptr().add(2 * i) });
        // SAFETY: i + 16 <= n <= dst.len(): the 16 bytes at dst[i..] are in bounds.
        unsafe { vst1q_u8(dst.as_mut_ptr().add(i), bytes) };
        i += 16;
    }
    i
}

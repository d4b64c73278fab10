//! The element loops over byte slices, and the dispatch to the hand-written kernels.
//!
//! Every loop is plain Rust over `chunks_exact` (so unaligned slices cost nothing: the loads and
//! stores become unaligned vector moves) with branch-free element functions, which LLVM
//! vectorizes. [`multiversion!`] compiles each entry point twice more, with AVX-512 and with AVX2
//! enabled, and runs the [`SimdLevel`] that [`level`] gives once per call (a forced one, else
//! `TRASH_PANDA_SIMD`, else the best the CPU has); elsewhere the portable build runs. Where a
//! hand-written kernel of `avx2` or `neon` covers a pair at that level, it runs instead.
//!
//! Conversions other than the direct pairs go through a small f32 buffer on the stack: decode a
//! chunk, scale it, encode it. The buffer stays in L1, and each of the three loops vectorizes on
//! its own where one fused loop over mixed types would not.

use super::fp8::{
    e4m3_to_bf16_bits, e4m3_to_f32_bits, e5m2_to_bf16_bits, e5m2_to_f32_bits, f32_bits_to_e4m3,
};
use super::half::{f16_to_f32_bits_bf, f32_bits_to_bf16_bf, f32_bits_to_f16_bf, f64_to_f32_odd};
use super::level::{level, multiversion, SimdLevel};
pub(crate) use super::stores::Stores;
use super::DType;

/// Elements per staged chunk: 1 KiB of f32, small enough for L1 alongside the streams.
pub(crate) const CHUNK: usize = 256;

/// The code that converts `src` to `dst` at this thread's level (see
/// [`simd_level`](super::simd_level)), for benchmarks and logs: "hand-written avx2" or "hand-written neon" for the kernels of those
/// modules, else the generic loops and the level they are compiled for. `dst` = fp8 e4m3 means
/// quantization. (Block scales with an f32 destination take the generic loops on AVX2 whatever
/// this says.)
pub fn kernel_path(src: DType, dst: DType) -> String {
    let lvl = level();
    #[cfg(target_arch = "aarch64")]
    if lvl == SimdLevel::Neon {
        use DType::*;
        if matches!(
            (src, dst),
            (F8E4M3 | F8E5M2, BF16 | F32 | F16) | (F32, BF16 | F16) | (BF16 | F16, F32 | F8E4M3)
        ) {
            return "hand-written neon".to_owned();
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (src, dst);
    #[cfg(target_arch = "x86_64")]
    if matches!(lvl, SimdLevel::Avx2 | SimdLevel::Avx512) {
        use DType::*;
        let hand = match (src, dst) {
            (F8E4M3 | F8E5M2, BF16 | F32 | F16) => Some("table"),
            (F32, BF16) => Some("round and pack"),
            (F32, F16) => Some("f16c"),
            (BF16 | F16, F8E4M3) => Some("reciprocal or table, and encode"),
            _ => None,
        };
        if let Some(how) = hand {
            return format!("hand-written avx2 ({how})");
        }
    }
    format!("generic loops ({lvl})")
}

/// Converts equal element counts of `src` to `dst`, multiplying by `scale` in f32 when given.
/// The caller has checked the dtypes (float source; f64, f32, f16 or bf16 destination) and the
/// lengths.
#[inline(always)]
pub(crate) fn convert_inline(
    src: &[u8],
    src_t: DType,
    dst: &mut [u8],
    dst_t: DType,
    scale: Option<f32>,
    stores: Stores,
) {
    #[cfg(target_arch = "aarch64")]
    if level() == SimdLevel::Neon {
        // SAFETY: `level()` returns Neon only when this CPU has NEON, the feature the kernels
        // are compiled with.
        if unsafe { super::neon::convert(src, src_t, dst, dst_t, scale) } {
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(fmt) = super::avx2::fp8_to_bf16(src_t, dst_t) {
        // fp8 -> bf16, scaled or not (a scale of 1 is exact): the table kernel beats the
        // staging loops and the direct loops at both levels (see avx2/mod.rs).
        // SAFETY: `fp8_to_bf16` answers only at a level whose CPU has AVX2, FMA and F16C, the
        // features the kernel is compiled with.
        unsafe {
            super::avx2::fp8::fp8_to_bf16_scaled(fmt, src, dst, scale.unwrap_or(1.0), stores)
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some((fmt, half)) = super::avx2::fp8_to_wide(src_t, dst_t) {
        // fp8 -> f32 or f16 the same way, four bytes a result (then F16C for f16).
        let k = scale.unwrap_or(1.0);
        // SAFETY: as above.
        unsafe { super::avx2::wide::fp8_to_wide_scaled(fmt, half, src, dst, k, stores) };
        return;
    }
    if scale.is_none() && direct(src, src_t, dst, dst_t, stores) {
        return;
    }
    // Without a scale a 16-bit destination must see the f64 rounded once, hence round-to-odd;
    // with one, the reference first rounds to f32 (`w.to(float32) * scale`).
    let odd = scale.is_none() && dst_t != DType::F32 && dst_t != DType::F64;
    let mut buf = [0f32; CHUNK];
    let (ss, ds) = (src_t.size(), dst_t.size());
    for (s, d) in src.chunks(CHUNK * ss).zip(dst.chunks_mut(CHUNK * ds)) {
        let b = &mut buf[..s.len() / ss];
        if dst_t == DType::F64 {
            // f64 out: only reachable unscaled; decode f64 sources straight through.
            if src_t == DType::F64 {
                d.copy_from_slice(s);
                continue;
            }
            decode(s, src_t, false, b);
            for (x, o) in b.iter().zip(d.chunks_exact_mut(8)) {
                o.copy_from_slice(&f64::from(*x).to_le_bytes());
            }
            continue;
        }
        decode(s, src_t, odd, b);
        if let Some(k) = scale {
            for x in b.iter_mut() {
                *x *= k;
            }
        }
        encode(b, d, dst_t);
    }
}

multiversion! {
    /// [`convert_inline`] for one contiguous run, compiled for the CPU.
    fn convert(
        src: &[u8],
        src_t: DType,
        dst: &mut [u8],
        dst_t: DType,
        scale: Option<f32>,
        stores: Stores,
    ) {
        convert_inline(src, src_t, dst, dst_t, scale, stores)
    }
}

/// Loops for the pairs that need no staging. Returns false for the others.
#[inline(always)]
fn direct(src: &[u8], src_t: DType, dst: &mut [u8], dst_t: DType, stores: Stores) -> bool {
    use DType::*;
    #[cfg(target_arch = "x86_64")]
    if src_t == F32
        && matches!(dst_t, BF16 | F16)
        && matches!(level(), SimdLevel::Avx2 | SimdLevel::Avx512)
    {
        // SAFETY: `level()` returns these levels only when this CPU has AVX2, FMA and F16C
        // (`SimdLevel::is_supported`), the features the kernels are compiled with.
        unsafe {
            if dst_t == BF16 {
                super::avx2::cast::f32_to_bf16(src, dst, stores);
            } else {
                super::avx2::cast::f32_to_f16(src, dst, stores);
            }
        }
        return true;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = stores;
    match (src_t, dst_t) {
        (a, b) if a == b => dst.copy_from_slice(src),
        (F8E4M3, BF16) => map_8_16(src, dst, e4m3_to_bf16_bits),
        (F8E5M2, BF16) => map_8_16(src, dst, e5m2_to_bf16_bits),
        (F8E4M3, F32) => map_8_32(src, dst, e4m3_to_f32_bits),
        (F8E5M2, F32) => map_8_32(src, dst, e5m2_to_f32_bits),
        (BF16, F32) => map_16_32(src, dst, |h| u32::from(h) << 16),
        (F16, F32) => map_16_32(src, dst, f16_to_f32_bits_bf),
        (F32, BF16) => map_32_16(src, dst, f32_bits_to_bf16_bf),
        (F32, F16) => map_32_16(src, dst, f32_bits_to_f16_bf),
        _ => return false,
    }
    true
}

/// Reads a little-endian u16 from a 2-byte chunk. The fixed-size copy is what LLVM recognises
/// as one (vectorizable) load; building the value from indexed bytes defeats the vectorizer.
#[inline(always)]
fn le_u16(s: &[u8]) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(s);
    u16::from_le_bytes(b)
}

/// Reads a little-endian u32 from a 4-byte chunk (see [`le_u16`]).
#[inline(always)]
fn le_u32(s: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(s);
    u32::from_le_bytes(b)
}

#[inline(always)]
fn map_8_16(src: &[u8], dst: &mut [u8], f: impl Fn(u8) -> u16) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f(*s).to_le_bytes());
    }
}

#[inline(always)]
fn map_8_32(src: &[u8], dst: &mut [u8], f: impl Fn(u8) -> u32) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&f(*s).to_le_bytes());
    }
}

#[inline(always)]
fn map_16_32(src: &[u8], dst: &mut [u8], f: impl Fn(u16) -> u32) {
    for (s, d) in src.chunks_exact(2).zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&f(le_u16(s)).to_le_bytes());
    }
}

#[inline(always)]
fn map_32_16(src: &[u8], dst: &mut [u8], f: impl Fn(u32) -> u16) {
    for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f(le_u32(s)).to_le_bytes());
    }
}

/// Decodes `out.len()` elements of `src` to f32. `odd` narrows f64 with round-to-odd.
#[inline(always)]
pub(crate) fn decode(src: &[u8], src_t: DType, odd: bool, out: &mut [f32]) {
    match src_t {
        DType::F8E4M3 => {
            for (s, o) in src.iter().zip(out.iter_mut()) {
                *o = f32::from_bits(e4m3_to_f32_bits(*s));
            }
        }
        DType::F8E5M2 => {
            for (s, o) in src.iter().zip(out.iter_mut()) {
                *o = f32::from_bits(e5m2_to_f32_bits(*s));
            }
        }
        DType::I8 => {
            for (s, o) in src.iter().zip(out.iter_mut()) {
                *o = f32::from(*s as i8);
            }
        }
        DType::BF16 => {
            for (s, o) in src.chunks_exact(2).zip(out.iter_mut()) {
                *o = f32::from_bits(u32::from(le_u16(s)) << 16);
            }
        }
        DType::F16 => {
            for (s, o) in src.chunks_exact(2).zip(out.iter_mut()) {
                *o = f32::from_bits(f16_to_f32_bits_bf(le_u16(s)));
            }
        }
        DType::F32 => {
            for (s, o) in src.chunks_exact(4).zip(out.iter_mut()) {
                *o = f32::from_bits(le_u32(s));
            }
        }
        DType::F64 => {
            for (s, o) in src.chunks_exact(8).zip(out.iter_mut()) {
                let mut b = [0u8; 8];
                b.copy_from_slice(s);
                let x = f64::from_le_bytes(b);
                *o = if odd { f64_to_f32_odd(x) } else { x as f32 };
            }
        }
        // Unreachable after validation; zeros rather than a panic keep the kernels total.
        _ => out.fill(0.0),
    }
}

/// Encodes f32 values to `dst_t` (f32, f16 or bf16) in `dst`.
#[inline(always)]
pub(crate) fn encode(inp: &[f32], dst: &mut [u8], dst_t: DType) {
    match dst_t {
        DType::BF16 => {
            for (x, d) in inp.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&f32_bits_to_bf16_bf(x.to_bits()).to_le_bytes());
            }
        }
        DType::F16 => {
            for (x, d) in inp.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&f32_bits_to_f16_bf(x.to_bits()).to_le_bytes());
            }
        }
        DType::F32 => {
            for (x, d) in inp.iter().zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        DType::F8E4M3 => {
            for (x, d) in inp.iter().zip(dst.iter_mut()) {
                *d = f32_bits_to_e4m3(x.to_bits());
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::level::{supported_simd_levels, with_simd_level};

    #[test]
    fn every_level_agrees_with_the_portable_build() {
        let mut x = 0x1234_5678_9ABC_DEF1u64;
        let src: Vec<u8> = (0..8 * 4099 + 3)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let types = [
            DType::F64,
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F8E4M3,
            DType::F8E5M2,
        ];
        for st in types {
            for dt in [DType::F64, DType::F32, DType::F16, DType::BF16] {
                for scale in [None, Some(0.37f32)] {
                    if dt == DType::F64 && scale.is_some() {
                        continue;
                    }
                    let n = 4099;
                    let s = &src[3..3 + n * st.size()];
                    let run = |l| {
                        let mut out = vec![0u8; n * dt.size()];
                        with_simd_level(l, || convert(s, st, &mut out, dt, scale, Stores::Cached))
                            .unwrap();
                        out
                    };
                    let portable = run(SimdLevel::Portable);
                    for l in supported_simd_levels() {
                        assert!(run(l) == portable, "{l}: {st}->{dt} scale {scale:?}");
                    }
                }
            }
        }
    }
}

//! The element loops over byte slices, and their selection at run time.
//!
//! Every loop is plain Rust over `chunks_exact` (so unaligned slices cost nothing: the loads and
//! stores become unaligned vector moves) with branch-free element functions, which LLVM
//! vectorizes. [`multiversion!`] compiles each entry point twice more, with AVX-512 and with AVX2
//! enabled, and picks the best the CPU has once per call; elsewhere the portable build runs.
//!
//! Conversions other than the direct pairs go through a small f32 buffer on the stack: decode a
//! chunk, scale it, encode it. The buffer stays in L1, and each of the three loops vectorizes on
//! its own where one fused loop over mixed types would not.

use super::cast::{f16_to_f32_bits_bf, f32_bits_to_bf16_bf, f32_bits_to_f16_bf, f64_to_f32_odd};
use super::fp8::{
    e4m3_to_bf16_bits, e4m3_to_f32_bits, e5m2_to_bf16_bits, e5m2_to_f32_bits, f32_bits_to_e4m3,
};
use super::DType;

/// Elements per staged chunk: 1 KiB of f32, small enough for L1 alongside the streams.
pub(crate) const CHUNK: usize = 256;

#[cfg(test)]
pub(crate) static FORCE_PORTABLE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Which compiled variant runs; `FORCE_PORTABLE` lets tests compare it with the portable one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

pub(crate) fn level() -> Level {
    #[cfg(test)]
    if FORCE_PORTABLE.load(std::sync::atomic::Ordering::Relaxed) {
        return Level::Portable;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
        {
            return Level::Avx512;
        }
        if std::is_x86_feature_detected!("avx2") {
            return Level::Avx2;
        }
    }
    Level::Portable
}

/// Defines `pub(crate) fn $name` that runs `$body` compiled for the best instruction set found.
macro_rules! multiversion {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            match level() {
                #[cfg(target_arch = "x86_64")]
                Level::Avx512 => {
                    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                    unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                    // SAFETY: `level()` returned Avx512 only after detecting every feature
                    // enabled here on this CPU.
                    unsafe { avx512($($arg),*) }
                }
                #[cfg(target_arch = "x86_64")]
                Level::Avx2 => {
                    #[target_feature(enable = "avx2")]
                    unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                    // SAFETY: `level()` returned Avx2 only after detecting avx2 on this CPU.
                    unsafe { avx2($($arg),*) }
                }
                Level::Portable => body($($arg),*),
            }
        }
    };
}
pub(crate) use multiversion;

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
) {
    if scale.is_none() && direct(src, src_t, dst, dst_t) {
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
    fn convert(src: &[u8], src_t: DType, dst: &mut [u8], dst_t: DType, scale: Option<f32>) {
        convert_inline(src, src_t, dst, dst_t, scale)
    }
}

/// Loops for the pairs that need no staging. Returns false for the others.
#[inline(always)]
fn direct(src: &[u8], src_t: DType, dst: &mut [u8], dst_t: DType) -> bool {
    use DType::*;
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
    use std::sync::atomic::Ordering;

    #[test]
    fn compiled_variants_agree_with_the_portable_build() {
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
                    let mut fast = vec![0u8; n * dt.size()];
                    let mut portable = vec![0u8; n * dt.size()];
                    convert(s, st, &mut fast, dt, scale);
                    FORCE_PORTABLE.store(true, Ordering::Relaxed);
                    convert(s, st, &mut portable, dt, scale);
                    FORCE_PORTABLE.store(false, Ordering::Relaxed);
                    assert!(fast == portable, "{st}->{dt} scale {scale:?}");
                }
            }
        }
    }
}

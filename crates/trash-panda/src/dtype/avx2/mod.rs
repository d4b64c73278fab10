//! Hand-written AVX2 kernels for the conversions the autovectorized loops leave far from memory
//! speed on AVX2-only CPUs; AVX-512 CPUs run them too, as they beat its loops.
//!
//! Why the generic path is slow there: a scaled conversion decodes a chunk to an f32 buffer,
//! scales it, and encodes it, three loops with a load and a store per element each, and on AVX2
//! (no mask registers, no byte-to-dword conversions LLVM picks well) each comes out as a long
//! chain of unpacks and blends; quantizing also divides and encodes through the same buffer.
//!
//! - [`fp8`] and `table`: fp8 (e4m3fn and e5m2) -> bf16, unscaled or times a per-tensor,
//!   per-row or block scale, by `vpshufb` tables of one scale's results (the exponent moved in
//!   integers; see `table::Table`): about 24 GB/s of bf16 in cache on this Xeon (per-tensor and
//!   per-row scales; 14-18 with block scales, whose rows of whole tiles run four written-out
//!   steps a tile), against 10.7 for the per-row 128-entry tables before and 9 for the
//!   unscaled generic loop.
//! - [`wide`]: fp8 -> f32 and f16, unscaled or times a per-tensor or per-row scale, by the same
//!   tables four bytes a result, F16C rounding to f16 (block scales stay generic here).
//! - [`cast`]: f32 -> bf16 (integer rounding and a pack, NaNs sent to the scalar code) and
//!   f32 -> f16 (F16C, which rounds as the reference does).
//! - [`quant`]: bf16 and f16 -> e4m3 quantization, amax on the 16-bit patterns and a fused
//!   quotient-and-encode without division (Markstein's correction of the reciprocal, exact;
//!   bf16 by a per-scale table of one binade's codes where it can; see there).
//!
//! Measured and left to the generic loops (`TRASH_PANDA_SIMD=avx2 make
//! bench-convert` on this Xeon, one thread, times memcpy): bf16 -> f32 0.69 (a widening, at
//! memory speed in cache: fine); fp8 -> f32 or f16 with block scales (not measured; the bf16
//! block rows could be shared); quantizing f32 sources.
//!
//! Every kernel computes what the branch-free element functions compute (the same integer
//! rounding, the same f32 multiply or division), so results are bit for bit those of the
//! portable path; the tests check every code against the scalar references over a set of scales.
//! The one exception is not a difference: which of two NaN operands a multiply returns is not
//! defined (LLVM may swap the operands of any multiply), so a NaN code times a NaN scale is only
//! checked to be a quiet NaN. The kernels assume MXCSR's defaults (no flush-to-zero, no
//! denormals-are-zero), as the compiled loops do.
//!
//! Large outputs are written with non-temporal stores ([`Stores::Streaming`]): a plain store
//! first reads the line it fills, so a kernel writing two bytes per byte read moves half again
//! as much memory as it needs, where `memcpy` (`rep movsb`) does not. Streamed runs are aligned
//! (a few elements before them are written through a stack buffer), and a cache line is never
//! written partly streamed and partly plain except at the ends of a run (each tile of a block
//! scale would otherwise be one, hence `fp8::row_of_tiles`): such a line costs a read for
//! ownership that stalls the stores behind it, which made a per-row scale 30% slower on a
//! 16-byte aligned output. The kernels do not fence: the splitter's closure fences once per
//! thread ([`Stores::fence`]).
//!
//! The loops prefetch their source 4 KiB ahead: one core of this KVM Xeon reads about 7 GB/s
//! by demand loads and the hardware prefetcher alone, which held f32 -> bf16 at a third of
//! memcpy and the block-scaled fp8 case at 0.7-0.8x. The fp8 table loops prefetch into L1
//! (`primitives::prefetch`) and outrun memcpy (they read half of what memcpy reads); the loops
//! bound by their reads prefetch into L2, which keeps more lines on their way: the f32
//! narrowing loops and a whole tensor's amax by `primitives::prefetch_l2`, the quantizing loops
//! by their loads (`quant::reciprocal::load_32`, the next row ahead per row). f32 -> bf16 runs at 0.84x memcpy
//! and f32 -> f16 at 0.9-0.98x, as fast as the best plain read of the source (see
//! BENCHMARK.md).

use core::arch::x86_64::*;

use super::level::{level, SimdLevel};
pub(crate) use super::stores::Stores;
use super::DType;

pub(crate) mod cast;
pub(crate) mod fp8;
pub(crate) mod ggml;
mod primitives;
pub(crate) mod quant;
mod table;
pub(crate) mod wide;

pub(crate) use table::Fp8;

/// The fp8 format of an fp8 -> bf16 conversion the table kernels run at this thread's level
/// (AVX2 or AVX-512), if it is one.
#[inline]
pub(crate) fn fp8_to_bf16(src: DType, dst: DType) -> Option<Fp8> {
    fp8_tables(src, dst, DType::BF16)
}

/// As [`fp8_to_bf16`], for fp8 -> f32 and f16 ([`wide`]): the format, and whether the
/// destination is f16.
#[inline]
pub(crate) fn fp8_to_wide(src: DType, dst: DType) -> Option<(Fp8, bool)> {
    fp8_tables(src, dst, DType::F32)
        .map(|f| (f, false))
        .or_else(|| fp8_tables(src, dst, DType::F16).map(|f| (f, true)))
}

fn fp8_tables(src: DType, dst: DType, want: DType) -> Option<Fp8> {
    if dst != want || !matches!(level(), SimdLevel::Avx2 | SimdLevel::Avx512) {
        return None;
    }
    match src {
        DType::F8E4M3 => Some(Fp8::E4m3),
        DType::F8E5M2 => Some(Fp8::E5m2),
        _ => None,
    }
}

/// Writes `v` to the 32 bytes at `p`.
///
/// # Safety
/// The 32 bytes at `p` are writable; with [`Stores::Streaming`] `p` is 32-byte aligned. The
/// thread that ran a streaming kernel calls [`Stores::fence`] before its output is handed on.
#[inline(always)]
pub(crate) unsafe fn store(p: *mut u8, v: __m256i, how: Stores) {
    // SAFETY: the caller's contract.
    unsafe {
        match how {
            Stores::Cached => _mm256_storeu_si256(p.cast(), v),
            Stores::Streaming => _mm256_stream_si256(p.cast(), v),
        }
    }
}

/// Scales the kernel tests run over (the shared list, with a wide spread of finite ones).
#[cfg(test)]
pub(crate) fn test_scales() -> Vec<f32> {
    crate::dtype::kernel_tests::scales(64)
}

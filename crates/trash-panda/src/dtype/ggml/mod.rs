//! GGML's block-quantized types (Q4_0 … Q8_0, Q2_K … Q6_K): dequantization to the compute
//! dtype, and the Q8_0 quantizer.
//!
//! A block holds [`DType::block_elems`] weights in [`DType::size`] bytes: f16 scales (and
//! minimums) and packed codes. Dequantization computes each weight in f32 exactly as the `gguf`
//! package's reference does, then rounds it once to bf16, f16 or f32, so a weight equals
//! `torch.from_numpy(gguf.quants.dequantize(blocks, type)).to(dtype)` bit for bit.
//!
//! - [`reference`](mod@reference): the scalar decoder, element by element, that the kernels are tested against.
//! - `blocks`: the decoders the kernels run, one block at a time into an f32 buffer in L1, which
//!   `multiversion!` compiles once per instruction-set level; the buffer is then
//!   rounded to the destination by the conversion loops.

mod blocks;
mod quantize;
pub mod reference;

pub use quantize::quantize_q8_0;

use super::convert::{encode, Stores, CHUNK};
#[cfg(target_arch = "x86_64")]
use super::level::{level, SimdLevel};
use super::level::{multiversion, simd_level};
use super::{check_bytes, parallel, DType, DtypeError};

/// Dequantizes `src`, whole blocks of the GGML type `src_dtype`, to `dst_dtype` (bf16, f16 or
/// f32) in `dst`, which holds exactly their elements. Each weight is computed in f32 as the
/// `gguf` package's `dequantize` computes it and rounded once to `dst_dtype` (nearest even).
///
/// Slices may be unaligned. `threads` = 0 uses every core; jobs under a million elements run on
/// the calling thread.
pub fn dequantize(
    src: &[u8],
    src_dtype: DType,
    dst: &mut [u8],
    dst_dtype: DType,
    threads: usize,
) -> Result<(), DtypeError> {
    if !src_dtype.is_block() || !matches!(dst_dtype, DType::BF16 | DType::F16 | DType::F32) {
        return Err(DtypeError::Unsupported {
            op: "dequantize",
            src: src_dtype,
            dst: dst_dtype,
            expected: "a GGML block type (q4_0 ... q6_k) and a bf16, f16 or f32 destination",
        });
    }
    simd_level()?;
    let bs = src_dtype.size();
    if !src.len().is_multiple_of(bs) {
        return Err(DtypeError::RaggedBytes {
            what: "dequantize source",
            dtype: src_dtype,
            bytes: src.len(),
        });
    }
    let per = src_dtype.block_elems();
    let blocks = src.len() / bs;
    let n = blocks * per;
    check_bytes("dequantize destination", dst_dtype, n, dst.len())?;
    let threads = parallel::effective_threads(threads, n);
    let stores = Stores::for_output(dst.len());
    let none: &mut [u8] = &mut [];
    let ds = dst_dtype.size();
    // Whole f32 chunks per piece, so every thread but the last decodes full buffers.
    let grain = (CHUNK / per).max(1);
    parallel::split_run(
        blocks,
        grain,
        threads,
        (dst, per * ds),
        (none, 0),
        |r, d, _| {
            run(
                &src[r.start * bs..r.end * bs],
                src_dtype,
                d,
                dst_dtype,
                stores,
            );
            stores.fence();
        },
    );
    Ok(())
}

multiversion! {
    /// Decodes whole blocks a buffer at a time and rounds each buffer to `dst_t`.
    fn run(src: &[u8], src_t: DType, dst: &mut [u8], dst_t: DType, stores: Stores) {
        #[cfg(target_arch = "x86_64")]
        if matches!(level(), SimdLevel::Avx2 | SimdLevel::Avx512) {
            let fallback = |s: &[u8], d: &mut [u8]| generic(s, src_t, d, dst_t, stores);
            // SAFETY: `level()` returns these levels only when this CPU has AVX2, FMA and F16C
            // (`SimdLevel::is_supported`), the features the kernel is compiled with.
            if unsafe { super::avx2::ggml::dequantize(src, src_t, dst, dst_t, stores, &fallback) } {
                return;
            }
        }
        generic(src, src_t, dst, dst_t, stores);
    }
}

/// The generic path: whole blocks decoded into an f32 buffer, which is then rounded.
#[inline(always)]
fn generic(src: &[u8], src_t: DType, dst: &mut [u8], dst_t: DType, stores: Stores) {
    let (bs, per, ds) = (src_t.size(), src_t.block_elems(), dst_t.size());
    let per_chunk = (CHUNK / per).max(1);
    let mut buf = [0f32; CHUNK];
    let pieces = src
        .chunks(per_chunk * bs)
        .zip(dst.chunks_mut(per_chunk * per * ds));
    for (s, d) in pieces {
        let b = &mut buf[..s.len() / bs * per];
        blocks::decode(s, src_t, b);
        round_into(b, d, dst_t, stores);
    }
}

/// Rounds the decoded values to `dst_t` in `dst`: by the hand-written AVX2 rounding where the
/// level has it (the generic loop's NaN select halves the whole kernel's speed), else by the
/// conversion loops.
#[inline(always)]
fn round_into(values: &[f32], dst: &mut [u8], dst_t: DType, stores: Stores) {
    #[cfg(target_arch = "x86_64")]
    if matches!(level(), SimdLevel::Avx2 | SimdLevel::Avx512) && dst_t != DType::F32 {
        // SAFETY: an f32 slice is readable as its bytes (no padding; u8 needs no alignment),
        // for as long as the borrow of `values` lasts.
        let bytes =
            unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), values.len() * 4) };
        // SAFETY: `level()` returns these levels only when this CPU has AVX2, FMA and F16C
        // (`SimdLevel::is_supported`), the features the kernels are compiled with.
        unsafe {
            if dst_t == DType::BF16 {
                super::avx2::cast::f32_to_bf16(bytes, dst, stores);
            } else {
                super::avx2::cast::f32_to_f16(bytes, dst, stores);
            }
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = stores;
    encode(values, dst, dst_t);
}

#[cfg(test)]
mod tests;

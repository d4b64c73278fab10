//! The public [`cast`] between the float types: checks, the split over threads, and the
//! conversion loops of `convert.rs`. Rounding and NaN follow the codecs of `half.rs` and
//! `fp8.rs`.

use super::convert::{self, Stores};
use super::level::simd_level;
use super::{check_bytes, parallel, DType, DtypeError};

/// Converts `src` (elements of `src_dtype`) to `dst_dtype` into `dst`.
///
/// Sources: f64, f32, f16, bf16, fp8 e4m3fn and e5m2 (fp8 decodes exactly). Destinations: f64,
/// f32, f16, bf16 (to produce fp8 use [`super::quantize_fp8`]). One rounding, to nearest even;
/// NaN as the codecs of `half.rs` and `fp8.rs` say. Slices may be unaligned; both must hold the
/// same number of elements. `threads` = 0 uses every core; jobs under a million elements run
/// inline.
pub fn cast(
    src: &[u8],
    src_dtype: DType,
    dst: &mut [u8],
    dst_dtype: DType,
    threads: usize,
) -> Result<(), DtypeError> {
    check_cast_dtypes("cast", src_dtype, dst_dtype)?;
    simd_level()?;
    let n = src.len() / src_dtype.size();
    if !src.len().is_multiple_of(src_dtype.size()) {
        return Err(DtypeError::RaggedBytes {
            what: "cast source",
            dtype: src_dtype,
            bytes: src.len(),
        });
    }
    check_bytes("cast destination", dst_dtype, n, dst.len())?;
    let threads = parallel::effective_threads(threads, n);
    let stores = Stores::for_output(dst.len());
    parallel::split_run(
        n,
        parallel::ELEMENT_GRAIN,
        threads,
        (dst, dst_dtype.size()),
        (&mut [] as &mut [u8], 0),
        |r, d, _| {
            let s = &src[r.start * src_dtype.size()..r.end * src_dtype.size()];
            convert::convert(s, src_dtype, d, dst_dtype, None, stores);
            stores.fence();
        },
    );
    Ok(())
}

/// The dtype pairs [`cast`] and an unscaled `expand` accept.
pub(crate) fn check_cast_dtypes(
    op: &'static str,
    src: DType,
    dst: DType,
) -> Result<(), DtypeError> {
    let dst_ok = matches!(dst, DType::F64 | DType::F32 | DType::F16 | DType::BF16);
    if src.is_float() && dst_ok {
        Ok(())
    } else {
        Err(DtypeError::Unsupported {
            op,
            src,
            dst,
            expected: "a float source (f64, f32, f16, bf16, fp8) and an f64, f32, f16 or bf16 \
                       destination",
        })
    }
}

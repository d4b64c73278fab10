//! Expansion of stored weights (usually fp8) to the compute dtype, with the scale layouts found
//! in checkpoints.

use super::cast::check_cast_dtypes;
use super::convert::{self, convert_inline, Stores};
#[cfg(target_arch = "aarch64")]
use super::level::{self, SimdLevel};
use super::level::{multiversion, simd_level};
use super::{check_bytes, elements, parallel, DType, DtypeError};

/// The tile of the block-wise scale layout (`weight_scale_inv`): 128 x 128 weights per scale.
pub const SCALE_BLOCK: usize = 128;

/// How a checkpoint's scale tensor applies to its weight; the one classification the loader, the
/// kernels and the device backends use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleLayout {
    /// One value for the whole tensor.
    Tensor,
    /// One value per row (output channel).
    Row,
    /// One value per [`SCALE_BLOCK`] x [`SCALE_BLOCK`] tile.
    Block,
}

impl ScaleLayout {
    /// The layout's name for messages and logs: "tensor", "row" or "block".
    pub const fn name(self) -> &'static str {
        match self {
            ScaleLayout::Tensor => "tensor",
            ScaleLayout::Row => "row",
            ScaleLayout::Block => "block",
        }
    }
}

/// How the kernels see a tensor of `shape`: a 2-D weight as `(rows, cols)`, a 1-D one as one row,
/// a scalar as `(1, 1)`, higher ranks as (first dimension, the rest), so per-row scales follow
/// the first dimension.
pub fn rows_cols(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (1, *n),
        [rows, rest @ ..] => (*rows, rest.iter().product()),
    }
}

/// How the scale tensor `name` of shape `scale` applies to a weight of shape `weight`, with tiles
/// of `block` for the block-wise layout. A name ending in `.weight_scale_inv` is the block-wise
/// layout by convention and is tried first, because a narrow weight's `[rows/128, 1]` grid also
/// looks like one scale per row.
pub fn classify_scale(
    name: &str,
    weight: &[usize],
    scale: &[usize],
    block: usize,
) -> Result<ScaleLayout, DtypeError> {
    if block == 0 {
        return Err(DtypeError::ZeroBlock);
    }
    let (rows, cols) = rows_cols(weight);
    let grid = [rows.div_ceil(block), cols.div_ceil(block)];
    let count: usize = scale.iter().product();
    let is_grid = scale == grid;
    if count == 1 {
        Ok(ScaleLayout::Tensor)
    } else if is_grid && name.ends_with(".weight_scale_inv") {
        Ok(ScaleLayout::Block)
    } else if count == rows && (scale.len() == 1 || (scale.len() == 2 && scale[1] == 1)) {
        Ok(ScaleLayout::Row)
    } else if is_grid {
        Ok(ScaleLayout::Block)
    } else {
        Err(DtypeError::ScaleShape {
            name: name.to_owned(),
            weight: weight.to_vec(),
            scale: scale.to_vec(),
            rows,
            block,
        })
    }
}

/// How stored values are scaled when expanded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale<'a> {
    /// No scale: a plain conversion.
    None,
    /// One scale for the whole tensor.
    PerTensor(f32),
    /// One scale per row (output channel) of a `[rows, cols]` weight.
    PerRow(&'a [f32]),
    /// One scale per `block x block` tile, stored row-major as
    /// `[ceil(rows / block), ceil(cols / block)]`: the `weight_scale_inv` layout (block = 128).
    /// Edge tiles may be partial.
    Block {
        /// The tile scales, row-major over the tile grid.
        scales: &'a [f32],
        /// The tile's side, in elements; at least 1.
        block: usize,
    },
}

impl Scale<'_> {
    /// Checks the scale's length against the shape.
    fn validate(&self, rows: usize, cols: usize) -> Result<(), DtypeError> {
        let (kind, expected, actual) = match *self {
            Scale::None | Scale::PerTensor(_) => return Ok(()),
            Scale::PerRow(s) => ("per-row", rows, s.len()),
            Scale::Block { scales, block } => {
                if block == 0 {
                    return Err(DtypeError::ZeroBlock);
                }
                let tiles = rows.div_ceil(block).checked_mul(cols.div_ceil(block));
                ("block", tiles.unwrap_or(usize::MAX), scales.len())
            }
        };
        if expected == actual {
            Ok(())
        } else {
            Err(DtypeError::ScaleLength {
                kind,
                rows,
                cols,
                expected,
                actual,
            })
        }
    }
}

/// Expands `src` (`shape` = `(rows, cols)`, `(1, n)` for 1-D, of `src_dtype`) to `dst_dtype`
/// (bf16, f16 or f32) into `dst`, multiplying by `scale`.
///
/// The result equals torch's `(w.to(torch.float32) * s).to(dst)`, with `s` broadcast from the
/// scale layout: every element is decoded exactly to f32, multiplied by its f32 scale in f32,
/// and rounded once to the destination (nearest even). With [`Scale::None`] it is the direct
/// conversion, as [`super::cast()`] (which rounds f64 sources once, not through f32).
///
/// `src_dtype` is any float type (fp8 e4m3fn and e5m2 being the usual ones), int8 codes with a
/// scale (from [`super::quantize_int8`]), or a GGML block type with no scale (its blocks hold
/// theirs: [`super::dequantize`]). Slices may be
/// unaligned. `threads` = 0 uses every core; jobs under a million elements run inline; row
/// scales split on row boundaries.
pub fn expand(
    src: &[u8],
    src_dtype: DType,
    dst: &mut [u8],
    dst_dtype: DType,
    shape: (usize, usize),
    scale: &Scale,
    threads: usize,
) -> Result<(), DtypeError> {
    if !matches!(dst_dtype, DType::BF16 | DType::F16 | DType::F32) {
        return Err(DtypeError::Unsupported {
            op: "expand",
            src: src_dtype,
            dst: dst_dtype,
            expected: "a float source and a bf16, f16 or f32 destination",
        });
    }
    if src_dtype.is_block() {
        if !matches!(scale, Scale::None) {
            return Err(DtypeError::Unsupported {
                op: "expand with a scale",
                src: src_dtype,
                dst: dst_dtype,
                expected: "no scale tensor: a GGML block holds its own scales",
            });
        }
        let n = elements(shape)?;
        check_bytes("expand source", src_dtype, n, src.len())?;
        return super::ggml::dequantize(src, src_dtype, dst, dst_dtype, threads);
    }
    if src_dtype == DType::I8 {
        if matches!(scale, Scale::None) {
            return Err(DtypeError::Unsupported {
                op: "expand without a scale",
                src: src_dtype,
                dst: dst_dtype,
                expected: "int8 codes with their scale (per tensor, per row or per block)",
            });
        }
    } else {
        check_cast_dtypes("expand", src_dtype, dst_dtype)?;
    }
    simd_level()?;
    let (rows, cols) = shape;
    let n = elements(shape)?;
    check_bytes("expand source", src_dtype, n, src.len())?;
    check_bytes("expand destination", dst_dtype, n, dst.len())?;
    scale.validate(rows, cols)?;
    let threads = parallel::effective_threads(threads, n);
    let (ss, ds) = (src_dtype.size(), dst_dtype.size());
    let stores = Stores::for_output(dst.len());
    let none: &mut [u8] = &mut [];
    match *scale {
        Scale::None | Scale::PerTensor(_) => {
            let k = match *scale {
                Scale::PerTensor(k) => Some(k),
                _ => None,
            };
            let grain = parallel::ELEMENT_GRAIN;
            parallel::split_run(n, grain, threads, (dst, ds), (none, 0), |r, d, _| {
                let s = &src[r.start * ss..r.end * ss];
                convert::convert(s, src_dtype, d, dst_dtype, k, stores);
                stores.fence();
            });
        }
        Scale::PerRow(_) | Scale::Block { .. } => {
            let row_bytes = cols * ds;
            parallel::split_run(rows, 1, threads, (dst, row_bytes), (none, 0), |r, d, _| {
                let s = &src[r.start * cols * ss..r.end * cols * ss];
                let rows_at = (r.start, cols);
                expand_rows(s, src_dtype, d, dst_dtype, rows_at, scale, stores);
                stores.fence();
            });
        }
    }
    Ok(())
}

/// [`expand`] with the rows taken in `order` when given: row `r` of `dst` is row `order[r]` of
/// `src` (`src_rows` rows of `cols` elements), expanded with that source row's scale. How a
/// checkpoint whose rows are stored permuted (GGUF's attention projections) reaches the model;
/// every row must name a source row. Block scales are refused with an order: a tile would span
/// rows from anywhere. `None` is [`expand`] itself.
#[allow(clippy::too_many_arguments)]
pub fn expand_reordered(
    src: &[u8],
    src_dtype: DType,
    dst: &mut [u8],
    dst_dtype: DType,
    (src_rows, cols): (usize, usize),
    scale: &Scale,
    order: Option<&[u32]>,
    threads: usize,
) -> Result<(), DtypeError> {
    let Some(rows) = order else {
        return expand(
            src,
            src_dtype,
            dst,
            dst_dtype,
            (src_rows, cols),
            scale,
            threads,
        );
    };
    if matches!(scale, Scale::Block { .. }) {
        return Err(DtypeError::Unsupported {
            op: "expand with rows reordered",
            src: src_dtype,
            dst: dst_dtype,
            expected: "no scale, one per tensor or one per row (block scales tile across rows)",
        });
    }
    scale.validate(src_rows, cols)?;
    let n = elements((src_rows, cols))?;
    check_bytes("expand source", src_dtype, n, src.len())?;
    check_bytes(
        "expand destination",
        dst_dtype,
        elements((rows.len(), cols))?,
        dst.len(),
    )?;
    if let Some(&bad) = rows.iter().find(|&&r| r as usize >= src_rows) {
        return Err(DtypeError::RowOutOfRange {
            row: bad as usize,
            rows: src_rows,
        });
    }
    if cols == 0 || rows.is_empty() {
        return Ok(());
    }
    let (src_row, dst_row) = (src.len() / src_rows, dst.len() / rows.len());
    let threads = parallel::effective_threads(threads, rows.len() * cols);
    let none: &mut [u8] = &mut [];
    let mut failed = None;
    let failure = std::sync::Mutex::new(&mut failed);
    parallel::split_run(
        rows.len(),
        1,
        threads,
        (dst, dst_row),
        (none, 0),
        |r, d, _| {
            for (i, out) in r.zip(d.chunks_exact_mut(dst_row)) {
                let s = rows[i] as usize;
                let k = match *scale {
                    Scale::PerRow(k) => Scale::PerTensor(k[s]),
                    other => other,
                };
                let one = &src[s * src_row..(s + 1) * src_row];
                if let Err(e) = expand(one, src_dtype, out, dst_dtype, (1, cols), &k, 1) {
                    if let Ok(mut f) = failure.lock() {
                        f.get_or_insert(e);
                    }
                    return;
                }
            }
        },
    );
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

multiversion! {
    /// Rows `first_row..` (`rows_at` = `(first_row, cols)`) of a row- or block-scaled
    /// expansion (`src` and `dst` hold whole rows).
    fn expand_rows(
        src: &[u8],
        src_t: DType,
        dst: &mut [u8],
        dst_t: DType,
        rows_at: (usize, usize),
        scale: &Scale<'_>,
        stores: Stores,
    ) {
        let (first_row, cols) = rows_at;
        let (ss, ds) = (src_t.size(), dst_t.size());
        if cols == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let (Some(fmt), Scale::Block { scales, block }) =
            (super::avx2::fp8_to_bf16(src_t, dst_t), scale)
        {
            // Block scales give runs of 128, too short for a table each; the kernel shares one
            // per tile over the tile's rows.
            // SAFETY: `fp8_to_bf16` answers only at a level whose CPU has AVX2, FMA and F16C,
            // the features the kernel is compiled with.
            unsafe {
                super::avx2::fp8::fp8_to_bf16_blocks(fmt, src, dst, rows_at, scales, *block, stores)
            };
            return;
        }
        #[cfg(target_arch = "aarch64")]
        if let (DType::F8E4M3 | DType::F8E5M2, Scale::Block { scales, block }) = (src_t, scale) {
            // As on AVX2: one table per tile, shared over the tile's rows.
            if level::level() == SimdLevel::Neon {
                // SAFETY: `level()` returns Neon only when this CPU has NEON, the feature the
                // kernel is compiled with.
                unsafe {
                    super::neon::fp8_blocks(src, src_t, dst, dst_t, cols, first_row, scales, *block)
                };
                return;
            }
        }
        let rows = src.chunks_exact(cols * ss).zip(dst.chunks_exact_mut(cols * ds));
        for (i, (s, d)) in rows.enumerate() {
            let row = first_row + i;
            match *scale {
                Scale::PerRow(k) => convert_inline(s, src_t, d, dst_t, Some(k[row]), stores),
                Scale::Block { scales, block } => {
                    let tiles = cols.div_ceil(block);
                    let tile_row = &scales[row / block * tiles..][..tiles];
                    let segs = s.chunks(block * ss).zip(d.chunks_mut(block * ds));
                    for ((s, d), k) in segs.zip(tile_row) {
                        convert_inline(s, src_t, d, dst_t, Some(*k), stores);
                    }
                }
                Scale::None => convert_inline(s, src_t, d, dst_t, None, stores),
                Scale::PerTensor(k) => convert_inline(s, src_t, d, dst_t, Some(k), stores),
            }
        }
    }
}

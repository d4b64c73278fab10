//! `trash_panda._core` conversion kernels on torch tensors (borrowed through DLPack).
//!
//! The Python layer passes every tensor as a flat byte view plus its dtype name, so the kernels
//! see exactly the bytes torch holds, whatever dtypes this torch build can export.

use pyo3::prelude::*;

use trash_panda::dtype::{self, DType, QuantGranularity, Scale};

use crate::dlpack::{disjoint, Borrowed};
use crate::errors::{raise, Kind, ToPyErr};
use crate::gil::{threads as worker_threads, without_gil};

pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    name.parse::<DType>().map_err(ToPyErr::to_py)
}

/// Reads little-endian f32 scales out of a borrowed float32 tensor.
fn scales_of(t: &Borrowed) -> Vec<f32> {
    f32_values(t.bytes())
}

/// Little-endian f32 values of a byte slice (a partial trailing value is ignored).
pub(crate) fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The safetensors header name of a dtype written the way users write it ("bf16", "fp8", ...).
#[pyfunction]
fn dtype_header_name(name: &str) -> PyResult<&'static str> {
    Ok(parse_dtype(name)?.safetensors_name())
}

/// Whether a dtype (a header name such as "F8_E4M3", or a name such as "bf16") is a float:
/// f64, f32, f16, bf16 and the two fp8 kinds (the core's one rule).
#[pyfunction]
fn is_float_dtype(name: &str) -> PyResult<bool> {
    Ok(parse_dtype(name)?.is_float())
}

/// Whether a dtype is one of GGML's block-quantized types ("Q4_K", "q8_0", ...).
#[pyfunction]
fn is_block_dtype(name: &str) -> PyResult<bool> {
    Ok(parse_dtype(name)?.is_block())
}

/// Elements per storage unit of a dtype: 32 or 256 for a GGML block type, 1 for the others.
#[pyfunction]
fn dtype_block_elems(name: &str) -> PyResult<usize> {
    Ok(parse_dtype(name)?.block_elems())
}

/// Bytes that `elements` elements of a dtype take, a block type's whole blocks included; a
/// DtypeError when they are not whole blocks.
#[pyfunction]
fn dtype_nbytes(name: &str, elements: u64) -> PyResult<u64> {
    let d = parse_dtype(name)?;
    d.bytes_for(elements).ok_or_else(|| {
        raise(
            Kind::Dtype,
            format!(
                "{elements} elements are not a whole number of {d} blocks of {}",
                d.block_elems()
            ),
        )
    })
}

/// The core's scale from its kind ("none", "tensor", "row", "block") and values. Pure, so it
/// can run without the GIL; the error is the message.
pub(crate) fn scale_of<'v>(
    kind: &str,
    values: &'v [f32],
    block: usize,
) -> Result<Scale<'v>, String> {
    Ok(match (kind, values) {
        ("none", _) => Scale::None,
        ("tensor", [v]) => Scale::PerTensor(*v),
        ("row", v) => Scale::PerRow(v),
        ("block", v) => Scale::Block { scales: v, block },
        ("tensor", v) => return Err(format!("a per-tensor scale has one value, got {}", v.len())),
        (other, _) => {
            return Err(format!(
                "scale kind {other:?} is not one of none, tensor, row, block"
            ))
        }
    })
}

/// Expands (fp8 or int8 times a scale, GGML blocks, or a plain cast) `src` into `dst`; with
/// `order`, row `r` of `dst` is row `order[r]` of `src`.
#[pyfunction]
#[pyo3(signature = (src, src_dtype, dst, dst_dtype, rows, cols, scale_kind="none", scale=None, block=128, threads=None, order=None))]
#[allow(clippy::too_many_arguments)]
fn expand(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    src_dtype: &str,
    dst: &Bound<'_, PyAny>,
    dst_dtype: &str,
    rows: usize,
    cols: usize,
    scale_kind: &str,
    scale: Option<&Bound<'_, PyAny>>,
    block: usize,
    threads: Option<usize>,
    order: Option<Vec<u32>>,
) -> PyResult<()> {
    let (sd, dd) = (parse_dtype(src_dtype)?, parse_dtype(dst_dtype)?);
    let (s, d) = (Borrowed::new(src, "src")?, Borrowed::new(dst, "dst")?);
    disjoint(&s, &d, "expand")?;
    let values = match scale {
        Some(t) => scales_of(&Borrowed::new(t, "scale")?),
        None => Vec::new(),
    };
    let scale = scale_of(scale_kind, &values, block)
        .map_err(|m| raise(Kind::Argument, format!("expand: {m}")))?;
    let n = worker_threads(threads);
    // SAFETY: `disjoint` checked that `s` and `d` do not overlap, and nothing else is borrowed.
    let (sb, db) = (s.bytes(), unsafe { d.bytes_mut() });
    without_gil(py, || {
        dtype::expand_reordered(sb, sd, db, dd, (rows, cols), &scale, order.as_deref(), n)
    })
    .map_err(ToPyErr::to_py)
}

/// Casts between f32, f16 and bf16 with round-to-nearest-even.
#[pyfunction]
#[pyo3(signature = (src, src_dtype, dst, dst_dtype, threads=None))]
fn cast(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    src_dtype: &str,
    dst: &Bound<'_, PyAny>,
    dst_dtype: &str,
    threads: Option<usize>,
) -> PyResult<()> {
    let (sd, dd) = (parse_dtype(src_dtype)?, parse_dtype(dst_dtype)?);
    let (s, d) = (Borrowed::new(src, "src")?, Borrowed::new(dst, "dst")?);
    disjoint(&s, &d, "cast")?;
    let n = worker_threads(threads);
    // SAFETY: `disjoint` checked that `s` and `d` do not overlap, and nothing else is borrowed.
    let (sb, db) = (s.bytes(), unsafe { d.bytes_mut() });
    without_gil(py, || dtype::cast(sb, sd, db, dd, n)).map_err(ToPyErr::to_py)
}

/// Runs a quantizer `run(src, dst, scales, threads)` without the GIL on the bytes of `src` and
/// `dst` and a buffer of as many f32 values as the float32 tensor `scales` holds, then writes the
/// scales it made into that tensor. `op` names the call in errors.
fn with_scales(
    py: Python<'_>,
    op: &'static str,
    (src, dst, scales): (&Bound<'_, PyAny>, &Bound<'_, PyAny>, &Bound<'_, PyAny>),
    threads: Option<usize>,
    run: impl FnOnce(&[u8], &mut [u8], &mut [f32], usize) -> Result<(), dtype::DtypeError> + Send,
) -> PyResult<()> {
    let (s, d, sc) = (
        Borrowed::new(src, "src")?,
        Borrowed::new(dst, "dst")?,
        Borrowed::new(scales, "scales")?,
    );
    disjoint(&s, &d, op)?;
    disjoint(&s, &sc, op)?;
    disjoint(&d, &sc, op)?;
    if sc.len() % 4 != 0 {
        return Err(raise(
            Kind::Argument,
            format!("{op}: scales must be a float32 tensor"),
        ));
    }
    let n = worker_threads(threads);
    let mut out = vec![0f32; sc.len() / 4];
    // SAFETY: the three tensors were checked pairwise disjoint above.
    let (sb, db) = (s.bytes(), unsafe { d.bytes_mut() });
    without_gil(py, || run(sb, db, &mut out, n)).map_err(ToPyErr::to_py)?;
    // SAFETY: `sb` and `db` are no longer used, and `sc` overlaps neither tensor.
    for (chunk, v) in unsafe { sc.bytes_mut() }.chunks_exact_mut(4).zip(out) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

/// Quantizes `src` to fp8 e4m3fn into `dst`, writing the float32 scales into `scales`: one
/// per tensor, per row or per `block` x `block` tile (`layout` "tensor", "row" or "block").
#[pyfunction]
#[pyo3(signature = (src, src_dtype, dst, scales, rows, cols, layout, block=128, threads=None))]
#[allow(clippy::too_many_arguments)]
fn quantize_fp8(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    src_dtype: &str,
    dst: &Bound<'_, PyAny>,
    scales: &Bound<'_, PyAny>,
    rows: usize,
    cols: usize,
    layout: &str,
    block: usize,
    threads: Option<usize>,
) -> PyResult<()> {
    let sd = parse_dtype(src_dtype)?;
    let granularity = match layout {
        "tensor" => QuantGranularity::PerTensor,
        "row" => QuantGranularity::PerRow,
        "block" => QuantGranularity::Block { block },
        other => {
            return Err(raise(
                Kind::Argument,
                format!("quantize_fp8: layout {other:?} is not one of tensor, row, block"),
            ))
        }
    };
    with_scales(
        py,
        "quantize_fp8",
        (src, dst, scales),
        threads,
        |sb, db, out, n| dtype::quantize_fp8(sb, sd, (rows, cols), granularity, db, out, n),
    )
}

/// Quantizes `src` (a multiple of 32 floats) to GGML Q8_0 blocks in `dst` (34 bytes a block).
#[pyfunction]
#[pyo3(signature = (src, src_dtype, dst, threads=None))]
fn quantize_q8_0(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    src_dtype: &str,
    dst: &Bound<'_, PyAny>,
    threads: Option<usize>,
) -> PyResult<()> {
    let sd = parse_dtype(src_dtype)?;
    let (s, d) = (Borrowed::new(src, "src")?, Borrowed::new(dst, "dst")?);
    disjoint(&s, &d, "quantize_q8_0")?;
    let n = worker_threads(threads);
    // SAFETY: `disjoint` checked that `s` and `d` do not overlap, and nothing else is borrowed.
    let (sb, db) = (s.bytes(), unsafe { d.bytes_mut() });
    without_gil(py, || dtype::quantize_q8_0(sb, sd, db, n)).map_err(ToPyErr::to_py)
}

/// Quantizes `src` (`rows` x `cols` floats) to int8 codes in `dst`, one float32 scale per row in
/// `scales`.
#[pyfunction]
#[pyo3(signature = (src, src_dtype, dst, scales, rows, cols, threads=None))]
#[allow(clippy::too_many_arguments)]
fn quantize_int8(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    src_dtype: &str,
    dst: &Bound<'_, PyAny>,
    scales: &Bound<'_, PyAny>,
    rows: usize,
    cols: usize,
    threads: Option<usize>,
) -> PyResult<()> {
    let sd = parse_dtype(src_dtype)?;
    with_scales(
        py,
        "quantize_int8",
        (src, dst, scales),
        threads,
        |sb, db, out, n| dtype::quantize_int8(sb, sd, (rows, cols), db, out, n),
    )
}

/// How scale tensor `name` of shape `scale` applies to a weight of shape `weight`: "tensor",
/// "row" or "block" (the core's one classification).
#[pyfunction]
#[pyo3(signature = (name, weight, scale, block=128))]
fn scale_layout(
    name: &str,
    weight: Vec<usize>,
    scale: Vec<usize>,
    block: usize,
) -> PyResult<&'static str> {
    dtype::classify_scale(name, &weight, &scale, block)
        .map(dtype::ScaleLayout::name)
        .map_err(ToPyErr::to_py)
}

/// How the kernels see a tensor of `shape`: (rows, cols).
#[pyfunction]
fn rows_cols(shape: Vec<usize>) -> (usize, usize) {
    dtype::rows_cols(&shape)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scale_layout, m)?)?;
    m.add_function(wrap_pyfunction!(rows_cols, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_header_name, m)?)?;
    m.add_function(wrap_pyfunction!(is_float_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(is_block_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_nbytes, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_block_elems, m)?)?;
    m.add_function(wrap_pyfunction!(expand, m)?)?;
    m.add_function(wrap_pyfunction!(cast, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_q8_0, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_int8, m)?)?;
    Ok(())
}

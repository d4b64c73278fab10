//! `trash_panda._core` rules the Python layer asks rather than restates: scale names, which
//! tensors are expanded, block prefixes, and the defaults of the figures a plan is sized by
//! (see the core's `rules` module).

use pyo3::prelude::*;

use trash_panda::plan;
use trash_panda::rules;

use crate::dtype::parse_dtype;
use crate::errors::ToPyErr;

/// Whether `name` is a scale tensor's: it ends in one of `SCALE_SUFFIXES`.
#[pyfunction]
fn is_scale_name(name: &str) -> bool {
    rules::is_scale_name(name)
}

/// The weight scale tensor `name` scales (`a.b.weight_scale` -> `a.b.weight`, for each of
/// `SCALE_SUFFIXES`); None for a name that is not a scale tensor's.
#[pyfunction]
fn weight_of_scale(name: &str) -> Option<String> {
    rules::weight_of_scale(name)
}

/// Whether a weight held as `held` (a dtype name such as "F8_E4M3" or "bf16") is expanded to
/// `compute` before its block runs rather than used as it is: a float in another dtype, or one
/// with a scale to apply (`scaled`).
#[pyfunction]
fn needs_expansion(held: &str, compute: &str, scaled: bool) -> PyResult<bool> {
    Ok(rules::needs_expansion(
        parse_dtype(held)?,
        parse_dtype(compute)?,
        scaled,
    ))
}

/// Block prefixes with the trailing dot each needs, after the planner's check: a PlanError for
/// an empty prefix, one given twice, or one inside another.
#[pyfunction]
fn check_block_prefixes(prefixes: Vec<String>) -> PyResult<Vec<String>> {
    plan::check_block_prefixes(&prefixes).map_err(ToPyErr::to_py)
}

/// The staging buffers a `pinned_buffers` setting asks for: None for 0 (the look-ahead decides).
#[pyfunction]
fn asked_staging_buffers(setting: usize) -> Option<usize> {
    rules::asked_staging_buffers(setting)
}

/// The staging buffers a plan with a streamed block counts: `asked`, else `lookahead + 1`; at
/// least one.
#[pyfunction]
fn staging_buffers(asked: Option<usize>, lookahead: usize) -> usize {
    rules::staging_buffers(asked, lookahead)
}

/// Bytes a patched block's image takes (its staged length `block_len`): rounded up to whole
/// pages in memory (`in_memory`), as it is in an overlay file.
#[pyfunction]
fn patched_image_bytes(block_len: u64, in_memory: bool) -> u64 {
    rules::patched_image_bytes(block_len, in_memory)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DEFAULT_HEADROOM_VRAM", rules::DEFAULT_HEADROOM_VRAM)?;
    m.add("DEFAULT_LOOKAHEAD", rules::DEFAULT_LOOKAHEAD)?;
    m.add("TENSOR_ALIGN", rules::TENSOR_ALIGN)?;
    m.add("LOAD_GROUP_BYTES", rules::LOAD_GROUP_BYTES)?;
    m.add("LOADER_RING_SLACK", rules::LOADER_RING_SLACK)?;
    m.add("LOADER_RING_BYTES", rules::LOADER_RING_BYTES)?;
    m.add("GGML_DEVICE_PASS_WEIGHTS", rules::GGML_DEVICE_PASS_WEIGHTS)?;
    m.add(
        "GGML_DEVICE_SCRATCH_BYTES",
        rules::GGML_DEVICE_SCRATCH_BYTES,
    )?;
    m.add_function(wrap_pyfunction!(is_scale_name, m)?)?;
    m.add_function(wrap_pyfunction!(weight_of_scale, m)?)?;
    m.add_function(wrap_pyfunction!(needs_expansion, m)?)?;
    m.add_function(wrap_pyfunction!(check_block_prefixes, m)?)?;
    m.add_function(wrap_pyfunction!(asked_staging_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(staging_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(patched_image_bytes, m)?)?;
    Ok(())
}

//! What the planner and the engine know of one tensor, the pairing of scale tensors with their
//! weights, and the compute dtype a checkpoint's weights vote for.

use serde::{Deserialize, Serialize};

use crate::checkpoint::TensorInfo;
use crate::DType;

/// Suffixes of the scale tensors that travel with an fp8 weight: `<layer>.weight_scale` (per
/// tensor or per output channel), `<layer>.scale_weight` (scaled-fp8 files of diffusion UIs),
/// `<layer>.weight_scale_inv` (128x128 blocks), and last `<layer>.input_scale`, which belongs to
/// activation quantization: carried along, never applied to weights.
pub const SCALE_SUFFIXES: [&str; 4] = [
    ".weight_scale",
    ".scale_weight",
    ".weight_scale_inv",
    ".input_scale",
];

/// Where a tensor's bytes start: the staging layout of a streamed block depends on it (tensors
/// of one file read together, O_DIRECT reads landing at their in-page offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorLocation {
    /// Index into the checkpoint's files.
    pub file: usize,
    /// Offset of the first byte in that file.
    pub start: u64,
}

/// What the planner needs of one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSizes {
    /// The tensor's name in the checkpoint.
    pub name: String,
    /// The dtype it is stored in, in the file.
    pub dtype: DType,
    /// Elements along each dimension, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// Bytes in the checkpoint file.
    pub file_bytes: u64,
    /// `None` for sizes made by hand: the tensors of a block are then taken to lie one after
    /// the other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<TensorLocation>,
    /// The model takes its rows in another order than the file's (see
    /// [`StreamTensor::rows`](super::StreamTensor::rows)): it is expanded whatever its dtype.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reordered: bool,
}

impl TensorSizes {
    /// Sizes made by hand (tests, tools): `file_bytes` is what the shape's elements take in the
    /// dtype (whole blocks for a block type, rounded up), and there is no location.
    pub fn new(name: impl Into<String>, dtype: DType, shape: &[usize]) -> Self {
        let numel = shape.iter().product::<usize>() as u64;
        let blocks = numel.div_ceil(dtype.block_elems() as u64);
        TensorSizes {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            file_bytes: blocks * dtype.size() as u64,
            location: None,
            reordered: false,
        }
    }

    /// The same tensor, its rows taken in another order than the file's.
    pub fn reordered(mut self) -> Self {
        self.reordered = true;
        self
    }

    /// The same tensor at `start` of file `file`.
    pub fn at(mut self, file: usize, start: u64) -> Self {
        self.location = Some(TensorLocation { file, start });
        self
    }

    /// Elements in the tensor (the product of its shape; 1 for a scalar).
    pub fn numel(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64
    }

    /// Scale tensors of fp8 weights: they live with their weight and vanish on expansion.
    pub fn is_scale(&self) -> bool {
        is_scale_name(&self.name)
    }
}

impl From<&TensorInfo> for TensorSizes {
    fn from(t: &TensorInfo) -> Self {
        TensorSizes {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            file_bytes: t.nbytes(),
            location: Some(TensorLocation {
                file: t.file,
                start: t.start,
            }),
            reordered: false,
        }
    }
}

/// Whether `name` is a scale tensor's (it ends in one of [`SCALE_SUFFIXES`]).
pub fn is_scale_name(name: &str) -> bool {
    SCALE_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// The weight a scale tensor scales: `<layer>.weight_scale` (or any of [`SCALE_SUFFIXES`],
/// `input_scale` too) -> `<layer>.weight`; `None` for a name that is not a scale tensor's.
pub fn weight_of_scale(name: &str) -> Option<String> {
    SCALE_SUFFIXES
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .map(|stem| format!("{stem}.weight"))
}

/// The scale tensor of weight `name` among `names`: `<layer>.weight` pairs with
/// `<layer>.weight_scale`, `<layer>.scale_weight` or `<layer>.weight_scale_inv`, first found
/// (`input_scale` scales activations and is never applied to a weight).
pub fn paired_scale<'a>(
    name: &str,
    names: impl Iterator<Item = &'a str> + Clone,
) -> Option<&'a str> {
    let scale = paired_scale_where(name, |c| names.clone().any(|n| n == c))?;
    names.clone().find(|n| *n == scale)
}

/// [`paired_scale`] over any set of names: the first of `<layer>.weight_scale`,
/// `<layer>.scale_weight`, `<layer>.weight_scale_inv` for which `has` is true (the binding asks
/// a Python dict or set through it).
pub fn paired_scale_where(name: &str, mut has: impl FnMut(&str) -> bool) -> Option<String> {
    let stem = name.strip_suffix(".weight")?;
    SCALE_SUFFIXES[..3]
        .iter()
        .map(|suffix| format!("{stem}{suffix}"))
        .find(|c| has(c))
}

/// The float dtype most of the weights are stored in, counted in elements, which the blocks
/// then compute in: f32, f16 or bf16. Each weight votes with its element count for the dtype it
/// computes in: f64 for f32, fp8 (either kind) for bf16, the 16- and 32-bit floats for
/// themselves; the scales of fp8 weights ([`TensorSizes::is_scale`]) and non-float tensors do
/// not vote. Ties go to the narrower dtype; a checkpoint with no float weights computes in bf16.
///
/// Elements, not bytes: a model of bf16 weights with a few large f32 tensors is a bf16 model
/// even where the f32 tensors weigh more bytes, and an fp8 checkpoint with f32 scales (per row
/// or per 128x128 block) computes in bf16, not in the dtype of its scales.
pub fn infer_compute_dtype<'a>(tensors: impl IntoIterator<Item = &'a TensorSizes>) -> DType {
    let mut elements = [(DType::BF16, 0u64), (DType::F16, 0), (DType::F32, 0)];
    for t in tensors {
        if t.is_scale() {
            continue;
        }
        let dtype = match t.dtype {
            DType::F64 => DType::F32,
            // Compact weights vote for the dtype they are usually expanded to.
            DType::F8E4M3 | DType::F8E5M2 => DType::BF16,
            d if d.is_block() => DType::BF16,
            d => d,
        };
        if let Some(e) = elements.iter_mut().find(|(d, _)| *d == dtype) {
            e.1 += t.numel();
        }
    }
    // Ties go to the narrower dtype, the first in the list.
    let (dtype, count) =
        elements.iter().fold(
            (DType::BF16, 0),
            |best, &(d, n)| if n > best.1 { (d, n) } else { best },
        );
    if count == 0 {
        DType::BF16
    } else {
        dtype
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_names_its_weight() {
        assert!(is_scale_name("a.b.weight_scale_inv"));
        assert!(!is_scale_name("a.b.weight"));
        assert_eq!(
            weight_of_scale("a.b.weight_scale").as_deref(),
            Some("a.b.weight")
        );
        assert_eq!(
            weight_of_scale("a.scale_weight").as_deref(),
            Some("a.weight")
        );
        assert_eq!(
            weight_of_scale("a.weight_scale_inv").as_deref(),
            Some("a.weight")
        );
        assert_eq!(
            weight_of_scale("a.input_scale").as_deref(),
            Some("a.weight")
        );
        assert_eq!(weight_of_scale("a.weight"), None);
        for s in SCALE_SUFFIXES {
            let name = format!("x{s}");
            assert_eq!(is_scale_name(&name), weight_of_scale(&name).is_some());
        }
    }
}

#[cfg(test)]
mod compute_tests {
    use super::*;

    #[test]
    fn block_types_vote_for_bf16() {
        let q4 = TensorSizes::new("blk.0.ffn_up.weight", DType::Q4K, &[512, 256]);
        let norm = TensorSizes::new("blk.0.attn_norm.weight", DType::F32, &[256]);
        assert_eq!(infer_compute_dtype([&q4, &norm]), DType::BF16);
        let f16 = TensorSizes::new("blk.0.ffn_down.weight", DType::F16, &[512, 512]);
        assert_eq!(infer_compute_dtype([&q4, &norm, &f16]), DType::F16);
    }
}

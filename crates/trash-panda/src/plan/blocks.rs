//! Finding a model's blocks from the tensor names of its checkpoint.
//!
//! A tensor belongs to the block named by its name up to and including the first segment made
//! of digits: `model.layers.12.mlp.up.weight` is in `model.layers.12.`, and
//! `double_blocks.3.img_attn.qkv.weight` in `double_blocks.3.`. The part before the digits
//! (`model.layers.`) is the block's list. A list counts only when it has at least two distinct
//! indices: a lone `foo.0.` is a module that happens to be numbered (a single projection in a
//! ModuleList), not a stack of repeated blocks worth streaming. Everything else is "outside".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::near::near_names;
use super::PlanError;
use crate::checkpoint::TensorInfo;
use crate::rules::TensorSizes;

/// One block: a name prefix and its tensors in checkpoint order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockTensors {
    /// The block's name prefix, with its trailing dot (`model.layers.12.`).
    pub name: String,
    /// Every tensor whose name starts with the prefix, in checkpoint order.
    pub tensors: Vec<TensorSizes>,
}

/// A model cut into blocks, in plan order, and the weights outside them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelBlocks {
    /// The blocks, in plan order.
    pub blocks: Vec<BlockTensors>,
    /// Tensors in no block (embeddings, final norm, heads), in checkpoint order.
    pub outside: Vec<TensorSizes>,
}

/// Splits a name at its first all-digit segment: `("model.layers.", 12, "model.layers.12.")`.
fn block_key(name: &str) -> Option<(String, u64, String)> {
    let segments: Vec<&str> = name.split('.').collect();
    // The last segment is the parameter's own name, never a block index.
    let last = segments.len().saturating_sub(1);
    let i = segments[..last]
        .iter()
        .position(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))?;
    let index: u64 = segments[i].parse().ok()?;
    let list: String = segments[..i].iter().map(|s| format!("{s}.")).collect();
    let block = format!("{list}{}.", segments[i]);
    Some((list, index, block))
}

impl ModelBlocks {
    /// Finds the blocks from the tensor names alone (see the module's rule).
    pub fn from_tensors<'a>(tensors: impl IntoIterator<Item = &'a TensorInfo>) -> Self {
        Self::discover(tensors.into_iter().map(TensorSizes::from).collect())
    }

    /// As [`ModelBlocks::from_tensors`], from sizes built by hand.
    pub fn discover(tensors: Vec<TensorSizes>) -> Self {
        // list -> (first appearance, index -> (block name, tensors))
        type Members = BTreeMap<u64, (String, Vec<(usize, TensorSizes)>)>;
        type Lists = BTreeMap<String, (usize, Members)>;
        let mut lists: Lists = BTreeMap::new();
        let mut loose = Vec::new();
        for (position, t) in tensors.into_iter().enumerate() {
            match block_key(&t.name) {
                Some((list, index, block)) => {
                    let entry = lists.entry(list).or_insert((position, BTreeMap::new()));
                    // `layers.01.` and `layers.1.` are different modules with one index; keep
                    // them apart by name so no tensor changes block.
                    let slot = entry.1.entry(index).or_insert((block.clone(), Vec::new()));
                    if slot.0 == block {
                        slot.1.push((position, t));
                    } else {
                        loose.push((position, t));
                    }
                }
                None => loose.push((position, t)),
            }
        }
        let mut ordered: Vec<_> = lists.into_values().collect();
        ordered.sort_by_key(|(first, _)| *first);
        let mut blocks = Vec::new();
        for (_, members) in ordered {
            if members.len() < 2 {
                loose.extend(members.into_values().flat_map(|(_, ts)| ts));
                continue;
            }
            for (_, (name, ts)) in members {
                blocks.push(BlockTensors {
                    name,
                    tensors: ts.into_iter().map(|(_, t)| t).collect(),
                });
            }
        }
        loose.sort_by_key(|(position, _)| *position);
        ModelBlocks {
            blocks,
            outside: loose.into_iter().map(|(_, t)| t).collect(),
        }
    }

    /// Blocks given by the user as name prefixes, in the order given. A prefix without a
    /// trailing dot gets one, so `blocks.1` does not take `blocks.10.`.
    pub fn with_prefixes<'a>(
        tensors: impl IntoIterator<Item = &'a TensorInfo>,
        prefixes: &[String],
    ) -> Result<Self, PlanError> {
        Self::from_prefixes(
            tensors.into_iter().map(TensorSizes::from).collect(),
            prefixes,
        )
    }

    /// As [`ModelBlocks::with_prefixes`], from sizes built by hand.
    pub fn from_prefixes(
        tensors: Vec<TensorSizes>,
        prefixes: &[String],
    ) -> Result<Self, PlanError> {
        let prefixes = check_block_prefixes(prefixes)?;
        let mut blocks: Vec<BlockTensors> = prefixes
            .iter()
            .map(|p| BlockTensors {
                name: p.clone(),
                tensors: Vec::new(),
            })
            .collect();
        let mut outside = Vec::new();
        let mut names = Vec::new();
        for t in tensors {
            names.push(t.name.clone());
            match blocks.iter_mut().find(|b| t.name.starts_with(&b.name)) {
                Some(b) => b.tensors.push(t),
                None => outside.push(t),
            }
        }
        if let Some(empty) = blocks.iter().find(|b| b.tensors.is_empty()) {
            return Err(PlanError::UnknownPrefix {
                prefix: empty.name.clone(),
                near: near_names(&empty.name, names.iter().map(String::as_str)),
            });
        }
        Ok(ModelBlocks { blocks, outside })
    }
}

/// Adds the trailing dot a module prefix needs, so `blocks.1` does not match `blocks.10.`.
pub(crate) fn normalize_prefix(prefix: &str) -> Result<String, PlanError> {
    let p = prefix.trim();
    if p.is_empty() {
        return Err(PlanError::EmptyPrefix);
    }
    Ok(if p.ends_with('.') {
        p.to_string()
    } else {
        format!("{p}.")
    })
}

/// Block prefixes as the user gave them, each with the trailing dot a module prefix needs (so
/// `blocks.1` does not take `blocks.10.`), checked: none empty, none given twice, and none
/// inside another (`blocks.` and `blocks.1.`), since a tensor belongs to one block. The one
/// check of the planner and of Python's `find_blocks`.
pub fn check_block_prefixes(prefixes: &[String]) -> Result<Vec<String>, PlanError> {
    let mut checked: Vec<String> = Vec::with_capacity(prefixes.len());
    for raw in prefixes {
        let name = normalize_prefix(raw)?;
        if let Some(other) = checked
            .iter()
            .find(|b| b.starts_with(name.as_str()) || name.starts_with(b.as_str()))
        {
            return Err(if *other == name {
                PlanError::NamedTwice {
                    block: name,
                    first: other.clone(),
                    second: raw.clone(),
                }
            } else {
                PlanError::OverlappingPrefixes {
                    first: other.clone(),
                    second: name,
                }
            });
        }
        checked.push(name);
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn t(name: &str) -> TensorSizes {
        TensorSizes::new(name, DType::BF16, &[4, 4])
    }

    fn names(m: &ModelBlocks) -> Vec<&str> {
        m.blocks.iter().map(|b| b.name.as_str()).collect()
    }

    #[test]
    fn first_digit_segment_names_the_block() {
        assert_eq!(
            block_key("model.layers.12.mlp.experts.3.w1.weight")
                .unwrap()
                .2,
            "model.layers.12."
        );
        assert_eq!(
            block_key("double_blocks.3.img_attn.qkv.weight").unwrap().2,
            "double_blocks.3."
        );
        assert_eq!(block_key("0.weight").unwrap().2, "0.");
        assert_eq!(block_key("lm_head.weight"), None);
        assert_eq!(block_key("norm.0"), None);
    }

    #[test]
    fn lists_in_first_appearance_order_numeric_within() {
        let m = ModelBlocks::discover(vec![
            t("embed.weight"),
            t("single_blocks.10.w"),
            t("double_blocks.2.w"),
            t("single_blocks.2.w"),
            t("double_blocks.0.w"),
            t("single_blocks.2.scale_weight"),
            t("proj.0.weight"),
            t("final.norm.weight"),
        ]);
        assert_eq!(
            names(&m),
            [
                "single_blocks.2.",
                "single_blocks.10.",
                "double_blocks.0.",
                "double_blocks.2."
            ]
        );
        assert_eq!(m.blocks[0].tensors.len(), 2);
        let outside: Vec<_> = m.outside.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            outside,
            ["embed.weight", "proj.0.weight", "final.norm.weight"]
        );
    }

    #[test]
    fn explicit_prefixes() {
        let ts = vec![
            t("blocks.0.w"),
            t("blocks.1.w"),
            t("blocks.10.w"),
            t("head.w"),
        ];
        let m = ModelBlocks::from_prefixes(ts.clone(), &["blocks.1".into(), "blocks.0.".into()])
            .unwrap();
        assert_eq!(names(&m), ["blocks.1.", "blocks.0."]);
        assert_eq!(m.outside.len(), 2);
        let err = ModelBlocks::from_prefixes(ts.clone(), &["blocks.7.".into()]).unwrap_err();
        assert!(err.to_string().contains("blocks.7."), "{err}");
        let err = ModelBlocks::from_prefixes(ts.clone(), &["blocks.".into(), "blocks.1.".into()])
            .unwrap_err();
        assert!(matches!(err, PlanError::OverlappingPrefixes { .. }));
        let err = ModelBlocks::from_prefixes(ts, &["".into()]).unwrap_err();
        assert!(matches!(err, PlanError::EmptyPrefix));
    }

    #[test]
    fn block_prefixes_are_checked_once() {
        let p =
            |v: &[&str]| check_block_prefixes(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            p(&["blocks.1", "blocks.10."]).unwrap(),
            ["blocks.1.", "blocks.10."]
        );
        let err = p(&["blocks.0.", "blocks.0"]).unwrap_err();
        assert!(matches!(err, PlanError::NamedTwice { .. }), "{err}");
        assert!(err.to_string().contains("named twice"), "{err}");
        let err = p(&["blocks.", "blocks.1."]).unwrap_err();
        assert!(
            matches!(err, PlanError::OverlappingPrefixes { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("overlap"), "{err}");
        assert!(matches!(p(&[" "]), Err(PlanError::EmptyPrefix)));
    }

    #[test]
    fn scale_suffixes() {
        for n in [
            "a.weight_scale",
            "a.scale_weight",
            "a.weight_scale_inv",
            "a.input_scale",
        ] {
            assert!(t(n).is_scale(), "{n}");
        }
        assert!(!t("a.scale").is_scale() && !t("a.weight").is_scale());
    }

    #[test]
    fn normalizes() {
        assert_eq!(normalize_prefix("blocks.1").unwrap(), "blocks.1.");
        assert_eq!(normalize_prefix(" blocks.1. ").unwrap(), "blocks.1.");
        assert!(matches!(normalize_prefix(" "), Err(PlanError::EmptyPrefix)));
    }
}

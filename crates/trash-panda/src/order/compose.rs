//! Matching an order's names against the model's blocks, and the full run order built from them.
//!
//! Names are compared without their trailing dot: the planner spells a block `layers.3.` (a
//! prefix of its tensor names), people and order files write `layers.3`, and both mean the same.

use std::collections::HashMap;

use super::OrderError;

/// How many block names an error message lists before it cuts the list short.
const LISTED: usize = 12;

/// A block name without its trailing dot: the form order files hold and names are compared in.
pub fn block_key(name: &str) -> &str {
    name.strip_suffix('.').unwrap_or(name)
}

/// `a, b, c`, or the first names and a count when the model has many blocks.
pub(crate) fn list_blocks(blocks: &[String]) -> String {
    if blocks.len() <= LISTED {
        return blocks.join(", ");
    }
    format!(
        "{}, ... ({} blocks in all)",
        blocks[..LISTED - 2].join(", "),
        blocks.len()
    )
}

/// Why a list of names does not fit the model, before it becomes an error or an ignored file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mismatch {
    Unknown(String),
    Duplicate(String),
}

/// The model's blocks by key, for looking names up.
pub(crate) struct BlockIndex<'a> {
    by_key: HashMap<&'a str, usize>,
    count: usize,
}

impl<'a> BlockIndex<'a> {
    pub(crate) fn new<S: AsRef<str>>(blocks: &'a [S]) -> Result<Self, OrderError> {
        let mut by_key = HashMap::with_capacity(blocks.len());
        for (i, b) in blocks.iter().enumerate() {
            if by_key.insert(block_key(b.as_ref()), i).is_some() {
                return Err(OrderError::DuplicateModelBlock {
                    name: b.as_ref().to_string(),
                });
            }
        }
        Ok(BlockIndex {
            by_key,
            count: blocks.len(),
        })
    }

    /// The position in the model of each name, in the names' order.
    pub(crate) fn resolve<S: AsRef<str>>(&self, names: &[S]) -> Result<Vec<usize>, Mismatch> {
        let mut seen = vec![false; self.count];
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let name = name.as_ref();
            let Some(&i) = self.by_key.get(block_key(name)) else {
                return Err(Mismatch::Unknown(name.to_string()));
            };
            match seen.get_mut(i) {
                Some(s) if !*s => *s = true,
                _ => return Err(Mismatch::Duplicate(name.to_string())),
            }
            out.push(i);
        }
        Ok(out)
    }
}

/// The full run order, as positions in `blocks` (the model's blocks in plan order): the blocks
/// `first` names, in that order, then every other block in plan order. This is what `order=`
/// and a usable order file both turn into.
pub fn full_order<A: AsRef<str>, B: AsRef<str>>(
    first: &[A],
    blocks: &[B],
) -> Result<Vec<usize>, OrderError> {
    let index = BlockIndex::new(blocks)?;
    let named = index.resolve(first).map_err(|m| match m {
        Mismatch::Unknown(name) => OrderError::UnknownBlock {
            name,
            blocks: blocks.iter().map(|b| b.as_ref().to_string()).collect(),
        },
        Mismatch::Duplicate(name) => OrderError::DuplicateBlock { name },
    })?;
    Ok(complete(named, blocks.len()))
}

/// `named` followed by every position below `count` it lacks, in increasing order.
pub(crate) fn complete(mut named: Vec<usize>, count: usize) -> Vec<usize> {
    let mut taken = vec![false; count];
    for &i in &named {
        if let Some(t) = taken.get_mut(i) {
            *t = true;
        }
    }
    named.extend((0..count).filter(|&i| !taken[i]));
    named
}

//! How a run order is composed from names: matching names against the model's blocks, and the
//! full run order they give (the named blocks first, then the others in plan order).
//!
//! Names are compared without their trailing dot: the planner spells a block `layers.3.` (a
//! prefix of its tensor names), people and order files write `layers.3`, and both mean the same.
//! What a name that does not fit means (an error, or an order file to ignore) is the caller's:
//! these rules say only which name and why (`Mismatch`).

use std::collections::HashMap;

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
    /// A name that is no block of the model.
    Unknown(String),
    /// A block the list names twice (with or without its trailing dot).
    Duplicate(String),
}

/// The model's blocks by key, for looking names up.
pub(crate) struct BlockIndex<'a> {
    by_key: HashMap<&'a str, usize>,
    count: usize,
}

impl<'a> BlockIndex<'a> {
    /// The index of the model's `blocks`; [`Mismatch::Duplicate`] when the list names a block
    /// twice.
    pub(crate) fn new<S: AsRef<str>>(blocks: &'a [S]) -> Result<Self, Mismatch> {
        let mut by_key = HashMap::with_capacity(blocks.len());
        for (i, b) in blocks.iter().enumerate() {
            if by_key.insert(block_key(b.as_ref()), i).is_some() {
                return Err(Mismatch::Duplicate(b.as_ref().to_string()));
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

/// The full run order from the positions of the blocks that run first: `named` followed by every
/// position below `count` it lacks, in increasing order (plan order).
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

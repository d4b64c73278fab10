//! Order files: the order a model's blocks ran in, kept next to its checkpoint so the next run
//! can prefetch in that order from its first call.
//!
//! The order files' rules live here (how names become a run order is
//! [`crate::rules::run_order`]'s), and the Python layer only asks: [`order_file_path`] names the file,
//! [`read_order_file`] gives the order or why there is none ([`Ignored`]), [`order_to_write`]
//! decides what of the order recorded during the run goes back to the file, [`write_order_file`]
//! writes it atomically, and [`full_order`] turns the names that run first (from the file or
//! from `order=`) into the whole run order. A bad file is never an error: the run falls back to
//! the model's order and replaces the file. Errors are for what the caller has to report once
//! (a file it cannot read, a folder it cannot write) or for a caller's wrong argument. The
//! format is described in docs/order-format.md.

mod atomic;
mod error;
mod format;
mod path;

#[cfg(test)]
mod tests;

pub use crate::rules::run_order::block_key;
pub use error::OrderError;
pub use format::{Ignored, OrderFile, MAX_ORDER_FILE_BYTES, ORDER_FORMAT, ORDER_VERSION};
pub use path::{order_file_path, ORDER_SUFFIX};

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use crate::rules::run_order::{complete, BlockIndex, Mismatch};

/// An order file's names, matched against the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownOrder {
    /// The file's blocks as the model spells them, in the file's order.
    pub blocks: Vec<String>,
    /// Their positions among the model's blocks.
    pub indices: Vec<usize>,
    /// The file's outside modules: name -> how many blocks of the run order start before its
    /// first use (empty when the file has none, as files written before them).
    pub outside: BTreeMap<String, usize>,
}

impl KnownOrder {
    /// The file's outside positions when every name in them is one of `model_outside` (the
    /// modules outside the model's blocks that hold weights); otherwise none at all, so the
    /// outside weights are all loaded before the first call. A wrong name says the file was
    /// recorded with another model's modules: its positions are not trusted, its blocks still
    /// are (they were matched on their own), and the run writes right ones.
    pub fn outside_for<S: AsRef<str>>(&self, model_outside: &[S]) -> BTreeMap<String, usize> {
        let known: HashSet<&str> = model_outside.iter().map(AsRef::as_ref).collect();
        if self.outside.keys().all(|n| known.contains(n.as_str())) {
            self.outside.clone()
        } else {
            BTreeMap::new()
        }
    }

    /// The whole run order: these blocks, then the model's others in plan order.
    pub fn full(&self, block_count: usize) -> Vec<usize> {
        complete(self.indices.clone(), block_count)
    }
}

/// What reading an order file gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderRead {
    /// The file holds an order that fits the model.
    Usable(KnownOrder),
    /// Nothing usable: run in the model's order, and write the file when the model is released.
    Ignored(Ignored),
}

impl OrderRead {
    /// The order, when the file was usable.
    pub fn order(&self) -> Option<&KnownOrder> {
        match self {
            OrderRead::Usable(k) => Some(k),
            OrderRead::Ignored(_) => None,
        }
    }

    /// Why the file was not used, when it was not.
    pub fn ignored(&self) -> Option<&Ignored> {
        match self {
            OrderRead::Usable(_) => None,
            OrderRead::Ignored(i) => Some(i),
        }
    }

    /// The one line worth a warning, for a file that exists but was ignored. An absent file and
    /// a usable one say nothing.
    pub fn warning(&self, path: &Path) -> Option<String> {
        match self.ignored()? {
            Ignored::Absent => None,
            why => Some(format!(
                "order file {} ignored: {why}; it will be replaced when the model is released",
                path.display()
            )),
        }
    }
}

/// The full run order, as positions in `blocks` (the model's blocks in plan order): the blocks
/// `first` names, in that order, then every other block in plan order (the rule of
/// [`crate::rules::run_order`]). This is what `order=` and a usable order file both turn into.
pub fn full_order<A: AsRef<str>, B: AsRef<str>>(
    first: &[A],
    blocks: &[B],
) -> Result<Vec<usize>, OrderError> {
    let index = model_index(blocks)?;
    let named = index
        .resolve(first)
        .map_err(|m| order_mismatch(m, blocks))?;
    Ok(complete(named, blocks.len()))
}

/// The index of the model's blocks; a block the model's list names twice is the caller's error.
fn model_index<S: AsRef<str>>(blocks: &[S]) -> Result<BlockIndex<'_>, OrderError> {
    BlockIndex::new(blocks).map_err(|m| match m {
        Mismatch::Duplicate(name) | Mismatch::Unknown(name) => {
            OrderError::DuplicateModelBlock { name }
        }
    })
}

/// The error for names (of an order, not the model's list) that do not fit the model's `blocks`.
fn order_mismatch<S: AsRef<str>>(m: Mismatch, blocks: &[S]) -> OrderError {
    match m {
        Mismatch::Unknown(name) => OrderError::UnknownBlock {
            name,
            blocks: blocks.iter().map(|b| b.as_ref().to_string()).collect(),
        },
        Mismatch::Duplicate(name) => OrderError::DuplicateBlock { name },
    }
}

/// Reads the order file at `path` and matches it against `model_blocks` (the model's block
/// names in plan order, with or without trailing dots).
///
/// A missing, torn, foreign or mismatched file gives [`OrderRead::Ignored`]. Errors are for a
/// file that exists but cannot be read ([`OrderError::Read`]: the caller warns once, runs in the
/// model's order, and had better not write either) and for a block list naming a block twice.
pub fn read_order_file<S: AsRef<str>>(
    path: &Path,
    model_blocks: &[S],
) -> Result<OrderRead, OrderError> {
    let index = model_index(model_blocks)?;
    let bytes = match read_capped(path) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return Ok(OrderRead::Ignored(Ignored::TooLarge {
                bytes: std::fs::metadata(path).map_or(MAX_ORDER_FILE_BYTES + 1, |m| m.len()),
            }))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(OrderRead::Ignored(Ignored::Absent))
        }
        Err(source) => {
            return Err(OrderError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    Ok(match_order(&bytes, model_blocks, &index))
}

/// The whole file, or `None` when it is larger than an order file can be.
fn read_capped(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    File::open(path)?
        .take(MAX_ORDER_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= MAX_ORDER_FILE_BYTES).then_some(bytes))
}

fn match_order<S: AsRef<str>>(bytes: &[u8], model_blocks: &[S], index: &BlockIndex) -> OrderRead {
    let file = match OrderFile::parse(bytes) {
        Ok(file) => file,
        Err(why) => return OrderRead::Ignored(why),
    };
    match index.resolve(&file.blocks) {
        Ok(indices) => OrderRead::Usable(KnownOrder {
            blocks: indices
                .iter()
                .filter_map(|&i| model_blocks.get(i).map(|b| b.as_ref().to_string()))
                .collect(),
            indices,
            outside: file.outside,
        }),
        Err(Mismatch::Unknown(name)) => OrderRead::Ignored(Ignored::UnknownBlock { name }),
        Err(Mismatch::Duplicate(name)) => OrderRead::Ignored(Ignored::Duplicate { name }),
    }
}

/// The order to write to the file after a run, or `None` when the file should stay as it is.
///
/// `recorded` is every block that ran, in the order of their first run (a block that ran twice
/// counts at its first place); `model_blocks` the model's blocks in plan order. A pass that ran
/// every block gives its own order. A pass that ran only some (a call of one part of the model,
/// or a run stopped early) is merged into the order known before it (the file's, else the
/// model's): the blocks that ran come first, in the order they ran, and the others follow in
/// the order known, so a partial pass never drops what the file knew. The result is written
/// when there was no usable file, or when it differs from the file's whole order. Nothing ran:
/// nothing is written (it would wipe a good file).
pub fn order_to_write<S: AsRef<str>, B: AsRef<str>>(
    read: &OrderRead,
    recorded: &[S],
    model_blocks: &[B],
) -> Result<Option<Vec<String>>, OrderError> {
    Ok(to_write(read, recorded, model_blocks, None)?.map(|w| w.blocks))
}

/// What goes to the order file after a run: the blocks, and where the outside modules were
/// first needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderToWrite {
    /// Block keys in run order, without trailing dots.
    pub blocks: Vec<String>,
    /// Empty when the pass did not run every block (see [`file_to_write`]).
    pub outside: BTreeMap<String, usize>,
}

/// [`order_to_write`] with the outside modules the run recorded (`outside`: name -> how many
/// distinct blocks had started before its first use). A pass that ran every block writes them,
/// also when its blocks' order is the file's but its outside positions are not (so a file
/// written before they existed gains them). A pass that ran only some blocks does not know
/// where the others' outside modules fall: it compares blocks only, as [`order_to_write`], and
/// what it writes has no outside positions (the outside weights are then loaded before the
/// first call until a whole pass writes them again). A position past the blocks that ran is
/// the caller's error.
pub fn file_to_write<S: AsRef<str>, B: AsRef<str>>(
    read: &OrderRead,
    recorded: &[S],
    model_blocks: &[B],
    outside: &BTreeMap<String, usize>,
) -> Result<Option<OrderToWrite>, OrderError> {
    to_write(read, recorded, model_blocks, Some(outside))
}

fn to_write<S: AsRef<str>, B: AsRef<str>>(
    read: &OrderRead,
    recorded: &[S],
    model_blocks: &[B],
    outside: Option<&BTreeMap<String, usize>>,
) -> Result<Option<OrderToWrite>, OrderError> {
    let index = model_index(model_blocks)?;
    let mut seen = HashSet::with_capacity(recorded.len());
    let ran: Vec<&str> = recorded
        .iter()
        .map(|b| block_key(b.as_ref()))
        .filter(|k| seen.insert(*k))
        .collect();
    if ran.is_empty() {
        return Ok(None);
    }
    let ran = index
        .resolve(&ran)
        .map_err(|m| order_mismatch(m, model_blocks))?;
    let count = model_blocks.len();
    for (name, &position) in outside.into_iter().flatten() {
        if name.is_empty() {
            return Err(OrderError::EmptyOutsideName);
        }
        if position > ran.len() {
            return Err(OrderError::OutsidePosition {
                name: name.clone(),
                position,
                blocks: ran.len(),
            });
        }
    }
    let whole = ran.len() == count;
    let known = read.order().map(|k| k.full(count));
    let merged = if whole {
        ran
    } else {
        // The blocks that ran lead, in the order they ran: a part of the model called alone (a
        // VAE that only decodes) then starts where its calls start, and its next pass is staged
        // in that order. The others follow in the order known before.
        let mut ran_here = vec![false; count];
        for &i in &ran {
            ran_here[i] = true;
        }
        let rest = known.clone().unwrap_or_else(|| (0..count).collect());
        let mut order = ran;
        order.extend(rest.into_iter().filter(|&b| !ran_here[b]));
        order
    };
    // Without recorded positions (the blocks-only API) the file's are not compared.
    let outside_changed =
        whole && outside.is_some_and(|o| read.order().is_some_and(|k| k.outside != *o));
    let outside = match outside {
        Some(recorded) if whole => recorded.clone(),
        _ => BTreeMap::new(),
    };
    if known.as_ref() == Some(&merged) && !outside_changed {
        return Ok(None);
    }
    Ok(Some(OrderToWrite {
        blocks: merged
            .into_iter()
            .map(|i| model_blocks[i].as_ref().to_string())
            .collect(),
        outside,
    }))
}

/// Writes `blocks` (the order they ran in) as the order file at `path`, for `checkpoint`,
/// atomically: a reader sees the old file or the new one, and a failed write leaves the old one.
/// A folder that cannot be written gives [`OrderError::Write`], for one warning.
pub fn write_order_file<S: AsRef<str>>(
    path: &Path,
    checkpoint: &Path,
    blocks: &[S],
) -> Result<(), OrderError> {
    write_order_file_with_outside(path, checkpoint, blocks, &BTreeMap::new())
}

/// [`write_order_file`] with the outside modules' positions (name -> how many of `blocks`
/// start before its first use; none: the field is left out, as before it existed).
pub fn write_order_file_with_outside<S: AsRef<str>>(
    path: &Path,
    checkpoint: &Path,
    blocks: &[S],
    outside: &BTreeMap<String, usize>,
) -> Result<(), OrderError> {
    let file = OrderFile::new(checkpoint, blocks)?.with_outside(outside)?;
    atomic::write_atomic(path, file.to_json().as_bytes())
}

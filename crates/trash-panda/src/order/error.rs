//! The one error type of the `order` module.

use std::io;
use std::path::PathBuf;

/// What goes wrong with order files that the caller has to hear about. A bad order file is not
/// one of them: reading reports it as an [`Ignored`](super::Ignored) outcome and the run goes on.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The checkpoint path gives no name to build the order file's name from (`/`, `.json`).
    ///
    /// What to do: give a checkpoint path that names a file or folder, or pass
    /// `order_file_destination=` to say where the order file goes.
    #[error("order file: cannot name the order file of checkpoint {path}: {why}")]
    NoName {
        /// The checkpoint path (file or folder) as given.
        path: PathBuf,
        /// Why no name can be made, in words.
        why: &'static str,
    },

    /// The order file exists but could not be read (permissions, a folder in its place).
    ///
    /// What to do: fix the file's permissions, or remove what is in its place; the next run writes
    /// it again.
    #[error("order file {path}: cannot read it: {source}")]
    Read {
        /// The order file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// Writing the order file failed at `step`; the previous file, if any, is left as it was.
    ///
    /// What to do: free space or permissions where the message says, or pass
    /// `order_file_destination=` to write it elsewhere. A stage reports this as a warning and runs
    /// on.
    #[error("order file {path}: cannot write it ({step}): {source}")]
    Write {
        /// The order file (not the temporary file it is written through).
        path: PathBuf,
        /// Which step failed: "creating a temporary file", "writing", "flushing to disk" or
        /// "renaming".
        step: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// An order names a block the model does not have.
    ///
    /// What to do: name blocks of this model in `order=`, as the message lists them (an order from
    /// another model or plan does not apply).
    #[error(
        "order names {name}, which is not a block of the model (blocks: {})",
        crate::rules::run_order::list_blocks(.blocks)
    )]
    UnknownBlock {
        /// The name as the order gives it.
        name: String,
        /// The model's blocks, for the message.
        blocks: Vec<String>,
    },

    /// An order names the same block twice (with or without its trailing dot).
    ///
    /// What to do: name each block once in `order=`.
    #[error("order names {name} twice")]
    DuplicateBlock {
        /// The block's name.
        name: String,
    },

    /// The model's own block list names a block twice: the caller built it wrong.
    #[error("the model's block list names {name} twice")]
    DuplicateModelBlock {
        /// The block's name.
        name: String,
    },

    /// An empty block name (or a lone dot) in an order to be written; `position` counts from 0.
    ///
    /// What to do: every entry of the order must name a block: remove the empty one.
    #[error("order: entry {position} is an empty block name")]
    EmptyName {
        /// Index of the entry in the order, from 0.
        position: usize,
    },

    /// An outside module recorded as needed after more blocks than the order holds.
    #[error(
        "order: outside module {name} is recorded before block {position}, expected a position \
         from 0 to {blocks} (the order holds {blocks} blocks)"
    )]
    OutsidePosition {
        /// The module's name in the model.
        name: String,
        /// Blocks recorded as started before its first use.
        position: usize,
        /// Blocks in the order: the largest position allowed.
        blocks: usize,
    },

    /// An empty module name among the outside modules of an order to be written.
    #[error("order: an outside module has an empty name, expected the module's name in the model")]
    EmptyOutsideName,
}

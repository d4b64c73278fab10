//! The one error type of the `stream` module.

use std::path::PathBuf;

use crate::dtype::DtypeError;
use crate::io::IoError;
use crate::rules::RuleError;
use crate::DType;

/// Everything the prefetch engine can report. Each variant names the block (index and name) it is
/// about, so the Python layer can say which part of the model could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A worker could not read a block's tensor from its file.
    ///
    /// What to do: the drive failed a read (the I/O error says how): check the drive (`dmesg`), or
    /// copy the checkpoint to another drive. A file changed since the load reads as this too: load
    /// again.
    #[error(
        "block {block} ({name}): reading tensor {tensor} (bytes {start}..{end} of {}) failed: {source}",
        file.display()
    )]
    Read {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// The tensor's name.
        tensor: String,
        /// The checkpoint file.
        file: PathBuf,
        /// Offset of the tensor's first byte in the file.
        start: u64,
        /// Offset one past the tensor's last byte.
        end: u64,
        /// The read error.
        #[source]
        source: Box<IoError>,
    },

    /// Converting a RAM-tier tensor to the storage dtype failed.
    ///
    /// What to do: the tensor cannot be stored in `storage_dtype` (the kernel's error says why):
    /// load without `storage_dtype`, or report it with the model's name.
    #[error(
        "block {block} ({name}): converting tensor {tensor} from {from} to {to} failed: {source}"
    )]
    Convert {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// The tensor's name.
        tensor: String,
        /// The tensor's dtype in the file.
        from: DType,
        /// The storage dtype.
        to: DType,
        /// The kernel's error.
        #[source]
        source: Box<DtypeError>,
    },

    /// An engine option has a value the engine does not support.
    ///
    /// What to do: set the option to a value the message says it accepts.
    #[error("invalid engine option {option} = {value}: expected {expected}")]
    InvalidOptions {
        /// The option's name.
        option: &'static str,
        /// The value given, as text.
        value: String,
        /// What the option accepts.
        expected: &'static str,
    },

    /// A staging alignment the layout cannot keep.
    #[error("staging alignment {align} is not supported: expected a power of two from 64 to 4096")]
    Alignment {
        /// The alignment asked for, in bytes.
        align: usize,
    },

    /// The engine configuration's staging buffers are smaller than a block needs: the
    /// configuration was derived from a plan made for other tensors.
    ///
    /// What to do: the plan was made for another checkpoint (or the checkpoint changed since): make
    /// the plan again for the files you load.
    #[error(
        "block {block} ({name}) needs {needs} bytes of staging buffer but the plan's buffers hold \
         {buffer}: the plan was made for other tensors; plan the model again"
    )]
    StagingTooSmall {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// Staging bytes the block needs.
        needs: usize,
        /// Bytes each buffer holds.
        buffer: usize,
    },

    /// The shared staging pool's buffers are smaller than a block of this engine needs: the
    /// pool was sized for other stages' blocks.
    ///
    /// What to do: size the shared `StagingPool` for every stage that uses it: make it from the
    /// largest of the stages' plans (a `Pipeline` does).
    #[error(
        "block {block} ({name}) needs {needs} bytes of staging buffer but the shared staging \
         pool's buffers hold {buffer}: size the pool for the largest block of every stage"
    )]
    PoolTooSmall {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// Staging bytes the block needs.
        needs: usize,
        /// Bytes each buffer holds.
        buffer: usize,
    },

    /// The engine was asked to stream while another engine has the shared staging pool.
    ///
    /// What to do: models that share a `StagingPool` run one at a time: finish (or release) the one
    /// the message names before another streams. A `Pipeline` does this for you.
    #[error(
        "{engine} cannot stage block {block} ({name}): the shared staging pool is held by \
         {holder}; park that engine when its turn ends"
    )]
    PoolHeld {
        /// The name the engine goes by with the shared pool.
        engine: String,
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// The name of the engine that holds the pool now.
        holder: String,
    },

    /// `park` was called while leases still hold staging buffers of the shared pool.
    ///
    /// What to do: a stage ended while one of its blocks was still in use. In a `Pipeline` this is
    /// a warning and the stage is released; with a pool of your own, release the model before the
    /// next one streams.
    #[error(
        "{engine} cannot give the shared staging pool back: leases still hold {}",
        holders.join(", ")
    )]
    ParkWhileLeased {
        /// The name the engine goes by with the shared pool.
        engine: String,
        /// The leased blocks, each as `block <index> (<name>)`.
        holders: Vec<String>,
    },

    /// A checkpoint file could not be opened, mapped or measured when the engine was created.
    ///
    /// What to do: check the file still exists and can be read; it may have been moved or deleted
    /// after the plan was made.
    #[error("cannot open checkpoint file {}: {source}", file.display())]
    Open {
        /// The checkpoint file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: Box<IoError>,
    },

    /// The description of a block does not fit the files (bad file index, range past the end).
    ///
    /// What to do: the plan does not fit the files (made for another checkpoint, or the files
    /// changed since): make the plan again for the files you load.
    #[error("block {block} ({name}): {reason}")]
    InvalidBlock {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// What is wrong, in words.
        reason: String,
    },

    /// `acquire` (or an order) named a block index the engine does not have.
    #[error("unknown block index {block} (the engine has {count} streamed blocks)")]
    UnknownBlock {
        /// The index given.
        block: usize,
        /// Streamed blocks the engine has.
        count: usize,
    },

    /// `Lease::tensor` was asked for a tensor the block does not have.
    #[error("block {block} ({name}) has no tensor {tensor}")]
    UnknownTensor {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// The tensor asked for: its name, or `#<index>`.
        tensor: String,
    },

    /// The run order given to `set_order` is not usable.
    ///
    /// What to do: give `order=` the names of the plan's streamed blocks, each once; the message
    /// says what is wrong.
    #[error("invalid run order: {reason}")]
    InvalidOrder {
        /// Why the order is refused.
        reason: String,
    },

    /// Every staging buffer is held by a lease, so the block asked for can never be staged until
    /// one is released (acquiring more than `lookahead + 1` blocks without releasing).
    #[error(
        "all {buffers} staging buffers are leased (held by {}) while acquiring block {block} ({name}); release a lease first",
        holders.join(", ")
    )]
    AllLeased {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// Staging buffers the engine has.
        buffers: usize,
        /// The blocks in the buffers, each as `block <index> (<name>)`.
        holders: Vec<String>,
    },

    /// The block is already leased; a block is staged in one buffer at a time.
    #[error("block {block} ({name}) is already leased; release it before acquiring it again")]
    AlreadyLeased {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
    },

    /// A worker panicked while staging the block (a bug); the engine itself keeps working.
    #[error("a worker panicked while staging block {block} ({name}): {message}")]
    WorkerPanicked {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// The panic's message, when it was a string.
        message: String,
    },

    /// No worker thread is left to stage blocks.
    #[error("no staging worker is running (they exited after a panic) while acquiring block {block} ({name})")]
    WorkersGone {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
    },

    /// The engine was stopped while the block was being staged.
    ///
    /// What to do: the model was released while a forward still ran (in another thread, or a
    /// callback): release it only after its last forward has returned.
    #[error("the stream engine is shutting down (block {block} ({name}) was not staged)")]
    ShuttingDown {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
    },

    /// The staging buffers or a RAM-tier copy could not be allocated.
    ///
    /// What to do: the machine is out of memory for the staging buffers or the RAM tier: plan with
    /// less (`lookahead`, `pinned_buffers`, `ram=`), or free memory.
    #[error("cannot allocate {what}: {source}")]
    Alloc {
        /// What was being allocated, in words.
        what: String,
        /// The allocation error.
        #[source]
        source: Box<IoError>,
    },

    /// A worker thread could not be started.
    ///
    /// What to do: the system refused a thread (a thread or process limit such as `ulimit -u`):
    /// raise the limit, or lower `TRASH_PANDA_WORKERS`.
    #[error("cannot start a staging worker thread: {source}")]
    Spawn {
        /// The error from starting the thread.
        #[source]
        source: std::io::Error,
    },

    /// A patch (a merged form of some of a block's tensors) cannot be kept as asked.
    ///
    /// What to do: the message says what did not match (a tensor's length, its scales, a block
    /// used in place); the layer is merged on each run instead.
    #[error("block {block} ({name}): cannot patch {tensor}: {reason}")]
    Patch {
        /// The block's index among the engine's streamed blocks.
        block: usize,
        /// The block's name.
        name: String,
        /// The tensor's name, or what was asked for.
        tensor: String,
        /// What is wrong, in words.
        reason: String,
    },

    /// An overlay file could not be made, written, read or renamed.
    ///
    /// What to do: check that the overlay folder (`TRASH_PANDA_OVERLAY_DIR`) is writable and its
    /// drive has room; the layer is merged on each run meanwhile.
    #[error("cannot {what} {}: {source}", path.display())]
    Overlay {
        /// The file or folder.
        path: PathBuf,
        /// What was being done, in words.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The overlay folder's limit leaves no room for one more merged block.
    ///
    /// What to do: raise `TRASH_PANDA_OVERLAY_LIMIT`, or remove overlay files of runs you will
    /// not repeat; the block is merged on each run meanwhile.
    #[error(
        "the overlay folder {} holds {used} bytes of its limit of {limit}; a merged block needs \
         {needs} more",
        dir.display()
    )]
    OverlayFull {
        /// The overlay folder.
        dir: PathBuf,
        /// Its limit, in bytes.
        limit: u64,
        /// Bytes of overlay files it holds that cannot go (held by this process's engines).
        used: u64,
        /// Bytes the new file needs.
        needs: u64,
    },
}

impl StreamError {
    /// A failed read of `tensor` (of `block`, index `index`) from its file in `files`.
    pub(crate) fn read(
        index: usize,
        block: &super::StreamBlock,
        tensor: &super::StreamTensor,
        files: &[PathBuf],
        source: IoError,
    ) -> StreamError {
        StreamError::Read {
            block: index,
            name: block.name.clone(),
            tensor: tensor.name.clone(),
            file: files[tensor.file].clone(),
            start: tensor.start,
            end: tensor.end,
            source: Box::new(source),
        }
    }
}

/// The layout's refusals, as the engine's variants of the same name and message.
impl From<RuleError> for StreamError {
    fn from(e: RuleError) -> Self {
        match e {
            RuleError::InvalidOptions {
                option,
                value,
                expected,
            } => StreamError::InvalidOptions {
                option,
                value,
                expected,
            },
            RuleError::Alignment { align } => StreamError::Alignment { align },
            RuleError::InvalidBlock {
                block,
                name,
                reason,
            } => StreamError::InvalidBlock {
                block,
                name,
                reason,
            },
        }
    }
}

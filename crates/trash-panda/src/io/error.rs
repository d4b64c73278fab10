//! The one error type of the `io` module.

use std::path::PathBuf;

/// Everything that can go wrong while opening, mapping or reading a file.
///
/// Ranges are printed as `start..end` in bytes, so a message says which part of which file failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The file could not be opened (or its size could not be read).
    ///
    /// What to do: check the file exists and can be read by this user; it may have been moved or
    /// deleted after the plan was made.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The file could not be memory-mapped.
    ///
    /// What to do: the file system does not map files (some network and FUSE mounts do not): copy
    /// the checkpoint to a local drive, or set `TRASH_PANDA_RAM_IN_MEMORY=1` to read the RAM tier
    /// instead.
    #[error("cannot map {}: {source}", path.display())]
    Map {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A read system call failed.
    ///
    /// What to do: the drive failed a read (the I/O error says how): check the drive (`dmesg`), or
    /// copy the checkpoint to another drive.
    #[error("cannot read {} bytes {offset}..{} ({len} bytes): {source}", path.display(), offset + len)]
    Read {
        /// The file.
        path: PathBuf,
        /// Offset of the range's first byte in the file.
        offset: u64,
        /// Bytes in the range.
        len: u64,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The requested range does not lie inside the file.
    ///
    /// What to do: the file is shorter than its header says: it changed after it was opened, or it
    /// is damaged. Load the model again; download the file again if it repeats.
    #[error(
        "range {offset}..{} of {} is beyond the end of the file ({file_size} bytes)",
        offset.saturating_add(*len),
        path.display()
    )]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Offset of the range's first byte in the file.
        offset: u64,
        /// Bytes in the range.
        len: u64,
        /// The file's size in bytes.
        file_size: u64,
    },

    /// The file ended early: it shrank after it was opened.
    ///
    /// What to do: the file shrank while it was read: another program rewrote it. Leave checkpoints
    /// alone while they are loaded, and load again.
    #[error(
        "{} ended at byte {got_to} while reading bytes {offset}..{} (was it truncated?)",
        path.display(),
        offset + len
    )]
    UnexpectedEof {
        /// The file.
        path: PathBuf,
        /// Offset of the range's first byte in the file.
        offset: u64,
        /// Bytes in the range.
        len: u64,
        /// Offset one past the last byte that could be read.
        got_to: u64,
    },

    /// The file is no longer the one whose header was read: written to, replaced by another
    /// file, resized or removed since (see [`FileStamp`](super::FileStamp)).
    ///
    /// What to do: another program rewrote the checkpoint while the model used it, so the
    /// header's offsets no longer find its tensors. Leave checkpoints alone while they are
    /// loaded (write a new one under another name), and load the model again.
    #[error(
        "{} changed after the model was loaded ({change}): its blocks would no longer be the \
         tensors its header names; load the model again",
        path.display()
    )]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed.
        change: super::Change,
    },

    /// A caller-supplied buffer cannot hold what was asked for.
    #[error("buffer of {have} bytes is too small for {need} bytes (reading {}, offset {offset})", path.display())]
    BufferTooSmall {
        /// The file.
        path: PathBuf,
        /// Offset of the range's first byte in the file.
        offset: u64,
        /// Bytes the read needs room for.
        need: usize,
        /// Bytes the buffer holds.
        have: usize,
    },

    /// An aligned buffer could not be allocated.
    ///
    /// What to do: the machine is out of memory for the buffers: plan with less (`lookahead`,
    /// `pinned_buffers`, a smaller `ram=`) or free memory.
    #[error("cannot allocate {len} bytes aligned to {align}: {reason}")]
    Alloc {
        /// Bytes asked for.
        len: usize,
        /// The alignment asked for, in bytes.
        align: usize,
        /// Why it failed (a bad size or alignment, or no memory).
        reason: &'static str,
    },

    /// Private memory for reads could not be mapped.
    ///
    /// What to do: the machine is out of memory (or of maps: `vm.max_map_count`): plan with
    /// less (a smaller `ram=`) or free memory.
    #[error("cannot map {len} bytes of memory ({op}): {source}")]
    Pages {
        /// Bytes asked for.
        len: usize,
        /// The call that failed.
        op: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },

    /// Page cache control (`posix_fadvise`, `mincore`) failed or is not available here.
    ///
    /// What to do: the file system refuses page-cache control (some network mounts): set
    /// `TRASH_PANDA_DISK_MODE=buffered`, or copy the checkpoint to a local drive.
    #[error("page cache control ({op}) on {} failed: {source}", path.display())]
    Cache {
        /// The file.
        path: PathBuf,
        /// The call that failed.
        op: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl IoError {
    /// The file the error is about, where there is one.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            IoError::Open { path, .. }
            | IoError::Map { path, .. }
            | IoError::Read { path, .. }
            | IoError::OutOfRange { path, .. }
            | IoError::UnexpectedEof { path, .. }
            | IoError::Changed { path, .. }
            | IoError::BufferTooSmall { path, .. }
            | IoError::Cache { path, .. } => Some(path),
            IoError::Alloc { .. } | IoError::Pages { .. } => None,
        }
    }
}

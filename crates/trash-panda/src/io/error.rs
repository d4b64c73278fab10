//! The one error type of the `io` module.

use std::path::PathBuf;

/// Everything that can go wrong while opening, mapping or reading a file.
///
/// Ranges are printed as `start..end` in bytes, so a message says which part of which file failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The file could not be opened (or its size could not be read).
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The file could not be memory-mapped.
    #[error("cannot map {}: {source}", path.display())]
    Map {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A read system call failed.
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
    #[error("cannot allocate {len} bytes aligned to {align}: {reason}")]
    Alloc {
        /// Bytes asked for.
        len: usize,
        /// The alignment asked for, in bytes.
        align: usize,
        /// Why it failed (a bad size or alignment, or no memory).
        reason: &'static str,
    },

    /// Page cache control (`posix_fadvise`, `mincore`) failed or is not available here.
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
            | IoError::BufferTooSmall { path, .. }
            | IoError::Cache { path, .. } => Some(path),
            IoError::Alloc { .. } => None,
        }
    }
}

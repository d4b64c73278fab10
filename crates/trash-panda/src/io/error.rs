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
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The file could not be memory-mapped.
    #[error("cannot map {}: {source}", path.display())]
    Map {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A read system call failed.
    #[error("cannot read {} bytes {offset}..{} ({len} bytes): {source}", path.display(), offset + len)]
    Read {
        path: PathBuf,
        offset: u64,
        len: u64,
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
        path: PathBuf,
        offset: u64,
        len: u64,
        file_size: u64,
    },

    /// The file ended early: it shrank after it was opened.
    #[error(
        "{} ended at byte {got_to} while reading bytes {offset}..{} (was it truncated?)",
        path.display(),
        offset + len
    )]
    UnexpectedEof {
        path: PathBuf,
        offset: u64,
        len: u64,
        got_to: u64,
    },

    /// A caller-supplied buffer cannot hold what was asked for.
    #[error("buffer of {have} bytes is too small for {need} bytes (reading {}, offset {offset})", path.display())]
    BufferTooSmall {
        path: PathBuf,
        offset: u64,
        need: usize,
        have: usize,
    },

    /// An aligned buffer could not be allocated.
    #[error("cannot allocate {len} bytes aligned to {align}: {reason}")]
    Alloc {
        len: usize,
        align: usize,
        reason: &'static str,
    },

    /// Page cache control (`posix_fadvise`, `mincore`) failed or is not available here.
    #[error("page cache control ({op}) on {} failed: {source}", path.display())]
    Cache {
        path: PathBuf,
        op: &'static str,
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

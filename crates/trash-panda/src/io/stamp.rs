//! What a file was when it was first looked at: its length, its modification time and (where the
//! system gives one) the identity of the file behind the path. A checkpoint's tensors are read by
//! the offsets of a header read once; when the file has been rewritten or replaced since, those
//! offsets may point into other bytes. A checkpoint keeps one stamp per file from its header's
//! read (`Checkpoint::changed`), and the engine one per file it reads, checked before each read
//! of a block, so a rewrite gives an error instead of a mix of two files' bytes.
//!
//! A file rewritten in place to the same length within the same tick of the file system's
//! clock cannot be told apart; every other rewrite, a replacement by rename, a length change
//! and a removal can.

use std::fmt;
use std::fs::Metadata;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// One file's length, modification time and identity, as read when the checkpoint opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    /// Device and inode where the platform has them: a file replaced by a rename keeps neither.
    id: Option<(u64, u64)>,
}

impl FileStamp {
    /// The stamp of a file's metadata (from its path or from an open file).
    pub fn of(meta: &Metadata) -> Self {
        FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            id: file_id(meta),
        }
    }

    /// How the file at `path` now differs from this stamp; `None` when it does not.
    pub fn change_at(&self, path: &Path) -> Option<Change> {
        match std::fs::metadata(path) {
            Ok(meta) => self.differs(&FileStamp::of(&meta)),
            Err(e) => Some(Change::Gone(e.kind())),
        }
    }

    /// How `now` differs from this stamp; `None` when it does not.
    pub fn differs(&self, now: &FileStamp) -> Option<Change> {
        if let (Some(a), Some(b)) = (self.id, now.id) {
            if a != b {
                return Some(Change::Replaced);
            }
        }
        if self.len != now.len {
            return Some(Change::Length {
                was: self.len,
                now: now.len,
            });
        }
        if self.modified != now.modified {
            return Some(Change::Modified);
        }
        None
    }
}

#[cfg(unix)]
fn file_id(meta: &Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((meta.dev(), meta.ino()))
}

#[cfg(not(unix))]
fn file_id(_meta: &Metadata) -> Option<(u64, u64)> {
    // Windows' file index is not in stable std; the length and the time tell a rewrite there.
    None
}

/// What happened to a file since its header was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Another file is at the path now (it was replaced, as a rename over it does).
    Replaced,
    /// Its length changed.
    Length {
        /// Bytes when the header was read.
        was: u64,
        /// Bytes now.
        now: u64,
    },
    /// It was written to since (same length, another modification time).
    Modified,
    /// It is gone, or can no longer be looked at.
    Gone(io::ErrorKind),
}

/// A checkpoint file that is not what it was when the checkpoint opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// The file.
    pub path: PathBuf,
    /// What changed.
    pub change: Change,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Replaced => f.write_str("another file is at its path now"),
            Change::Length { was, now } => write!(f, "its length went from {was} to {now} bytes"),
            Change::Modified => f.write_str("it was written to"),
            Change::Gone(kind) => write!(f, "it can no longer be looked at ({kind})"),
        }
    }
}

impl fmt::Display for FileChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.change)
    }
}

/// The first change among `files` against their `stamps` (parallel lists).
pub fn first_change(files: &[PathBuf], stamps: &[FileStamp]) -> Option<FileChange> {
    files.iter().zip(stamps).find_map(|(path, was)| {
        Some(FileChange {
            path: path.clone(),
            change: was.change_at(path)?,
        })
    })
}

//! Byte sources: memory maps, positional reads, O_DIRECT reads, parallel range reads, and page
//! cache control for cold measurements.
//!
//! Everything here reports failures as [`IoError`], naming the file and the byte range.

mod aligned;
mod cache;
mod error;
mod mapped;
mod parallel;
mod reader;
mod stats;

pub use aligned::{AlignedBuf, DIRECT_ALIGN};
pub use cache::{cached_bytes, drop_cache};
pub use error::IoError;
pub use mapped::MappedFile;
pub use parallel::{read_ranges, read_ranges_with, ReadOptions, ReadRequest, DEFAULT_CHUNK_SIZE};
pub use reader::{FileReader, ReadMode};
pub use stats::ReadStats;

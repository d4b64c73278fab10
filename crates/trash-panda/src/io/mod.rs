//! Byte sources: memory maps, positional reads, unbuffered reads, parallel range reads, the read
//! queue that orders every read of a drive by need and by each model's lane (`schedule`), one
//! per drive for the process (`drive_queue`), and page cache control for cold
//! measurements. What differs between Linux, Windows and macOS lives in `platform`, one module
//! per system behind the same functions.
//!
//! Everything here reports failures as [`IoError`], naming the file and the byte range.

mod aligned;
mod cache;
mod drive;
mod drive_queue;
mod error;
mod mapped;
mod pages;
mod parallel;
mod platform;
mod reader;
mod schedule;
mod stamp;
mod stats;
mod writable;

pub use aligned::{AlignedBuf, DIRECT_ALIGN};
pub use cache::{cached_bytes, can_drop_cache, drop_cache};
pub use drive::{measure_drive, DriveRate, DRIVE_IN_FLIGHT};
pub use drive_queue::drive_queue;
pub use error::IoError;
pub use mapped::MappedFile;
pub use pages::{PagePool, PoolStats, PooledPages};
pub use parallel::{
    read_ranges, read_ranges_queued, read_ranges_until, read_ranges_with, ReadOptions, ReadRequest,
    DEFAULT_CHUNK_SIZE, POPULATE_MIN,
};
pub(crate) use platform::page_size;
pub use platform::read_exact_at;
pub use reader::{FileReader, ReadMode};
pub use schedule::{Lane, Need, Permit, Priority, QueueStats, ReadQueue, Served};
pub use stamp::{first_change, Change, FileChange, FileStamp};
pub use stats::ReadStats;
pub use writable::WritableSpan;

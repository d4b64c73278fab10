//! The settings of an [`Engine`](super::Engine): how the RAM tier is held and read cold, how
//! far ahead and with how many workers blocks are staged, and in which dtype.

use crate::io::{ReadMode, DEFAULT_CHUNK_SIZE};
use crate::rules::TENSOR_ALIGN;
use crate::DType;

/// How the RAM tier is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RamSource {
    /// Mapped from the checkpoint; the first pass reads it from the drive through the page cache.
    Mapped,
    /// Read into private memory by [`Engine::load_ram_tier`](super::Engine::load_ram_tier) with
    /// `threads` parallel readers
    /// (or by the first worker that needs it), so no pass waits for the drive.
    InMemory {
        /// Reads in flight at once while the tier is read in (at least 1).
        threads: usize,
    },
}

/// How a block of the mapped RAM tier is read while its pages are not in memory yet (the first
/// pass after a load, or after the system evicted them). Warm blocks are copied from the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColdRead {
    /// Copy through the map after `MADV_WILLNEED` on the run: page faults and the kernel's
    /// read-ahead (the first reader, kept to measure the others against).
    Map,
    /// `MADV_POPULATE_READ` on the run, then copy from the map; where the system refuses it,
    /// as `Map`.
    Populate,
    /// Positional reads through the page cache straight into the staging buffer, `in_flight`
    /// requests at once; they leave the pages cached, so later passes copy from the map.
    Pread {
        /// Requests in flight at once, per worker.
        in_flight: usize,
    },
}

impl ColdRead {
    /// The reader measured fastest on a cold RAM tier here (BENCHMARK.md, "Cold RAM tier"):
    /// buffered reads want about four requests in flight on this drive, so each of the two
    /// workers keeps two, with the kernel's read-ahead ahead of each.
    pub const DEFAULT: ColdRead = ColdRead::Pread { in_flight: 2 };
}

/// Settings of an [`Engine`](super::Engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// `None`: weights staged as stored. `Some(DType::BF16)` or `Some(DType::F8E4M3)`: the RAM
    /// tier is converted once, on load, into private memory (whatever `ram_source` says), with the
    /// planner's rule (see [`STORAGE_DTYPES`](crate::rules::STORAGE_DTYPES)); disk-tier blocks
    /// are always staged as stored.
    pub storage: Option<DType>,
    /// Blocks staged ahead of the one that runs; 0 stages each block when it is acquired. The
    /// pool has `buffers` buffers (by default `lookahead + 1`).
    pub lookahead: usize,
    /// Worker threads (at least 1).
    pub workers: usize,
    /// How disk-tier blocks (and the in-memory RAM tier's load) are read. `Direct` by default: a
    /// streamed pass must not evict the page cache the RAM tier lives in.
    pub disk_mode: ReadMode,
    /// How the RAM tier is held: mapped, or read into private memory.
    pub ram_source: RamSource,
    /// How cold blocks of a mapped RAM tier are read.
    pub cold_read: ColdRead,
    /// Largest single read or copy; workers check for shutdown between chunks.
    pub chunk_size: usize,
    /// Offset alignment of staged tensors: [`TENSOR_ALIGN`] for the CPU,
    /// [`DEVICE_TENSOR_ALIGN`](crate::rules::DEVICE_TENSOR_ALIGN)
    /// for a GPU.
    pub align: usize,
    /// RAM-tier blocks held in private memory (`RamSource::InMemory` or a storage dtype) are not
    /// staged ahead: the caller copies them from [`Engine::ram_image`](super::Engine::ram_image)
    /// (a GPU from pinned memory).
    pub direct_ram: bool,
    /// Threads that copy one warm RAM-tier block into its staging buffer; 0: the cores shared
    /// among the workers.
    pub copy_threads: usize,
    /// Bytes of each staging buffer, as the plan counted them (see
    /// [`crate::engine_config::EngineConfig`]); every block must fit. `None`: the largest
    /// block's, page-rounded.
    pub buffer_len: Option<usize>,
    /// Staging buffers, as the plan counted them; `None`: one more than the maximum depth. At
    /// least one.
    pub buffers: Option<usize>,
    /// The deepest the staging grows where the compute waits for blocks (a block the compute
    /// waited for is staged one block earlier the next pass; passes without waits bring it back),
    /// within the buffers; `None`: `lookahead`, a fixed depth.
    pub max_lookahead: Option<usize>,
    /// Disk-tier blocks that [`in_place_eligible`](crate::rules::in_place_eligible) allows are
    /// used in place from private maps of
    /// their files (the CPU computes from the page cache's pages) instead of being copied into a
    /// staging buffer. After a block runs its pages are unmapped, and with `disk_mode: Direct`
    /// also dropped from the page cache, so the pass does not evict what the RAM tier keeps there.
    pub in_place: bool,
    /// RAM-tier blocks of a mapped RAM tier (no storage dtype) are used in place the same way,
    /// where their tensors allow: a warm pass copies nothing. Their pages stay in the page cache
    /// (the RAM tier's) and stay mapped from run to run; a run that wrote to them (a buggy
    /// in-place write) has its block unmapped after it, which drops what it wrote. Where the
    /// system cannot tell written pages, every run's mapping goes.
    pub ram_in_place: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            storage: None,
            lookahead: crate::rules::DEFAULT_LOOKAHEAD,
            workers: 2,
            disk_mode: ReadMode::Direct,
            ram_source: RamSource::Mapped,
            cold_read: ColdRead::DEFAULT,
            chunk_size: DEFAULT_CHUNK_SIZE,
            align: TENSOR_ALIGN,
            direct_ram: false,
            copy_threads: 0,
            buffer_len: None,
            buffers: None,
            max_lookahead: None,
            in_place: false,
            ram_in_place: false,
        }
    }
}

//! The engine's calls on its RAM tier as a whole and block by block: reading it in, a block's
//! in-memory image for a device to copy from, and giving a block's pages back between passes.

use super::{Engine, RamImage, StreamError};
use crate::io::ReadStats;

impl Engine {
    /// Reads the RAM tier into memory now if `RamSource::InMemory` or a storage dtype is set
    /// (once, converting as it goes; later calls and other modes return what was read, or zero
    /// bytes). The figure covers the reads and the conversion.
    pub fn load_ram_tier(&self) -> Result<ReadStats, StreamError> {
        let stats = self.source.load()?;
        Ok(stats.unwrap_or(ReadStats::new(0, 0.0, self.options.disk_mode)))
    }

    /// Gives back the memory a RAM-tier `block` holds between passes (its pages of the
    /// checkpoint's map, and their page cache on Linux unless `keep_cache`: a pipeline that
    /// runs again reads it from there), for a final pass: returns the bytes given back, 0 where
    /// the platform or the RAM source cannot. The block stays usable: its next staging maps it
    /// again, or reads it from the drive once the cache has let it go.
    pub fn release_pages(&self, block: usize, keep_cache: bool) -> Result<u64, StreamError> {
        self.check(block)?;
        Ok(self.source.release(block, keep_cache))
    }

    /// The in-memory RAM tier's image of `block`, laid out as staged, once the tier is loaded
    /// ([`load_ram_tier`](Self::load_ram_tier)); `None` for any other block. With
    /// `EngineOptions::direct_ram` such blocks are not staged ahead: the caller copies from here
    /// and counts the run with [`advance`](Self::advance).
    pub fn ram_image(&self, block: usize) -> Result<Option<RamImage>, StreamError> {
        self.check(block)?;
        Ok(self.source.image(block))
    }
}

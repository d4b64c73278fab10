//! The in-memory RAM tier's private copies, as a device reads them straight from where they are.

use std::sync::Arc;

use crate::io::AlignedBuf;

/// Per-block private copies of the RAM tier, in staged layout (so staging is one memcpy).
pub(super) type RamImages = Arc<Vec<Option<AlignedBuf>>>;

/// One block's private copy in the in-memory RAM tier, laid out as it is staged: a device can
/// copy it to its slot directly. Keeps every image alive while it lives.
#[derive(Debug, Clone)]
pub struct RamImage {
    pub(super) images: RamImages,
    pub(super) block: usize,
    pub(super) len: usize,
}

impl RamImage {
    /// The block's bytes, as a staging buffer would hold them.
    pub fn bytes(&self) -> &[u8] {
        match self.images.get(self.block) {
            Some(Some(buf)) => &buf[..self.len],
            _ => &[],
        }
    }
}

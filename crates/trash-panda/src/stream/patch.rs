//! The engine's calls on patched blocks: a merged form of some of a block's tensors written
//! where the block lives, staged from then on in place of the checkpoint's bytes (see
//! `source::overlay`), and taken back.
//!
//! A patch changes what a staging of the block holds, so every staging made before it (staged
//! ahead, being filled, or leased) goes back empty instead of staged: the block's next run
//! stages it again.

use super::source::{OverlayBytes, Patch, PatchPlace};
use super::{Engine, OverlayStore, StreamError};

impl Engine {
    /// Sets the folder where disk-tier blocks' patched images are kept, and its limit.
    pub fn keep_overlays_in(&self, store: OverlayStore) {
        self.source.set_overlay_store(store);
    }

    /// Writes `patches` (new bytes of tensors of `block`, in their staged form) into the block's
    /// patched image, made from the checkpoint's bytes in `place` where it has none. `key`
    /// names what the new bytes depend on (it names the overlay file). Returns where the image
    /// is kept. Errors: an unknown block or tensor, bytes that do not fit the staged form, a
    /// block used in place, no overlay folder for a file, or no room in it.
    pub fn patch(
        &self,
        block: usize,
        patches: &[Patch<'_>],
        key: &str,
        place: PatchPlace,
    ) -> Result<PatchPlace, StreamError> {
        self.check(block)?;
        let kept = self.source.patch(block, patches, key, place)?;
        self.changed(block);
        Ok(kept)
    }

    /// Takes back the patches of `tensors` (staged indices) of `block`: the checkpoint's bytes
    /// are staged again.
    pub fn unpatch(&self, block: usize, tensors: &[usize]) -> Result<(), StreamError> {
        self.check(block)?;
        self.source.unpatch(block, tensors)?;
        self.changed(block);
        Ok(())
    }

    /// Takes the overlay file of the merges `keys` (staged index to key, as [`patch`](Self::patch)
    /// named them) for `block`'s image, where the overlay folder has one (an earlier run's with
    /// the same merges of the same checkpoint, or this run's before they were taken back): the
    /// block is staged from it from now on, merged, without merging. False where there is none.
    pub fn adopt(
        &self,
        block: usize,
        keys: &std::collections::BTreeMap<usize, String>,
    ) -> Result<bool, StreamError> {
        self.check(block)?;
        let adopted = self.source.adopt(block, keys)?;
        if adopted {
            self.changed(block);
        }
        Ok(adopted)
    }

    /// The staged index and key of every patched tensor of `block`.
    pub fn patches(&self, block: usize) -> Result<Vec<(usize, String)>, StreamError> {
        self.check(block)?;
        Ok(self.source.patches(block))
    }

    /// Bytes of `block`'s patched image, made or not: its staged length, or for a block used in
    /// place its tensors packed at the CPU's alignment (the planner counts images by it, through
    /// [`crate::rules::patched_image_bytes`]).
    pub fn patched_image_len(&self, block: usize) -> Result<usize, StreamError> {
        self.check(block)?;
        Ok(self.source.image_len(block))
    }

    /// What the patched images of every block take.
    pub fn overlay_bytes(&self) -> OverlayBytes {
        self.source.overlay_bytes()
    }

    /// `block`'s bytes changed: its stagings go, and a patched block is staged (not copied
    /// straight from the RAM tier's image).
    fn changed(&self, block: usize) {
        let patched = !self.source.patches(block).is_empty();
        let mut st = self.shared.lock();
        st.generation[block] += 1;
        for s in &mut st.slots {
            if matches!(s.state, super::pool::SlotState::Ready(b) if b == block) {
                s.state = super::pool::SlotState::Empty;
            }
        }
        st.direct[block] = st.direct_mode && self.ram_direct[block] && !patched;
        drop(st);
        self.shared.cv.notify_all();
    }

    /// The blocks a caller copies straight from the in-memory RAM tier when it does: the RAM
    /// tier's, but for patched ones (staged from their image).
    pub(super) fn direct_blocks(&self) -> Vec<bool> {
        (0..self.block_count())
            .map(|b| self.ram_direct[b] && self.source.patches(b).is_empty())
            .collect()
    }
}

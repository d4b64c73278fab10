//! Leasing a block before it runs, for a device that copies the next blocks ahead while the
//! current one computes (several copies in flight).
//!
//! [`Engine::try_lease`] takes a block that is already staged without waiting and without
//! counting it as run; [`Engine::advance`] then counts the run when the block starts, as
//! [`Engine::acquire`] does, and moves the staging window on.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::pool::SlotState;
use super::{Engine, Lease, StreamError};

impl Engine {
    /// Leases `block` if it is staged now; `None` if it is not (yet), or its staging failed
    /// (the block's `acquire` reports that). The run order, the window and the statistics are
    /// left alone: call [`advance`](Self::advance) when the block runs.
    pub fn try_lease(&self, block: usize) -> Result<Option<Lease>, StreamError> {
        self.check(block)?;
        let mut st = self.shared.lock();
        let Some(slot) = st.find(block) else {
            return Ok(None);
        };
        let s = &mut st.slots[slot];
        if !matches!(s.state, SlotState::Ready(_)) {
            return Ok(None);
        }
        s.state = SlotState::Leased(block);
        s.used = true;
        let buf = s.buf.take();
        let generation = s.generation;
        drop(st);
        Ok(Some(Lease {
            shared: self.shared.clone(),
            source: self.source.clone(),
            block,
            slot,
            len: self.shared.layout.block_len(block),
            buf,
            waited: Duration::ZERO,
            hit: true,
            discarded: AtomicBool::new(false),
            generation,
            image: self.source.in_place_image(block),
        }))
    }

    /// Counts a run of `block`, leased earlier with [`try_lease`](Self::try_lease): records it
    /// for the order file and the statistics (a hit, no wait) and stages the `lookahead` blocks
    /// after it.
    pub fn advance(&self, block: usize) -> Result<(), StreamError> {
        self.check(block)?;
        self.take_pool(&mut self.shared.lock(), block)?;
        self.reads.advance(block);
        let mut st = self.shared.lock();
        st.note_acquire(block);
        let depth = st.plan_deep(block, false, self.options.lookahead);
        st.stats.acquired(block, true, false, 0.0);
        st.note_depth(block, depth, None, &self.shared.names[block]);
        drop(st);
        self.shared.cv.notify_all();
        Ok(())
    }
}

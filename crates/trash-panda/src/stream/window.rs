//! The far edge of the staging window: which blocks are staged ahead of a block, and the last
//! pass, after whose end nothing is.
//!
//! Between passes the window wraps: the blocks after the order's last are the next pass's first,
//! so a model that runs again finds them staged. A final pass frees each block after it runs
//! (its pages of the RAM tier go back to the system); wrapping there would read the first
//! blocks again, into memory the next model is meant to take.

use super::{Engine, StreamError};

impl Engine {
    /// Marks the pass under way (or about to start) as the last (`true`): no block past the end
    /// of the order is staged from now on, and queued prefetches of such blocks not yet staged
    /// are dropped (blocks already staged keep their buffers until they are needed). Called
    /// between passes, the first blocks of the order stay queued: they start the last pass.
    /// `false` wraps into the next pass again from the next [`acquire`](Self::acquire) or
    /// [`advance`](Self::advance) on, staging nothing now.
    pub fn set_last_pass(&self, last: bool) {
        let mut st = self.shared.lock();
        st.last_pass = last;
        let Some(at) = st.last else { return };
        let mid_pass = st.pos[at] + 1 < st.order.len();
        if last && mid_pass {
            // The window was planned wrapping; plan it again as the last pass has it.
            let include_first = st.window.first() == Some(&at);
            st.plan_deep(at, include_first, self.options.lookahead);
            drop(st);
            self.shared.cv.notify_all();
        }
    }

    /// The deepest the staging may grow here: the plan's maximum within the buffers
    /// ([`crate::rules::depth_cap`]); the look-ahead when the depth is fixed.
    pub fn max_depth(&self) -> usize {
        self.shared.lock().depth.cap()
    }

    /// The blocks staged ahead once `block` runs, nearest first: the `lookahead` after it in the
    /// run order, wrapping into the next pass unless this pass is the last. The plan's
    /// look-ahead, not the depth the engine grew to: a device copying these ahead holds a staging
    /// buffer for each copy in flight, and the pool counts those at the look-ahead. Blocks the caller
    /// copies from the in-memory RAM tier itself are listed too, though the engine does not
    /// stage them. A device that copies ahead follows this, so it stops where the engine does.
    pub fn next_blocks(&self, block: usize) -> Result<Vec<usize>, StreamError> {
        self.check(block)?;
        let st = self.shared.lock();
        Ok(st.next_after(block, self.options.lookahead).collect())
    }

    /// Stages the RAM tier ahead like any other tier from now on, when it was held back for the
    /// caller to copy straight from memory (`EngineOptions::direct_ram`) and the caller cannot
    /// (its pinning failed: a copy from pageable memory would hold the host). Returns whether
    /// anything changed.
    pub fn stage_ram_tier_ahead(&self) -> bool {
        let mut st = self.shared.lock();
        if !st.direct.iter().any(|&d| d) {
            return false;
        }
        st.direct.fill(false);
        st.direct_mode = false;
        self.replan(st);
        true
    }

    /// Holds the RAM tier back for the caller to copy straight from memory again
    /// (`EngineOptions::direct_ram`), after [`stage_ram_tier_ahead`](Self::stage_ram_tier_ahead):
    /// the tier arrived after the caller's device was set up (a stage loaded ahead of its turn
    /// reads it last), and pinning it then succeeded. Its blocks staged already stay staged;
    /// none is staged ahead from now on. Returns whether anything changed (nothing for an engine
    /// made without `direct_ram`, or with no RAM tier held in memory).
    pub fn copy_ram_tier_directly(&self) -> bool {
        let direct = self.direct_blocks();
        let mut st = self.shared.lock();
        st.direct_mode = true;
        if st.direct == direct {
            return false;
        }
        st.direct = direct;
        self.replan(st);
        true
    }

    /// Plans the window again from the block last run (or the start) after `direct` changed.
    fn replan(&self, mut st: std::sync::MutexGuard<'_, super::pool::State>) {
        if let Some(at) = st.last {
            st.plan_deep(at, false, self.options.lookahead);
        } else {
            st.plan_start(self.options.lookahead);
        }
        drop(st);
        self.shared.cv.notify_all();
    }
}

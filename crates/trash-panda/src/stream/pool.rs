//! The staging buffers, their states, the job queue and the rules that decide which buffer a
//! block is staged in. Pure bookkeeping under the engine's one mutex; no threads here.

use std::collections::VecDeque;
use std::time::Instant;

use super::depth::Depth;
use super::stagings::Stagings;
use super::stats::EngineStats;
use super::StreamError;
use crate::io::AlignedBuf;

/// What a staging buffer holds. The block index travels with every state but `Empty`, so each
/// block is in at most one buffer.
#[derive(Debug)]
pub(crate) enum SlotState {
    Empty,
    /// A worker has the buffer (moved out of the slot) and is reading the block into it.
    Filling(usize),
    /// The block is staged and nobody holds it; it stays until its buffer is needed.
    Ready(usize),
    /// A lease has the buffer (moved out of the slot).
    Leased(usize),
    /// Staging failed; the error waits for the block's next `acquire`.
    Failed(usize, StreamError),
}

impl SlotState {
    pub fn block(&self) -> Option<usize> {
        match self {
            SlotState::Empty => None,
            SlotState::Filling(b)
            | SlotState::Ready(b)
            | SlotState::Leased(b)
            | SlotState::Failed(b, _) => Some(*b),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Slot {
    /// `None` while a worker or a lease has the buffer. Buffers move instead of being shared, so
    /// a buffer being filled can never be read, and one being read can never be refilled.
    pub buf: Option<AlignedBuf>,
    pub state: SlotState,
    /// When the slot last became Ready (filled or released): the stalest is reclaimed first.
    pub stamp: u64,
    /// Whether the staged block has been leased since it was staged.
    pub used: bool,
    /// The generation of its block's bytes (see [`State::generation`]) it holds or is filled
    /// with.
    pub generation: u64,
}

/// Everything the engine's mutex protects.
#[derive(Debug)]
pub(crate) struct State {
    pub slots: Vec<Slot>,
    /// Blocks to stage, first first. Rebuilt on every acquire from `demanded` and `window`.
    pub queue: VecDeque<usize>,
    /// The block last acquired and the `lookahead` after it in the run order: kept staged.
    pub window: Vec<usize>,
    /// Blocks an `acquire` is waiting for (one entry per waiting call); staged before the rest,
    /// and allowed to take a buffer from a prefetched block.
    pub demanded: Vec<usize>,
    /// Blocks the device copies straight from the in-memory RAM tier: never staged ahead (an
    /// `acquire` still stages one, as it demands it).
    pub direct: Vec<bool>,
    /// Whether the caller copies the RAM tier straight from memory now (see
    /// [`Engine::copy_ram_tier_directly`](super::Engine::copy_ram_tier_directly)); a patched
    /// block is staged all the same.
    pub direct_mode: bool,
    pub order: Vec<usize>,
    /// Position of each block in `order`.
    pub pos: Vec<usize>,
    pub last: Option<usize>,
    pub recorded: Vec<usize>,
    seen: Vec<bool>,
    pub stats: EngineStats,
    pub stagings: Stagings,
    /// How deep the window is planned after each block (see [`super::depth`]).
    pub depth: Depth,
    /// The pass under way is the last: nothing past the end of the order is staged (see
    /// [`Engine::set_last_pass`](super::Engine::set_last_pass)).
    pub last_pass: bool,
    pub stop: bool,
    /// Whether the slots hold their buffers: always for an engine's own, and for a shared
    /// pool's between taking them and parking. Without them nothing is staged.
    pub held: bool,
    pub workers_alive: usize,
    /// The queued block a worker found no buffer for, and since when (one count per block).
    buffer_wait: Option<(usize, Instant)>,
    clock: u64,
    /// Per block: how often its bytes changed (a patch, or one taken back). A staging filled or
    /// leased under an older generation goes back empty, not staged.
    pub generation: Vec<u64>,
}

impl State {
    #[cfg(test)]
    pub fn new(buffers: Vec<AlignedBuf>, blocks: usize, stats: EngineStats) -> Self {
        State::with_slots(buffers.into_iter().map(Some).collect(), blocks, stats)
    }

    /// Slots holding `buffers`; where one is `None` (a shared pool's, not taken yet) none is held.
    pub fn with_slots(buffers: Vec<Option<AlignedBuf>>, blocks: usize, stats: EngineStats) -> Self {
        let held = buffers.iter().all(Option::is_some);
        let slots = buffers
            .into_iter()
            .map(|buf| Slot {
                buf,
                state: SlotState::Empty,
                stamp: 0,
                used: false,
                generation: 0,
            })
            .collect();
        State {
            slots,
            queue: VecDeque::new(),
            window: Vec::new(),
            demanded: Vec::new(),
            direct: vec![false; blocks],
            direct_mode: false,
            order: (0..blocks).collect(),
            pos: (0..blocks).collect(),
            last: None,
            recorded: Vec::new(),
            seen: vec![false; blocks],
            stats,
            stagings: Stagings::default(),
            depth: Depth::new(blocks, 0, 0),
            last_pass: false,
            stop: false,
            held,
            workers_alive: 0,
            buffer_wait: None,
            clock: 0,
            generation: vec![0; blocks],
        }
    }

    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The slot holding `block` in any state.
    pub fn find(&self, block: usize) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.state.block() == Some(block))
    }

    /// Replaces the run order. Indices must be valid and unique; blocks it leaves out follow in
    /// definition order.
    pub fn set_order(&mut self, order: Vec<usize>) -> Result<(), StreamError> {
        let n = self.pos.len();
        let mut taken = vec![false; n];
        for &b in &order {
            if b >= n {
                return Err(StreamError::InvalidOrder {
                    reason: format!("block index {b} is out of range (there are {n} blocks)"),
                });
            }
            if std::mem::replace(&mut taken[b], true) {
                return Err(StreamError::InvalidOrder {
                    reason: format!("block index {b} appears twice"),
                });
            }
        }
        let mut full = order;
        full.extend((0..n).filter(|&b| !taken[b]));
        for (i, &b) in full.iter().enumerate() {
            self.pos[b] = i;
        }
        self.order = full;
        Ok(())
    }

    /// Forgets the blocks recorded so far (and the last one, so the next acquire is not counted
    /// out of order against a run of earlier hooks).
    pub fn clear_recorded(&mut self) {
        self.recorded.clear();
        self.seen.fill(false);
        self.last = None;
    }

    /// Records an acquire of `block` for the order file and the out-of-order count.
    pub fn note_acquire(&mut self, block: usize) {
        if !std::mem::replace(&mut self.seen[block], true) {
            self.recorded.push(block);
        }
        if let Some(last) = self.last {
            let expected = self.order[(self.pos[last] + 1) % self.order.len()];
            if expected != block && last != block {
                self.stats.out_of_order += 1;
            }
        }
        self.last = Some(block);
    }

    /// The `lookahead` blocks after `block` in the run order, wrapping into the next pass; in a
    /// last pass, only those left before the end of the order (there is no next pass to stage
    /// for, and the blocks at its start may have given their memory back).
    pub fn next_after(&self, block: usize, lookahead: usize) -> impl Iterator<Item = usize> + '_ {
        let n = self.order.len();
        let at = self.pos[block];
        let left = if self.last_pass {
            n - 1 - at
        } else {
            n.saturating_sub(1)
        };
        (1..=lookahead.min(left)).map(move |k| self.order[(at + k) % n])
    }

    /// Plans the window of a pass about to start: the first `lookahead` blocks of the order, as
    /// the block before them, the order's last, would have had them. Even in a last pass: they
    /// are its own first blocks.
    pub fn plan_start(&mut self, lookahead: usize) {
        let (Some(&first), Some(&last)) = (self.order.first(), self.order.last()) else {
            return;
        };
        if lookahead == 0 {
            return;
        }
        let last_pass = std::mem::replace(&mut self.last_pass, false);
        self.plan_deep(last, first == last, lookahead);
        self.last_pass = last_pass;
    }

    /// Makes `window` the blocks to keep staged (`first` and the `lookahead` after it; `first`
    /// itself only when `include_first`) and rebuilds the queue: demanded blocks first, then the
    /// window in run order. Queued prefetches that left the window are dropped.
    pub fn plan(&mut self, first: usize, include_first: bool, lookahead: usize) {
        let mut window: Vec<usize> = Vec::with_capacity(lookahead + 1);
        if include_first {
            window.push(first);
        }
        window.extend(self.next_after(first, lookahead));
        window.retain(|&b| {
            !self.direct.get(b).copied().unwrap_or(false) || (include_first && b == first)
        });
        let mut queue = VecDeque::with_capacity(window.len() + self.demanded.len());
        for &b in self.demanded.iter().chain(&window) {
            if self.find(b).is_none() && !queue.contains(&b) {
                queue.push_back(b);
            }
        }
        self.window = window;
        self.queue = queue;
        if self.queue.is_empty() {
            self.end_buffer_wait();
        }
    }

    /// A slot a worker may stage `block` in: an empty one; else the stalest unleased block
    /// outside the window; else, for a block an acquire waits for, the prefetched block farthest
    /// ahead in the window.
    pub fn pick_slot(&self, block: usize) -> Option<usize> {
        if !self.held {
            return None;
        }
        if let Some(i) = self
            .slots
            .iter()
            .position(|s| matches!(s.state, SlotState::Empty))
        {
            return Some(i);
        }
        let reclaimable = |s: &Slot| match &s.state {
            SlotState::Ready(b) | SlotState::Failed(b, _) => !self.demanded.contains(b),
            _ => false,
        };
        let outside = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| reclaimable(s))
            .filter(|(_, s)| s.state.block().is_some_and(|b| !self.window.contains(&b)))
            .min_by_key(|(_, s)| s.stamp);
        if let Some((i, _)) = outside {
            return Some(i);
        }
        if !self.demanded.contains(&block) {
            return None;
        }
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| reclaimable(s))
            .max_by_key(|(_, s)| {
                let b = s.state.block().unwrap_or(0);
                self.window.iter().position(|&w| w == b)
            })
            .map(|(i, _)| i)
    }

    /// Counts a worker finding no free buffer for `block` (once per block it waits for).
    pub fn begin_buffer_wait(&mut self, block: usize) {
        if self.buffer_wait.map(|(b, _)| b) != Some(block) {
            self.end_buffer_wait();
            self.stats.buffer_waits += 1;
            self.buffer_wait = Some((block, Instant::now()));
        }
    }

    pub fn end_buffer_wait(&mut self) {
        if let Some((_, since)) = self.buffer_wait.take() {
            self.stats.buffer_wait_seconds += since.elapsed().as_secs_f64();
        }
    }

    pub fn all_leased(&self) -> bool {
        self.slots
            .iter()
            .all(|s| matches!(s.state, SlotState::Leased(_)))
    }

    /// Whether no worker has anything to do or in hand.
    pub fn idle(&self) -> bool {
        self.queue.is_empty()
            && !self
                .slots
                .iter()
                .any(|s| matches!(s.state, SlotState::Filling(_)))
    }

    /// Removes one entry of `block` from `demanded`.
    pub fn undemand(&mut self, block: usize) {
        if let Some(i) = self.demanded.iter().position(|&b| b == block) {
            self.demanded.swap_remove(i);
        }
    }
}

impl State {
    /// The depth to plan the window with after `block`, by the staging-depth policy of
    /// [`Depth`] (`depth.rs`).
    pub fn depth_at(&self, block: usize) -> usize {
        if !self.depth.grows() {
            return self.depth.window(std::iter::empty());
        }
        self.depth.window(self.next_after(block, self.depth.cap()))
    }

    /// Plans the window after `block` (see [`State::plan`]) at the policy's depth, never less
    /// than `lookahead`; returns the depth used.
    pub fn plan_deep(&mut self, block: usize, include_first: bool, lookahead: usize) -> usize {
        let depth = self.depth_at(block).max(lookahead);
        self.plan(block, include_first, depth);
        depth
    }

    /// Counts an acquire of `block` by the policy (see [`Depth::note`]).
    pub fn note_depth(&mut self, block: usize, used: usize, waited: Option<f64>, name: &str) {
        let pos = self.pos[block];
        self.depth.note(block, pos, name, used, waited);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::stats::EngineStats;

    fn state(buffers: usize, blocks: usize) -> State {
        let bufs = (0..buffers).map(|_| AlignedBuf::new(1).unwrap()).collect();
        State::new(bufs, blocks, EngineStats::new(Vec::new()))
    }

    #[test]
    fn order_is_completed_and_validated() {
        let mut s = state(1, 5);
        s.set_order(vec![3, 1]).unwrap();
        assert_eq!(s.order, [3, 1, 0, 2, 4]);
        assert_eq!(s.pos[0], 2);
        assert!(s.set_order(vec![1, 1]).is_err());
        assert!(s.set_order(vec![5]).is_err());
        assert_eq!(s.next_after(4, 2).collect::<Vec<_>>(), [3, 1]);
        assert_eq!(s.next_after(4, 9).count(), 4);
    }

    #[test]
    fn a_last_pass_stops_at_the_end_of_the_order() {
        let mut s = state(3, 5);
        s.set_order(vec![3, 1]).unwrap(); // [3, 1, 0, 2, 4]
        s.last_pass = true;
        assert_eq!(s.next_after(0, 2).collect::<Vec<_>>(), [2, 4]);
        assert_eq!(s.next_after(2, 2).collect::<Vec<_>>(), [4]);
        assert_eq!(s.next_after(4, 2).count(), 0);
        s.plan(4, true, 2);
        assert_eq!((&s.window[..], s.queue.len()), (&[4][..], 1));
        // The start of the pass is still planned: it is the last pass's own beginning.
        s.plan_start(2);
        assert_eq!(s.window, [3, 1]);
        assert!(s.last_pass);
    }

    #[test]
    fn reclaims_stalest_outside_window_and_protects_window() {
        let mut s = state(3, 6);
        for (i, (b, stamp)) in [(0, 5), (1, 2), (2, 9)].into_iter().enumerate() {
            s.slots[i].state = SlotState::Ready(b);
            s.slots[i].stamp = stamp;
        }
        s.plan(2, true, 2); // window [2, 3, 4]
        assert_eq!(s.queue, [3, 4]);
        assert_eq!(s.pick_slot(3), Some(1)); // block 1 is the stalest outside the window
        s.slots[0].state = SlotState::Leased(0);
        s.slots[1].state = SlotState::Ready(3);
        assert_eq!(s.pick_slot(4), None); // only window blocks are left unleased
        s.demanded.push(5);
        assert_eq!(s.pick_slot(5), Some(1)); // a demanded block evicts the farthest prefetch
        s.slots[1].state = SlotState::Leased(3);
        s.slots[2].state = SlotState::Leased(2);
        assert!(s.all_leased());
    }

    #[test]
    fn cleared_records_start_again() {
        let mut s = state(1, 3);
        s.note_acquire(2);
        s.note_acquire(0);
        s.clear_recorded();
        assert!(s.recorded.is_empty() && s.last.is_none());
        s.note_acquire(0);
        s.note_acquire(2);
        assert_eq!(s.recorded, [0, 2]);
    }

    #[test]
    fn out_of_order_and_recorded() {
        let mut s = state(1, 3);
        for b in [0, 1, 1, 0, 2, 0] {
            s.note_acquire(b);
        }
        assert_eq!(s.recorded, [0, 1, 2]);
        assert_eq!(s.stats.out_of_order, 2); // 1 -> 0 and 0 -> 2; 2 -> 0 is the wrap
    }
}

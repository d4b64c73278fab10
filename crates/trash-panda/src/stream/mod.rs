//! The prefetch engine: a pool of staging buffers that worker threads fill with the next blocks of
//! the run order while the current block computes.
//!
//! The caller (the Python hooks) calls [`Engine::acquire`] before a streamed block runs, copies the
//! block out of the [`Lease`]'s buffer, and releases the lease (or drops it). Blocks come from the
//! RAM tier (a memory map, or a private copy read up front) or from the disk tier (O_DIRECT or
//! buffered reads straight into the staging buffer); the binding then copies a staging buffer to
//! a device slot (docs/guides/platforms.md), or the CPU computes from it.
//!
//! The [`StagedLayout`] (where each tensor sits in a buffer) and [`StreamBlock`] belong to
//! [`crate::rules`], where the planner counts a block by [`block_figures`] before any engine
//! exists; this module adds the runtime: the pool, the workers, the reads and copies, the leases.
//!
//! With a storage dtype ([`EngineOptions::storage`]) the RAM tier is converted once, on load,
//! into private memory, and its blocks are staged in that form; the staged layout says what each
//! tensor is in the buffer (dtype, shape, per-row scales).

#[cfg(test)]
mod cold_tests;
mod convert;
mod copy;
mod depth;
#[cfg(test)]
mod depth_tests;
mod early;
mod error;
mod lease;
mod options;
mod overlay_store;
mod patch;
mod pool;
mod ram_tier;
mod reads;
mod source;
mod staging_pool;
#[cfg(test)]
mod staging_pool_tests;
mod stagings;
mod stats;
mod window;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use error::StreamError;
pub use lease::{Lease, TensorKey};
pub use options::{ColdRead, EngineOptions, RamSource};
pub use overlay_store::{OverlayStore, OVERLAY_EXTENSION};
pub use staging_pool::StagingPool;
pub use stagings::{Staging, StagingSource, MAX_STAGINGS};
pub use stats::{BlockStats, EngineStats};

use crate::io::ReadMode;
pub use crate::rules::{
    block_figures, buffer_len, in_place_eligible, tensor_in_place_eligible, BlockFigures,
    SourceTier, StagedLayout, StagedScale, StagedTensor, StreamBlock, StreamTensor,
    DEVICE_TENSOR_ALIGN, MAP_GRAIN, MERGE_GAP, STORAGE_DTYPES, TENSOR_ALIGN,
};
use pool::{SlotState, State};
use reads::{own_depth, Reads};
use source::{CheckpointSource, Source};
pub use source::{OverlayBytes, Patch, PatchPlace, RamImage};

/// What the engine and its workers share.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// One condition for every change (a buffer filled, released, a job queued, a worker gone):
    /// there are only a few threads, and one signal cannot be missed by the wrong waiter.
    cv: Condvar,
    /// Set at shutdown; read by workers between chunks of a read, without the lock.
    stop: AtomicBool,
    names: Vec<String>,
    layout: StagedLayout,
    /// The shared pool the slots' buffers are lent from, and the name this engine takes them
    /// under; `None`: the buffers are the engine's own.
    pool: Option<(Arc<StagingPool>, String)>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Fills run outside the lock and panics in them are caught, so a poisoned lock can only
        // come from a bug in this module's bookkeeping; the state is still the best we have.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.cv.wait(guard).unwrap_or_else(|p| p.into_inner())
    }
}

/// The prefetch engine. `Send + Sync`: every method takes `&self`.
#[derive(Debug)]
pub struct Engine {
    shared: Arc<Shared>,
    source: Arc<dyn Source>,
    workers: Vec<JoinHandle<()>>,
    options: EngineOptions,
    buffers: Vec<(usize, usize)>,
    /// The read queue the source's drive reads wait in; `acquire` moves its current block.
    reads: Arc<Reads>,
    /// The blocks a caller may copy straight from the in-memory RAM tier
    /// (`EngineOptions::direct_ram`): what `State::direct` starts as, and goes back to.
    ram_direct: Vec<bool>,
}

impl std::fmt::Debug for dyn Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Source")
    }
}

impl Engine {
    /// An engine for `blocks`, whose tensors lie in `files`. Checks every range against the files,
    /// opens (or maps) them, allocates and prefaults the staging pool, and starts the workers. The
    /// run order is the definition order until [`set_order`](Self::set_order).
    pub fn new(
        blocks: Vec<StreamBlock>,
        files: Vec<PathBuf>,
        options: EngineOptions,
    ) -> Result<Engine, StreamError> {
        Engine::open(blocks, files, options, None)
    }

    /// As [`new`](Self::new), but the engine stages into `pool`'s buffers, taken when it starts
    /// streaming and given back at [`park`](Self::park), under the name `holder` (see
    /// [`StagingPool`]); `options.buffer_len` and `options.buffers` give way to the pool's.
    pub fn with_pool(
        blocks: Vec<StreamBlock>,
        files: Vec<PathBuf>,
        options: EngineOptions,
        pool: Arc<StagingPool>,
        holder: impl Into<String>,
    ) -> Result<Engine, StreamError> {
        Engine::open(blocks, files, options, Some((pool, holder.into())))
    }

    fn open(
        blocks: Vec<StreamBlock>,
        files: Vec<PathBuf>,
        options: EngineOptions,
        pool: Option<(Arc<StagingPool>, String)>,
    ) -> Result<Engine, StreamError> {
        let ram_in_place = options.ram_in_place && matches!(options.ram_source, RamSource::Mapped);
        let layout = StagedLayout::build_in_place(
            &blocks,
            files.len(),
            options.storage,
            options.align,
            options.in_place,
            ram_in_place,
        )?;
        let meta = blocks.iter().map(|b| (b.name.clone(), b.tier)).collect();
        let reads = Reads::own(own_depth(&options), blocks.len());
        let source = CheckpointSource::open(
            blocks,
            files,
            Arc::new(layout.clone()),
            &options,
            reads.clone(),
        )?;
        Engine::with_reads(meta, layout, Arc::new(source), options, reads, pool)
    }

    #[cfg(test)]
    pub(crate) fn with_source(
        blocks: Vec<(String, SourceTier)>,
        layout: StagedLayout,
        source: Arc<dyn Source>,
        options: EngineOptions,
    ) -> Result<Engine, StreamError> {
        let reads = Reads::own(own_depth(&options), blocks.len());
        Engine::with_reads(blocks, layout, source, options, reads, None)
    }

    pub(crate) fn with_reads(
        blocks: Vec<(String, SourceTier)>,
        layout: StagedLayout,
        source: Arc<dyn Source>,
        options: EngineOptions,
        reads: Arc<Reads>,
        pool: Option<(Arc<StagingPool>, String)>,
    ) -> Result<Engine, StreamError> {
        let max = crate::rules::max_depth(options.lookahead, options.max_lookahead);
        let (slots, buffers) = match &pool {
            Some((pool, _)) => staging_pool::lend_slots(pool, &layout, &blocks)?,
            None => staging_pool::own_slots(&options, &layout, &blocks, max)?,
        };
        let count = slots.len();
        let stats = EngineStats::new(
            blocks
                .iter()
                .map(|(n, t)| BlockStats::new(n.clone(), *t))
                .collect(),
        );
        let mut state = State::with_slots(slots, blocks.len(), stats);
        let cap = crate::rules::depth_cap(options.lookahead, max, count);
        state.depth = depth::Depth::new(blocks.len(), options.lookahead, cap);
        let in_memory =
            matches!(options.ram_source, RamSource::InMemory { .. }) || options.storage.is_some();
        if options.direct_ram && in_memory {
            state.direct = blocks.iter().map(|(_, t)| *t == SourceTier::Ram).collect();
            state.direct_mode = true;
        }
        let ram_direct = state.direct.clone();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            names: blocks.into_iter().map(|(n, _)| n).collect(),
            layout,
            pool,
        });
        let workers = worker::spawn(&shared, &source, options.workers.max(1))?;
        Ok(Engine {
            shared,
            source,
            workers,
            options,
            buffers,
            reads,
            ram_direct,
        })
    }

    /// The options the engine was made with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Number of streamed blocks.
    pub fn block_count(&self) -> usize {
        self.shared.names.len()
    }

    /// The name of block `block`.
    pub fn block_name(&self, block: usize) -> Result<&str, StreamError> {
        self.check(block)?;
        Ok(&self.shared.names[block])
    }

    /// The staging layout of every block.
    pub fn staged_layout(&self) -> &StagedLayout {
        &self.shared.layout
    }

    /// Where each tensor of `block` sits in a staging buffer (the same in every buffer).
    pub fn layout(&self, block: usize) -> Result<&[StagedTensor], StreamError> {
        self.check(block)?;
        Ok(self.shared.layout.layout(block))
    }

    /// Whether `block` is used in place from the map of its files (see
    /// [`EngineOptions::in_place`]): its leases point into the file's pages, not a buffer.
    pub fn in_place(&self, block: usize) -> Result<bool, StreamError> {
        self.check(block)?;
        Ok(self.shared.layout.is_in_place(block))
    }

    /// Whether `block`'s tensors are unmapped one by one as the modules that use them end
    /// ([`Lease::forget_tensor`]): a disk-tier block used in place, whose process then maps one
    /// module's weights at a time. A RAM-tier block's pages stay cached either way.
    pub fn unmaps_as_used(&self, block: usize) -> Result<bool, StreamError> {
        self.check(block)?;
        Ok(self.source.unmaps_as_used(block))
    }

    /// `(address, length)` of every staging buffer, by buffer index. They live as long as the
    /// engine and any lease, never move, and are the only memory leases point into, so the CUDA
    /// layer can register them as pinned once.
    pub fn staging_buffers(&self) -> Vec<(usize, usize)> {
        self.buffers.clone()
    }

    /// Bytes of the staging pool.
    pub fn staging_bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.1).sum()
    }

    /// Sets the run order (block indices; blocks left out follow in definition order) and starts
    /// staging its first `lookahead` blocks.
    pub fn set_order(&self, order: Vec<usize>) -> Result<(), StreamError> {
        let mut st = self.shared.lock();
        st.set_order(order)?;
        self.reads.follow_order(&st.pos);
        st.plan_start(self.options.lookahead);
        drop(st);
        self.shared.cv.notify_all();
        Ok(())
    }

    /// The run order in use (always every block once).
    pub fn order(&self) -> Vec<usize> {
        self.shared.lock().order.clone()
    }

    /// Every block acquired so far, once each, in the order of their first acquire: what the
    /// order file should hold.
    pub fn recorded_order(&self) -> Vec<usize> {
        self.shared.lock().recorded.clone()
    }

    /// Forgets the recorded order, so a new set of hooks on the same model records (and checks
    /// its first runs against) an order of its own.
    pub fn clear_recorded_order(&self) {
        self.shared.lock().clear_recorded();
    }

    /// Leases block `block`, waiting until it is staged, and queues the `lookahead` blocks after
    /// it in the run order.
    ///
    /// A block staged ahead that is not the one asked for keeps its buffer until a buffer is
    /// needed, so a model that runs blocks out of order still finds them. Errors: an unknown
    /// index, the block already leased, every buffer leased (the error names the holders), or the
    /// block's staging failed (the error names the tensor, file and range).
    pub fn acquire(&self, block: usize) -> Result<Lease, StreamError> {
        self.check(block)?;
        self.source.check_in_place(block)?;
        self.take_pool(&mut self.shared.lock(), block)?;
        // Reads of this block rank first now, ahead of every look-ahead read.
        self.reads.advance(block);
        let started = Instant::now();
        let name = || self.shared.names[block].clone();
        let mut st = self.shared.lock();
        st.note_acquire(block);
        let initially = st.find(block).map(|s| &st.slots[s].state);
        let hit = matches!(initially, Some(SlotState::Ready(_)));
        let in_flight = matches!(initially, Some(SlotState::Filling(_)));
        if matches!(initially, Some(SlotState::Leased(_))) {
            return Err(StreamError::AlreadyLeased {
                block,
                name: name(),
            });
        }
        st.demanded.push(block);
        let depth = st.plan_deep(block, true, self.options.lookahead);
        self.shared.cv.notify_all();
        let outcome = loop {
            if let Some(slot) = st.find(block) {
                let s = &mut st.slots[slot];
                match &s.state {
                    SlotState::Ready(_) => {
                        s.state = SlotState::Leased(block);
                        s.used = true;
                        let buf = s.buf.take().expect("a ready slot holds its buffer");
                        break Ok((slot, buf, s.generation));
                    }
                    SlotState::Failed(..) => {
                        let SlotState::Failed(_, e) =
                            std::mem::replace(&mut s.state, SlotState::Empty)
                        else {
                            unreachable!()
                        };
                        break Err(e);
                    }
                    SlotState::Leased(_) => {
                        break Err(StreamError::AlreadyLeased {
                            block,
                            name: name(),
                        })
                    }
                    SlotState::Filling(_) | SlotState::Empty => {}
                }
            } else if st.stop {
                break Err(StreamError::ShuttingDown {
                    block,
                    name: name(),
                });
            } else if st.workers_alive == 0 {
                break Err(StreamError::WorkersGone {
                    block,
                    name: name(),
                });
            } else if st.all_leased() {
                let holders = st
                    .slots
                    .iter()
                    .filter_map(|s| s.state.block())
                    .map(|b| format!("block {b} ({})", self.shared.names[b]))
                    .collect();
                st.queue.retain(|&b| b != block);
                break Err(StreamError::AllLeased {
                    block,
                    name: name(),
                    buffers: st.slots.len(),
                    holders,
                });
            } else if !st.queue.contains(&block) {
                // Dropped from the queue by a concurrent acquire's plan: queue it again, first.
                st.queue.push_front(block);
                self.shared.cv.notify_all();
            }
            st = self.shared.wait(st);
        };
        st.undemand(block);
        let waited = started.elapsed();
        st.stats
            .acquired(block, hit, in_flight, waited.as_secs_f64());
        if outcome.is_ok() {
            let wait = (!hit).then_some(waited.as_secs_f64());
            st.note_depth(block, depth, wait, &self.shared.names[block]);
        }
        drop(st);
        // A buffer taken or a queue change may let a worker go on.
        self.shared.cv.notify_all();
        let (slot, buf, generation) = outcome?;
        Ok(Lease {
            shared: self.shared.clone(),
            source: self.source.clone(),
            block,
            slot,
            len: self.shared.layout.block_len(block),
            buf: Some(buf),
            waited,
            hit,
            discarded: AtomicBool::new(false),
            generation,
            image: self.source.in_place_image(block),
        })
    }

    /// Returns the lease's buffer; the block stays staged there until the buffer is needed.
    /// Dropping the lease does the same.
    pub fn release(&self, lease: Lease) {
        drop(lease);
    }

    /// How disk-tier blocks are read now: `Direct`, or `Buffered` where O_DIRECT was asked for
    /// but refused by the filesystem; `None` without disk-tier blocks.
    pub fn disk_read_mode(&self) -> Option<ReadMode> {
        self.source.disk_mode()
    }

    /// Statistics since the last [`reset_stats`](Self::reset_stats).
    pub fn stats(&self) -> EngineStats {
        let st = self.shared.lock();
        let mut stats = st.stats.clone();
        stats.depth = st.depth.passes().to_vec();
        drop(st);
        stats.ram_load = self.source.loaded();
        stats.workers = self.options.workers.max(1) as u64;
        if let Some(c) = self.source.converted() {
            stats.converted_tensors = c.tensors;
            stats.converted_bytes_saved = c.bytes_saved;
            stats.convert_seconds = c.seconds;
        }
        stats
    }

    /// Starts a new pass's statistics (the RAM tier's load figure is kept).
    pub fn reset_stats(&self) {
        let mut st = self.shared.lock();
        st.stats.reset();
        st.depth.reset();
    }

    /// Waits until the workers have nothing queued or in hand (for measurements and tests), or
    /// `timeout` passes; returns whether they are idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            if st.idle() {
                return true;
            }
            // A queued block nobody can get a buffer for will not move; that is idle too.
            let stuck = st.queue.front().is_some_and(|&b| st.pick_slot(b).is_none())
                && !st
                    .slots
                    .iter()
                    .any(|s| matches!(s.state, SlotState::Filling(_)));
            let left = deadline.saturating_duration_since(Instant::now());
            if stuck || st.stop || left.is_zero() {
                return stuck;
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn check(&self, block: usize) -> Result<(), StreamError> {
        let count = self.block_count();
        if block < count {
            Ok(())
        } else {
            Err(StreamError::UnknownBlock { block, count })
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        worker::stop(&self.shared, std::mem::take(&mut self.workers));
    }
}

#[cfg(test)]
mod tests;

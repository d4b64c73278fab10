//! The read queue the engine's drive reads wait in ([`ReadQueue`]), and where each of the
//! engine's blocks sits in the run order that queue ranks needs by.
//!
//! Each engine starts with a queue of its own, ranked by its own run order. A model whose other
//! reads (the resident loader's) should share the drive in one order gives the engine its queue
//! with [`Engine::share_reads`](super::Engine::share_reads), and the positions of the engine's
//! blocks in the model's run order.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{ColdRead, Engine, EngineOptions, StreamError};
use crate::io::{Need, ReadQueue};

#[derive(Debug)]
struct Inner {
    queue: Arc<ReadQueue>,
    /// Per engine block: its position in the queue's run order.
    positions: Vec<usize>,
    /// The queue came from outside: the engine's own `set_order` no longer moves positions.
    shared: bool,
}

/// Shared by the engine (which advances the current block on `acquire`) and its source (whose
/// reads wait in the queue).
#[derive(Debug)]
pub(crate) struct Reads {
    inner: Mutex<Inner>,
}

impl Reads {
    /// A queue of the engine's own: `depth` reads at once, ranked in definition order until the
    /// engine's run order is set.
    pub fn own(depth: usize, blocks: usize) -> Arc<Reads> {
        Arc::new(Reads {
            inner: Mutex::new(Inner {
                queue: Arc::new(ReadQueue::new(depth, blocks)),
                positions: (0..blocks).collect(),
                shared: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The queue and the need of a read of `block`.
    pub fn of(&self, block: usize) -> (Arc<ReadQueue>, Need) {
        let inner = self.lock();
        let need = Need::Block(inner.positions.get(block).copied().unwrap_or(block));
        (inner.queue.clone(), need)
    }

    /// The queue reads that block everything wait in (a load before the run).
    pub fn queue(&self) -> Arc<ReadQueue> {
        self.lock().queue.clone()
    }

    /// The engine's run order changed: `pos[b]` is block `b`'s place in it. A shared queue keeps
    /// the positions it was given (the model's order is the caller's).
    pub fn follow_order(&self, pos: &[usize]) {
        let mut inner = self.lock();
        if !inner.shared {
            inner.positions = pos.to_vec();
        }
    }

    /// Uses `queue`, with the engine's blocks at `positions` of its run order.
    pub fn share(&self, queue: Arc<ReadQueue>, positions: Vec<usize>) {
        let mut inner = self.lock();
        *inner = Inner {
            queue,
            positions,
            shared: true,
        };
    }

    /// `block` runs now.
    pub fn advance(&self, block: usize) {
        let (queue, need) = self.of(block);
        if let Need::Block(pos) = need {
            queue.advance(pos);
        }
    }
}

impl Engine {
    /// Makes the engine's drive reads wait in `queue` (shared with the model's other readers,
    /// such as the resident loader), ranked by `positions`: for each of the engine's blocks, its
    /// position in the queue's run order. `acquire` then advances the queue's current block.
    pub fn share_reads(
        &self,
        queue: Arc<ReadQueue>,
        positions: Vec<usize>,
    ) -> Result<(), StreamError> {
        if positions.len() != self.block_count() {
            return Err(StreamError::InvalidOrder {
                reason: format!(
                    "the read queue was given {} positions for {} streamed blocks",
                    positions.len(),
                    self.block_count()
                ),
            });
        }
        self.reads.share(queue, positions);
        Ok(())
    }

    /// The read queue the engine's drive reads wait in (its own, or the one shared with it).
    pub fn read_queue(&self) -> Arc<ReadQueue> {
        self.reads.queue()
    }
}

/// The depth of an engine's own read queue: as many reads as its workers keep in flight today
/// (each cold RAM-tier read keeps `in_flight`), so the queue orders them without slowing them.
pub(crate) fn own_depth(options: &EngineOptions) -> usize {
    let per_worker = match options.cold_read {
        ColdRead::Pread { in_flight } => in_flight.max(1),
        ColdRead::Map | ColdRead::Populate => 1,
    };
    options.workers.max(1) * per_worker
}

//! The lane of a read queue the engine's drive reads wait in ([`Lane`]), and where each of the
//! engine's blocks sits in the run order that lane ranks needs by.
//!
//! Each engine starts with a lane on a queue of its own, ranked by its own run order. A model
//! whose other reads (the resident loader's) should share the drive in one order, with the
//! other models reading the same drive, gives the engine its lane with
//! [`Engine::share_reads`](super::Engine::share_reads), and the positions of the engine's blocks
//! in the model's run order.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{ColdRead, Engine, EngineOptions, StreamError};
use crate::io::{Lane, Need, Priority, ReadQueue};

#[derive(Debug)]
struct Inner {
    lane: Lane,
    /// Per engine block: its position in the lane's run order.
    positions: Vec<usize>,
    /// The lane came from outside: the engine's own `set_order` no longer moves positions.
    shared: bool,
}

/// Shared by the engine (which advances the current block on `acquire`) and its source (whose
/// reads wait in the lane).
#[derive(Debug)]
pub(crate) struct Reads {
    inner: Mutex<Inner>,
}

impl Reads {
    /// A lane on a queue of the engine's own: `depth` reads at once, ranked in definition order
    /// until the engine's run order is set.
    pub fn own(depth: usize, blocks: usize) -> Arc<Reads> {
        Arc::new(Reads {
            inner: Mutex::new(Inner {
                lane: Arc::new(ReadQueue::new(depth)).lane(blocks, Priority::Run),
                positions: (0..blocks).collect(),
                shared: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lane and the need of a read of `block`.
    pub fn of(&self, block: usize) -> (Lane, Need) {
        let inner = self.lock();
        let need = Need::Block(inner.positions.get(block).copied().unwrap_or(block));
        (inner.lane.clone(), need)
    }

    /// The lane reads that block everything wait in (a load before the run).
    pub fn lane(&self) -> Lane {
        self.lock().lane.clone()
    }

    /// The engine's run order changed: `pos[b]` is block `b`'s place in it. A shared lane keeps
    /// the positions it was given (the model's order is the caller's).
    pub fn follow_order(&self, pos: &[usize]) {
        let mut inner = self.lock();
        if !inner.shared {
            inner.positions = pos.to_vec();
        }
    }

    /// Uses `lane`, with the engine's blocks at `positions` of its run order.
    pub fn share(&self, lane: Lane, positions: Vec<usize>) {
        let mut inner = self.lock();
        *inner = Inner {
            lane,
            positions,
            shared: true,
        };
    }

    /// `block` runs now.
    pub fn advance(&self, block: usize) {
        let (lane, need) = self.of(block);
        if let Need::Block(pos) = need {
            lane.advance(pos);
        }
    }
}

impl Engine {
    /// Makes the engine's drive reads wait in `lane` (the model's, shared with its other readers
    /// such as the resident loader, on the drive's queue), ranked by `positions`: for each of the
    /// engine's blocks, its position in the lane's run order. `acquire` then advances the lane's
    /// current block. Called again, it replaces the positions (the model's order was set).
    pub fn share_reads(&self, lane: Lane, positions: Vec<usize>) -> Result<(), StreamError> {
        if positions.len() != self.block_count() {
            return Err(StreamError::InvalidOrder {
                reason: format!(
                    "the read lane was given {} positions for {} streamed blocks",
                    positions.len(),
                    self.block_count()
                ),
            });
        }
        self.reads.share(lane, positions);
        Ok(())
    }

    /// The lane the engine's drive reads wait in (its own, or the one shared with it).
    pub fn read_lane(&self) -> Lane {
        self.reads.lane()
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

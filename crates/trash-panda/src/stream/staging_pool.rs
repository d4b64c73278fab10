//! One set of staging buffers for several engines that stream in turn (the stages of a
//! pipeline), so a stage loaded ahead of its turn, or kept loaded after it, holds none.
//!
//! An engine made with a pool ([`Engine::with_pool`](super::Engine::with_pool)) takes every
//! buffer at once when it starts streaming (its first `acquire` or `advance`) and gives them
//! all back at [`Engine::park`](super::Engine::park) or when it goes. Taking them never waits:
//! a compute thread that waited for buffers another stage's thread holds would wait for ever if
//! that stage's turn were over but it was never parked, so the second engine gets
//! [`StreamError::PoolHeld`] naming the holder instead. The buffers are allocated once and never
//! move, so the CUDA layer registers their addresses as pinned once for the pool's life.

use std::sync::{Arc, Mutex, MutexGuard};

use super::pool::{SlotState, State};
use super::{Engine, EngineOptions, Shared, SourceTier, StagedLayout, StreamError};
use crate::io::AlignedBuf;

/// The shared staging buffers: `count` page-aligned, prefaulted buffers of one length.
#[derive(Debug)]
pub struct StagingPool {
    buffer_len: usize,
    /// `(address, length)` of each buffer, fixed at creation.
    addresses: Vec<(usize, usize)>,
    lent: Mutex<Lent>,
}

#[derive(Debug)]
struct Lent {
    /// `None` while an engine has them; always all of them or none, in creation order.
    buffers: Option<Vec<AlignedBuf>>,
    /// The engine that has them, by the name it gave.
    holder: Option<String>,
}

impl StagingPool {
    /// `count` buffers of `buffer_len` bytes each, rounded up to whole pages, written once so no
    /// stage pays their first-touch page faults.
    pub fn new(buffer_len: usize, count: usize) -> Result<StagingPool, StreamError> {
        if count == 0 {
            return Err(StreamError::InvalidOptions {
                option: "count",
                value: count.to_string(),
                expected: "at least one staging buffer",
            });
        }
        let len = crate::rules::buffer_len(buffer_len);
        let buffers = allocate(len, count, "shared staging buffer")?;
        let addresses = buffers
            .iter()
            .map(|b| (b.as_ptr() as usize, b.len()))
            .collect();
        Ok(StagingPool {
            buffer_len: len,
            addresses,
            lent: Mutex::new(Lent {
                buffers: Some(buffers),
                holder: None,
            }),
        })
    }

    /// Bytes of each buffer (whole pages).
    pub fn buffer_len(&self) -> usize {
        self.buffer_len
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.addresses.len()
    }

    /// Bytes of all the buffers.
    pub fn bytes(&self) -> u64 {
        self.buffer_len as u64 * self.count() as u64
    }

    /// `(address, length)` of every buffer; the same for the pool's whole life.
    pub fn buffers(&self) -> &[(usize, usize)] {
        &self.addresses
    }

    /// The name of the engine that has the buffers now, if any.
    pub fn holder(&self) -> Option<String> {
        self.lock().holder.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Lent> {
        // Nothing panics while the lock is held; a poisoned lock still holds a consistent state.
        self.lent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every buffer, for `holder`; `Err` with the current holder's name when another has them.
    pub(crate) fn take(&self, holder: &str) -> Result<Vec<AlignedBuf>, String> {
        let mut lent = self.lock();
        match lent.buffers.take() {
            Some(b) => {
                lent.holder = Some(holder.to_owned());
                Ok(b)
            }
            None => Err(lent.holder.clone().unwrap_or_default()),
        }
    }

    /// Gives back what [`take`](Self::take) lent, in the same order.
    pub(crate) fn give_back(&self, buffers: Vec<AlignedBuf>) {
        debug_assert_eq!(buffers.len(), self.count());
        debug_assert!(buffers
            .iter()
            .zip(&self.addresses)
            .all(|(b, a)| b.as_ptr() as usize == a.0));
        let mut lent = self.lock();
        lent.buffers = Some(buffers);
        lent.holder = None;
    }
}

/// The slots of an engine with buffers of its own: `count` of `size` bytes, prefaulted; and
/// their addresses.
pub(super) type Slots = (Vec<Option<AlignedBuf>>, Vec<(usize, usize)>);

/// `count` buffers of `size` bytes, each written once: first-touch page faults cost more than
/// the copy itself, so they are paid here, once.
fn allocate(size: usize, count: usize, what: &str) -> Result<Vec<AlignedBuf>, StreamError> {
    (0..count)
        .map(|i| {
            let mut b = AlignedBuf::new(size).map_err(|source| StreamError::Alloc {
                what: format!("{what} {i} ({size} bytes)"),
                source: Box::new(source),
            })?;
            b.prefault();
            Ok(b)
        })
        .collect()
}

/// Sized as `options` say (the plan's figures), or for the largest block, with buffers for
/// staging `max` blocks ahead; every block must fit.
pub(super) fn own_slots(
    options: &EngineOptions,
    layout: &StagedLayout,
    blocks: &[(String, SourceTier)],
    max: usize,
) -> Result<Slots, StreamError> {
    let size = match options.buffer_len {
        None => layout.max_block_len(),
        Some(size) => {
            let too_big = (0..layout.len()).find(|&b| layout.block_len(b) > size);
            if let Some(b) = too_big {
                return Err(StreamError::StagingTooSmall {
                    block: b,
                    name: blocks[b].0.clone(),
                    needs: layout.block_len(b),
                    buffer: size,
                });
            }
            size
        }
    };
    let count = crate::rules::staging_buffers(options.buffers, max);
    let bufs = allocate(size, count, "staging buffer")?;
    let addresses = bufs
        .iter()
        .map(|b| (b.as_ptr() as usize, b.len()))
        .collect();
    Ok((bufs.into_iter().map(Some).collect(), addresses))
}

/// The slots of an engine staging into `pool`: empty until it takes the buffers. Every block
/// must fit one of them.
pub(super) fn lend_slots(
    pool: &StagingPool,
    layout: &StagedLayout,
    blocks: &[(String, SourceTier)],
) -> Result<Slots, StreamError> {
    if let Some(b) = (0..layout.len()).find(|&b| layout.block_len(b) > pool.buffer_len()) {
        return Err(StreamError::PoolTooSmall {
            block: b,
            name: blocks[b].0.clone(),
            needs: layout.block_len(b),
            buffer: pool.buffer_len(),
        });
    }
    let slots = (0..pool.count()).map(|_| None).collect();
    Ok((slots, pool.buffers().to_vec()))
}

impl Engine {
    /// Takes the shared pool's buffers into the slots unless they are there (or the engine has
    /// its own); `block` is the one being asked for, for the error.
    pub(super) fn take_pool(&self, st: &mut State, block: usize) -> Result<(), StreamError> {
        let Some((pool, holder)) = self.shared.pool.as_ref().filter(|_| !st.held) else {
            return Ok(());
        };
        let buffers = pool.take(holder).map_err(|other| StreamError::PoolHeld {
            engine: holder.clone(),
            block,
            name: self.shared.names[block].clone(),
            holder: other,
        })?;
        for (slot, buf) in st.slots.iter_mut().zip(buffers) {
            slot.buf = Some(buf);
            slot.state = SlotState::Empty;
            slot.used = false;
        }
        st.held = true;
        // The queue waited for buffers: the workers may start now.
        self.shared.cv.notify_all();
        Ok(())
    }

    /// Gives the shared pool's buffers back so another engine can stream, once the blocks being
    /// staged into them are in (what is staged and not leased is dropped; it is staged again
    /// when this engine streams next). Returns whether anything was given back: nothing for an
    /// engine with buffers of its own, or one that does not have them now. A lease still held
    /// is an error ([`StreamError::ParkWhileLeased`]), and nothing changes.
    pub fn park(&self) -> Result<bool, StreamError> {
        let Some((pool, holder)) = self.shared.pool.as_ref() else {
            return Ok(false);
        };
        let mut st = self.shared.lock();
        if !st.held {
            return Ok(false);
        }
        let leased: Vec<String> = st
            .slots
            .iter()
            .filter_map(|s| match s.state {
                SlotState::Leased(b) => Some(format!("block {b} ({})", self.shared.names[b])),
                _ => None,
            })
            .collect();
        if !leased.is_empty() {
            return Err(StreamError::ParkWhileLeased {
                engine: holder.clone(),
                holders: leased,
            });
        }
        // No worker picks a slot from now on; those filling one finish it first.
        st.held = false;
        st.queue.clear();
        st.end_buffer_wait();
        while st.slots.iter().any(|s| s.buf.is_none()) {
            st = self.shared.wait(st);
        }
        pool.give_back(drain(&mut st));
        drop(st);
        self.shared.cv.notify_all();
        Ok(true)
    }

    /// The shared pool this engine stages into, if any.
    pub fn staging_pool(&self) -> Option<&Arc<StagingPool>> {
        self.shared.pool.as_ref().map(|(p, _)| p)
    }
}

/// Every slot's buffer, in slot order, the slots left empty.
fn drain(st: &mut State) -> Vec<AlignedBuf> {
    st.slots
        .iter_mut()
        .filter_map(|s| {
            s.state = SlotState::Empty;
            s.used = false;
            s.buf.take()
        })
        .collect()
}

impl Drop for Shared {
    /// The last of the engine, its workers and its leases is gone: a shared pool's buffers go
    /// back (an engine dropped without `park`, or with leases out, parks here).
    fn drop(&mut self) {
        let Some((pool, _)) = self.pool.as_ref() else {
            return;
        };
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if st.held {
            st.held = false;
            pool.give_back(drain(st));
        }
    }
}

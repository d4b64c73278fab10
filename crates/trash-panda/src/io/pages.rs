//! Private memory that is faulted once and handed on: the pages a pipeline's stages read their
//! weights into.
//!
//! The first touch of a page costs the system a fault and a zeroed page (about 0.7 s of system
//! time per GB per core on the machines we measure on), and a read ahead into fresh pages costs
//! the compute beside it about three times what a read into pages already present does. A
//! [`PagePool`] keeps the pages of the regions given back to it (a released stage's weights, the
//! blocks a final pass gave back) and hands them out again for the next reads, whatever their
//! sizes: a region is cut from one kept region where one is large enough, and otherwise put
//! together from several, their pages moved into one new range without faulting them again
//! (`mremap`, Linux). Where the system cannot split a region (Windows) the pool keeps nothing, and
//! where it cannot move pages (macOS) only a kept region large enough is used.
//!
//! Pages kept are the process's memory still: their owner says how many the reads to come will
//! take ([`PagePool::want`]), the pool keeps no more, and [`PagePool::trim`] gives back the rest.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::platform;
use super::IoError;

/// Pages of one region: page-aligned, a whole number of pages, inside one of the system's maps
/// (so a part of it can be moved or unmapped by one call).
#[derive(Debug)]
struct Piece {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a piece is an address range the pool or one `PooledPages` owns alone; nothing in it is
// tied to a thread.
unsafe impl Send for Piece {}

impl Piece {
    /// The piece's bytes from `at` on, cut off as a piece of their own (`at` is a page multiple
    /// below `len`).
    fn split_off(&mut self, at: usize) -> Piece {
        debug_assert!(at < self.len);
        // SAFETY: `at < len`, so the pointer stays inside the piece.
        let ptr = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(at)) };
        let rest = Piece {
            ptr,
            len: self.len - at,
        };
        self.len = at;
        rest
    }

    /// Gives the pages back to the system.
    fn unmap(self) {
        // SAFETY: the piece was made by `map_anonymous` (or is a page-aligned part of such a
        // map, on a platform that keeps pages), and whoever gave it up holds no reference into
        // it any more. A failure leaves the pages mapped and unreferenced: leaked, not unsound.
        let _ = unsafe { platform::unmap(self.ptr.as_ptr(), self.len) };
    }
}

/// What a pool has handed out so far, by where the pages came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes handed out in pages that had been given back (no fault to pay).
    pub reused: u64,
    /// Bytes handed out in new pages (faulted by their first write).
    pub fresh: u64,
}

#[derive(Debug, Default)]
struct State {
    idle: Vec<Piece>,
    idle_bytes: usize,
    closed: bool,
    stats: PoolStats,
    /// The most bytes of pages kept: what reads still to come will take ([`PagePool::want`]),
    /// less what has been taken since; `None`, no bound.
    wanted: Option<usize>,
}

impl State {
    /// Takes kept pieces out until at most `keep` bytes are kept; returns them.
    fn shed_to(&mut self, keep: usize) -> Vec<Piece> {
        let mut out = Vec::new();
        while self.idle_bytes > keep {
            let Some(mut piece) = self.idle.pop() else {
                break;
            };
            let over = self.idle_bytes - keep;
            if piece.len > over {
                let rest = piece.split_off(piece.len - over);
                self.idle_bytes -= rest.len;
                self.idle.push(piece);
                out.push(rest);
            } else {
                self.idle_bytes -= piece.len;
                out.push(piece);
            }
        }
        out
    }
}

impl Drop for State {
    fn drop(&mut self) {
        unmap_all(std::mem::take(&mut self.idle));
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held leaves at worst a piece out of the idle list (leaked);
        // the list itself is never half-written.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// See the module. Regions it hands out go back to it when dropped, while it is open.
#[derive(Debug, Default)]
pub struct PagePool {
    shared: Arc<Shared>,
}

/// A region of private memory from a [`PagePool`]: `len()` bytes, page-aligned, writable; its
/// pages go back to the pool when it is dropped (to the system once the pool is closed or gone).
/// Its bytes are whatever the pages held before: a region is for a read that fills it.
#[derive(Debug)]
pub struct PooledPages {
    ptr: NonNull<u8>,
    len: usize,
    /// The system's maps the region spans, in address order: each goes back as a piece.
    pieces: Vec<Piece>,
    pool: Weak<Shared>,
}

// SAFETY: the region is memory this value owns alone (like a `Vec<u8>`); `&PooledPages` gives
// out nothing but its address and length.
unsafe impl Send for PooledPages {}
// SAFETY: as for Send.
unsafe impl Sync for PooledPages {}

impl PagePool {
    /// An empty, open pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether pages given back are kept on this platform (they are not on Windows).
    pub const fn keeps_pages() -> bool {
        platform::KEEPS_PAGES
    }

    /// Whether a region can be put together from several kept ones on this platform (Linux).
    pub const fn moves_pages() -> bool {
        platform::CAN_MOVE_PAGES
    }

    /// A region of at least `len` bytes (rounded up to whole pages; one page for 0): kept pages
    /// where the pool has them, new ones for the rest.
    pub fn take(&self, len: usize) -> Result<PooledPages, IoError> {
        let page = platform::page_size();
        let len = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or(IoError::Alloc {
                len,
                align: page,
                reason: "the length overflows",
            })?;
        let mut state = self.shared.lock();
        if let Some(w) = state.wanted.as_mut() {
            *w = w.saturating_sub(len);
        }
        if let Some(region) = self.cut(&mut state, len) {
            return Ok(region);
        }
        if !Self::moves_pages() || state.idle_bytes == 0 {
            state.stats.fresh += len as u64;
            drop(state);
            return self.fresh(len);
        }
        // No kept region is large enough: the largest ones, moved into one new range.
        state.idle.sort_by_key(|p| p.len);
        let mut moving = Vec::new();
        let mut got = 0;
        while got < len {
            let Some(mut piece) = state.idle.pop() else {
                break;
            };
            if piece.len > len - got {
                state.idle.push(piece.split_off(len - got));
            }
            got += piece.len;
            moving.push(piece);
        }
        state.idle_bytes -= got;
        drop(state);
        let mut region = match self.fresh(len) {
            Ok(r) => r,
            Err(e) => {
                give_back(&self.shared, moving);
                return Err(e);
            }
        };
        // The range is no longer one map once pages move into it: each moved piece is a map of
        // its own, and so is each run of the range left fresh between them.
        let mut maps: Vec<(usize, usize, bool)> = Vec::new();
        let mut at = 0;
        let mut moved = 0;
        for piece in moving {
            // SAFETY: `at + piece.len <= len`, so the target lies inside the new region, which no
            // one else refers to yet; the piece was taken out of the idle list, so nothing else
            // refers to it either, and two maps never overlap.
            let to = unsafe { region.ptr.as_ptr().add(at) };
            let n = piece.len;
            // SAFETY: see above; both are page-aligned parts of private anonymous maps.
            let ok = match unsafe { platform::move_pages(piece.ptr.as_ptr(), n, to) } {
                Ok(()) => true,
                // Left fresh there; the piece's own pages are given up.
                Err(_) => {
                    piece.unmap();
                    false
                }
            };
            moved += if ok { n } else { 0 };
            push_map(&mut maps, at, n, ok);
            at += n;
        }
        if at < len {
            push_map(&mut maps, at, len - at, false);
        }
        region.pieces = maps
            .into_iter()
            .map(|(start, n, _)| Piece {
                // SAFETY: `start < len`: inside the region.
                ptr: unsafe { NonNull::new_unchecked(region.ptr.as_ptr().add(start)) },
                len: n,
            })
            .collect();
        let mut state = self.shared.lock();
        state.stats.reused += moved as u64;
        state.stats.fresh += (len - moved) as u64;
        Ok(region)
    }

    /// Keeps at most `bytes` of pages from now on (what the reads still to come will take;
    /// each region handed out counts against it), giving back at once what is kept beyond:
    /// pages no read will take are memory the process holds for nothing. Returns the bytes
    /// given back.
    pub fn want(&self, bytes: usize) -> usize {
        let shed = {
            let mut state = self.shared.lock();
            state.wanted = Some(bytes);
            state.shed_to(bytes)
        };
        unmap_all(shed)
    }

    /// Bytes of pages kept, not handed out.
    pub fn idle_bytes(&self) -> usize {
        self.shared.lock().idle_bytes
    }

    /// What the pool has handed out so far.
    pub fn stats(&self) -> PoolStats {
        self.shared.lock().stats
    }

    /// Gives every kept page back to the system; returns their bytes.
    pub fn trim(&self) -> usize {
        let pieces = self.shared.lock().shed_to(0);
        unmap_all(pieces)
    }

    /// Trims the pool and keeps nothing from now on: regions still out go back to the system
    /// when dropped. Returns the bytes given back now.
    pub fn close(&self) -> usize {
        self.shared.lock().closed = true;
        self.trim()
    }

    /// A kept region of exactly `len` bytes cut from the smallest kept piece that holds it.
    fn cut(&self, state: &mut State, len: usize) -> Option<PooledPages> {
        let (i, _) = state
            .idle
            .iter()
            .enumerate()
            .filter(|(_, p)| p.len >= len)
            .min_by_key(|(_, p)| p.len)?;
        let mut piece = state.idle.swap_remove(i);
        if piece.len > len {
            state.idle.push(piece.split_off(len));
        }
        state.idle_bytes -= len;
        state.stats.reused += len as u64;
        Some(PooledPages {
            ptr: piece.ptr,
            len,
            pieces: vec![piece],
            pool: Arc::downgrade(&self.shared),
        })
    }

    fn fresh(&self, len: usize) -> Result<PooledPages, IoError> {
        let ptr = platform::map_anonymous(len).map_err(|(op, source)| IoError::Pages {
            len,
            op,
            source,
        })?;
        Ok(PooledPages {
            ptr,
            len,
            pieces: vec![Piece { ptr, len }],
            pool: Arc::downgrade(&self.shared),
        })
    }
}

/// Adds `n` bytes at `at` of a region to its maps (start, length, moved): a moved piece is a map
/// of its own, fresh bytes join the fresh run before them.
fn push_map(maps: &mut Vec<(usize, usize, bool)>, at: usize, n: usize, moved: bool) {
    match maps.last_mut() {
        Some((_, len, false)) if !moved => *len += n,
        _ => maps.push((at, n, moved)),
    }
}

/// Gives `pieces` back to the system; returns their bytes.
fn unmap_all(pieces: Vec<Piece>) -> usize {
    let bytes = pieces.iter().map(|p| p.len).sum();
    for piece in pieces {
        piece.unmap();
    }
    bytes
}

fn give_back(shared: &Shared, pieces: Vec<Piece>) {
    let mut state = shared.lock();
    if state.closed || !PagePool::keeps_pages() {
        drop(state);
        unmap_all(pieces);
        return;
    }
    for piece in pieces {
        state.idle_bytes += piece.len;
        state.idle.push(piece);
    }
    let shed = match state.wanted {
        Some(keep) => state.shed_to(keep),
        None => Vec::new(),
    };
    drop(state);
    unmap_all(shed);
}

impl PooledPages {
    /// Bytes in the region (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region holds no byte (never: a region has a page at least).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region's first byte.
    pub(crate) fn raw_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for PooledPages {
    fn drop(&mut self) {
        let pieces = std::mem::take(&mut self.pieces);
        match self.pool.upgrade() {
            Some(shared) => give_back(&shared, pieces),
            None => {
                unmap_all(pieces);
            }
        }
    }
}

#[cfg(test)]
mod tests;

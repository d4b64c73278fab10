//! Pages for tensors read from a checkpoint, and a pool that gives the pages one stage freed to
//! the next stage's reads instead of to the system.
//!
//! A read into new anonymous pages pays for them at the read: the kernel faults and zeroes each
//! one (0.3-0.4 s of system time per GB on the 2-core bench machine, against 0.05 s into pages
//! already there). A pipeline frees a stage's blocks to read the next stage's into the same
//! memory, so it tells the pool how many bytes its reads will still take
//! ([`PagePool::keep_for`]): up to that, the pages of freed tensors stay in the pool and the next
//! reads take them; the rest goes back to the system at once, for whatever else needs memory
//! (the running stage's activations, which the allocator gets from the system).
//!
//! The pool never makes the process hold more than it would without it: its pages were counted
//! as freed for the reads that take them, each read lowers what the pool may keep by its bytes,
//! and a read that finds no run large enough, and so maps new pages, first unmaps as many
//! pooled bytes. Runs are split at pages, so a large run serves several smaller tensors. Only
//! Unix maps split; elsewhere the pool keeps nothing.

use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::{IoError, DIRECT_ALIGN};

/// A run of whole pages, private to the process, uninitialised to its user (it may hold what an
/// earlier tensor left). Its start is page-aligned, so direct reads can land in it.
#[derive(Debug)]
pub struct PageRun {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a PageRun owns its pages exclusively (like a Box<[u8]>); nothing else points into
// them while it lives, so it can move to and be shared with other threads.
unsafe impl Send for PageRun {}
// SAFETY: see Send; `&PageRun` gives out only the address and length.
unsafe impl Sync for PageRun {}

impl PageRun {
    /// New pages for at least `len` bytes (rounded up to whole pages, at least one).
    pub fn map(len: usize) -> Result<PageRun, IoError> {
        let len = round_up(len)?;
        let ptr = platform::map(len).ok_or(IoError::Alloc {
            len,
            align: DIRECT_ALIGN,
            reason: "the system gave no pages",
        })?;
        Ok(PageRun { ptr, len })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes in the run, a whole number of pages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: a run holds a page at least.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `at` bytes (a multiple of the page, below the length) and returns the
    /// rest as a run of its own.
    fn split_off(&mut self, at: usize) -> PageRun {
        debug_assert!(
            platform::SPLITS && at > 0 && at < self.len && at.is_multiple_of(DIRECT_ALIGN)
        );
        // SAFETY: `at` is inside the run (checked by the caller, `take`), so the pointer stays
        // within the same map; both halves are whole pages, which munmap frees one by one.
        let rest = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(at)) };
        let rest = PageRun {
            ptr: rest,
            len: self.len - at,
        };
        self.len = at;
        rest
    }
}

impl Drop for PageRun {
    fn drop(&mut self) {
        platform::unmap(self.ptr, self.len);
    }
}

fn round_up(len: usize) -> Result<usize, IoError> {
    len.max(1)
        .checked_next_multiple_of(DIRECT_ALIGN)
        .ok_or(IoError::Alloc {
            len,
            align: DIRECT_ALIGN,
            reason: "the length overflows",
        })
}

/// What the pool has done since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes handed out from pages freed earlier.
    pub reused: u64,
    /// Bytes handed out in new pages.
    pub fresh: u64,
    /// Bytes in the pool now.
    pub pooled: u64,
}

/// The process's pool of freed page runs; see the module.
#[derive(Debug, Default)]
pub struct PagePool {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes the reads to come will take: the most the pool keeps.
    want: u64,
    runs: Vec<PageRun>,
    stats: PoolStats,
}

impl PagePool {
    /// The pool every read of the process takes its pages from.
    pub fn global() -> &'static PagePool {
        static POOL: OnceLock<PagePool> = OnceLock::new();
        POOL.get_or_init(PagePool::default)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held left the run list whole (pushes and removes only).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pages for at least `len` bytes: the smallest pooled run that holds them (split, the rest
    /// staying pooled), or new pages, for which as many pooled bytes are unmapped first.
    pub fn take(&self, len: usize) -> Result<PageRun, IoError> {
        self.take_counted(len).map(|(run, _)| run)
    }

    /// [`take`](Self::take), and by how many bytes it grew the process's memory: none for a
    /// pooled run, the new pages less the pooled ones unmapped for them otherwise. A memory
    /// meter that reads the process's private memory subtracts no more than that for the read.
    pub fn take_counted(&self, len: usize) -> Result<(PageRun, usize), IoError> {
        let len = round_up(len)?;
        let mut st = self.lock();
        let best = (st.runs.iter().enumerate())
            .filter(|(_, r)| r.len >= len)
            .min_by_key(|(_, r)| r.len)
            .map(|(i, _)| i);
        if let Some(i) = best {
            let mut run = st.runs.swap_remove(i);
            if run.len > len {
                let rest = run.split_off(len);
                st.runs.push(rest);
            }
            st.stats.reused += len as u64;
            st.stats.pooled -= len as u64;
            st.want = st.want.saturating_sub(len as u64);
            return Ok((run, 0));
        }
        // Exactly as many bytes as the new pages, where the pool has them (a run split if need
        // be): the process's memory then does not change, which the CPU's memory meter reads.
        let mut gone = Vec::new();
        let mut freed = 0;
        while freed < len {
            let Some(mut run) = st.runs.pop() else { break };
            if run.len > len - freed {
                let rest = run.split_off(len - freed);
                st.runs.push(rest);
            }
            freed += run.len;
            gone.push(run);
        }
        st.stats.pooled -= freed as u64;
        st.stats.fresh += len as u64;
        st.want = st.want.saturating_sub(len as u64);
        drop(st);
        drop(gone); // unmapped outside the lock
        Ok((PageRun::map(len)?, len - freed))
    }

    /// Takes back a run whose tensor was freed: pooled while the reads to come want it, else
    /// unmapped.
    pub fn give(&self, run: PageRun) {
        let mut st = self.lock();
        if platform::SPLITS && st.stats.pooled + run.len as u64 <= st.want {
            st.stats.pooled += run.len as u64;
            st.runs.push(run);
        } else {
            drop(st);
            drop(run);
        }
    }

    /// The reads to come will take `bytes`: the pool keeps freed pages up to that from now
    /// (each read taking its share off), and unmaps what it holds beyond it. Zero gives every
    /// pooled run to the system. One figure for the process: the last caller's.
    pub fn keep_for(&self, bytes: u64) -> u64 {
        let mut st = self.lock();
        st.want = bytes;
        let mut gone = Vec::new();
        while st.stats.pooled > bytes {
            // The smallest runs first: the large ones serve more reads.
            let Some(i) = (st.runs.iter().enumerate())
                .min_by_key(|(_, r)| r.len)
                .map(|(i, _)| i)
            else {
                break;
            };
            let run = st.runs.swap_remove(i);
            st.stats.pooled -= run.len as u64;
            gone.push(run);
        }
        drop(st);
        let freed = gone.iter().map(|r| r.len as u64).sum();
        drop(gone);
        freed
    }

    /// The pool's figures so far.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }
}

#[cfg(unix)]
mod platform {
    use std::ptr::NonNull;

    pub(super) const SPLITS: bool = true;

    pub(super) fn map(len: usize) -> Option<NonNull<u8>> {
        // SAFETY: an anonymous private map asks for no file and no address; the kernel returns
        // fresh zeroed pages or MAP_FAILED, which is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANON,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(p.cast())
    }

    pub(super) fn unmap(ptr: NonNull<u8>, len: usize) {
        // SAFETY: [ptr, ptr + len) is whole pages of a map this module made (or a split of
        // one), owned by the run being dropped, so nothing uses them after this.
        unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    }
}

#[cfg(not(unix))]
mod platform {
    use std::alloc::{self, Layout};
    use std::ptr::NonNull;

    use super::DIRECT_ALIGN;

    // One heap allocation per run: it can be freed only whole, so runs neither split nor pool.
    pub(super) const SPLITS: bool = false;

    pub(super) fn map(len: usize) -> Option<NonNull<u8>> {
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size (`round_up` gives a page at least).
        NonNull::new(unsafe { alloc::alloc(layout) })
    }

    pub(super) fn unmap(ptr: NonNull<u8>, len: usize) {
        // The same layout `map` made it with (runs never split here).
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).expect("made by map");
        // SAFETY: `ptr` came from `alloc` with this layout and is freed once, by its run.
        unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = DIRECT_ALIGN;

    fn fill(run: &PageRun, byte: u8) {
        // SAFETY: the run's bytes are ours and mapped writable.
        unsafe { std::ptr::write_bytes(run.as_ptr(), byte, run.len()) };
    }

    #[test]
    fn runs_are_whole_aligned_pages() {
        let pool = PagePool::default();
        for len in [0, 1, P - 1, P, P + 1, 10 * P + 3] {
            let run = pool.take(len).unwrap();
            assert!(run.len() >= len.max(1) && run.len() % P == 0);
            assert_eq!(run.as_ptr() as usize % P, 0);
            fill(&run, 7);
        }
        assert_eq!(pool.stats().reused, 0);
        assert!(matches!(
            PageRun::map(usize::MAX),
            Err(IoError::Alloc { .. })
        ));
    }

    #[test]
    fn nothing_is_kept_unless_reads_want_it() {
        let pool = PagePool::default();
        pool.give(pool.take(4 * P).unwrap());
        assert_eq!(pool.stats().pooled, 0);
        let again = pool.take(4 * P).unwrap();
        assert_eq!(pool.stats().reused, 0);
        drop(again);
    }

    #[cfg(unix)]
    #[test]
    fn freed_runs_serve_the_reads_that_want_them() {
        let pool = PagePool::default();
        let run = pool.take(8 * P).unwrap();
        let at = run.as_ptr();
        fill(&run, 1);
        pool.keep_for(8 * P as u64);
        pool.give(run);
        assert_eq!(pool.stats().pooled, 8 * P as u64);
        // The smaller read takes the front of the run, the rest stays pooled.
        let a = pool.take(3 * P).unwrap();
        assert_eq!((a.as_ptr(), a.len()), (at, 3 * P));
        // SAFETY: the run's first byte is mapped and ours.
        let first = unsafe { *a.as_ptr() };
        assert_eq!(first, 1, "reused pages keep their bytes (no zeroing)");
        let b = pool.take(5 * P).unwrap();
        // SAFETY: `at + 3P` lies inside the original map.
        assert_eq!(b.as_ptr(), unsafe { at.add(3 * P) });
        let s = pool.stats();
        assert_eq!(
            (s.reused, s.pooled, s.fresh),
            (8 * P as u64, 0, 8 * P as u64)
        );
        // The reads took what they wanted: what is freed now goes back to the system.
        pool.give(a);
        pool.give(b);
        assert_eq!(pool.stats().pooled, 0);
    }

    #[cfg(unix)]
    #[test]
    fn the_pool_keeps_no_more_than_the_reads_want() {
        let pool = PagePool::default();
        let runs: Vec<_> = (0..4).map(|_| pool.take(2 * P).unwrap()).collect();
        pool.keep_for(5 * P as u64);
        for run in runs {
            pool.give(run);
        }
        assert_eq!(
            pool.stats().pooled,
            4 * P as u64,
            "a third run would pass the 5 pages"
        );
        // Fewer reads to come: the pool gives back what is beyond them.
        assert_eq!(pool.keep_for(3 * P as u64), 2 * P as u64);
        assert_eq!(pool.stats().pooled, 2 * P as u64);
        assert_eq!(pool.keep_for(0), 2 * P as u64);
        assert_eq!(pool.stats().pooled, 0);
    }

    #[cfg(unix)]
    #[test]
    fn the_best_fit_is_taken_and_new_pages_unmap_as_much() {
        let pool = PagePool::default();
        let (small, large) = (pool.take(2 * P).unwrap(), pool.take(6 * P).unwrap());
        let small_at = small.as_ptr();
        pool.keep_for(100 * P as u64);
        pool.give(large);
        pool.give(small);
        let got = pool.take(P).unwrap();
        assert_eq!(got.as_ptr(), small_at, "the smallest run that holds it");
        assert_eq!(pool.stats().pooled, 7 * P as u64);
        // Larger than any run: new pages, and the pool shrinks by as much (a run split for
        // it), so the process holds what it held before the tensors were freed.
        let big = pool.take(6 * P + P / 2).unwrap();
        assert_eq!(pool.stats().pooled, 0);
        assert_eq!(big.len(), 7 * P);
        let more = pool.take(P).unwrap();
        pool.keep_for(100 * P as u64);
        pool.give(more);
        let bigger = pool.take(3 * P).unwrap();
        assert_eq!(pool.stats().pooled, 0, "one page pooled, one page unmapped");
        pool.give(pool.take(4 * P).unwrap());
        let huge = pool.take(3 * P).unwrap();
        assert_eq!(
            pool.stats().pooled,
            P as u64,
            "the 4-page run gives 3 to the read and keeps 1"
        );
        // No run holds 3 pages: new ones, and of the two 2-page runs one goes whole and one
        // gives a page.
        pool.give(huge);
        pool.keep_for(0);
        let pair = (pool.take(2 * P).unwrap(), pool.take(2 * P).unwrap());
        pool.keep_for(100 * P as u64);
        pool.give(pair.0);
        pool.give(pair.1);
        let (fresh, grown) = pool.take_counted(3 * P).unwrap();
        assert_eq!(pool.stats().pooled, P as u64);
        assert_eq!(grown, 0, "as many pooled pages went as came");
        let (again, grown) = pool.take_counted(2 * P).unwrap();
        assert_eq!(grown, P, "one pooled page, one new");
        drop(again);
        drop((got, big, bigger, fresh));
        pool.keep_for(0);
    }
}

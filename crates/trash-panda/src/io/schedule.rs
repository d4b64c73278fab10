//! One read queue ordered by need: every read of a model's checkpoint (the engine's disk tier and
//! cold RAM tier, the resident loader) waits here for one of `depth` places at the drive, and
//! the waiting read whose block is needed soonest goes next.
//!
//! A block's need is its position in the run order, counted from the block being run now: the
//! current block ranks first, later blocks by their distance, and blocks behind the current one
//! (the next pass's) last. A read holds its place across its chunks, but gives it up between two
//! chunks to a read that is needed sooner, so a block needed now waits for one chunk at most.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// When a read's bytes are needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// Before anything else can run (weights outside the blocks, a load that blocks the caller).
    Now,
    /// For the block at this position of the run order.
    Block(usize),
}

/// What the queue has done since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueStats {
    /// Places handed out (a read, or a read that took its place again after giving it up).
    pub grants: u64,
    /// Of those, grants that had to wait for a place.
    pub waits: u64,
    /// Seconds reads spent waiting for a place, summed over the reads.
    pub wait_seconds: f64,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    need: Need,
}

#[derive(Debug)]
struct State {
    /// Blocks in the run order: positions wrap at this many (0: no wrap).
    blocks: usize,
    /// The position of the block being run.
    current: usize,
    in_flight: usize,
    waiting: Vec<Waiter>,
    next_ticket: u64,
    stats: QueueStats,
    /// The needs served, in the order their places were granted, while recording (tests and
    /// traces ask for it; a run does not keep it).
    served: Option<Vec<Need>>,
}

impl State {
    /// Smaller is sooner. A position past the end of the order wraps like the order does.
    fn rank(&self, need: Need) -> usize {
        match need {
            Need::Now => 0,
            Need::Block(pos) if self.blocks == 0 => pos.saturating_sub(self.current) + 1,
            Need::Block(pos) => {
                let n = self.blocks;
                (pos % n + n - self.current % n) % n + 1
            }
        }
    }

    /// Whether `ticket` is the waiter to go next: the soonest need, the earliest ticket on a tie.
    fn is_next(&self, ticket: u64) -> bool {
        let first = self
            .waiting
            .iter()
            .min_by_key(|w| (self.rank(w.need), w.ticket));
        first.is_some_and(|w| w.ticket == ticket)
    }

    fn sooner_waiting(&self, need: Need) -> bool {
        let mine = self.rank(need);
        self.waiting.iter().any(|w| self.rank(w.need) < mine)
    }
}

/// The queue. `Send + Sync`; share it in an `Arc` between every reader of one model (or more).
#[derive(Debug)]
pub struct ReadQueue {
    depth: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl ReadQueue {
    /// A queue with `depth` reads at the drive at once (at least 1), over a run order of
    /// `blocks` blocks (positions wrap there; 0 for no wrap), the first one current.
    pub fn new(depth: usize, blocks: usize) -> Self {
        ReadQueue {
            depth: depth.max(1),
            state: Mutex::new(State {
                blocks,
                current: 0,
                in_flight: 0,
                waiting: Vec::new(),
                next_ticket: 0,
                stats: QueueStats::default(),
                served: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics under this lock but an allocation; the counts are still right then.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads at the drive at once.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Blocks in the run order the positions count in.
    pub fn blocks(&self) -> usize {
        self.lock().blocks
    }

    /// Sets the length of the run order (when it changes).
    pub fn set_blocks(&self, blocks: usize) {
        self.lock().blocks = blocks;
        self.cv.notify_all();
    }

    /// The block at `position` of the run order runs now: the waiting reads are ranked from it.
    pub fn advance(&self, position: usize) {
        let mut st = self.lock();
        if st.current != position {
            st.current = position;
            drop(st);
            self.cv.notify_all();
        }
    }

    /// The position of the block being run.
    pub fn current(&self) -> usize {
        self.lock().current
    }

    /// Reads waiting for a place now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Reads holding a place now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    pub fn stats(&self) -> QueueStats {
        self.lock().stats
    }

    /// Starts (or stops) recording the needs served, in the order they got their place.
    pub fn record(&self, on: bool) {
        self.lock().served = on.then(Vec::new);
    }

    /// The needs served since [`record`](Self::record)`(true)`.
    pub fn served(&self) -> Vec<Need> {
        self.lock().served.clone().unwrap_or_default()
    }

    /// Waits for a place at the drive for a read of `need`, and holds it until the permit is
    /// dropped.
    pub fn acquire(&self, need: Need) -> Permit<'_> {
        let st = self.lock();
        drop(self.take_place(st, need));
        Permit { queue: self, need }
    }

    fn take_place<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        need: Need,
    ) -> MutexGuard<'a, State> {
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let free_now = st.in_flight < self.depth && st.waiting.is_empty();
        let started = Instant::now();
        if !free_now {
            st.waiting.push(Waiter { ticket, need });
            while !(st.in_flight < self.depth && st.is_next(ticket)) {
                st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.waiting.retain(|w| w.ticket != ticket);
            st.stats.waits += 1;
            st.stats.wait_seconds += started.elapsed().as_secs_f64();
            // The next waiter may go too if places are left.
            self.cv.notify_all();
        }
        st.in_flight += 1;
        st.stats.grants += 1;
        if let Some(served) = &mut st.served {
            served.push(need);
        }
        st
    }
}

/// A place at the drive. Dropping it frees the place for the soonest-needed waiting read.
#[derive(Debug)]
pub struct Permit<'a> {
    queue: &'a ReadQueue,
    need: Need,
}

impl Permit<'_> {
    /// What this read is needed for.
    pub fn need(&self) -> Need {
        self.need
    }

    /// Between two chunks of a read: gives the place to a waiting read needed sooner, then waits
    /// for a place again; keeps it otherwise (a read never waits behind one needed later).
    pub fn yield_to_sooner(&mut self) {
        let q = self.queue;
        let mut st = q.lock();
        if !st.sooner_waiting(self.need) {
            return;
        }
        st.in_flight -= 1;
        q.cv.notify_all();
        drop(q.take_place(st, self.need));
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut st = self.queue.lock();
        st.in_flight -= 1;
        drop(st);
        self.queue.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Waits until `n` reads wait at the queue (the deadline guards against a hang; nothing
    /// asserts a time).
    fn until_waiting(q: &ReadQueue, n: usize) {
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while q.waiting() < n {
            assert!(
                Instant::now() < deadline,
                "{} reads wait, not {n}",
                q.waiting()
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn ranks_from_the_current_block_and_wraps() {
        let q = ReadQueue::new(1, 10);
        q.advance(7);
        let st = q.lock();
        assert_eq!(st.rank(Need::Now), 0);
        assert_eq!(st.rank(Need::Block(7)), 1);
        assert_eq!(st.rank(Need::Block(9)), 3);
        assert_eq!(st.rank(Need::Block(0)), 4); // the next pass's first block
        assert_eq!(st.rank(Need::Block(6)), 10); // just behind: needed last
    }

    /// The drive is one place held by a slow read (the test's permit); reads for far blocks
    /// queue first, then one for the block needed next: it is served first once the slow read
    /// ends, and the far ones after it nearest first.
    #[test]
    fn the_soonest_needed_read_goes_first() {
        let q = Arc::new(ReadQueue::new(1, 8));
        q.record(true);
        let slow = q.acquire(Need::Block(0));
        let mut threads = Vec::new();
        for (k, pos) in [6usize, 4, 1].into_iter().enumerate() {
            let q2 = q.clone();
            threads.push(std::thread::spawn(move || {
                drop(q2.acquire(Need::Block(pos)))
            }));
            until_waiting(&q, k + 1);
        }
        drop(slow);
        for t in threads {
            t.join().unwrap();
        }
        let served = q.served();
        assert_eq!(
            served,
            [0, 1, 4, 6].map(Need::Block),
            "the near read must not wait behind far ones"
        );
        assert_eq!(q.stats().waits, 3);
    }

    /// The current block moves while reads wait: ranks follow it.
    #[test]
    fn advancing_reorders_the_waiting_reads() {
        let q = Arc::new(ReadQueue::new(1, 8));
        q.record(true);
        let slow = q.acquire(Need::Now);
        let mut threads = Vec::new();
        for (k, pos) in [2usize, 6].into_iter().enumerate() {
            let q2 = q.clone();
            threads.push(std::thread::spawn(move || {
                drop(q2.acquire(Need::Block(pos)))
            }));
            until_waiting(&q, k + 1);
        }
        q.advance(5); // block 2 is now the next pass's
        drop(slow);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(q.served(), [Need::Now, Need::Block(6), Need::Block(2)]);
    }

    /// No more than `depth` reads hold a place at once, however many ask.
    #[test]
    fn depth_is_respected() {
        let q = Arc::new(ReadQueue::new(2, 0));
        let most = Arc::new(Mutex::new(0usize));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (q, most) = (q.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let p = q.acquire(Need::Block(i));
                        let now = q.in_flight();
                        let mut m = most.lock().unwrap();
                        *m = (*m).max(now);
                        drop(m);
                        std::thread::yield_now();
                        drop(p);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let most = *most.lock().unwrap();
        assert!(most <= 2, "{most} reads held a place at once");
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.stats().grants, 400);
    }

    /// A long read keeps its place between chunks while nothing sooner waits, and gives it up to
    /// a read needed sooner.
    #[test]
    fn a_long_read_yields_to_a_sooner_one_between_chunks() {
        let q = Arc::new(ReadQueue::new(1, 8));
        q.record(true);
        let mut far = q.acquire(Need::Block(5));
        let q2 = q.clone();
        let later = std::thread::spawn(move || drop(q2.acquire(Need::Block(6))));
        until_waiting(&q, 1);
        far.yield_to_sooner(); // block 6 is later: keep the place
        assert_eq!(q.waiting(), 1);
        let q3 = q.clone();
        let near = std::thread::spawn(move || drop(q3.acquire(Need::Block(1))));
        until_waiting(&q, 2);
        far.yield_to_sooner(); // block 1 goes, then block 5 again, then 6
        drop(far);
        near.join().unwrap();
        later.join().unwrap();
        assert_eq!(q.served(), [5, 1, 5, 6].map(Need::Block));
    }
}

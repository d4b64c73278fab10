//! One read queue ordered by need, shared by every model reading from one drive: each read waits
//! for one of `depth` places at the drive, and the waiting read needed soonest goes next.
//!
//! Each model reads through a [`Lane`] of the queue: the lane has the model's run order (its
//! length and the block being run now) and a [`Priority`]. A waiting read ranks by its lane's
//! priority first (a model that runs now before one that runs later), then by its need within
//! the lane, then by when it asked.
//!
//! A block's need is its position in the lane's run order, counted from the block being run now:
//! the current block ranks first, later blocks by their distance, and blocks behind the current
//! one (the next pass's) last. A read holds its place across its chunks, but gives it up between
//! two chunks to a read that ranks sooner (in any lane), so a block needed now waits for one
//! chunk at most, even behind a read for a model that runs later.
//!
//! Models that run together, their blocks alternating (a ControlNet's blocks before its
//! denoiser's in each step), share one run order: [`ReadQueue::join`] gives each of their lanes
//! the place of each of its positions in that order, and a need then ranks by its distance in
//! it from the block of any of them that runs now.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// When a read's bytes are needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// Before anything else of its lane can run (weights outside the blocks, a load that blocks
    /// the caller).
    Now,
    /// For the block at this position of the lane's run order.
    Block(usize),
}

/// How a lane's reads rank against other lanes'. The order of the variants is the order served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// A model that runs now or is about to: its reads go before any `Ahead` read.
    Run,
    /// A model that runs later, read ahead of time behind the running one.
    Ahead,
}

impl Priority {
    /// The names [`parse`](Self::parse) accepts, for messages.
    pub const NAMES: [&'static str; 2] = ["run", "ahead"];

    /// `"run"` or `"ahead"`; `None` for anything else.
    pub fn parse(name: &str) -> Option<Priority> {
        match name {
            "run" => Some(Priority::Run),
            "ahead" => Some(Priority::Ahead),
            _ => None,
        }
    }

    /// The priority's name, one of [`NAMES`](Self::NAMES).
    pub fn name(self) -> &'static str {
        match self {
            Priority::Run => "run",
            Priority::Ahead => "ahead",
        }
    }
}

/// What a queue (or one lane of it) has done since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueStats {
    /// Places handed out (a read, or a read that took its place again after giving it up).
    pub grants: u64,
    /// Of those, grants that had to wait for a place.
    pub waits: u64,
    /// Seconds reads spent waiting for a place, summed over the reads.
    pub wait_seconds: f64,
}

impl QueueStats {
    fn grant(&mut self, waited: Option<f64>) {
        self.grants += 1;
        if let Some(s) = waited {
            self.waits += 1;
            self.wait_seconds += s;
        }
    }
}

/// A read served, as recorded by [`ReadQueue::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// The lane's id ([`Lane::id`]).
    pub lane: usize,
    /// When the read's bytes were needed.
    pub need: Need,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    lane: usize,
    need: Need,
}

#[derive(Debug)]
struct LaneState {
    /// Blocks in the lane's run order: positions wrap at this many (0: no wrap).
    blocks: usize,
    /// The position of the block being run.
    current: usize,
    priority: Priority,
    stats: QueueStats,
    /// The run order it shares with other lanes, and the place of each of its positions in it.
    joint: Option<(usize, Arc<Vec<usize>>)>,
}

impl LaneState {
    /// Smaller is sooner. A position past the end of the order wraps like the order does.
    fn rank(&self, need: Need) -> usize {
        match need {
            Need::Now => 0,
            Need::Block(pos) => distance(pos, self.current, self.blocks),
        }
    }
}

/// How far `pos` comes after `current` in an order of `n` (0: no wrap), counting from 1.
fn distance(pos: usize, current: usize, n: usize) -> usize {
    if n == 0 {
        pos.saturating_sub(current) + 1
    } else {
        (pos % n + n - current % n) % n + 1
    }
}

/// A run order several lanes share: its length, and the place of the block that runs now.
#[derive(Debug)]
struct JointState {
    length: usize,
    current: usize,
}

#[derive(Debug)]
struct State {
    /// Lanes by id; a freed lane's slot is `None` until a new lane takes it.
    lanes: Vec<Option<LaneState>>,
    in_flight: usize,
    waiting: Vec<Waiter>,
    next_ticket: u64,
    stats: QueueStats,
    /// The reads served, in the order their places were granted, while recording (tests and
    /// traces ask for it; a run does not keep it).
    served: Option<Vec<Served>>,
    /// Run orders shared by lanes ([`ReadQueue::join`]), by id.
    joints: Vec<JointState>,
}

impl State {
    fn lane(&self, id: usize) -> &LaneState {
        self.lanes[id]
            .as_ref()
            .expect("a lane with a handle is live")
    }

    fn lane_mut(&mut self, id: usize) -> &mut LaneState {
        self.lanes[id]
            .as_mut()
            .expect("a lane with a handle is live")
    }

    /// The order reads are served in: lane priority, then need within the lane (within the run
    /// order it shares, for a joined lane).
    fn key(&self, lane: usize, need: Need) -> (Priority, usize) {
        let l = self.lane(lane);
        let rank = match (need, &l.joint) {
            (Need::Block(pos), Some((joint, places))) => {
                let j = &self.joints[*joint];
                match places.get(pos) {
                    Some(&place) => distance(place, j.current, j.length),
                    // A position the shared order has no place for comes after all of it.
                    None => j.length + pos + 1,
                }
            }
            _ => l.rank(need),
        };
        (l.priority, rank)
    }

    /// Whether `ticket` is the waiter to go next: the smallest key, the earliest ticket on a tie.
    fn is_next(&self, ticket: u64) -> bool {
        let first = self
            .waiting
            .iter()
            .min_by_key(|w| (self.key(w.lane, w.need), w.ticket));
        first.is_some_and(|w| w.ticket == ticket)
    }

    fn sooner_waiting(&self, lane: usize, need: Need) -> bool {
        let mine = self.key(lane, need);
        self.waiting.iter().any(|w| self.key(w.lane, w.need) < mine)
    }
}

/// The queue: `depth` places at the drive, shared by the lanes made from it. `Send + Sync`;
/// held in an `Arc` by every lane.
#[derive(Debug)]
pub struct ReadQueue {
    depth: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl ReadQueue {
    /// A queue with `depth` reads at the drive at once (at least 1) and no lane yet.
    pub fn new(depth: usize) -> Self {
        ReadQueue {
            depth: depth.max(1),
            state: Mutex::new(State {
                lanes: Vec::new(),
                in_flight: 0,
                waiting: Vec::new(),
                next_ticket: 0,
                stats: QueueStats::default(),
                served: None,
                joints: Vec::new(),
            }),
            cv: Condvar::new(),
        }
    }

    /// A new lane over a run order of `blocks` blocks (positions wrap there; 0 for no wrap), the
    /// first one current.
    pub fn lane(self: &Arc<Self>, blocks: usize, priority: Priority) -> Lane {
        let mut st = self.lock();
        let lane = LaneState {
            blocks,
            current: 0,
            priority,
            stats: QueueStats::default(),
            joint: None,
        };
        let id = match st.lanes.iter().position(Option::is_none) {
            Some(free) => {
                st.lanes[free] = Some(lane);
                free
            }
            None => {
                st.lanes.push(Some(lane));
                st.lanes.len() - 1
            }
        };
        Lane {
            handle: Arc::new(LaneHandle {
                queue: self.clone(),
                id,
            }),
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

    /// Makes `lanes` (each with the place in one shared run order of `length` blocks of each
    /// position of its own order) rank their needs in that order, from the block of any of them
    /// that runs now. `false`, changing nothing, when a lane is not this queue's or a place is
    /// past `length`. A lane joined before leaves its earlier order.
    pub fn join(&self, lanes: &[(&Lane, Vec<usize>)], length: usize) -> bool {
        let ours = lanes
            .iter()
            .all(|(l, _)| std::ptr::eq(l.queue().as_ref(), self));
        if !ours
            || lanes
                .iter()
                .any(|(_, places)| places.iter().any(|&p| p >= length))
        {
            return false;
        }
        let mut st = self.lock();
        // The first lane's block runs now, as far as the shared order knows yet.
        let current = lanes
            .first()
            .and_then(|(l, places)| places.get(st.lane(l.id()).current).copied())
            .unwrap_or(0);
        st.joints.push(JointState { length, current });
        let joint = st.joints.len() - 1;
        for (lane, places) in lanes {
            st.lane_mut(lane.id()).joint = Some((joint, Arc::new(places.clone())));
        }
        drop(st);
        self.cv.notify_all();
        true
    }

    /// Lanes live now (with at least one handle).
    pub fn lanes(&self) -> usize {
        self.lock().lanes.iter().filter(|l| l.is_some()).count()
    }

    /// Reads waiting for a place now, all lanes together.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Reads holding a place now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// All lanes together, including lanes since dropped.
    pub fn stats(&self) -> QueueStats {
        self.lock().stats
    }

    /// Starts (or stops) recording the reads served, in the order they got their place.
    pub fn record(&self, on: bool) {
        self.lock().served = on.then(Vec::new);
    }

    /// The reads served since [`record`](Self::record)`(true)`, every lane's.
    pub fn served(&self) -> Vec<Served> {
        self.lock().served.clone().unwrap_or_default()
    }

    fn take_place<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        lane: usize,
        need: Need,
    ) -> MutexGuard<'a, State> {
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let free_now = st.in_flight < self.depth && st.waiting.is_empty();
        let mut waited = None;
        if !free_now {
            let started = Instant::now();
            st.waiting.push(Waiter { ticket, lane, need });
            while !(st.in_flight < self.depth && st.is_next(ticket)) {
                st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.waiting.retain(|w| w.ticket != ticket);
            waited = Some(started.elapsed().as_secs_f64());
            // The next waiter may go too if places are left.
            self.cv.notify_all();
        }
        st.in_flight += 1;
        st.stats.grant(waited);
        st.lane_mut(lane).stats.grant(waited);
        if let Some(served) = &mut st.served {
            served.push(Served { lane, need });
        }
        st
    }
}

/// The last handle of a lane frees its slot.
#[derive(Debug)]
struct LaneHandle {
    queue: Arc<ReadQueue>,
    id: usize,
}

impl Drop for LaneHandle {
    fn drop(&mut self) {
        // No read of this lane waits or holds a place: each borrows a handle.
        self.queue.lock().lanes[self.id] = None;
    }
}

/// One model's way into a [`ReadQueue`]: its run order, the block it runs now, its priority.
/// Clones are handles to the same lane; the lane lives until the last one drops.
#[derive(Debug, Clone)]
pub struct Lane {
    handle: Arc<LaneHandle>,
}

impl PartialEq for Lane {
    fn eq(&self, other: &Lane) -> bool {
        Arc::ptr_eq(&self.handle, &other.handle)
    }
}

impl Eq for Lane {}

impl Lane {
    /// The queue this lane reads through.
    pub fn queue(&self) -> &Arc<ReadQueue> {
        &self.handle.queue
    }

    /// The lane's id in its queue (as [`Served::lane`] names it); a dropped lane's id is reused.
    pub fn id(&self) -> usize {
        self.handle.id
    }

    fn with<T>(&self, f: impl FnOnce(&mut LaneState) -> T) -> T {
        f(self.queue().lock().lane_mut(self.handle.id))
    }

    /// Changes that re-rank waiting reads wake them to look again.
    fn changed(&self) {
        self.queue().cv.notify_all();
    }

    /// Blocks in the run order the positions count in.
    pub fn blocks(&self) -> usize {
        self.with(|l| l.blocks)
    }

    /// Sets the length of the run order (when it changes).
    pub fn set_blocks(&self, blocks: usize) {
        self.with(|l| l.blocks = blocks);
        self.changed();
    }

    /// The block at `position` of the run order runs now: the lane's waiting reads rank from it
    /// (and those of the lanes it shares a run order with, from its place in that order).
    pub fn advance(&self, position: usize) {
        let moved = {
            let mut st = self.queue().lock();
            let lane = st.lane_mut(self.handle.id);
            let moved = std::mem::replace(&mut lane.current, position) != position;
            let joint = lane
                .joint
                .as_ref()
                .and_then(|(j, places)| places.get(position).map(|&p| (*j, p)));
            match joint {
                Some((j, place)) => {
                    std::mem::replace(&mut st.joints[j].current, place) != place || moved
                }
                None => moved,
            }
        };
        if moved {
            self.changed();
        }
    }

    /// The place of each position of its order in the run order it shares with other lanes
    /// ([`ReadQueue::join`]); `None` when it shares none.
    pub fn joint_places(&self) -> Option<Vec<usize>> {
        self.with(|l| l.joint.as_ref().map(|(_, places)| places.as_ref().clone()))
    }

    /// Leaves the run order it shared: its needs rank in its own order again.
    pub fn leave_joint(&self) {
        self.with(|l| l.joint = None);
        self.changed();
    }

    /// The position of the block being run.
    pub fn current(&self) -> usize {
        self.with(|l| l.current)
    }

    /// How the lane's reads rank against other lanes' now.
    pub fn priority(&self) -> Priority {
        self.with(|l| l.priority)
    }

    /// Changes the lane's priority (the next model becomes the running one, say); waiting reads
    /// are ranked again.
    pub fn set_priority(&self, priority: Priority) {
        let moved = self.with(|l| std::mem::replace(&mut l.priority, priority) != priority);
        if moved {
            self.changed();
        }
    }

    /// What this lane's reads have done since the lane was made.
    pub fn stats(&self) -> QueueStats {
        self.with(|l| l.stats)
    }

    /// This lane's reads served since the queue's [`record`](ReadQueue::record)`(true)`.
    pub fn served(&self) -> Vec<Need> {
        let id = self.id();
        self.queue()
            .served()
            .into_iter()
            .filter(|s| s.lane == id)
            .map(|s| s.need)
            .collect()
    }

    /// Waits for a place at the drive for a read of `need`, and holds it until the permit is
    /// dropped.
    pub fn acquire(&self, need: Need) -> Permit<'_> {
        let q = self.queue();
        drop(q.take_place(q.lock(), self.id(), need));
        Permit { lane: self, need }
    }
}

/// A place at the drive. Dropping it frees the place for the soonest-needed waiting read.
#[derive(Debug)]
pub struct Permit<'a> {
    lane: &'a Lane,
    need: Need,
}

impl Permit<'_> {
    /// What this read is needed for.
    pub fn need(&self) -> Need {
        self.need
    }

    /// Between two chunks of a read: gives the place to a waiting read that ranks sooner (in any
    /// lane), then waits for a place again; keeps it otherwise (a read never waits behind one
    /// that ranks later).
    pub fn yield_to_sooner(&mut self) {
        let q = self.lane.queue();
        let id = self.lane.id();
        let mut st = q.lock();
        if !st.sooner_waiting(id, self.need) {
            return;
        }
        st.in_flight -= 1;
        q.cv.notify_all();
        drop(q.take_place(st, id, self.need));
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let q = self.lane.queue();
        let mut st = q.lock();
        st.in_flight -= 1;
        drop(st);
        q.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A queue of `depth` places with one running lane over `blocks` blocks.
    fn one_lane(depth: usize, blocks: usize) -> Lane {
        Arc::new(ReadQueue::new(depth)).lane(blocks, Priority::Run)
    }

    #[test]
    fn lanes_that_share_a_run_order_rank_their_needs_in_it() {
        let q = Arc::new(ReadQueue::new(1));
        let guide = q.lane(3, Priority::Run);
        let denoiser = q.lane(6, Priority::Run);
        let key = |l: &Lane, pos: usize| q.lock().key(l.id(), Need::Block(pos)).1;
        // Alone, each ranks from its own current block: the denoiser's first block ties with
        // the guide's second.
        guide.advance(0);
        denoiser.advance(5);
        assert_eq!(key(&guide, 1), key(&denoiser, 0));
        // One order: the guide's three blocks, then the denoiser's six.
        assert!(q.join(
            &[(&guide, vec![0, 1, 2]), (&denoiser, vec![3, 4, 5, 6, 7, 8])],
            9
        ));
        assert_eq!(denoiser.joint_places(), Some(vec![3, 4, 5, 6, 7, 8]));
        guide.advance(0);
        assert_eq!(
            (key(&guide, 1), key(&guide, 2), key(&denoiser, 0)),
            (2, 3, 4)
        );
        // The denoiser runs: the guide's blocks are next step's, needed after its own.
        denoiser.advance(2);
        assert_eq!((key(&denoiser, 3), key(&guide, 0)), (2, 5));
        // A place past the order, or a lane of another queue, is refused.
        assert!(!q.join(&[(&guide, vec![0, 1, 9])], 9));
        let other = Arc::new(ReadQueue::new(1)).lane(3, Priority::Run);
        assert!(!q.join(&[(&other, vec![0, 1, 2])], 3));
        guide.leave_joint();
        assert_eq!(guide.joint_places(), None);
        assert_eq!(key(&guide, 1), 2);
    }

    #[test]
    fn ranks_from_the_current_block_and_wraps() {
        let lane = one_lane(1, 10);
        lane.advance(7);
        lane.with(|l| {
            assert_eq!(l.rank(Need::Now), 0);
            assert_eq!(l.rank(Need::Block(7)), 1);
            assert_eq!(l.rank(Need::Block(9)), 3);
            assert_eq!(l.rank(Need::Block(0)), 4); // the next pass's first block
            assert_eq!(l.rank(Need::Block(6)), 10); // just behind: needed last
        });
    }

    /// The drive is one place held by a slow read (the test's permit); reads for far blocks
    /// queue first, then one for the block needed next: it is served first once the slow read
    /// ends, and the far ones after it nearest first.
    #[test]
    fn the_soonest_needed_read_goes_first() {
        let lane = one_lane(1, 8);
        let q = lane.queue().clone();
        q.record(true);
        let slow = lane.acquire(Need::Block(0));
        let mut threads = Vec::new();
        for (k, pos) in [6usize, 4, 1].into_iter().enumerate() {
            let l2 = lane.clone();
            threads.push(std::thread::spawn(move || {
                drop(l2.acquire(Need::Block(pos)))
            }));
            until_waiting(&q, k + 1);
        }
        drop(slow);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            lane.served(),
            [0, 1, 4, 6].map(Need::Block),
            "the near read must not wait behind far ones"
        );
        assert_eq!(q.stats().waits, 3);
        assert_eq!(lane.stats(), q.stats());
    }

    /// The current block moves while reads wait: ranks follow it.
    #[test]
    fn advancing_reorders_the_waiting_reads() {
        let lane = one_lane(1, 8);
        let q = lane.queue().clone();
        q.record(true);
        let slow = lane.acquire(Need::Now);
        let mut threads = Vec::new();
        for (k, pos) in [2usize, 6].into_iter().enumerate() {
            let l2 = lane.clone();
            threads.push(std::thread::spawn(move || {
                drop(l2.acquire(Need::Block(pos)))
            }));
            until_waiting(&q, k + 1);
        }
        lane.advance(5); // block 2 is now the next pass's
        drop(slow);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(lane.served(), [Need::Now, Need::Block(6), Need::Block(2)]);
    }

    /// No more than `depth` reads hold a place at once, however many ask.
    #[test]
    fn depth_is_respected() {
        let lane = one_lane(2, 0);
        let most = Arc::new(Mutex::new(0usize));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (lane, most) = (lane.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let p = lane.acquire(Need::Block(i));
                        let now = lane.queue().in_flight();
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
        assert_eq!(lane.queue().in_flight(), 0);
        assert_eq!(lane.queue().stats().grants, 400);
    }

    /// A long read keeps its place between chunks while nothing sooner waits, and gives it up to
    /// a read needed sooner.
    #[test]
    fn a_long_read_yields_to_a_sooner_one_between_chunks() {
        let lane = one_lane(1, 8);
        let q = lane.queue().clone();
        q.record(true);
        let mut far = lane.acquire(Need::Block(5));
        let l2 = lane.clone();
        let later = std::thread::spawn(move || drop(l2.acquire(Need::Block(6))));
        until_waiting(&q, 1);
        far.yield_to_sooner(); // block 6 is later: keep the place
        assert_eq!(q.waiting(), 1);
        let l3 = lane.clone();
        let near = std::thread::spawn(move || drop(l3.acquire(Need::Block(1))));
        until_waiting(&q, 2);
        far.yield_to_sooner(); // block 1 goes, then block 5 again, then 6
        drop(far);
        near.join().unwrap();
        later.join().unwrap();
        assert_eq!(lane.served(), [5, 1, 5, 6].map(Need::Block));
    }

    #[test]
    fn priority_names_parse() {
        for name in Priority::NAMES {
            assert_eq!(Priority::parse(name).unwrap().name(), name);
        }
        assert_eq!(Priority::parse("soon"), None);
    }
}

//! Lanes of one read queue: several models share the drive, each through its lane, the running
//! model's reads before those of a model that runs later, then by need within a lane. Orders are
//! observed with the test holding the queue's one place as a slow read would; nothing is timed.

mod common;

use common::until_waiting;

use std::sync::Arc;

use proptest::prelude::*;
use trash_panda::io::{Lane, Need, Priority, ReadQueue};

/// Queues a read of `need` on `lane` on a thread of its own, and waits until it waits.
fn queue_read(lane: &Lane, need: Need, waiting: usize) -> std::thread::JoinHandle<()> {
    let l = lane.clone();
    let t = std::thread::spawn(move || drop(l.acquire(need)));
    until_waiting(lane.queue(), waiting);
    t
}

fn join(threads: Vec<std::thread::JoinHandle<()>>) {
    for t in threads {
        t.join().unwrap();
    }
}

/// The running lane's reads go first whatever the positions: its read of the block just behind
/// the current one (needed last in its run order) goes before the later model's read of the
/// block it needs first, and before its read needed now.
#[test]
fn the_run_lane_goes_before_the_ahead_lane() {
    let q = Arc::new(ReadQueue::new(1));
    let run = q.lane(8, Priority::Run);
    let ahead = q.lane(8, Priority::Ahead);
    run.advance(3);
    q.record(true);
    let slow = run.acquire(Need::Now);
    let threads = vec![
        queue_read(&ahead, Need::Now, 1),
        queue_read(&ahead, Need::Block(0), 2),
        queue_read(&run, Need::Block(2), 3),
        queue_read(&run, Need::Block(5), 4),
    ];
    drop(slow);
    join(threads);
    let (r, a) = (run.id(), ahead.id());
    let served: Vec<_> = q.served().iter().map(|s| (s.lane, s.need)).collect();
    assert_eq!(
        served,
        [
            (r, Need::Now),
            (r, Need::Block(5)),
            (r, Need::Block(2)),
            (a, Need::Now),
            (a, Need::Block(0)),
        ]
    );
    assert_eq!(run.stats().grants, 3);
    assert_eq!(ahead.stats().grants, 2);
    assert_eq!(ahead.stats().waits, 2);
    assert_eq!(q.stats().grants, 5);
}

/// The later model becomes the running one while its reads wait: they go first now.
#[test]
fn a_priority_change_ranks_the_waiting_reads_again() {
    let q = Arc::new(ReadQueue::new(1));
    let first = q.lane(4, Priority::Run);
    let second = q.lane(4, Priority::Ahead);
    q.record(true);
    let slow = first.acquire(Need::Now);
    let threads = vec![
        queue_read(&second, Need::Block(1), 1),
        queue_read(&first, Need::Block(1), 2),
    ];
    first.set_priority(Priority::Ahead);
    second.set_priority(Priority::Run);
    assert_eq!(second.priority(), Priority::Run);
    drop(slow);
    join(threads);
    let lanes: Vec<_> = q.served().iter().map(|s| s.lane).collect();
    assert_eq!(lanes, [first.id(), second.id(), first.id()]);
}

/// A read of the running lane waits one chunk at most behind a read of a later model: the
/// later read gives its place up between chunks, and keeps it against a read of its own lane
/// needed later.
#[test]
fn a_later_models_read_yields_to_the_running_one_between_chunks() {
    let q = Arc::new(ReadQueue::new(1));
    let run = q.lane(8, Priority::Run);
    let ahead = q.lane(8, Priority::Ahead);
    q.record(true);
    let mut long = ahead.acquire(Need::Block(0));
    let own_later = queue_read(&ahead, Need::Block(3), 1);
    long.yield_to_sooner(); // its own lane's later read: keep the place
    assert_eq!(q.waiting(), 1);
    let running = queue_read(&run, Need::Block(7), 2);
    long.yield_to_sooner(); // the running lane's read goes, then this one again
    drop(long);
    join(vec![running, own_later]);
    let served: Vec<_> = q.served().iter().map(|s| (s.lane, s.need)).collect();
    let (r, a) = (run.id(), ahead.id());
    assert_eq!(
        served,
        [
            (a, Need::Block(0)),
            (r, Need::Block(7)),
            (a, Need::Block(0)),
            (a, Need::Block(3)),
        ]
    );
}

/// A lane lives while a handle does; its slot is then free for the next lane.
#[test]
fn a_dropped_lane_frees_its_slot() {
    let q = Arc::new(ReadQueue::new(2));
    let a = q.lane(4, Priority::Run);
    let b = q.lane(4, Priority::Ahead);
    assert_eq!(q.lanes(), 2);
    let a2 = a.clone();
    assert!(a2 == a && a != b);
    drop(a);
    assert_eq!(q.lanes(), 2, "a clone still holds the lane");
    let id = a2.id();
    drop(a2);
    assert_eq!(q.lanes(), 1);
    let c = q.lane(2, Priority::Run);
    assert_eq!(c.id(), id, "the freed slot is taken again");
    assert_eq!((c.blocks(), c.current(), c.stats().grants), (2, 0, 0));
    assert_eq!(q.lanes(), 2);
}

#[derive(Debug, Clone)]
struct LaneSpec {
    blocks: usize,
    current: usize,
    ahead: bool,
}

fn lane_spec() -> impl Strategy<Value = LaneSpec> {
    (0usize..6, 0usize..8, any::<bool>()).prop_map(|(blocks, current, ahead)| LaneSpec {
        blocks,
        current,
        ahead,
    })
}

/// The rank of `need` in a lane as the queue documents it: now first, then the distance from
/// the current block, wrapping at `blocks` (0: no wrap).
fn rank(spec: &LaneSpec, need: Need) -> usize {
    match need {
        Need::Now => 0,
        Need::Block(p) if spec.blocks == 0 => p.saturating_sub(spec.current) + 1,
        Need::Block(p) => {
            let n = spec.blocks;
            (p % n + n - spec.current % n) % n + 1
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever waits, the reads are served in the order of (lane priority, rank in the lane,
    /// arrival).
    #[test]
    fn the_order_served_is_priority_then_rank_then_arrival(
        specs in prop::collection::vec(lane_spec(), 1..4),
        reads in prop::collection::vec((0usize..4, prop::option::of(0usize..10)), 1..8),
    ) {
        let q = Arc::new(ReadQueue::new(1));
        let lanes: Vec<Lane> = specs
            .iter()
            .map(|s| {
                let p = if s.ahead { Priority::Ahead } else { Priority::Run };
                let lane = q.lane(s.blocks, p);
                lane.advance(s.current);
                lane
            })
            .collect();
        let holder = q.lane(0, Priority::Run);
        let slow = holder.acquire(Need::Now);
        q.record(true);
        let mut expected = Vec::new();
        let mut threads = Vec::new();
        for (ticket, &(l, pos)) in reads.iter().enumerate() {
            let l = l % lanes.len();
            let need = pos.map_or(Need::Now, Need::Block);
            threads.push(queue_read(&lanes[l], need, ticket + 1));
            let key = (specs[l].ahead, rank(&specs[l], need), ticket);
            expected.push((key, lanes[l].id(), need));
        }
        drop(slow);
        join(threads);
        expected.sort_by_key(|e| e.0);
        let want: Vec<_> = expected.iter().map(|e| (e.1, e.2)).collect();
        let got: Vec<_> = q.served().iter().map(|s| (s.lane, s.need)).collect();
        prop_assert_eq!(got, want);
    }
}

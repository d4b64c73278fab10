//! Engine tests with injected sources: prefetch overlap, worker panics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::source::{Filled, Source};
use super::*;

/// Writes a block-specific pattern after a delay; panics on one block if asked.
struct Fake {
    layout: StagedLayout,
    delay: Duration,
    panic_on: Option<usize>,
}

impl Source for Fake {
    fn fill(&self, block: usize, dst: &mut [u8], stop: &AtomicBool) -> Result<Filled, StreamError> {
        if Some(block) == self.panic_on {
            panic!("injected failure on block {block}");
        }
        std::thread::sleep(self.delay);
        if stop.load(Ordering::Relaxed) {
            return Err(StreamError::ShuttingDown {
                block,
                name: String::new(),
            });
        }
        let len = self.layout.block_len(block);
        dst[..len].fill(block as u8);
        Ok(Filled::warm(self.layout.block_bytes(block)))
    }
}

fn engine(n: usize, delay: Duration, panic_on: Option<usize>, opts: EngineOptions) -> Engine {
    engine_of(SourceTier::Disk, n, delay, panic_on, opts)
}

fn engine_of(
    tier: SourceTier,
    n: usize,
    delay: Duration,
    panic_on: Option<usize>,
    opts: EngineOptions,
) -> Engine {
    let blocks: Vec<StreamBlock> = (0..n)
        .map(|i| StreamBlock {
            name: format!("blocks.{i}"),
            tier,
            tensors: vec![StreamTensor {
                name: "w".into(),
                file: 0,
                start: 0,
                end: 10_000,
                dtype: crate::DType::U8,
                shape: vec![10_000],
                rows: None,
            }],
        })
        .collect();
    let layout = StagedLayout::new(&blocks, 1).unwrap();
    let fake = Fake {
        layout: layout.clone(),
        delay,
        panic_on,
    };
    let meta = blocks.iter().map(|b| (b.name.clone(), b.tier)).collect();
    Engine::with_source(meta, layout, Arc::new(fake), opts).unwrap()
}

/// Runs `passes` passes over `n` blocks with `compute` per block; returns (seconds, stats).
fn run(e: &Engine, n: usize, compute: Duration) -> (f64, EngineStats) {
    e.reset_stats();
    let t = Instant::now();
    for b in 0..n {
        let lease = e.acquire(b).unwrap();
        assert!(lease.bytes().iter().all(|&x| x == b as u8));
        std::thread::sleep(compute);
        e.release(lease);
    }
    (t.elapsed().as_secs_f64(), e.stats())
}

#[test]
fn prefetch_overlaps_reads_with_compute() {
    // Reads a little shorter than compute, so jitter does not turn every hit into a near miss.
    let (n, read, compute) = (8, Duration::from_millis(25), Duration::from_millis(40));
    let serial = n as f64 * (read + compute).as_secs_f64();
    let opts = EngineOptions {
        lookahead: 2,
        workers: 1,
        ..EngineOptions::default()
    };
    let e = engine(n, read, None, opts);
    e.set_order((0..n).collect()).unwrap();
    let (overlapped, stats) = run(&e, n, compute);
    eprintln!(
        "lookahead 2: {overlapped:.3} s for {n} blocks (serial {serial:.3} s), waited {:.3} s, hits {}/{}",
        stats.compute_waited_seconds, stats.hits, stats.acquires
    );
    // About n * compute (plus the first read at most), far from the serial sum.
    assert!(overlapped < 0.8 * serial, "{overlapped} vs serial {serial}");
    assert!(stats.compute_waited_seconds < 0.5 * n as f64 * read.as_secs_f64());
    assert!(stats.hits >= n as u64 / 2, "{stats:?}");

    // Without lookahead every read is on the critical path, and the wait says so.
    let e0 = engine(
        n,
        read,
        None,
        EngineOptions {
            lookahead: 0,
            ..opts
        },
    );
    let (plain, stats0) = run(&e0, n, compute);
    eprintln!(
        "lookahead 0: {plain:.3} s, waited {:.3} s",
        stats0.compute_waited_seconds
    );
    assert!(plain >= 0.95 * serial, "{plain}");
    assert!(stats0.compute_waited_seconds >= 0.9 * n as f64 * read.as_secs_f64());
    assert_eq!(stats0.hits, 0);
}

#[test]
fn worker_panic_reaches_the_acquire_and_the_engine_goes_on() {
    let e = engine(4, Duration::ZERO, Some(2), EngineOptions::default());
    for b in [0, 1] {
        drop(e.acquire(b).unwrap());
    }
    let err = e.acquire(2).unwrap_err();
    assert!(
        matches!(&err, StreamError::WorkerPanicked { block: 2, message, .. } if message.contains("injected")),
        "{err}"
    );
    assert!(err.to_string().contains("blocks.2"), "{err}");
    let lease = e.acquire(3).unwrap();
    assert_eq!(lease.bytes()[0], 3);
    assert_eq!(e.stats().failures, 1);
}

#[test]
fn drop_with_jobs_in_flight_joins() {
    let e = engine(6, Duration::from_millis(30), None, EngineOptions::default());
    e.set_order(vec![5, 4, 3]).unwrap();
    let lease = e.acquire(5).unwrap();
    let t = Instant::now();
    drop(e);
    assert!(t.elapsed() < Duration::from_secs(2));
    // The lease outlives the engine; its buffer goes back to the shared pool harmlessly.
    assert_eq!(lease.bytes()[0], 5);
    drop(lease);
}

#[test]
fn a_held_lease_makes_the_worker_wait_for_a_buffer() {
    let e = engine(5, Duration::from_millis(5), None, EngineOptions::default());
    let a = e.acquire(0).unwrap();
    let b = e.acquire(1).unwrap();
    // Window [1, 2, 3]: 2 takes the last buffer, 3 has none until a lease goes back.
    assert!(e.wait_idle(Duration::from_secs(5)));
    let s = e.stats();
    assert!(s.buffer_waits >= 1, "{s:?}");
    drop(a);
    assert!(e.wait_idle(Duration::from_secs(5)));
    assert_eq!(e.stats().blocks[3].stagings, 1);
    drop(b);
    let lease = e.acquire(3).unwrap();
    assert!(lease.was_hit());
    assert!(e.stats().buffer_wait_seconds > 0.0);
}

#[test]
fn stagings_record_what_the_workers_staged() {
    let (n, passes) = (6, 3);
    let opts = EngineOptions {
        lookahead: 2,
        workers: 2,
        ..EngineOptions::default()
    };
    let before = crate::profile::clock_seconds();
    let e = engine(n, Duration::from_millis(2), None, opts);
    e.set_order((0..n).collect()).unwrap();
    for _ in 0..passes {
        for b in 0..n {
            let lease = e.acquire(b).unwrap();
            std::thread::sleep(Duration::from_millis(3));
            e.release(lease);
        }
    }
    assert!(e.wait_idle(Duration::from_secs(5)));
    let after = crate::profile::clock_seconds();
    let (stats, stagings) = (e.stats(), e.stagings());
    assert_eq!(
        stagings.len() as u64,
        stats.blocks.iter().map(|b| b.stagings).sum::<u64>()
    );
    for (b, s) in stats.blocks.iter().enumerate() {
        let of_b: Vec<_> = stagings.iter().filter(|x| x.block == b).collect();
        assert_eq!(of_b.len() as u64, s.stagings, "block {b}");
        assert!(of_b.len() >= passes, "block {b}: {of_b:?}");
        assert_eq!(
            of_b.iter().map(|x| x.bytes).sum::<u64>(),
            s.bytes,
            "block {b}"
        );
    }
    for s in &stagings {
        assert!(
            before <= s.start && s.start <= s.end && s.end <= after,
            "{s:?}"
        );
        assert!(s.worker < 2, "{s:?}");
        assert_eq!(s.source, StagingSource::Disk);
    }
    // One worker stages one block at a time.
    for w in 0..2 {
        let mut mine: Vec<_> = stagings.iter().filter(|s| s.worker == w).collect();
        mine.sort_by(|a, b| a.start.total_cmp(&b.start));
        assert!(
            mine.windows(2).all(|p| p[0].end <= p[1].start),
            "worker {w}"
        );
    }
    // A reset starts new counters but keeps the timeline.
    e.reset_stats();
    assert_eq!(e.stagings().len(), stagings.len());
}

#[test]
fn stagings_keep_only_the_most_recent() {
    // One buffer and no lookahead: every acquire of another block stages it once.
    let opts = EngineOptions {
        lookahead: 0,
        workers: 1,
        ..EngineOptions::default()
    };
    let e = engine(3, Duration::ZERO, None, opts);
    let total = MAX_STAGINGS + 100;
    for i in 0..total {
        drop(e.acquire(i % 3).unwrap());
    }
    let stagings = e.stagings();
    assert_eq!(
        e.stats().blocks.iter().map(|b| b.stagings).sum::<u64>(),
        total as u64
    );
    assert_eq!(stagings.len(), MAX_STAGINGS);
    let blocks: Vec<usize> = stagings.iter().map(|s| s.block).collect();
    let want: Vec<usize> = (total - MAX_STAGINGS..total).map(|i| i % 3).collect();
    assert_eq!(blocks, want);
    assert!(stagings.windows(2).all(|p| p[0].end <= p[1].start));
}

#[test]
fn staging_source_names_the_tier_and_whether_it_was_cold() {
    assert_eq!(StagingSource::of(SourceTier::Disk, 0), StagingSource::Disk);
    assert_eq!(
        StagingSource::of(SourceTier::Ram, 0),
        StagingSource::RamWarm
    );
    assert_eq!(
        StagingSource::of(SourceTier::Ram, 1),
        StagingSource::RamCold
    );
    assert_eq!(StagingSource::RamCold.name(), "ram_cold");
}

/// Blocks staged after the first `skip` stagings, in the order they were staged.
fn staged_since(e: &Engine, skip: usize) -> Vec<usize> {
    e.stagings()[skip..].iter().map(|s| s.block).collect()
}

/// Leases `b` with `acquire` once the workers are idle, and gives it back.
fn run_one(e: &Engine, b: usize) {
    assert!(e.wait_idle(Duration::from_secs(5)));
    drop(e.acquire(b).unwrap());
}

/// A pass over `n` blocks ending with `n - 1`, each leased as the CPU does (`acquire`) or, with
/// `early`, as a device copying ahead does (`try_lease` of a staged block, then `advance`).
fn pass(e: &Engine, n: usize, early: bool) {
    for b in 0..n {
        if !early {
            run_one(e, b);
            continue;
        }
        assert!(e.wait_idle(Duration::from_secs(5)));
        let lease = e
            .try_lease(b)
            .unwrap()
            .expect("staged by the window before it");
        e.advance(b).unwrap();
        assert_eq!(lease.bytes()[0], b as u8);
    }
    assert!(e.wait_idle(Duration::from_secs(5)));
}

#[test]
fn a_last_pass_stages_nothing_past_its_last_block() {
    let n = 6;
    for early in [false, true] {
        let opts = EngineOptions {
            lookahead: 2,
            workers: 2,
            ..EngineOptions::default()
        };
        let e = engine(n, Duration::from_millis(1), None, opts);
        assert_eq!(e.staging_buffers().len(), 3);
        e.set_order((0..n).collect()).unwrap();
        pass(&e, n, early);
        // A pass that is not the last stages the next one's first blocks after its end.
        assert_eq!(e.next_blocks(n - 1).unwrap(), [0, 1]);
        let skip = e.stagings().len();
        e.set_last_pass(true);
        assert!(e.wait_idle(Duration::from_secs(5)));
        assert!(staged_since(&e, skip).is_empty(), "0 and 1 are staged");
        pass(&e, n, early);
        // 0 and 1 were staged by the pass before: only the others are, once each.
        assert_eq!(staged_since(&e, skip), [2, 3, 4, 5], "early: {early}");
        assert_eq!(e.next_blocks(3).unwrap(), [4, 5]);
        assert!(e.next_blocks(n - 1).unwrap().is_empty());

        // Wrapping again stages nothing by itself, and the next pass wraps at its end.
        let skip = e.stagings().len();
        e.set_last_pass(false);
        assert!(e.wait_idle(Duration::from_secs(5)));
        assert!(staged_since(&e, skip).is_empty());
        assert_eq!(e.next_blocks(n - 1).unwrap(), [0, 1]);
        pass(&e, n, false);
        let mut staged = staged_since(&e, skip);
        staged.sort_unstable();
        assert_eq!(staged, [0, 0, 1, 1, 2, 3, 4, 5]);
    }
}

#[test]
fn a_ram_tier_held_for_direct_copies_is_staged_ahead_and_held_back_again_once_told() {
    let opts = EngineOptions {
        lookahead: 2,
        workers: 1,
        ram_source: RamSource::InMemory { threads: 1 },
        direct_ram: true,
        ..EngineOptions::default()
    };
    let e = engine_of(SourceTier::Ram, 5, Duration::ZERO, None, opts);
    e.set_order((0..5).collect()).unwrap();
    assert!(!e.copy_ram_tier_directly(), "held back already");
    assert!(e.wait_idle(Duration::from_secs(5)));
    // Held back for the caller to copy from memory: nothing is staged ahead.
    assert!(e.stagings().is_empty());
    assert!(e.stage_ram_tier_ahead());
    assert!(e.wait_idle(Duration::from_secs(5)));
    assert_eq!(
        staged_since(&e, 0),
        [0, 1],
        "the first blocks of the pass, as any tier's"
    );
    drop(e.acquire(0).unwrap());
    assert!(e.wait_idle(Duration::from_secs(5)));
    assert_eq!(staged_since(&e, 0), [0, 1, 2]);
    assert!(!e.stage_ram_tier_ahead(), "a second call changes nothing");
    // The tier arrived later and was pinned: the caller copies it from memory from now on.
    assert!(e.copy_ram_tier_directly());
    e.advance(1).unwrap();
    e.advance(2).unwrap();
    assert!(e.wait_idle(Duration::from_secs(5)));
    assert_eq!(
        staged_since(&e, 0),
        [0, 1, 2],
        "nothing more is staged ahead once held back"
    );
    assert!(!e.copy_ram_tier_directly(), "a second call changes nothing");
}

#[test]
fn an_engine_without_direct_copies_is_never_held_back() {
    let opts = EngineOptions {
        lookahead: 2,
        workers: 1,
        ram_source: RamSource::InMemory { threads: 1 },
        ..EngineOptions::default()
    };
    let e = engine_of(SourceTier::Ram, 5, Duration::ZERO, None, opts);
    e.set_order((0..5).collect()).unwrap();
    assert!(!e.copy_ram_tier_directly());
    assert!(e.wait_idle(Duration::from_secs(5)));
    assert_eq!(staged_since(&e, 0), [0, 1], "staged ahead as any tier");
}

#[test]
fn a_last_pass_set_mid_pass_drops_the_queued_blocks_past_its_end() {
    let opts = EngineOptions {
        lookahead: 2,
        workers: 1,
        ..EngineOptions::default()
    };
    let e = engine(6, Duration::ZERO, None, opts);
    e.set_order((0..6).collect()).unwrap();
    for b in 0..3 {
        run_one(&e, b);
    }
    // Window [4, 5, 0]: 3 and 4 hold two buffers, 5 the third, so 0 waits in the queue.
    let l3 = e.acquire(3).unwrap();
    let l4 = e.acquire(4).unwrap();
    assert!(e.wait_idle(Duration::from_secs(5)));
    let skip = e.stagings().len();
    e.set_last_pass(true);
    // Buffers come back, outside the window: a queued 0 would take one now.
    drop(l3);
    drop(l4);
    run_one(&e, 5);
    assert!(e.wait_idle(Duration::from_secs(5)));
    assert!(
        staged_since(&e, skip).is_empty(),
        "{:?}",
        staged_since(&e, skip)
    );
}

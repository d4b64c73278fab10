//! Engines sharing one staging pool: taking it, parking, the errors, and two engines taking
//! turns on it from two threads with every staged byte checked.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::source::{Filled, Source};
use super::*;

/// Writes `seed ^ block` into every byte of a block and counts its fills.
struct Pattern {
    layout: StagedLayout,
    seed: u8,
    fills: AtomicUsize,
}

impl Source for Pattern {
    fn fill(
        &self,
        block: usize,
        dst: &mut [u8],
        _stop: &AtomicBool,
    ) -> Result<Filled, StreamError> {
        self.fills.fetch_add(1, Ordering::Relaxed);
        let len = self.layout.block_len(block);
        dst[..len].fill(self.seed ^ block as u8);
        Ok(Filled::warm(self.layout.block_bytes(block)))
    }
}

fn blocks(n: usize, bytes: u64) -> Vec<StreamBlock> {
    (0..n)
        .map(|i| StreamBlock {
            name: format!("blocks.{i}"),
            tier: SourceTier::Disk,
            tensors: vec![StreamTensor {
                name: "w".into(),
                file: 0,
                start: 0,
                end: bytes,
                dtype: crate::DType::U8,
                shape: vec![bytes as usize],
                rows: None,
            }],
        })
        .collect()
}

fn pooled(
    name: &str,
    seed: u8,
    n: usize,
    bytes: u64,
    pool: &Arc<StagingPool>,
) -> Result<(Engine, Arc<Pattern>), StreamError> {
    let b = blocks(n, bytes);
    let layout = StagedLayout::new(&b, 1).unwrap();
    let src = Arc::new(Pattern {
        layout: layout.clone(),
        seed,
        fills: AtomicUsize::new(0),
    });
    let meta = b.iter().map(|b| (b.name.clone(), b.tier)).collect();
    let reads = Reads::own(own_depth(&EngineOptions::default()), n);
    let holder = Some((pool.clone(), name.to_owned()));
    let e = Engine::with_reads(
        meta,
        layout,
        src.clone(),
        EngineOptions::default(),
        reads,
        holder,
    )?;
    Ok((e, src))
}

fn check(e: &Engine, block: usize, seed: u8) -> usize {
    let lease = e.acquire(block).unwrap();
    let want = seed ^ block as u8;
    assert!(lease.bytes().iter().all(|&x| x == want), "block {block}");
    lease.buffer_index()
}

#[test]
fn two_engines_take_turns_on_one_pool() {
    let pool = Arc::new(StagingPool::new(10_000, 3).unwrap());
    let (a, _) = pooled("stage a", 0x10, 4, 10_000, &pool).unwrap();
    let (b, _) = pooled("stage b", 0x80, 5, 6_000, &pool).unwrap();
    // Both see the pool's buffers, at the pool's addresses, before and after taking them.
    assert_eq!(a.staging_buffers(), pool.buffers());
    assert_eq!(b.staging_buffers(), pool.buffers());
    assert_eq!(a.staging_bytes() as u64, pool.bytes());
    assert_eq!(pool.holder(), None);
    for block in 0..4 {
        check(&a, block, 0x10);
    }
    assert_eq!(pool.holder().as_deref(), Some("stage a"));
    match b.acquire(0) {
        Err(StreamError::PoolHeld {
            engine,
            block,
            holder,
            ..
        }) => assert_eq!((&engine[..], block, &holder[..]), ("stage b", 0, "stage a")),
        other => panic!("expected PoolHeld, got {other:?}"),
    }
    assert!(b.advance(1).is_err(), "a run counted without the pool");
    assert!(a.park().unwrap());
    assert!(!a.park().unwrap(), "parked twice gives back once");
    assert_eq!(pool.holder(), None);
    for block in 0..5 {
        check(&b, block, 0x80);
    }
    assert!(b.park().unwrap());
    check(&a, 2, 0x10);
    assert_eq!(a.staging_buffers(), pool.buffers());
}

#[test]
fn staged_blocks_are_dropped_at_park_and_staged_again() {
    let pool = Arc::new(StagingPool::new(4096, 3).unwrap());
    let (a, src) = pooled("a", 1, 4, 4096, &pool).unwrap();
    a.set_order(vec![0, 1, 2, 3]).unwrap();
    // Queued, but nothing is staged before the engine has the buffers.
    assert!(a.wait_idle(Duration::from_secs(5)));
    assert_eq!(src.fills.load(Ordering::Relaxed), 0);
    assert!(a.try_lease(0).unwrap().is_none());
    check(&a, 0, 1);
    assert!(a.wait_idle(Duration::from_secs(5)));
    let before = src.fills.load(Ordering::Relaxed);
    assert_eq!(before, 3, "block 0 and the two after it");
    a.park().unwrap();
    // Block 1 was staged ahead; parking dropped it, so it is read again.
    check(&a, 1, 1);
    assert!(src.fills.load(Ordering::Relaxed) > before);
}

#[test]
fn a_lease_out_refuses_park_and_a_dropped_engine_gives_the_pool_back() {
    let pool = Arc::new(StagingPool::new(4096, 2).unwrap());
    let (a, _) = pooled("a", 3, 2, 4096, &pool).unwrap();
    let lease = a.acquire(1).unwrap();
    match a.park() {
        Err(StreamError::ParkWhileLeased { engine, holders }) => {
            assert_eq!(engine, "a");
            assert_eq!(holders, ["block 1 (blocks.1)"]);
        }
        other => panic!("expected ParkWhileLeased, got {other:?}"),
    }
    assert_eq!(pool.holder().as_deref(), Some("a"));
    // The engine goes first, its lease after: the buffers come back with the lease.
    drop(a);
    assert_eq!(pool.holder().as_deref(), Some("a"));
    assert!(lease.bytes().iter().all(|&x| x == 3 ^ 1));
    drop(lease);
    assert_eq!(pool.holder(), None);
    let (b, _) = pooled("b", 5, 2, 4096, &pool).unwrap();
    check(&b, 0, 5);
    drop(b);
    assert_eq!(pool.holder(), None);
}

#[test]
fn a_pool_too_small_for_a_block_is_refused_at_creation() {
    let pool = Arc::new(StagingPool::new(4096, 2).unwrap());
    assert_eq!(pool.buffer_len(), 4096);
    match pooled("big", 0, 3, 5000, &pool) {
        Err(StreamError::PoolTooSmall {
            block,
            needs,
            buffer,
            ..
        }) => assert!(
            block == 0 && needs >= 5000 && buffer == 4096,
            "{block} {needs} {buffer}"
        ),
        other => panic!("expected PoolTooSmall, got {:?}", other.map(|_| ())),
    }
    assert!(matches!(
        StagingPool::new(4096, 0),
        Err(StreamError::InvalidOptions { .. })
    ));
    // Whole pages, as the engine's own buffers.
    assert_eq!(StagingPool::new(5000, 1).unwrap().buffer_len(), 8192);
}

#[test]
fn two_threads_alternating_on_one_pool_see_their_own_bytes() {
    let pool = Arc::new(StagingPool::new(3 * 4096, 3).unwrap());
    let engines: Vec<_> = [(0x21u8, 6usize, 3 * 4096u64), (0x42, 4, 2 * 4096)]
        .into_iter()
        .enumerate()
        .map(|(i, (seed, n, bytes))| {
            let (e, _) = pooled(&format!("stage {i}"), seed, n, bytes, &pool).unwrap();
            (Arc::new(e), seed, n)
        })
        .collect();
    // Whose turn it is: each thread runs a pass, parks, and hands the turn over.
    let turn = Arc::new((Mutex::new(0usize), Condvar::new()));
    let rounds = 25;
    let handles: Vec<_> = engines
        .into_iter()
        .enumerate()
        .map(|(me, (e, seed, n))| {
            let (turn, pool) = (turn.clone(), pool.clone());
            std::thread::spawn(move || {
                let mut used = Vec::new();
                for _ in 0..rounds {
                    let (lock, cv) = &*turn;
                    let mut t = lock.lock().unwrap();
                    while *t % 2 != me {
                        t = cv.wait(t).unwrap();
                    }
                    drop(t);
                    for block in 0..n {
                        used.push(check(&e, block, seed));
                    }
                    assert!(e.park().unwrap());
                    assert_eq!(e.staging_buffers(), pool.buffers());
                    *lock.lock().unwrap() += 1;
                    cv.notify_all();
                }
                used
            })
        })
        .collect();
    let (lock, cv) = &*turn;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut t = lock.lock().unwrap();
    while *t < 2 * rounds {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "the turns stopped at {}", *t);
        t = cv.wait_timeout(t, left).unwrap().0;
    }
    drop(t);
    for h in handles {
        let used = h.join().unwrap();
        assert!(used.iter().all(|&i| i < 3));
    }
    assert_eq!(pool.holder(), None);
}

//! The engine's depth following the waits: a source that holds one block's first staging until
//! the compute waits for it, so the wait happens where the test says, every time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::pool::SlotState;
use super::source::{Filled, Source};
use super::*;

const N: usize = 6;
const SLOW: usize = 3;

/// Writes each block's index into its bytes; the first staging of `SLOW` waits for the gate.
struct Gated {
    layout: StagedLayout,
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gated {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl Source for Gated {
    fn fill(&self, block: usize, dst: &mut [u8], stop: &AtomicBool) -> Result<Filled, StreamError> {
        if block == SLOW {
            let mut open = self.open.lock().unwrap();
            while !*open && !stop.load(Ordering::Relaxed) {
                open = self
                    .cv
                    .wait_timeout(open, Duration::from_millis(5))
                    .unwrap()
                    .0;
            }
        }
        let len = self.layout.block_len(block);
        dst[..len].fill(block as u8);
        Ok(Filled::warm(self.layout.block_bytes(block)))
    }
}

fn engine(opts: EngineOptions) -> (Engine, Arc<Gated>) {
    let blocks: Vec<StreamBlock> = (0..N)
        .map(|i| StreamBlock {
            name: format!("blocks.{i}"),
            tier: SourceTier::Disk,
            tensors: vec![StreamTensor {
                name: "w".into(),
                file: 0,
                start: 0,
                end: 4096,
                dtype: crate::DType::U8,
                shape: vec![4096],
                rows: None,
            }],
        })
        .collect();
    let layout = StagedLayout::new(&blocks, 1).unwrap();
    let gated = Arc::new(Gated {
        layout: layout.clone(),
        open: Mutex::new(false),
        cv: Condvar::new(),
    });
    let meta = blocks.iter().map(|b| (b.name.clone(), b.tier)).collect();
    let e = Engine::with_source(meta, layout, gated.clone(), opts).unwrap();
    e.set_order((0..N).collect()).unwrap();
    (e, gated)
}

fn is_staged(e: &Engine, block: usize) -> bool {
    let st = e.shared.lock();
    st.find(block)
        .is_some_and(|s| matches!(st.slots[s].state, SlotState::Ready(_)))
}

/// Waits until `block` is staged (the workers get there; no timing is asserted).
fn wait_staged(e: &Engine, block: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !is_staged(e, block) {
        assert!(Instant::now() < deadline, "block {block} never staged");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One pass over the blocks; each acquire finds its block staged except the gated one's first,
/// which waits until the gate opens, and the gate opens only once that acquire waits. Checks
/// each block's bytes and that the window never wants more buffers than the pool has.
fn pass(e: &Engine, gated: &Gated) {
    for b in 0..N {
        let gate_closed = !*gated.open.lock().unwrap();
        let lease = std::thread::scope(|s| {
            if b == SLOW && gate_closed {
                s.spawn(|| {
                    while !e.shared.lock().demanded.contains(&SLOW) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    gated.open();
                });
            } else {
                wait_staged(e, b);
            }
            e.acquire(b).unwrap()
        });
        assert!(lease.bytes().iter().all(|&x| x == b as u8));
        let st = e.shared.lock();
        assert!(st.window.len() <= st.slots.len());
        drop(st);
        e.release(lease);
    }
}

#[test]
fn the_depth_grows_before_a_block_the_compute_waited_for_and_shrinks_back() {
    let opts = EngineOptions {
        lookahead: 2,
        max_lookahead: Some(3),
        ..EngineOptions::default()
    };
    let (e, gated) = engine(opts);
    // The plan counts the maximum: one buffer per block staged ahead at depth 3, plus one.
    let counted = crate::rules::staging_buffers(None, crate::rules::max_depth(2, Some(3)));
    assert_eq!(
        (e.staging_buffers().len(), counted, e.max_depth()),
        (4, 4, 3)
    );

    pass(&e, &gated);
    let s = e.stats();
    assert_eq!(
        (s.misses, s.blocks[SLOW].misses),
        (1, 1),
        "only the gated block waited"
    );
    assert_eq!((s.depth[0].min, s.depth[0].max), (2, 2));
    let grew = &s.depth[0].changes;
    assert_eq!(grew.len(), 1);
    assert_eq!(
        (grew[0].block.as_str(), grew[0].from, grew[0].to),
        ("blocks.3", 2, 3)
    );
    assert!(grew[0]
        .reason()
        .starts_with("grew to 3 before blocks.3 after a "));

    // Next pass, block 3 is staged three ahead: while block 0 runs.
    wait_staged(&e, 0);
    let first = e.acquire(0).unwrap();
    assert_eq!(e.shared.lock().window, [0, 1, 2, SLOW]);
    wait_staged(&e, SLOW);
    drop(first);
    for b in 1..N {
        wait_staged(&e, b);
        e.release(e.acquire(b).unwrap());
    }
    let s = e.stats();
    assert_eq!((s.depth[1].min, s.depth[1].max), (2, 3));
    assert!(s.depth[1].changes.is_empty());

    // The second pass in a row without a wait brings it back to the look-ahead.
    pass(&e, &gated);
    let s = e.stats();
    assert_eq!(s.misses, 1);
    let shrank = &s.depth[2].changes;
    assert_eq!(
        (shrank[0].from, shrank[0].to, shrank[0].calm_passes),
        (3, 2, 2)
    );
    pass(&e, &gated);
    let s = e.stats();
    assert_eq!(s.depth.len(), 4);
    assert_eq!((s.depth[3].min, s.depth[3].max), (2, 2));
}

#[test]
fn at_a_fixed_depth_a_wait_changes_nothing() {
    let opts = EngineOptions {
        lookahead: 2,
        ..EngineOptions::default()
    };
    let (e, gated) = engine(opts);
    assert_eq!((e.staging_buffers().len(), e.max_depth()), (3, 2));
    pass(&e, &gated);
    assert_eq!(e.stats().blocks[SLOW].misses, 1);
    // Block 3 is not staged while block 0 runs: two ahead, as always.
    wait_staged(&e, 0);
    let first = e.acquire(0).unwrap();
    assert_eq!(e.shared.lock().window, [0, 1, 2]);
    assert!(e.wait_idle(Duration::from_secs(20)));
    assert!(!is_staged(&e, SLOW));
    drop(first);
    assert!(e.stats().depth.is_empty(), "a fixed depth records nothing");
}

#[test]
fn the_buffers_cap_the_depth() {
    // Fewer buffers than the maximum wants: the depth stops where they do.
    let opts = EngineOptions {
        lookahead: 2,
        max_lookahead: Some(6),
        buffers: Some(4),
        ..EngineOptions::default()
    };
    let (e, _) = engine(opts);
    assert_eq!((e.staging_buffers().len(), e.max_depth()), (4, 3));
}

//! The read queue ordered by need, with the engine: while the drive is busy (the test holds its
//! one place, as a slow read would), the engine's reads of the blocks needed soonest go before a
//! read of a block needed later that was queued first (the resident loader's, say).

mod common;

use common::{until_waiting, Dir};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use trash_panda::io::{
    read_ranges_queued, FileReader, Lane, Need, Priority, ReadMode, ReadOptions, ReadQueue,
    ReadRequest,
};
use trash_panda::stream::{Engine, EngineOptions, SourceTier, StreamBlock, StreamTensor};
use trash_panda::DType;

const BLOCKS: usize = 6;
const BLOCK_BYTES: u64 = 64 << 10;

/// One file of `BLOCKS` disk-tier blocks of one tensor each.
fn checkpoint(dir: &Dir) -> (PathBuf, Vec<StreamBlock>) {
    let path = dir.0.join("model.safetensors");
    let data: Vec<u8> = (0..BLOCKS as u64 * BLOCK_BYTES)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    std::fs::write(&path, data).unwrap();
    let blocks = (0..BLOCKS as u64)
        .map(|b| StreamBlock {
            name: format!("blocks.{b}"),
            tier: SourceTier::Disk,
            tensors: vec![StreamTensor {
                name: format!("blocks.{b}.w"),
                file: 0,
                start: b * BLOCK_BYTES,
                end: (b + 1) * BLOCK_BYTES,
                dtype: DType::U8,
                shape: vec![BLOCK_BYTES as usize],
                rows: None,
            }],
        })
        .collect();
    (path, blocks)
}

/// A read of block `position`'s bytes through the queue on its own thread, as the resident
/// loader makes one.
fn read_on_thread(path: PathBuf, lane: Lane, position: usize) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let reader = FileReader::open(&path, ReadMode::Buffered).unwrap();
        let mut buf = vec![0u8; BLOCK_BYTES as usize];
        let at = position as u64 * BLOCK_BYTES;
        let mut reqs = [ReadRequest::new(at, &mut buf)];
        let opts = ReadOptions {
            threads: 1,
            ..ReadOptions::default()
        };
        let gate = Some((&lane, Need::Block(position)));
        read_ranges_queued(&reader, &mut reqs, &opts, &AtomicBool::new(false), gate)
            .unwrap()
            .unwrap();
        buf
    })
}

fn engine(dir: &Dir, lane: &Lane) -> (Engine, PathBuf) {
    let (path, blocks) = checkpoint(dir);
    let options = EngineOptions {
        lookahead: 3,
        workers: 2,
        disk_mode: ReadMode::Buffered,
        ..EngineOptions::default()
    };
    let engine = Engine::new(blocks, vec![path.clone()], options).unwrap();
    engine
        .share_reads(lane.clone(), (0..BLOCKS).collect())
        .unwrap();
    (engine, path)
}

/// The look-ahead of the pass's first blocks goes before the loader's read of block 5, queued
/// first.
#[test]
fn the_look_ahead_of_the_next_blocks_goes_before_a_later_block() {
    let dir = Dir::new("read-queue-ahead");
    let lane = Arc::new(ReadQueue::new(1)).lane(BLOCKS, Priority::Run);
    let queue = lane.queue().clone();
    let (engine, path) = engine(&dir, &lane);
    queue.record(true);
    let slow = lane.acquire(Need::Now);
    let loader = read_on_thread(path, lane.clone(), 5);
    until_waiting(&queue, 1);
    engine.set_order((0..BLOCKS).collect()).unwrap(); // stages blocks 0..3, two at a time
    until_waiting(&queue, 3);
    drop(slow);
    let got = loader.join().unwrap();
    assert_eq!(got[1], ((5 * BLOCK_BYTES + 1) * 31 % 251) as u8);
    let served = lane.served();
    assert_eq!(
        served[..3],
        [Need::Now, Need::Block(0), Need::Block(1)],
        "served: {served:?}"
    );
    let lease = engine.acquire(0).unwrap();
    assert_eq!(lease.bytes()[1], 31);
}

/// The block an `acquire` waits for (block 4) goes first, ahead of the loader's block 2 queued
/// before it: the acquire moved the current block, and block 2 is now the next pass's.
#[test]
fn the_block_an_acquire_waits_for_goes_first() {
    let dir = Dir::new("read-queue-acquire");
    let lane = Arc::new(ReadQueue::new(1)).lane(BLOCKS, Priority::Run);
    let queue = lane.queue().clone();
    let (engine, path) = engine(&dir, &lane);
    queue.record(true);
    let slow = lane.acquire(Need::Now);
    let loader = read_on_thread(path, lane.clone(), 2);
    until_waiting(&queue, 1);
    let engine = Arc::new(engine);
    let e2 = engine.clone();
    let acquirer = std::thread::spawn(move || e2.acquire(4).map(|l| l.bytes()[0]).unwrap());
    until_waiting(&queue, 3); // blocks 4 and 5: the two workers
    drop(slow);
    assert_eq!(acquirer.join().unwrap(), (4 * BLOCK_BYTES * 31 % 251) as u8);
    loader.join().unwrap();
    let served = lane.served();
    assert_eq!(lane.current(), 4);
    assert_eq!(
        served[..3],
        [Need::Now, Need::Block(4), Need::Block(5)],
        "served: {served:?}"
    );
    assert!(served.contains(&Need::Block(2)), "served: {served:?}");
}

/// A lane shared with positions for another number of blocks is refused, naming both counts.
#[test]
fn share_reads_wants_a_position_per_block() {
    let dir = Dir::new("read-queue-positions");
    let lane = Arc::new(ReadQueue::new(2)).lane(BLOCKS, Priority::Run);
    let (engine, _path) = engine(&dir, &lane);
    assert!(engine.read_lane() == lane);
    let e = engine.share_reads(lane, vec![0, 1]).unwrap_err();
    assert!(
        e.to_string().contains("2 positions for 6 streamed blocks"),
        "{e}"
    );
}

/// Two models on one drive: the running model's engine reads its look-ahead before the read of
/// a model that runs later, although that read asked first and is for its first block.
#[test]
fn the_running_models_reads_go_before_a_later_models() {
    let dir = Dir::new("read-queue-lanes");
    let queue = Arc::new(ReadQueue::new(1));
    let running = queue.lane(BLOCKS, Priority::Run);
    let later = queue.lane(BLOCKS, Priority::Ahead);
    let (engine, path) = engine(&dir, &running);
    queue.record(true);
    let slow = running.acquire(Need::Now);
    let loader = read_on_thread(path, later.clone(), 0);
    until_waiting(&queue, 1);
    engine.set_order((0..BLOCKS).collect()).unwrap(); // stages blocks 0..3, two at a time
    until_waiting(&queue, 3);
    drop(slow);
    loader.join().unwrap();
    // The two reads queued with the loader's go first; a worker's next read may ask in time to
    // go before it too, so only the first three are fixed.
    let served: Vec<_> = queue.served().iter().map(|s| s.lane).collect();
    let (r, a) = (running.id(), later.id());
    assert_eq!(served[..3], [r, r, r], "served: {:?}", queue.served());
    assert!(served.contains(&a), "served: {:?}", queue.served());
    assert_eq!(
        running.served()[..3],
        [Need::Now, Need::Block(0), Need::Block(1)]
    );
    assert_eq!(later.stats().grants, 1);
    assert_eq!(later.served(), [Need::Block(0)]);
}

//! The prefetch engine against real files on disk (under the target dir, so O_DIRECT is real):
//! every tier, lookahead and worker count, in order, out of order and with repeats.

mod common;

use common::{write_over, Dir, Rng};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use trash_panda::io::ReadMode;
use trash_panda::stream::{
    Engine, EngineOptions, RamSource, SourceTier, StreamBlock, StreamError, StreamTensor,
    TENSOR_ALIGN,
};
use trash_panda::DType;

/// A tensor of raw bytes (u8): the engine stages it as it is whatever the storage dtype.
fn bytes(name: String, file: usize, start: u64, end: u64) -> StreamTensor {
    StreamTensor {
        name,
        file,
        start,
        end,
        dtype: DType::U8,
        shape: vec![(end - start) as usize],
        rows: None,
    }
}

/// Three files of random bytes, and blocks of tensors at odd offsets, some spanning two files,
/// some with gaps, one empty tensor.
fn checkpoint(
    dir: &Path,
    tier: impl Fn(usize) -> SourceTier,
) -> (Vec<PathBuf>, Vec<StreamBlock>, Vec<Vec<u8>>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let sizes = [320_000usize, 330_001, 70_003];
    let mut files = Vec::new();
    let mut data = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let p = dir.join(format!("model-{i}.safetensors"));
        std::fs::write(&p, &bytes).unwrap();
        files.push(p);
        data.push(bytes);
    }
    let mut blocks = Vec::new();
    for b in 0..6 {
        let mut tensors = Vec::new();
        let file = b % 2;
        let mut at = 8 + rng.below(5000) + (b as u64 / 2) * 90_000;
        for t in 0..3 + b % 2 {
            let len = 1 + rng.below(12_000);
            let gap = if t == 2 { 70_000 } else { rng.below(300) };
            tensors.push(bytes(format!("blocks.{b}.w{t}"), file, at, at + len));
            at += len + gap;
        }
        let start = rng.below(60_000);
        let end = start + 1 + rng.below(8000);
        tensors.push(bytes(format!("blocks.{b}.other_file"), 2, start, end));
        if b == 3 {
            tensors.push(bytes("blocks.3.empty".into(), 0, 100, 100));
        }
        blocks.push(StreamBlock {
            name: format!("blocks.{b}"),
            tier: tier(b),
            tensors,
        });
    }
    (files, blocks, data)
}

/// Runs `f` on another thread and fails the test if it takes longer than `secs`.
fn guarded<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("the engine hung (or the test thread panicked)")
}

fn check_block(e: &Engine, blocks: &[StreamBlock], data: &[Vec<u8>], b: usize) {
    let lease = e
        .acquire(b)
        .unwrap_or_else(|err| panic!("acquire {b}: {err}"));
    assert_eq!(lease.block(), b);
    assert_eq!(lease.bytes().len(), e.staged_layout().block_len(b));
    assert!(lease.buffer_index() < e.staging_buffers().len());
    for (i, t) in blocks[b].tensors.iter().enumerate() {
        let want = &data[t.file][t.start as usize..t.end as usize];
        assert!(
            lease.tensor(i).unwrap() == want,
            "block {b} tensor {}",
            t.name
        );
        assert!(lease.tensor(t.name.as_str()).unwrap() == want);
        let slot = &e.layout(b).unwrap()[i];
        assert_eq!(slot.name, t.name);
        assert!(&lease.bytes()[slot.offset..slot.offset + slot.len] == want);
        // Usable in place by kernels that want 64-byte aligned weights, in every tier and mode.
        assert!(
            slot.offset.is_multiple_of(TENSOR_ALIGN),
            "block {b} {}",
            t.name
        );
        let addr = lease.tensor(i).unwrap().as_ptr() as usize;
        assert!(addr.is_multiple_of(TENSOR_ALIGN), "block {b} {}", t.name);
    }
    let layout = e.staged_layout();
    let area = layout.read_area(b);
    assert!(area.end <= layout.block_len(b), "block {b}: {area:?}");
    assert!(layout.block_len(b) <= layout.max_block_len());
    if blocks[b].tier == SourceTier::Ram {
        assert!(area.is_empty());
    }
    e.release(lease);
}

/// A configuration: its name, how RAM blocks and disk blocks are read, and each block's tier.
type Config = (&'static str, RamSource, ReadMode, fn(usize) -> SourceTier);

fn configs() -> Vec<Config> {
    fn ram(_: usize) -> SourceTier {
        SourceTier::Ram
    }
    fn disk(_: usize) -> SourceTier {
        SourceTier::Disk
    }
    fn mixed(b: usize) -> SourceTier {
        if b.is_multiple_of(3) {
            SourceTier::Ram
        } else {
            SourceTier::Disk
        }
    }
    vec![
        ("ram-mapped", RamSource::Mapped, ReadMode::Direct, ram),
        (
            "ram-in-memory",
            RamSource::InMemory { threads: 2 },
            ReadMode::Direct,
            ram,
        ),
        ("disk-direct", RamSource::Mapped, ReadMode::Direct, disk),
        ("disk-buffered", RamSource::Mapped, ReadMode::Buffered, disk),
        (
            "mixed",
            RamSource::InMemory { threads: 1 },
            ReadMode::Direct,
            mixed,
        ),
    ]
}

#[test]
fn every_tier_lookahead_and_order_gives_the_file_bytes() {
    guarded(120, || {
        let dir = Dir::new("stream_engine_all");
        for (tag, ram_source, disk_mode, tier) in configs() {
            let (files, blocks, data) = checkpoint(&dir.0, tier);
            let n = blocks.len();
            let payload: Vec<u64> = blocks
                .iter()
                .map(|b| b.tensors.iter().map(|t| t.end - t.start).sum())
                .collect();
            for lookahead in 0..=3 {
                for workers in 1..=2 {
                    let what = format!("{tag} lookahead {lookahead} workers {workers}");
                    let opts = EngineOptions {
                        storage: None,
                        lookahead,
                        workers,
                        disk_mode,
                        ram_source,
                        chunk_size: 16 << 10,
                        ..EngineOptions::default()
                    };
                    let e = Engine::new(blocks.clone(), files.clone(), opts).unwrap();
                    assert_eq!(e.staging_buffers().len(), lookahead + 1, "{what}");
                    if tag.starts_with("disk") {
                        // Refused O_DIRECT may fall back, but only to buffered.
                        assert!(e.disk_read_mode().is_some(), "{what}");
                    }
                    if tag == "disk-buffered" {
                        assert_eq!(e.disk_read_mode(), Some(ReadMode::Buffered));
                    }
                    assert_eq!(
                        e.staging_bytes(),
                        (lookahead + 1) * e.staged_layout().max_block_len()
                    );
                    if matches!(ram_source, RamSource::InMemory { .. }) && workers == 2 {
                        let load = e.load_ram_tier().unwrap();
                        assert!(load.bytes > 0, "{what}");
                        assert_eq!(e.stats().ram_load, Some(load));
                    }
                    // Pass 1 in the defined order: every block is read once (no pass before it
                    // could have staged anything, and nothing is acquired twice).
                    for b in 0..n {
                        check_block(&e, &blocks, &data, b);
                    }
                    assert_eq!(e.recorded_order(), (0..n).collect::<Vec<_>>(), "{what}");
                    assert!(e.wait_idle(Duration::from_secs(10)), "{what}");
                    let s = e.stats();
                    assert_eq!(s.acquires, n as u64);
                    assert_eq!(s.hits + s.misses, s.acquires);
                    for (b, bs) in s.blocks.iter().enumerate() {
                        assert!(bs.stagings >= 1, "{what}: block {b} {bs:?}");
                        assert_eq!(bs.bytes, bs.stagings * payload[b], "{what}");
                    }
                    let total: u64 = s.blocks.iter().map(|b| b.bytes).sum();
                    assert_eq!(total, s.bytes());
                    let ram: u64 = s
                        .blocks
                        .iter()
                        .filter(|b| b.tier == SourceTier::Ram)
                        .map(|b| b.bytes)
                        .sum();
                    assert_eq!(ram, s.ram_bytes, "{what}");
                    if lookahead == 0 {
                        assert_eq!(total, payload.iter().sum::<u64>(), "{what}");
                        assert_eq!(s.hits, 0, "{what}");
                    }

                    // A second pass, then one in an order the engine was not told.
                    e.reset_stats();
                    for b in 0..n {
                        check_block(&e, &blocks, &data, b);
                    }
                    assert_eq!(e.stats().out_of_order, 0, "{what}");
                    let shuffled = [3, 0, 5, 1, 4, 2];
                    for &b in &shuffled {
                        check_block(&e, &blocks, &data, b);
                    }
                    assert!(e.stats().out_of_order > 0, "{what}");

                    // The engine told the shuffled order, then repeats.
                    e.set_order(shuffled.to_vec()).unwrap();
                    assert_eq!(e.order(), shuffled);
                    for &b in &shuffled {
                        check_block(&e, &blocks, &data, b);
                    }
                    for b in [0, 0, 1, 1, 1, 5, 0, 5, 2] {
                        check_block(&e, &blocks, &data, b);
                    }
                    assert_eq!(e.recorded_order(), (0..n).collect::<Vec<_>>(), "{what}");
                    let s = e.stats();
                    assert_eq!(s.hits + s.misses, s.acquires);
                    assert!(s.failures == 0 && s.compute_waited_seconds >= 0.0);
                    let json = serde_json::to_string(&s).unwrap();
                    assert!(json.contains("\"buffer_waits\""), "{json}");
                    if tag == "disk-direct" && lookahead == 0 && workers == 1 {
                        eprintln!("disk-direct reads: {:?}", e.disk_read_mode());
                    }
                }
            }
        }
    });
}

/// A disk block of many tiny tensors: packed at 64 bytes they need more room than their bytes in
/// the file, so the read area starts pages in; the pool must cover it and the bytes survive.
#[test]
fn pool_covers_the_read_area_of_many_tiny_tensors() {
    guarded(60, || {
        let dir = Dir::new("stream_engine_tiny");
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let data: Vec<u8> = (0..20_000).map(|_| rng.next() as u8).collect();
        let path = dir.0.join("tiny.safetensors");
        std::fs::write(&path, &data).unwrap();
        let tensors = (0..300u64)
            .map(|k| bytes(format!("t{k}"), 0, 4096 + 8 * k, 4096 + 8 * k + 8))
            .collect();
        let blocks = vec![
            StreamBlock {
                name: "tiny".into(),
                tier: SourceTier::Disk,
                tensors,
            },
            StreamBlock {
                name: "one".into(),
                tier: SourceTier::Disk,
                tensors: vec![bytes("one".into(), 0, 8, 16)],
            },
        ];
        for disk_mode in [ReadMode::Direct, ReadMode::Buffered] {
            for lookahead in 0..=2 {
                let opts = EngineOptions {
                    lookahead,
                    disk_mode,
                    chunk_size: 4096,
                    ..EngineOptions::default()
                };
                let e = Engine::new(blocks.clone(), vec![path.clone()], opts).unwrap();
                let layout = e.staged_layout();
                let area = layout.read_area(0);
                // 300 tensors of 8 bytes take 300 * 64 bytes packed: the reads start 5 pages in.
                assert_eq!(area, 5 * 4096..6 * 4096);
                assert!(layout.layout(0).last().unwrap().offset + 8 <= area.end);
                assert_eq!(layout.block_len(0), area.end);
                assert_eq!(layout.max_block_len(), area.end);
                assert_eq!(
                    (lookahead + 1) * layout.max_block_len(),
                    (lookahead + 1) * area.end
                );
                assert_eq!(e.staging_bytes(), (lookahead + 1) * layout.max_block_len());
                assert!(e.staging_buffers().iter().all(|&(_, len)| len >= area.end));
                let files = [data.clone()];
                for b in [0, 1, 0, 1] {
                    check_block(&e, &blocks, &files, b);
                }
                assert_eq!(e.stats().blocks[0].bytes % 2400, 0);
            }
        }
    });
}

#[test]
#[cfg_attr(
    windows,
    ignore = "Windows refuses to truncate a mapped file (ERROR_USER_MAPPED_FILE): the RAM tier's \
              map keeps this truncation from happening there"
)]
fn truncated_file_gives_an_error_naming_block_and_file() {
    guarded(60, || {
        for (tag, ram_source, disk_mode, tier) in configs() {
            let dir = Dir::new(&format!("trunc_{tag}"));
            let (files, blocks, _) = checkpoint(&dir.0, tier);
            let opts = EngineOptions {
                ram_source,
                disk_mode,
                ..EngineOptions::default()
            };
            let e = Engine::new(blocks.clone(), files.clone(), opts).unwrap();
            // Blocks 2 to 5 lie (partly) past 100 kB of files 0 and 1.
            for f in &files[..2] {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(f)
                    .unwrap()
                    .set_len(100_000)
                    .unwrap();
            }
            let err = (0..blocks.len())
                .find_map(|b| e.acquire(b).err())
                .unwrap_or_else(|| panic!("{tag}: no error after truncation"));
            let msg = err.to_string();
            match &err {
                StreamError::Read {
                    block,
                    name,
                    tensor,
                    file,
                    ..
                } => {
                    assert_eq!(name, &blocks[*block].name, "{tag}");
                    assert!(blocks[*block].tensors.iter().any(|t| &t.name == tensor));
                    assert!(files[..2].contains(file), "{tag}: {msg}");
                    assert!(msg.contains(&file.display().to_string()) && msg.contains(name));
                }
                other => panic!("{tag}: unexpected error {other}"),
            }
            drop(e);
        }
    });
}

#[test]
fn a_file_written_to_while_loaded_gives_an_error_naming_it() {
    guarded(60, || {
        for (tag, ram_source, disk_mode, tier) in configs() {
            let dir = Dir::new(&format!("changed_{tag}"));
            let (files, blocks, data) = checkpoint(&dir.0, tier);
            let opts = EngineOptions {
                ram_source,
                disk_mode,
                lookahead: 1,
                ..EngineOptions::default()
            };
            let e = Engine::new(blocks.clone(), files.clone(), opts).unwrap();
            for b in 0..blocks.len() {
                check_block(&e, &blocks, &data, b);
            }
            // Another program writes into file 0 in place.
            write_over(&files[0], 20_000, &[0xA5; 64]);
            let err = (0..2 * blocks.len()).find_map(|i| e.acquire(i % blocks.len()).err());
            if tag == "ram-in-memory" {
                // The RAM tier read into memory holds its own copy: it stays what was loaded.
                assert!(err.is_none(), "{tag}: {err:?}");
                for b in 0..blocks.len() {
                    check_block(&e, &blocks, &data, b);
                }
                continue;
            }
            let err = err.unwrap_or_else(|| panic!("{tag}: no error after the file changed"));
            let msg = err.to_string();
            match &err {
                StreamError::Read { block, file, .. } => {
                    assert_eq!(file, &files[0], "{tag}: {msg}");
                    assert!(blocks[*block].tensors.iter().any(|t| t.file == 0), "{tag}");
                    assert!(
                        msg.contains("changed after the model was loaded (it was written to)"),
                        "{tag}: {msg}"
                    );
                }
                other => panic!("{tag}: unexpected error {other}"),
            }
        }
    });
}

#[test]
fn leasing_more_blocks_than_buffers_is_an_error_not_a_hang() {
    guarded(30, || {
        let dir = Dir::new("stream_engine_leased");
        let (files, blocks, data) = checkpoint(&dir.0, |_| SourceTier::Disk);
        let opts = EngineOptions {
            lookahead: 1,
            ..EngineOptions::default()
        };
        let e = Engine::new(blocks.clone(), files, opts).unwrap();
        let a = e.acquire(0).unwrap();
        let b = e.acquire(1).unwrap();
        let err = e.acquire(2).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                StreamError::AllLeased {
                    block: 2,
                    buffers: 2,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("blocks.0") && msg.contains("blocks.1"),
            "{msg}"
        );
        assert!(matches!(
            e.acquire(1),
            Err(StreamError::AlreadyLeased { block: 1, .. })
        ));
        assert!(matches!(
            e.acquire(99),
            Err(StreamError::UnknownBlock {
                block: 99,
                count: 6
            })
        ));
        assert!(a.tensor("nope").is_err());
        e.release(a);
        check_block(&e, &blocks, &data, 2);
        drop(b);
        check_block(&e, &blocks, &data, 1);
    });
}

#[test]
fn drop_with_reads_in_flight_joins_cleanly() {
    guarded(30, || {
        let dir = Dir::new("stream_engine_drop");
        let (files, blocks, _) = checkpoint(&dir.0, |_| SourceTier::Disk);
        for workers in 1..=2 {
            let opts = EngineOptions {
                lookahead: 3,
                workers,
                chunk_size: 4096,
                ..EngineOptions::default()
            };
            let e = Engine::new(blocks.clone(), files.clone(), opts).unwrap();
            e.set_order(vec![5, 4, 3, 2, 1, 0]).unwrap();
            let lease = e.acquire(5).unwrap();
            drop(e);
            assert!(!lease.bytes().is_empty());
        }
    });
}

#[test]
fn bad_inputs_are_refused_at_creation() {
    let dir = Dir::new("stream_engine_bad");
    let (files, mut blocks, _) = checkpoint(&dir.0, |_| SourceTier::Disk);
    let good = blocks[2].tensors[0].clone();
    blocks[2].tensors[0].end = 10_000_000;
    blocks[2].tensors[0].shape = vec![(10_000_000 - good.start) as usize];
    let err = Engine::new(blocks.clone(), files.clone(), EngineOptions::default()).unwrap_err();
    assert!(
        matches!(&err, StreamError::InvalidBlock { block: 2, .. })
            && err.to_string().contains("blocks.2.w0")
            && err.to_string().contains("ends at byte 10000000"),
        "{err}"
    );
    // A range that does not hold the tensor's shape of its dtype.
    blocks[2].tensors[0] = StreamTensor {
        dtype: DType::F32,
        ..good
    };
    let err = Engine::new(blocks.clone(), files.clone(), EngineOptions::default()).unwrap_err();
    assert!(
        matches!(&err, StreamError::InvalidBlock { block: 2, .. })
            && err.to_string().contains("blocks.2.w0")
            && err.to_string().contains("shape"),
        "{err}"
    );
    let (_, blocks, _) = checkpoint(&dir.0, |_| SourceTier::Ram);
    let missing = vec![dir.0.join("missing"), files[1].clone(), files[2].clone()];
    assert!(matches!(
        Engine::new(blocks.clone(), missing, EngineOptions::default()),
        Err(StreamError::Open { .. })
    ));
    let e = Engine::new(blocks, files, EngineOptions::default()).unwrap();
    assert!(matches!(
        e.set_order(vec![1, 1]),
        Err(StreamError::InvalidOrder { .. })
    ));
}

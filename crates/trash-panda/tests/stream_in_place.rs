//! Disk-tier blocks used in place from the checkpoint's map: which blocks qualify, that their
//! tensors are the file's bytes, that the pool stages nothing for them, that a truncated file or
//! one written to is an error and not a crash or other bytes, that with O_DIRECT reads the pages leave the page cache after
//! use, that a RAM-tier block stays mapped from run to run unless a run wrote to it, and that the
//! process never maps more of the checkpoint than the plan's window.

mod common;

use std::path::PathBuf;

use common::{write_over, Dir, Rng};
use trash_panda::io::{cached_bytes, can_drop_cache, drop_cache, ReadMode};
use trash_panda::stream::{
    in_place_eligible, Engine, EngineOptions, SourceTier, StreamBlock, StreamTensor, TENSOR_ALIGN,
};
use trash_panda::DType;

/// One file per block: `(dtype, first offset)` each, three tensors of `len` elements one after
/// the other from that offset.
fn checkpoint(dir: &Dir, specs: &[(DType, u64)], len: usize) -> (Vec<PathBuf>, Vec<StreamBlock>) {
    let mut rng = Rng(0x5eed);
    let mut files = Vec::new();
    let mut blocks = Vec::new();
    for (b, &(dtype, first)) in specs.iter().enumerate() {
        let nbytes = (len * dtype.size()) as u64;
        let size = first + 3 * nbytes + 4096;
        let bytes: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
        let path = dir.0.join(format!("block{b}.safetensors"));
        std::fs::write(&path, &bytes).unwrap();
        files.push(path);
        let tensors = (0..3u64)
            .map(|t| StreamTensor {
                name: format!("blocks.{b}.w{t}"),
                file: b,
                start: first + t * nbytes,
                end: first + (t + 1) * nbytes,
                dtype,
                shape: vec![len],
                rows: None,
            })
            .collect();
        blocks.push(StreamBlock {
            name: format!("blocks.{b}."),
            tier: SourceTier::Disk,
            tensors,
        });
    }
    (files, blocks)
}

fn options(disk_mode: ReadMode) -> EngineOptions {
    EngineOptions {
        in_place: true,
        lookahead: 1,
        disk_mode,
        ..EngineOptions::default()
    }
}

#[test]
fn sixteen_bit_floats_and_aligned_tensors_are_used_in_place() {
    let dir = Dir::new("in_place_rule");
    // bf16 at the file's 8-byte alignment; f32 at 8 bytes (would round differently); f32 at 64.
    let (_files, blocks) = checkpoint(
        &dir,
        &[(DType::BF16, 8), (DType::F32, 8), (DType::F32, 64)],
        4096,
    );
    let eligible: Vec<bool> = blocks
        .iter()
        .map(|b| in_place_eligible(b, TENSOR_ALIGN))
        .collect();
    assert_eq!(eligible, [true, false, true]);
    let ram = StreamBlock {
        tier: SourceTier::Ram,
        ..blocks[0].clone()
    };
    assert!(!in_place_eligible(&ram, TENSOR_ALIGN), "only the disk tier");
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "blocks are used in place on Linux only"
)]
fn tensors_are_the_files_bytes_and_the_pool_stages_nothing() {
    let dir = Dir::new("in_place_bytes");
    let (files, blocks) = checkpoint(
        &dir,
        &[(DType::BF16, 8), (DType::F16, 24), (DType::F32, 8)],
        300_000,
    );
    let data: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    for f in &files {
        let _ = drop_cache(f);
    }
    let e = Engine::new(blocks.clone(), files.clone(), options(ReadMode::Buffered)).unwrap();
    assert!(e.staged_layout().is_in_place(0) && e.staged_layout().is_in_place(1));
    assert!(
        !e.staged_layout().is_in_place(2),
        "f32 at 8 bytes is staged, 64-byte aligned"
    );
    // Disk-tier blocks used in place give their tensors back as the modules end.
    assert!(e.unmaps_as_used(0).unwrap() && !e.unmaps_as_used(2).unwrap());
    // The pool is sized by the staged block alone.
    assert_eq!(
        e.staging_bytes(),
        2 * e.staged_layout().block_len(2).next_multiple_of(4096)
    );
    for _pass in 0..2 {
        for (b, block) in blocks.iter().enumerate() {
            let lease = e.acquire(b).unwrap();
            assert_eq!(lease.in_place(), b < 2);
            for (i, t) in block.tensors.iter().enumerate() {
                let got = lease.tensor(i).unwrap();
                assert_eq!(
                    got,
                    &data[b][t.start as usize..t.end as usize],
                    "{}",
                    t.name
                );
                lease.forget_tensor(i).unwrap();
                // Forgotten pages read back the same.
                assert_eq!(lease.tensor(i).unwrap(), got);
            }
            if b < 2 {
                assert!(lease.bytes().is_empty());
                let placed = lease.tensor(0).unwrap().as_ptr() as usize;
                assert_eq!(
                    placed % 4096,
                    (block.tensors[0].start % 4096) as usize,
                    "a view of the map"
                );
            }
        }
    }
    let stats = e.stats();
    assert_eq!(stats.acquires, 6);
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "blocks are used in place on Linux only"
)]
fn a_truncated_file_is_an_error_naming_it() {
    let dir = Dir::new("in_place_truncated");
    let (files, blocks) = checkpoint(&dir, &[(DType::BF16, 8)], 100_000);
    let opts = EngineOptions {
        lookahead: 0,
        ..options(ReadMode::Buffered)
    };
    let e = Engine::new(blocks, files.clone(), opts).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .unwrap()
        .set_len(1000)
        .unwrap();
    let err = e.acquire(0).unwrap_err().to_string();
    assert!(
        err.contains("block0.safetensors") && err.contains("blocks.0."),
        "{err}"
    );
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "blocks are used in place on Linux only"
)]
fn a_block_staged_before_its_file_was_written_to_is_an_error_at_its_lease() {
    let dir = Dir::new("in_place_written");
    let (files, blocks) = checkpoint(&dir, &[(DType::BF16, 8), (DType::BF16, 8)], 10_000);
    let e = Engine::new(blocks, files.clone(), options(ReadMode::Buffered)).unwrap();
    for b in [0, 1, 0] {
        e.release(e.acquire(b).unwrap());
    }
    // Block 1 is staged again already (look-ahead 1): its lease would point into pages that
    // show the file as it is now.
    write_over(&files[1], 100, &[0x5A; 64]);
    let err = e.acquire(1).unwrap_err().to_string();
    assert!(
        err.contains("block1.safetensors changed after the model was loaded (it was written to)")
            && err.contains("blocks.1."),
        "{err}"
    );
    // The other file is untouched: its block still comes.
    e.release(e.acquire(0).unwrap());
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "blocks are used in place on Linux only"
)]
fn with_direct_reads_the_pages_leave_the_page_cache_after_use() {
    if !can_drop_cache() || !cfg!(target_os = "linux") {
        return; // the page cache is only given back per file range on Linux
    }
    let dir = Dir::new("in_place_direct");
    let (files, blocks) = checkpoint(&dir, &[(DType::BF16, 8), (DType::BF16, 8)], 2_000_000);
    for f in &files {
        drop_cache(f).unwrap();
    }
    let e = Engine::new(blocks, files.clone(), options(ReadMode::Direct)).unwrap();
    let lease = e.acquire(0).unwrap();
    assert!(lease.in_place());
    let sum: u64 = lease.tensor(0).unwrap().iter().map(|&x| u64::from(x)).sum();
    assert!(sum > 0);
    assert!(
        cached_bytes(&files[0]).unwrap() >= 3 * 4_000_000 - 8192,
        "read before it ran"
    );
    drop(lease);
    // Whole folios only: those reaching past the block's ends (2 MiB each at most) may stay.
    assert!(
        cached_bytes(&files[0]).unwrap() <= 2 * (2 << 20),
        "still cached: {}",
        cached_bytes(&files[0]).unwrap()
    );
}

/// Bytes of `files` this process has mapped (the Rss of their maps in /proc/self/smaps).
fn mapped_rss(files: &[PathBuf]) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut ours = false;
    let mut total = 0;
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            let path = parts.nth(4).map(PathBuf::from);
            ours = path.is_some_and(|p| files.contains(&p));
        } else if ours && first == "Rss:" {
            total += parts.next().unwrap().parse::<u64>().unwrap() * 1024;
        }
    }
    total
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "blocks are used in place on Linux only"
)]
fn the_process_maps_no_more_than_the_plans_window() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use trash_panda::rules::Held;

    let dir = Dir::new("in_place_window");
    let (files, blocks) = checkpoint(&dir, &[(DType::BF16, 8); 5], 2_000_000);
    let files: Vec<PathBuf> = files.iter().map(|f| f.canonicalize().unwrap()).collect();
    for f in &files {
        let _ = drop_cache(f);
    }
    let opts = EngineOptions {
        lookahead: 2,
        workers: 2,
        ..options(ReadMode::Buffered)
    };
    let e = Engine::new(blocks.clone(), files.clone(), opts).unwrap();
    let largest = (0..blocks.len())
        .map(|b| e.staged_layout().mapped_bytes(b))
        .max()
        .unwrap();
    let window = Held::default()
        .with_mapped_window(largest, 2)
        .mapped_window_bytes;
    let (stop, peak) = (AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(mapped_rss(&files), Ordering::Relaxed);
            }
        });
        for b in 0..blocks.len() {
            let lease = e.acquire(b).unwrap();
            let sum: u64 = (0..3)
                .map(|i| {
                    lease
                        .tensor(i)
                        .unwrap()
                        .iter()
                        .map(|&x| u64::from(x))
                        .sum::<u64>()
                })
                .sum();
            assert!(sum > 0);
            peak.fetch_max(mapped_rss(&files), Ordering::Relaxed);
            drop(lease);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let peak = peak.into_inner();
    // A whole block was mapped at once (no hooks give modules back here).
    assert!(peak >= 3 * 4_000_000, "peak {peak}");
    assert!(
        peak <= window,
        "mapped {peak} bytes, the plan's window is {window}"
    );
    assert_eq!(mapped_rss(&files), 0, "every lease unmapped its block");
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "blocks are used in place on Linux only"
)]
fn a_ram_tier_block_stays_mapped_between_runs_unless_a_run_wrote_to_it() {
    let dir = Dir::new("in_place_ram_kept");
    let (files, mut blocks) = checkpoint(&dir, &[(DType::BF16, 8), (DType::BF16, 8)], 1_000_000);
    let mapped0 = [files[0].canonicalize().unwrap()];
    for b in &mut blocks {
        b.tier = SourceTier::Ram;
    }
    let opts = EngineOptions {
        ram_in_place: true,
        ..options(ReadMode::Buffered)
    };
    let e = Engine::new(blocks.clone(), files.clone(), opts).unwrap();
    // Its pages stay cached whatever the map does: nothing is given back tensor by tensor.
    assert!(e.staged_layout().is_in_place(0) && !e.unmaps_as_used(0).unwrap());
    let file0 = std::fs::read(&files[0]).unwrap();
    let t = &blocks[0].tensors[1];
    let want = &file0[t.start as usize..t.end as usize];
    let block_bytes = blocks[0].tensors[2].end - blocks[0].tensors[0].start;
    // Read, not written: after the lease the block's pages are still mapped for its next run.
    for _ in 0..2 {
        let lease = e.acquire(0).unwrap();
        assert!(lease.in_place());
        for t in &blocks[0].tensors {
            let bytes = &file0[t.start as usize..t.end as usize];
            assert_eq!(lease.tensor(t.name.as_str()).unwrap(), bytes);
        }
        e.release(lease);
        e.release(e.acquire(1).unwrap());
        assert!(mapped_rss(&mapped0) >= block_bytes, "block 0 was unmapped");
    }
    // Written: the run's copy of the page goes with the lease, and the next run reads the
    // file's bytes.
    let lease = e.acquire(0).unwrap();
    let span = lease.tensor_writable(t.name.as_str()).unwrap();
    // SAFETY: the span is the lease's tensor, live while the lease is; nothing else reads it now.
    unsafe { span.as_mut_ptr().add(10).write(!want[10]) };
    assert_ne!(lease.tensor(t.name.as_str()).unwrap(), want);
    e.release(lease);
    assert!(
        mapped_rss(&mapped0) < block_bytes,
        "a written block stays mapped"
    );
    e.release(e.acquire(1).unwrap());
    let lease = e.acquire(0).unwrap();
    assert_eq!(lease.tensor(t.name.as_str()).unwrap(), want);
    e.release(lease);
}

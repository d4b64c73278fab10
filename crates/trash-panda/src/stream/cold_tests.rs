//! The mapped RAM tier read cold and warm, with every cold reader and with refused methods.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use super::source::{CheckpointSource, Refusals};
use super::*;

/// A file of `blocks` blocks of three tensors each, at odd (8-byte, not page) offsets.
fn checkpoint(blocks: usize) -> (tempfile::NamedTempFile, Vec<StreamBlock>, Vec<u8>) {
    let lens = [4096 * 3 + 8, 300_000, 1_048_576 + 24];
    let total = 1736 + blocks * lens.iter().sum::<usize>();
    let data: Vec<u8> = (0..total as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&dir).unwrap();
    let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
    let mut at = 1736u64;
    let out = (0..blocks)
        .map(|b| StreamBlock {
            name: format!("blocks.{b}"),
            tier: SourceTier::Ram,
            tensors: lens
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    let t = StreamTensor {
                        name: format!("blocks.{b}.t{i}"),
                        file: 0,
                        start: at,
                        end: at + len as u64,
                        dtype: crate::DType::U8,
                        shape: vec![len],
                        rows: None,
                    };
                    at += len as u64;
                    t
                })
                .collect(),
        })
        .collect();
    (f, out, data)
}

fn engine(path: &Path, blocks: &[StreamBlock], cold_read: ColdRead, refusals: Refusals) -> Engine {
    let options = EngineOptions {
        cold_read,
        lookahead: 1,
        workers: 2,
        // Small chunks, so a block is several requests in flight.
        chunk_size: 64 << 10,
        ..EngineOptions::default()
    };
    let layout = StagedLayout::build(blocks, 1, None, options.align, false).unwrap();
    let reads = super::reads::Reads::own(4, blocks.len());
    let source = CheckpointSource::open(
        blocks.to_vec(),
        vec![path.to_owned()],
        Arc::new(layout.clone()),
        &options,
        reads.clone(),
    )
    .unwrap()
    .with_refusals(refusals);
    let meta = blocks.iter().map(|b| (b.name.clone(), b.tier)).collect();
    Engine::with_reads(meta, layout, Arc::new(source), options, reads, None).unwrap()
}

/// One pass: every tensor of every block equals the file's bytes; returns the stats.
fn pass(e: &Engine, blocks: &[StreamBlock], data: &[u8]) -> EngineStats {
    e.reset_stats();
    e.set_order((0..blocks.len()).collect()).unwrap();
    for (b, block) in blocks.iter().enumerate() {
        let lease = e.acquire(b).unwrap();
        for t in &block.tensors {
            let got = lease.tensor(t.name.as_str()).unwrap();
            assert!(
                got == &data[t.start as usize..t.end as usize],
                "{} differs",
                t.name
            );
        }
        e.release(lease);
    }
    e.stats()
}

#[test]
fn a_block_read_cold_and_warm_gives_the_same_bytes() {
    let (f, blocks, data) = checkpoint(4);
    let refusals = [
        Refusals::default(),
        Refusals {
            populate: true,
            residency: false,
        },
        Refusals {
            populate: false,
            residency: true,
        },
        Refusals {
            populate: true,
            residency: true,
        },
    ];
    let reads = [
        ColdRead::Map,
        ColdRead::Populate,
        ColdRead::Pread { in_flight: 1 },
        ColdRead::DEFAULT,
        ColdRead::Pread { in_flight: 3 },
    ];
    let all: u64 = blocks
        .iter()
        .flat_map(|b| &b.tensors)
        .map(|t| t.end - t.start)
        .sum();
    for cold_read in reads {
        for r in refusals {
            let e = engine(f.path(), &blocks, cold_read, r);
            let dropped = crate::io::can_drop_cache() && crate::io::drop_cache(f.path()).is_ok();
            let first = pass(&e, &blocks, &data);
            let what = format!("{cold_read:?} {r:?}");
            // Without mincore the engine's own record says cold until read once. With it, the
            // kernel's read-ahead for one block can bring in the next before it is looked at.
            if r.residency {
                assert_eq!(first.ram_cold_bytes, all, "{what}: first pass");
                assert_eq!(first.ram_cold_blocks, blocks.len() as u64, "{what}");
            } else if dropped {
                assert!(first.ram_cold_blocks >= 1, "{what}: first pass {first:?}");
            }
            let second = pass(&e, &blocks, &data);
            assert_eq!(second.ram_cold_bytes, 0, "{what}: second pass");
            // The timeline tells cold reads from warm copies as the counters do.
            let stagings = e.stagings();
            let cold = stagings
                .iter()
                .filter(|s| s.source == StagingSource::RamCold)
                .count();
            assert_eq!(cold as u64, first.ram_cold_blocks, "{what}");
            assert!(stagings.iter().all(|s| s.source != StagingSource::Disk));
            assert_eq!(second.failures, 0, "{what}");
        }
    }
}

#[test]
fn a_refused_populate_falls_back_to_the_map() {
    let (f, blocks, data) = checkpoint(2);
    let refused = Refusals {
        populate: true,
        residency: false,
    };
    let e = engine(f.path(), &blocks, ColdRead::Populate, refused);
    let _ = crate::io::drop_cache(f.path());
    let stats = pass(&e, &blocks, &data);
    assert_eq!(stats.failures, 0);
}

#[test]
fn a_block_given_back_drops_the_cache_out_to_the_grain_its_neighbours_let_go() {
    // Blocks of 1.36 MB from byte 1736: each 2 MiB grain holds parts of two blocks.
    let (f, blocks, _) = checkpoint(3);
    let options = EngineOptions::default();
    let layout = StagedLayout::build(&blocks, 1, None, options.align, false).unwrap();
    let source = CheckpointSource::open(
        blocks.clone(),
        vec![f.path().to_owned()],
        Arc::new(layout.clone()),
        &options,
        super::reads::Reads::own(4, blocks.len()),
    )
    .unwrap();
    let run = |b: usize| {
        assert_eq!(layout.blocks[b].runs.len(), 1);
        layout.blocks[b].runs[0].clone()
    };
    let (grain, ends) = (MAP_GRAIN, [run(0).end, run(1).end, run(2).end]);
    // Held neighbours keep their side; the header before block 0 and the end after block 2
    // belong to no block.
    assert_eq!(source.cache_span(0, &run(0)), 0..ends[0]);
    assert_eq!(source.cache_span(1, &run(1)), ends[0]..ends[1]);
    assert_eq!(source.cache_span(2, &run(2)), ends[1]..2 * grain);
    if source.release(1, false) == 0 {
        // Windows gives back no range of a map: block 1 still holds its pages.
        assert_eq!(source.cache_span(0, &run(0)), 0..ends[0]);
        return;
    }
    assert_eq!(source.cache_span(0, &run(0)), 0..grain);
    assert_eq!(source.cache_span(2, &run(2)), grain..2 * grain);
    // Kept pages (a pipeline's pass) leave the neighbours' grains alone.
    assert!(source.release(0, true) > 0);
    assert_eq!(source.cache_span(1, &run(1)), ends[0]..ends[1]);
    // Staged again, a block holds its pages once more.
    let mut dst = vec![0u8; layout.block_len(1)];
    source.fill(1, &mut dst, &AtomicBool::new(false)).unwrap();
    assert_eq!(source.cache_span(2, &run(2)), ends[1]..2 * grain);
}

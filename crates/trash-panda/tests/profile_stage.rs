//! The profile on a synthetic stage: 8 blocks (2 on the device, 3 in RAM, 3 on disk) run in three
//! passes, the first one cold. Times are multiples of 1/4 s from a clock at 100 s, so durations are
//! exact and ties between blocks are real ties.

mod common;

use common::profile_stage::{empty, names, stage};
use serde_json::Value;
use trash_panda::profile::{
    BlockRun, CopyRun, DepthChange, DepthPass, DeviceCopy, DriveRate, EngineSummary, LargeTensor,
    LoadSummary, LoaderRun, LogLine, MemoryPoint, Profile, ProfileError, RamRead, Tier, TierLoad,
};

fn full_stage() -> Profile {
    let mut p = stage();
    p.set_load(LoadSummary {
        seconds: 12.5,
        device: TierLoad {
            bytes: 5_210_000_000,
            seconds: 10.25,
        },
        ram: TierLoad {
            bytes: 7_290_000_000,
            seconds: 2.0,
        },
        disk: TierLoad::default(),
        ram_in_memory: Some(RamRead {
            bytes: 7_290_000_000,
            seconds: 21.0,
            threads: 2,
            storage: None,
        }),
        loader: Some(LoaderRun {
            blocks: 12,
            bytes: 5_210_000_000,
            seconds: 18.5,
            waited_seconds: 2.25,
        }),
    })
    .unwrap();
    p.set_engine(EngineSummary {
        buffer_waits: 4,
        buffer_wait_seconds: 0.3,
        hits: 40,
        misses: 8,
        reclaimed_unused: 1,
        out_of_order: 2,
        ram_cold_bytes: 3_000_000_000,
        ram_cold_blocks: 3,
        ram_cold_seconds: 4.0,
        workers: 2,
        depth: Vec::new(),
    })
    .unwrap();
    let tensor = |name: &str, bytes| LargeTensor {
        name: name.to_string(),
        bytes,
    };
    p.set_memory_points(vec![
        MemoryPoint {
            label: "before release".to_string(),
            free_ram: 6_200_000_000,
            rss: 9_100_000_000,
            private: 8_700_000_000,
            large_tensors: vec![
                tensor("c", 2_000_000),
                tensor("a.weight", 200_000_000),
                tensor("d", 1_000_000),
                tensor("b.weight", 50_000_000),
            ],
        },
        MemoryPoint {
            label: "after release".to_string(),
            free_ram: 8_200_000_000,
            rss: 3_000_000_000,
            private: 2_500_000_000,
            large_tensors: vec![tensor("x", 5_000_000)],
        },
    ]);
    p
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn pass_statistics() {
    let passes = stage().passes();
    assert_eq!(passes.len(), 3);
    let first = &passes[0];
    assert_eq!((first.index, first.blocks), (0, 8));
    assert_eq!((first.start, first.seconds), (100.0, 9.75));
    assert!(close(first.staged_seconds, 6.5));
    assert!(close(first.gpu_seconds, 0.7));
    assert!(close(first.waited_seconds, 7.2));
    assert!(close(first.waited_percent(), 100.0 * 7.2 / 9.75));
    assert_eq!(
        (first.ram_bytes, first.disk_bytes),
        (3_000_000_000, 1_500_000_000)
    );
    assert!(close(first.ram_gbps, 3.0 / 9.75));
    assert!(close(first.disk_gbps, 1.5 / 9.75));
    for (k, warm) in passes[1..].iter().enumerate() {
        assert_eq!((warm.index, warm.blocks, warm.seconds), (k + 1, 8, 2.0));
        assert!(close(warm.waited_seconds, 0.3));
        assert_eq!(warm.gpu_seconds, 0.0);
        assert!(close(warm.ram_gbps, 1.5));
        assert!(close(warm.disk_gbps, 0.75));
    }
    assert_eq!(passes[1].start, 110.25);
    assert_eq!(passes[2].start, 112.75);
}

#[test]
fn report_text() {
    let expected = "\
stream_load took 12.50 s (device 5.21 GB in 10.25 s at 0.51 GB/s, ram 7.29 GB in 2.00 s at 3.65 GB/s)
read 7.29 GB of streamed-block tensors into memory in 21.00 s (0.35 GB/s, 2 threads)
loader thread: 12 resident blocks (5.21 GB) in 18.50 s (0.28 GB/s); blocks waited 2.25 s for it
pass 1: 9.75 s, waited 7.20 s (73.8%), ram 3.00 GB at 0.31 GB/s, disk 1.50 GB at 0.15 GB/s
pass 2: 2.00 s, waited 0.30 s (15.0%), ram 3.00 GB at 1.50 GB/s, disk 1.50 GB at 0.75 GB/s
pass 3: 2.00 s, waited 0.30 s (15.0%), ram 3.00 GB at 1.50 GB/s, disk 1.50 GB at 0.75 GB/s
first pass, main thread time by block:
  blocks.6 (disk): 3.00 s = staged 2.50 s + gpu 0.20 s + rest 0.30 s
  blocks.4 (ram): 2.00 s = staged 1.50 s + gpu 0.20 s + rest 0.30 s
  blocks.2 (ram): 1.50 s = staged 1.00 s + gpu 0.10 s + rest 0.40 s
  blocks.5 (disk): 1.25 s = staged 1.00 s + gpu 0.10 s + rest 0.15 s
  blocks.3 (ram): 0.75 s = staged 0.25 s + gpu 0.10 s + rest 0.40 s
  blocks.0 (device): 0.50 s = staged 0.00 s + gpu 0.00 s + rest 0.50 s
ram tier read from the drive (pages not in memory): 3.00 GB in 3 blocks, 1.50 GB/s with 2 workers
worker waited for a free pinned buffer 4 times (0.30 s)
blocks acquired: 40 ready, 8 waited for; 1 staged and never used, 2 out of order
memory while releasing:
  before release: free RAM 6.20 GB, working set 9.10 GB, private 8.70 GB, 4 tensors of 1 MB or more alive (0.25 GB)
    held: a.weight (200.00 MB)
    held: b.weight (50.00 MB)
    held: c (2.00 MB)
  after release: free RAM 8.20 GB, working set 3.00 GB, private 2.50 GB, 1 tensor of 1 MB or more alive (0.01 GB)
";
    assert_eq!(full_stage().report(), expected);
    // Same events, same text.
    assert_eq!(full_stage().report(), full_stage().report());
}

#[test]
fn the_report_says_which_depth_each_pass_ran_at_and_why() {
    let mut p = stage();
    let change = |block: &str, from, to, waited_seconds, calm_passes| DepthChange {
        block: block.to_owned(),
        from,
        to,
        waited_seconds,
        calm_passes,
    };
    p.set_engine(EngineSummary {
        depth: vec![
            DepthPass {
                pass: 0,
                min: 2,
                max: 2,
                changes: vec![change("blocks.7", 2, 3, 0.3, 0)],
            },
            DepthPass {
                pass: 1,
                min: 2,
                max: 3,
                changes: vec![],
            },
            DepthPass {
                pass: 2,
                min: 2,
                max: 3,
                changes: vec![change("blocks.7", 3, 2, 0.0, 2)],
            },
        ],
        ..EngineSummary::default()
    })
    .unwrap();
    let report = p.report();
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("staging depth"))
        .collect();
    assert_eq!(
        lines,
        [
            "staging depth, engine pass 1: 2 blocks ahead; grew to 3 before blocks.7 after a 0.30 s wait",
            "staging depth, engine pass 2: 2..3 blocks ahead",
            "staging depth, engine pass 3: 2..3 blocks ahead; shrank to 2 before blocks.7: no waits for 2 passes",
        ]
    );
    // At a fixed depth the engine records no passes, and the report says nothing new.
    let mut fixed = stage();
    fixed.set_engine(EngineSummary::default()).unwrap();
    assert!(!fixed.report().contains("staging depth"));
}

#[test]
fn a_storage_dtype_read_is_reported_as_a_read_into_memory() {
    // A storage dtype converts the RAM tier on its way into memory: nothing of it is mapped.
    let mut p = stage();
    p.set_load(LoadSummary {
        seconds: 3.0,
        ram_in_memory: Some(RamRead {
            bytes: 2_000_000_000,
            seconds: 2.5,
            threads: 2,
            storage: Some(trash_panda::DType::BF16),
        }),
        ..LoadSummary::default()
    })
    .unwrap();
    let report = p.report();
    let mut lines = report.lines();
    assert_eq!(lines.next(), Some("stream_load took 3.00 s"));
    assert_eq!(
        lines.next(),
        Some("read 2.00 GB of streamed-block tensors into memory as bf16 in 2.50 s (0.80 GB/s, 2 threads)")
    );
    // Log lines written before the field read back as kept as stored.
    let old: RamRead =
        serde_json::from_str(r#"{"bytes": 1, "seconds": 1.0, "threads": 4}"#).unwrap();
    assert_eq!(old.storage, None);
}

#[test]
fn report_without_summaries_has_only_passes() {
    let report = stage().report();
    assert!(report.starts_with("pass 1: "), "{report}");
    assert!(!report.contains("stream_load"));
    assert!(!report.contains("into memory"));
    assert!(!report.contains("staging buffer"));
    assert!(!report.contains("memory while releasing"));
    assert_eq!(empty().report(), "no block ran\n");
}

#[test]
fn a_repeated_block_starts_a_pass() {
    let mut p = empty();
    for (block, t) in [(0, 0.0), (1, 1.0), (2, 2.0), (1, 3.0), (2, 4.0), (2, 5.0)] {
        p.record(BlockRun {
            block,
            start: t,
            end: t + 0.5,
            staged_wait: 0.0,
            gpu_wait: 0.0,
            bytes: 0,
            tier: Tier::Device,
            expanded: 0,
        })
        .unwrap();
    }
    let blocks: Vec<usize> = p.passes().iter().map(|s| s.blocks).collect();
    assert_eq!(blocks, vec![3, 2, 1]);
    assert_eq!(p.passes()[1].start, 3.0);
    assert_eq!(p.passes()[1].seconds, 1.5);
}

#[test]
fn end_pass_closes_a_partial_pass_and_never_an_empty_one() {
    let mut p = empty();
    let at = |block, start: f64| BlockRun {
        block,
        start,
        end: start + 1.0,
        staged_wait: 0.0,
        gpu_wait: 0.0,
        bytes: 0,
        tier: Tier::Device,
        expanded: 0,
    };
    p.end_pass();
    p.record(at(0, 0.0)).unwrap();
    p.record(at(1, 1.0)).unwrap();
    p.end_pass();
    p.end_pass();
    // Block 0 after an explicit end is the first of a new pass, not a repeat.
    p.record(at(0, 2.0)).unwrap();
    p.record(at(2, 3.0)).unwrap();
    let blocks: Vec<usize> = p.passes().iter().map(|s| s.blocks).collect();
    assert_eq!(blocks, vec![2, 2]);
}

#[test]
fn errors_name_the_block_and_change_nothing() {
    let mut p = stage();
    let before = p.passes();
    let good = BlockRun {
        block: 3,
        start: 200.0,
        end: 201.0,
        staged_wait: 0.0,
        gpu_wait: 0.0,
        bytes: 0,
        tier: Tier::Ram,
        expanded: 0,
    };
    let err = p.record(BlockRun { block: 8, ..good }).unwrap_err();
    assert_eq!(
        err,
        ProfileError::UnknownBlock {
            block: 8,
            blocks: 8
        }
    );
    let err = p.record(BlockRun { end: 199.5, ..good }).unwrap_err();
    assert!(matches!(
        err,
        ProfileError::EndBeforeStart { block: 3, ref name, what: "run", start: 200.0, end: 199.5 }
            if name == "blocks.3"
    ));
    assert!(err.to_string().contains("blocks.3"), "{err}");
    let err = p
        .record(BlockRun {
            start: f64::NAN,
            ..good
        })
        .unwrap_err();
    assert!(matches!(
        err,
        ProfileError::BadSeconds { field: "start", .. }
    ));
    let err = p
        .record(BlockRun {
            staged_wait: -0.5,
            ..good
        })
        .unwrap_err();
    assert!(matches!(
        err,
        ProfileError::BadSeconds {
            field: "staged_wait",
            ..
        }
    ));
    let err = p
        .record(BlockRun {
            gpu_wait: f64::INFINITY,
            ..good
        })
        .unwrap_err();
    assert!(matches!(
        err,
        ProfileError::BadSeconds {
            field: "gpu_wait",
            ..
        }
    ));
    let copy = CopyRun {
        block: 9,
        start: 1.0,
        end: 2.0,
        bytes: 1,
        tier: Tier::Disk,
        worker: None,
        cold: false,
    };
    assert!(matches!(
        p.record_copy(copy).unwrap_err(),
        ProfileError::UnknownBlock { block: 9, .. }
    ));
    let load = LoadSummary {
        seconds: f64::NAN,
        ..LoadSummary::default()
    };
    assert!(matches!(
        p.set_load(load).unwrap_err(),
        ProfileError::BadSeconds {
            field: "seconds",
            ..
        }
    ));
    let engine = EngineSummary {
        buffer_wait_seconds: -1.0,
        ..EngineSummary::default()
    };
    assert!(p.set_engine(engine).is_err());
    assert_eq!(p.passes(), before);
    assert!(p.load().is_none() && p.engine().is_none() && p.copies().is_empty());
    assert_eq!(
        Profile::new(names(), vec![Tier::Ram]).unwrap_err(),
        ProfileError::LengthMismatch { names: 8, tiers: 1 }
    );
}

#[test]
fn log_line_round_trip() {
    let p = full_stage();
    let line = p.to_log_line();
    assert!(!line.contains('\n'));
    let back = LogLine::parse(&line).unwrap();
    let log = p.to_log();
    assert_eq!(back.format, "trash-panda-profile");
    assert_eq!(back.version, 1);
    assert_eq!(back.blocks, log.blocks);
    assert_eq!(back.blocks[5].tier, Tier::Disk);
    assert_eq!((back.load, back.engine), (log.load, log.engine));
    assert_eq!(back.memory, log.memory);
    assert_eq!(back.drive, None);
    assert_eq!(back.passes.len(), 3);
    for (b, p) in back.passes.iter().zip(&log.passes) {
        assert_eq!(
            (b.index, b.blocks, b.ram_bytes, b.disk_bytes),
            (p.index, p.blocks, p.ram_bytes, p.disk_bytes)
        );
        for (x, y) in [
            (b.seconds, p.seconds),
            (b.waited_seconds, p.waited_seconds),
            (b.ram_gbps, p.ram_gbps),
            (b.disk_gbps, p.disk_gbps),
        ] {
            assert!(close(x, y), "{x} != {y}");
        }
    }
    let value: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        value["passes"][0]["waited_seconds"]
            .as_f64()
            .map(|w| close(w, 7.2)),
        Some(true)
    );
    assert!(value["load"]["ram_in_memory"]["threads"] == 2);
}

#[test]
fn device_copies_per_pass_against_the_link() {
    let mut p = stage();
    let first = p.passes()[0];
    // Two copies inside the first pass, one outside every pass.
    for (at, bytes, seconds) in [
        (first.start, 2_000_000_000u64, 0.5),
        (first.start + 0.25, 1_000_000_000, 0.25),
        (1e9, 7, 1.0),
    ] {
        p.record_device_copy(DeviceCopy { at, bytes, seconds })
            .unwrap();
    }
    p.set_link(20e9).unwrap();
    let report = p.report();
    assert!(
        report.contains(
            "  copies to the device: 3.00 GB in 0.75 s of copy engine time, 4.00 GB/s, 20% of the \
             pinned link's 20.00 GB/s"
        ),
        "{report}"
    );
    assert_eq!(
        report.matches("copies to the device").count(),
        1,
        "{report}"
    );
    assert!(p.set_link(f64::NAN).is_err());
}

#[test]
fn read_rates_against_the_drive_reference() {
    let mut p = full_stage();
    p.set_drive(DriveRate {
        bytes: 512_000_000,
        seconds: 0.25,
        in_flight: 4,
    })
    .unwrap();
    let report = p.report();
    for line in [
        "drive reference: 2.05 GB/s (unbuffered reads of 0.51 GB of the checkpoint, 4 in flight, measured at release)\n",
        "stream_load took 12.50 s (device 5.21 GB in 10.25 s at 0.51 GB/s, 0.25x the drive, ram 7.29 GB in 2.00 s at 3.65 GB/s, 1.78x the drive)\n",
        "  first pass against the drive: ram 0.15x the drive, disk 0.08x the drive\n",
        "ram tier read from the drive (pages not in memory): 3.00 GB in 3 blocks, 1.50 GB/s with 2 workers, 0.73x the drive\n",
    ] {
        assert!(report.contains(line), "missing {line:?} in\n{report}");
    }
    let logged = LogLine::parse(&p.to_log_line()).unwrap();
    assert_eq!(logged.drive.map(|d| d.bytes), Some(512_000_000));
    // Only the first pass is set against the drive: later ones read from memory.
    assert_eq!(report.matches("against the drive").count(), 1, "{report}");
    let bad = DriveRate {
        bytes: 1,
        seconds: f64::INFINITY,
        in_flight: 4,
    };
    assert!(p.set_drive(bad).is_err());
}

//! Disk-tier staging benchmark: how fast does the prefetch engine stage cold blocks from a file,
//! against a plain O_DIRECT read of the same file in the same run?
//!
//! `cargo run --release -p trash-panda-bench --bin bench-stage -- [--size-gib 2] [--dir PATH]
//!  [--rounds 2] [--workers 2] [--lookahead 2]`
//!
//! The file is cut into blocks shaped like transformer layers (a few large tensors and small
//! ones, at 8-byte but not page-aligned offsets, as in a safetensors file). Each round drops the
//! file's cache, reads it once with `read_ranges_with` (O_DIRECT, 2 threads) as the reference,
//! drops it again, and stages every block once through an `Engine` (disk tier, O_DIRECT).

use std::path::{Path, PathBuf};
use std::time::Instant;

use trash_panda::io::{
    can_drop_cache, drop_cache, read_ranges_with, AlignedBuf, FileReader, ReadMode, ReadOptions,
    ReadRequest,
};
use trash_panda::stream::{Engine, EngineOptions, SourceTier, StreamBlock, StreamTensor};
use trash_panda::DType;

struct Args {
    size: u64,
    dir: PathBuf,
    rounds: usize,
    workers: usize,
    lookahead: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        size: 2 << 30,
        dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data"),
        rounds: 2,
        workers: 2,
        lookahead: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |s: String| s.parse::<f64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--size-gib" => a.size = (num(val()?)? * (1u64 << 30) as f64) as u64,
            "--dir" => a.dir = PathBuf::from(val()?),
            "--rounds" => a.rounds = num(val()?)?.max(1.0) as usize,
            "--workers" => a.workers = num(val()?)?.max(1.0) as usize,
            "--lookahead" => a.lookahead = num(val()?)? as usize,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    a.size = a.size.max(64 << 20);
    Ok(a)
}

/// Blocks of about 112 MB: per layer two 8 KiB norms and seven projections, laid out back to
/// back from byte 8 + a header-like odd start, so nothing is page-aligned.
fn blocks(size: u64) -> Vec<StreamBlock> {
    let shapes: [(&str, usize); 9] = [
        ("input_norm", 4096 * 2),
        ("q", 4096 * 4096 * 2),
        ("k", 1024 * 4096 * 2),
        ("v", 1024 * 4096 * 2),
        ("o", 4096 * 4096 * 2),
        ("post_norm", 4096 * 2),
        ("gate", 4096 * 2048 * 2),
        ("up", 4096 * 2048 * 2),
        ("down", 2048 * 4096 * 2),
    ];
    let mut at = 8 + 1736u64;
    let mut out = Vec::new();
    'outer: for b in 0.. {
        let mut tensors = Vec::new();
        for (name, len) in shapes {
            if at + len as u64 > size {
                break 'outer;
            }
            tensors.push(StreamTensor {
                name: format!("layers.{b}.{name}"),
                file: 0,
                start: at,
                end: at + len as u64,
                dtype: DType::BF16,
                shape: vec![len / 2],
            });
            at += len as u64;
        }
        out.push(StreamBlock {
            name: format!("layers.{b}"),
            tier: SourceTier::Disk,
            tensors,
        });
    }
    out
}

/// Drops `path` from the page cache where the platform can; elsewhere says once that the cache
/// is left alone, so the figures are warm.
fn make_cold(path: &Path) -> Result<(), String> {
    static SAID: std::sync::Once = std::sync::Once::new();
    if !can_drop_cache() {
        SAID.call_once(|| {
            eprintln!(
                "page cache left alone: this platform cannot drop one file's pages (warm figures)"
            )
        });
        return Ok(());
    }
    drop_cache(path).map_err(|e| e.to_string())
}

fn reference(path: &Path, size: u64, staging: &mut AlignedBuf) -> Result<f64, String> {
    make_cold(path)?;
    let r = FileReader::open(path, ReadMode::Direct).map_err(|e| e.to_string())?;
    let opts = ReadOptions {
        threads: 2,
        chunk_size: 8 << 20,
    };
    let t = Instant::now();
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(staging.len() as u64) as usize;
        let mut req = [ReadRequest::new(off, &mut staging[..n])];
        read_ranges_with(&r, &mut req, &opts).map_err(|e| e.to_string())?;
        off += n as u64;
    }
    Ok(size as f64 / 1e9 / t.elapsed().as_secs_f64())
}

fn stage(path: &Path, size: u64, a: &Args) -> Result<(f64, usize), String> {
    let blocks = blocks(size);
    let n = blocks.len();
    let opts = EngineOptions {
        lookahead: a.lookahead,
        workers: a.workers,
        disk_mode: ReadMode::Direct,
        ..EngineOptions::default()
    };
    let engine = Engine::new(blocks, vec![path.to_owned()], opts).map_err(|e| e.to_string())?;
    let pool = engine.staging_bytes();
    make_cold(path)?;
    let t = Instant::now();
    let mut bytes = 0u64;
    engine
        .set_order((0..n).collect())
        .map_err(|e| e.to_string())?;
    for b in 0..n {
        let lease = engine.acquire(b).map_err(|e| e.to_string())?;
        bytes += engine.staged_layout().block_bytes(b);
        engine.release(lease);
    }
    let secs = t.elapsed().as_secs_f64();
    if engine.disk_read_mode() != Some(ReadMode::Direct) {
        return Err(format!(
            "disk mode fell back: {:?}",
            engine.disk_read_mode()
        ));
    }
    Ok((bytes as f64 / 1e9 / secs, pool))
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let path =
        trash_panda_bench::ensure_file(&a.dir, "stage", a.size).expect("write the test file");
    let mut staging = AlignedBuf::new(256 << 20).expect("staging");
    staging.prefault();
    println!(
        "{} ({:.2} GB), {} workers, lookahead {}",
        path.display(),
        a.size as f64 / 1e9,
        a.workers,
        a.lookahead
    );
    for round in 1..=a.rounds {
        let reference = reference(&path, a.size, &mut staging).expect("reference read");
        let (engine, pool) = stage(&path, a.size, &a).expect("engine staging");
        println!(
            "round {round}: O_DIRECT reference {reference:.3} GB/s, engine {engine:.3} GB/s \
             ({:.0}% of reference), pool {:.1} MB",
            100.0 * engine / reference,
            pool as f64 / 1e6
        );
    }
}

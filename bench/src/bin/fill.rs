//! Staging fill rate from a warm RAM tier: how fast does the engine copy mapped blocks already in
//! the page cache into its staging buffers, by copy threads per block, against a memcpy of the
//! same bytes with the same number of threads in the same run?
//!
//! `cargo run --release -p trash-panda-bench --bin bench-fill -- [--size-mib 1024] [--rounds 3]`
//!
//! The file is read once so its pages are cached (checked with `cached_bytes`). For each thread
//! count, each round stages every block once through an `Engine` (one worker, lookahead 1, so
//! the figure is one block's fill at a time, as a GPU's copy would wait for it) and times a
//! multi-threaded memcpy of the same bytes from a warm private buffer into a reused one. The
//! ratio is per round; the table gives the median.

use std::path::{Path, PathBuf};
use std::time::Instant;

use trash_panda::io::cached_bytes;
use trash_panda::stream::{
    Engine, EngineOptions, RamSource, SourceTier, StreamBlock, StreamTensor,
};
use trash_panda::DType;
use trash_panda_bench::ensure_file;

const BLOCK: usize = 64 << 20;

fn parse() -> Result<(usize, usize, PathBuf), String> {
    let (mut size, mut rounds) = (1024usize << 20, 3usize);
    let mut dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data");
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let val = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--size-mib" => size = val.parse::<usize>().map_err(|e| e.to_string())? << 20,
            "--rounds" => {
                rounds = val
                    .parse()
                    .map_err(|e: std::num::ParseIntError| e.to_string())?
            }
            "--dir" => dir = PathBuf::from(val),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok((size.max(2 * BLOCK), rounds.max(1), dir))
}

/// Blocks of four tensors each, at 8-byte but not page-aligned offsets, as in a checkpoint.
fn blocks(size: usize) -> Vec<StreamBlock> {
    let quarter = BLOCK / 4;
    (0..size / BLOCK)
        .map(|b| StreamBlock {
            name: format!("layers.{b}."),
            tier: SourceTier::Ram,
            tensors: (0..4)
                .map(|k| {
                    let start = (8 + b * BLOCK + k * quarter) as u64;
                    StreamTensor {
                        name: format!("layers.{b}.w{k}"),
                        file: 0,
                        start,
                        end: start + quarter as u64,
                        dtype: DType::U8,
                        shape: vec![quarter],
                        rows: None,
                    }
                })
                .collect(),
        })
        .collect()
}

fn memcpy_rate(src: &[u8], dst: &mut [u8], threads: usize) -> f64 {
    let t0 = Instant::now();
    let share = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(share).zip(src.chunks(share)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
    src.len() as f64 / t0.elapsed().as_secs_f64()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (size, rounds, dir) = parse()?;
    let path = ensure_file(&dir, "fill", (size + 4096) as u64)?;
    let _ = std::fs::read(&path)?; // warm: the RAM tier's pages in the page cache
    let cached = cached_bytes(&path).unwrap_or(0);
    println!("file {} MiB, {} MiB cached", size >> 20, cached >> 20);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let src = vec![7u8; BLOCK];
    let mut dst = vec![0u8; BLOCK];
    let _ = memcpy_rate(&src, &mut dst, 1); // touch both buffers once
    let mut rows = Vec::new();
    for threads in 1..=cores.max(2) {
        let mut ratios = Vec::new();
        let mut fills = Vec::new();
        let mut copies = Vec::new();
        for _ in 0..rounds {
            let options = EngineOptions {
                lookahead: 0,
                workers: 1,
                ram_source: RamSource::Mapped,
                copy_threads: threads,
                ..EngineOptions::default()
            };
            let n = size / BLOCK;
            let engine = Engine::new(blocks(size), vec![path.clone()], options)?;
            // A first acquire pages the map in and warms the pool; then time every block once.
            drop(engine.acquire(0)?);
            let t0 = Instant::now();
            for b in 0..n {
                drop(engine.acquire(b)?);
            }
            let fill = (n * BLOCK) as f64 / t0.elapsed().as_secs_f64();
            let mut copy = 0.0;
            for _ in 0..n {
                copy += memcpy_rate(&src, &mut dst, threads);
            }
            let copy = copy / n as f64;
            fills.push(fill / 1e9);
            copies.push(copy / 1e9);
            ratios.push(fill / copy);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let row = format!(
            "| {threads} | {:.2} | {:.2} | {:.2} | {} |",
            median(&mut fills),
            median(&mut copies),
            median(&mut ratios.clone()),
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" / ")
        );
        println!("{row}");
        rows.push(row);
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/fill.md");
    // Where and when, for the results page.
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let cpu = trash_panda_bench::cpu_model();
    let text = format!(
        "# Staging fill rate from a warm RAM tier (`bench-fill`)\n\n- date: {date}\n- machine: \
         {cpu}, {cores} cores\n- method: `make bench-fill`; {} MiB file of \
         {} MiB blocks, all cached; one worker, each block staged once per round; memcpy = the same \
         bytes from a warm private buffer into a reused one, split over the same threads\n\n\
         | copy threads | fill GB/s | memcpy GB/s | median fill / memcpy | per round |\n\
         |---:|---:|---:|---:|---|\n{}\n",
        size >> 20,
        BLOCK >> 20,
        rows.join("\n")
    );
    std::fs::write(&out, text)?;
    Ok(())
}

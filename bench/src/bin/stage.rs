//! Disk-tier staging benchmark: how fast does the prefetch engine stage cold blocks from a file,
//! against a plain O_DIRECT read of the same file in the same run?
//!
//! `cargo run --release -p trash-panda-bench --bin bench-stage -- [--size-gib 2] [--dir PATH]
//!  [--rounds 2] [--workers 2] [--lookahead 2] [--tier ram]`
//!
//! With `--tier ram` the blocks are a mapped RAM tier instead, and each round stages them once
//! cold with every cold reader (`ColdRead`: map + WILLNEED, MADV_POPULATE_READ, pread with 1, 2
//! and 4 requests in flight) and loads them once in memory (`RamSource::InMemory`, direct and
//! buffered), alternated with the standalone readers of the same file (dd with one and two
//! streams, pread from one thread, O_DIRECT with 2 and 4 in flight); every figure is printed
//! beside /proc/diskstats' own count of what the device read in the same interval.
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
use trash_panda::stream::{
    ColdRead, Engine, EngineOptions, RamSource, SourceTier, StreamBlock, StreamTensor,
};
use trash_panda::DType;

struct Args {
    size: u64,
    dir: PathBuf,
    rounds: usize,
    workers: usize,
    lookahead: usize,
    ram: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        size: 2 << 30,
        dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data"),
        rounds: 2,
        workers: 2,
        lookahead: 2,
        ram: false,
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
            "--tier" => a.ram = val()? == "ram",
            other => return Err(format!("unknown argument {other}")),
        }
    }
    a.size = a.size.max(64 << 20);
    Ok(a)
}

/// Blocks of about 112 MB: per layer two 8 KiB norms and seven projections, laid out back to
/// back from byte 8 + a header-like odd start, so nothing is page-aligned.
fn blocks(size: u64, tier: SourceTier) -> Vec<StreamBlock> {
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
                rows: None,
            });
            at += len as u64;
        }
        out.push(StreamBlock {
            name: format!("layers.{b}"),
            tier,
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
        populate: false, // one staging buffer, reused
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
    let blocks = blocks(size, SourceTier::Disk);
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

/// Bytes the device holding `path` has read so far (/proc/diskstats; 0 where there is none).
fn device_read_bytes(path: &Path) -> u64 {
    #[cfg(target_os = "linux")]
    {
        use std::os::linux::fs::MetadataExt;
        let Ok(dev) = std::fs::metadata(path).map(|m| m.st_dev()) else {
            return 0;
        };
        let (major, minor) = (libc_major(dev), libc_minor(dev));
        let stats = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
        for line in stats.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 5 && f[0] == major.to_string() && f[1] == minor.to_string() {
                return f[5].parse::<u64>().unwrap_or(0) * 512;
            }
        }
        0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        0
    }
}

#[cfg(target_os = "linux")]
fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff)
}

#[cfg(target_os = "linux")]
fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0x00ff)
}

/// One way of reading the RAM tier's bytes, engine or standalone.
#[derive(Clone, Copy)]
enum Way {
    Dd(usize),
    Pread1,
    Direct(usize),
    Cold(ColdRead),
    InMemory(ReadMode),
}

impl Way {
    fn name(self) -> String {
        match self {
            Way::Dd(1) => "dd iflag=direct bs=8M, one stream".into(),
            Way::Dd(n) => format!("dd iflag=direct bs=8M, {n} streams"),
            Way::Pread1 => "pread, 1 thread (buffered)".into(),
            Way::Direct(n) => format!("O_DIRECT, {n} in flight"),
            Way::Cold(ColdRead::Map) => "engine: map + WILLNEED + copy".into(),
            Way::Cold(ColdRead::Populate) => "engine: MADV_POPULATE_READ + copy".into(),
            Way::Cold(ColdRead::Pread { in_flight }) => {
                format!("engine: pread, {in_flight} in flight per worker")
            }
            Way::InMemory(m) => format!("engine: in-memory load ({m}, 2 threads)"),
        }
    }

    fn is_reference(self) -> bool {
        matches!(self, Way::Dd(_) | Way::Pread1 | Way::Direct(_))
    }
}

fn dd(path: &Path, size: u64, streams: usize) -> Result<(), String> {
    let bs = 8u64 << 20;
    let share = size / streams as u64 / bs * bs;
    let mut kids = Vec::new();
    for j in 0..streams as u64 {
        let count = if j + 1 < streams as u64 {
            share
        } else {
            size - share * j
        };
        kids.push(
            std::process::Command::new("dd")
                .arg(format!("if={}", path.display()))
                .args([
                    "of=/dev/null",
                    "iflag=direct,skip_bytes,count_bytes",
                    "bs=8M",
                ])
                .arg(format!("skip={}", j * share))
                .arg(format!("count={count}"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("dd: {e}"))?,
        );
    }
    for mut k in kids {
        if !k.wait().map_err(|e| e.to_string())?.success() {
            return Err("dd failed".into());
        }
    }
    Ok(())
}

/// Reads the RAM tier's bytes one way, cold; returns (seconds, bytes).
fn run_way(
    way: Way,
    path: &Path,
    size: u64,
    a: &Args,
    staging: &mut AlignedBuf,
) -> Result<(f64, u64), String> {
    let blocks = blocks(size, SourceTier::Ram);
    let bytes: u64 = blocks
        .iter()
        .flat_map(|b| &b.tensors)
        .map(|t| t.end - t.start)
        .sum();
    let first = blocks[0].tensors[0].start;
    let opts = |cold_read, ram_source| EngineOptions {
        lookahead: a.lookahead,
        workers: a.workers,
        disk_mode: ReadMode::Direct,
        ram_source,
        cold_read,
        ..EngineOptions::default()
    };
    let engine = match way {
        Way::Cold(c) => Some(opts(c, RamSource::Mapped)),
        Way::InMemory(m) => Some(EngineOptions {
            disk_mode: m,
            ..opts(ColdRead::DEFAULT, RamSource::InMemory { threads: 2 })
        }),
        _ => None,
    }
    .map(|o| Engine::new(blocks.clone(), vec![path.to_owned()], o))
    .transpose()
    .map_err(|e| e.to_string())?;
    make_cold(path)?;
    let cached = trash_panda::io::cached_bytes(path).unwrap_or(0);
    if cached > size / 100 {
        return Err(format!("{cached} bytes still cached after drop_cache"));
    }
    let t = Instant::now();
    match way {
        Way::Dd(n) => dd(path, size, n)?,
        Way::Pread1 | Way::Direct(_) => {
            let (mode, threads) = match way {
                Way::Direct(n) => (ReadMode::Direct, n),
                _ => (ReadMode::Buffered, 1),
            };
            let r = FileReader::open(path, mode).map_err(|e| e.to_string())?;
            let o = ReadOptions {
                threads,
                chunk_size: 8 << 20,
                populate: false,
            };
            let mut off = first;
            let end = first + bytes;
            while off < end {
                let n = (end - off).min(staging.len() as u64 - 4096) as usize;
                // The destination lines up with the file offset, so O_DIRECT needs no bounce.
                let shift = (off % 4096) as usize;
                let mut req = [ReadRequest::new(off, &mut staging[shift..shift + n])];
                read_ranges_with(&r, &mut req, &o).map_err(|e| e.to_string())?;
                off += n as u64;
            }
        }
        Way::Cold(_) => {
            let e = engine.as_ref().expect("made above");
            let n = e.block_count();
            e.set_order((0..n).collect()).map_err(|e| e.to_string())?;
            for b in 0..n {
                let lease = e.acquire(b).map_err(|e| e.to_string())?;
                e.release(lease);
            }
            let st = e.stats();
            if st.ram_cold_bytes < bytes * 9 / 10 {
                return Err(format!("only {} bytes were read cold", st.ram_cold_bytes));
            }
        }
        Way::InMemory(_) => {
            let e = engine.as_ref().expect("made above");
            e.load_ram_tier().map_err(|e| e.to_string())?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let dd_bytes = if let Way::Dd(_) = way { size } else { bytes };
    Ok((secs, dd_bytes))
}

fn ram_main(a: &Args, path: &Path, staging: &mut AlignedBuf) {
    let ways = [
        Way::Dd(1),
        Way::Cold(ColdRead::Map),
        Way::Dd(2),
        Way::Cold(ColdRead::Populate),
        Way::Pread1,
        Way::Cold(ColdRead::Pread { in_flight: 1 }),
        Way::Direct(2),
        Way::Cold(ColdRead::Pread { in_flight: 2 }),
        Way::Direct(4),
        Way::Cold(ColdRead::Pread { in_flight: 4 }),
        Way::InMemory(ReadMode::Direct),
        Way::InMemory(ReadMode::Buffered),
    ];
    let mut table: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ways.len()];
    let mut best_ref: Vec<f64> = Vec::new();
    for round in 1..=a.rounds {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("round {round} (loadavg {})", load.trim());
        let mut best = 0f64;
        // Alternate the order each round, so neither side always gets the drive fresh.
        let order: Vec<usize> = if round % 2 == 1 {
            (0..ways.len()).collect()
        } else {
            (0..ways.len()).rev().collect()
        };
        for &i in &order {
            let way = ways[i];
            let dev0 = device_read_bytes(path);
            let (secs, bytes) = run_way(way, path, a.size, a, staging).expect("a way of reading");
            let dev = device_read_bytes(path) - dev0;
            let gbs = bytes as f64 / 1e9 / secs;
            let dev_gbs = dev as f64 / 1e9 / secs;
            if way.is_reference() {
                best = best.max(gbs);
            }
            println!(
                "  {:<44} {:6.3} GB/s  (device {:6.3} GB/s, {:.2} GB)",
                way.name(),
                gbs,
                dev_gbs,
                dev as f64 / 1e9
            );
            table[i].push((gbs, dev_gbs));
        }
        println!("  best standalone reader this round: {best:.3} GB/s");
        best_ref.push(best);
    }
    println!("\n| way | GB/s each round | device GB/s each round | ratio to the round's best reader (each) | median ratio |");
    println!("|---|---:|---:|---:|---:|");
    for (i, way) in ways.iter().enumerate() {
        let each: Vec<String> = table[i].iter().map(|(g, _)| format!("{g:.2}")).collect();
        let dev: Vec<String> = table[i].iter().map(|(_, d)| format!("{d:.2}")).collect();
        let mut ratios: Vec<f64> = table[i]
            .iter()
            .zip(&best_ref)
            .map(|((g, _), b)| g / b)
            .collect();
        let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        ratios.sort_by(f64::total_cmp);
        let median = if ratios.len() % 2 == 1 {
            ratios[ratios.len() / 2]
        } else {
            (ratios[ratios.len() / 2 - 1] + ratios[ratios.len() / 2]) / 2.0
        };
        println!(
            "| {} | {} | {} | {} | {median:.2} |",
            way.name(),
            each.join(" / "),
            dev.join(" / "),
            shown.join(" / ")
        );
    }
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
    if a.ram {
        ram_main(&a, &path, &mut staging);
        return;
    }
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

//! Read benchmark: how close do our readers come to `dd iflag=direct` on the same file, in the
//! same run?
//!
//! `cargo run --release -p trash-panda-bench --bin bench-read -- [--size-gib 4] [--dir PATH]
//!  [--rounds 3] [--window-mib 256]`
//!
//! Every cold pass starts with `drop_cache` (checked with `cached_bytes`). Each round measures dd
//! before and after our methods and uses their mean as the reference, because the drive drifts.
//! Reads go into one reused, prefaulted staging buffer of `--window-mib`, as the streaming engine
//! will do, so first-touch page faults are not measured.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use trash_panda::io::{
    cached_bytes, can_drop_cache, drop_cache, read_ranges_with, AlignedBuf, FileReader, MappedFile,
    ReadMode, ReadOptions, ReadRequest,
};

struct Args {
    size: u64,
    dir: PathBuf,
    rounds: usize,
    window: usize,
    chunk: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        size: 4 << 30,
        dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data"),
        rounds: 3,
        window: 256 << 20,
        chunk: 8 << 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |s: String| s.parse::<f64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--size-gib" => a.size = (num(val()?)? * (1u64 << 30) as f64) as u64,
            "--dir" => a.dir = PathBuf::from(val()?),
            "--rounds" => a.rounds = num(val()?)?.max(1.0) as usize,
            "--window-mib" => a.window = (num(val()?)? * (1 << 20) as f64) as usize,
            "--chunk-mib" => a.chunk = (num(val()?)? * (1 << 20) as f64) as usize,
            "-h" | "--help" => {
                return Err("bench-read [--size-gib 4] [--dir PATH] [--rounds 3] \
                            [--window-mib 256] [--chunk-mib 8]"
                    .into())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    a.size = a.size.max(1 << 20);
    a.window = a.window.max(1 << 20);
    Ok(a)
}

#[derive(Clone, Copy, PartialEq)]
enum Method {
    Dd,
    MapCopy,
    Pread(usize),
    Direct(usize),
}

impl Method {
    fn name(self) -> String {
        match self {
            Method::Dd => "dd iflag=direct bs=8M".into(),
            Method::MapCopy => "mmap + copy".into(),
            Method::Pread(t) => format!("pread, {t} thread{}", if t > 1 { "s" } else { "" }),
            Method::Direct(t) => format!("O_DIRECT, {t} thread{}", if t > 1 { "s" } else { "" }),
        }
    }
}

struct Bench {
    path: PathBuf,
    size: u64,
    staging: AlignedBuf,
    chunk: usize,
}

impl Bench {
    /// One pass over the whole file; returns GB/s.
    fn run(&mut self, m: Method) -> Result<f64, String> {
        let t = Instant::now();
        match m {
            Method::Dd => {
                let st = Command::new("dd")
                    .arg(format!("if={}", self.path.display()))
                    .args(["of=/dev/null", "iflag=direct", "bs=8M"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .map_err(|e| format!("dd: {e}"))?;
                if !st.success() {
                    return Err(format!("dd failed: {st}"));
                }
            }
            Method::MapCopy => {
                let map = MappedFile::open(&self.path).map_err(|e| e.to_string())?;
                for piece in map.bytes().chunks(self.staging.len()) {
                    self.staging[..piece.len()].copy_from_slice(piece);
                }
            }
            Method::Pread(threads) | Method::Direct(threads) => {
                let mode = if matches!(m, Method::Direct(_)) {
                    ReadMode::Direct
                } else {
                    ReadMode::Buffered
                };
                let r = FileReader::open(&self.path, mode).map_err(|e| e.to_string())?;
                let opts = ReadOptions {
                    threads,
                    chunk_size: self.chunk,
                    populate: false, // one staging buffer, reused
                };
                let mut off = 0u64;
                while off < self.size {
                    let n = (self.size - off).min(self.staging.len() as u64) as usize;
                    let mut req = [ReadRequest::new(off, &mut self.staging[..n])];
                    read_ranges_with(&r, &mut req, &opts).map_err(|e| e.to_string())?;
                    off += n as u64;
                }
                if r.effective_mode() != mode {
                    return Err(format!("{} fell back to {}", m.name(), r.effective_mode()));
                }
            }
        }
        Ok(self.size as f64 / 1e9 / t.elapsed().as_secs_f64())
    }

    fn make_cold(&self) -> Result<f64, String> {
        if !can_drop_cache() {
            // Windows and macOS cannot drop one file's pages: the cache is left alone, every
            // pass may be warm, and the report says the whole file may still be cached.
            return Ok(1.0);
        }
        drop_cache(&self.path).map_err(|e| e.to_string())?;
        let left = cached_bytes(&self.path).map_err(|e| e.to_string())?;
        let frac = left as f64 / self.size as f64;
        if frac > 0.05 {
            eprintln!(
                "warning: {:.1}% of the file still cached after drop_cache",
                frac * 100.0
            );
        }
        Ok(frac)
    }
}

struct Row {
    method: String,
    state: &'static str,
    gbs: Vec<f64>,
    ratios: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        eprintln!("bench-read: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let path = trash_panda_bench::ensure_file(&args.dir, "read", args.size)
        .map_err(|e| format!("test file: {e}"))?;
    let mut staging = AlignedBuf::new(args.window).map_err(|e| e.to_string())?;
    staging.prefault();
    let mut b = Bench {
        path: path.clone(),
        size: args.size,
        staging,
        chunk: args.chunk,
    };
    let cold = [
        Method::MapCopy,
        Method::Pread(1),
        Method::Pread(2),
        Method::Direct(1),
        Method::Direct(2),
        Method::Direct(4),
    ];
    let warm = [Method::MapCopy, Method::Pread(1), Method::Pread(2)];
    let mut rows: Vec<Row> = std::iter::once((Method::Dd, "cold"))
        .chain(cold.iter().map(|&m| (m, "cold")))
        .chain(warm.iter().map(|&m| (m, "warm")))
        .map(|(m, state)| Row {
            method: m.name(),
            state,
            gbs: vec![],
            ratios: vec![],
        })
        .collect();
    let mut worst_left = 0.0f64;
    for round in 1..=args.rounds {
        println!("round {round}/{}", args.rounds);
        let mut results = Vec::new();
        worst_left = worst_left.max(b.make_cold()?);
        let dd_before = b.run(Method::Dd)?;
        for &m in &cold {
            worst_left = worst_left.max(b.make_cold()?);
            let g = b.run(m)?;
            println!("  cold {:<22} {g:6.3} GB/s", m.name());
            results.push(g);
        }
        worst_left = worst_left.max(b.make_cold()?);
        let dd_after = b.run(Method::Dd)?;
        let dd = (dd_before + dd_after) / 2.0;
        println!(
            "  cold {:<22} {dd_before:6.3} / {dd_after:6.3} GB/s (before / after)",
            Method::Dd.name()
        );
        // Warm: one pass to fill the cache, then measure.
        b.run(Method::Pread(2))?;
        let cached = cached_bytes(&path).map_err(|e| e.to_string())?;
        if (cached as f64) < 0.95 * args.size as f64 {
            eprintln!("warning: only {cached} bytes cached for the warm passes");
        }
        for &m in &warm {
            let g = b.run(m)?;
            println!("  warm {:<22} {g:6.3} GB/s", m.name());
            results.push(g);
        }
        rows[0].gbs.push(dd);
        rows[0].ratios.push(1.0);
        for (row, g) in rows[1..].iter_mut().zip(results) {
            row.gbs.push(g);
            row.ratios.push(g / dd);
        }
    }
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| method | cache | best GB/s | median GB/s | median ratio to dd (same round) |"
    );
    let _ = writeln!(table, "|---|---|---:|---:|---:|");
    for r in &rows {
        let _ = writeln!(
            table,
            "| {} | {} | {:.3} | {:.3} | {:.2} |",
            r.method,
            r.state,
            best(&r.gbs),
            median(&r.gbs),
            median(&r.ratios)
        );
    }
    println!("\n{table}");
    write_results(&args, &path, worst_left, &table).map_err(|e| format!("results: {e}"))
}

fn write_results(args: &Args, path: &Path, worst_left: f64, table: &str) -> std::io::Result<()> {
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let ram = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let kb: u64 = s.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.1} GiB", kb as f64 / (1 << 20) as f64))
        })
        .unwrap_or_else(|| "?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let fs = filesystem_of(path).unwrap_or_else(|| "?".into());
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/read.md");
    std::fs::create_dir_all(out.parent().expect("has a parent"))?;
    let mut md = String::new();
    let _ = writeln!(md, "# bench-read\n");
    if !can_drop_cache() {
        let _ = writeln!(
            md,
            "**The page cache was left alone: this platform cannot drop one file's pages, so \
             every pass may be warm and no figure below is a cold read.**\n"
        );
    }
    let _ = writeln!(
        md,
        "- date: {date}\n- machine: {nproc} CPUs, {ram} RAM, kernel {kernel}, filesystem {fs}\n\
         - file: {:.2} GiB of incompressible bytes, {} rounds; staging buffer {} MiB reused, \
         {} MiB requests\n- cold = `drop_cache` (posix_fadvise DONTNEED) before each pass; at most \
         {:.1}% of the file was still cached\n- dd reference: mean of `dd if=FILE of=/dev/null \
         iflag=direct bs=8M` before and after our methods in each round; ratios are per round, \
         then the median\n- O_DIRECT, 4 threads = four 8 MiB requests in flight (threads block \
         in the drive, not on the CPU)\n",
        args.size as f64 / (1u64 << 30) as f64,
        args.rounds,
        args.window >> 20,
        args.chunk >> 20,
        worst_left * 100.0
    );
    md.push_str(table);
    std::fs::write(&out, md)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// The device and type of the filesystem holding `path`, from the longest matching mount point.
fn filesystem_of(path: &Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, mnt, ty) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mnt)
                .then(|| (mnt.len(), format!("{ty} on {dev}")))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, s)| s)
}

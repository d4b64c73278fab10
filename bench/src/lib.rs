//! Helpers shared by the benchmark binaries.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Writes `dir/{prefix}-{size}.bin` of incompressible bytes unless one of that size is there.
pub fn ensure_file(dir: &Path, prefix: &str, size: u64) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{prefix}-{size}.bin"));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == size) {
        println!("reusing {}", path.display());
        return Ok(path);
    }
    println!(
        "writing {} ({:.2} GB)...",
        path.display(),
        size as f64 / 1e9
    );
    let mut f = std::fs::File::create(&path)?;
    let mut block = vec![0u8; 64 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in block.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
    let mut left = size;
    let mut n = 0u64;
    while left > 0 {
        // Vary every block so nothing below us can deduplicate or compress it away.
        block[..8].copy_from_slice(&n.to_le_bytes());
        let k = left.min(block.len() as u64) as usize;
        f.write_all(&block[..k])?;
        left -= k as u64;
        n += 1;
    }
    f.sync_all()?;
    Ok(path)
}

/// The CPU's model name from /proc/cpuinfo (Linux), for a results file; "unknown CPU" elsewhere.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Fills `buf` with xorshift bytes: data that only needs to look like weights, not be random.
pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// The best of `reps` timed runs of `f`, after one untimed run (page faults, caches, thread
/// start-up paths).
pub fn best_of(reps: usize, mut f: impl FnMut()) -> std::time::Duration {
    f();
    (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// `dst.copy_from_slice(src)` on `threads` threads, each on its share: the memcpy reference.
pub fn parallel_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    if threads <= 1 {
        dst.copy_from_slice(src);
        return;
    }
    let per = dst.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// GB (1e9 bytes) per second of `bytes` in `t`.
pub fn gbps(bytes: usize, t: std::time::Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

/// The text after `name` on the command line, if given.
pub fn arg_str(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The number after `name` on the command line, else `default`.
pub fn arg(name: &str, default: usize) -> usize {
    arg_str(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

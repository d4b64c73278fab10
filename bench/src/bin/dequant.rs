//! GGML dequantization and 8-bit quantization throughput against memcpy, in the same run.
//!
//! Each case writes about 128 MiB (`--mib`) of output into a buffer allocated once, touched
//! before timing and reused; the figure is GB/s of output written, best of `--reps`, on one and
//! two threads, each beside a `copy_from_slice` of the same output size on as many threads timed
//! right before it. Block sources are random codes with weight-like f16 scales.
//!
//! `cargo run --release -p trash-panda-bench --bin bench-dequant [-- --reps N --mib M --only
//! TEXT]`; `TRASH_PANDA_SIMD` forces a kernel level. A full run writes
//! bench/results/dequant-<level>.md.

use std::path::Path;

use trash_panda::dtype::ggml::reference::scale_fields;
use trash_panda::dtype::{
    best_simd_level, dequantize, quantize_int8, quantize_q8_0, simd_level, DType, BLOCK_DTYPES,
};
use trash_panda_bench::{arg, arg_str, best_of, fill_random, gbps, parallel_copy};

/// Random blocks of `t` whose f16 scale fields all hold about 0.001 (as a layer's weights'
/// scales do), so no case runs on infinities or NaNs.
fn fill_blocks(buf: &mut [u8], t: DType) {
    fill_random(buf, 9);
    for (i, b) in buf.chunks_exact_mut(t.size()).enumerate() {
        for &at in scale_fields(t) {
            let h = 0x1419u16 + (i % 64) as u16; // about 0.001
            b[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
}

enum Job {
    Dequant(DType, DType),
    QuantQ8(DType),
    QuantInt8(DType),
}

impl Job {
    fn name(&self) -> String {
        match self {
            Job::Dequant(s, d) => format!("{s} -> {d}"),
            Job::QuantQ8(s) => format!("{s} -> q8_0 (quantize)"),
            Job::QuantInt8(s) => format!("{s} -> int8 per row (quantize)"),
        }
    }
}

fn main() {
    let mut report = String::new();
    macro_rules! emit {
        ($($t:tt)*) => {{
            let line = format!($($t)*);
            println!("{line}");
            report.push_str(&line);
            report.push('\n');
        }};
    }
    let reps = arg("--reps", 7);
    let out_bytes = arg("--mib", 128) << 20;
    let only = arg_str("--only").unwrap_or_default();
    let level = match simd_level() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bench-dequant: {e}");
            std::process::exit(2);
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    emit!(
        "# bench-dequant: {}, {cores} cores, {level} kernels (best here: {}), {} MiB written \
         per case, best of {reps}",
        trash_panda_bench::cpu_model(),
        best_simd_level(),
        out_bytes >> 20
    );
    let mut jobs: Vec<Job> = BLOCK_DTYPES
        .into_iter()
        .map(|t| Job::Dequant(t, DType::BF16))
        .collect();
    for t in [DType::Q8_0, DType::Q4K, DType::Q6K] {
        jobs.push(Job::Dequant(t, DType::F16));
        jobs.push(Job::Dequant(t, DType::F32));
    }
    jobs.push(Job::QuantQ8(DType::BF16));
    jobs.push(Job::QuantInt8(DType::BF16));

    let mut src_all = vec![0u8; out_bytes * 2];
    let mut dst_buf = vec![0u8; out_bytes + 128];
    let lead = dst_buf.as_ptr().align_offset(64);
    let dst = &mut dst_buf[lead..lead + out_bytes];
    // memcpy's source, apart from the cases' sources (which are borrowed while they run).
    let mut copy_src = vec![0u8; out_bytes];
    fill_random(&mut copy_src, 7);
    fill_random(&mut src_all, 5);
    fill_random(dst, 3);
    let mut scales = vec![0f32; out_bytes];
    emit!("");
    emit!("| case | 1 thread GB/s | x memcpy | 2 threads GB/s | x memcpy | 2 vs 1 thread |");
    emit!("|---|---:|---:|---:|---:|---:|");
    for job in jobs.iter().filter(|j| j.name().contains(only.as_str())) {
        // The output's size is fixed; the source is what yields it.
        let (src_len, out_len) = match *job {
            Job::Dequant(s, d) => {
                let n = out_bytes / d.size() / 256 * 256;
                (n / s.block_elems() * s.size(), n * d.size())
            }
            Job::QuantQ8(s) => {
                let n = out_bytes / 34 * 32 / 256 * 256;
                (n * s.size(), n / 32 * 34)
            }
            Job::QuantInt8(s) => {
                let n = out_bytes / 8192 * 8192;
                (n * s.size(), n)
            }
        };
        let src = &mut src_all[..src_len];
        match *job {
            Job::Dequant(s, _) => fill_blocks(src, s),
            _ => {
                // Weight-like bf16: random mantissas, exponents around 2^-7.
                fill_random(src, 13);
                for b in src.chunks_exact_mut(2) {
                    b[1] = (b[1] & 0x80) | 0x3C;
                }
            }
        }
        let src: &[u8] = src;
        let out = &mut dst[..out_len];
        let (mut speeds, mut ratios) = (Vec::new(), Vec::new());
        for threads in [1usize, 2] {
            let copy = best_of(reps, || parallel_copy(out, &copy_src[..out_len], threads));
            let t = best_of(reps, || {
                let r = match *job {
                    Job::Dequant(s, d) => dequantize(src, s, out, d, threads),
                    Job::QuantQ8(s) => quantize_q8_0(src, s, out, threads),
                    Job::QuantInt8(s) => {
                        let rows = out_len / 8192;
                        quantize_int8(src, s, (rows, 8192), out, &mut scales[..rows], threads)
                    }
                };
                if let Err(e) = r {
                    panic!("{}: {e}", job.name());
                }
            });
            speeds.push(gbps(out_len, t));
            ratios.push(copy.as_secs_f64() / t.as_secs_f64());
        }
        emit!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            job.name(),
            speeds[0],
            ratios[0],
            speeds[1],
            ratios[1],
            speeds[1] / speeds[0]
        );
    }
    if only.is_empty() {
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        let (title, table) = report.split_once('\n').unwrap_or((&report, ""));
        let text = format!(
            "{title}\n\n- date: {date}\n- method: `make bench-dequant`; GB/s of output written \
             into a reused 64-byte aligned buffer, best of {reps}; memcpy = `copy_from_slice` of \
             the output's size on as many threads, timed right before each case\n\n{table}"
        );
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("results/dequant-{level}.md"));
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("bench-dequant: could not write {}: {e}", path.display());
        }
    }
}

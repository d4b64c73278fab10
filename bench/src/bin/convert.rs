//! Conversion throughput against memcpy, measured in the same run.
//!
//! Every case writes about 128 MiB into a buffer allocated once, touched before timing, and
//! reused; the figure is GB/s of output written, best of several repetitions, next to a plain
//! `copy_from_slice` of the same output size on the same number of threads.
//!
//! `cargo run --release -p trash-panda-bench --bin bench-convert [-- --reps N --mib M]`; the
//! header names the CPU and the kernel level that ran, which `TRASH_PANDA_SIMD` (portable, avx2,
//! avx512, neon, auto) forces.

use std::time::{Duration, Instant};

use trash_panda::dtype::{
    best_simd_level, cast, expand, quantize_fp8, simd_level, DType, QuantGranularity, Scale,
};

struct Case {
    name: &'static str,
    src_dtype: DType,
    dst_dtype: DType,
}

const CASES: [Case; 7] = [
    Case {
        name: "fp8 e4m3 -> bf16",
        src_dtype: DType::F8E4M3,
        dst_dtype: DType::BF16,
    },
    Case {
        name: "fp8 e4m3 -> bf16, per-row scale",
        src_dtype: DType::F8E4M3,
        dst_dtype: DType::BF16,
    },
    Case {
        name: "fp8 e4m3 -> bf16, 128x128 block scale",
        src_dtype: DType::F8E4M3,
        dst_dtype: DType::BF16,
    },
    Case {
        name: "fp8 e5m2 -> bf16",
        src_dtype: DType::F8E5M2,
        dst_dtype: DType::BF16,
    },
    Case {
        name: "bf16 -> f32",
        src_dtype: DType::BF16,
        dst_dtype: DType::F32,
    },
    Case {
        name: "f32 -> bf16",
        src_dtype: DType::F32,
        dst_dtype: DType::BF16,
    },
    Case {
        name: "bf16 -> fp8 e4m3, per-row quantize",
        src_dtype: DType::BF16,
        dst_dtype: DType::F8E4M3,
    },
];

/// A small xorshift generator: the data only needs to look like weights, not be random.
fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// Fills `buf` with weight-like values of `dtype` (finite, spread over a few binades).
fn fill_values(buf: &mut [u8], dtype: DType, threads: usize) {
    if dtype.is_fp8() {
        fill_random(buf, 7);
        // Keep the codes finite: clear NaN patterns so every case converts ordinary numbers.
        for b in buf.iter_mut() {
            if *b & 0x7F >= 0x7C {
                *b &= 0xBF;
            }
        }
        return;
    }
    let n = buf.len() / dtype.size();
    let mut fp8 = vec![0u8; n];
    fill_values(&mut fp8, DType::F8E4M3, threads);
    if let Err(e) = expand(
        &fp8,
        DType::F8E4M3,
        buf,
        dtype,
        (1, n),
        &Scale::PerTensor(0.01),
        threads,
    ) {
        panic!("fill {dtype}: {e}");
    }
}

fn best_of(reps: usize, mut f: impl FnMut()) -> Duration {
    f(); // warm-up: page faults, caches, thread start-up paths
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn parallel_copy(dst: &mut [u8], src: &[u8], threads: usize) {
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

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let reps = arg("--reps", 7);
    let out_bytes = arg("--mib", 128) << 20;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = trash_panda_bench::cpu_model();
    // TRASH_PANDA_SIMD picks the path (`TRASH_PANDA_SIMD=avx2 make bench-convert`); a level this
    // CPU lacks stops here rather than measuring another one.
    let level = match simd_level() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bench-convert: {e}");
            std::process::exit(2);
        }
    };
    let how = if std::env::var("TRASH_PANDA_SIMD").is_ok_and(|v| !v.trim().is_empty()) {
        "forced by TRASH_PANDA_SIMD"
    } else {
        "auto"
    };
    println!(
        "# bench-convert: {cpu}, {cores} cores, {level} kernels ({how}; best here: {}), \
         {} MiB written per case, best of {reps}",
        best_simd_level(),
        out_bytes >> 20
    );

    // Buffers allocated once and reused by every case; the largest source is f32 or bf16 at
    // twice the output size.
    let mut src_all = vec![0u8; out_bytes * 2];
    let mut dst = vec![0u8; out_bytes];
    // Touch everything first: fresh pages (even read-only zero pages) would skew the timings.
    fill_random(&mut src_all, 5);
    fill_random(&mut dst, 3);
    let mut scales = vec![1.0f32; out_bytes];

    println!("| conversion | threads | GB/s written | memcpy GB/s | ratio |");
    println!("|---|---:|---:|---:|---:|");
    for threads in [1, cores] {
        let memcpy = best_of(reps, || {
            parallel_copy(&mut dst, &src_all[..out_bytes], threads);
        });
        let memcpy_gbps = gbps(out_bytes, memcpy);
        println!(
            "| memcpy (copy_from_slice) | {threads} | {memcpy_gbps:.2} | {memcpy_gbps:.2} | 1.00 |"
        );
        for case in &CASES {
            let n = out_bytes / case.dst_dtype.size();
            let src = &mut src_all[..n * case.src_dtype.size()];
            fill_values(src, case.src_dtype, cores);
            let src: &[u8] = src;
            let cols = 8192.min(n);
            let rows = n / cols;
            let row_scales: Vec<f32> = (0..rows).map(|i| 0.001 + i as f32 * 1e-6).collect();
            let tiles = rows.div_ceil(128) * cols.div_ceil(128);
            let block_scales: Vec<f32> = (0..tiles).map(|i| 0.002 + i as f32 * 1e-7).collect();
            let t = best_of(reps, || {
                let r = match case.name {
                    n if n.contains("quantize") => quantize_fp8(
                        src,
                        case.src_dtype,
                        (rows, cols),
                        QuantGranularity::PerRow,
                        &mut dst,
                        &mut scales[..rows],
                        threads,
                    ),
                    n if n.contains("per-row") => expand(
                        src,
                        case.src_dtype,
                        &mut dst,
                        case.dst_dtype,
                        (rows, cols),
                        &Scale::PerRow(&row_scales),
                        threads,
                    ),
                    n if n.contains("block") => expand(
                        src,
                        case.src_dtype,
                        &mut dst,
                        case.dst_dtype,
                        (rows, cols),
                        &Scale::Block {
                            scales: &block_scales,
                            block: 128,
                        },
                        threads,
                    ),
                    _ if case.src_dtype.is_fp8() => expand(
                        src,
                        case.src_dtype,
                        &mut dst,
                        case.dst_dtype,
                        (rows, cols),
                        &Scale::None,
                        threads,
                    ),
                    _ => cast(src, case.src_dtype, &mut dst, case.dst_dtype, threads),
                };
                if let Err(e) = r {
                    panic!("{}: {e}", case.name);
                }
            });
            let g = gbps(out_bytes, t);
            println!(
                "| {} | {threads} | {g:.2} | {memcpy_gbps:.2} | {:.2} |",
                case.name,
                g / memcpy_gbps
            );
        }
    }
}

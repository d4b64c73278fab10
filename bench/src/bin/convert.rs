//! Conversion throughput against memcpy, measured in the same run.
//!
//! Every case writes about 128 MiB into a buffer allocated once, touched before timing, and
//! reused; the figure is GB/s of output written, best of several repetitions, on one and on two
//! threads, each next to a plain `copy_from_slice` of the same output size on as many threads
//! timed right before it.
//!
//! `cargo run --release -p trash-panda-bench --bin bench-convert [-- --reps N --mib M --kib K
//! --cols C --only TEXT]`; the header names the CPU and the kernel level that ran, which
//! `TRASH_PANDA_SIMD` (portable, avx2, avx512, neon, auto) forces, and each row the code that ran
//! (a hand-written kernel or the generic loops). `--kib` sizes the output for in-cache runs that
//! time the kernels alone; `--cols` sets the row length of the per-row and block cases (8192 by
//! default: a weight's, whose per-row work the quantizer repeats each row); `--only` runs the
//! cases whose name holds the text.

use std::path::Path;

use trash_panda::dtype::{
    best_simd_level, cast, expand, kernel_path, quantize_fp8, simd_level, DType, QuantGranularity,
    Scale,
};
use trash_panda_bench::{arg, arg_str, best_of, fill_random, gbps, parallel_copy};

struct Case {
    name: &'static str,
    src_dtype: DType,
    dst_dtype: DType,
}

const CASES: [Case; 17] = [
    Case {
        name: "fp8 e4m3 -> bf16",
        src_dtype: DType::F8E4M3,
        dst_dtype: DType::BF16,
    },
    Case {
        name: "fp8 e4m3 -> bf16, per-tensor scale",
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
        name: "fp8 e4m3 -> f16, per-row scale",
        src_dtype: DType::F8E4M3,
        dst_dtype: DType::F16,
    },
    Case {
        name: "fp8 e4m3 -> f32, per-row scale",
        src_dtype: DType::F8E4M3,
        dst_dtype: DType::F32,
    },
    Case {
        name: "fp8 e5m2 -> bf16",
        src_dtype: DType::F8E5M2,
        dst_dtype: DType::BF16,
    },
    Case {
        name: "fp8 e5m2 -> bf16, per-row scale",
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
        name: "f32 -> f16",
        src_dtype: DType::F32,
        dst_dtype: DType::F16,
    },
    Case {
        name: "bf16 -> fp8 e4m3, per-row quantize",
        src_dtype: DType::BF16,
        dst_dtype: DType::F8E4M3,
    },
    Case {
        name: "bf16 -> fp8 e4m3, per-row quantize, normal values",
        src_dtype: DType::BF16,
        dst_dtype: DType::F8E4M3,
    },
    Case {
        name: "bf16 -> fp8 e4m3, per-row quantize, every bit pattern",
        src_dtype: DType::BF16,
        dst_dtype: DType::F8E4M3,
    },
    Case {
        name: "bf16 -> fp8 e4m3, per-tensor quantize",
        src_dtype: DType::BF16,
        dst_dtype: DType::F8E4M3,
    },
    Case {
        name: "f16 -> fp8 e4m3, per-row quantize",
        src_dtype: DType::F16,
        dst_dtype: DType::F8E4M3,
    },
    Case {
        name: "f16 -> fp8 e4m3, per-row quantize, normal values",
        src_dtype: DType::F16,
        dst_dtype: DType::F8E4M3,
    },
];

/// Fills `buf` with bf16 values drawn about as a layer's weights are (near normal, sd 0.02: a
/// row's amax over 448 makes a scale under which almost no value falls into e4m3's subnormal
/// codes), where `fill_values` spreads them over every binade of e4m3.
fn fill_normal_bf16(buf: &mut [u8]) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32
    };
    for out in buf.chunks_exact_mut(2) {
        // The sum of four uniforms less 2 has mean 0 and variance 1/3.
        let z = (uniform() + uniform() + uniform() + uniform() - 2.0) * 3f32.sqrt();
        let bits = (0.02 * z).to_bits();
        let rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
        out.copy_from_slice(&(rounded as u16).to_le_bytes());
    }
}

/// Fills `buf` with bf16 bit patterns drawn uniformly, but for the infinities and NaNs: every
/// binade, subnormals included, whose quotients are subnormal f32 values for most scales.
fn fill_bits_bf16(buf: &mut [u8]) {
    fill_random(buf, 11);
    for b in buf.chunks_exact_mut(2) {
        if b[1] & 0x7F == 0x7F && b[0] & 0x80 != 0 {
            b[1] &= 0xBF;
        }
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

fn main() {
    // Every line goes to stdout and, for a full run, to bench/results/convert-<level>.md.
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
    // `--kib` (for in-cache runs that time the kernels' own speed) overrides `--mib`.
    let out_bytes = arg("--kib", arg("--mib", 128) << 10) << 10;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Every case has out_bytes / 4, / 2 or / 1 elements.
    let cols = arg("--cols", 8192).max(1);
    if !(out_bytes / 4).is_multiple_of(cols) {
        eprintln!(
            "bench-convert: --cols {cols} does not divide the {} elements of the f32 cases",
            out_bytes / 4
        );
        std::process::exit(2);
    }
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
    emit!(
        "# bench-convert: {cpu}, {cores} cores, {level} kernels ({how}; best here: {}), \
         {} KiB written per case, best of {reps}",
        best_simd_level(),
        out_bytes >> 10
    );

    // Buffers allocated once and reused by every case; the largest source is f32 or bf16 at
    // twice the output size.
    let mut src_all = vec![0u8; out_bytes * 2];
    // The output starts on a 64-byte boundary, as torch's CPU allocator places tensors (a
    // large Vec is only 16-byte aligned); `--misalign B` shifts it by B bytes.
    let mut dst_buf = vec![0u8; out_bytes + 128];
    let lead = dst_buf.as_ptr().align_offset(64) + arg("--misalign", 0) % 64;
    let dst = &mut dst_buf[lead..lead + out_bytes];
    // Touch everything first: fresh pages (even read-only zero pages) would skew the timings.
    fill_random(&mut src_all, 5);
    fill_random(dst, 3);
    let mut scales = vec![1.0f32; out_bytes];

    // One and two threads (the columns), whatever the core count; memcpy on as many.
    let thread_counts = [1usize, 2];
    let memcpy: Vec<f64> = thread_counts
        .iter()
        .map(|&threads| {
            let t = best_of(reps, || parallel_copy(dst, &src_all[..out_bytes], threads));
            gbps(out_bytes, t)
        })
        .collect();
    emit!(
        "memcpy (copy_from_slice) at the start: {:.2} GB/s on 1 thread, {:.2} GB/s on 2; each \
         ratio below is against a memcpy timed right before the case",
        memcpy[0],
        memcpy[1]
    );
    emit!("");
    emit!(
        "| conversion | path | 1 thread GB/s | x memcpy | 2 threads GB/s | x memcpy | 2 vs 1 thread |"
    );
    emit!("|---|---|---:|---:|---:|---:|---:|");
    // `--only TEXT` runs the cases whose name contains it.
    let only = arg_str("--only").unwrap_or_default();
    for case in CASES.iter().filter(|c| c.name.contains(only.as_str())) {
        let n = out_bytes / case.dst_dtype.size();
        if case.name.contains("normal values") && case.src_dtype == DType::F16 {
            let mut bf16 = vec![0u8; n * 2];
            fill_normal_bf16(&mut bf16);
            if let Err(e) = cast(&bf16, DType::BF16, &mut src_all[..n * 2], DType::F16, cores) {
                panic!("fill f16: {e}");
            }
        } else if case.name.contains("normal values") {
            fill_normal_bf16(&mut src_all[..n * case.src_dtype.size()]);
        } else if case.name.contains("every bit pattern") {
            fill_bits_bf16(&mut src_all[..n * case.src_dtype.size()]);
        } else {
            fill_values(
                &mut src_all[..n * case.src_dtype.size()],
                case.src_dtype,
                cores,
            );
        }
        let src: &[u8] = &src_all[..n * case.src_dtype.size()];
        let cols = cols.min(n);
        let rows = n / cols;
        let row_scales: Vec<f32> = (0..rows).map(|i| 0.001 + i as f32 * 1e-6).collect();
        let tiles = rows.div_ceil(128) * cols.div_ceil(128);
        let block_scales: Vec<f32> = (0..tiles).map(|i| 0.002 + i as f32 * 1e-7).collect();
        let (mut speeds, mut ratios) = (Vec::new(), Vec::new());
        for &threads in &thread_counts {
            // memcpy again right before the case: the machine's bandwidth drifts.
            let copy = best_of(reps, || parallel_copy(dst, &src_all[..out_bytes], threads));
            let t = best_of(reps, || {
                let r = match case.name {
                    n if n.contains("quantize") => {
                        let (g, groups) = if n.contains("per-tensor") {
                            (QuantGranularity::PerTensor, 1)
                        } else {
                            (QuantGranularity::PerRow, rows)
                        };
                        let s = &mut scales[..groups];
                        quantize_fp8(src, case.src_dtype, (rows, cols), g, dst, s, threads)
                    }
                    n if n.contains("per-tensor") => expand(
                        src,
                        case.src_dtype,
                        dst,
                        case.dst_dtype,
                        (rows, cols),
                        &Scale::PerTensor(0.0123),
                        threads,
                    ),
                    n if n.contains("per-row") => expand(
                        src,
                        case.src_dtype,
                        dst,
                        case.dst_dtype,
                        (rows, cols),
                        &Scale::PerRow(&row_scales),
                        threads,
                    ),
                    n if n.contains("block") => expand(
                        src,
                        case.src_dtype,
                        dst,
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
                        dst,
                        case.dst_dtype,
                        (rows, cols),
                        &Scale::None,
                        threads,
                    ),
                    _ => cast(src, case.src_dtype, dst, case.dst_dtype, threads),
                };
                if let Err(e) = r {
                    panic!("{}: {e}", case.name);
                }
            });
            speeds.push(gbps(out_bytes, t));
            ratios.push(copy.as_secs_f64() / t.as_secs_f64());
        }
        emit!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            case.name,
            kernel_path(case.src_dtype, case.dst_dtype),
            speeds[0],
            ratios[0],
            speeds[1],
            ratios[1],
            speeds[1] / speeds[0]
        );
        if case.src_dtype.size() > case.dst_dtype.size() {
            read_side(case.name, src, dst, reps, &thread_counts, &mut |l| {
                emit!("{l}")
            });
        }
    }
    if only.is_empty() && std::env::args().all(|a| a != "--kib" && a != "--cols") {
        write_report(&report, level, reps, out_bytes);
    }
}

/// The read side of a narrowing case (its source is larger than its output), measured in the
/// same run: reading the source alone (a vector sum) and a memcpy of the source's size. Each is
/// given as GB/s of the case's output (output bytes over the time) and against a memcpy of the
/// output's size, so a row says how close to 1 the case could get if it cost no more than
/// that; whether the 0.9 target is reachable on this machine follows from the read row.
fn read_side(
    name: &str,
    src: &[u8],
    dst: &mut [u8],
    reps: usize,
    thread_counts: &[usize],
    emit: &mut dyn FnMut(String),
) {
    let out = dst.len();
    let mut scratch = vec![0u8; src.len()];
    scratch.fill(1);
    let mut cells = Vec::new();
    for &threads in thread_counts {
        let copy = best_of(reps, || parallel_copy(dst, &src[..out], threads));
        let read = best_of(reps, || {
            std::hint::black_box(parallel_sum(src, threads, false));
        });
        let ahead = best_of(reps, || {
            std::hint::black_box(parallel_sum(src, threads, true));
        });
        let big = best_of(reps, || parallel_copy(&mut scratch, src, threads));
        cells
            .push([read, ahead, big].map(|t| (gbps(out, t), copy.as_secs_f64() / t.as_secs_f64())));
    }
    let mib = src.len() >> 20;
    let what = [
        format!("{name}, reference: read the {mib} MiB source alone (vector sum)"),
        format!("{name}, reference: the same read, prefetching 4 KiB ahead into L2"),
        format!("{name}, reference: memcpy of the source's size ({mib} MiB)"),
    ];
    for (i, what) in what.iter().enumerate() {
        let (a, b) = (cells[0][i], cells[1][i]);
        emit(format!(
            "| {what} | reference | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            a.0,
            a.1,
            b.0,
            b.1,
            b.0 / a.0
        ));
    }
}

/// The wrapping sum of `buf` as 64-bit words, on `threads` threads: a pure read stream; with
/// `ahead`, each 64-byte line also prefetches the one 4 KiB on into L2 (as the narrowing and
/// quantizing kernels do).
fn parallel_sum(buf: &[u8], threads: usize, ahead: bool) -> u64 {
    let sum = move |b: &[u8]| {
        let words = |l: &[u8]| {
            l.chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                .fold(0u64, u64::wrapping_add)
        };
        if !ahead {
            return words(b);
        }
        let mut total = 0u64;
        for line in b.chunks(64) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults and reads nothing into the program; the address
            // (past the end near the last lines) is never dereferenced.
            unsafe {
                let p = line.as_ptr().wrapping_add(4096);
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(p.cast());
            }
            total = total.wrapping_add(words(line));
        }
        total
    };
    if threads <= 1 {
        return sum(buf);
    }
    let per = buf.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = buf.chunks(per).map(|c| s.spawn(move || sum(c))).collect();
        parts
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .fold(0, u64::wrapping_add)
    })
}

/// The run's report as a results page (bench/results/convert-<level>.md), with when, where and
/// how, for the site's figures.
fn write_report(report: &str, level: trash_panda::dtype::SimdLevel, reps: usize, bytes: usize) {
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let (title, table) = report.split_once('\n').unwrap_or((report, ""));
    let text = format!(
        "{title}\n\n- date: {date}\n- method: `make bench-convert` (`TRASH_PANDA_SIMD={level}` \
         forces this level); {} MiB written per case into a reused 64-byte aligned buffer, best \
         of {reps}, on 1 and 2 threads; GB/s of output; memcpy = `copy_from_slice` of the output's \
         size on as many threads, timed right before each case\n\n{table}",
        bytes >> 20
    );
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("results/convert-{level}.md"));
    if let Err(e) = std::fs::write(&out, text) {
        eprintln!("bench-convert: could not write {}: {e}", out.display());
    }
}

//! Outputs large enough for the streaming stores and the threaded split, on odd shapes: every
//! kernel level on one and two threads gives the bits the portable level gives on one.

mod common;
use common::on_every_level;
use trash_panda::dtype::{
    cast, expand, quantize_fp8, with_simd_level, DType, QuantGranularity, Scale, SimdLevel,
};

/// `n` bytes from a xorshift generator; where `clean`, NaN patterns of `t` are replaced, so the
/// fast paths that send NaNs elsewhere run on whole stretches.
fn data(n: usize, seed: u64, t: DType) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out: Vec<u8> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    // The second half without NaNs.
    let size = t.size();
    let half = n / size / 2 * size;
    for e in out[half..].chunks_exact_mut(size) {
        let top = e[size - 1];
        match t {
            DType::F8E4M3 if top & 0x7F == 0x7F => e[0] = 0x7E | (top & 0x80),
            DType::F8E5M2 if top & 0x7F >= 0x7C => e[0] = 0x7B | (top & 0x80),
            // Clearing one exponent bit keeps the 16- and 32-bit floats finite.
            DType::BF16 | DType::F16 | DType::F32 => e[size - 1] = top & 0xBF,
            _ => {}
        }
    }
    out
}

/// Runs `f(threads)` on the portable level with one thread, then on every level with one and
/// two, and checks every output equals the first.
fn same_everywhere(what: &str, f: impl Fn(usize) -> Vec<u8>) {
    let want = with_simd_level(SimdLevel::Portable, || f(1)).unwrap();
    on_every_level(|| {
        for threads in [1, 2] {
            let got = f(threads);
            assert!(got.len() == want.len());
            if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
                panic!(
                    "{what}, {threads} threads: byte {i} is {:#04x}, not {:#04x}",
                    got[i], want[i]
                );
            }
        }
    });
}

#[test]
fn fp8_expansion_streams_and_splits_to_the_same_bits() {
    // 2053 x 2111 codes: 8.7 MB of bf16, past the streaming threshold; no dimension a multiple
    // of anything the kernels step by.
    let (rows, cols) = (2053usize, 2111usize);
    let n = rows * cols;
    let row_scales: Vec<f32> = (0..rows).map(|r| 1e-3 * (1.0 + r as f32 * 0.37)).collect();
    let tiles = rows.div_ceil(128) * cols.div_ceil(128);
    let block_scales: Vec<f32> = (0..tiles).map(|t| 0.02 + t as f32 * 1.3e-3).collect();
    let scales = [
        Scale::None,
        Scale::PerTensor(3.7e-3),
        Scale::PerRow(&row_scales),
        Scale::Block {
            scales: &block_scales,
            block: 128,
        },
    ];
    // The pairs with hand-written kernels (the others' split is checked on smaller shapes in
    // dtype_kernels.rs; debug builds make every run here cost).
    for (st, dt, scales) in [
        (DType::F8E4M3, DType::BF16, &scales[..]),
        (DType::F8E5M2, DType::BF16, &scales[..]),
        (DType::F8E4M3, DType::F32, &scales[..]),
        (DType::F8E4M3, DType::F16, &scales[..3]),
    ] {
        // One byte more, so the source slice starts unaligned.
        let raw = data(n + 1, 11, st);
        for scale in scales {
            same_everywhere(&format!("{st}->{dt} {scale:?}"), |threads| {
                let mut out = vec![0u8; n * dt.size() + 2];
                let d = &mut out[2..];
                expand(&raw[1..], st, d, dt, (rows, cols), scale, threads).unwrap();
                out
            });
        }
    }
}

#[test]
fn block_scales_on_whole_tiles_stream_and_split_to_the_same_bits() {
    // The usual block-scaled shape: rows of whole 128-code tiles into a 64-byte aligned output,
    // so every streamed row starts on a step and runs tile by tile; 1000 rows (8.7 MB of bf16)
    // split mid block row on two threads.
    let (rows, cols) = (1000usize, 34 * 128usize);
    let n = rows * cols;
    let tiles = rows.div_ceil(128) * cols.div_ceil(128);
    let block_scales: Vec<f32> = (0..tiles).map(|t| 0.5 + t as f32 * 0.013).collect();
    let scale = Scale::Block {
        scales: &block_scales,
        block: 128,
    };
    for st in [DType::F8E4M3, DType::F8E5M2] {
        let raw = data(n, 19, st);
        same_everywhere(&format!("{st}->bf16 whole tiles"), |threads| {
            let mut out = vec![0u8; n * 2 + 64];
            let lead = out.as_ptr().align_offset(64);
            let d = &mut out[lead..lead + n * 2];
            expand(&raw, st, d, DType::BF16, (rows, cols), &scale, threads).unwrap();
            d.to_vec()
        });
    }
}

#[test]
fn wide_casts_stream_and_split_to_the_same_bits() {
    // 8.7 MB of bf16 or f16 out; the output starts 6 bytes into its buffer.
    let n = 4_333_333;
    let raw = data(n * 4, 13, DType::F32);
    for dt in [DType::BF16, DType::F16] {
        same_everywhere(&format!("f32->{dt}"), |threads| {
            let mut out = vec![0u8; n * 2 + 6];
            cast(&raw, DType::F32, &mut out[6..], dt, threads).unwrap();
            out
        });
    }
}

#[test]
fn quantization_streams_and_splits_to_the_same_bits() {
    // 8.4 M codes from bf16 and f16 (the sources with hand-written kernels), past the streaming
    // threshold; the output starts 3 bytes into its buffer; the scales are compared too.
    let (rows, cols) = (2053usize, 4111usize);
    let n = rows * cols;
    for st in [DType::BF16, DType::F16] {
        let raw = data(n * 2, 17, st);
        for (g, groups) in [
            (QuantGranularity::PerRow, rows),
            (QuantGranularity::PerTensor, 1),
        ] {
            same_everywhere(&format!("{st} {g:?}"), |threads| {
                let mut out = vec![0u8; n + 3];
                let mut scales = vec![0f32; groups];
                let q = &mut out[3..];
                quantize_fp8(&raw, st, (rows, cols), g, q, &mut scales, threads).unwrap();
                out.extend(scales.iter().flat_map(|s| s.to_le_bytes()));
                out
            });
        }
    }
}

//! The storage dtype of the prefetch engine: RAM-tier blocks converted on load (bf16 casts, fp8
//! and int8 per-row quantization, GGML Q8_0 blocks), checked tensor by tensor against the scalar reference conversions, and
//! against the planner's count of the same blocks.

mod common;

use common::{Dir, Rng};
use std::path::{Path, PathBuf};

use trash_panda::dtype::{
    bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, f32_to_fp8_e4m3fn,
    quantize_fp8, QuantGranularity, FP8_E4M3FN_MAX,
};
use trash_panda::io::ReadMode;
use trash_panda::plan::{plan, Figures, ModelBlocks, PlanOptions, TensorSizes};
use trash_panda::stream::{
    Engine, EngineOptions, RamSource, SourceTier, StagedLayout, StreamBlock, StreamError,
    StreamTensor, TENSOR_ALIGN,
};
use trash_panda::DType;

/// The tensors of the test model: (name, dtype, shape, block). Blocks 0 and 1 are RAM tier,
/// block 2 disk tier. Sizes straddle the fp8 threshold (1 Mi elements).
fn specs() -> Vec<(String, DType, Vec<usize>, usize)> {
    let l = |b: usize, n: &str| format!("model.layers.{b}.{n}");
    vec![
        (l(0, "mlp.weight"), DType::F32, vec![1024, 1040], 0),
        (l(0, "attn.weight"), DType::BF16, vec![1024, 1024], 0),
        (l(0, "norm.weight"), DType::F32, vec![300], 0),
        (l(0, "small.weight"), DType::F16, vec![64, 48], 0),
        (l(0, "small32.weight"), DType::F32, vec![40, 24], 0),
        (l(0, "mlp.weight_scale"), DType::F32, vec![1024], 0),
        (l(0, "bias"), DType::F64, vec![33], 0),
        (l(0, "ids"), DType::I64, vec![10], 0),
        (l(1, "proj.weight"), DType::F16, vec![1025, 1024], 1),
        (l(1, "norm.weight"), DType::BF16, vec![1024], 1),
        (l(1, "empty.weight"), DType::F32, vec![0, 16], 1),
        (l(2, "mlp.weight"), DType::F32, vec![256, 300], 2),
        (l(2, "norm.weight"), DType::F32, vec![256], 2),
    ]
}

fn encode(dtype: DType, x: f32) -> Vec<u8> {
    match dtype {
        DType::F32 => x.to_le_bytes().to_vec(),
        DType::F64 => f64::from(x).to_le_bytes().to_vec(),
        DType::BF16 => f32_to_bf16_bits(x).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f32(x).to_bits().to_le_bytes().to_vec(),
        DType::I64 => (x as i64).to_le_bytes().to_vec(),
        other => unreachable!("{other}"),
    }
}

fn decode(dtype: DType, b: &[u8]) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()),
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()) as f32,
        DType::BF16 => bf16_bits_to_f32(u16::from_le_bytes(b.try_into().unwrap())),
        DType::F16 => f16_bits_to_f32(u16::from_le_bytes(b.try_into().unwrap())),
        other => unreachable!("{other}"),
    }
}

/// One file holding every tensor at 8-byte aligned offsets (as safetensors does), rows of very
/// different magnitudes so per-row scales differ; returns it, the blocks and the file bytes.
fn checkpoint(dir: &Path) -> (PathBuf, Vec<StreamBlock>, Vec<u8>) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut data = vec![0u8; 24];
    let mut blocks: Vec<StreamBlock> = (0..3)
        .map(|b| StreamBlock {
            name: format!("model.layers.{b}."),
            tier: if b < 2 {
                SourceTier::Ram
            } else {
                SourceTier::Disk
            },
            tensors: Vec::new(),
        })
        .collect();
    for (name, dtype, shape, block) in specs() {
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let numel: usize = shape.iter().product();
        let start = data.len() as u64;
        for i in 0..numel {
            let mag = 2f32.powi((i / cols % 24) as i32 - 12);
            data.extend(encode(dtype, rng.float(mag)));
        }
        let end = data.len() as u64;
        data.resize(data.len().next_multiple_of(8) + 8, 0);
        blocks[block].tensors.push(StreamTensor {
            name,
            file: 0,
            start,
            end,
            dtype,
            shape,
            rows: None,
        });
    }
    let path = dir.join("model.safetensors");
    std::fs::write(&path, &data).unwrap();
    (path, blocks, data)
}

/// The expected staged form of `t` under `storage`: (dtype, bytes, per-row scales), from the
/// scalar functions.
fn reference(t: &StreamTensor, src: &[u8], storage: DType) -> (DType, Vec<u8>, Option<Vec<u8>>) {
    let numel: usize = t.shape.iter().product();
    let is_scale = t.name.ends_with("_scale");
    let keep = (t.dtype, src.to_vec(), None);
    let eight_bit = matches!(storage, DType::F8E4M3 | DType::I8 | DType::Q8_0);
    let narrow = if eight_bit { 1 } else { storage.size() };
    if !t.dtype.is_float() || is_scale || t.dtype.size() <= narrow {
        return keep;
    }
    let ds = t.dtype.size();
    if storage == DType::BF16 {
        let out = src
            .chunks_exact(ds)
            .flat_map(|b| f32_to_bf16_bits(decode(t.dtype, b)).to_le_bytes())
            .collect();
        return (DType::BF16, out, None);
    }
    let [rows, cols] = t.shape[..] else {
        return keep;
    };
    if numel < 1 << 20 || (storage == DType::Q8_0 && !cols.is_multiple_of(32)) {
        return keep;
    }
    let values: Vec<f32> = src.chunks_exact(ds).map(|b| decode(t.dtype, b)).collect();
    if storage == DType::Q8_0 {
        // Per run of 32: d = amax / 127, codes rounded half away from zero, d stored as f16.
        let mut out = Vec::with_capacity(numel / 32 * 34);
        for b in values.chunks_exact(32) {
            let d = b.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            out.extend(f32_to_f16_bits(d).to_le_bytes());
            out.extend(b.iter().map(|x| (x * id).round() as i8 as u8));
        }
        return (DType::Q8_0, out, None);
    }
    if storage == DType::I8 {
        // Per row: scale = amax / 127 (1 for a zero row), codes rounded half to even.
        let (mut q, mut scales) = (Vec::with_capacity(numel), Vec::with_capacity(rows * 4));
        for row in values.chunks_exact(cols) {
            let amax = row
                .iter()
                .filter(|x| !x.is_nan())
                .fold(0f32, |m, x| m.max(x.abs()));
            let s = amax / 127.0;
            let s = if s > 0.0 && s.is_finite() { s } else { 1.0 };
            q.extend(
                row.iter()
                    .map(|x| (x / s).round_ties_even().clamp(-127.0, 127.0) as i8 as u8),
            );
            scales.extend(s.to_le_bytes());
        }
        return (DType::I8, q, Some(scales));
    }
    // The documented formula, element by element.
    let mut q = vec![0u8; numel];
    let mut scales = Vec::with_capacity(rows * 4);
    for r in 0..rows {
        let row: Vec<f32> = src[r * cols * ds..(r + 1) * cols * ds]
            .chunks_exact(ds)
            .map(|b| decode(t.dtype, b))
            .collect();
        let amax = row
            .iter()
            .filter(|x| !x.is_nan())
            .fold(0f32, |m, x| m.max(x.abs()));
        let s = amax / FP8_E4M3FN_MAX;
        let s = if s > 0.0 && s.is_finite() { s } else { 1.0 };
        for (c, x) in row.iter().enumerate() {
            let v = (x / s).clamp(-FP8_E4M3FN_MAX, FP8_E4M3FN_MAX);
            q[r * cols + c] = f32_to_fp8_e4m3fn(v);
        }
        scales.extend(s.to_le_bytes());
    }
    // And the kernel on the original bytes agrees with it.
    let mut kq = vec![0u8; numel];
    let mut ks = vec![0f32; rows];
    let g = QuantGranularity::PerRow;
    quantize_fp8(src, t.dtype, (rows, cols), g, &mut kq, &mut ks, 1).unwrap();
    assert!(kq == q, "{}: quantize_fp8 differs from the formula", t.name);
    (DType::F8E4M3, q, Some(scales))
}

fn options(storage: DType, ram_source: RamSource, lookahead: usize) -> EngineOptions {
    EngineOptions {
        storage: Some(storage),
        lookahead,
        workers: 2,
        disk_mode: ReadMode::Direct,
        ram_source,
        chunk_size: 256 << 10,
        ..EngineOptions::default()
    }
}

#[test]
fn storage_conversion_matches_the_reference_and_the_planner() {
    let dir = Dir::new("stream_storage_convert");
    let (path, blocks, data) = checkpoint(&dir.0);
    let sizes: Vec<TensorSizes> = blocks
        .iter()
        .flat_map(|b| &b.tensors)
        .map(|t| TensorSizes::new(t.name.as_str(), t.dtype, &t.shape))
        .collect();
    let model = ModelBlocks::discover(sizes);
    let stored = StagedLayout::new(&blocks, 1).unwrap();
    for storage in [DType::BF16, DType::F8E4M3, DType::I8, DType::Q8_0] {
        let mut refs = Vec::new();
        for b in &blocks {
            refs.push(
                b.tensors
                    .iter()
                    .map(|t| {
                        let src = &data[t.start as usize..t.end as usize];
                        match b.tier {
                            SourceTier::Ram => reference(t, src, storage),
                            SourceTier::Disk => (t.dtype, src.to_vec(), None),
                        }
                    })
                    .collect::<Vec<_>>(),
            );
        }
        let converted = |b: usize| {
            blocks[b]
                .tensors
                .iter()
                .zip(&refs[b])
                .filter(|(t, r)| r.0 != t.dtype)
        };
        let expect_converted = (0..2).flat_map(converted).count() as u64;
        // bf16: the f32 and f64 tensors but the scale tensor; fp8 and int8: the three large 2-D
        // weights (one of them exactly at the threshold); q8_0: the two whose rows are whole
        // blocks of 32.
        let want = match storage {
            DType::BF16 => 5,
            DType::Q8_0 => 2,
            _ => 3,
        };
        assert_eq!(expect_converted, want, "{storage}");
        let saved: u64 = (0..2)
            .flat_map(converted)
            .map(|(t, r)| t.end - t.start - (r.1.len() + r.2.as_ref().map_or(0, Vec::len)) as u64)
            .sum();

        // The planner counts what the engine stages for the RAM tier.
        let opts = PlanOptions {
            storage_dtype: Some(storage),
            ..PlanOptions::default()
        };
        let p = plan(&model, &Figures::injected(1 << 40, None), &opts).unwrap();
        let layout = StagedLayout::with_storage(&blocks, 1, Some(storage)).unwrap();
        for (b, block) in blocks[..2].iter().enumerate() {
            let bp = p.blocks.iter().find(|x| x.name == block.name).unwrap();
            assert_eq!(
                bp.storage_bytes,
                layout.block_bytes(b),
                "{storage} block {b}"
            );
            assert!(layout.is_converted(b));
        }
        assert!(!layout.is_converted(2));
        assert_eq!(layout.layout(2), stored.layout(2));
        // The pool is sized from the converted blocks, which are smaller than the stored ones.
        let largest = (0..3).map(|b| layout.block_len(b)).max().unwrap();
        assert_eq!(layout.max_block_len(), largest.next_multiple_of(4096));
        assert!(layout.max_block_len() < stored.max_block_len(), "{storage}");

        for (ram_source, lookahead) in [
            (RamSource::Mapped, 1),
            (RamSource::InMemory { threads: 2 }, 2),
        ] {
            let what = format!("{storage} {ram_source:?}");
            let opts = options(storage, ram_source, lookahead);
            let e = Engine::new(blocks.clone(), vec![path.clone()], opts).unwrap();
            assert_eq!(
                e.staging_bytes(),
                (lookahead + 1) * layout.max_block_len(),
                "{what}"
            );
            assert_eq!(e.staging_buffers()[0].1, layout.max_block_len());
            if matches!(ram_source, RamSource::InMemory { .. }) {
                let load = e.load_ram_tier().unwrap();
                let ram_file: u64 = blocks[..2]
                    .iter()
                    .flat_map(|b| &b.tensors)
                    .map(|t| t.end - t.start)
                    .sum();
                assert_eq!(load.bytes, ram_file, "{what}");
            }
            for pass in 0..2 {
                for (b, block) in blocks.iter().enumerate() {
                    let lease = e.acquire(b).unwrap();
                    let staged = e.layout(b).unwrap();
                    for (i, t) in block.tensors.iter().enumerate() {
                        let (dtype, bytes, scales) = &refs[b][i];
                        let s = &staged[i];
                        assert_eq!((&s.name, &s.dtype, &s.shape), (&t.name, dtype, &t.shape));
                        assert!(lease.tensor(i).unwrap() == &bytes[..], "{what} {}", t.name);
                        assert!(lease.tensor(t.name.as_str()).unwrap() == &bytes[..]);
                        let got = lease.scale(i).unwrap();
                        assert_eq!(got.map(<[u8]>::to_vec), *scales, "{what} {}", t.name);
                        assert_eq!(s.scale.is_some(), scales.is_some());
                        // Converted or not, RAM or disk: every tensor 64-byte aligned.
                        assert!(s.offset.is_multiple_of(TENSOR_ALIGN), "{what} {}", t.name);
                        if let Some(sc) = s.scale {
                            assert!(sc.offset >= s.offset + s.len);
                            assert!(sc.offset.is_multiple_of(TENSOR_ALIGN));
                        }
                    }
                    assert_eq!(lease.bytes().len(), layout.block_len(b));
                    drop(lease);
                    if pass == 0 && b == 0 {
                        let st = e.stats();
                        assert!(st.ram_load.is_some(), "{what}: loaded by the first worker");
                        assert_eq!(st.converted_tensors, expect_converted, "{what}");
                        assert_eq!(st.converted_bytes_saved, saved, "{what}");
                    }
                }
            }
            assert!(e.wait_idle(std::time::Duration::from_secs(10)));
            let st = e.stats();
            for (b, bs) in st.blocks.iter().enumerate() {
                assert_eq!(bs.bytes, bs.stagings * layout.block_bytes(b), "{what}");
            }
            e.reset_stats();
            let st = e.stats();
            assert!(st.ram_load.is_some() && st.converted_tensors > 0 && st.convert_seconds >= 0.0);
        }
    }
}

#[test]
fn unsupported_storage_dtypes_are_refused() {
    let dir = Dir::new("stream_storage_bad");
    let (path, blocks, _) = checkpoint(&dir.0);
    for bad in [DType::F16, DType::F32, DType::F8E5M2, DType::U8] {
        let opts = options(bad, RamSource::Mapped, 1);
        let err = Engine::new(blocks.clone(), vec![path.clone()], opts).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                &err,
                StreamError::InvalidOptions {
                    option: "storage",
                    ..
                }
            ),
            "{msg}"
        );
        assert!(msg.contains("bf16") && msg.contains("fp8") && msg.contains(&bad.to_string()));
        assert!(StagedLayout::with_storage(&blocks, 1, Some(bad)).is_err());
    }
}

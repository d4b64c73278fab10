//! The staging layout: alignment, the read area, settling runs, converted blocks.
use super::*;
use crate::rules::{SourceTier, StreamTensor};

fn t(name: &str, file: usize, start: u64, end: u64) -> StreamTensor {
    StreamTensor {
        name: name.into(),
        file,
        start,
        end,
        dtype: DType::U8,
        shape: vec![(end.max(start) - start) as usize],
        rows: None,
    }
}

/// Stages `block` the way the disk worker does (each run read into the read area, then
/// settled) from files of pattern bytes, and checks every tensor's bytes and alignment.
fn stage_like_disk(block: &StreamBlock, files: usize) -> StagedLayout {
    let l = StagedLayout::new(std::slice::from_ref(block), files).unwrap();
    let b = &l.blocks[0];
    let byte = |file: usize, at: u64| (at.wrapping_mul(31) ^ (file as u64 * 7)) as u8;
    let mut buf = vec![0xAAu8; l.max_block_len()];
    assert!(b.read_area.end <= b.len && b.len <= buf.len());
    assert!(b.read_area.start.is_multiple_of(DIRECT_ALIGN));
    for run in &b.runs {
        assert!(b.read_area.start <= run.buf_offset && run.buf_range().end <= b.read_area.end);
        assert_eq!(
            run.buf_offset % DIRECT_ALIGN,
            (run.start % DIRECT_ALIGN as u64) as usize
        );
        for (k, at) in (run.start..run.end).enumerate() {
            buf[run.buf_offset + k] = byte(run.file, at);
        }
        b.settle(run, &mut buf);
    }
    for (t, s) in block.tensors.iter().zip(l.layout(0)) {
        assert!(s.offset.is_multiple_of(TENSOR_ALIGN), "{}", t.name);
        assert!(s.offset + s.len <= b.len);
        let want: Vec<u8> = (t.start..t.end).map(|at| byte(t.file, at)).collect();
        assert!(buf[s.offset..s.offset + s.len] == want[..], "{}", t.name);
    }
    l
}

#[test]
fn tensors_are_aligned_and_runs_keep_file_alignment() {
    let block = StreamBlock {
        name: "b".into(),
        tier: SourceTier::Disk,
        tensors: vec![
            t("w2", 0, 5000, 9000),
            t("w1", 0, 100, 5000),
            t("far", 0, 1 << 20, (1 << 20) + 10),
            t("other", 1, 8, 16),
            t("empty", 1, 16, 16),
        ],
    };
    let l = stage_like_disk(&block, 2);
    let b = &l.blocks[0];
    assert_eq!(b.runs.len(), 3);
    assert_eq!(b.payload, 4000 + 4900 + 10 + 8);
    let names: Vec<_> = l.layout(0).iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["w2", "w1", "far", "other", "empty"]);
    // Packed in file order: w1, w2, far, other, empty.
    let s = l.layout(0);
    let offsets: Vec<_> = s.iter().map(|s| s.offset).collect();
    assert_eq!(offsets, [4928, 0, 8960, 8960 + 64, 8960 + 128]);
    // The runs' 100-byte head start covers the packing: no shift, and the block needs no
    // more than the read area.
    assert_eq!(l.read_area(0), 0..5 * DIRECT_ALIGN);
    assert_eq!(b.len, l.read_area(0).end);
    for w in b.runs.windows(2) {
        assert!(w[0].buf_range().end <= w[1].buf_offset);
    }

    let ram = StreamBlock {
        tier: SourceTier::Ram,
        ..block
    };
    let r = StagedLayout::new(&[ram], 2).unwrap();
    assert_eq!(r.layout(0), l.layout(0));
    assert_eq!((r.read_area(0), r.block_len(0)), (0..0, 8960 + 128));
}

#[test]
fn many_small_tensors_shift_the_read_area() {
    // 200 tensors of 8 bytes back to back from a page boundary: packed they take 64 bytes
    // each, so the read area must start 3 pages in for the moves to stay ahead of the reads.
    let tensors = (0..200)
        .map(|k| t(&format!("t{k}"), 0, 4096 + 8 * k, 4096 + 8 * k + 8))
        .collect();
    let block = StreamBlock {
        name: "tiny".into(),
        tier: SourceTier::Disk,
        tensors,
    };
    let l = stage_like_disk(&block, 1);
    assert_eq!(l.read_area(0), 3 * DIRECT_ALIGN..4 * DIRECT_ALIGN);
    assert_eq!(l.block_len(0), 4 * DIRECT_ALIGN);
}

proptest::proptest! {
    #[test]
    fn settle_reproduces_every_tensor(
        spec in proptest::collection::vec((0usize..2, 0u64..3000, 0u64..600, 0u64..3), 1..40)
    ) {
        // Tensors at 8-byte offsets, some tiny, some overlapping or repeated, over two files.
        let tensors = spec
            .iter()
            .enumerate()
            .map(|(k, &(file, at, len, rep))| {
                let start = at * 8 + rep * 4096;
                t(&format!("t{k}"), file, start, start + len)
            })
            .collect();
        let block = StreamBlock { name: "p".into(), tier: SourceTier::Disk, tensors };
        stage_like_disk(&block, 2);
    }
}

#[test]
fn converted_blocks_are_packed_with_scales_after_their_tensor() {
    let f = |name: &str, start: u64, dtype: DType, shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        StreamTensor {
            name: name.into(),
            file: 0,
            start,
            end: start + (n * dtype.size()) as u64,
            dtype,
            shape,
            rows: None,
        }
    };
    let tensors = vec![
        f("norm.weight", 8, DType::F32, vec![3]),
        f("w.weight", 5000, DType::F32, vec![1024, 1024]),
        f("ids", 20, DType::I64, vec![1]),
    ];
    let ram = StreamBlock {
        name: "r".into(),
        tier: SourceTier::Ram,
        tensors: tensors.clone(),
    };
    let disk = StreamBlock {
        tier: SourceTier::Disk,
        ..ram.clone()
    };
    let l = StagedLayout::with_storage(&[ram, disk.clone()], 1, Some(DType::F8E4M3)).unwrap();
    let s = l.layout(0);
    // Packed in file order: norm (at 8), ids (at 20), then the weight (at 5000).
    assert_eq!((s[0].offset, s[0].len, s[0].dtype), (0, 12, DType::F32));
    assert_eq!((s[2].offset, s[2].len), (64, 8));
    assert_eq!(
        (s[1].offset, s[1].len, s[1].dtype),
        (128, 1 << 20, DType::F8E4M3)
    );
    let scale = s[1].scale.unwrap();
    assert_eq!((scale.offset, scale.len), (128 + (1 << 20), 4096));
    assert_eq!(l.block_len(0), scale.offset + 4096);
    assert_eq!(l.block_bytes(0), 12 + (1 << 20) + 4096 + 8);
    assert!(l.is_converted(0) && !l.is_converted(1));
    assert_eq!(
        l.layout(1),
        StagedLayout::new(&[disk], 1).unwrap().layout(0)
    );
    assert!(l.layout(1).iter().all(|t| t.scale.is_none()));

    let mut bad = tensors[0].clone();
    bad.shape = vec![4];
    let block = StreamBlock {
        name: "z".into(),
        tier: SourceTier::Disk,
        tensors: vec![bad],
    };
    let e = StagedLayout::new(&[block], 1).unwrap_err().to_string();
    assert!(e.contains("norm.weight") && e.contains("needs 16"), "{e}");
}

#[test]
fn rejects_bad_file_and_range() {
    let bad_file = StreamBlock {
        name: "x".into(),
        tier: SourceTier::Ram,
        tensors: vec![t("a", 3, 0, 1)],
    };
    let e = StagedLayout::new(&[bad_file], 1).unwrap_err();
    assert!(e.to_string().contains("block 0 (x)"), "{e}");
    let reversed = StreamBlock {
        name: "y".into(),
        tier: SourceTier::Ram,
        tensors: vec![t("a", 0, 9, 1)],
    };
    assert!(StagedLayout::new(&[reversed], 1).is_err());
}

//! Where each tensor of a block sits inside its staging buffer.
//!
//! The tensors of a block are grouped into runs: tensors of one file that lie next to each other
//! (gaps up to [`MERGE_GAP`]). A run is staged at a buffer offset congruent to its file offset
//! modulo [`DIRECT_ALIGN`], so an O_DIRECT read of the whole run lands straight in the staging
//! buffer with no bounce copy, in requests as large as the chunk size. A consequence: a tensor has
//! the same alignment in the buffer as in its file (at least 8 bytes in a safetensors file), not a
//! fixed 64; packing tensors at 64-byte offsets would have made almost every direct read go through
//! a bounce buffer, because safetensors data is only 8-byte aligned.

use std::ops::Range;

use super::{StreamBlock, StreamError};
use crate::io::DIRECT_ALIGN;

/// Tensors of one file closer than this are read in one request, gap included: a gap this small
/// costs less drive time than a second request.
pub const MERGE_GAP: u64 = 64 << 10;

/// One tensor's place in the staging buffer of its block.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StagedTensor {
    pub name: String,
    /// Offset of the tensor's first byte in the staging buffer.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

/// Contiguous bytes of one file staged with one read.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub file: usize,
    /// File range of the run (from its first tensor's start to its last tensor's end).
    pub start: u64,
    pub end: u64,
    /// Buffer offset of the run's first byte (`start`).
    pub buf_offset: usize,
    /// Indices (in the block's tensor order) of the tensors in this run.
    pub tensors: Vec<usize>,
}

impl Run {
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// The buffer range the run's bytes occupy.
    pub fn buf_range(&self) -> Range<usize> {
        self.buf_offset..self.buf_offset + self.len()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BlockLayout {
    pub tensors: Vec<StagedTensor>,
    pub runs: Vec<Run>,
    /// Bytes of staging buffer the block needs (runs plus alignment padding).
    pub len: usize,
    /// Sum of the tensors' lengths: the bytes a staging of this block moves.
    pub payload: u64,
}

/// The staging layout of every streamed block, computed once when the engine is created.
#[derive(Debug, Clone)]
pub struct StagedLayout {
    pub(crate) blocks: Vec<BlockLayout>,
}

impl StagedLayout {
    /// Lays out `blocks`, whose tensors name files `0..file_count`.
    pub fn new(blocks: &[StreamBlock], file_count: usize) -> Result<Self, StreamError> {
        let blocks = blocks
            .iter()
            .enumerate()
            .map(|(i, b)| lay_out(i, b, file_count))
            .collect::<Result<_, _>>()?;
        Ok(StagedLayout { blocks })
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Every tensor of `block`, in the block's tensor order, with its offset and length in the
    /// staging buffer. Panics if `block` is out of range.
    pub fn layout(&self, block: usize) -> &[StagedTensor] {
        &self.blocks[block].tensors
    }

    /// Bytes of staging buffer `block` needs (what `Lease::bytes` covers).
    pub fn block_len(&self, block: usize) -> usize {
        self.blocks[block].len
    }

    /// Sum of the tensor lengths of `block`.
    pub fn block_bytes(&self, block: usize) -> u64 {
        self.blocks[block].payload
    }

    /// The staging buffer size: the largest block, rounded to the page size.
    pub fn max_block_len(&self) -> usize {
        let max = self.blocks.iter().map(|b| b.len).max().unwrap_or(0);
        max.next_multiple_of(DIRECT_ALIGN).max(DIRECT_ALIGN)
    }

    /// Bytes of the staging pool an engine with this `lookahead` allocates (for the planner).
    pub fn pool_bytes(&self, lookahead: usize) -> usize {
        self.max_block_len() * (lookahead + 1)
    }
}

fn lay_out(
    index: usize,
    block: &StreamBlock,
    file_count: usize,
) -> Result<BlockLayout, StreamError> {
    let invalid = |reason: String| StreamError::InvalidBlock {
        block: index,
        name: block.name.clone(),
        reason,
    };
    for t in &block.tensors {
        if t.file >= file_count {
            return Err(invalid(format!(
                "tensor {} names file {} but there are {file_count} files",
                t.name, t.file
            )));
        }
        if t.start > t.end {
            return Err(invalid(format!(
                "tensor {} has a reversed range {}..{}",
                t.name, t.start, t.end
            )));
        }
    }
    let mut order: Vec<usize> = (0..block.tensors.len()).collect();
    order.sort_by_key(|&i| {
        (
            block.tensors[i].file,
            block.tensors[i].start,
            block.tensors[i].end,
        )
    });

    let mut runs: Vec<Run> = Vec::new();
    for i in order {
        let t = &block.tensors[i];
        match runs.last_mut() {
            Some(r) if r.file == t.file && t.start <= r.end.saturating_add(MERGE_GAP) => {
                r.end = r.end.max(t.end);
                r.tensors.push(i);
            }
            _ => runs.push(Run {
                file: t.file,
                start: t.start,
                end: t.end,
                buf_offset: 0,
                tensors: vec![i],
            }),
        }
    }

    let mut tensors: Vec<StagedTensor> = block
        .tensors
        .iter()
        .map(|t| StagedTensor {
            name: t.name.clone(),
            offset: 0,
            len: (t.end - t.start) as usize,
        })
        .collect();
    // Each run starts on a fresh page at the same in-page offset as in its file.
    let mut page = 0usize;
    for r in &mut runs {
        let in_page = (r.start % DIRECT_ALIGN as u64) as usize;
        r.buf_offset = page + in_page;
        for &i in &r.tensors {
            tensors[i].offset = r.buf_offset + (block.tensors[i].start - r.start) as usize;
        }
        page = (r.buf_offset + r.len()).next_multiple_of(DIRECT_ALIGN);
    }
    let payload = block.tensors.iter().map(|t| t.end - t.start).sum();
    Ok(BlockLayout {
        tensors,
        runs,
        len: page,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{SourceTier, StreamTensor};

    fn t(name: &str, file: usize, start: u64, end: u64) -> StreamTensor {
        StreamTensor {
            name: name.into(),
            file,
            start,
            end,
        }
    }

    #[test]
    fn runs_keep_file_alignment_and_do_not_overlap() {
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
        let l = StagedLayout::new(&[block], 2).unwrap();
        let b = &l.blocks[0];
        assert_eq!(b.runs.len(), 3);
        assert_eq!(b.payload, 4000 + 4900 + 10 + 8);
        let names: Vec<_> = l.layout(0).iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["w2", "w1", "far", "other", "empty"]);
        let s = l.layout(0);
        assert_eq!(s[1].offset % DIRECT_ALIGN, 100);
        assert_eq!(s[0].offset, s[1].offset + 4900);
        assert_eq!(s[2].offset % DIRECT_ALIGN, (1 << 20) % DIRECT_ALIGN);
        assert!(s[2].offset >= s[0].offset + 4000);
        assert_eq!(s[3].offset % DIRECT_ALIGN, 8);
        assert_eq!(b.len % DIRECT_ALIGN, 0);
        for w in b.runs.windows(2) {
            assert!(w[0].buf_range().end <= w[1].buf_offset);
        }
        assert_eq!(l.pool_bytes(2), 3 * l.max_block_len());
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
}

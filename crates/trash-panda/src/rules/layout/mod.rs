//! Where each tensor of a block sits inside its staging buffer.
//!
//! Every staged tensor starts at an aligned offset ([`TENSOR_ALIGN`], 64 bytes, for the CPU;
//! [`DEVICE_TENSOR_ALIGN`](super::DEVICE_TENSOR_ALIGN), 512, for a GPU), so the Python layer can
//! use it in place: kernels take different (and differently rounding) paths for weights that are
//! not aligned like the allocator's own blocks, and safetensors data is only 8-byte aligned in
//! its file.
//!
//! This is the pure computation: offsets, runs, read areas, and moving a run's bytes to their
//! packed places in a buffer (`BlockLayout::settle`). Reading runs from files, the staging
//! buffers and the leases are the engine's (`stream`).
//!
//! - Converted blocks (a storage dtype, RAM tier) are packed in file order, each tensor's per-row
//!   scales (if it was quantized) right after it; the load writes them into private images.
//! - Blocks staged as stored are packed in file order (by file, then offset). Their tensors are
//!   grouped into runs: tensors of one file that lie next to each other (gaps up to
//!   [`MERGE_GAP`]). The RAM tier copies each tensor from its map (or in-memory image) to its
//!   place. The disk tier reads each run with large requests into a *read area* of the same
//!   buffer, at a buffer offset congruent to the run's file offset modulo [`DIRECT_ALIGN`], so an
//!   O_DIRECT read lands there with no bounce copy; the worker then moves each tensor down to its
//!   packed place (see `BlockLayout::settle`). The read area starts at a page boundary far enough
//!   in (usually 0, at most a few pages) that moving the tensors in file order never overwrites
//!   bytes not yet moved, so it overlaps the packed area instead of doubling the buffer.

use std::ops::Range;

use super::block::{is_row_order, SourceTier, StreamBlock};
use super::conversion::{check_storage, tensor_conversion, Conversion};
use super::error::RuleError;
use super::staging::{buffer_len, tensor_in_place_eligible, MAP_GRAIN, TENSOR_ALIGN};
use crate::io::DIRECT_ALIGN;
use crate::DType;

/// Tensors of one file closer than this are read in one request, gap included: a gap this small
/// costs less drive time than a second request.
pub const MERGE_GAP: u64 = 64 << 10;

/// One tensor's place in the staging buffer of its block, and what its bytes are there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StagedTensor {
    /// The tensor's name in the checkpoint.
    pub name: String,
    /// Offset of the tensor's first byte in the staging buffer.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// The dtype of the bytes in the buffer: the file's, or the storage dtype it was converted to.
    pub dtype: DType,
    /// Elements along each dimension, outermost first.
    pub shape: Vec<usize>,
    /// Where the per-row dequantization scales of a tensor the engine quantized to fp8 lie;
    /// `None` for every other tensor (a checkpoint's own scale tensors are tensors of their own).
    pub scale: Option<StagedScale>,
    /// The order the model takes the rows in, when it is not the stored one (see
    /// [`StreamTensor::rows`](super::StreamTensor::rows)).
    pub rows: Option<Vec<u32>>,
}

/// Per-row scales of a quantized tensor in the staging buffer: `len / 4` little-endian f32, one
/// per row; multiply a row by its scale to get the values back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StagedScale {
    /// Offset of the first scale in the staging buffer, in bytes.
    pub offset: usize,
    /// Length of the scales in bytes (4 per row).
    pub len: usize,
}

/// Contiguous bytes of one file read with one request (split at chunk boundaries).
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub file: usize,
    /// File range of the run (from its first tensor's start to its last tensor's end).
    pub start: u64,
    pub end: u64,
    /// Disk tier: buffer offset (in the read area) where the run's first byte (`start`) is read.
    /// Unused (0) for the RAM tier, which copies tensor by tensor.
    pub buf_offset: usize,
    /// Indices (in the block's tensor order) of the tensors in this run, in file order.
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
    /// The block's runs in file order; empty for a converted block.
    pub runs: Vec<Run>,
    /// Packed and filled from a converted private image (storage dtype set, RAM tier).
    pub converted: bool,
    /// Disk tier: the buffer range the runs are read into (page-aligned start; it may overlap
    /// the packed tensors, see [`settle`](Self::settle)). Empty for the RAM tier.
    pub read_area: Range<usize>,
    /// Bytes of staging buffer the block needs (packed tensors, and the read area).
    pub len: usize,
    /// File offset of each tensor's first byte, in block order.
    pub file_starts: Vec<u64>,
    /// Sum of the tensors' (and scales') lengths: the bytes a staging of this block moves.
    pub payload: u64,
    /// Used in place from a private map of its files (see [`in_place_eligible`]): its tensors
    /// are not copied into the staging buffer, which only takes the cold reads that bring their
    /// pages into the page cache.
    pub in_place: bool,
}

/// The staging layout of every streamed block, computed once when the engine is created.
#[derive(Debug, Clone)]
pub struct StagedLayout {
    pub(crate) blocks: Vec<BlockLayout>,
    align: usize,
}

impl BlockLayout {
    /// Bytes of the tensors of `run` (the run's range less the gaps between them).
    pub fn run_bytes(&self, run: &Run) -> u64 {
        run.tensors
            .iter()
            .map(|&i| self.tensors[i].len as u64)
            .sum()
    }

    /// Moves the tensors of `run` (read into `buf` at `run.buf_range()`) to their packed,
    /// 64-byte aligned places. Call it for each run in order, after the run is read: the read
    /// area is placed so that a tensor's new place never overlaps the bytes of a later tensor,
    /// of this run or a later one, that are still in the read area.
    pub fn settle(&self, run: &Run, buf: &mut [u8]) {
        for &i in &run.tensors {
            let t = &self.tensors[i];
            let from = self.read_offset(run, i);
            if from != t.offset {
                buf.copy_within(from..from + t.len, t.offset);
            }
        }
    }

    /// Where tensor `i` of `run` lies in the read area.
    fn read_offset(&self, run: &Run, i: usize) -> usize {
        run.buf_offset + (self.file_starts[i] - run.start) as usize
    }
}

impl StagedLayout {
    /// Lays out `blocks`, whose tensors name files `0..file_count`, as stored, for the CPU.
    pub fn new(blocks: &[StreamBlock], file_count: usize) -> Result<Self, RuleError> {
        Self::with_storage(blocks, file_count, None)
    }

    /// As [`build`](Self::build) for the CPU's alignment.
    pub fn with_storage(
        blocks: &[StreamBlock],
        file_count: usize,
        storage: Option<DType>,
    ) -> Result<Self, RuleError> {
        Self::build(blocks, file_count, storage, TENSOR_ALIGN, false)
    }

    /// Lays out `blocks` for an engine with storage dtype `storage`, every tensor at an `align`
    /// offset ([`TENSOR_ALIGN`] or [`DEVICE_TENSOR_ALIGN`](super::DEVICE_TENSOR_ALIGN)):
    /// RAM-tier blocks packed in their converted form, disk-tier blocks as stored, or, with
    /// `in_place`, used from the map where [`in_place_eligible`] allows. Errors on a storage
    /// dtype the engine does not convert to, or an alignment that is not a power of two from 64
    /// to a page.
    pub fn build(
        blocks: &[StreamBlock],
        file_count: usize,
        storage: Option<DType>,
        align: usize,
        in_place: bool,
    ) -> Result<Self, RuleError> {
        Self::build_in_place(blocks, file_count, storage, align, in_place, false)
    }

    /// As [`build`](Self::build), with RAM-tier blocks used in place too where `ram_in_place`
    /// (a RAM tier that is the checkpoint's map, no storage dtype: its pages are the file's, as
    /// the disk tier's are).
    pub fn build_in_place(
        blocks: &[StreamBlock],
        file_count: usize,
        storage: Option<DType>,
        align: usize,
        in_place: bool,
        ram_in_place: bool,
    ) -> Result<Self, RuleError> {
        check_storage(storage)?;
        if !align.is_power_of_two() || !(TENSOR_ALIGN..=DIRECT_ALIGN).contains(&align) {
            return Err(RuleError::Alignment { align });
        }
        let blocks = blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                check_tensors(i, b, file_count)?;
                Ok(match storage {
                    Some(dtype) if b.tier == SourceTier::Ram => pack(b, dtype, align),
                    _ if in_place && in_place_eligible(b, align) => lay_out_in_place(b),
                    _ if ram_in_place
                        && storage.is_none()
                        && b.tier == SourceTier::Ram
                        && tensors_in_place_eligible(b, align) =>
                    {
                        lay_out_in_place(b)
                    }
                    _ => lay_out(b, align),
                })
            })
            .collect::<Result<_, RuleError>>()?;
        Ok(StagedLayout { blocks, align })
    }

    /// The offset alignment of every staged tensor.
    pub fn align(&self) -> usize {
        self.align
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

    /// Sum of the staged tensor (and scale) lengths of `block`.
    pub fn block_bytes(&self, block: usize) -> u64 {
        self.blocks[block].payload
    }

    /// The buffer range a disk-tier `block`'s runs are read into before its tensors move to
    /// their aligned places (it may overlap them); empty for every other block. Inside
    /// `block_len(block)`, so inside every staging buffer.
    pub fn read_area(&self, block: usize) -> Range<usize> {
        self.blocks[block].read_area.clone()
    }

    /// Where each tensor of `block` lies in its patched image (a merged form of the block, kept
    /// where it lives), and the image's length: as staged, or for a block used in place (which
    /// stages nothing) its tensors packed at the CPU's alignment.
    pub fn image_places(&self, block: usize) -> (Vec<usize>, usize) {
        let b = &self.blocks[block];
        if !b.in_place {
            return (b.tensors.iter().map(|t| t.offset).collect(), b.len);
        }
        let mut at = 0;
        let places = b
            .tensors
            .iter()
            .map(|t| {
                let here = at;
                at = (at + t.len).next_multiple_of(TENSOR_ALIGN);
                here
            })
            .collect();
        (places, at.max(TENSOR_ALIGN))
    }

    /// Whether `block` is used in place from the map of its files (see [`in_place_eligible`]).
    pub fn is_in_place(&self, block: usize) -> bool {
        self.blocks[block].in_place
    }

    /// The bytes of `block`'s pages a process maps while the block runs in place: each run
    /// rounded out to [`MAP_GRAIN`] (0 for a staged block).
    pub fn mapped_bytes(&self, block: usize) -> u64 {
        let b = &self.blocks[block];
        if !b.in_place {
            return 0;
        }
        b.runs
            .iter()
            .map(|r| r.end.next_multiple_of(MAP_GRAIN) - (r.start - r.start % MAP_GRAIN))
            .sum()
    }

    /// Whether `block` is staged from a converted image (packed layout).
    pub fn is_converted(&self, block: usize) -> bool {
        self.blocks[block].converted
    }

    /// The staging buffer size: the largest block, rounded to the page size.
    pub fn max_block_len(&self) -> usize {
        buffer_len(self.blocks.iter().map(|b| b.len).max().unwrap_or(0))
    }
}

/// Checks every tensor's file, range, and that its range holds exactly its shape of its dtype.
fn check_tensors(index: usize, block: &StreamBlock, file_count: usize) -> Result<(), RuleError> {
    let invalid = |reason: String| RuleError::InvalidBlock {
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
        let elements = t
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        let want = elements.and_then(|n| t.dtype.bytes_for(n));
        if let Some(rows) = t.rows.as_deref().filter(|r| !is_row_order(&t.shape, r)) {
            return Err(invalid(format!(
                "tensor {} of shape {:?} has a row order of {} rows that is not an order of its rows",
                t.name,
                t.shape,
                rows.len()
            )));
        }
        if want != Some(t.end - t.start) {
            return Err(invalid(format!(
                "tensor {} has {} bytes ({}..{}) but shape {:?} of {} needs {}",
                t.name,
                t.end - t.start,
                t.start,
                t.end,
                t.shape,
                t.dtype,
                want.map_or("more than 2^64".to_owned(), |w| w.to_string())
            )));
        }
    }
    Ok(())
}

/// The packed layout of a RAM-tier block converted to `storage`, in file order (so its size
/// does not depend on the order the block lists its tensors in).
fn pack(block: &StreamBlock, storage: DType, align: usize) -> BlockLayout {
    let mut order: Vec<usize> = (0..block.tensors.len()).collect();
    order.sort_by_key(|&i| (block.tensors[i].file, block.tensors[i].start, i));
    let mut at = 0usize;
    let mut payload = 0u64;
    let mut tensors: Vec<Option<StagedTensor>> = vec![None; block.tensors.len()];
    for i in order {
        let t = &block.tensors[i];
        let (dtype, rows) = match tensor_conversion(t, storage) {
            Conversion::Keep => (t.dtype, None),
            Conversion::ToBf16 => (DType::BF16, None),
            Conversion::ToFp8 { rows, .. } => (DType::F8E4M3, Some(rows)),
            Conversion::ToInt8 { rows, .. } => (DType::I8, Some(rows)),
            Conversion::ToQ8_0 => (DType::Q8_0, None),
        };
        let elements: usize = t.shape.iter().product();
        let offset = at.next_multiple_of(align);
        let len = elements / dtype.block_elems() * dtype.size();
        at = offset + len;
        let scale = rows.map(|rows| {
            let s = StagedScale {
                offset: at.next_multiple_of(align),
                len: rows * 4,
            };
            at = s.offset + s.len;
            s
        });
        payload += (len + scale.map_or(0, |s| s.len)) as u64;
        tensors[i] = Some(StagedTensor {
            name: t.name.clone(),
            offset,
            len,
            dtype,
            shape: t.shape.clone(),
            scale,
            rows: t.rows.clone(),
        });
    }
    BlockLayout {
        tensors: tensors.into_iter().flatten().collect(),
        runs: Vec::new(),
        converted: true,
        read_area: 0..0,
        len: at,
        file_starts: block.tensors.iter().map(|t| t.start).collect(),
        payload,
        in_place: false,
    }
}

/// The block's tensors (indices in `order`, file order) grouped into runs: tensors of one file
/// at most [`MERGE_GAP`] apart.
fn runs_of(block: &StreamBlock, order: &[usize]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for &i in order {
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
    runs
}

/// Whether a disk-tier block can be used in place, as views of its file's pages, on the CPU:
/// every tensor is a 16-bit float, or lies at an `align` offset in its file. Other tensors at the
/// file's own 8-byte alignment would change results: an fp32 Linear rounds differently on a
/// weight that is not 64-byte aligned (measured; bf16 and f16 Linears round the same at any
/// even offset, which the tests hold against plain models).
pub fn in_place_eligible(block: &StreamBlock, align: usize) -> bool {
    block.tier == SourceTier::Disk && tensors_in_place_eligible(block, align)
}

/// Whether every tensor of `block` may be used from its file's pages (and it has some).
fn tensors_in_place_eligible(block: &StreamBlock, align: usize) -> bool {
    !block.tensors.is_empty()
        && block
            .tensors
            .iter()
            .all(|t| tensor_in_place_eligible(t.dtype, t.start, align))
}

/// The block's tensors as the file holds them, at offset 0 until placed.
fn as_stored(block: &StreamBlock) -> Vec<StagedTensor> {
    block
        .tensors
        .iter()
        .map(|t| StagedTensor {
            name: t.name.clone(),
            offset: 0,
            len: (t.end - t.start) as usize,
            dtype: t.dtype,
            shape: t.shape.clone(),
            scale: None,
            rows: t.rows.clone(),
        })
        .collect()
}

/// The layout of a block used in place: its runs, and no staging bytes (a staging buffer's slot
/// only paces the workers' look-ahead).
fn lay_out_in_place(block: &StreamBlock) -> BlockLayout {
    let mut order: Vec<usize> = (0..block.tensors.len()).collect();
    order.sort_by_key(|&i| (block.tensors[i].file, block.tensors[i].start));
    let runs = runs_of(block, &order);
    let payload: u64 = block.tensors.iter().map(|t| t.end - t.start).sum();
    BlockLayout {
        tensors: as_stored(block),
        runs,
        converted: false,
        read_area: 0..0,
        len: 0,
        file_starts: block.tensors.iter().map(|t| t.start).collect(),
        payload,
        in_place: true,
    }
}

/// The as-stored layout: tensors packed at `align` offsets in file order; for the disk tier, runs
/// read into a page-congruent read area that [`BlockLayout::settle`] empties.
fn lay_out(block: &StreamBlock, align: usize) -> BlockLayout {
    let mut order: Vec<usize> = (0..block.tensors.len()).collect();
    order.sort_by_key(|&i| {
        (
            block.tensors[i].file,
            block.tensors[i].start,
            block.tensors[i].end,
        )
    });

    let mut runs = runs_of(block, &order);

    let mut tensors = as_stored(block);
    // Packed in file order (the order runs hold them), so the packed offsets grow with the
    // read-area offsets and `settle` can move the tensors one after the other.
    let mut packed_end = 0usize;
    for &i in &order {
        let offset = packed_end.next_multiple_of(align);
        tensors[i].offset = offset;
        packed_end = offset + tensors[i].len;
    }
    let payload = block.tensors.iter().map(|t| t.end - t.start).sum();
    let file_starts: Vec<u64> = block.tensors.iter().map(|t| t.start).collect();
    if block.tier == SourceTier::Ram {
        return BlockLayout {
            tensors,
            runs,
            converted: false,
            read_area: 0..0,
            len: packed_end,
            file_starts,
            payload,
            in_place: false,
        };
    }

    // The read area, from 0 for now: each run starts on a fresh page at the same in-page offset
    // as in its file.
    let mut page = 0usize;
    for r in &mut runs {
        r.buf_offset = page + (r.start % DIRECT_ALIGN as u64) as usize;
        page = (r.buf_offset + r.len()).next_multiple_of(DIRECT_ALIGN);
    }
    // Then shifted by whole pages until, for each tensor in file order, its packed place ends
    // before the next tensor's read bytes start: moving the tensors in that order then never
    // overwrites bytes still to be moved. Packing adds at most 56 bytes per tensor while runs
    // start at their in-page offset, so the shift is 0 or a page for all but blocks of many
    // tiny tensors.
    let read_at: Vec<usize> = runs
        .iter()
        .flat_map(|r| {
            r.tensors
                .iter()
                .map(|&i| r.buf_offset + (file_starts[i] - r.start) as usize)
        })
        .collect();
    let shift = (1..order.len())
        .map(|k| {
            let prev = &tensors[order[k - 1]];
            (prev.offset + prev.len).saturating_sub(read_at[k])
        })
        .max()
        .unwrap_or(0)
        .next_multiple_of(DIRECT_ALIGN);
    for r in &mut runs {
        r.buf_offset += shift;
    }
    let read_area = shift..shift + page;
    BlockLayout {
        tensors,
        runs,
        converted: false,
        len: read_area.end.max(packed_end),
        read_area,
        file_starts,
        payload,
        in_place: false,
    }
}

#[cfg(test)]
mod tests;

//! The storage conversion of the RAM tier: the load that reads the tensors that change (by the
//! planner's rule, see [`crate::rules::conversion`], so the RAM the plan counts is the RAM the engine takes)
//! and converts them into the blocks' private images.
//!
//! The load reads the tensors that stay as stored straight into their images, then each tensor
//! that changes into one reused scratch buffer and converts it from there, so it never holds an
//! unconverted copy of more than one tensor.

use std::path::PathBuf;
use std::time::Instant;

use super::{StreamBlock, StreamError};
use crate::dtype::{cast, quantize_fp8, quantize_int8, quantize_q8_0, QuantGranularity};
use crate::io::{
    read_ranges_queued, AlignedBuf, FileReader, IoError, Lane, Need, ReadMode, ReadOptions,
    ReadRequest, ReadStats, DIRECT_ALIGN,
};
use crate::rules::conversion::tensor_conversion;
use crate::rules::Conversion;
use crate::rules::StagedLayout;
use crate::DType;

/// What the conversion load changed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct ConvertStats {
    pub tensors: u64,
    /// File bytes of the converted tensors minus their staged bytes (scales included).
    pub bytes_saved: u64,
    /// Seconds in the conversion kernels (the reads are in the load's `ReadStats`).
    pub seconds: f64,
}

/// A tensor read as it is: file offset, block, tensor index, its place in the block's image.
type Kept<'a> = (u64, usize, usize, &'a mut [u8]);

/// What the load needs of the source.
pub(crate) struct Load<'a> {
    pub blocks: &'a [StreamBlock],
    pub files: &'a [PathBuf],
    pub layout: &'a StagedLayout,
    pub storage: DType,
    pub mode: ReadMode,
    pub opts: ReadOptions,
    /// The engine's read lane: the run waits for this load, so its reads are needed now.
    pub lane: &'a Lane,
}

impl Load<'_> {
    fn read(
        &self,
        reader: &FileReader,
        reqs: &mut [ReadRequest<'_>],
    ) -> Result<ReadStats, IoError> {
        let never = std::sync::atomic::AtomicBool::new(false);
        let gate = Some((self.lane, Need::Now));
        read_ranges_queued(reader, reqs, &self.opts, &never, gate)
            .map(|s| s.expect("never stopped"))
    }

    /// Fills the image of every converted block (`images[b]` is `Some` for RAM-tier blocks).
    /// Returns the reads (bytes from the files, seconds of the whole load, conversions
    /// included) and what was converted.
    pub fn run(
        &self,
        images: &mut [Option<AlignedBuf>],
    ) -> Result<(ReadStats, ConvertStats), StreamError> {
        let started = Instant::now();
        let mut readers: Vec<Option<FileReader>> = (0..self.files.len()).map(|_| None).collect();
        let mut read = ReadStats::new(0, 0.0, self.mode);
        let mut converted = ConvertStats::default();
        let mut changing = Vec::new();

        // Tensors that stay as they are: every one of a file in one batch, in file order.
        let mut kept: Vec<Vec<Kept<'_>>> = (0..self.files.len()).map(|_| Vec::new()).collect();
        for (b, image) in images.iter_mut().enumerate() {
            let Some(image) = image else { continue };
            if !self.layout.is_converted(b) {
                continue;
            }
            let staged = self.layout.layout(b);
            let mut rest: &mut [u8] = image;
            let mut consumed = 0;
            // Visited in the order of their packed offsets (file order), which only grow.
            let mut by_offset: Vec<usize> = (0..staged.len()).collect();
            by_offset.sort_by_key(|&i| staged[i].offset);
            for i in by_offset {
                let (t, s) = (&self.blocks[b].tensors[i], &staged[i]);
                if tensor_conversion(t, self.storage) != Conversion::Keep {
                    changing.push((b, i));
                    continue;
                }
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(s.offset - consumed);
                let (mine, tail) = tail.split_at_mut(s.len);
                consumed = s.offset + s.len;
                rest = tail;
                kept[t.file].push((t.start, b, i, mine));
            }
        }
        for (f, mut list) in kept.into_iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            list.sort_by_key(|k| k.0);
            let owners: Vec<(u64, usize, usize)> =
                list.iter().map(|&(at, b, i, _)| (at, b, i)).collect();
            let mut reqs: Vec<ReadRequest<'_>> = list
                .into_iter()
                .map(|(at, _, _, dst)| ReadRequest::new(at, dst))
                .collect();
            let reader = self.reader(&mut readers, f)?;
            let got = self.read(reader, &mut reqs).map_err(|e| {
                let at = failed_at(&e);
                let (_, b, i) = owners
                    .iter()
                    .rev()
                    .find(|o| o.0 <= at)
                    .or(owners.first())
                    .copied()
                    .expect("a batch has tensors");
                self.read_error(b, i, e)
            })?;
            read += got;
        }

        // Tensors that change: one at a time through the scratch buffer, at the file's in-page
        // offset so direct reads land in it without a bounce.
        let span = |&(b, i): &(usize, usize)| {
            let t = &self.blocks[b].tensors[i];
            (t.end - t.start) as usize + DIRECT_ALIGN
        };
        let mut scratch =
            AlignedBuf::new(changing.iter().map(span).max().unwrap_or(0)).map_err(|source| {
                StreamError::Alloc {
                    what: "the storage conversion's scratch buffer".into(),
                    source: Box::new(source),
                }
            })?;
        let mut scales: Vec<f32> = Vec::new();
        for (b, i) in changing {
            let t = &self.blocks[b].tensors[i];
            let s = &self.layout.layout(b)[i];
            let len = (t.end - t.start) as usize;
            let skip = (t.start % DIRECT_ALIGN as u64) as usize;
            let src = &mut scratch[skip..skip + len];
            let reader = self.reader(&mut readers, t.file)?;
            read += self
                .read(reader, &mut [ReadRequest::new(t.start, src)])
                .map_err(|e| self.read_error(b, i, e))?;
            let src = &scratch[skip..skip + len];
            let image = images[b].as_mut().expect("RAM blocks have an image");
            let dst = &mut image[s.offset..s.offset + s.len];
            let t0 = Instant::now();
            let threads = self.opts.threads;
            let done = match tensor_conversion(t, self.storage) {
                Conversion::ToBf16 => cast(src, t.dtype, dst, DType::BF16, threads),
                Conversion::ToQ8_0 => quantize_q8_0(src, t.dtype, dst, threads),
                Conversion::ToFp8 { rows, cols } | Conversion::ToInt8 { rows, cols } => {
                    scales.clear();
                    scales.resize(rows, 0.0);
                    let r = if s.dtype == DType::I8 {
                        quantize_int8(src, t.dtype, (rows, cols), dst, &mut scales, threads)
                    } else {
                        let q = QuantGranularity::PerRow;
                        quantize_fp8(src, t.dtype, (rows, cols), q, dst, &mut scales, threads)
                    };
                    let sc = s.scale.expect("a quantized tensor has scales");
                    let out = image[sc.offset..sc.offset + sc.len].chunks_exact_mut(4);
                    for (o, v) in out.zip(&scales) {
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                    r
                }
                Conversion::Keep => unreachable!("kept tensors were read in place"),
            };
            done.map_err(|source| StreamError::Convert {
                block: b,
                name: self.blocks[b].name.clone(),
                tensor: t.name.clone(),
                from: t.dtype,
                to: s.dtype,
                source: Box::new(source),
            })?;
            converted.seconds += t0.elapsed().as_secs_f64();
            converted.tensors += 1;
            let staged = s.len + s.scale.map_or(0, |sc| sc.len);
            converted.bytes_saved += (len as u64).saturating_sub(staged as u64);
        }
        read.seconds = started.elapsed().as_secs_f64();
        Ok((read, converted))
    }

    fn reader<'r>(
        &self,
        readers: &'r mut [Option<FileReader>],
        f: usize,
    ) -> Result<&'r FileReader, StreamError> {
        if readers[f].is_none() {
            let r = FileReader::open(&self.files[f], self.mode).map_err(|source| {
                StreamError::Open {
                    file: self.files[f].clone(),
                    source: Box::new(source),
                }
            })?;
            readers[f] = Some(r);
        }
        Ok(readers[f].as_ref().expect("opened above"))
    }

    fn read_error(&self, block: usize, tensor: usize, source: IoError) -> StreamError {
        let b = &self.blocks[block];
        StreamError::read(block, b, &b.tensors[tensor], self.files, source)
    }
}

/// The file offset a read error points at.
pub(crate) fn failed_at(e: &IoError) -> u64 {
    match e {
        IoError::UnexpectedEof { got_to, .. } => *got_to,
        IoError::Read { offset, .. } | IoError::OutOfRange { offset, .. } => *offset,
        _ => 0,
    }
}

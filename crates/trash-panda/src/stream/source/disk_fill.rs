//! Filling a staging buffer from the disk tier: each run read with the block's reader (O_DIRECT
//! into the page-congruent read area, then moved to the aligned places; buffered reads straight
//! to each tensor's place).

use std::sync::atomic::{AtomicBool, Ordering};

use super::super::StreamError;
use super::CheckpointSource;
use crate::io::{AlignedBuf, Permit, ReadMode, DIRECT_ALIGN};
use crate::rules::layout::Run;

/// What a block's reads carry from chunk to chunk.
struct Reading<'q> {
    /// Only a run's unaligned first and last page pass through this.
    bounce: AlignedBuf,
    /// The block's place at the drive, given up between chunks only to a read needed sooner
    /// (the block an `acquire` waits for, when this one is a look-ahead).
    place: Permit<'q>,
}

impl CheckpointSource {
    /// Reads a staged disk-tier block into `dst` at its layout's places.
    pub(super) fn fill_disk(
        &self,
        block: usize,
        dst: &mut [u8],
        stop: &AtomicBool,
    ) -> Result<(), StreamError> {
        let bounce = AlignedBuf::new(2 * DIRECT_ALIGN).map_err(|source| StreamError::Alloc {
            what: "a bounce buffer".into(),
            source: Box::new(source),
        })?;
        let layout = &self.layout.blocks[block];
        let (lane, need) = self.reads.of(block);
        let mut reading = Reading {
            bounce,
            place: lane.acquire(need),
        };
        for run in &layout.runs {
            let reader = self.readers[run.file]
                .as_ref()
                .expect("opened for disk blocks");
            if reader.effective_mode() == ReadMode::Buffered {
                // No alignment to keep: each tensor goes straight to its place.
                for &i in &run.tensors {
                    let t = &layout.tensors[i];
                    let at = layout.file_starts[i];
                    let dst = &mut dst[t.offset..t.offset + t.len];
                    self.read_chunked(block, run, at, dst, &mut reading, stop)?;
                }
                continue;
            }
            let area = &mut dst[run.buf_range()];
            self.read_chunked(block, run, run.start, area, &mut reading, stop)?;
            // Realigned here, on the worker: the compute thread gets every tensor 64-byte aligned.
            layout.settle(run, dst);
        }
        // After the reads: a file written to before they ended may have given them its new
        // bytes, which the header's offsets do not describe.
        self.check_files(block, |f| {
            self.readers[f]
                .as_ref()
                .expect("opened for disk blocks")
                .file()
        })
    }

    /// Reads `dst.len()` bytes at file offset `at` in requests that end on multiples of the chunk
    /// size (so every middle request is aligned), checking `stop` between them and letting a read
    /// needed sooner take the place at the drive before each.
    fn read_chunked(
        &self,
        block: usize,
        run: &Run,
        mut at: u64,
        mut rest: &mut [u8],
        reading: &mut Reading<'_>,
        stop: &AtomicBool,
    ) -> Result<(), StreamError> {
        let reader = self.readers[run.file]
            .as_ref()
            .expect("opened for disk blocks");
        while !rest.is_empty() {
            if stop.load(Ordering::Relaxed) {
                return Err(self.stopped(block));
            }
            reading.place.yield_to_sooner();
            let to_boundary = self.chunk_size - (at % self.chunk_size as u64) as usize;
            let n = to_boundary.min(rest.len());
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(n);
            reader
                .read_into(at, part, &mut reading.bounce)
                .map_err(|e| self.read_error(block, run, e))?;
            at += n as u64;
            rest = tail;
        }
        Ok(())
    }
}

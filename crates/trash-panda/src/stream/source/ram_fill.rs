//! Filling a staging buffer from a mapped RAM tier: warm blocks copied from the map by several
//! threads, cold runs read from the drive with the configured reader.

use std::sync::atomic::{AtomicBool, Ordering};

use super::super::copy::copy_pairs;
use super::super::{ColdRead, StreamError};
use super::{CheckpointSource, PAGES_READ};
use crate::io::{read_ranges_queued, MappedFile, ReadOptions, ReadRequest};
use crate::rules::layout::Run;

impl CheckpointSource {
    /// Whether `run` of `block` has pages that are not in memory: `mincore` where the system has
    /// it, else the engine's own record (cold until the block was read once).
    pub(super) fn run_is_cold(&self, block: usize, map: &MappedFile, run: &Run) -> bool {
        let asked = if self.refusals.residency {
            Err(())
        } else {
            map.resident(run.start as usize..run.end as usize)
                .map_err(|_| ())
        };
        match asked {
            Ok(resident) => !resident,
            Err(()) => self.pages[block].load(Ordering::Relaxed) != PAGES_READ,
        }
    }

    /// Reads the cold `run` of `block` with positional reads through the page cache, `in_flight`
    /// requests at once, each tensor straight to its place in `dst`.
    pub(super) fn read_cold_run(
        &self,
        block: usize,
        run: &Run,
        dst: &mut [u8],
        in_flight: usize,
        stop: &AtomicBool,
    ) -> Result<(), StreamError> {
        let layout = &self.layout.blocks[block];
        let reader = self.cold_readers[run.file]
            .as_ref()
            .expect("opened for mapped files under ColdRead::Pread");
        let places = run
            .tensors
            .iter()
            .map(|&i| {
                (
                    layout.tensors[i].offset,
                    layout.tensors[i].len,
                    layout.file_starts[i],
                )
            })
            .collect();
        let mut requests: Vec<ReadRequest<'_>> = split_places(dst, places)
            .into_iter()
            .map(|(mine, start)| ReadRequest::new(start, mine))
            .collect();
        let opts = ReadOptions {
            threads: in_flight.max(1),
            chunk_size: self.chunk_size,
            populate: false,
        };
        let (lane, need) = self.reads.of(block);
        match read_ranges_queued(reader, &mut requests, &opts, stop, Some((&lane, need))) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(self.stopped(block)),
            Err(e) => Err(self.read_error(block, run, e)),
        }
    }

    /// Copies a mapped RAM-tier block into `dst`; returns the bytes that were read from the drive
    /// (runs whose pages were not all in memory).
    pub(super) fn fill_mapped(
        &self,
        block: usize,
        dst: &mut [u8],
        stop: &AtomicBool,
    ) -> Result<u64, StreamError> {
        let layout = &self.layout.blocks[block];
        let mut cold_bytes = 0u64;
        // Tensors to copy from the map: (their place in the staging buffer, their bytes).
        let mut copies: Vec<(usize, usize, &[u8])> = Vec::new();
        // Copies through a cold map fault the pages in from the drive: they hold a place in the
        // read queue until the copy ends (`Pread` reads take their own places).
        let (lane, need) = self.reads.of(block);
        let mut place = None;
        for run in &layout.runs {
            let (map, file) = self.mapped[run.file]
                .as_ref()
                .expect("mapped for RAM blocks");
            self.check_file(block, run, file)?;
            let range = run.start as usize..run.end as usize;
            if self.run_is_cold(block, map, run) {
                cold_bytes += layout.run_bytes(run);
                if let ColdRead::Pread { in_flight } = self.cold_read {
                    self.read_cold_run(block, run, dst, in_flight, stop)?;
                    continue;
                }
                place.get_or_insert_with(|| lane.acquire(need));
                match self.cold_read {
                    ColdRead::Populate if !self.populate_refused.load(Ordering::Relaxed) => {
                        // Where refused, the kernel's read-ahead under the copy does the work.
                        self.populate_or_advise(map, range);
                    }
                    _ => {
                        // Start the kernel's read-ahead of the whole run: a cold map is
                        // otherwise faulted in a few pages at a time as the copy walks it.
                        let _ = map.advise_willneed(range);
                    }
                }
            }
            for &i in &run.tensors {
                let t = &layout.tensors[i];
                let start = layout.file_starts[i] as usize;
                let src = map
                    .slice(start, start + t.len)
                    .map_err(|e| self.read_error(block, run, e))?;
                copies.push((t.offset, t.len, src));
            }
        }
        if !copy_pairs(
            split_places(dst, copies),
            self.copy_threads,
            self.chunk_size,
            stop,
        ) {
            return Err(self.stopped(block));
        }
        drop(place);
        self.pages[block].store(PAGES_READ, Ordering::Relaxed);
        Ok(cold_bytes)
    }
}

/// The staging buffer's places `(offset, length, what goes there)` as disjoint destination
/// slices, each with what goes there. Staged tensors never overlap, so sorted by offset each
/// begins after the last ends.
fn split_places<T>(dst: &mut [u8], mut places: Vec<(usize, usize, T)>) -> Vec<(&mut [u8], T)> {
    places.sort_by_key(|p| p.0);
    let mut pairs = Vec::with_capacity(places.len());
    let mut rest = dst;
    let mut at = 0;
    for (offset, len, what) in places {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(offset - at);
        let (mine, tail) = tail.split_at_mut(len);
        pairs.push((mine, what));
        rest = tail;
        at = offset + len;
    }
    pairs
}

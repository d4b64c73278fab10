//! Disk-tier blocks (and a mapped RAM tier's) used in place on the CPU: the compute reads the
//! weights straight from the page cache's pages, through a private map of the checkpoint,
//! instead of from a copy. A RAM-tier block's pages are the RAM tier: they stay in the page
//! cache, and stay mapped from run to run unless a run wrote to them.
//!
//! A warm pass then costs no copy at all (a staged block costs one memcpy of its bytes, which on
//! a machine of few cores competes with the compute), and the process holds a block's pages only
//! while the block runs: a worker brings a cold block's pages into the page cache ahead of the
//! compute (`MADV_POPULATE_READ` a chunk at a time, each chunk unmapped again at once), and the
//! lease, or the hooks module by module, unmap them once used. The map asks for huge pages, so
//! the page cache those reads fill is made of 2 MiB folios: mapping a block and unmapping it
//! again then takes one page-table entry per 2 MiB, not one per 4 KiB page (measured: 0.6 ms/GB
//! to map again, against 60 ms/GB for page cache filled by plain reads).

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::super::{SourceTier, StreamBlock, StreamError, StreamTensor};
use super::{CheckpointSource, PAGES_READ};
use crate::io::{IoError, MappedFile, ReadMode, WritableSpan};
use crate::rules::layout::Run;
use crate::rules::MAP_GRAIN;

/// A checkpoint file whose blocks are used in place.
pub(crate) struct InPlaceFile {
    /// Private, so a model that writes to a weight changes its own copy of the page, never the
    /// file; the copy is dropped when the block's lease goes.
    pub(super) map: MappedFile,
    /// To check the file before its pages are handed out (a page past a truncated end raises
    /// SIGBUS when touched; a file written to shows other bytes) and to drop its pages from the
    /// page cache.
    pub(super) file: File,
}

impl InPlaceFile {
    pub fn open(path: &Path) -> Result<Self, IoError> {
        let map = MappedFile::open_private(path)?;
        // Only a hint: without it the blocks still work, with more page-table work per pass.
        let _ = map.advise_huge();
        Ok(InPlaceFile {
            map,
            file: File::open(path).map_err(|source| IoError::Open {
                path: path.to_owned(),
                source,
            })?,
        })
    }
}

impl CheckpointSource {
    pub(super) fn in_place_file(&self, file: usize) -> &InPlaceFile {
        self.in_place[file]
            .as_ref()
            .expect("opened for blocks used in place")
    }

    /// Brings the pages of `block` (used in place) into the page cache, for runs with pages
    /// missing. Returns the bytes read from the drive.
    pub(super) fn fill_in_place(
        &self,
        block: usize,
        stop: &AtomicBool,
    ) -> Result<u64, StreamError> {
        let layout = &self.layout.blocks[block];
        let mut cold_bytes = 0u64;
        // Bringing cold pages in reads the drive: one place in the read queue while it does.
        let (lane, need) = self.reads.of(block);
        let mut place = None;
        for run in &layout.runs {
            let f = self.in_place_file(run.file);
            self.check_file(block, run, &f.file)?;
            if !self.in_place_run_is_cold(block, f, run) {
                continue;
            }
            cold_bytes += layout.run_bytes(run);
            place.get_or_insert_with(|| lane.acquire(need));
            self.read_through(block, run, f, stop)?;
        }
        self.pages[block].store(PAGES_READ, Ordering::Relaxed);
        Ok(cold_bytes)
    }

    /// Whether `run` has pages out of the page cache. The reads that bring them in fill huge
    /// folios, so one page per [`MAP_GRAIN`] tells: asking for every page of a 200 MB block
    /// costs milliseconds of a worker that, on a machine of two cores, the compute waits for.
    fn in_place_run_is_cold(&self, block: usize, f: &InPlaceFile, run: &Run) -> bool {
        let range = run.start as usize..run.end as usize;
        match f.map.resident_sampled(range, MAP_GRAIN as usize) {
            Ok(resident) => !resident,
            Err(_) => self.run_is_cold(block, &f.map, run),
        }
    }

    /// Reads `run` into the page cache a chunk at a time: populated (read with the kernel's
    /// read-ahead, into huge folios) and unmapped again, so the process never holds more than a
    /// chunk of it. Where the system refuses to populate (kernels before 5.14), the chunk is
    /// faulted in page by page after `MADV_WILLNEED`.
    fn read_through(
        &self,
        block: usize,
        run: &Run,
        f: &InPlaceFile,
        stop: &AtomicBool,
    ) -> Result<(), StreamError> {
        let mut at = run.start as usize;
        let end = run.end as usize;
        while at < end {
            if stop.load(Ordering::Relaxed) {
                return Err(self.stopped(block));
            }
            // Chunks end on MAP_GRAIN boundaries of the file (the map starts on one), so each
            // populates one huge folio: a chunk across two would map both.
            let grain = MAP_GRAIN as usize;
            let range = at..end.min((at / grain + 1) * grain);
            let n = range.len();
            if !self.populate_or_advise(&f.map, range.clone()) {
                let bytes = f
                    .map
                    .slice(range.start, range.end)
                    .map_err(|e| self.read_error(block, run, e))?;
                touch_pages(bytes);
            }
            let _ = f.map.forget(range);
            at += n;
        }
        Ok(())
    }

    /// Block `block` and its tensor `tensor`, or the error that names both.
    fn in_place_entry(
        &self,
        block: usize,
        tensor: usize,
    ) -> Result<(&StreamBlock, &StreamTensor), StreamError> {
        let b = &self.blocks[block];
        let t = b
            .tensors
            .get(tensor)
            .ok_or_else(|| StreamError::UnknownTensor {
                block,
                name: b.name.clone(),
                tensor: format!("#{tensor}"),
            })?;
        Ok((b, t))
    }

    /// Tensor `tensor` of `block` (used in place) in its file's map.
    pub(super) fn in_place_tensor(
        &self,
        block: usize,
        tensor: usize,
    ) -> Result<&[u8], StreamError> {
        let (b, t) = self.in_place_entry(block, tensor)?;
        self.in_place_file(t.file)
            .map
            .slice(t.start as usize, t.end as usize)
            .map_err(|e| StreamError::read(block, b, t, &self.files, e))
    }

    /// As [`in_place_tensor`](Self::in_place_tensor), as a writable span of the private map.
    pub(super) fn in_place_tensor_writable(
        &self,
        block: usize,
        tensor: usize,
    ) -> Result<WritableSpan, StreamError> {
        let (b, t) = self.in_place_entry(block, tensor)?;
        self.in_place_file(t.file)
            .map
            .writable(t.start as usize, t.end as usize)
            .map_err(|e| StreamError::read(block, b, t, &self.files, e))
    }

    /// Whether `block`'s tensors are unmapped one by one as the modules that use them end (a
    /// disk-tier block used in place: the process then maps one module's weights at a time). A
    /// RAM-tier block's pages stay in the page cache whatever its map does, so unmapping them
    /// early frees nothing; its own forget after the run undoes what the run wrote.
    pub(super) fn unmaps_as_used(&self, block: usize) -> bool {
        self.layout.is_in_place(block) && self.blocks[block].tier == SourceTier::Disk
    }

    /// Unmaps the pages of `block` (or of one of its tensors); with the disk tier read O_DIRECT,
    /// also drops them from the page cache, which the plan keeps for the RAM tier. The whole
    /// block is unmapped out to [`MAP_GRAIN`]: a huge folio at a run's end was mapped whole, the
    /// bytes past the run with it. A RAM-tier block stays mapped for its next run unless the run
    /// wrote to its pages (or the system cannot tell): mapping it again costs each pass page
    /// faults on the compute's thread, and unmapping the pages written is what gives the next
    /// run the file's weights again. Failures only leave pages mapped or cached a little
    /// longer, so they are not errors.
    pub(super) fn forget_in_place(&self, block: usize, tensor: Option<usize>) {
        if !self.layout.is_in_place(block) {
            return;
        }
        if tensor.is_some() && !self.unmaps_as_used(block) {
            return;
        }
        if !self.forget_image(block, tensor) {
            self.forget_checkpoint_pages(block, tensor);
        }
    }

    /// [`forget_in_place`](Self::forget_in_place) for the checkpoint's map: the pages a run of
    /// `block` mapped from it (`tensor`'s alone, or all).
    pub(super) fn forget_checkpoint_pages(&self, block: usize, tensor: Option<usize>) {
        let b = &self.blocks[block];
        let ranges: Vec<(usize, u64, u64, u64, u64)> = match tensor {
            Some(i) => b
                .tensors
                .get(i)
                .map(|t| (t.file, t.start, t.end, t.start, t.end))
                .into_iter()
                .collect(),
            None => self.layout.blocks[block]
                .runs
                .iter()
                .map(|r| {
                    let (lo, hi) = (
                        r.start - r.start % MAP_GRAIN,
                        r.end.next_multiple_of(MAP_GRAIN),
                    );
                    (r.file, r.start, r.end, lo, hi)
                })
                .collect(),
        };
        // A RAM-tier block's pages are the RAM tier's: they stay in the page cache.
        let disk = b.tier == SourceTier::Disk;
        for (file, start, end, lo, hi) in ranges {
            let f = self.in_place_file(file);
            if disk && self.disk_mode == ReadMode::Direct {
                let _ = f.map.release(start as usize..end as usize, &f.file);
            }
            let range = lo as usize..(hi as usize).min(f.map.len()).max(lo as usize);
            if !disk && matches!(f.map.written(range.clone()), Ok(false)) {
                continue;
            }
            let _ = f.map.forget(range);
        }
    }
}

/// Reads one byte of every page of `bytes`, so each page is faulted in.
fn touch_pages(bytes: &[u8]) {
    let page = crate::io::page_size();
    let mut sum = 0u8;
    for i in (0..bytes.len()).step_by(page) {
        sum = sum.wrapping_add(bytes[i]);
    }
    std::hint::black_box(sum);
}

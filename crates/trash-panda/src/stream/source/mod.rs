//! Where workers get a block's bytes: a memory map or a private copy for the RAM tier, positional
//! reads (O_DIRECT or buffered) for the disk tier. The engine sees one trait, so tests can inject
//! slow or failing sources.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::convert::{failed_at, ConvertStats, Load};
use super::copy::{copy_pairs, copy_threads};
use super::reads::Reads;
use super::{ColdRead, EngineOptions, RamSource, SourceTier, StreamBlock, StreamError};
use crate::io::{
    read_ranges_queued, AlignedBuf, FileReader, FileStamp, IoError, MappedFile, Need, ReadMode,
    ReadOptions, ReadRequest, ReadStats, WritableSpan, DIRECT_ALIGN,
};
use crate::rules::layout::{Run, StagedLayout};
use crate::rules::MAP_GRAIN;

mod check;
mod disk_fill;
mod in_place;
mod overlay;
mod ram_fill;
mod ram_image;

use super::overlay_store::OverlayStore;
pub(crate) use in_place::InPlaceFile;
use overlay::BlockOverlay;
pub use overlay::{OverlayBytes, Patch, PatchPlace};
pub use ram_image::RamImage;
use ram_image::RamImages;

/// What one [`Source::fill`] moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Filled {
    /// Tensor bytes staged.
    pub bytes: u64,
    /// Of those, bytes of the mapped RAM tier read from the drive (pages not in memory).
    pub cold_bytes: u64,
}

impl Filled {
    #[cfg(test)]
    pub fn warm(bytes: u64) -> Self {
        Filled {
            bytes,
            cold_bytes: 0,
        }
    }
}

/// Fills staging buffers. Called from several worker threads at once.
pub(crate) trait Source: Send + Sync {
    /// Writes `block` into `dst` (at least the block's staged length) at the offsets of the
    /// layout, and says what it moved. Gives up with `ShuttingDown` once `stop` is set.
    fn fill(&self, block: usize, dst: &mut [u8], stop: &AtomicBool) -> Result<Filled, StreamError>;

    /// Reads whatever must be in memory before staging (the in-memory RAM tier), if not done
    /// yet. `Some` with what that read moved, `None` when there is nothing to load.
    fn load(&self) -> Result<Option<ReadStats>, StreamError> {
        Ok(None)
    }

    /// What [`load`](Self::load) read, once it has (whoever triggered it); never blocks.
    fn loaded(&self) -> Option<ReadStats> {
        None
    }

    /// What the storage conversion of the load changed, once it ran; never blocks.
    fn converted(&self) -> Option<ConvertStats> {
        None
    }

    /// The in-memory RAM tier's image of `block` (in its staged layout), once the tier is loaded;
    /// `None` for a mapped RAM tier, a disk-tier block, or before the load.
    fn image(&self, _block: usize) -> Option<RamImage> {
        None
    }

    /// Gives back the memory a RAM-tier block holds between passes, where it can; returns the
    /// bytes given back (0 where nothing could be).
    fn release(&self, _block: usize, _keep_cache: bool) -> u64 {
        0
    }

    /// How disk-tier reads actually go (`Buffered` if O_DIRECT was refused for any file), or
    /// `None` without disk-tier blocks.
    fn disk_mode(&self) -> Option<ReadMode> {
        None
    }

    /// The bytes of tensor `tensor` of `block`, a block used in place, in the map of its file.
    fn in_place(&self, block: usize, tensor: usize) -> Result<&[u8], StreamError> {
        let _ = tensor;
        Err(StreamError::InvalidBlock {
            block,
            name: String::new(),
            reason: "this source maps no file".into(),
        })
    }

    /// As [`in_place`](Self::in_place), as a writable span of the file's private map (a write
    /// through it stays in this process's copy of the page).
    fn in_place_writable(&self, block: usize, tensor: usize) -> Result<WritableSpan, StreamError> {
        let _ = tensor;
        Err(StreamError::InvalidBlock {
            block,
            name: String::new(),
            reason: "this source maps no file".into(),
        })
    }

    /// For a block used in place, checks that the files it maps are still the ones the engine
    /// opened, unchanged: its lease points into the map, whose pages show each file as it is
    /// now, so a fill long before (the block may stay staged across passes) says nothing of
    /// today's bytes. Nothing for other blocks.
    fn check_in_place(&self, _block: usize) -> Result<(), StreamError> {
        Ok(())
    }

    /// Gives back the pages a block used in place mapped while it ran (and, when the disk tier
    /// is read with O_DIRECT, drops them from the page cache too).
    fn forget(&self, _block: usize) {}

    /// As [`forget`](Self::forget) for one tensor of the block, while the others still run.
    fn forget_tensor(&self, _block: usize, _tensor: usize) {}

    /// Whether the block's tensors are given back one by one as they are used
    /// ([`forget_tensor`](Self::forget_tensor) does something).
    fn unmaps_as_used(&self, _block: usize) -> bool {
        false
    }

    /// Writes `patches` into `block`'s patched image (made in `place` where it has none), from
    /// which it is staged from now on; returns where the image is kept.
    fn patch(
        &self,
        block: usize,
        patches: &[Patch<'_>],
        key: &str,
        place: PatchPlace,
    ) -> Result<PatchPlace, StreamError> {
        let _ = (patches, key, place);
        Err(StreamError::Patch {
            block,
            name: String::new(),
            tensor: "the block".into(),
            reason: "this source keeps no patched images".into(),
        })
    }

    /// Takes back the patches of `tensors` of `block`.
    fn unpatch(&self, _block: usize, _tensors: &[usize]) -> Result<(), StreamError> {
        Ok(())
    }

    /// Takes an existing overlay file of the merges `keys` for `block`'s image; false where
    /// there is none.
    fn adopt(
        &self,
        _block: usize,
        _keys: &std::collections::BTreeMap<usize, String>,
    ) -> Result<bool, StreamError> {
        Ok(false)
    }

    /// The staged index and key of each patched tensor of `block`.
    fn patches(&self, _block: usize) -> Vec<(usize, String)> {
        Vec::new()
    }

    /// What the patched images take.
    fn overlay_bytes(&self) -> OverlayBytes {
        OverlayBytes::default()
    }

    /// Sets the folder that disk-tier blocks' patched images go to.
    fn set_overlay_store(&self, _store: OverlayStore) {}

    /// For a block used in place with a patched image: the image's map, which its leases point
    /// into instead of the checkpoint's, and each tensor's place in it.
    fn in_place_image(&self, _block: usize) -> Option<InPlaceImage> {
        None
    }

    /// Bytes of `block`'s patched image, made or not.
    fn image_len(&self, _block: usize) -> usize {
        0
    }
}

/// A patched image used in place: its map, and where each tensor of the block lies in it.
pub(crate) type InPlaceImage = (Arc<MappedFile>, Vec<usize>);

// What the engine knows of a mapped RAM-tier block's pages when the system cannot say (no
// `mincore` on Windows): cold until read once.
const PAGES_UNREAD: u8 = 0;
const PAGES_READ: u8 = 1;
/// Given back with its page cache by a final pass, until staged again.
const PAGES_GIVEN_BACK: u8 = 2;

/// Refusals to pretend, so tests reach the fallbacks on a system that has every method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Refusals {
    /// `MADV_POPULATE_READ` fails as on a kernel before 5.14.
    pub populate: bool,
    /// `mincore` fails as on Windows (the engine then keeps its own record).
    pub residency: bool,
}

/// The real source: the checkpoint files.
pub(crate) struct CheckpointSource {
    blocks: Vec<StreamBlock>,
    files: Vec<PathBuf>,
    /// What each file was when the engine opened it: a block is read only from the same file,
    /// unchanged (see `check_file`).
    stamps: Vec<FileStamp>,
    layout: Arc<StagedLayout>,
    /// For files holding RAM-tier blocks with `RamSource::Mapped`: the map, and the file to check
    /// its current size (reading a mapped page past a truncated end would raise SIGBUS).
    mapped: Vec<Option<(MappedFile, File)>>,
    /// For files holding disk-tier blocks.
    readers: Vec<Option<FileReader>>,
    /// Buffered readers of the mapped files, for cold RAM-tier blocks under `ColdRead::Pread`.
    cold_readers: Vec<Option<FileReader>>,
    /// For files holding disk-tier blocks used in place: their private map.
    in_place: Vec<Option<InPlaceFile>>,
    cold_read: ColdRead,
    /// Per block: `PAGES_READ` once a cold read brought it into the page cache,
    /// `PAGES_GIVEN_BACK` once released with its page cache.
    pages: Vec<AtomicU8>,
    /// Set once `MADV_POPULATE_READ` was refused: the rest of the run copies through the map.
    populate_refused: AtomicBool,
    refusals: Refusals,
    /// Reader threads of the RAM tier's load; `None` when the RAM tier is mapped.
    ram_threads: Option<usize>,
    storage: Option<crate::DType>,
    disk_mode: ReadMode,
    chunk_size: usize,
    /// Threads that copy one warm RAM-tier block into its staging buffer.
    copy_threads: usize,
    in_memory: Mutex<Option<RamImages>>,
    load_stats: OnceLock<ReadStats>,
    convert_stats: OnceLock<ConvertStats>,
    /// The queue every drive read waits in, ranked by its block's need.
    reads: Arc<Reads>,
    /// Per block: its patched image, if it has one (read-locked while a fill copies from it).
    overlays: Vec<RwLock<BlockOverlay>>,
    /// Where disk-tier blocks' patched images go; `None` until the caller sets a folder.
    store: Mutex<Option<Arc<OverlayStore>>>,
}

impl CheckpointSource {
    pub fn open(
        blocks: Vec<StreamBlock>,
        files: Vec<PathBuf>,
        layout: Arc<StagedLayout>,
        options: &EngineOptions,
        reads: Arc<Reads>,
    ) -> Result<Self, StreamError> {
        let disk_mode = options.disk_mode;
        // A converted RAM tier cannot be mapped: its bytes are not the file's.
        let ram_threads = match (options.ram_source, options.storage) {
            (RamSource::InMemory { threads }, _) => Some(threads.max(1)),
            (RamSource::Mapped, Some(_)) => Some(ReadOptions::default().threads),
            (RamSource::Mapped, None) => None,
        };
        let mut needs_map = vec![false; files.len()];
        let mut needs_reader = vec![false; files.len()];
        let mut needs_in_place = vec![false; files.len()];
        for (i, b) in blocks.iter().enumerate() {
            for t in &b.tensors {
                match b.tier {
                    _ if layout.is_in_place(i) => needs_in_place[t.file] = true,
                    SourceTier::Ram => needs_map[t.file] |= ram_threads.is_none(),
                    SourceTier::Disk => needs_reader[t.file] = true,
                }
            }
        }
        let open_err = |f: usize| {
            let file = files[f].clone();
            move |source| StreamError::Open {
                file,
                source: Box::new(source),
            }
        };
        let mut stamps = Vec::with_capacity(files.len());
        let mut sizes = Vec::with_capacity(files.len());
        for (f, path) in files.iter().enumerate() {
            let meta = std::fs::metadata(path)
                .map_err(|source| IoError::Open {
                    path: path.clone(),
                    source,
                })
                .map_err(open_err(f))?;
            sizes.push(meta.len());
            stamps.push(FileStamp::of(&meta));
        }
        for (i, b) in blocks.iter().enumerate() {
            if let Some(t) = b.tensors.iter().find(|t| t.end > sizes[t.file]) {
                return Err(StreamError::InvalidBlock {
                    block: i,
                    name: b.name.clone(),
                    reason: format!(
                        "tensor {} ends at byte {} but {} has {} bytes",
                        t.name,
                        t.end,
                        files[t.file].display(),
                        sizes[t.file]
                    ),
                });
            }
        }
        let mut mapped = Vec::with_capacity(files.len());
        let mut readers = Vec::with_capacity(files.len());
        let mut cold_readers = Vec::with_capacity(files.len());
        let mut in_place = Vec::with_capacity(files.len());
        let pread = matches!(options.cold_read, ColdRead::Pread { .. });
        for (f, path) in files.iter().enumerate() {
            in_place.push(if needs_in_place[f] {
                Some(InPlaceFile::open(path).map_err(open_err(f))?)
            } else {
                None
            });
            cold_readers.push(if needs_map[f] && pread {
                Some(FileReader::open(path, ReadMode::Buffered).map_err(open_err(f))?)
            } else {
                None
            });
            mapped.push(if needs_map[f] {
                let map = MappedFile::open(path).map_err(open_err(f))?;
                let file = File::open(path)
                    .map_err(|source| IoError::Open {
                        path: path.clone(),
                        source,
                    })
                    .map_err(open_err(f))?;
                Some((map, file))
            } else {
                None
            });
            readers.push(if needs_reader[f] {
                Some(FileReader::open(path, disk_mode).map_err(open_err(f))?)
            } else {
                None
            });
        }
        let pages = blocks.iter().map(|_| AtomicU8::new(PAGES_UNREAD)).collect();
        let overlays = blocks.iter().map(|_| RwLock::default()).collect();
        Ok(CheckpointSource {
            overlays,
            store: Mutex::new(None),
            blocks,
            files,
            stamps,
            layout,
            mapped,
            readers,
            cold_readers,
            in_place,
            cold_read: options.cold_read,
            pages,
            populate_refused: AtomicBool::new(false),
            refusals: Refusals::default(),
            ram_threads,
            storage: options.storage,
            disk_mode,
            chunk_size: options.chunk_size.max(1).next_multiple_of(DIRECT_ALIGN),
            copy_threads: match options.copy_threads {
                0 => copy_threads(options.workers),
                n => n,
            },
            in_memory: Mutex::new(None),
            load_stats: OnceLock::new(),
            convert_stats: OnceLock::new(),
            reads,
        })
    }

    /// Populates `range` of `map` (`MADV_POPULATE_READ`). Where the system refuses (kernels
    /// before 5.14, or a test's refusal), that is remembered for every later call, the kernel's
    /// read-ahead is started instead, and false is returned: the caller's reads fault the pages in.
    pub(super) fn populate_or_advise(
        &self,
        map: &MappedFile,
        range: std::ops::Range<usize>,
    ) -> bool {
        let populated = !self.populate_refused.load(Ordering::Relaxed)
            && !self.refusals.populate
            && map.populate(range.clone()).is_ok();
        if !populated {
            self.populate_refused.store(true, Ordering::Relaxed);
            let _ = map.advise_willneed(range);
        }
        populated
    }

    /// The file range whose page cache goes with `run` of `block`, given back: out to
    /// [`MAP_GRAIN`] on each side where no other RAM-tier block still holds pages. The kernel
    /// drops only folios the range holds whole, so a huge folio across two blocks' boundary is
    /// dropped with the second of them given back, not left behind by both.
    pub(super) fn cache_span(&self, block: usize, run: &Run) -> std::ops::Range<u64> {
        let (lo, hi) = (
            run.start - run.start % MAP_GRAIN,
            run.end.next_multiple_of(MAP_GRAIN),
        );
        let held = |from: u64, to: u64| {
            self.layout.blocks.iter().enumerate().any(|(b, layout)| {
                b != block
                    && self.blocks[b].tier == SourceTier::Ram
                    && self.pages[b].load(Ordering::Relaxed) != PAGES_GIVEN_BACK
                    && layout
                        .runs
                        .iter()
                        .any(|r| r.file == run.file && r.start < to && from < r.end)
            })
        };
        let start = if held(lo, run.start) { run.start } else { lo };
        let end = if held(run.end, hi) { run.end } else { hi };
        start..end
    }

    fn stopped(&self, block: usize) -> StreamError {
        StreamError::ShuttingDown {
            block,
            name: self.blocks[block].name.clone(),
        }
    }

    /// Pretends the given methods are refused (tests).
    #[cfg(test)]
    pub(crate) fn with_refusals(mut self, refusals: Refusals) -> Self {
        self.refusals = refusals;
        self
    }

    /// The RAM tier's private copies, reading them first if needed (under the lock, so workers
    /// that need them meanwhile wait for the one read).
    fn images(&self) -> Result<RamImages, StreamError> {
        let mut slot = self.in_memory.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(images) = &*slot {
            return Ok(images.clone());
        }
        let Some(threads) = self.ram_threads else {
            return Ok(Arc::new(Vec::new()));
        };
        let mut images = Vec::with_capacity(self.blocks.len());
        for (i, b) in self.blocks.iter().enumerate() {
            images.push(match b.tier {
                SourceTier::Ram => {
                    Some(AlignedBuf::new(self.layout.block_len(i)).map_err(|source| {
                        StreamError::Alloc {
                            what: format!("the in-memory copy of block {i} ({})", b.name),
                            source: Box::new(source),
                        }
                    })?)
                }
                SourceTier::Disk => None,
            });
        }
        let opts = ReadOptions {
            threads,
            chunk_size: self.chunk_size,
            populate: false,
        };
        if let Some(storage) = self.storage {
            let lane = self.reads.lane();
            let load = Load {
                lane: &lane,
                blocks: &self.blocks,
                files: &self.files,
                layout: &self.layout,
                storage,
                mode: self.disk_mode,
                opts,
            };
            let (read, converted) = load.run(&mut images)?;
            let images: RamImages = Arc::new(images);
            *slot = Some(images.clone());
            let _ = self.load_stats.set(read);
            let _ = self.convert_stats.set(converted);
            return Ok(images);
        }
        let mut stats: Option<ReadStats> = None;
        {
            // One request per tensor, grouped by file, each into its aligned place in its
            // block's image (the reads pass through a bounce buffer, once, at load).
            let mut requests: Vec<Vec<ReadRequest<'_>>> =
                (0..self.files.len()).map(|_| Vec::new()).collect();
            let mut owners: Vec<Vec<(usize, &Run)>> =
                (0..self.files.len()).map(|_| Vec::new()).collect();
            for (b, image) in images.iter_mut().enumerate() {
                let Some(image) = image else { continue };
                let layout = &self.layout.blocks[b];
                let mut rest: &mut [u8] = image;
                let mut consumed = 0;
                // Packed in file order, so the offsets only grow.
                for run in &layout.runs {
                    for &i in &run.tensors {
                        let t = &layout.tensors[i];
                        let (_, tail) = std::mem::take(&mut rest).split_at_mut(t.offset - consumed);
                        let (mine, tail) = tail.split_at_mut(t.len);
                        consumed = t.offset + t.len;
                        rest = tail;
                        requests[run.file].push(ReadRequest::new(layout.file_starts[i], mine));
                    }
                    owners[run.file].push((b, run));
                }
            }
            for (f, reqs) in requests.iter_mut().enumerate() {
                if reqs.is_empty() {
                    continue;
                }
                // The cold RAM tier's reader (positional reads through the page cache) when it
                // is `Pread`, as measured fastest; otherwise the disk tier's.
                let mode = match self.cold_read {
                    ColdRead::Pread { .. } => ReadMode::Buffered,
                    ColdRead::Map | ColdRead::Populate => self.disk_mode,
                };
                let reader =
                    FileReader::open(&self.files[f], mode).map_err(|source| StreamError::Open {
                        file: self.files[f].clone(),
                        source: Box::new(source),
                    })?;
                // The run waits for this load: it is needed now, ahead of any look-ahead.
                let lane = self.reads.lane();
                let never = AtomicBool::new(false);
                let gate = Some((&lane, Need::Now));
                let read = read_ranges_queued(&reader, reqs, &opts, &never, gate)
                    .map(|s| s.expect("never stopped"))
                    .map_err(|e| {
                        let at = failed_at(&e);
                        let (b, run) = owners[f]
                            .iter()
                            .find(|(_, r)| r.start <= at && at < r.end)
                            .or(owners[f].first())
                            .copied()
                            .expect("a file with requests has owners");
                        self.read_error(b, run, e)
                    })?;
                stats = Some(match stats {
                    Some(s) => s + read,
                    None => read,
                });
            }
        }
        let images: RamImages = Arc::new(images);
        *slot = Some(images.clone());
        let _ = self
            .load_stats
            .set(stats.unwrap_or(ReadStats::new(0, 0.0, self.disk_mode)));
        Ok(images)
    }
    /// Writes `block` into `dst` from the checkpoint (the RAM tier's map or image, or the
    /// drive), whatever patches it has.
    fn fill_checkpoint(
        &self,
        block: usize,
        dst: &mut [u8],
        stop: &AtomicBool,
    ) -> Result<Filled, StreamError> {
        // Staged again: its pages are held once more (see `cache_span`).
        let _ = self.pages[block].compare_exchange(
            PAGES_GIVEN_BACK,
            PAGES_UNREAD,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let cold_bytes = match (self.blocks[block].tier, self.ram_threads) {
            _ if self.layout.is_in_place(block) => self.fill_in_place(block, stop)?,
            (SourceTier::Disk, _) => {
                self.fill_disk(block, dst, stop)?;
                0
            }
            (SourceTier::Ram, None) => self.fill_mapped(block, dst, stop)?,
            (SourceTier::Ram, Some(_)) => {
                let images = self.images()?;
                let image = images[block].as_ref().expect("RAM blocks have an image");
                let len = self.layout.block_len(block);
                let pairs = vec![(&mut dst[..len], &image[..len])];
                if !copy_pairs(pairs, self.copy_threads, self.chunk_size, stop) {
                    return Err(self.stopped(block));
                }
                0
            }
        };
        Ok(Filled {
            bytes: self.layout.block_bytes(block),
            cold_bytes,
        })
    }

    fn image_unpatched(&self, block: usize) -> Option<RamImage> {
        if self.blocks[block].tier != SourceTier::Ram {
            return None;
        }
        let images = self
            .in_memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        images.get(block)?.as_ref()?;
        Some(RamImage {
            images,
            block,
            len: self.layout.block_len(block),
        })
    }
}

impl Source for CheckpointSource {
    fn check_in_place(&self, block: usize) -> Result<(), StreamError> {
        if !self.layout.is_in_place(block) {
            return Ok(());
        }
        self.check_files(block, |f| &self.in_place_file(f).file)
    }

    fn fill(&self, block: usize, dst: &mut [u8], stop: &AtomicBool) -> Result<Filled, StreamError> {
        if let Some(filled) = self.fill_overlay(block, dst, stop)? {
            return Ok(filled);
        }
        self.fill_checkpoint(block, dst, stop)
    }

    fn patch(
        &self,
        block: usize,
        patches: &[Patch<'_>],
        key: &str,
        place: PatchPlace,
    ) -> Result<PatchPlace, StreamError> {
        self.patch_block(block, patches, key, place)
    }

    fn unpatch(&self, block: usize, tensors: &[usize]) -> Result<(), StreamError> {
        self.unpatch_block(block, tensors)
    }

    fn adopt(
        &self,
        block: usize,
        keys: &std::collections::BTreeMap<usize, String>,
    ) -> Result<bool, StreamError> {
        self.adopt_block(block, keys)
    }

    fn patches(&self, block: usize) -> Vec<(usize, String)> {
        self.block_patches(block)
    }

    fn overlay_bytes(&self) -> OverlayBytes {
        self.overlay_figures()
    }

    fn set_overlay_store(&self, store: OverlayStore) {
        self.set_store(store);
    }

    fn in_place_image(&self, block: usize) -> Option<InPlaceImage> {
        self.mapped_image(block)
    }

    fn image_len(&self, block: usize) -> usize {
        self.places(block).1
    }

    fn image(&self, block: usize) -> Option<RamImage> {
        if !self.block_patches(block).is_empty() {
            // A patched block is staged from its patched image, never copied from this one.
            return None;
        }
        self.image_unpatched(block)
    }

    fn release(&self, block: usize, keep_cache: bool) -> u64 {
        if self.blocks[block].tier != SourceTier::Ram || self.ram_threads.is_some() {
            // The in-memory RAM tier's images are shared by every fill: they go with the engine.
            return 0;
        }
        let layout = &self.layout.blocks[block];
        let in_place = self.layout.is_in_place(block);
        let mut released = 0;
        for run in &layout.runs {
            // A block used in place stays mapped between runs in the in-place map.
            let (map, file) = match (&self.mapped[run.file], &self.in_place[run.file]) {
                (_, Some(f)) if in_place => (&f.map, &f.file),
                (Some((map, file)), _) => (map, file),
                (None, Some(f)) => (&f.map, &f.file),
                (None, None) => continue,
            };
            let range = run.start as usize..run.end as usize;
            let done = if keep_cache {
                map.forget(range)
            } else {
                map.release_cached(range, self.cache_span(block, run), file)
            };
            if done.is_ok() {
                released += run.len() as u64;
            }
        }
        if !keep_cache && released > 0 {
            // The block is cold again: its next staging reads it from the drive.
            self.pages[block].store(PAGES_GIVEN_BACK, Ordering::Relaxed);
        }
        released
    }

    fn load(&self) -> Result<Option<ReadStats>, StreamError> {
        if self.ram_threads.is_none() {
            return Ok(None);
        }
        self.images()?;
        Ok(self.loaded())
    }

    fn loaded(&self) -> Option<ReadStats> {
        self.load_stats.get().copied()
    }

    fn converted(&self) -> Option<ConvertStats> {
        self.convert_stats.get().copied()
    }

    fn in_place(&self, block: usize, tensor: usize) -> Result<&[u8], StreamError> {
        self.in_place_tensor(block, tensor)
    }

    fn in_place_writable(&self, block: usize, tensor: usize) -> Result<WritableSpan, StreamError> {
        self.in_place_tensor_writable(block, tensor)
    }

    fn forget(&self, block: usize) {
        self.forget_in_place(block, None);
    }

    fn forget_tensor(&self, block: usize, tensor: usize) {
        self.forget_in_place(block, Some(tensor));
    }

    fn unmaps_as_used(&self, block: usize) -> bool {
        CheckpointSource::unmaps_as_used(self, block)
    }

    fn disk_mode(&self) -> Option<ReadMode> {
        let disk_in_place = self
            .blocks
            .iter()
            .enumerate()
            .any(|(i, b)| b.tier == SourceTier::Disk && self.layout.is_in_place(i));
        if self.readers.iter().all(Option::is_none) && disk_in_place {
            // Blocks used in place are read through the page cache whatever the mode.
            return Some(ReadMode::Buffered);
        }
        let mut modes = self.readers.iter().flatten().map(|r| r.effective_mode());
        let first = modes.next()?;
        Some(if modes.all(|m| m == first) {
            first
        } else {
            ReadMode::Buffered
        })
    }
}

//! Blocks staged from a patched image instead of the checkpoint: a merged form of some of their
//! tensors (an adapter folded in), kept where the block lives, so every later staging brings the
//! merged bytes at the cost of an unmerged one.
//!
//! A staged RAM-tier block keeps its patched image in private memory (the map's pages it
//! replaces are given back); a disk-tier block, and a block used in place, keep it in an overlay
//! file ([`OverlayStore`]), read with one request or mapped as the checkpoint is. Taking a patch
//! back from a memory image writes the checkpoint's bytes of those tensors again, and the last
//! one drops the image; a file is the image of one set of merges, named by them, so it is left
//! as it is for a later adoption ([`CheckpointSource::adopt_block`]) and the block goes back to
//! the checkpoint's bytes whole.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::super::copy::copy_pairs;
use super::super::overlay_store::OverlayStore;
use super::super::{SourceTier, StreamError};
use super::{CheckpointSource, Filled, Source};
use crate::io::{AlignedBuf, FileReader, MappedFile, DIRECT_ALIGN};
use crate::rules::patched_image_bytes;

/// Where a patched block's image is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchPlace {
    /// Private memory.
    Memory,
    /// An overlay file.
    File,
}

impl PatchPlace {
    /// The word for it in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            PatchPlace::Memory => "memory",
            PatchPlace::File => "file",
        }
    }
}

/// The new bytes of one staged tensor (and of its staged scales, for a tensor the engine
/// quantized), exactly as a staging buffer holds them.
#[derive(Debug, Clone, Copy)]
pub struct Patch<'a> {
    /// The tensor's index in the block's staged layout.
    pub tensor: usize,
    /// Its bytes.
    pub data: &'a [u8],
    /// Its staged scales' bytes, where the layout has them.
    pub scale: Option<&'a [u8]>,
}

/// What patched images take now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverlayBytes {
    /// Bytes of private memory.
    pub memory: u64,
    /// Bytes of overlay files.
    pub file: u64,
    /// Blocks staged from a patched image.
    pub blocks: u64,
}

#[derive(Debug)]
enum Image {
    Memory(AlignedBuf),
    File {
        path: PathBuf,
        reader: FileReader,
        store: Arc<OverlayStore>,
        /// For a block used in place: the file's private map, which its leases point into.
        map: Option<Arc<MappedFile>>,
    },
}

/// One block's patched image and the patch of each of its tensors (by staged index: the key the
/// caller gave, which names what the merged bytes depend on).
#[derive(Debug, Default)]
pub(crate) struct BlockOverlay {
    image: Option<Image>,
    patched: BTreeMap<usize, String>,
}

impl Image {
    /// Gives the image up: its memory, or its file, removed if `remove` (closed first: an open
    /// file cannot be removed everywhere), else left to be adopted again.
    fn discard(self, remove: bool) {
        if let Image::File {
            path,
            store,
            reader,
            map,
        } = self
        {
            drop((reader, map));
            store.release(&path, remove);
        }
    }
}

impl BlockOverlay {
    /// What its image takes (of `image_len` bytes), by the rule the planner counts it with.
    fn len(&self, image_len: usize) -> u64 {
        match &self.image {
            Some(Image::Memory(_)) => patched_image_bytes(image_len as u64, true),
            Some(Image::File { .. }) => patched_image_bytes(image_len as u64, false),
            None => 0,
        }
    }
}

impl Drop for BlockOverlay {
    fn drop(&mut self) {
        // Its engine is gone; the file stays for a later run with the same merges (within
        // the folder's limit).
        if let Some(image) = self.image.take() {
            image.discard(false);
        }
    }
}

impl CheckpointSource {
    /// Stages `block` from its patched image, if it has one: `None` when it has not.
    pub(super) fn fill_overlay(
        &self,
        block: usize,
        dst: &mut [u8],
        stop: &AtomicBool,
    ) -> Result<Option<Filled>, StreamError> {
        let overlay = self.overlays[block]
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let len = self.layout.block_len(block);
        match &overlay.image {
            None => return Ok(None),
            Some(Image::File { map: Some(map), .. }) => {
                // Used in place: its pages brought in (a hint; the run faults in any missed).
                let (lane, need) = self.reads.of(block);
                let _place = lane.acquire(need);
                let _ = map.populate(0..map.len());
            }
            Some(Image::Memory(buf)) => {
                let pairs = vec![(&mut dst[..len], &buf[..len])];
                if !copy_pairs(pairs, self.copy_threads, self.chunk_size, stop) {
                    return Err(self.stopped(block));
                }
            }
            Some(Image::File { path, reader, .. }) => {
                let (lane, need) = self.reads.of(block);
                let _place = lane.acquire(need);
                let mut bounce =
                    AlignedBuf::new(2 * DIRECT_ALIGN).map_err(|source| StreamError::Alloc {
                        what: "a bounce buffer".into(),
                        source: Box::new(source),
                    })?;
                reader
                    .read_into(0, &mut dst[..len], &mut bounce)
                    .map_err(|source| StreamError::Overlay {
                        path: path.clone(),
                        what: "read the overlay file",
                        source: std::io::Error::other(source),
                    })?;
            }
        }
        Ok(Some(Filled {
            bytes: self.layout.block_bytes(block),
            cold_bytes: 0,
        }))
    }

    /// Writes `patches` into `block`'s patched image, making it (from the checkpoint's bytes)
    /// where the block has none, in `place`; returns where the image is kept (an image made
    /// earlier stays where it is).
    pub(super) fn patch_block(
        &self,
        block: usize,
        patches: &[Patch<'_>],
        key: &str,
        place: PatchPlace,
    ) -> Result<PatchPlace, StreamError> {
        self.check_patches(block, patches, place)?;
        let mut overlay = self.overlays[block]
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let mut keys = overlay.patched.clone();
        for p in patches {
            keys.insert(p.tensor, key.to_owned());
        }
        match &mut overlay.image {
            Some(Image::Memory(buf)) => {
                for p in patches {
                    self.write_patch(block, p, buf);
                }
            }
            Some(Image::File { .. }) => {
                let (places, _) = self.places(block);
                let mut writes: Vec<(usize, &[u8])> = Vec::new();
                for p in patches {
                    writes.push((places[p.tensor], p.data));
                    if let (Some(s), Some(bytes)) =
                        (self.layout.layout(block)[p.tensor].scale, p.scale)
                    {
                        writes.push((s.offset, bytes));
                    }
                }
                self.rewrite_file(block, &mut overlay, &writes, &keys)?;
            }
            None => {
                let mut buf = self.original(block)?;
                for p in patches {
                    self.write_patch(block, p, &mut buf);
                }
                overlay.image = Some(self.keep_image(block, buf, place, &keys)?);
            }
        }
        overlay.patched = keys;
        Ok(match overlay.image {
            Some(Image::File { .. }) => PatchPlace::File,
            _ => PatchPlace::Memory,
        })
    }

    /// Takes back the patches of `tensors` of `block` (their checkpoint bytes come back); the
    /// image goes with the last of them. Tensors with no patch are left alone.
    pub(super) fn unpatch_block(&self, block: usize, tensors: &[usize]) -> Result<(), StreamError> {
        let mut overlay = self.overlays[block]
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let undone: Vec<usize> = tensors
            .iter()
            .copied()
            .filter(|t| overlay.patched.contains_key(t))
            .collect();
        if undone.is_empty() {
            return Ok(());
        }
        let mut keys = overlay.patched.clone();
        for t in &undone {
            keys.remove(t);
        }
        // An overlay file is the image of one set of merges, which a later run may adopt: it
        // stays as it is, and the block goes back to the checkpoint's bytes whole (the merges
        // left are made again, into an image of their own).
        let file = matches!(overlay.image, Some(Image::File { .. }));
        if keys.is_empty() || file {
            if let Some(image) = overlay.image.take() {
                image.discard(false);
            }
            overlay.patched.clear();
            return Ok(());
        }
        let original = self.original_tensors(block, &undone)?;
        match &mut overlay.image {
            Some(Image::Memory(buf)) => {
                for (at, bytes) in &original {
                    buf[*at..*at + bytes.len()].copy_from_slice(bytes);
                }
            }
            Some(Image::File { .. }) => {
                let writes: Vec<(usize, &[u8])> =
                    original.iter().map(|(at, b)| (*at, b.as_slice())).collect();
                self.rewrite_file(block, &mut overlay, &writes, &keys)?;
            }
            None => {}
        }
        overlay.patched = keys;
        Ok(())
    }

    /// Writes `writes` (offset, bytes) into `block`'s overlay file and names it for `keys`.
    /// Where that fails part way (part of a tensor may be written), the whole image goes, and
    /// every patch with it: the block stages the checkpoint's bytes again.
    fn rewrite_file(
        &self,
        block: usize,
        overlay: &mut BlockOverlay,
        writes: &[(usize, &[u8])],
        keys: &BTreeMap<usize, String>,
    ) -> Result<(), StreamError> {
        let Some(Image::File { path, store, .. }) = &mut overlay.image else {
            return Ok(());
        };
        let store = store.clone();
        let cached = self.keeps_cache(block);
        let written = writes
            .iter()
            .try_for_each(|(at, bytes)| store.write_at(path, *at as u64, bytes, cached));
        match written.and_then(|()| store.rename(path, &self.overlay_name(block, keys))) {
            Ok(renamed) => {
                *path = renamed;
                Ok(())
            }
            Err(e) => {
                if let Some(image) = overlay.image.take() {
                    image.discard(true);
                }
                overlay.patched.clear();
                Err(e)
            }
        }
    }

    /// Takes the overlay file of the merges `keys` (staged index, key) for `block`'s image, if
    /// the folder has one (an earlier run's, or this one's before its merges were taken back):
    /// the block is staged from it from now on. False where there is none, or no folder.
    pub(super) fn adopt_block(
        &self,
        block: usize,
        keys: &BTreeMap<usize, String>,
    ) -> Result<bool, StreamError> {
        let Some(store) = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            return Ok(false);
        };
        if keys.is_empty() || keys.keys().any(|&t| t >= self.layout.layout(block).len()) {
            return Ok(false);
        }
        let mut overlay = self.overlays[block]
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if overlay.image.is_some() && overlay.patched == *keys {
            return Ok(true);
        }
        let len = self.places(block).1 as u64;
        let Some(path) = store.find(&self.overlay_name(block, keys), len) else {
            return Ok(false);
        };
        let image = self.open_file_image(block, path, store)?;
        if let Some(old) = overlay.image.replace(image) {
            old.discard(false);
        }
        overlay.patched = keys.clone();
        Ok(true)
    }

    /// The staged index and key of each patched tensor of `block`.
    pub(super) fn block_patches(&self, block: usize) -> Vec<(usize, String)> {
        let overlay = self.overlays[block]
            .read()
            .unwrap_or_else(|p| p.into_inner());
        overlay
            .patched
            .iter()
            .map(|(t, k)| (*t, k.clone()))
            .collect()
    }

    /// What the patched images take.
    pub(super) fn overlay_figures(&self) -> OverlayBytes {
        let mut bytes = OverlayBytes::default();
        for (b, o) in self.overlays.iter().enumerate() {
            let o = o.read().unwrap_or_else(|p| p.into_inner());
            let len = o.len(self.places(b).1);
            match &o.image {
                Some(Image::Memory(_)) => bytes.memory += len,
                Some(Image::File { .. }) => bytes.file += len,
                None => continue,
            }
            bytes.blocks += 1;
        }
        bytes
    }

    /// Sets the folder that disk-tier blocks' images go to.
    pub(super) fn set_store(&self, store: OverlayStore) {
        *self.store.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(store));
    }

    fn check_patches(
        &self,
        block: usize,
        patches: &[Patch<'_>],
        place: PatchPlace,
    ) -> Result<(), StreamError> {
        let refuse = |tensor: String, reason: String| StreamError::Patch {
            block,
            name: self.blocks[block].name.clone(),
            tensor,
            reason,
        };
        let fresh = self.overlays[block]
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .image
            .is_none();
        if self.layout.is_in_place(block) && place == PatchPlace::Memory && fresh {
            return Err(refuse(
                "the block".into(),
                "it is used in place from a map: its image must be an overlay file, mapped as the \
                 checkpoint is"
                    .into(),
            ));
        }
        let layout = self.layout.layout(block);
        for p in patches {
            let Some(t) = layout.get(p.tensor) else {
                return Err(refuse(
                    format!("tensor {}", p.tensor),
                    format!("the block stages {} tensors", layout.len()),
                ));
            };
            if p.data.len() != t.len {
                return Err(refuse(
                    t.name.clone(),
                    format!(
                        "{} bytes given, its staged form ({}, shape {:?}) has {}",
                        p.data.len(),
                        t.dtype,
                        t.shape,
                        t.len
                    ),
                ));
            }
            match (t.scale, p.scale) {
                (None, None) => {}
                (Some(s), Some(bytes)) if bytes.len() == s.len => {}
                (Some(s), got) => {
                    return Err(refuse(
                        t.name.clone(),
                        format!(
                            "its staged scales take {} bytes, {} given",
                            s.len,
                            got.map_or(0, <[u8]>::len)
                        ),
                    ))
                }
                (None, Some(_)) => {
                    return Err(refuse(
                        t.name.clone(),
                        "scales given for a tensor staged without any".into(),
                    ))
                }
            }
        }
        Ok(())
    }

    fn write_patch(&self, block: usize, p: &Patch<'_>, buf: &mut [u8]) {
        let t = &self.layout.layout(block)[p.tensor];
        let at = self.places(block).0[p.tensor];
        buf[at..at + t.len].copy_from_slice(p.data);
        if let (Some(s), Some(bytes)) = (t.scale, p.scale) {
            buf[s.offset..s.offset + s.len].copy_from_slice(bytes);
        }
    }

    /// The block's staged bytes as the checkpoint gives them.
    fn original(&self, block: usize) -> Result<AlignedBuf, StreamError> {
        let (places, len) = self.places(block);
        let mut buf = AlignedBuf::new(len).map_err(|source| StreamError::Alloc {
            what: format!(
                "a patched image of block {block} ({})",
                self.blocks[block].name
            ),
            source: Box::new(source),
        })?;
        if self.layout.is_in_place(block) {
            // No staging to fill: each tensor from the checkpoint's map, at its place.
            for (t, &at) in places.iter().enumerate() {
                let bytes = self.in_place_tensor(block, t)?;
                buf[at..at + bytes.len()].copy_from_slice(bytes);
            }
            // (The caller holds the block's overlay lock: the checkpoint's pages, directly.)
            self.forget_checkpoint_pages(block, None);
            return Ok(buf);
        }
        let never = AtomicBool::new(false);
        self.fill_checkpoint(block, &mut buf, &never)?;
        Ok(buf)
    }

    /// Where each tensor of `block` lies in its image, and the image's length (the layout's
    /// rule, which the planner counts with).
    pub(super) fn places(&self, block: usize) -> (Vec<usize>, usize) {
        self.layout.image_places(block)
    }

    /// As [`forget_in_place`](CheckpointSource::forget_in_place) for a block used in place from
    /// its overlay file's map: the pages a disk-tier block's run mapped go, from the page cache
    /// too when the disk tier is read with O_DIRECT (so the pass does not evict the RAM tier's
    /// cache), and a RAM-tier block's only where the run wrote to them. False where the block
    /// has no such image (its pages are the checkpoint's).
    pub(super) fn forget_image(&self, block: usize, tensor: Option<usize>) -> bool {
        let overlay = self.overlays[block]
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let Some(Image::File {
            map: Some(map),
            reader,
            ..
        }) = &overlay.image
        else {
            return false;
        };
        let range = match tensor {
            Some(t) => {
                let at = self.places(block).0[t];
                at..at + self.layout.layout(block)[t].len
            }
            None => 0..map.len(),
        };
        if self.blocks[block].tier == SourceTier::Disk {
            if self.disk_mode == crate::io::ReadMode::Direct {
                let _ = map.release(range.clone(), reader.file());
            }
            let _ = map.forget(range);
        } else if !matches!(map.written(range.clone()), Ok(false)) {
            let _ = map.forget(range);
        }
        true
    }

    /// Whether `block`'s overlay file keeps its page cache: a RAM-tier block used in place
    /// lives there, as the checkpoint's RAM tier does.
    fn keeps_cache(&self, block: usize) -> bool {
        self.layout.is_in_place(block) && self.blocks[block].tier == SourceTier::Ram
    }

    /// The private map of `block`'s overlay file and each tensor's place in it, for a block
    /// used in place with an image.
    pub(super) fn mapped_image(&self, block: usize) -> Option<(Arc<MappedFile>, Vec<usize>)> {
        let overlay = self.overlays[block]
            .read()
            .unwrap_or_else(|p| p.into_inner());
        match &overlay.image {
            Some(Image::File { map: Some(map), .. }) => Some((map.clone(), self.places(block).0)),
            _ => None,
        }
    }

    /// The checkpoint's staged bytes of `tensors` of `block` (and of their staged scales), each
    /// with its offset in the staged layout: from the RAM tier's image where the block has one
    /// (converted tensors are only there), else read from the files, those tensors alone.
    fn original_tensors(
        &self,
        block: usize,
        tensors: &[usize],
    ) -> Result<Vec<(usize, Vec<u8>)>, StreamError> {
        let layout = self.layout.layout(block);
        let mut out = Vec::new();
        if self.blocks[block].tier == SourceTier::Ram && self.ram_threads.is_some() {
            // Held in private memory (converted, perhaps): read in first if it was not yet.
            self.images()?;
        }
        if let Some(image) = self.image_unpatched(block) {
            let bytes = image.bytes();
            for &t in tensors {
                let s = &layout[t];
                for (at, len) in
                    std::iter::once((s.offset, s.len)).chain(s.scale.map(|c| (c.offset, c.len)))
                {
                    out.push((at, bytes[at..at + len].to_vec()));
                }
            }
            return Ok(out);
        }
        let starts = &self.layout.blocks[block].file_starts;
        let (places, _) = self.places(block);
        for &t in tensors {
            let (s, info) = (&layout[t], &self.blocks[block].tensors[t]);
            let reader = FileReader::open(&self.files[info.file], crate::io::ReadMode::Buffered)
                .map_err(|source| StreamError::Open {
                    file: self.files[info.file].clone(),
                    source: Box::new(source),
                })?;
            let mut bytes = vec![0u8; s.len];
            reader
                .read_exact_at(starts[t], &mut bytes)
                .map_err(|e| StreamError::read(block, &self.blocks[block], info, &self.files, e))?;
            out.push((places[t], bytes));
        }
        Ok(out)
    }

    fn keep_image(
        &self,
        block: usize,
        buf: AlignedBuf,
        place: PatchPlace,
        keys: &BTreeMap<usize, String>,
    ) -> Result<Image, StreamError> {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match (place, store) {
            (PatchPlace::File, Some(store)) => {
                let len = self.places(block).1;
                let cached = self.keeps_cache(block);
                let path = store.create(&self.overlay_name(block, keys), &buf[..len], cached)?;
                self.open_file_image(block, path, store)
            }
            (PatchPlace::File, None) => Err(StreamError::Patch {
                block,
                name: self.blocks[block].name.clone(),
                tensor: "the block".into(),
                reason: "no overlay folder is set for its engine".into(),
            }),
            (PatchPlace::Memory, _) => {
                if self.blocks[block].tier == SourceTier::Ram {
                    // The image stands for the block now: the map's pages of it can go.
                    self.release(block, false);
                }
                Ok(Image::Memory(buf))
            }
        }
    }

    /// The image of `block` in the overlay file at `path` (held by `store`): read as the disk
    /// tier is, or mapped for a block used in place; a RAM-tier block's pages of the checkpoint
    /// are given back.
    fn open_file_image(
        &self,
        block: usize,
        path: PathBuf,
        store: Arc<OverlayStore>,
    ) -> Result<Image, StreamError> {
        {
            {
                let reader = match FileReader::open(&path, self.disk_mode) {
                    Ok(r) => r,
                    Err(e) => {
                        store.release(&path, true);
                        return Err(StreamError::Overlay {
                            path,
                            what: "open the overlay file",
                            source: std::io::Error::other(e),
                        });
                    }
                };
                let map = if self.layout.is_in_place(block) {
                    match MappedFile::open_private(&path) {
                        Ok(map) => Some(Arc::new(map)),
                        Err(e) => {
                            store.release(&path, true);
                            return Err(StreamError::Overlay {
                                path,
                                what: "map the overlay file",
                                source: std::io::Error::other(e),
                            });
                        }
                    }
                } else {
                    None
                };
                if self.blocks[block].tier == SourceTier::Ram {
                    // The image stands for the block now: its pages of the checkpoint can go.
                    self.release(block, false);
                }
                Ok(Image::File {
                    path,
                    reader,
                    store,
                    map,
                })
            }
        }
    }

    /// The overlay file's name: the checkpoint's files as they are now, the block, its staged
    /// form, and the key of each patch.
    fn overlay_name(&self, block: usize, keys: &BTreeMap<usize, String>) -> String {
        let b = &self.blocks[block];
        let mut parts: Vec<String> = Vec::new();
        let mut files: Vec<usize> = b.tensors.iter().map(|t| t.file).collect();
        files.sort_unstable();
        files.dedup();
        for f in files {
            parts.push(format!("{}:{:?}", self.files[f].display(), self.stamps[f]));
        }
        parts.push(b.name.clone());
        parts.push(format!(
            "{}:{:?}",
            self.layout.block_len(block),
            self.storage
        ));
        let layout = self.layout.layout(block);
        for (t, k) in keys {
            parts.push(format!("{}={k}", layout[*t].name));
        }
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        OverlayStore::name_for(&refs)
    }
}

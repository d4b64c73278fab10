//! A leased staging buffer: the block's bytes while it is copied to the device.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::pool::SlotState;
use super::source::{InPlaceImage, Source};
use super::{Shared, StagedTensor, StreamError};
use crate::io::{AlignedBuf, WritableSpan};

/// Names a tensor of a block: its index in the block's tensor list, or its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKey<'a> {
    /// Index in the block's tensor list, from 0.
    Index(usize),
    /// The tensor's name in the checkpoint.
    Name(&'a str),
}

impl From<usize> for TensorKey<'_> {
    fn from(i: usize) -> Self {
        TensorKey::Index(i)
    }
}

impl<'a> From<&'a str> for TensorKey<'a> {
    fn from(n: &'a str) -> Self {
        TensorKey::Name(n)
    }
}

impl<'a> From<&'a String> for TensorKey<'a> {
    fn from(n: &'a String) -> Self {
        TensorKey::Name(n)
    }
}

/// A staged block, held until released or dropped. While it lives its staging buffer is not
/// refilled.
#[derive(Debug)]
pub struct Lease {
    pub(super) shared: Arc<Shared>,
    /// Holds the maps a block used in place points into, for as long as the lease lives.
    pub(super) source: Arc<dyn Source>,
    pub(super) block: usize,
    pub(super) slot: usize,
    pub(super) len: usize,
    /// Moved out of the pool for the lease's lifetime; `None` only after it went back.
    pub(super) buf: Option<AlignedBuf>,
    pub(super) waited: Duration,
    pub(super) hit: bool,
    /// Set by [`discard`](Self::discard): the staged bytes are not to be reused.
    pub(super) discarded: AtomicBool,
    /// The generation of the block's bytes it holds (see `State::generation`).
    pub(super) generation: u64,
    /// For a block used in place with a patched image: the image's map, which its tensors are
    /// views of instead of the checkpoint's.
    pub(super) image: Option<InPlaceImage>,
}

impl Lease {
    /// The block index.
    pub fn block(&self) -> usize {
        self.block
    }

    /// The index of the staging buffer (into [`Engine::staging_buffers`](super::Engine::staging_buffers)).
    pub fn buffer_index(&self) -> usize {
        self.slot
    }

    /// The block's staged bytes: every tensor at its (64-byte aligned) layout offset, with padding
    /// between them; past the last tensor of a disk-tier block, what is left of its read area.
    /// A block used in place has no staged bytes (see [`tensor`](Self::tensor)).
    pub fn bytes(&self) -> &[u8] {
        if self.in_place() {
            return &[];
        }
        &self.buf.as_ref().expect("a live lease holds its buffer")[..self.len]
    }

    /// Whether the block is used in place from the map of its files: its tensors are views of
    /// the file's pages, and [`bytes`](Self::bytes) is empty.
    pub fn in_place(&self) -> bool {
        self.shared.layout.is_in_place(self.block)
    }

    /// The bytes of one tensor of the block, in the dtype its layout entry names: in the staging
    /// buffer, or, for a block used in place, in the file's map (private: a write stays in this
    /// process and is undone when the lease goes).
    pub fn tensor<'k>(&self, key: impl Into<TensorKey<'k>>) -> Result<&[u8], StreamError> {
        let (index, t) = self.staged(key.into())?;
        if let Some((map, places)) = &self.image {
            return map
                .slice(places[index], places[index] + t.len)
                .map_err(|e| self.image_error(e));
        }
        if self.in_place() {
            return self.source.in_place(self.block, index);
        }
        Ok(&self.bytes()[t.offset..t.offset + t.len])
    }

    /// Gives back the pages of one tensor of a block used in place, once the caller is done with
    /// its views (they would fault the pages back in); does nothing for a staged block or a
    /// RAM-tier one (see [`Engine::unmaps_as_used`](super::Engine::unmaps_as_used)).
    pub fn forget_tensor<'k>(&self, key: impl Into<TensorKey<'k>>) -> Result<(), StreamError> {
        let (index, _) = self.staged(key.into())?;
        if self.in_place() {
            self.source.forget_tensor(self.block, index);
        }
        Ok(())
    }

    /// The per-row f32 scales (little-endian) of a tensor the engine quantized to fp8; `None` for
    /// every other tensor.
    pub fn scale<'k>(&self, key: impl Into<TensorKey<'k>>) -> Result<Option<&[u8]>, StreamError> {
        let (_, t) = self.staged(key.into())?;
        Ok(t.scale.map(|s| &self.bytes()[s.offset..s.offset + s.len]))
    }

    /// Every tensor of the leased block, as staged.
    pub fn layout(&self) -> &[StagedTensor] {
        self.shared.layout.layout(self.block)
    }

    /// The tensor `key` names, with its index in the block's layout.
    pub(super) fn staged(&self, key: TensorKey<'_>) -> Result<(usize, &StagedTensor), StreamError> {
        let tensors = self.shared.layout.layout(self.block);
        let found = match key {
            TensorKey::Index(i) => tensors.get(i).map(|t| (i, t)),
            TensorKey::Name(n) => tensors.iter().enumerate().find(|(_, t)| t.name == n),
        };
        found.ok_or_else(|| StreamError::UnknownTensor {
            block: self.block,
            name: self.shared.names[self.block].clone(),
            tensor: match key {
                TensorKey::Index(i) => format!("#{i}"),
                TensorKey::Name(n) => n.to_owned(),
            },
        })
    }

    /// How long `acquire` waited for the block.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Whether the block was already staged when acquired.
    pub fn was_hit(&self) -> bool {
        self.hit
    }

    /// Marks the staged bytes as spoiled (something wrote to them): when the lease goes, the
    /// buffer comes back empty and the block is staged again before its next run.
    pub fn discard(&self) {
        self.discarded.store(true, Ordering::Relaxed);
    }
}

impl Lease {
    fn image_error(&self, source: crate::io::IoError) -> StreamError {
        StreamError::Patch {
            block: self.block,
            name: self.shared.names[self.block].clone(),
            tensor: "its image".into(),
            reason: source.to_string(),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        if self.in_place() {
            // Nothing of ours points into the pages now (the views went before the lease).
            self.source.forget(self.block);
        }
        let mut st = self.shared.lock();
        let stamp = st.tick();
        st.slots[self.slot].buf = Some(buf);
        let stale = st.generation[self.block] != self.generation;
        let s = &mut st.slots[self.slot];
        s.state = if stale || self.discarded.load(Ordering::Relaxed) {
            SlotState::Empty
        } else {
            SlotState::Ready(self.block)
        };
        s.stamp = stamp;
        drop(st);
        self.shared.cv.notify_all();
    }
}

// A lease's bytes as writable spans, for consumers (torch, through the binding) that want views
// they may write: every span is memory a write cannot carry past the lease.
//
// A staged block's spans point into the staging buffer the lease owns alone (moved out of the
// pool while the lease lives): a write stays in that buffer, which goes back to the pool with the
// lease (call [`Lease::discard`] after writing, so the block is staged again). A block used in
// place gives spans of its file's private (copy-on-write) map: a write makes this process's own
// copy of the page, never the file's, and the lease's end drops those copies.
impl Lease {
    /// The staged block as a writable span (empty for a block used in place), as
    /// [`bytes`](Self::bytes) lays it out.
    pub fn bytes_writable(&self) -> WritableSpan {
        let buf = self.buf.as_ref().expect("a live lease holds its buffer");
        let len = if self.in_place() { 0 } else { self.len };
        buf.writable(0, len)
            .expect("the staged length fits its buffer")
    }

    /// One tensor's bytes as a writable span: in the staging buffer the lease owns, or, for a
    /// block used in place, in the private map of its file.
    pub fn tensor_writable<'k>(
        &self,
        key: impl Into<TensorKey<'k>>,
    ) -> Result<WritableSpan, StreamError> {
        let (index, t) = self.staged(key.into())?;
        if let Some((map, places)) = &self.image {
            return map
                .writable(places[index], places[index] + t.len)
                .map_err(|e| self.image_error(e));
        }
        if self.in_place() {
            return self.source.in_place_writable(self.block, index);
        }
        let buf = self.buf.as_ref().expect("a live lease holds its buffer");
        Ok(buf
            .writable(t.offset, t.len)
            .expect("a layout entry lies inside its staged block"))
    }
}

//! A lease's bytes as writable spans, for consumers (torch, through the binding) that want views
//! they may write: every span is memory a write cannot carry past the lease.
//!
//! A staged block's spans point into the staging buffer the lease owns alone (moved out of the
//! pool while the lease lives): a write stays in that buffer, which goes back to the pool with the
//! lease (call [`Lease::discard`] after writing, so the block is staged again). A block used in
//! place gives spans of its file's private (copy-on-write) map: a write makes this process's own
//! copy of the page, never the file's, and the lease's end drops those copies.

use super::lease::{Lease, TensorKey};
use super::StreamError;
use crate::io::WritableSpan;

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
        if self.in_place() {
            return self.source.in_place_writable(self.block, index);
        }
        let buf = self.buf.as_ref().expect("a live lease holds its buffer");
        Ok(buf
            .writable(t.offset, t.len)
            .expect("a layout entry lies inside its staged block"))
    }
}

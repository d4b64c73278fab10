//! Memory that may be lent out as writable views (to torch, through the binding).
//!
//! A [`WritableSpan`] can only be made here, from one of three kinds of memory, so a consumer that
//! is handed one knows a write through it reaches nothing but its owner's own bytes:
//! - an [`AlignedBuf`]: heap memory owned by one value (a staging buffer a lease owns alone);
//! - a [`PooledPages`]: private anonymous memory owned by one value (a tensor's region from a
//!   page pool);
//! - a private (copy-on-write) [`MappedFile`]: a write makes this process's own copy of the page,
//!   never the file's or another process's.
//!
//! A shared read-only map, or bytes only known as `&[u8]`, cannot make one.

use std::ptr::NonNull;

use super::{AlignedBuf, IoError, MappedFile, PooledPages};

/// `len` bytes at `ptr`, writable, in memory that is either owned by one value or privately
/// mapped. The pointer comes from the owner's raw allocation (never from a `&[u8]`), so it
/// carries the right to write. It stays valid while its owner lives and is not moved out of
/// (an [`AlignedBuf`] never moves its allocation; a map stays where it was made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritableSpan {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a span is an address and a length; it gives no access by itself (using it is unsafe
// and the user's contract), so sending or sharing it between threads is sound.
unsafe impl Send for WritableSpan {}
// SAFETY: as for Send.
unsafe impl Sync for WritableSpan {}

impl WritableSpan {
    /// The first byte (dangling but non-null for an empty span).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes `start..start + len` of this span.
    fn sub(self, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `start <= self.len`, so the offset stays inside (or one past) the allocation.
        let ptr = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(start)) };
        Some(WritableSpan { ptr, len })
    }
}

impl AlignedBuf {
    /// Bytes `start..start + len` of the buffer as a writable span, `None` past its end. The
    /// buffer owns its allocation alone: no other value's memory is reachable through the span.
    pub fn writable(&self, start: usize, len: usize) -> Option<WritableSpan> {
        WritableSpan {
            ptr: self.raw_ptr(),
            len: self.len(),
        }
        .sub(start, len)
    }
}

impl PooledPages {
    /// The whole region as a writable span. The region owns its pages alone (the pool hands a
    /// page to one region at a time): no other value's memory is reachable through the span.
    pub fn writable(&self) -> WritableSpan {
        WritableSpan {
            ptr: self.raw_ptr(),
            len: self.len(),
        }
    }

    /// Bytes `start..start + len` of the region as a writable span, `None` past its end.
    pub fn writable_part(&self, start: usize, len: usize) -> Option<WritableSpan> {
        self.writable().sub(start, len)
    }
}

impl MappedFile {
    /// Bytes `start..end` of a private (copy-on-write, writable) map as a writable span: a write
    /// through it makes this process's own copy of the page and never reaches the file. An error
    /// for a shared read-only map (writing it would fault) or a range past the file's end.
    pub fn writable(&self, start: usize, end: usize) -> Result<WritableSpan, IoError> {
        let range = self.check(start, end)?;
        let ptr = self.private_ptr().ok_or_else(|| IoError::Map {
            path: self.path().to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the map is shared and read-only: it gives no writable view",
            ),
        })?;
        let whole = WritableSpan {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len: self.len(),
        };
        Ok(whole
            .sub(range.start, range.len())
            .expect("checked against the map's length"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_write_through_a_private_maps_span_never_reaches_the_file() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        f.flush().unwrap();
        let map = MappedFile::open_private(f.path()).unwrap();
        let span = map.writable(4096, 4100).unwrap();
        // SAFETY: the span is 4 bytes of a live private map; no reference to them is held.
        unsafe { std::ptr::write_bytes(span.as_mut_ptr(), 0xff, span.len()) };
        assert_eq!(&map.bytes()[4096..4100], &[0xff; 4]);
        assert_eq!(std::fs::read(f.path()).unwrap(), vec![7u8; 8192]);
        // Another map of the same file (another view) still shows the file.
        let other = MappedFile::open_private(f.path()).unwrap();
        assert_eq!(&other.bytes()[4096..4100], &[7u8; 4]);
    }

    #[test]
    fn a_shared_map_gives_no_writable_span() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[1u8; 64]).unwrap();
        f.flush().unwrap();
        let map = MappedFile::open(f.path()).unwrap();
        assert!(map.writable(0, 8).is_err());
        assert!(MappedFile::open_private(f.path())
            .unwrap()
            .writable(60, 65)
            .is_err());
    }

    #[test]
    fn a_buffers_span_stays_inside_it() {
        let buf = AlignedBuf::new(100).unwrap();
        let span = buf.writable(64, 36).unwrap();
        assert_eq!(span.as_mut_ptr() as usize - buf.as_ptr() as usize, 64);
        assert!(buf.writable(4000, 97).is_none());
        assert!(buf.writable(usize::MAX, 2).is_none());
    }
}

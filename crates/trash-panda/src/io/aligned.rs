//! Heap buffers aligned for O_DIRECT, allocated once and reused (the future staging pool).

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::IoError;

/// The alignment O_DIRECT needs on every filesystem we meet (logical block size up to 4 KiB), and
/// the page size, so a buffer can also be registered as pinned memory page by page.
pub const DIRECT_ALIGN: usize = 4096;

/// A zero-initialised heap buffer whose address and length are multiples of its alignment.
///
/// The length is fixed at creation (rounded up to the alignment). Reuse one buffer for many reads:
/// the first write to freshly allocated memory costs page faults that a reused buffer does not.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); no interior mutability, so
// moving it to another thread or sharing `&AlignedBuf` (read-only bytes) is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: see Send: `&AlignedBuf` only gives `&[u8]`, which is Sync.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of at least `len` bytes aligned to [`DIRECT_ALIGN`].
    pub fn new(len: usize) -> Result<Self, IoError> {
        Self::with_alignment(len, DIRECT_ALIGN)
    }

    /// A buffer of at least `len` bytes (rounded up to `align`) aligned to `align`, which must be
    /// a power of two.
    pub fn with_alignment(len: usize, align: usize) -> Result<Self, IoError> {
        let fail = |reason| IoError::Alloc { len, align, reason };
        if !align.is_power_of_two() {
            return Err(fail("the alignment is not a power of two"));
        }
        let rounded = len
            .checked_add(align - 1)
            .map(|l| l & !(align - 1))
            .ok_or_else(|| fail("the length overflows"))?;
        // A zero-sized layout cannot be allocated; keep one aligned unit behind an empty buffer so
        // the pointer is always real and Drop has a single path.
        let layout = Layout::from_size_align(rounded.max(align), align)
            .map_err(|_| fail("the length is too large"))?;
        // SAFETY: the layout has a non-zero size (at least `align` bytes).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| fail("out of memory"))?;
        Ok(AlignedBuf {
            ptr,
            len: rounded,
            layout,
        })
    }

    /// The alignment of the address and of the length.
    pub fn align(&self) -> usize {
        self.layout.align()
    }

    /// The length in bytes (a multiple of [`align`](Self::align)).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocation's own pointer (with the right to write), for [`writable`](Self::writable).
    pub(super) fn raw_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Writes every page once, so later reads into the buffer do not pay first-touch page faults.
    pub fn prefault(&mut self) {
        let page = DIRECT_ALIGN.min(self.len.max(1));
        for i in (0..self.len).step_by(page) {
            self[i] = 0;
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to an allocation of at least `len` initialised (zeroed) bytes that
        // lives as long as `self`; the shared borrow of self prevents concurrent mutation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and the unique borrow of self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly `self.layout` and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.align())
            .finish()
    }
}

/// Rounds `x` down to a multiple of `align` (a power of two).
pub(crate) fn align_down(x: u64, align: usize) -> u64 {
    x & !(align as u64 - 1)
}

/// Rounds `x` up to a multiple of `align` (a power of two), saturating at the largest multiple.
pub(crate) fn align_up(x: u64, align: usize) -> u64 {
    align_down(x.saturating_add(align as u64 - 1), align)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_length_and_aligns_address() {
        for (len, align) in [
            (0, 4096),
            (1, 4096),
            (4096, 4096),
            (5000, 4096),
            (3, 512),
            (100, 64),
        ] {
            let b = AlignedBuf::with_alignment(len, align).unwrap();
            assert_eq!(b.as_ptr() as usize % align, 0);
            assert_eq!(b.len() % align, 0);
            assert!(b.len() >= len && b.len() < len + align);
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn rejects_bad_alignment_and_huge_sizes() {
        assert!(matches!(
            AlignedBuf::with_alignment(10, 3000),
            Err(IoError::Alloc { .. })
        ));
        assert!(AlignedBuf::new(usize::MAX - 10).is_err());
        assert!(AlignedBuf::new(isize::MAX as usize).is_err());
    }

    #[test]
    fn writable_and_sendable() {
        let mut b = AlignedBuf::new(10_000).unwrap();
        b[..4].copy_from_slice(b"abcd");
        b.prefault();
        let b = std::thread::spawn(move || b).join().unwrap();
        assert_eq!(&b[..4], &[0, b'b', b'c', b'd']);
    }

    #[test]
    fn rounding_helpers() {
        assert_eq!(align_down(4097, 4096), 4096);
        assert_eq!(align_up(4097, 4096), 8192);
        assert_eq!(align_up(0, 4096), 0);
        assert_eq!(align_up(u64::MAX, 4096), u64::MAX - 4095);
    }
}

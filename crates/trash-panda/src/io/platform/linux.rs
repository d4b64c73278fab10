//! Linux (and the BSDs with O_DIRECT): O_DIRECT opens, `posix_fadvise` for the page cache.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub(crate) use super::unix::{map_anonymous, page_residency, page_size, prefetch, read_at, unmap};
use super::OpError;

pub(crate) const UNBUFFERED: &str = "O_DIRECT";

pub(crate) fn open_unbuffered(path: &Path) -> io::Result<Option<File>> {
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        // tmpfs and some FUSE filesystems refuse O_DIRECT at open.
        Err(e) if is_refusal(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// O_DIRECT says EINVAL both for a filesystem that does not support it and for a misaligned
/// request; the reader tells them apart by whether a read has already worked.
pub(crate) fn is_refusal(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

pub(crate) fn refusal() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

pub(crate) const CAN_DROP_CACHE: bool = true;

/// `madvise(MADV_POPULATE_READ)` over the pages that hold `bytes` (part of a live map): returns
/// once every page is in memory, read with the kernel's read-ahead instead of one fault at a time.
/// Kernels before 5.14 refuse it with EINVAL; the caller then copies through the map.
pub(crate) fn populate(bytes: &[u8]) -> Result<(), OpError> {
    super::unix::advise(bytes, libc::MADV_POPULATE_READ).map_err(|e| ("madvise(POPULATE_READ)", e))
}

/// Makes the pages of the `len` bytes at `start` present and writable now
/// (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14 on), as a write to each would, without writing:
/// pages already there keep their bytes. A reader that fills fresh memory then finds its pages
/// faulted by whoever called this, on another core, instead of faulting them one at a time in
/// its read. Elsewhere (older kernels, the BSDs) an error: the reads fault the pages themselves.
///
/// # Safety
///
/// `start..start + len` must lie in memory this process has mapped writable, for the call.
pub(crate) unsafe fn populate_write(start: *mut u8, len: usize) -> Result<(), OpError> {
    #[cfg(target_os = "linux")]
    {
        if len == 0 {
            return Ok(());
        }
        let page = page_size();
        let first = start as usize - start as usize % page;
        let span = len + (start as usize - first);
        loop {
            // SAFETY: `first..first + span` covers only the pages that hold the caller's range,
            // which the caller keeps mapped for the call; this advice changes no byte of a
            // present page and maps zeroed ones where none were, as the first write would.
            let rc = unsafe {
                libc::madvise(first as *mut libc::c_void, span, libc::MADV_POPULATE_WRITE)
            };
            if rc == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(("madvise(POPULATE_WRITE)", e));
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (start, len);
        Err((
            "madvise(POPULATE_WRITE)",
            io::Error::from(io::ErrorKind::Unsupported),
        ))
    }
}

pub(crate) fn drop_cache(file: &File) -> Result<(), OpError> {
    fadvise(file, 0, 0, libc::POSIX_FADV_DONTNEED).map_err(|e| ("posix_fadvise(DONTNEED)", e))
}

/// Gives back a mapped range's memory: the process's pages (`madvise(DONTNEED)`) and the page
/// cache's (`posix_fadvise(DONTNEED)` on the file range `cache`, which holds the mapped one).
pub(crate) fn release_range(bytes: &[u8], file: &File, cache: Range<u64>) -> Result<(), OpError> {
    super::unix::forget(bytes).map_err(|e| ("madvise(DONTNEED)", e))?;
    fadvise(
        file,
        cache.start,
        cache.end - cache.start,
        libc::POSIX_FADV_DONTNEED,
    )
    .map_err(|e| ("posix_fadvise(DONTNEED)", e))
}

pub(crate) fn advise_read(file: &File, offset: u64, len: u64) -> Result<(), OpError> {
    fadvise(file, offset, len, libc::POSIX_FADV_WILLNEED)
        .map_err(|e| ("posix_fadvise(WILLNEED)", e))
}

fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for the call.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, advice) };
    if rc != 0 {
        // posix_fadvise returns the error number instead of setting errno.
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Drops this process's pages of a mapped range (`madvise(DONTNEED)`); the page cache keeps them.
pub(crate) fn forget_pages(bytes: &[u8]) -> Result<(), OpError> {
    super::unix::forget(bytes).map_err(|e| ("madvise(DONTNEED)", e))
}

/// Whether this process wrote to any page of `bytes`, part of a private map of a file: a page
/// written holds this process's copy (an anonymous page, present or swapped out) instead of the
/// file's page. Asked with one `PAGEMAP_SCAN` of `/proc/self/pagemap` (Linux 6.7 on), which
/// walks the range's page tables and stops at the first such page; an error where the kernel
/// cannot say.
pub(crate) fn written_pages(bytes: &[u8]) -> Result<bool, OpError> {
    let fail = |e| ("ioctl(PAGEMAP_SCAN)", e);
    let Some((start, len)) = super::unix::page_span(bytes) else {
        return Ok(false);
    };
    // Opened each time: a descriptor kept across a fork would read the parent's page tables.
    let pagemap =
        File::open("/proc/self/pagemap").map_err(|e| ("opening /proc/self/pagemap", e))?;
    let page = super::unix::page_size();
    let mut found = PageRegion::default();
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        start: start as u64,
        end: (start + len.next_multiple_of(page)) as u64,
        vec: &mut found as *mut PageRegion as u64,
        vec_len: 1,
        max_pages: 1,
        // Not the file's page, and present or swapped out.
        category_inverted: PAGE_IS_FILE,
        category_mask: PAGE_IS_FILE,
        category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        ..PmScanArg::default()
    };
    // SAFETY: `arg` is a valid pm_scan_arg whose `size` is its own; `vec` points at one live,
    // writable page_region (`vec_len` 1) that outlives the call; the scan only reads page tables
    // of this process's range and writes `found` and `arg.walk_end`.
    let rc = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
    if rc < 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    Ok(rc > 0)
}

// The kernel's pagemap scan (include/uapi/linux/fs.h).
const PAGEMAP_SCAN: u64 = 0xC060_6610; // _IOWR('f', 16, struct pm_scan_arg)
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

#[repr(C)]
#[derive(Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `madvise(MADV_HUGEPAGE)` over a mapped range: a hint that changes no content.
pub(crate) fn advise_huge(bytes: &[u8]) -> Result<(), OpError> {
    super::unix::advise(bytes, libc::MADV_HUGEPAGE).map_err(|e| ("madvise(HUGEPAGE)", e))
}

/// Whether a pool may keep pages given back and hand out parts of them (`munmap` takes any
/// page-aligned part of a map).
pub(crate) const KEEPS_PAGES: bool = true;

/// Whether [`move_pages`] can move pages here.
pub(crate) const CAN_MOVE_PAGES: bool = cfg!(target_os = "linux");

/// Moves the pages of `len` bytes at `from` to `to` with `mremap`, contents and all, with no
/// page faulted again: `to..to + len` is replaced, `from..from + len` is left unmapped.
///
/// # Safety
/// Both ranges are page-aligned, lie in private anonymous maps made by [`map_anonymous`], do
/// not overlap, and nothing refers to either (the moved bytes are read through `to` after).
pub(crate) unsafe fn move_pages(from: *mut u8, len: usize, to: *mut u8) -> Result<(), OpError> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the caller's contract; MREMAP_FIXED replaces whatever was mapped at `to`.
        let got = unsafe {
            libc::mremap(
                from.cast(),
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                to.cast::<libc::c_void>(),
            )
        };
        if got == libc::MAP_FAILED {
            return Err(("mremap", io::Error::last_os_error()));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (from, len, to);
        Err(("mremap", io::Error::from(io::ErrorKind::Unsupported)))
    }
}

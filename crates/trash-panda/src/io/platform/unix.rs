//! The parts Linux and macOS share: `pread`, `mincore`, `madvise`, anonymous maps and the page
//! size.

use std::ffi::c_void;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.read_at(buf, offset)
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf only reads its argument.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Fills `out` (one byte per page, bit 0 set when resident) for `window`, which must start on a
/// page boundary (a map's start plus a multiple of the page size).
pub(crate) fn page_residency(window: &[u8], out: &mut [u8]) -> Result<(), super::OpError> {
    let pages = window.len().div_ceil(page_size());
    if out.len() < pages || !(window.as_ptr() as usize).is_multiple_of(page_size()) {
        return Err(("mincore", io::Error::from(io::ErrorKind::InvalidInput)));
    }
    // SAFETY: the window lies inside a live map and starts on a page (checked above), and `out`
    // has one entry per page of it, as mincore requires; mincore only writes `out`.
    let rc = unsafe {
        libc::mincore(
            window.as_ptr() as *mut c_void,
            window.len(),
            out.as_mut_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(("mincore", io::Error::last_os_error()));
    }
    Ok(())
}

/// `madvise(MADV_WILLNEED)` over the pages that hold `bytes` (part of a live map).
pub(crate) fn prefetch(bytes: &[u8]) -> Result<(), super::OpError> {
    advise(bytes, libc::MADV_WILLNEED).map_err(|e| ("madvise(WILLNEED)", e))
}

/// `madvise(advice)` over the pages that hold `bytes` (part of a live map). Only for advice that
/// reads or hints (WILLNEED, POPULATE_READ, HUGEPAGE): none of them changes what the pages hold.
pub(crate) fn advise(bytes: &[u8], advice: libc::c_int) -> io::Result<()> {
    let Some((aligned, len)) = page_span(bytes) else {
        return Ok(());
    };
    loop {
        // SAFETY: `aligned..start + bytes.len()` lies within the pages of the map that holds
        // `bytes` (maps start on a page), and the advice given here only reads pages in: it
        // changes no content and no mapping.
        let rc = unsafe { libc::madvise(aligned as *mut c_void, len, advice) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // POPULATE_READ can be interrupted by a signal part way; asking again resumes it.
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Drops this process's pages of `bytes`, part of a map of a file (`MADV_DONTNEED`): the next
/// access reads them from the file (or its cache) again. A shared read-only map loses nothing; a
/// private one also loses what this process wrote to those pages, and reads the file's bytes again
/// (which is what its callers want: weights used in place go back to the checkpoint's values).
pub(crate) fn forget(bytes: &[u8]) -> io::Result<()> {
    let Some((aligned, len)) = page_span(bytes) else {
        return Ok(());
    };
    // SAFETY: the range lies within the pages of a live file map (maps start on a page).
    // MADV_DONTNEED on a file map only drops page-table entries (and, for a private map, the
    // copies of pages this process wrote): a later access, concurrent or not, faults the file's
    // bytes back in. Memory stays mapped, so no reference into it dangles; callers drop pages
    // only when no Rust code reads them expecting the values written through the map.
    let rc = unsafe { libc::madvise(aligned as *mut c_void, len, libc::MADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The page-aligned start and the length of the pages that hold `bytes` (`None` when empty):
/// madvise takes whole pages.
pub(crate) fn page_span(bytes: &[u8]) -> Option<(usize, usize)> {
    if bytes.is_empty() {
        return None;
    }
    let start = bytes.as_ptr() as usize;
    let aligned = start - start % page_size();
    Some((aligned, bytes.len() + (start - aligned)))
}

/// `len` bytes (a multiple of the page size) of new private anonymous memory, read-write: no page
/// is present until it is first touched.
pub(crate) fn map_anonymous(len: usize) -> Result<std::ptr::NonNull<u8>, super::OpError> {
    // SAFETY: a new private anonymous map at an address the kernel picks: it aliases nothing.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANON,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(("mmap(MAP_ANONYMOUS)", io::Error::last_os_error()));
    }
    std::ptr::NonNull::new(ptr.cast()).ok_or((
        "mmap(MAP_ANONYMOUS)",
        io::Error::from(io::ErrorKind::OutOfMemory),
    ))
}

/// Unmaps `len` bytes at `ptr`, part of (or all of) a map made by [`map_anonymous`].
///
/// # Safety
/// `ptr..ptr + len` is page-aligned, lies in such a map, and nothing refers to it any more.
pub(crate) unsafe fn unmap(ptr: *mut u8, len: usize) -> Result<(), super::OpError> {
    // SAFETY: the caller's contract.
    if unsafe { libc::munmap(ptr.cast(), len) } != 0 {
        return Err(("munmap", io::Error::last_os_error()));
    }
    Ok(())
}

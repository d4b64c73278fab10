//! The parts Linux and macOS share: `pread`, `mincore`, `madvise` and the page size.

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
    if bytes.is_empty() {
        return Ok(());
    }
    let page = page_size();
    let start = bytes.as_ptr() as usize;
    let aligned = start - start % page;
    let len = bytes.len() + (start - aligned);
    // SAFETY: `aligned..start + bytes.len()` lies within the pages of the map that holds
    // `bytes` (maps start on a page), and WILLNEED only schedules reads: it changes no content.
    let rc = unsafe { libc::madvise(aligned as *mut c_void, len, libc::MADV_WILLNEED) };
    if rc != 0 {
        return Err(("madvise(WILLNEED)", io::Error::last_os_error()));
    }
    Ok(())
}

//! macOS: no O_DIRECT; `F_NOCACHE` keeps reads of a descriptor out of the unified buffer cache,
//! `F_RDADVISE` asks for a range ahead and `F_RDAHEAD` turns on sequential read-ahead.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::Path;

pub(crate) use super::unix::{map_anonymous, page_residency, page_size, prefetch, read_at, unmap};
use super::OpError;

pub(crate) const UNBUFFERED: &str = "F_NOCACHE";

pub(crate) fn open_unbuffered(path: &Path) -> io::Result<Option<File>> {
    let file = File::open(path)?;
    // F_NOCACHE is advice on the descriptor: a filesystem that ignores it still reads correctly,
    // so a failure here means "read buffered", not an error.
    if fcntl(&file, libc::F_NOCACHE, 1).is_err() {
        return Ok(None);
    }
    // The unbuffered reader asks for whole staging buffers; read-ahead beyond them would only
    // fill the cache F_NOCACHE keeps us out of.
    let _ = fcntl(&file, libc::F_RDAHEAD, 0);
    Ok(Some(file))
}

/// F_NOCACHE has no alignment rule; EINVAL from a first read still means the descriptor cannot
/// serve it, under the same fallback rule as O_DIRECT.
pub(crate) fn is_refusal(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

pub(crate) fn refusal() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// macOS has no per-file eviction for an unprivileged process (`purge` empties the whole cache
/// and needs root), so the cache is left alone and callers report a warm measurement.
pub(crate) const CAN_DROP_CACHE: bool = false;

pub(crate) fn drop_cache(_file: &File) -> Result<(), OpError> {
    Err((
        "dropping a file's cached pages (macOS has no per-file eviction)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// Gives back a mapped range's pages in this process (`madvise(DONTNEED)`); macOS has no
/// per-file eviction, so the file's cache keeps them until the system needs the memory.
pub(crate) fn release_range(bytes: &[u8], _file: &File, _cache: Range<u64>) -> Result<(), OpError> {
    super::unix::forget(bytes).map_err(|e| ("madvise(DONTNEED)", e))
}

pub(crate) fn advise_read(file: &File, offset: u64, len: u64) -> Result<(), OpError> {
    let fail = |e| ("fcntl(F_RDADVISE)", e);
    let offset = libc::off_t::try_from(offset).map_err(|_| fail(invalid()))?;
    // F_RDADVISE takes an int count; longer ranges are advised from their start.
    let count = libc::c_int::try_from(len).unwrap_or(libc::c_int::MAX);
    let advice = libc::radvisory {
        ra_offset: offset,
        ra_count: count,
    };
    // SAFETY: F_RDADVISE reads one radvisory struct, which lives across the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_RDADVISE, &advice) };
    if rc == -1 {
        return Err(fail(io::Error::last_os_error()));
    }
    let _ = fcntl(file, libc::F_RDAHEAD, 1);
    Ok(())
}

/// macOS has no synchronous populate of a map; the caller copies through the map instead.
pub(crate) fn populate(_bytes: &[u8]) -> Result<(), OpError> {
    Err((
        "populating a map (macOS has no MADV_POPULATE_READ)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

fn invalid() -> io::Error {
    io::Error::from(io::ErrorKind::InvalidInput)
}

fn fcntl(file: &File, cmd: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: F_NOCACHE and F_RDAHEAD take an int argument and touch no memory of ours.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, value) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process wrote to a page of a private map: the system cannot say here, so
/// callers give the pages back.
pub(crate) fn written_pages(_bytes: &[u8]) -> Result<bool, OpError> {
    Err((
        "telling written pages of a map (no pagemap on macOS)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// Drops this process's pages of a mapped range (`madvise(DONTNEED)`); the page cache keeps them.
pub(crate) fn forget_pages(bytes: &[u8]) -> Result<(), OpError> {
    super::unix::forget(bytes).map_err(|e| ("madvise(DONTNEED)", e))
}

/// No huge-page advice for file maps here.
pub(crate) fn advise_huge(_bytes: &[u8]) -> Result<(), OpError> {
    Err((
        "madvise(HUGEPAGE) (not available here)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// macOS has no way to make pages present without touching them: the reads fault them.
///
/// # Safety
///
/// None needed; unsafe to match the other platforms.
pub(crate) unsafe fn populate_write(_start: *mut u8, _len: usize) -> Result<(), OpError> {
    Err((
        "populating fresh memory (no MADV_POPULATE_WRITE on macOS)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// Whether a pool may keep pages given back and hand out parts of them (`munmap` takes any
/// page-aligned part of a map).
pub(crate) const KEEPS_PAGES: bool = true;

/// Whether [`move_pages`] can move pages here: macOS has no `mremap`.
pub(crate) const CAN_MOVE_PAGES: bool = false;

/// Moving pages between maps is Linux's `mremap`; see the Linux module.
///
/// # Safety
/// None needed: it does nothing.
pub(crate) unsafe fn move_pages(_from: *mut u8, _len: usize, _to: *mut u8) -> Result<(), OpError> {
    Err(("mremap", io::Error::from(io::ErrorKind::Unsupported)))
}

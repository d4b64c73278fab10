//! Windows: `FILE_FLAG_NO_BUFFERING` opens, `ReadFile` with the offset in an `OVERLAPPED`,
//! `PrefetchVirtualMemory` for maps. Windows keeps a file's pages on the standby list and has no
//! per-file eviction without administrator rights, so the page cache is left alone.

use std::ffi::c_void;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::windows::fs::OpenOptionsExt;
use std::os::windows::io::AsRawHandle;
use std::path::Path;

use windows_sys::Win32::Foundation::{ERROR_HANDLE_EOF, ERROR_INVALID_PARAMETER};
use windows_sys::Win32::Storage::FileSystem::{ReadFile, FILE_FLAG_NO_BUFFERING};
use windows_sys::Win32::System::Memory::{PrefetchVirtualMemory, WIN32_MEMORY_RANGE_ENTRY};
use windows_sys::Win32::System::SystemInformation::{GetSystemInfo, SYSTEM_INFO};
use windows_sys::Win32::System::Threading::GetCurrentProcess;
use windows_sys::Win32::System::IO::OVERLAPPED;

use super::OpError;

pub(crate) const UNBUFFERED: &str = "FILE_FLAG_NO_BUFFERING";

/// One `ReadFile` at `offset`. The offset travels in the OVERLAPPED, so threads sharing the
/// handle never race on a file pointer; on a synchronous handle the call still blocks.
pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    // ReadFile counts in u32. Larger requests are read 1 GiB at a time (a multiple of every
    // sector size, so unbuffered reads stay aligned); the caller's loop asks for the rest.
    const MAX_READ: u32 = 1 << 30;
    let len = u32::try_from(buf.len()).map_or(MAX_READ, |l| l.min(MAX_READ));
    let mut overlapped = OVERLAPPED::default();
    overlapped.Anonymous.Anonymous.Offset = offset as u32;
    overlapped.Anonymous.Anonymous.OffsetHigh = (offset >> 32) as u32;
    let mut read = 0u32;
    // SAFETY: the handle is open for the life of `file`; `buf` is writable for `len` bytes
    // (len <= buf.len()); `read` and `overlapped` outlive the call, which completes before it
    // returns because std opens handles for synchronous I/O.
    let ok = unsafe {
        ReadFile(
            file.as_raw_handle(),
            buf.as_mut_ptr(),
            len,
            &mut read,
            &mut overlapped,
        )
    };
    if ok == 0 {
        let e = io::Error::last_os_error();
        // A read that starts at or past the end is EOF, not a failure.
        if e.raw_os_error() == Some(ERROR_HANDLE_EOF as i32) {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(read as usize)
}

/// FILE_FLAG_NO_BUFFERING wants sector-aligned offsets, lengths and buffer addresses;
/// [`DIRECT_ALIGN`](crate::io::DIRECT_ALIGN) (4 KiB) is a multiple of the 512-byte and 4 KiB
/// sectors of every drive we meet.
pub(crate) fn open_unbuffered(path: &Path) -> io::Result<Option<File>> {
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(FILE_FLAG_NO_BUFFERING)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if is_refusal(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A misaligned unbuffered request, or a redirector that does not take the flag, fails with
/// ERROR_INVALID_PARAMETER: the same role as EINVAL under O_DIRECT.
pub(crate) fn is_refusal(e: &io::Error) -> bool {
    e.raw_os_error() == Some(ERROR_INVALID_PARAMETER as i32)
}

pub(crate) fn refusal() -> io::Error {
    io::Error::from_raw_os_error(ERROR_INVALID_PARAMETER as i32)
}

pub(crate) const CAN_DROP_CACHE: bool = false;

pub(crate) fn drop_cache(_file: &File) -> Result<(), OpError> {
    Err((
        "dropping a file's cached pages (Windows cannot evict one file without admin rights)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// Windows cannot say which pages of a file are cached (QueryWorkingSetEx only covers this
/// process's working set, not the standby list).
pub(crate) fn page_residency(_window: &[u8], _out: &mut [u8]) -> Result<(), OpError> {
    Err((
        "counting a file's cached pages (not available on Windows)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

pub(crate) fn prefetch(bytes: &[u8]) -> Result<(), OpError> {
    if bytes.is_empty() {
        return Ok(());
    }
    let range = WIN32_MEMORY_RANGE_ENTRY {
        VirtualAddress: bytes.as_ptr() as *mut c_void,
        NumberOfBytes: bytes.len(),
    };
    // SAFETY: the range lies inside a live view of a file (the caller's map); prefetching only
    // schedules reads into it and changes no content. GetCurrentProcess is a pseudo-handle.
    let ok = unsafe { PrefetchVirtualMemory(GetCurrentProcess(), 1, &range, 0) };
    if ok == 0 {
        return Err(("PrefetchVirtualMemory", io::Error::last_os_error()));
    }
    Ok(())
}

/// Windows has no synchronous populate of a view (PrefetchVirtualMemory returns before the reads
/// are done); the caller copies through the map instead.
pub(crate) fn populate(_bytes: &[u8]) -> Result<(), OpError> {
    Err((
        "populating a map (no synchronous populate on Windows)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// A view's pages stay in the working set until Windows trims it; nothing gives them back early.
pub(crate) fn release_range(
    _bytes: &[u8],
    _file: &File,
    _cache: Range<u64>,
) -> Result<(), OpError> {
    Err((
        "giving back a mapped range's pages (not available on Windows)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// Windows reads ahead on its own for sequential handles; there is no range advice to give.
pub(crate) fn advise_read(_file: &File, _offset: u64, _len: u64) -> Result<(), OpError> {
    Ok(())
}

pub(crate) fn page_size() -> usize {
    let mut info = SYSTEM_INFO::default();
    // SAFETY: GetSystemInfo fills the struct it is given and cannot fail.
    unsafe { GetSystemInfo(&mut info) };
    usize::try_from(info.dwPageSize)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// Whether this process wrote to a page of a private map: the system cannot say here, so
/// callers give the pages back.
pub(crate) fn written_pages(_bytes: &[u8]) -> Result<bool, OpError> {
    Err((
        "telling written pages of a view (not available on Windows)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// A view's pages stay in the working set until Windows trims it (blocks are not used in place
/// from maps here).
pub(crate) fn forget_pages(_bytes: &[u8]) -> Result<(), OpError> {
    Err((
        "giving back a view's pages (not available on Windows)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// No huge-page advice for file maps here.
pub(crate) fn advise_huge(_bytes: &[u8]) -> Result<(), OpError> {
    Err((
        "madvise(HUGEPAGE) (not available here)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// Windows has no way to make pages present without touching them: the reads fault them.
///
/// # Safety
///
/// None needed; unsafe to match the other platforms.
pub(crate) unsafe fn populate_write(_start: *mut u8, _len: usize) -> Result<(), OpError> {
    Err((
        "populating fresh memory (no MADV_POPULATE_WRITE on Windows)",
        io::Error::from(io::ErrorKind::Unsupported),
    ))
}

/// Whether a pool may keep pages given back and hand out parts of them: not here, where
/// `VirtualFree` releases only a whole allocation, so every region goes back whole.
pub(crate) const KEEPS_PAGES: bool = false;

/// Whether [`move_pages`] can move pages here: Windows has no `mremap`.
pub(crate) const CAN_MOVE_PAGES: bool = false;

/// `len` bytes of new committed private memory, read-write (pages appear on first touch).
pub(crate) fn map_anonymous(len: usize) -> Result<std::ptr::NonNull<u8>, OpError> {
    use windows_sys::Win32::System::Memory::{
        VirtualAlloc, MEM_COMMIT, MEM_RESERVE, PAGE_READWRITE,
    };
    // SAFETY: a new allocation at an address the system picks: it aliases nothing.
    let ptr = unsafe {
        VirtualAlloc(
            std::ptr::null(),
            len,
            MEM_COMMIT | MEM_RESERVE,
            PAGE_READWRITE,
        )
    };
    std::ptr::NonNull::new(ptr.cast()).ok_or_else(|| ("VirtualAlloc", io::Error::last_os_error()))
}

/// Releases an allocation made by [`map_anonymous`], whole (`len` is its length).
///
/// # Safety
/// `ptr` is the start of such an allocation, and nothing refers to it any more.
pub(crate) unsafe fn unmap(ptr: *mut u8, _len: usize) -> Result<(), OpError> {
    use windows_sys::Win32::System::Memory::{VirtualFree, MEM_RELEASE};
    // SAFETY: the caller's contract.
    if unsafe { VirtualFree(ptr.cast::<c_void>(), 0, MEM_RELEASE) } == 0 {
        return Err(("VirtualFree", io::Error::last_os_error()));
    }
    Ok(())
}

/// Moving pages between allocations is Linux's `mremap`.
///
/// # Safety
/// None needed: it does nothing.
pub(crate) unsafe fn move_pages(_from: *mut u8, _len: usize, _to: *mut u8) -> Result<(), OpError> {
    Err(("mremap", io::Error::from(io::ErrorKind::Unsupported)))
}

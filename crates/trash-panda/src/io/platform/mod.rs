//! The operating system's side of reading files, one module per platform behind the same
//! functions, so the readers, maps and cache tools above it carry no `cfg` of their own.
//!
//! Every platform module provides:
//! - `UNBUFFERED`: the name of its cache-bypassing open (for messages and reports);
//! - `read_at(file, buf, offset)`: one positional read that leaves no shared cursor behind;
//! - `open_unbuffered(path)`: the file opened to bypass the page cache, or `None` when the
//!   platform or the filesystem refuses, so the caller reads buffered instead;
//! - `is_refusal(err)` / `refusal()`: the error an unbuffered read gives for a request the
//!   filesystem will not serve unbuffered (the fallback rule), and one such error for tests;
//! - `drop_cache(file)` and `CAN_DROP_CACHE`: evict the file's cached pages, or say why that
//!   cannot be done here;
//! - `page_residency(window, out)`: which pages of a mapped window are in memory;
//! - `prefetch(bytes)`: start reading a mapped range ahead of its use;
//! - `release_range(bytes, file, cache)`: give back a mapped range's memory (the process's
//!   pages, and the cache's of the file range `cache` where the platform allows);
//! - `advise_huge(bytes)`: ask for a mapped range to be mapped with huge pages (a hint);
//! - `forget_pages(bytes)`: give back the process's pages of a mapped range, leaving the cache's;
//! - `written_pages(bytes)`: whether the process wrote to a page of a private map's range, or
//!   say that it cannot tell;
//! - `populate(bytes)`: read a mapped range in now (returns when it is in memory), or say why not;
//! - `populate_write(start, len)`: make fresh memory's pages present and writable now, without
//!   writing, or say why not;
//! - `advise_read(file, offset, len)`: start reading a file range ahead into the cache;
//! - `map_anonymous(len)` / `unmap(ptr, len)`: new private memory, and giving it back;
//! - `KEEPS_PAGES`: whether part of such memory can be given back (a pool can split it);
//! - `move_pages(from, len, to)` and `CAN_MOVE_PAGES`: move pages, contents and all, from one
//!   address to another without faulting them again (Linux's `mremap`);
//! - `page_size()`.

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
#[path = "linux.rs"]
mod imp;

#[cfg(any(target_os = "macos", target_os = "ios"))]
#[path = "macos.rs"]
mod imp;

#[cfg(windows)]
#[path = "windows.rs"]
mod imp;

#[cfg(not(any(
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd",
    target_os = "macos",
    target_os = "ios",
    windows
)))]
compile_error!("trash-panda's io layer has modules for Linux, Windows and macOS only");

#[cfg(unix)]
mod unix;

pub(crate) use imp::*;

/// A failed platform call: what was called, and the system's error.
pub(crate) type OpError = (&'static str, std::io::Error);

/// Fills `buf` from `offset` with positional reads, retrying short and interrupted reads; a file
/// that ends first is `UnexpectedEof`.
pub fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        match read_at(file, &mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

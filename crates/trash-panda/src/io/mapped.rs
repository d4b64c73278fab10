//! Read-only and private (copy-on-write) memory maps of whole files.

use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions, MmapRaw};

use super::{platform, IoError};

enum Map {
    Shared(Mmap),
    /// Kept raw so its pointer (not a `&[u8]` of it) is what writable views come from.
    Private(MmapRaw),
}

/// A whole file mapped into memory, keeping its path for error messages.
///
/// The map assumes the file is not truncated or rewritten while mapped (checkpoints are not);
/// if it is, reading the vanished part raises SIGBUS (an in-page error on Windows), as with any
/// memory map. On Windows a private map charges the whole file to the commit limit when it is
/// made; a shared read-only one charges nothing.
pub struct MappedFile {
    path: PathBuf,
    map: Map,
}

impl MappedFile {
    /// Maps `path` read-only, shared with the page cache.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, IoError> {
        let path = path.as_ref();
        let file = open_file(path)?;
        // SAFETY: memmap2 requires that the file is not modified or truncated while mapped. That is
        // the documented contract of this type (checkpoints are read-only inputs); a violation
        // gives SIGBUS or changed bytes, not memory unsafety in our own data structures.
        let map = unsafe { MmapOptions::new().map(&file) }.map_err(|source| IoError::Map {
            path: path.to_owned(),
            source,
        })?;
        Ok(MappedFile {
            path: path.to_owned(),
            map: Map::Shared(map),
        })
    }

    /// Maps `path` privately and writably (copy-on-write): writes stay in this process and never
    /// reach the file. Torch wants writable memory behind its tensors; pages not written to are
    /// still shared with the page cache.
    pub fn open_private(path: impl AsRef<Path>) -> Result<Self, IoError> {
        let path = path.as_ref();
        let file = open_file(path)?;
        // SAFETY: as in `open`: the file must not change while mapped. MAP_PRIVATE means our
        // writes cannot reach the file or other processes.
        let map = unsafe { MmapOptions::new().map_copy(&file) }.map_err(|source| IoError::Map {
            path: path.to_owned(),
            source,
        })?;
        Ok(MappedFile {
            path: path.to_owned(),
            map: Map::Private(MmapRaw::from(map)),
        })
    }

    /// The mapped file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.map {
            Map::Shared(m) => m,
            // SAFETY: the map is `len` bytes, mapped readable for as long as `self` lives (the
            // file's contract above); writes through writable views are the unsafe user's, who
            // promises no `&[u8]` of the same bytes is read across them.
            Map::Private(m) => unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) },
        }
    }

    /// The whole file, writable, for a private map; `None` for a read-only one.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.map {
            Map::Shared(_) => None,
            Map::Private(m) => {
                // SAFETY: the map is `len` writable bytes, and `&mut self` makes this the only
                // reference to them while it lives.
                Some(unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr(), m.len()) })
            }
        }
    }

    /// The first byte of a private map, with the right to write (from the map itself, not from a
    /// `&[u8]` of it); `None` for a shared read-only map.
    pub(super) fn private_ptr(&self) -> Option<*mut u8> {
        match &self.map {
            Map::Shared(_) => None,
            // The raw map's own pointer, not a reference's.
            Map::Private(m) => Some(m.as_mut_ptr()),
        }
    }

    /// Whether this map is private and writable.
    pub fn is_private(&self) -> bool {
        matches!(self.map, Map::Private(_))
    }

    /// The file's length in bytes.
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes `start..end` of the file, or an error naming the file, its size and the range.
    pub fn slice(&self, start: usize, end: usize) -> Result<&[u8], IoError> {
        let range = self.check(start, end)?;
        Ok(&self.bytes()[range])
    }

    /// Asks the system to read `range` ahead (`MADV_WILLNEED`, or `PrefetchVirtualMemory` on
    /// Windows); it returns at once.
    pub fn advise_willneed(&self, range: Range<usize>) -> Result<(), IoError> {
        let range = self.check(range.start, range.end)?;
        platform::prefetch(&self.bytes()[range]).map_err(self.cache_error())
    }

    /// Reads `range` into memory now (`MADV_POPULATE_READ`): returns once its pages are in, read
    /// with the kernel's read-ahead rather than one fault at a time. An error where the system
    /// has no such call (kernels before 5.14, macOS, Windows): copy through the map instead.
    pub fn populate(&self, range: Range<usize>) -> Result<(), IoError> {
        let range = self.check(range.start, range.end)?;
        platform::populate(&self.bytes()[range]).map_err(self.cache_error())
    }

    /// Gives back the memory of `range` (which `file` holds at the same offsets): this process's
    /// pages, and the page cache's where the platform allows (Linux). The next read of the
    /// range comes from the file again. An error where the platform cannot (Windows).
    pub fn release(&self, range: Range<usize>, file: &std::fs::File) -> Result<(), IoError> {
        let cache = range.start as u64..range.end as u64;
        self.release_cached(range, cache, file)
    }

    /// As [`release`](Self::release), dropping the page cache's pages of `cache` (a file range
    /// around `range`: a huge folio is dropped only when the range holds it whole).
    pub fn release_cached(
        &self,
        range: Range<usize>,
        cache: Range<u64>,
        file: &std::fs::File,
    ) -> Result<(), IoError> {
        let range = self.check(range.start, range.end)?;
        debug_assert!(cache.start <= range.start as u64 && range.end as u64 <= cache.end);
        platform::release_range(&self.bytes()[range], file, cache).map_err(self.cache_error())
    }

    /// Asks for the map's pages to be mapped as huge pages where the page cache holds them so
    /// (`MADV_HUGEPAGE`): the pages it reads in are then read into 2 MiB folios, each mapped by
    /// one page-table entry. An error where the platform has no such advice (it is only a hint).
    pub fn advise_huge(&self) -> Result<(), IoError> {
        platform::advise_huge(self.bytes()).map_err(self.cache_error())
    }

    /// Gives back this process's pages of `range` and keeps the page cache's: the next read maps
    /// them again (from the cache when still there). On a private map, what this process wrote
    /// there is dropped and the file's bytes come back. An error where the platform cannot
    /// (Windows).
    pub fn forget(&self, range: Range<usize>) -> Result<(), IoError> {
        let range = self.check(range.start, range.end)?;
        platform::forget_pages(&self.bytes()[range]).map_err(self.cache_error())
    }

    /// Whether this process wrote to a page of `range` of a private map (its own copy of the
    /// page instead of the file's); an error where the system cannot tell (before Linux 6.7,
    /// macOS, Windows).
    pub fn written(&self, range: Range<usize>) -> Result<bool, IoError> {
        let range = self.check(range.start, range.end)?;
        platform::written_pages(&self.bytes()[range]).map_err(self.cache_error())
    }

    /// Whether every page holding `range` is in memory now (`mincore`); an error where the system
    /// cannot tell (Windows).
    pub fn resident(&self, range: Range<usize>) -> Result<bool, IoError> {
        let range = self.check(range.start, range.end)?;
        if range.is_empty() {
            return Ok(true);
        }
        let page = platform::page_size();
        let first = range.start - range.start % page;
        // Windows of 64 MiB keep the residency vector small.
        let window = page * 16_384;
        let mut vec = vec![0u8; window / page];
        let mut at = first;
        while at < range.end {
            let n = window.min(range.end - at);
            let pages = n.div_ceil(page);
            // `at` is a multiple of the page size from the map's start, so the window starts on
            // a page.
            platform::page_residency(&self.bytes()[at..at + n], &mut vec[..pages])
                .map_err(self.cache_error())?;
            if vec[..pages].iter().any(|&v| v & 1 == 0) {
                return Ok(false);
            }
            at += n;
        }
        Ok(true)
    }

    /// Whether `range` looks resident, judged from one page every `stride` bytes and its last
    /// page: enough for a page cache of large folios, which is cached or evicted a folio at a
    /// time, at a hundredth of the cost of asking for every page. An error where the system
    /// cannot tell (Windows).
    pub fn resident_sampled(&self, range: Range<usize>, stride: usize) -> Result<bool, IoError> {
        let range = self.check(range.start, range.end)?;
        if range.is_empty() {
            return Ok(true);
        }
        let page = platform::page_size();
        let stride = stride.max(page);
        let mut out = [0u8; 1];
        let last = range.end - 1;
        let mut at = range.start;
        loop {
            let first = at - at % page;
            platform::page_residency(&self.bytes()[first..first + 1], &mut out)
                .map_err(self.cache_error())?;
            if out[0] & 1 == 0 {
                return Ok(false);
            }
            if at == last {
                return Ok(true);
            }
            at = (at + stride).min(last);
        }
    }

    /// Turns a platform call's failure into an error naming this map's file.
    fn cache_error(&self) -> impl Fn(platform::OpError) -> IoError + '_ {
        |(op, source)| IoError::Cache {
            path: self.path.clone(),
            op,
            source,
        }
    }

    pub(super) fn check(&self, start: usize, end: usize) -> Result<Range<usize>, IoError> {
        if start <= end && end <= self.len() {
            Ok(start..end)
        } else {
            Err(IoError::OutOfRange {
                path: self.path.clone(),
                offset: start as u64,
                len: end.saturating_sub(start) as u64,
                file_size: self.len() as u64,
            })
        }
    }
}

fn open_file(path: &Path) -> Result<File, IoError> {
    File::open(path).map_err(|source| IoError::Open {
        path: path.to_owned(),
        source,
    })
}

impl fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.len())
            .field("private", &self.is_private())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
        f
    }

    #[test]
    fn maps_and_slices() {
        let data: Vec<u8> = (0..10_007u32).map(|i| (i * 7) as u8).collect();
        let f = file_with(&data);
        let m = MappedFile::open(f.path()).unwrap();
        assert_eq!(m.bytes(), &data[..]);
        assert_eq!(m.slice(3, 5000).unwrap(), &data[3..5000]);
        assert_eq!(m.slice(10_007, 10_007).unwrap(), &[] as &[u8]);
        m.advise_willneed(1..9000).unwrap();
        m.advise_willneed(0..0).unwrap();
        assert!(!m.is_private());
    }

    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "only Linux can evict one file's pages and count them"
    )]
    fn residency_and_populate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
        let data: Vec<u8> = (0..(3 << 20) + 77u32).map(|i| (i * 13) as u8).collect();
        f.write_all(&data).unwrap();
        f.flush().unwrap();
        crate::io::drop_cache(f.path()).unwrap();
        let m = MappedFile::open(f.path()).unwrap();
        assert!(!m.resident(100..(2 << 20)).unwrap());
        assert!(m.resident(5..5).unwrap());
        match m.populate(100..(2 << 20)) {
            Ok(()) => assert!(m.resident(100..(2 << 20)).unwrap()),
            // Kernels before 5.14 refuse the advice.
            Err(IoError::Cache { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        assert_eq!(m.slice(100, 2 << 20).unwrap(), &data[100..2 << 20]);
        assert!(m.resident(0..m.len() + 1).is_err());
    }

    #[test]
    fn out_of_range_names_file_and_size() {
        let f = file_with(b"hello");
        let m = MappedFile::open(f.path()).unwrap();
        let err = m.slice(2, 9).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("2..9") && msg.contains("5 bytes"), "{msg}");
        assert!(msg.contains(&f.path().display().to_string()), "{msg}");
        assert!(m.slice(4, 2).is_err());
        assert!(m.advise_willneed(0..6).is_err());
    }

    #[test]
    fn private_map_is_writable_and_leaves_the_file_alone() {
        let f = file_with(b"abcdef");
        let mut m = MappedFile::open_private(f.path()).unwrap();
        m.bytes_mut().unwrap()[0] = b'X';
        assert_eq!(m.bytes(), b"Xbcdef");
        assert_eq!(std::fs::read(f.path()).unwrap(), b"abcdef");
    }

    #[test]
    fn a_private_map_tells_the_pages_written_until_they_are_forgotten() {
        let page = platform::page_size();
        let data: Vec<u8> = (0..8 * page as u32).map(|i| (i % 251) as u8).collect();
        let f = file_with(&data);
        let mut m = MappedFile::open_private(f.path()).unwrap();
        let Ok(untouched) = m.written(0..data.len()) else {
            return; // this system cannot tell (the callers then forget every page)
        };
        assert!(!untouched);
        let sum: u64 = m.bytes().iter().step_by(page).map(|&b| b as u64).sum();
        assert!(sum > 0);
        assert!(!m.written(0..data.len()).unwrap(), "read, not written");
        m.bytes_mut().unwrap()[5 * page + 3] = 0xff;
        assert!(m.written(0..data.len()).unwrap());
        assert!(m.written(5 * page + 100..5 * page + 101).unwrap());
        assert!(!m.written(0..5 * page).unwrap());
        assert!(!m.written(6 * page..data.len()).unwrap());
        m.forget(5 * page..6 * page).unwrap();
        assert!(!m.written(0..data.len()).unwrap());
        assert_eq!(m.bytes(), &data[..]);
    }

    #[test]
    fn empty_file_and_missing_file() {
        let f = file_with(b"");
        let m = MappedFile::open(f.path()).unwrap();
        assert!(m.is_empty());
        assert!(matches!(
            MappedFile::open("/nonexistent/trash-panda"),
            Err(IoError::Open { .. })
        ));
    }
}

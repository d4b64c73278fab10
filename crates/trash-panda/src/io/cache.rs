//! Page cache control, so benchmarks and tests can make a cold read without root.

use std::fs::File;
use std::path::Path;

use super::IoError;

fn cache_err(path: &Path, op: &'static str, source: std::io::Error) -> IoError {
    IoError::Cache {
        path: path.to_owned(),
        op,
        source,
    }
}

fn open(path: &Path) -> Result<File, IoError> {
    File::open(path).map_err(|source| IoError::Open {
        path: path.to_owned(),
        source,
    })
}

/// Asks the kernel to drop `path`'s pages from the page cache (`POSIX_FADV_DONTNEED`).
///
/// Dirty pages are written back first, since DONTNEED skips them. Pages that some process has
/// mapped stay cached; check with [`cached_bytes`].
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub fn drop_cache(path: impl AsRef<Path>) -> Result<(), IoError> {
    use std::os::fd::AsRawFd;
    let path = path.as_ref();
    let file = open(path)?;
    file.sync_data()
        .map_err(|e| cache_err(path, "fdatasync", e))?;
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for the call.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        // posix_fadvise returns the error number instead of setting errno.
        let e = std::io::Error::from_raw_os_error(rc);
        return Err(cache_err(path, "posix_fadvise(DONTNEED)", e));
    }
    Ok(())
}

/// Not available on this platform: always an error.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub fn drop_cache(path: impl AsRef<Path>) -> Result<(), IoError> {
    let path = path.as_ref();
    let e = std::io::Error::from(std::io::ErrorKind::Unsupported);
    Err(cache_err(path, "posix_fadvise(DONTNEED)", e))
}

/// How many bytes of `path` are in the page cache now (`mincore` over a temporary map that
/// touches no page).
pub fn cached_bytes(path: impl AsRef<Path>) -> Result<u64, IoError> {
    let path = path.as_ref();
    let file = open(path)?;
    let len = file.metadata().map_err(|source| IoError::Open {
        path: path.to_owned(),
        source,
    })?;
    let len = len.len();
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: the map is only passed to mincore, never read, so a concurrent change of the file
    // cannot affect us.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| cache_err(path, "mmap", e))?;
    let page = page_size();
    // Windows of 1 GiB keep the residency vector small for huge files.
    let window = page * 262_144;
    let mut vec = vec![0u8; window / page];
    let mut cached = 0u64;
    let mut start = 0usize;
    while start < map.len() {
        let n = window.min(map.len() - start);
        let pages = n.div_ceil(page);
        // SAFETY: `map.as_ptr() + start` is page aligned (maps start on a page and `start` is a
        // multiple of the page size), `n` bytes lie inside the map, and `vec` has room for
        // `pages` entries, one per page of the window, as mincore requires.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr().add(start) as *mut libc::c_void,
                n,
                vec.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(cache_err(path, "mincore", std::io::Error::last_os_error()));
        }
        for (i, &v) in vec[..pages].iter().enumerate() {
            if v & 1 != 0 {
                let page_start = start + i * page;
                cached += page.min(map.len() - page_start) as u64;
            }
        }
        start += n;
    }
    Ok(cached)
}

fn page_size() -> usize {
    // SAFETY: sysconf only reads its argument.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn drop_then_read_then_count() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.flush().unwrap();
        drop_cache(f.path()).unwrap();
        let cold = cached_bytes(f.path()).unwrap();
        let _ = std::fs::read(f.path()).unwrap();
        let warm = cached_bytes(f.path()).unwrap();
        assert!(warm >= cold && warm == 1 << 20, "cold {cold} warm {warm}");
        assert!(cold < 1 << 19, "cold {cold}");
    }

    #[test]
    fn empty_and_missing() {
        let f = tempfile::NamedTempFile::new().unwrap();
        assert_eq!(cached_bytes(f.path()).unwrap(), 0);
        assert!(cached_bytes("/nonexistent/tp").is_err());
        assert!(drop_cache("/nonexistent/tp").is_err());
    }
}

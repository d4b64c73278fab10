//! Page cache control, so benchmarks and tests can make a cold read without root.

use std::fs::File;
use std::path::Path;

use super::{platform, IoError};

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

/// Asks the system to drop `path`'s pages from the page cache (`POSIX_FADV_DONTNEED` on Linux).
///
/// Dirty pages are written back first, since DONTNEED skips them. Pages that some process has
/// mapped stay cached; check with [`cached_bytes`]. Windows and macOS cannot evict one file's
/// pages without administrator rights: there this is an [`IoError::Cache`] whose source is
/// `Unsupported`, and callers measure warm (see [`can_drop_cache`]).
pub fn drop_cache(path: impl AsRef<Path>) -> Result<(), IoError> {
    let path = path.as_ref();
    let file = open(path)?;
    file.sync_data()
        .map_err(|e| cache_err(path, "sync_data", e))?;
    platform::drop_cache(&file).map_err(|(op, e)| cache_err(path, op, e))
}

/// Whether [`drop_cache`] can work on this platform at all (false on Windows and macOS, where a
/// "cold" read is only cold after a reboot or memory pressure).
pub fn can_drop_cache() -> bool {
    platform::CAN_DROP_CACHE
}

/// How many bytes of `path` are in the page cache now (`mincore` over a temporary map that
/// touches no page). Not available on Windows.
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
    let page = platform::page_size();
    // Windows of 1 GiB keep the residency vector small for huge files.
    let window = page * 262_144;
    let mut vec = vec![0u8; window / page];
    let mut cached = 0u64;
    let mut start = 0usize;
    while start < map.len() {
        let n = window.min(map.len() - start);
        let pages = n.div_ceil(page);
        // `start` is a multiple of the page size, so the window starts on a page.
        platform::page_residency(&map[start..start + n], &mut vec[..pages])
            .map_err(|(op, e)| cache_err(path, op, e))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "only Linux can evict one file's pages (posix_fadvise) and count them"
    )]
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

//! The folder where merged disk-tier blocks are kept: one file per block, named by what its bytes
//! depend on (the checkpoint's files as they are, the block, and the merges in it), so engines
//! of several processes share a folder without taking each other's files, within a size limit
//! kept by removing the files used least recently that no engine of this process holds. A file
//! outlives its engine: a later run (or this one, after the merges were taken back and made
//! again) with the same merges of the same checkpoint adopts it instead of merging.
//!
//! A file holds the block's staged image (every tensor, merged or not, at its staging offset),
//! so the block is read from it with one request, as many bytes as from the checkpoint.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use super::StreamError;

/// The extension of overlay files: only these are counted and removed in the folder.
pub const OVERLAY_EXTENSION: &str = "tpo";

/// Overlay files an engine of this process reads from: never removed to make room.
static HELD: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn held() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// A folder of overlay files and the most they may take together.
#[derive(Debug, Clone)]
pub struct OverlayStore {
    dir: PathBuf,
    limit: u64,
}

impl OverlayStore {
    /// The store in `dir` (made if missing), holding at most `limit` bytes of overlay files.
    pub fn open(dir: impl Into<PathBuf>, limit: u64) -> Result<Self, StreamError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|source| StreamError::Overlay {
            path: dir.clone(),
            what: "create the overlay folder",
            source,
        })?;
        Ok(OverlayStore { dir, limit })
    }

    /// The folder overlay files go to when none is set: beside the checkpoint's `file`.
    pub fn default_dir(file: &Path) -> PathBuf {
        file.parent()
            .unwrap_or_else(|| Path::new("."))
            .join(".trash-panda-overlays")
    }

    /// The limit from the `overlay_limit` setting's text: a size ("20GB", see
    /// [`crate::units::parse_bytes`]), or "auto": twice `streamed` (the bytes of the streamed
    /// blocks whose merges may go there): room for every block merged, with files of another
    /// run beside them.
    pub fn limit_from(text: &str, streamed: u64) -> Result<u64, String> {
        if text.trim().eq_ignore_ascii_case("auto") {
            return Ok(streamed.saturating_mul(2));
        }
        crate::units::parse_bytes(text)
            .map_err(|e| format!("overlay_limit: expected \"auto\" or a size: {e}"))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The most its files may take together, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes of the overlay files in the folder now (every process's).
    pub fn used(&self) -> u64 {
        self.entries().iter().map(|e| e.1).sum()
    }

    /// The file name for `parts` (what the bytes depend on): a stable hash of them, so the same
    /// merges of the same checkpoint find the same name in a later run.
    pub fn name_for(parts: &[&str]) -> String {
        // FNV-1a, twice with different offsets: stable across builds, unlike std's hasher.
        let hash = |seed: u64| {
            let mut h = seed;
            for p in parts {
                for b in p.bytes().chain([0u8]) {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
            h
        };
        format!(
            "{:016x}{:016x}.{OVERLAY_EXTENSION}",
            hash(0xcbf2_9ce4_8422_2325),
            hash(0x6c62_272e_07bb_0142)
        )
    }

    /// Writes `bytes` as the file `name` (replacing one there), after making room for it;
    /// the file is held until [`release`](Self::release). Its pages stay in the page cache if
    /// `cached` (a RAM-tier block's), else they are dropped (the file is read as a drive is).
    pub fn create(&self, name: &str, bytes: &[u8], cached: bool) -> Result<PathBuf, StreamError> {
        let path = self.dir.join(name);
        self.make_room(bytes.len() as u64, &path)?;
        let err = |what: &'static str| {
            let path = path.clone();
            move |source| StreamError::Overlay { path, what, source }
        };
        let mut file = File::create(&path).map_err(err("create an overlay file"))?;
        held().insert(path.clone());
        let written = file
            .write_all(bytes)
            .and_then(|()| file.sync_data())
            .map_err(err("write an overlay file"));
        if let Err(e) = written {
            self.release(&path, true);
            return Err(e);
        }
        if !cached {
            forget_cache(&path);
        }
        Ok(path)
    }

    /// The file `name` in the folder, if it is there with `len` bytes: held from now on, and
    /// marked as just used (the limit evicts the least recently used first).
    pub fn find(&self, name: &str, len: u64) -> Option<PathBuf> {
        let path = self.dir.join(name);
        let meta = std::fs::metadata(&path).ok()?;
        if !meta.is_file() || meta.len() != len {
            return None;
        }
        if let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) {
            let _ = file.set_modified(SystemTime::now());
        }
        held().insert(path.clone());
        Some(path)
    }

    /// Writes `bytes` at `offset` of the held file `path` (its pages kept in the page cache if
    /// `cached`, as for [`create`](Self::create)).
    pub fn write_at(
        &self,
        path: &Path,
        offset: u64,
        bytes: &[u8],
        cached: bool,
    ) -> Result<(), StreamError> {
        let err = |what: &'static str| {
            let path = path.to_path_buf();
            move |source| StreamError::Overlay { path, what, source }
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(err("open an overlay file"))?;
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.write_all(bytes))
            .and_then(|()| file.sync_data())
            .map_err(err("write an overlay file"))?;
        if !cached {
            forget_cache(path);
        }
        Ok(())
    }

    /// Renames the held file `path` to `name` (its merges changed); returns the new path.
    pub fn rename(&self, path: &Path, name: &str) -> Result<PathBuf, StreamError> {
        let to = self.dir.join(name);
        if to == path {
            return Ok(to);
        }
        std::fs::rename(path, &to).map_err(|source| StreamError::Overlay {
            path: path.to_path_buf(),
            what: "rename an overlay file",
            source,
        })?;
        let mut held = held();
        held.remove(path);
        held.insert(to.clone());
        Ok(to)
    }

    /// Stops holding `path`; removes the file when `remove`, else leaves it until the limit
    /// needs its room.
    pub fn release(&self, path: &Path, remove: bool) {
        held().remove(path);
        if remove {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The overlay files in the folder: (path, bytes, last used), least recently used first.
    fn entries(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let Ok(read) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut found: Vec<(PathBuf, u64, SystemTime)> = read
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == OVERLAY_EXTENSION))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                Some((e.path(), meta.len(), used))
            })
            .collect();
        found.sort_by_key(|e| e.2);
        found
    }

    /// Removes overlay files, least recently used first and none held, until `len` more bytes
    /// fit the limit (`replacing`, if there, is about to be replaced and does not count).
    fn make_room(&self, len: u64, replacing: &Path) -> Result<(), StreamError> {
        let entries = self.entries();
        let mut used: u64 = entries
            .iter()
            .filter(|e| e.0 != replacing)
            .map(|e| e.1)
            .sum();
        let held = held();
        for (path, bytes, _) in &entries {
            if used + len <= self.limit {
                break;
            }
            if held.contains(path) || path == replacing {
                continue;
            }
            if std::fs::remove_file(path).is_ok() {
                used -= bytes;
            }
        }
        if used + len > self.limit {
            return Err(StreamError::OverlayFull {
                dir: self.dir.clone(),
                limit: self.limit,
                used,
                needs: len,
            });
        }
        Ok(())
    }
}

/// Drops a just-written overlay file's pages from the page cache: the engine reads it back
/// like the disk tier, and the cache it would otherwise take is RAM no plan counted.
fn forget_cache(path: &Path) {
    let _ = crate::io::drop_cache(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_differ_by_every_part() {
        let a = OverlayStore::name_for(&["ckpt", "block.0", "w:lora a 1.0"]);
        assert_eq!(
            a,
            OverlayStore::name_for(&["ckpt", "block.0", "w:lora a 1.0"])
        );
        assert_ne!(
            a,
            OverlayStore::name_for(&["ckpt", "block.0", "w:lora a 0.5"])
        );
        // Parts are separated: moving a character across a boundary changes the name.
        assert_ne!(
            OverlayStore::name_for(&["ab", "c"]),
            OverlayStore::name_for(&["a", "bc"])
        );
        assert!(a.ends_with(".tpo") && a.len() == 32 + 4);
    }

    #[test]
    fn the_limit_evicts_the_least_recently_used_file_no_engine_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = OverlayStore::open(dir.path(), 250).unwrap();
        let a = store.create("a.tpo", &[1; 100], false).unwrap();
        store.release(&a, false);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = store.create("b.tpo", &[2; 100], false).unwrap();
        // Held: c needs room, a (released, oldest) goes, b stays.
        let c = store.create("c.tpo", &[3; 100], false).unwrap();
        assert!(!a.exists() && b.exists() && c.exists());
        assert_eq!(store.used(), 200);
        // Nothing left that may go: a clear error with the figures.
        let err = store.create("d.tpo", &[4; 100], false).unwrap_err();
        assert!(
            matches!(
                err,
                StreamError::OverlayFull {
                    limit: 250,
                    used: 200,
                    needs: 100,
                    ..
                }
            ),
            "{err}"
        );
        // Other files in the folder are never touched.
        std::fs::write(dir.path().join("notes.txt"), b"keep").unwrap();
        store.release(&b, true);
        store.release(&c, true);
        assert!(dir.path().join("notes.txt").exists() && store.used() == 0);
    }

    #[test]
    fn writes_and_renames_keep_the_file_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = OverlayStore::open(dir.path(), 1000).unwrap();
        let a = store.create("a.tpo", &[0; 10], false).unwrap();
        store.write_at(&a, 4, &[9, 9], false).unwrap();
        let b = store.rename(&a, "b.tpo").unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), [0, 0, 0, 0, 9, 9, 0, 0, 0, 0]);
        assert!(held().contains(&b) && !held().contains(&a));
        store.release(&b, true);
        assert!(!b.exists());
    }
}

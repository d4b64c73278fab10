//! Replacing a file so that a reader sees the old content or the new one, never a mix: write a
//! temporary file in the same folder, flush it to the disk, then rename it over the target.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::OrderError;

/// Tells apart the temporary files of two writes from the same process.
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// How many taken temporary names to skip before giving up (a stale one left by a killed
/// process with a reused id).
const TEMP_TRIES: u32 = 16;

/// Writes `bytes` to `target` atomically.
pub(crate) fn write_atomic(target: &Path, bytes: &[u8]) -> Result<(), OrderError> {
    write_atomic_with(target, bytes, |file, bytes| file.write_all(bytes))
}

/// [`write_atomic`] with the write itself given, so tests can cut a write short.
pub(crate) fn write_atomic_with(
    target: &Path,
    bytes: &[u8],
    write: impl FnOnce(&mut File, &[u8]) -> io::Result<()>,
) -> Result<(), OrderError> {
    let fail = |step: &'static str| {
        move |source| OrderError::Write {
            path: target.to_path_buf(),
            step,
            source,
        }
    };
    let (temp, mut file) = create_temp(target).map_err(fail("creating a temporary file"))?;
    let written = write(&mut file, bytes)
        .map_err(fail("writing"))
        .and_then(|()| file.sync_all().map_err(fail("flushing to disk")));
    drop(file);
    let renamed = written.and_then(|()| fs::rename(&temp, target).map_err(fail("renaming")));
    if renamed.is_err() {
        // The target is untouched; only the temporary file has to go.
        let _ = fs::remove_file(&temp);
        return renamed;
    }
    sync_folder(target);
    Ok(())
}

/// `.<name>.<pid>.<n>.tmp` next to `target`, created new so no other file is ever truncated.
fn create_temp(target: &Path) -> io::Result<(PathBuf, File)> {
    let folder = target.parent().unwrap_or(Path::new(""));
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut last = None;
    for _ in 0..TEMP_TRIES {
        let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
        let temp = folder.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

/// Makes the rename itself durable. Best effort: some file systems refuse to sync a folder, and
/// the file is already complete either way.
fn sync_folder(target: &Path) {
    #[cfg(unix)]
    {
        let folder = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Ok(dir) = File::open(folder) {
            let _ = dir.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = target;
}

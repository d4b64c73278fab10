//! The filesystem holding a path (from `/proc/self/mountinfo` on Linux, the volume on Windows,
//! `statfs` on macOS) and a short cold-read probe.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{read_text, SysError, SysRoots};

/// The mount that holds a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountInfo {
    /// Where the filesystem is mounted, e.g. `/home`.
    pub mount_point: String,
    /// The filesystem type as the mount table names it (`ext4`, `nfs`, `overlay`, ...).
    pub fs_type: String,
    /// The mounted device or source, e.g. `/dev/vda1`.
    pub source: String,
    /// `major:minor` of the device.
    pub device: String,
}

/// Finds the mount (the volume, on Windows) holding `path`.
pub fn mount_of(roots: &SysRoots, path: &Path) -> Result<MountInfo, SysError> {
    super::platform::mount_of(roots, path)
}

/// Finds the mount holding `path` (made absolute first) in `<proc>/self/mountinfo`: Linux's
/// [`mount_of`].
pub fn mount_of_in_mountinfo(roots: &SysRoots, path: &Path) -> Result<MountInfo, SysError> {
    let absolute = std::fs::canonicalize(path).map_err(|source| SysError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mountinfo = roots.proc.join("self/mountinfo");
    let text = read_text(&mountinfo)?;
    parse_mountinfo(&text)
        .into_iter()
        .filter(|m| absolute.starts_with(&m.mount_point))
        // The deepest mount wins; among equal mount points the last one mounted hides the others.
        .max_by_key(|m| Path::new(&m.mount_point).components().count())
        .ok_or(SysError::NoMount { path: absolute })
}

/// Parses mountinfo lines: `id parent major:minor root mount_point options [optional...] -
/// fs_type source super_options`. Malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let tail: Vec<&str> = right.split(' ').collect();
        if fields.len() < 5 || tail.len() < 2 {
            continue;
        }
        mounts.push(MountInfo {
            mount_point: unescape(fields[4]),
            fs_type: tail[0].to_string(),
            source: unescape(tail[1]),
            device: fields[2].to_string(),
        });
    }
    // Later mounts shadow earlier ones at the same point; max_by_key keeps the last maximum.
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The result of a cold sequential read of a fresh file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadProbe {
    /// The folder the probe file was written in.
    pub dir: PathBuf,
    /// Bytes written to the probe file.
    pub file_bytes: u64,
    /// Bytes read back before the file ended or the time limit passed.
    pub bytes_read: u64,
    /// Seconds the reading took.
    pub seconds: f64,
    /// `bytes_read / seconds` in MB/s (10^6 bytes); 0 when no time was measured.
    pub mb_per_s: f64,
    /// False when the page cache could not be dropped (always on Windows and macOS, which cannot
    /// evict one file's pages), so the figure may be a warm read.
    pub cache_dropped: bool,
}

/// Removes the probe file however the probe ends.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes a `file_bytes` file in `dir`, drops it from the page cache and reads it back with
/// plain reads for at most `limit`, reporting MB/s (decimal). The file is always removed.
pub fn read_speed(dir: &Path, file_bytes: u64, limit: Duration) -> Result<ReadProbe, SysError> {
    const CHUNK: usize = 8 << 20;
    let err = |what| {
        move |source| SysError::Probe {
            dir: dir.to_path_buf(),
            what,
            source,
        }
    };
    let path = dir.join(format!(".trash-panda-read-probe-{}", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(err("create the probe file"))?;
    let guard = TempFile(path);
    // A varying pattern so no filesystem can store the file as holes or compress it away.
    let chunk: Vec<u8> = (0..CHUNK).map(|i| (i * 31 % 251) as u8).collect();
    let mut written = 0u64;
    while written < file_bytes {
        let n = (file_bytes - written).min(CHUNK as u64) as usize;
        file.write_all(&chunk[..n]).map_err(err("write"))?;
        written += n as u64;
    }
    file.sync_all().map_err(err("sync"))?;
    drop(file);
    let cache_dropped = crate::io::drop_cache(&guard.0).is_ok();
    let mut file = File::open(&guard.0).map_err(err("open"))?;
    let mut buffer = vec![0u8; CHUNK];
    let mut bytes_read = 0u64;
    let start = Instant::now();
    while start.elapsed() < limit {
        let n = file.read(&mut buffer).map_err(err("read"))?;
        if n == 0 {
            break;
        }
        bytes_read += n as u64;
    }
    let seconds = start.elapsed().as_secs_f64();
    drop(guard);
    Ok(ReadProbe {
        dir: dir.to_path_buf(),
        file_bytes,
        bytes_read,
        seconds,
        mb_per_s: if seconds > 0.0 {
            bytes_read as f64 / seconds / 1e6
        } else {
            0.0
        },
        cache_dropped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
30 22 0:5 / /proc rw - proc proc rw\n\
40 22 252:16 / /mnt/my\\040disk rw,relatime - xfs /dev/vdb rw\n\
41 40 0:50 / /mnt/my\\040disk/tmp rw - tmpfs tmpfs rw\n\
garbage line\n";

    #[test]
    fn parses_and_unescapes() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 4);
        assert_eq!(m[2].mount_point, "/mnt/my disk");
        assert_eq!(
            (m[2].fs_type.as_str(), m[2].device.as_str()),
            ("xfs", "252:16")
        );
    }

    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "reads a fake /proc/self/mountinfo, which only the Linux probe uses"
    )]
    fn finds_the_deepest_mount() {
        let dir = tempfile::tempdir().unwrap();
        let roots = SysRoots::under(dir.path());
        std::fs::create_dir_all(roots.proc.join("self")).unwrap();
        let here = dir.path().canonicalize().unwrap();
        let text = format!(
            "22 1 252:1 / / rw - ext4 /dev/vda1 rw\n23 22 0:9 / {} rw - tmpfs fake rw\n",
            here.display()
        );
        std::fs::write(roots.proc.join("self/mountinfo"), text).unwrap();
        let m = mount_of(&roots, &roots.proc).unwrap();
        assert_eq!((m.fs_type.as_str(), m.source.as_str()), ("tmpfs", "fake"));
        let m = mount_of(&roots, Path::new("/")).unwrap();
        assert_eq!(m.fs_type, "ext4");
        assert!(matches!(
            mount_of(&roots, Path::new("/no/such/path")),
            Err(SysError::Read { .. })
        ));
    }

    #[test]
    fn read_probe_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let p = read_speed(dir.path(), 3 << 20, Duration::from_secs(2)).unwrap();
        assert_eq!(p.bytes_read, 3 << 20);
        assert!(p.mb_per_s > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let err = read_speed(Path::new("/no/such/dir"), 1, Duration::from_secs(1)).unwrap_err();
        let shown = Path::new("/no/such/dir").display().to_string();
        assert!(err.to_string().contains(&shown), "{err}");
    }
}

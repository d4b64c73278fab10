//! Linux: `/proc/meminfo` and the cgroup limit, `/proc/self/statm`, `/proc/cpuinfo`,
//! `/etc/os-release`, `/proc/self/mountinfo`, NVML from `libnvidia-ml.so.1`, glibc's
//! `malloc_trim`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::super::doctor::{parse_cpuinfo, CpuInfo};
use super::super::{disk, rss, MemoryFigures, MountInfo};
use super::super::{SysError, SysRoots};
pub(crate) use super::unix::{kernel_and_arch, DynLib};

pub(crate) const NVML_LIBRARIES: &[&str] = &["libnvidia-ml.so.1"];

/// Whether memory limits come from cgroups here (the doctor's "cgroup" line).
pub(crate) const HAS_CGROUPS: bool = true;

pub(crate) fn memory(roots: &SysRoots) -> Result<MemoryFigures, SysError> {
    MemoryFigures::probe_at(roots)
}

/// `/proc/self/statm`, kept open: it is regenerated on every read from offset 0, so one open
/// file serves every sample without an open and close each millisecond.
#[derive(Debug)]
pub(crate) struct RssSource {
    statm: File,
}

impl RssSource {
    pub(crate) fn open() -> Result<RssSource, SysError> {
        let path = PathBuf::from(rss::STATM);
        let statm = File::open(&path).map_err(|source| SysError::Read { path, source })?;
        Ok(RssSource { statm })
    }

    pub(crate) fn read(&self) -> Result<u64, SysError> {
        self.with_statm(rss::parse_statm)
    }

    pub(crate) fn read_private(&self) -> Result<u64, SysError> {
        self.with_statm(rss::parse_statm_private)
    }

    /// Reads statm again (one short line, from the start) and hands its text to `parse`.
    fn with_statm(&self, parse: fn(&str, &Path) -> Result<u64, SysError>) -> Result<u64, SysError> {
        let path = Path::new(rss::STATM);
        let mut buf = [0u8; 256];
        let n = FileExt::read_at(&self.statm, &mut buf, 0).map_err(|source| SysError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        parse(&String::from_utf8_lossy(&buf[..n]), path)
    }
}

/// `RssAnon` of `/proc/self/status`: the resident pages no file backs (heap, anonymous maps,
/// copy-on-write copies), which is what a freed tensor gives back and a mapped file never adds.
pub(crate) fn private_bytes() -> Result<u64, SysError> {
    let path = Path::new("/proc/self/status");
    let text = std::fs::read_to_string(path).map_err(|source| SysError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    rss::parse_status_kb(&text, "RssAnon", path)
}

pub(crate) fn os_name(roots: &SysRoots) -> Result<String, String> {
    let path = roots.etc.join("os-release");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let value = |key: &str| {
        text.lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().trim_matches('"').to_string())
    };
    value("PRETTY_NAME")
        .or_else(|| value("NAME"))
        .ok_or_else(|| format!("{}: no PRETTY_NAME or NAME", path.display()))
}

pub(crate) fn cpu_info(roots: &SysRoots) -> Result<CpuInfo, String> {
    let path = roots.proc.join("cpuinfo");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(parse_cpuinfo(&text))
}

pub(crate) fn mount_of(roots: &SysRoots, path: &Path) -> Result<MountInfo, SysError> {
    disk::mount_of_in_mountinfo(roots, path)
}

/// glibc keeps memory freed by large `free` calls in its arenas once its mmap threshold has
/// grown; `malloc_trim` returns the free top of each heap.
pub(crate) fn trim_heap() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it takes no
        // pointers from us and is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

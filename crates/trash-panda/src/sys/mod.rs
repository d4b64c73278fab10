//! Probes of the machine: RAM, cgroup limits, GPUs, disks.
//!
//! On Linux every probe reads from a root directory given by the caller ([`SysRoots`]), so tests
//! run on fake `/proc` and `/sys` trees; on Windows and macOS the probes ask the system (what
//! differs lives in `platform`, one module per system). The planner never probes by itself: it
//! takes the figures a probe (or a test, or the user) filled in.

pub mod cgroup;
pub mod disk;
pub mod doctor;
pub mod heap;
pub mod meminfo;
pub mod nvml;
mod platform;
pub mod rss;

use std::path::{Path, PathBuf};

pub use cgroup::CgroupMemory;
pub use disk::{MountInfo, ReadProbe};
pub use doctor::DoctorReport;
pub use heap::trim_heap;
pub use meminfo::{CommitCharge, MemoryFigures};
pub use nvml::{GpuDevice, GpuProbe};
pub use rss::{current_rss, private_memory, RssMeasure, RssSampler, RssStats};

/// Errors of the sys module.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A system call of a probe failed (Windows and macOS, where there is no file to name).
    #[error("{call} failed: {source}")]
    Call {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: field {field} is missing")]
    MissingField { path: PathBuf, field: &'static str },
    #[error("{path}: cannot parse {field} from {value:?}")]
    Parse {
        path: PathBuf,
        field: &'static str,
        value: String,
    },
    #[error("{path}: no mount holds this path")]
    NoMount { path: PathBuf },
    #[error("read-speed probe in {dir}: {what}: {source}")]
    Probe {
        dir: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Where the probes look for `/proc`, `/sys` and `/etc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoots {
    pub proc: PathBuf,
    pub sys: PathBuf,
    pub etc: PathBuf,
}

impl Default for SysRoots {
    fn default() -> Self {
        SysRoots {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
            etc: PathBuf::from("/etc"),
        }
    }
}

impl SysRoots {
    /// Roots under one directory: `<dir>/proc`, `<dir>/sys`, `<dir>/etc` (for tests).
    pub fn under(dir: &Path) -> Self {
        SysRoots {
            proc: dir.join("proc"),
            sys: dir.join("sys"),
            etc: dir.join("etc"),
        }
    }
}

pub(crate) fn read_text(path: &Path) -> Result<String, SysError> {
    std::fs::read_to_string(path).map_err(|source| SysError::Read {
        path: path.to_path_buf(),
        source,
    })
}

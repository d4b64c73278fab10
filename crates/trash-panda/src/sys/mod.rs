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
///
/// What to do: the machine's memory figures could not be read (a sandbox that hides `/proc`, an
/// unusual kernel). Give them yourself: `plan(..., ram="32GB", vram="10GB")` skips the probe;
/// report the message if the figures should be readable.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// A file a probe needs (under `/proc` or `/sys`, or their test roots) could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A system call of a probe failed (Windows and macOS, where there is no file to name).
    #[error("{call} failed: {source}")]
    Call {
        /// The call's name, as the system documents it.
        call: &'static str,
        /// The error the system reported.
        #[source]
        source: std::io::Error,
    },
    /// A file the probe read lacks a field it needs (e.g. `MemTotal` in `meminfo`).
    #[error("{path}: field {field} is missing")]
    MissingField {
        /// The file.
        path: PathBuf,
        /// The field's name as the file spells it.
        field: &'static str,
    },
    /// A field of a probed file holds something that is not the number expected.
    #[error("{path}: cannot parse {field} from {value:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The field's name as the file spells it.
        field: &'static str,
        /// The text found.
        value: String,
    },
    /// No line of the mount table holds the path asked about.
    #[error("{path}: no mount holds this path")]
    NoMount {
        /// The path, made absolute.
        path: PathBuf,
    },
    /// A step of the read-speed probe failed (creating, writing or reading its file).
    ///
    /// What to do: the read-speed probe writes a file in the folder it measures: give a folder on
    /// the same drive that this user can write to, with a few hundred MB free.
    #[error("read-speed probe in {dir}: {what}: {source}")]
    Probe {
        /// The folder the probe file was written in.
        dir: PathBuf,
        /// The step that failed, as a verb phrase.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A probe's own thread could not be started (the RSS sampler's).
    ///
    /// What to do: the system refused a thread (a thread or process limit such as `ulimit -u`):
    /// raise the limit.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// The thread's job, for the message ("RSS sampler").
        what: &'static str,
        /// The error from starting the thread.
        #[source]
        source: std::io::Error,
    },
}

/// Where the probes look for `/proc`, `/sys` and `/etc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoots {
    /// Stands for `/proc`.
    pub proc: PathBuf,
    /// Stands for `/sys`.
    pub sys: PathBuf,
    /// Stands for `/etc` (only `os-release` is read there).
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

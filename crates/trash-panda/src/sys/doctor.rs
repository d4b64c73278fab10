//! The hardware report of `trash-panda doctor`: what a bug report needs to know about the machine.
//!
//! Collecting never fails as a whole: a section that cannot be read carries its error message,
//! because a partial report is still what the user needs to paste.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::disk::{self, MountInfo, ReadProbe};
use super::meminfo::MemoryFigures;
use super::nvml::{self, GpuProbe};
use super::{platform, SysRoots};
use crate::units::format_bytes;

/// CPU flags that matter for the conversion kernels.
pub const CPU_FLAGS_OF_INTEREST: [&str; 5] =
    ["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "f16c"];

/// The CPU, as far as the conversion kernels care.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuInfo {
    /// The model name the system gives.
    pub model: String,
    /// Hardware threads the system reports.
    pub logical_cores: usize,
    /// The flags of [`CPU_FLAGS_OF_INTEREST`] this CPU has.
    pub flags: Vec<String>,
}

/// What `trash-panda doctor` prints: the machine as the planner and the engine see it. Each
/// probe that can fail holds its error as text, so one failed probe does not hide the others.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorReport {
    /// The system's name and version (`PRETTY_NAME` of `os-release` on Linux).
    pub os: Result<String, String>,
    /// The kernel's name and release (`uname`'s sysname and release; "unknown" if it fails).
    pub kernel: String,
    /// The machine's architecture as the system reports it (`x86_64`, `aarch64`).
    pub arch: String,
    /// The CPU.
    pub cpu: Result<CpuInfo, String>,
    /// RAM, swap and cgroup figures.
    pub memory: Result<MemoryFigures, String>,
    /// The GPUs NVML sees.
    pub gpus: GpuProbe,
    /// The mount holding the path asked about; `None` when no path was given.
    pub mount: Option<Result<MountInfo, String>>,
    /// The read-speed test; `None` when it was not asked for.
    pub read_probe: Option<Result<ReadProbe, String>>,
}

/// How much the read-speed probe writes and how long it reads.
pub const PROBE_FILE_BYTES: u64 = 256 << 20;
/// The longest the read-speed probe reads, in seconds (see [`PROBE_FILE_BYTES`]).
pub const PROBE_SECONDS: u64 = 2;

impl DoctorReport {
    /// Collects the report for the machine, with the filesystem of `path` and, if `probe`, a
    /// two-second read-speed test there.
    pub fn collect(path: &Path, probe: bool) -> Self {
        Self::collect_at(&SysRoots::default(), Some(path), probe, nvml::probe())
    }

    /// Collects from the given roots, with an already made GPU probe (tests pass a fake one).
    pub fn collect_at(roots: &SysRoots, path: Option<&Path>, probe: bool, gpus: GpuProbe) -> Self {
        let mount = path.map(|p| disk::mount_of(roots, p).map_err(|e| e.to_string()));
        let read_probe = match (path, probe) {
            (Some(p), true) => {
                let dir = if p.is_dir() {
                    p
                } else {
                    p.parent().unwrap_or(Path::new("."))
                };
                Some(
                    disk::read_speed(dir, PROBE_FILE_BYTES, Duration::from_secs(PROBE_SECONDS))
                        .map_err(|e| e.to_string()),
                )
            }
            _ => None,
        };
        let (kernel, arch) = platform::kernel_and_arch();
        DoctorReport {
            os: platform::os_name(roots),
            kernel,
            arch,
            cpu: platform::cpu_info(roots),
            memory: platform::memory(roots).map_err(|e| e.to_string()),
            gpus,
            mount,
            read_probe,
        }
    }
}

/// Parses `/proc/cpuinfo`: the first model name, the number of processors, the flags of interest.
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut model = None;
    let mut cores = 0;
    let mut flags = Vec::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "processor" => cores += 1,
            "model name" if model.is_none() => model = Some(value.trim().to_string()),
            "flags" if flags.is_empty() => {
                let present: Vec<&str> = value.split_whitespace().collect();
                flags = CPU_FLAGS_OF_INTEREST
                    .iter()
                    .filter(|f| present.contains(f))
                    .map(|f| f.to_string())
                    .collect();
            }
            _ => {}
        }
    }
    CpuInfo {
        model: model.unwrap_or_else(|| "unknown".into()),
        logical_cores: cores,
        flags,
    }
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |r: &Result<String, String>| match r {
            Ok(v) | Err(v) => v.clone(),
        };
        writeln!(f, "os:      {}", show(&self.os))?;
        writeln!(f, "kernel:  {} ({})", self.kernel, self.arch)?;
        match &self.cpu {
            Ok(c) => writeln!(
                f,
                "cpu:     {}, {} logical cores, flags: {}",
                c.model,
                c.logical_cores,
                if c.flags.is_empty() {
                    "none of interest".to_string()
                } else {
                    c.flags.join(" ")
                }
            )?,
            Err(e) => writeln!(f, "cpu:     {e}")?,
        }
        match &self.memory {
            Ok(m) => {
                writeln!(
                    f,
                    "ram:     {} total, {} available, {} usable",
                    format_bytes(m.total_ram),
                    format_bytes(m.available_ram),
                    format_bytes(m.usable_ram())
                )?;
                writeln!(
                    f,
                    "swap:    {} total, {} free",
                    format_bytes(m.swap_total),
                    format_bytes(m.swap_free)
                )?;
                if let Some(c) = &m.commit {
                    writeln!(
                        f,
                        "commit:  {} limit, {} available{}",
                        format_bytes(c.limit),
                        format_bytes(c.available),
                        if m.commit_below_available() {
                            " (below the free RAM: plans use the commit headroom)"
                        } else {
                            ""
                        }
                    )?;
                }
                match &m.cgroup {
                    Some(cg) => writeln!(
                        f,
                        "cgroup:  v{} limit {}, usage {} ({})",
                        cg.version,
                        format_bytes(cg.limit),
                        cg.usage.map_or("unknown".into(), format_bytes),
                        cg.path
                    )?,
                    None if platform::HAS_CGROUPS => writeln!(f, "cgroup:  no memory limit")?,
                    None => {}
                }
            }
            Err(e) => writeln!(f, "ram:     {e}")?,
        }
        match &self.gpus {
            GpuProbe::NoDriver { .. } => writeln!(f, "gpu:     no NVIDIA driver found")?,
            GpuProbe::Failed { reason } => writeln!(f, "gpu:     NVML error: {reason}")?,
            GpuProbe::Found { driver, devices } => {
                writeln!(f, "gpu:     driver {driver}, {} device(s)", devices.len())?;
                for d in devices {
                    writeln!(
                        f,
                        "  [{}] {}: {} total, {} free",
                        d.index,
                        d.name,
                        format_bytes(d.total),
                        format_bytes(d.free)
                    )?;
                }
            }
        }
        match &self.mount {
            Some(Ok(m)) => writeln!(
                f,
                "disk:    {} on {} ({}, device {})",
                m.mount_point, m.source, m.fs_type, m.device
            )?,
            Some(Err(e)) => writeln!(f, "disk:    {e}")?,
            None => {}
        }
        match &self.read_probe {
            Some(Ok(p)) => writeln!(
                f,
                "read:    {:.0} MB/s ({} in {:.2} s{})",
                p.mb_per_s,
                format_bytes(p.bytes_read),
                p.seconds,
                if p.cache_dropped {
                    ", cold"
                } else {
                    ", page cache not dropped"
                }
            )?,
            Some(Err(e)) => writeln!(f, "read:    {e}")?,
            None => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "reads fake /proc and /etc trees, which only the Linux probes use"
    )]
    fn report_from_fake_tree() {
        let dir = tempfile::tempdir().unwrap();
        let roots = SysRoots::under(dir.path());
        for d in [&roots.proc, &roots.etc] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(
            roots.etc.join("os-release"),
            "NAME=\"Ubuntu\"\nPRETTY_NAME=\"Ubuntu 24.04 LTS\"\n",
        )
        .unwrap();
        std::fs::write(
            roots.proc.join("cpuinfo"),
            "processor\t: 0\nmodel name\t: Fake CPU\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\
             processor\t: 1\nmodel name\t: Fake CPU\nflags\t\t: fpu avx2\n",
        )
        .unwrap();
        std::fs::write(
            roots.proc.join("meminfo"),
            "MemTotal: 1000 kB\nMemAvailable: 500 kB\n",
        )
        .unwrap();
        let gpus = GpuProbe::NoDriver {
            reason: "none".into(),
        };
        let r = DoctorReport::collect_at(&roots, None, false, gpus);
        assert_eq!(r.os.as_deref(), Ok("Ubuntu 24.04 LTS"));
        let cpu = r.cpu.clone().unwrap();
        assert_eq!(cpu.logical_cores, 2);
        assert_eq!(cpu.flags, ["avx2", "avx512f", "avx512_bf16"]);
        let text = r.to_string();
        assert!(text.contains("no NVIDIA driver found"), "{text}");
        assert!(text.contains("Fake CPU, 2 logical cores"), "{text}");
        assert!(serde_json::to_string(&r).unwrap().contains("no_driver"));
    }

    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "reads fake /proc and /etc trees, which only the Linux probes use"
    )]
    fn missing_files_are_sections_not_failures() {
        let dir = tempfile::tempdir().unwrap();
        let roots = SysRoots::under(dir.path());
        let gpus = GpuProbe::NoDriver {
            reason: "none".into(),
        };
        let r = DoctorReport::collect_at(&roots, Some(Path::new("/")), false, gpus);
        assert!(r.os.is_err() && r.cpu.is_err() && r.memory.is_err());
        assert!(r.to_string().contains("os-release"));
    }
}

//! RAM and swap (from `/proc/meminfo` on Linux), combined with the cgroup limit (Linux) or the
//! commit charge (Windows) into one usable figure.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::cgroup::{self, CgroupMemory};
use super::{read_text, SysError, SysRoots};

/// The memory figures the planner works from. Fill it by hand (tests, `--ram`) or with
/// [`MemoryFigures::probe`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryFigures {
    /// MemTotal: the machine's RAM.
    pub total_ram: u64,
    /// MemAvailable: what can be allocated without swapping.
    pub available_ram: u64,
    /// SwapTotal: swap space, in bytes.
    pub swap_total: u64,
    /// SwapFree: unused swap space, in bytes.
    pub swap_free: u64,
    /// The tightest memory limit of the process's cgroup, if any.
    pub cgroup: Option<CgroupMemory>,
    /// Windows' commit charge: absent elsewhere (and absent from JSON when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<CommitCharge>,
}

/// Windows charges private memory (heap, copy-on-write maps, tensors read into RAM) to the
/// commit limit, RAM plus page files, when it is allocated, not when it is touched. A process
/// past the limit fails to allocate even with RAM free, so the limit caps the RAM plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitCharge {
    /// The commit limit: RAM plus the page files' current size.
    pub limit: u64,
    /// What is left of it.
    pub available: u64,
}

impl MemoryFigures {
    /// Figures for a machine with `ram` bytes, all available, no swap and no cgroup limit.
    pub fn with_ram(ram: u64) -> Self {
        MemoryFigures {
            total_ram: ram,
            available_ram: ram,
            ..Default::default()
        }
    }

    /// The RAM this process can still use: the smallest of MemAvailable, what the cgroup limit
    /// leaves (limit minus usage; the limit alone when usage cannot be read) and, on Windows,
    /// the commit headroom.
    pub fn usable_ram(&self) -> u64 {
        let cgroup = self
            .cgroup
            .as_ref()
            .map_or(u64::MAX, CgroupMemory::headroom);
        self.available_ram
            .min(cgroup)
            .min(self.commit_headroom().unwrap_or(u64::MAX))
    }

    /// What the commit limit still allows (Windows only).
    pub fn commit_headroom(&self) -> Option<u64> {
        self.commit.map(|c| c.available)
    }

    /// True for figures of a Windows machine, the only ones with a commit charge. The plan's
    /// Windows-only warnings follow the figures, not the platform the planner runs on, so the
    /// same figures give the same plan everywhere.
    pub fn is_windows(&self) -> bool {
        self.commit.is_some()
    }

    /// True when the commit headroom, not the free RAM, decides what the plan may use.
    pub fn commit_below_available(&self) -> bool {
        self.commit_headroom()
            .is_some_and(|c| c < self.available_ram)
    }

    /// True when a cgroup limit is set below the machine's RAM: then the limit, not the RAM,
    /// decides when the process is killed.
    pub fn cgroup_below_ram(&self) -> bool {
        self.cgroup
            .as_ref()
            .is_some_and(|cg| cg.limit < self.total_ram)
    }

    /// Probes the running machine: `/proc/meminfo` and the cgroup on Linux,
    /// `GlobalMemoryStatusEx` (with the commit charge) on Windows, `sysctl` and
    /// `host_statistics64` on macOS.
    pub fn probe() -> Result<Self, SysError> {
        super::platform::memory(&SysRoots::default())
    }

    /// Reads a Linux machine's figures from the `/proc` and `/sys` trees at `roots`
    /// (`<proc>/meminfo` and the cgroup limit). A plain file reader, so tests of it run on
    /// every platform.
    pub fn probe_at(roots: &SysRoots) -> Result<Self, SysError> {
        let path = roots.proc.join("meminfo");
        let mut figures = parse_meminfo(&path, &read_text(&path)?)?;
        figures.cgroup = cgroup::probe(roots)?;
        Ok(figures)
    }
}

/// Parses the text of `/proc/meminfo` (values in kB, which the kernel means as KiB).
pub fn parse_meminfo(path: &Path, text: &str) -> Result<MemoryFigures, SysError> {
    let field = |name: &'static str| -> Result<Option<u64>, SysError> {
        for line in text.lines() {
            let Some((key, rest)) = line.split_once(':') else {
                continue;
            };
            if key.trim() != name {
                continue;
            }
            let number = rest.trim().trim_end_matches("kB").trim();
            let kib: u64 = number.parse().map_err(|_| SysError::Parse {
                path: path.to_path_buf(),
                field: name,
                value: rest.trim().to_string(),
            })?;
            return Ok(Some(kib * 1024));
        }
        Ok(None)
    };
    let missing = |field| SysError::MissingField {
        path: path.to_path_buf(),
        field,
    };
    let total_ram = field("MemTotal")?.ok_or_else(|| missing("MemTotal"))?;
    // Kernels before 3.14 have no MemAvailable; MemFree undercounts but never overcounts.
    let available_ram = match field("MemAvailable")? {
        Some(v) => v,
        None => field("MemFree")?.ok_or_else(|| missing("MemAvailable"))?,
    };
    Ok(MemoryFigures {
        total_ram,
        available_ram,
        swap_total: field("SwapTotal")?.unwrap_or(0),
        swap_free: field("SwapFree")?.unwrap_or(0),
        cgroup: None,
        commit: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       16303500 kB\nMemFree:         1000000 kB\n\
        MemAvailable:    8000000 kB\nBuffers:          123 kB\nSwapTotal:       2097148 kB\n\
        SwapFree:        2097148 kB\n";

    #[test]
    fn parses_meminfo() {
        let f = parse_meminfo(Path::new("meminfo"), MEMINFO).unwrap();
        assert_eq!(f.total_ram, 16_303_500 * 1024);
        assert_eq!(f.available_ram, 8_000_000 * 1024);
        assert_eq!(f.swap_total, 2_097_148 * 1024);
        assert_eq!(f.usable_ram(), f.available_ram);
    }

    #[test]
    fn falls_back_to_memfree_and_reports_missing_total() {
        let f = parse_meminfo(Path::new("m"), "MemTotal: 10 kB\nMemFree: 4 kB\n").unwrap();
        assert_eq!(f.available_ram, 4096);
        let err = parse_meminfo(Path::new("m"), "MemFree: 4 kB\n").unwrap_err();
        assert!(matches!(
            err,
            SysError::MissingField {
                field: "MemTotal",
                ..
            }
        ));
        let err = parse_meminfo(Path::new("m"), "MemTotal: lots kB\n").unwrap_err();
        assert!(err.to_string().contains("lots"), "{err}");
    }

    #[test]
    fn commit_headroom_caps_usable_ram_where_it_is_tighter() {
        let mut f = MemoryFigures::with_ram(16 << 30);
        f.commit = Some(CommitCharge {
            limit: 24 << 30,
            available: 6 << 30,
        });
        assert_eq!(f.usable_ram(), 6 << 30);
        assert!(f.commit_below_available());
        f.commit = Some(CommitCharge {
            limit: 40 << 30,
            available: 30 << 30,
        });
        assert_eq!(f.usable_ram(), 16 << 30);
        assert!(!f.commit_below_available());
        // Absent on Linux, and then absent from the JSON the plan carries.
        let json = serde_json::to_string(&MemoryFigures::with_ram(1)).unwrap();
        assert!(!json.contains("commit"), "{json}");
    }

    #[test]
    fn probes_the_real_machine() {
        // Linux CI and dev machines all have /proc/meminfo; the figures must be sane.
        let f = MemoryFigures::probe().unwrap();
        assert!(f.total_ram > 0 && f.usable_ram() <= f.total_ram);
        // Only Windows has a commit charge.
        assert_eq!(f.commit.is_some(), cfg!(windows));
    }

    /// The cgroup's limit and usage, read through the cgroup files, as the usable figure.
    mod with_cgroup {
        use super::super::*;
        use std::fs;

        fn write(path: &Path, text: &str) {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }

        const MEMINFO: &str = "MemTotal: 16000000 kB\nMemAvailable: 12000000 kB\n";

        #[test]
        fn v2_limit_below_available() {
            let dir = tempfile::tempdir().unwrap();
            let roots = SysRoots::under(dir.path());
            write(&roots.proc.join("meminfo"), MEMINFO);
            write(
                &roots.proc.join("self/cgroup"),
                "0::/user.slice/app.scope\n",
            );
            let cg = roots.sys.join("fs/cgroup");
            write(&cg.join("cgroup.controllers"), "memory\n");
            write(&cg.join("user.slice/memory.max"), "8000000000\n");
            write(&cg.join("user.slice/memory.current"), "1000000000\n");
            write(&cg.join("user.slice/app.scope/memory.max"), "max\n");
            write(
                &cg.join("user.slice/app.scope/memory.current"),
                "500000000\n",
            );
            let f = MemoryFigures::probe_at(&roots).unwrap();
            let got = f.cgroup.clone().unwrap();
            assert_eq!(
                (got.version, got.limit, got.usage),
                (2, 8_000_000_000, Some(1_000_000_000))
            );
            assert_eq!(f.usable_ram(), 7_000_000_000);
            assert!(f.cgroup_below_ram());
        }

        #[test]
        fn v2_max_means_no_limit() {
            let dir = tempfile::tempdir().unwrap();
            let roots = SysRoots::under(dir.path());
            write(&roots.proc.join("meminfo"), MEMINFO);
            write(&roots.proc.join("self/cgroup"), "0::/\n");
            let cg = roots.sys.join("fs/cgroup");
            write(&cg.join("cgroup.controllers"), "memory\n");
            write(&cg.join("memory.max"), "max\n");
            let f = MemoryFigures::probe_at(&roots).unwrap();
            assert_eq!(f.cgroup, None);
            assert_eq!(f.usable_ram(), 12_000_000 * 1024);
        }

        #[test]
        fn v1_hybrid_and_namespaced_path() {
            let dir = tempfile::tempdir().unwrap();
            let roots = SysRoots::under(dir.path());
            write(&roots.proc.join("meminfo"), MEMINFO);
            write(
                &roots.proc.join("self/cgroup"),
                "5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n",
            );
            // The host path /docker/abc is not visible: the limit sits at the mount root.
            let mem = roots.sys.join("fs/cgroup/memory");
            write(&mem.join("memory.limit_in_bytes"), "4000000000\n");
            write(&mem.join("memory.usage_in_bytes"), "3000000000\n");
            let f = MemoryFigures::probe_at(&roots).unwrap();
            assert_eq!(f.cgroup.as_ref().unwrap().version, 1);
            assert_eq!(f.usable_ram(), 1_000_000_000);
        }
    }
}

//! The memory limit of the process's own cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`).
//!
//! Containers and systemd slices often cap memory well below the machine's RAM; MemAvailable
//! does not know that, and the OOM killer acts on the cgroup, so the planner must.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{read_text, SysError, SysRoots};

/// v1 writes "no limit" as a page-rounded `i64::MAX`; anything this large is no limit.
const V1_UNLIMITED: u64 = 1 << 60;

/// The tightest memory limit found on the path from the process's cgroup to the root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupMemory {
    /// 1 or 2.
    pub version: u8,
    /// The cgroup directory the limit was read from.
    pub path: String,
    /// The limit in bytes (`memory.max` or `memory.limit_in_bytes`).
    pub limit: u64,
    /// The cgroup's current usage, when readable.
    pub usage: Option<u64>,
}

impl CgroupMemory {
    /// What the limit still lets this cgroup allocate.
    pub fn headroom(&self) -> u64 {
        self.limit.saturating_sub(self.usage.unwrap_or(0))
    }
}

/// Finds the memory limit of the process's cgroup; `None` when there is no limit or no cgroup
/// memory controller. A missing `/proc/self/cgroup` is `None` too (not Linux, or a sandbox).
pub fn probe(roots: &SysRoots) -> Result<Option<CgroupMemory>, SysError> {
    let self_cgroup = roots.proc.join("self/cgroup");
    let Ok(text) = std::fs::read_to_string(&self_cgroup) else {
        return Ok(None);
    };
    let base = roots.sys.join("fs/cgroup");
    let mut v2_path = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2_path = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            // A v1 memory controller wins over the v2 entry of a hybrid setup, whose unified
            // hierarchy carries no memory controller.
            return walk(&base.join("memory"), path, 1);
        }
    }
    match v2_path {
        Some(path) => {
            // Pure v2 mounts at /sys/fs/cgroup; hybrid setups mount it at .../unified.
            let root = if base.join("cgroup.controllers").exists() {
                base
            } else {
                base.join("unified")
            };
            walk(&root, &path, 2)
        }
        None => Ok(None),
    }
}

/// Reads the limit at every level from the process's cgroup up to the mount root and keeps the
/// one that leaves the least room: a parent's limit caps its children.
fn walk(root: &Path, cgroup_path: &str, version: u8) -> Result<Option<CgroupMemory>, SysError> {
    let (limit_file, usage_file) = match version {
        1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        _ => ("memory.max", "memory.current"),
    };
    let mut dir: PathBuf = root.join(cgroup_path.trim_start_matches('/'));
    // Inside a cgroup namespace (most containers) the path names a cgroup of the host that is
    // not visible; the container's own cgroup is the mount root.
    if !dir.exists() {
        dir = root.to_path_buf();
    }
    let mut best: Option<CgroupMemory> = None;
    loop {
        if let Some(limit) = read_limit(&dir.join(limit_file))? {
            let usage = read_number(&dir.join(usage_file)).ok();
            let found = CgroupMemory {
                version,
                path: dir.display().to_string(),
                limit,
                usage,
            };
            if best
                .as_ref()
                .is_none_or(|b| found.headroom() < b.headroom())
            {
                best = Some(found);
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    Ok(best)
}

fn read_limit(path: &Path) -> Result<Option<u64>, SysError> {
    if !path.exists() {
        return Ok(None);
    }
    let text = read_text(path)?;
    let value = text.trim();
    if value == "max" {
        return Ok(None);
    }
    let limit: u64 = value.parse().map_err(|_| SysError::Parse {
        path: path.to_path_buf(),
        field: "memory limit",
        value: value.to_string(),
    })?;
    Ok((limit < V1_UNLIMITED).then_some(limit))
}

fn read_number(path: &Path) -> Result<u64, SysError> {
    let text = read_text(path)?;
    text.trim().parse().map_err(|_| SysError::Parse {
        path: path.to_path_buf(),
        field: "memory usage",
        value: text.trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn v1_unlimited_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let roots = SysRoots::under(dir.path());
        write(&roots.proc.join("self/cgroup"), "4:memory:/\n");
        let mem = roots.sys.join("fs/cgroup/memory");
        write(&mem.join("memory.limit_in_bytes"), "9223372036854771712\n");
        assert_eq!(probe(&roots).unwrap(), None);
        write(&mem.join("memory.limit_in_bytes"), "lots\n");
        let err = probe(&roots).unwrap_err();
        assert!(matches!(err, SysError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("lots"));
    }

    #[test]
    fn no_cgroup_file_is_no_limit() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(probe(&SysRoots::under(dir.path())).unwrap(), None);
    }
}

//! What the probes ask of the operating system, one module per platform behind the same
//! functions, so the rest of `sys` (and the planner above it) carries no `cfg` of its own.
//!
//! Every platform module provides:
//! - `memory(roots)`: RAM, swap, and the cgroup limit (Linux) or the commit charge (Windows);
//! - `RssSource`: the resident set (working set) of this process, read again and again cheaply;
//! - `DynLib` and `NVML_LIBRARIES`: a run-time loaded library, and where NVML is looked for
//!   (none on macOS, which has no NVIDIA driver);
//! - `os_name(roots)`, `kernel_and_arch()`, `cpu_info(roots)`, `mount_of(roots, path)`: the
//!   doctor's sections;
//! - `trim_heap()`: give freed heap memory back to the system where the allocator keeps it.
//!
//! On Linux the probes read `/proc`, `/sys` and `/etc` under the caller's [`SysRoots`]
//! (so tests use fake trees); on Windows and macOS they ask the system and ignore the roots.
//!
//! [`SysRoots`]: super::SysRoots

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
#[path = "linux.rs"]
mod imp;

#[cfg(any(target_os = "macos", target_os = "ios"))]
#[path = "macos.rs"]
mod imp;

#[cfg(windows)]
#[path = "windows.rs"]
mod imp;

#[cfg(not(any(
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd",
    target_os = "macos",
    target_os = "ios",
    windows
)))]
compile_error!("trash-panda's sys layer has modules for Linux, Windows and macOS only");

#[cfg(unix)]
mod unix;

pub(crate) use imp::*;

/// The CPU flags of [`CPU_FLAGS_OF_INTEREST`](super::doctor::CPU_FLAGS_OF_INTEREST) this CPU
/// has, asked of the CPU itself (where there is no `/proc/cpuinfo` to read them from).
#[cfg_attr(target_os = "linux", allow(dead_code))]
pub(crate) fn detected_cpu_flags() -> Vec<String> {
    #[allow(unused_mut)]
    let mut flags: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let detected = [
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            (
                "avx512_bf16",
                std::arch::is_x86_feature_detected!("avx512bf16"),
            ),
            (
                "avx512_fp16",
                std::arch::is_x86_feature_detected!("avx512fp16"),
            ),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
        ];
        flags.extend(detected.iter().filter(|(_, on)| *on).map(|(name, _)| *name));
    }
    flags.into_iter().map(String::from).collect()
}

/// The number of logical cores the process may use.
#[cfg_attr(target_os = "linux", allow(dead_code))]
pub(crate) fn logical_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

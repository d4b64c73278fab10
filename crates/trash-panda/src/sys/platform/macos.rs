//! macOS: `sysctl` (`hw.memsize`, `vm.swapusage`, the CPU brand, the OS version),
//! `host_statistics64` for the memory the system can hand out, `task_info` for the resident
//! size, `statfs` for the volume. No cgroups and no NVML (Macs have no NVIDIA driver).

use std::ffi::CStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::super::doctor::CpuInfo;
use super::super::{MemoryFigures, MountInfo, SysError, SysRoots};
use super::unix::c_chars;
pub(crate) use super::unix::{kernel_and_arch, DynLib};

/// No NVIDIA driver exists for current Macs: the GPU probe reports no driver without looking.
pub(crate) const NVML_LIBRARIES: &[&str] = &[];

fn call_err(call: &'static str) -> SysError {
    SysError::Call {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// Reads sysctl `name` into `size` bytes at `dst`; returns the bytes written.
///
/// # Safety
/// `dst` must be writable for `size` bytes.
unsafe fn sysctl_into(name: &CStr, dst: *mut u8, size: usize) -> Result<usize, SysError> {
    let mut len = size;
    // SAFETY: name is NUL-terminated; by the contract dst is writable for `len` bytes, which is
    // passed and updated; no new value is set (null, 0).
    let rc =
        unsafe { libc::sysctlbyname(name.as_ptr(), dst.cast(), &mut len, std::ptr::null_mut(), 0) };
    if rc != 0 {
        return Err(call_err("sysctlbyname"));
    }
    Ok(len)
}

fn sysctl_u64(name: &CStr) -> Result<u64, SysError> {
    let mut value = 0u64;
    // SAFETY: value is writable for 8 bytes.
    unsafe { sysctl_into(name, (&mut value as *mut u64).cast(), 8) }?;
    Ok(value)
}

fn sysctl_string(name: &CStr) -> Option<String> {
    let mut buf = [0 as libc::c_char; 256];
    // SAFETY: buf is writable for its length.
    unsafe { sysctl_into(name, buf.as_mut_ptr().cast(), buf.len()) }.ok()?;
    Some(c_chars(&buf))
}

/// Available memory the way the system counts it: free, inactive, speculative and purgeable
/// pages can all be handed to a new allocation without paging anything out.
#[allow(deprecated)] // libc points to the mach2 crate for these; the calls are the same.
fn available_bytes() -> Result<u64, SysError> {
    // SAFETY: vm_statistics64 is plain old data, so all zeroes is a valid value.
    let mut stats: libc::vm_statistics64 = unsafe { std::mem::zeroed() };
    let mut count = libc::HOST_VM_INFO64_COUNT;
    // SAFETY: stats is writable for `count` natural_t words (its size in those units, as
    // HOST_VM_INFO64_COUNT is defined); mach_host_self returns this task's host port.
    let rc = unsafe {
        libc::host_statistics64(
            libc::mach_host_self(),
            libc::HOST_VM_INFO64,
            (&mut stats as *mut libc::vm_statistics64).cast(),
            &mut count,
        )
    };
    if rc != libc::KERN_SUCCESS {
        return Err(SysError::Call {
            call: "host_statistics64",
            source: std::io::Error::other(format!("kern_return_t {rc}")),
        });
    }
    let pages = u64::from(stats.free_count)
        + u64::from(stats.inactive_count)
        + u64::from(stats.speculative_count)
        + u64::from(stats.purgeable_count);
    Ok(pages * crate::io::page_size() as u64)
}

/// Whether memory limits come from cgroups here (the doctor's "cgroup" line).
pub(crate) const HAS_CGROUPS: bool = false;

pub(crate) fn memory(_roots: &SysRoots) -> Result<MemoryFigures, SysError> {
    let total_ram = sysctl_u64(c"hw.memsize")?;
    // SAFETY: xsw_usage is plain old data, so all zeroes is a valid value.
    let mut swap: libc::xsw_usage = unsafe { std::mem::zeroed() };
    // SAFETY: swap is writable for its size. macOS grows swap files on demand, so a failure
    // only means "no swap figures", not a failed probe.
    let swap_ok = unsafe {
        sysctl_into(
            c"vm.swapusage",
            (&mut swap as *mut libc::xsw_usage).cast(),
            std::mem::size_of::<libc::xsw_usage>(),
        )
    }
    .is_ok();
    Ok(MemoryFigures {
        total_ram,
        available_ram: available_bytes()?.min(total_ram),
        swap_total: if swap_ok { swap.xsu_total } else { 0 },
        swap_free: if swap_ok { swap.xsu_avail } else { 0 },
        cgroup: None,
        commit: None,
    })
}

/// The resident size from `task_info(MACH_TASK_BASIC_INFO)`.
#[derive(Debug)]
pub(crate) struct RssSource;

impl RssSource {
    pub(crate) fn open() -> Result<RssSource, SysError> {
        Ok(RssSource)
    }

    pub(crate) fn read_private(&self) -> Result<u64, SysError> {
        private_bytes()
    }

    #[allow(deprecated)] // libc points to the mach2 crate for these; the calls are the same.
    pub(crate) fn read(&self) -> Result<u64, SysError> {
        // SAFETY: mach_task_basic_info is plain old data, so all zeroes is a valid value.
        let mut info: libc::mach_task_basic_info = unsafe { std::mem::zeroed() };
        let mut count = libc::MACH_TASK_BASIC_INFO_COUNT;
        // SAFETY: info is writable for `count` natural_t words (its size in those units);
        // mach_task_self is this task's own port.
        let rc = unsafe {
            libc::task_info(
                libc::mach_task_self(),
                libc::MACH_TASK_BASIC_INFO,
                (&mut info as *mut libc::mach_task_basic_info).cast(),
                &mut count,
            )
        };
        if rc != libc::KERN_SUCCESS {
            return Err(SysError::Call {
                call: "task_info(MACH_TASK_BASIC_INFO)",
                source: std::io::Error::other(format!("kern_return_t {rc}")),
            });
        }
        Ok(info.resident_size)
    }
}

/// macOS has no cheap split of the resident set into file-backed and private pages here, so
/// the private figure is the resident size (an upper bound of it).
pub(crate) fn private_bytes() -> Result<u64, SysError> {
    RssSource.read()
}

pub(crate) fn os_name(_roots: &SysRoots) -> Result<String, String> {
    let version = sysctl_string(c"kern.osproductversion")
        .ok_or_else(|| "sysctl kern.osproductversion is missing".to_string())?;
    Ok(format!("macOS {version}"))
}

pub(crate) fn cpu_info(_roots: &SysRoots) -> Result<CpuInfo, String> {
    Ok(CpuInfo {
        model: sysctl_string(c"machdep.cpu.brand_string").unwrap_or_else(|| "unknown".into()),
        logical_cores: super::logical_cores(),
        flags: super::detected_cpu_flags(),
    })
}

/// The volume holding `path`, from `statfs`.
pub(crate) fn mount_of(_roots: &SysRoots, path: &Path) -> Result<MountInfo, SysError> {
    let read_err = |source| SysError::Read {
        path: path.to_path_buf(),
        source,
    };
    let absolute = std::fs::canonicalize(path).map_err(read_err)?;
    let c_path = std::ffi::CString::new(absolute.as_os_str().as_bytes())
        .map_err(|_| read_err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: statfs is plain old data, so all zeroes is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is NUL-terminated and fs is writable.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut fs) } != 0 {
        return Err(read_err(std::io::Error::last_os_error()));
    }
    Ok(MountInfo {
        mount_point: c_chars(&fs.f_mntonname),
        fs_type: c_chars(&fs.f_fstypename),
        source: c_chars(&fs.f_mntfromname),
        device: std::fs::metadata(&absolute).map_or_else(
            |_| "unknown".into(),
            |m| format!("{:#x}", std::os::unix::fs::MetadataExt::dev(&m)),
        ),
    })
}

/// The system allocator returns freed memory by itself (madvise of free pages).
pub(crate) fn trim_heap() -> bool {
    false
}

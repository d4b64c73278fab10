//! Windows: `GlobalMemoryStatusEx` (RAM and the commit charge), the working set from
//! `K32GetProcessMemoryInfo`, the version and CPU name from the registry, the volume from
//! `GetVolumePathNameW`/`GetVolumeInformationW`, NVML from `nvml.dll`.

use std::ffi::{c_void, CStr, OsStr};
use std::os::windows::ffi::OsStrExt;
use std::path::Path;

use windows_sys::Win32::Foundation::{FreeLibrary, ERROR_SUCCESS, HMODULE};
use windows_sys::Win32::Storage::FileSystem::{GetVolumeInformationW, GetVolumePathNameW};
use windows_sys::Win32::System::LibraryLoader::{
    GetModuleHandleW, GetProcAddress, LoadLibraryExW, LOAD_LIBRARY_SEARCH_SYSTEM32,
};
use windows_sys::Win32::System::ProcessStatus::{K32GetProcessMemoryInfo, PROCESS_MEMORY_COUNTERS};
use windows_sys::Win32::System::Registry::{
    RegGetValueW, HKEY_LOCAL_MACHINE, RRF_RT_REG_DWORD, RRF_RT_REG_SZ,
};
use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, MEMORYSTATUSEX};
use windows_sys::Win32::System::Threading::GetCurrentProcess;

use super::super::doctor::CpuInfo;
use super::super::meminfo::CommitCharge;
use super::super::{MemoryFigures, MountInfo, SysError, SysRoots};

/// Drivers since 2019 put nvml.dll in System32; older ones only under NVSMI.
pub(crate) const NVML_LIBRARIES: &[&str] = &[
    "nvml.dll",
    r"C:\Program Files\NVIDIA Corporation\NVSMI\nvml.dll",
];

const CURRENT_VERSION: &str = r"SOFTWARE\Microsoft\Windows NT\CurrentVersion";
const CPU_0: &str = r"HARDWARE\DESCRIPTION\System\CentralProcessor\0";

fn wide(s: &OsStr) -> Vec<u16> {
    s.encode_wide().chain(std::iter::once(0)).collect()
}

fn from_wide(buf: &[u16]) -> String {
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    String::from_utf16_lossy(&buf[..end])
}

/// Whether memory limits come from cgroups here (the doctor's "cgroup" line).
pub(crate) const HAS_CGROUPS: bool = false;

/// RAM from the physical figures; the commit charge from the page-file figures, which on
/// Windows are the commit limit (RAM plus page files) and what is left of it. Private memory
/// (a copy-on-write map, tensors read into RAM) counts against the commit limit even while RAM
/// is free, so the planner must not plan past it.
pub(crate) fn memory(_roots: &SysRoots) -> Result<MemoryFigures, SysError> {
    // Wine's GlobalMemoryStatusEx now and then succeeds with every figure 0; no machine has 0
    // bytes of RAM, so ask again a few times, then fail rather than plan for no memory.
    let mut status = memory_status()?;
    for _ in 0..5 {
        if status.ullTotalPhys > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        status = memory_status()?;
    }
    if status.ullTotalPhys == 0 {
        return Err(SysError::Call {
            call: "GlobalMemoryStatusEx",
            source: std::io::Error::other("it reported 0 bytes of RAM, six times in a row"),
        });
    }
    let commit = CommitCharge {
        limit: status.ullTotalPageFile,
        available: status.ullAvailPageFile,
    };
    Ok(MemoryFigures {
        total_ram: status.ullTotalPhys,
        available_ram: status.ullAvailPhys,
        // The page files are what the commit limit has beyond RAM.
        swap_total: status.ullTotalPageFile.saturating_sub(status.ullTotalPhys),
        swap_free: status
            .ullAvailPageFile
            .saturating_sub(status.ullAvailPhys)
            .min(status.ullTotalPageFile.saturating_sub(status.ullTotalPhys)),
        cgroup: None,
        commit: Some(commit),
    })
}

fn memory_status() -> Result<MEMORYSTATUSEX, SysError> {
    let mut status = MEMORYSTATUSEX {
        dwLength: std::mem::size_of::<MEMORYSTATUSEX>() as u32,
        ..Default::default()
    };
    // SAFETY: status is writable and its dwLength is set, as GlobalMemoryStatusEx requires.
    if unsafe { GlobalMemoryStatusEx(&mut status) } == 0 {
        return Err(SysError::Call {
            call: "GlobalMemoryStatusEx",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(status)
}

/// The working set of this process (what Task Manager calls memory), the closest Windows has
/// to a resident set size.
#[derive(Debug)]
pub(crate) struct RssSource;

impl RssSource {
    pub(crate) fn open() -> Result<RssSource, SysError> {
        Ok(RssSource)
    }

    pub(crate) fn read_private(&self) -> Result<u64, SysError> {
        private_bytes()
    }

    pub(crate) fn read(&self) -> Result<u64, SysError> {
        let mut counters = PROCESS_MEMORY_COUNTERS {
            cb: std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32,
            ..Default::default()
        };
        // SAFETY: GetCurrentProcess is a pseudo-handle that needs no closing; counters is
        // writable and its size is passed.
        let ok =
            unsafe { K32GetProcessMemoryInfo(GetCurrentProcess(), &mut counters, counters.cb) };
        if ok == 0 {
            return Err(SysError::Call {
                call: "K32GetProcessMemoryInfo",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(counters.WorkingSetSize as u64)
    }
}

/// The private bytes of this process (its commit charge, `PagefileUsage`, which Task Manager
/// calls the commit size): heap and anonymous memory, not mapped files.
pub(crate) fn private_bytes() -> Result<u64, SysError> {
    let mut counters = PROCESS_MEMORY_COUNTERS {
        cb: std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32,
        ..Default::default()
    };
    // SAFETY: as in RssSource::read.
    let ok = unsafe { K32GetProcessMemoryInfo(GetCurrentProcess(), &mut counters, counters.cb) };
    if ok == 0 {
        return Err(SysError::Call {
            call: "K32GetProcessMemoryInfo",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(counters.PagefileUsage as u64)
}

fn registry_string(key: &str, value: &str) -> Option<String> {
    let (key, value) = (wide(OsStr::new(key)), wide(OsStr::new(value)));
    let mut buf = [0u16; 256];
    let mut size = std::mem::size_of_val(&buf) as u32;
    // SAFETY: key and value are NUL-terminated; buf is writable for `size` bytes, which is
    // passed and updated by the call; a null type pointer is allowed.
    let rc = unsafe {
        RegGetValueW(
            HKEY_LOCAL_MACHINE,
            key.as_ptr(),
            value.as_ptr(),
            RRF_RT_REG_SZ,
            std::ptr::null_mut(),
            buf.as_mut_ptr().cast(),
            &mut size,
        )
    };
    (rc == ERROR_SUCCESS).then(|| from_wide(&buf).trim().to_string())
}

fn registry_dword(key: &str, value: &str) -> Option<u32> {
    let (key, value) = (wide(OsStr::new(key)), wide(OsStr::new(value)));
    let mut data = 0u32;
    let mut size = std::mem::size_of::<u32>() as u32;
    // SAFETY: as in registry_string, with a 4-byte destination for a REG_DWORD.
    let rc = unsafe {
        RegGetValueW(
            HKEY_LOCAL_MACHINE,
            key.as_ptr(),
            value.as_ptr(),
            RRF_RT_REG_DWORD,
            std::ptr::null_mut(),
            (&mut data as *mut u32).cast(),
            &mut size,
        )
    };
    (rc == ERROR_SUCCESS).then_some(data)
}

fn build_number() -> Option<u32> {
    registry_string(CURRENT_VERSION, "CurrentBuildNumber")?
        .parse()
        .ok()
}

/// "Windows 11 Pro 23H2". Windows 11 still calls itself "Windows 10" in ProductName; the build
/// number (22000 and later) tells them apart.
pub(crate) fn os_name(_roots: &SysRoots) -> Result<String, String> {
    let product = registry_string(CURRENT_VERSION, "ProductName")
        .ok_or_else(|| format!(r"HKLM\{CURRENT_VERSION}: no ProductName"))?;
    let product = match build_number() {
        Some(b) if b >= 22000 => product.replacen("Windows 10", "Windows 11", 1),
        _ => product,
    };
    Ok(match registry_string(CURRENT_VERSION, "DisplayVersion") {
        Some(release) => format!("{product} {release}"),
        None => product,
    })
}

/// "Windows NT build 22631.3880", with the Wine version when running under Wine (its ntdll
/// exports `wine_get_version`), since a report from Wine says nothing about real Windows.
pub(crate) fn kernel_and_arch() -> (String, String) {
    let build = build_number().map_or("unknown".to_string(), |b| b.to_string());
    let mut kernel = match registry_dword(CURRENT_VERSION, "UBR") {
        Some(ubr) => format!("Windows NT build {build}.{ubr}"),
        None => format!("Windows NT build {build}"),
    };
    if let Some(wine) = wine_version() {
        kernel.push_str(&format!(" (Wine {wine})"));
    }
    (kernel, std::env::consts::ARCH.to_string())
}

fn wine_version() -> Option<String> {
    let ntdll = wide(OsStr::new("ntdll.dll"));
    // SAFETY: the name is NUL-terminated; ntdll is loaded in every process and never unloaded,
    // so the module handle needs no release.
    let module = unsafe { GetModuleHandleW(ntdll.as_ptr()) };
    if module.is_null() {
        return None;
    }
    // SAFETY: module is a live module handle and the name is NUL-terminated.
    let f = unsafe { GetProcAddress(module, c"wine_get_version".as_ptr().cast()) }?;
    // SAFETY: Wine documents wine_get_version as `const char *(void)`, returning a static
    // NUL-terminated string; a function pointer of that exact type is what we call.
    let get: unsafe extern "C" fn() -> *const std::ffi::c_char = unsafe { std::mem::transmute(f) };
    // SAFETY: see above: a static string, or null.
    let ptr = unsafe { get() };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated, valid for the life of the process.
    Some(
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned(),
    )
}

pub(crate) fn cpu_info(_roots: &SysRoots) -> Result<CpuInfo, String> {
    Ok(CpuInfo {
        model: registry_string(CPU_0, "ProcessorNameString").unwrap_or_else(|| "unknown".into()),
        logical_cores: super::logical_cores(),
        flags: super::detected_cpu_flags(),
    })
}

/// The volume that holds `path`: its root (`C:\`), filesystem (`NTFS`), label and serial.
pub(crate) fn mount_of(_roots: &SysRoots, path: &Path) -> Result<MountInfo, SysError> {
    let read_err = |source| SysError::Read {
        path: path.to_path_buf(),
        source,
    };
    let absolute = std::path::absolute(path).map_err(read_err)?;
    std::fs::metadata(&absolute).map_err(read_err)?;
    let name = wide(absolute.as_os_str());
    let mut root = [0u16; 512];
    // SAFETY: name is NUL-terminated; root is writable for its length in u16s, which is passed.
    if unsafe { GetVolumePathNameW(name.as_ptr(), root.as_mut_ptr(), root.len() as u32) } == 0 {
        return Err(read_err(std::io::Error::last_os_error()));
    }
    let mut label = [0u16; 261];
    let mut fs_type = [0u16; 261];
    let mut serial = 0u32;
    // SAFETY: root is the NUL-terminated path GetVolumePathNameW wrote; both name buffers are
    // writable for the lengths passed; the pointers we do not need may be null.
    let ok = unsafe {
        GetVolumeInformationW(
            root.as_ptr(),
            label.as_mut_ptr(),
            label.len() as u32,
            &mut serial,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            fs_type.as_mut_ptr(),
            fs_type.len() as u32,
        )
    };
    if ok == 0 {
        return Err(read_err(std::io::Error::last_os_error()));
    }
    let label = from_wide(&label);
    Ok(MountInfo {
        mount_point: from_wide(&root),
        fs_type: from_wide(&fs_type),
        source: if label.is_empty() {
            "unlabelled volume".into()
        } else {
            label
        },
        device: format!("{serial:08X}"),
    })
}

/// Rust's allocator on Windows takes large blocks straight from the system and returns them on
/// free, so there is nothing to trim.
pub(crate) fn trim_heap() -> bool {
    false
}

/// A library loaded with `LoadLibraryExW`, freed on drop.
#[derive(Debug)]
pub(crate) struct DynLib {
    module: HMODULE,
}

impl DynLib {
    /// A bare name is looked up in System32 only (never the current directory, where a planted
    /// DLL would be picked up); a full path is loaded as given.
    pub(crate) fn open(name: &str) -> Result<DynLib, String> {
        let flags = if name.contains('\\') {
            0
        } else {
            LOAD_LIBRARY_SEARCH_SYSTEM32
        };
        let w = wide(OsStr::new(name));
        // SAFETY: w is NUL-terminated; the file handle argument must be null.
        let module = unsafe { LoadLibraryExW(w.as_ptr(), std::ptr::null_mut(), flags) };
        if module.is_null() {
            return Err(format!("{name} cannot be loaded"));
        }
        Ok(DynLib { module })
    }

    /// The address of `name`, or null when the library has no such symbol.
    pub(crate) fn symbol(&self, name: &CStr) -> *mut c_void {
        // SAFETY: self.module is a live module handle and name is NUL-terminated.
        let f = unsafe { GetProcAddress(self.module, name.as_ptr().cast()) };
        f.map_or(std::ptr::null_mut(), |f| f as *mut c_void)
    }
}

impl Drop for DynLib {
    fn drop(&mut self) {
        // SAFETY: the module came from LoadLibraryExW and the owner uses no symbol after this.
        unsafe { FreeLibrary(self.module) };
    }
}

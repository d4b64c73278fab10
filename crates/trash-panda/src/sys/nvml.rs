//! NVIDIA GPUs through NVML, loaded at run time.
//!
//! The library (`libnvidia-ml.so.1` on Linux, `nvml.dll` on Windows) is loaded at run time
//! rather than linked, so the crate builds and runs on machines without a driver; there the
//! probe says "no NVIDIA driver found" and nothing fails. macOS has no NVML at all.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use serde::{Deserialize, Serialize};

use super::platform::{DynLib, NVML_LIBRARIES};

/// One GPU as NVML sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// NVML's index of the GPU (not necessarily CUDA's when `CUDA_VISIBLE_DEVICES` is set).
    pub index: u32,
    /// The product name.
    pub name: String,
    /// Memory in bytes.
    pub total: u64,
    /// Free memory in bytes.
    pub free: u64,
    /// Used memory in bytes, as NVML counts it.
    pub used: u64,
}

/// What the GPU probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuProbe {
    /// NVML could not be loaded: no NVIDIA driver on this machine.
    NoDriver {
        /// Why loading failed, in words.
        reason: String,
    },
    /// The driver is there but NVML reported an error.
    Failed {
        /// NVML's error, in words.
        reason: String,
    },
    /// NVML answered.
    Found {
        /// The driver's version string.
        driver: String,
        /// Every GPU, in NVML's order; may be empty.
        devices: Vec<GpuDevice>,
    },
}

impl GpuProbe {
    /// Free memory of GPU `index`, if the probe found it.
    pub fn free_vram(&self, index: u32) -> Option<u64> {
        match self {
            GpuProbe::Found { devices, .. } => {
                devices.iter().find(|d| d.index == index).map(|d| d.free)
            }
            _ => None,
        }
    }
}

const NVML_SUCCESS: c_int = 0;

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type DriverFn = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> c_int;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
type NameFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
type MemoryFn = unsafe extern "C" fn(Device, *mut NvmlMemory) -> c_int;

/// An opened NVML; NVML shut down (if it was initialised) and the library closed on drop.
struct Library {
    lib: DynLib,
    initialised: bool,
}

impl Library {
    fn open() -> Result<Self, String> {
        if NVML_LIBRARIES.is_empty() {
            return Err("no NVIDIA driver found (this system has no NVML)".into());
        }
        let mut tried = Vec::new();
        for name in NVML_LIBRARIES {
            match DynLib::open(name) {
                Ok(lib) => {
                    return Ok(Library {
                        lib,
                        initialised: false,
                    })
                }
                Err(e) => tried.push(e),
            }
        }
        Err(format!("no NVIDIA driver found ({})", tried.join("; ")))
    }

    /// Looks up `name` and returns it as a function pointer of type `F`.
    ///
    /// # Safety
    /// `F` must be the exact C signature NVML documents for `name`.
    unsafe fn symbol<F: Copy>(&self, name: &CStr) -> Result<F, String> {
        let ptr = self.lib.symbol(name);
        if ptr.is_null() {
            return Err(format!("NVML has no symbol {}", name.to_string_lossy()));
        }
        if std::mem::size_of::<F>() != std::mem::size_of::<*mut c_void>() {
            return Err(format!(
                "{} is not a function pointer",
                std::any::type_name::<F>()
            ));
        }
        // SAFETY: the pointer is non-null, F is pointer-sized (checked above) and, by this
        // function's contract, the function type of the symbol.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) })
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        if self.initialised {
            // SAFETY: nvmlShutdown takes no arguments and returns an int, matching InitFn;
            // it pairs with the successful nvmlInit_v2 recorded in `initialised`.
            if let Ok(shutdown) = unsafe { self.symbol::<InitFn>(c"nvmlShutdown") } {
                // SAFETY: see above; NVML is initialised and no handles outlive this call.
                unsafe { shutdown() };
            }
        }
        // `lib` closes the library after this, once no symbol from it is in use.
    }
}

fn check(what: &str, code: c_int) -> Result<(), String> {
    if code == NVML_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed with NVML error {code}"))
    }
}

fn c_buffer_to_string(buffer: &[c_char]) -> String {
    let bytes: Vec<u8> = buffer
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn query(lib: &mut Library) -> Result<(String, Vec<GpuDevice>), String> {
    // SAFETY: each type alias matches the signature nvml.h gives for that symbol.
    let (init, driver_version, count, handle_by_index, name, memory) = unsafe {
        (
            lib.symbol::<InitFn>(c"nvmlInit_v2")?,
            lib.symbol::<DriverFn>(c"nvmlSystemGetDriverVersion")?,
            lib.symbol::<CountFn>(c"nvmlDeviceGetCount_v2")?,
            lib.symbol::<HandleFn>(c"nvmlDeviceGetHandleByIndex_v2")?,
            lib.symbol::<NameFn>(c"nvmlDeviceGetName")?,
            lib.symbol::<MemoryFn>(c"nvmlDeviceGetMemoryInfo")?,
        )
    };
    // SAFETY: nvmlInit_v2 takes no arguments; it may be called from any thread.
    check("nvmlInit_v2", unsafe { init() })?;
    lib.initialised = true;
    let mut buffer = [0 as c_char; 96];
    // SAFETY: the buffer is writable for its full length, which is passed; NVML writes a
    // NUL-terminated string of at most that many bytes.
    check("nvmlSystemGetDriverVersion", unsafe {
        driver_version(buffer.as_mut_ptr(), buffer.len() as c_uint)
    })?;
    let driver = c_buffer_to_string(&buffer);
    let mut n: c_uint = 0;
    // SAFETY: n is a valid, writable c_uint.
    check("nvmlDeviceGetCount_v2", unsafe { count(&mut n) })?;
    let mut devices = Vec::new();
    for index in 0..n {
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: index < count and device is a writable handle slot.
        check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            handle_by_index(index, &mut device)
        })?;
        let mut name_buffer = [0 as c_char; 96];
        // SAFETY: device is a handle NVML just returned; the buffer length is passed.
        check("nvmlDeviceGetName", unsafe {
            name(
                device,
                name_buffer.as_mut_ptr(),
                name_buffer.len() as c_uint,
            )
        })?;
        let mut info = NvmlMemory::default();
        // SAFETY: device is valid and info is a writable struct laid out as nvmlMemory_t.
        check("nvmlDeviceGetMemoryInfo", unsafe {
            memory(device, &mut info)
        })?;
        devices.push(GpuDevice {
            index,
            name: c_buffer_to_string(&name_buffer),
            total: info.total,
            free: info.free,
            used: info.used,
        });
    }
    Ok((driver, devices))
}

/// Lists the GPUs and the driver version. Never fails: the absence of a driver is a result.
pub fn probe() -> GpuProbe {
    let mut lib = match Library::open() {
        Ok(lib) => lib,
        Err(reason) => return GpuProbe::NoDriver { reason },
    };
    match query(&mut lib) {
        Ok((driver, devices)) => GpuProbe::Found { driver, devices },
        Err(reason) => GpuProbe::Failed { reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_fails() {
        // Without a driver this is NoDriver; on a GPU machine it lists the devices.
        match probe() {
            GpuProbe::NoDriver { reason } => assert!(reason.contains("no NVIDIA driver found")),
            GpuProbe::Failed { reason } => assert!(!reason.is_empty()),
            GpuProbe::Found { devices, .. } => {
                assert!(devices.iter().all(|d| d.free <= d.total))
            }
        }
    }

    #[test]
    fn free_vram_of_found_device() {
        let p = GpuProbe::Found {
            driver: "550".into(),
            devices: vec![GpuDevice {
                index: 0,
                name: "X".into(),
                total: 10,
                free: 7,
                used: 3,
            }],
        };
        assert_eq!(p.free_vram(0), Some(7));
        assert_eq!(p.free_vram(1), None);
        assert_eq!(GpuProbe::NoDriver { reason: "x".into() }.free_vram(0), None);
    }
}

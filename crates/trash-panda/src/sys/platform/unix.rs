//! The parts Linux and macOS share: `uname` and `dlopen`.

use std::ffi::{c_void, CStr, CString};

pub(crate) fn kernel_and_arch() -> (String, String) {
    // SAFETY: utsname is plain old data, so all zeroes is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid, writable utsname; uname fills it with NUL-terminated strings.
    if unsafe { libc::uname(&mut u) } != 0 {
        return ("unknown".into(), std::env::consts::ARCH.into());
    }
    (
        format!("{} {}", c_chars(&u.sysname), c_chars(&u.release)),
        c_chars(&u.machine),
    )
}

/// A NUL-terminated C string in a fixed array, as text.
pub(crate) fn c_chars(f: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = f
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A library opened with `dlopen`, closed on drop.
#[derive(Debug)]
pub(crate) struct DynLib {
    handle: *mut c_void,
}

impl DynLib {
    pub(crate) fn open(name: &str) -> Result<DynLib, String> {
        let c_name = CString::new(name).map_err(|_| format!("{name:?} contains a NUL byte"))?;
        // SAFETY: c_name is NUL-terminated; dlopen has no other preconditions and returns null
        // on failure, which is checked.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("{name} cannot be loaded"));
        }
        Ok(DynLib { handle })
    }

    /// The address of `name`, or null when the library has no such symbol.
    pub(crate) fn symbol(&self, name: &CStr) -> *mut c_void {
        // SAFETY: self.handle is a live handle from dlopen and name is NUL-terminated.
        unsafe { libc::dlsym(self.handle, name.as_ptr()) }
    }
}

impl Drop for DynLib {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and the owner uses no symbol from it after this.
        unsafe { libc::dlclose(self.handle) };
    }
}

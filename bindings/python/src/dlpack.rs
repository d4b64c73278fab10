//! Zero-copy exchange of bytes with torch through the DLPack protocol.
//!
//! The stable ABI (abi3 for Python 3.10) has no buffer protocol for our classes, so bytes go out
//! as `__dlpack__` capsules (torch.from_dlpack wraps them without copying) and come in by asking
//! a tensor for its own capsule and borrowing the pointer while the capsule is alive.
//!
//! Only the legacy, unversioned `"dltensor"` capsule is produced and read: every torch release
//! we support speaks it, and it is all a flat byte view needs.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::{raise, Kind};

const DLTENSOR: &CStr = c"dltensor";
const KDL_CPU: i32 = 1;
const KDL_UINT: u8 = 1;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
#[derive(Debug)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
#[derive(Debug)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// Owner of exported bytes: anything that keeps them valid while torch holds a view.
pub(crate) trait ByteOwner: Send + Sync + 'static {
    /// Start and length of the owned bytes. The memory must be writable (torch may write into
    /// a tensor it was given) and stay valid for as long as the owner lives.
    fn raw_parts(&self) -> (*mut u8, usize);
}

/// What a capsule owns: the managed tensor torch reads, its shape, and the keep-alive.
struct Export {
    managed: DlManagedTensor,
    shape: [i64; 1],
    _owner: Arc<dyn ByteOwner>,
}

unsafe extern "C" fn delete_export(managed: *mut DlManagedTensor) {
    // SAFETY: `manager_ctx` holds the address of the boxed `Export` that `export_capsule`
    // leaked, and DLPack calls the deleter exactly once, so the box is freed exactly once.
    unsafe {
        let ctx = (*managed).manager_ctx.cast::<Export>();
        drop(Box::from_raw(ctx));
    }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule. If a consumer took the tensor it renamed
    // the capsule to "used_dltensor" and now owns the deleter; only an unconsumed capsule
    // (still named "dltensor") is ours to free.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let managed =
                ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr()).cast::<DlManagedTensor>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

/// Makes a `"dltensor"` capsule that shows the owner's bytes as a 1-D uint8 CPU tensor.
pub(crate) fn export_capsule(py: Python<'_>, owner: Arc<dyn ByteOwner>) -> PyResult<Py<PyAny>> {
    let (data, len) = owner.raw_parts();
    let len_i64 = i64::try_from(len).map_err(|_| raise(Kind::Argument, "tensor too large"))?;
    let mut export = Box::new(Export {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: data.cast(),
                device: DlDevice {
                    device_type: KDL_CPU,
                    device_id: 0,
                },
                ndim: 1,
                dtype: DlDataType {
                    code: KDL_UINT,
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export),
        },
        shape: [len_i64],
        _owner: owner,
    });
    // The shape lives in the same heap allocation, so its address is stable once boxed.
    export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
    let raw = Box::into_raw(export);
    // SAFETY: `raw` is a valid, uniquely owned `Export`; storing its own address as the context
    // lets the deleter find and free it.
    let managed = unsafe {
        (*raw).managed.manager_ctx = raw.cast();
        std::ptr::addr_of_mut!((*raw).managed)
    };
    // SAFETY: `managed` stays valid until the deleter runs; the capsule destructor runs the
    // deleter only if no consumer took ownership. On failure we free the export ourselves.
    unsafe {
        let capsule =
            ffi::PyCapsule_New(managed.cast(), DLTENSOR.as_ptr(), Some(capsule_destructor));
        if capsule.is_null() {
            delete_export(managed);
            return Err(PyErr::fetch(py));
        }
        Ok(Py::from_owned_ptr(py, capsule))
    }
}

/// A CPU tensor's bytes, borrowed through its own DLPack capsule.
///
/// The capsule is never consumed: holding it keeps the tensor alive, and dropping it lets the
/// producer's destructor clean up as the protocol intends.
#[derive(Debug)]
pub(crate) struct Borrowed {
    _capsule: Py<PyAny>,
    data: *mut u8,
    len: usize,
}

impl Borrowed {
    /// Borrows `tensor` (anything with `__dlpack__`), which must be a contiguous CPU tensor.
    /// `what` names the argument in errors.
    pub(crate) fn new(tensor: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let capsule = tensor.call_method0("__dlpack__")?;
        // SAFETY: `PyCapsule_IsValid` accepts any object and checks type and name.
        let valid = unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), DLTENSOR.as_ptr()) };
        if valid != 1 {
            return Err(raise(
                Kind::Argument,
                format!("{what}: __dlpack__ did not return a DLPack tensor capsule"),
            ));
        }
        // SAFETY: the capsule is valid and named "dltensor", so its pointer is a
        // DLManagedTensor that lives at least as long as the capsule, which we keep.
        let t = unsafe {
            &(*ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr())
                .cast::<DlManagedTensor>())
            .dl_tensor
        };
        if t.device.device_type != KDL_CPU {
            return Err(raise(
                Kind::Argument,
                format!(
                    "{what}: expected a CPU tensor, got DLPack device type {}",
                    t.device.device_type
                ),
            ));
        }
        let ndim = usize::try_from(t.ndim).unwrap_or(0);
        // SAFETY: DLPack guarantees `shape` (and `strides` when not null) hold `ndim` entries.
        let (shape, strides) = unsafe {
            let shape = if ndim == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(t.shape, ndim)
            };
            let strides = if t.strides.is_null() || ndim == 0 {
                None
            } else {
                Some(std::slice::from_raw_parts(t.strides, ndim))
            };
            (shape, strides)
        };
        let numel: i64 = shape.iter().product();
        if let Some(strides) = strides {
            let mut expected = 1i64;
            for (&dim, &stride) in shape.iter().zip(strides).rev() {
                if dim > 1 && stride != expected {
                    return Err(raise(
                        Kind::Argument,
                        format!("{what}: expected a contiguous tensor"),
                    ));
                }
                expected *= dim;
            }
        }
        let elem = usize::from(t.dtype.bits).div_ceil(8) * usize::from(t.dtype.lanes);
        let len = usize::try_from(numel).unwrap_or(0) * elem;
        let data = if len == 0 {
            std::ptr::NonNull::<u8>::dangling().as_ptr()
        } else {
            // SAFETY: the tensor's first byte is `data + byte_offset` by the DLPack definition.
            unsafe { t.data.cast::<u8>().add(t.byte_offset as usize) }
        };
        Ok(Borrowed {
            _capsule: capsule.unbind(),
            data,
            len,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The byte range as `(start, end)` addresses, to detect overlapping arguments.
    pub(crate) fn span(&self) -> (usize, usize) {
        (self.data as usize, self.data as usize + self.len)
    }

    /// The bytes, read-only.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `data` points to `len` initialised bytes of a tensor kept alive by the capsule
        // we hold; callers never hold this slice together with an overlapping `bytes_mut`
        // (checked by `disjoint`).
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// The bytes, writable.
    ///
    /// # Safety
    ///
    /// The caller must make sure no other slice of the same memory lives while this one does:
    /// no other `bytes`/`bytes_mut` of a `Borrowed` whose span overlaps this one (check with
    /// `disjoint` or an explicit span comparison), and no slice of memory the core owns that
    /// the tensor may view (a staging buffer). The tensor itself must be writable CPU memory,
    /// which a torch tensor borrowed through DLPack is.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: `data` points to `len` initialised bytes kept alive by the capsule we hold;
        // exclusivity is the caller's contract above.
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }
}

/// Fails unless the two borrowed tensors share no byte.
pub(crate) fn disjoint(a: &Borrowed, b: &Borrowed, what: &str) -> PyResult<()> {
    let (a0, a1) = a.span();
    let (b0, b1) = b.span();
    if a.len() > 0 && b.len() > 0 && a0 < b1 && b0 < a1 {
        return Err(raise(
            Kind::Argument,
            format!("{what}: source and destination overlap"),
        ));
    }
    Ok(())
}

//! Zero-copy exchange of bytes with torch through the DLPack protocol.
//!
//! The stable ABI (abi3 for Python 3.10) has no buffer protocol for our classes, so bytes go out
//! as `__dlpack__` capsules (torch.from_dlpack wraps them without copying) and come in by asking
//! a tensor for its own capsule and borrowing the pointer while the capsule is alive.
//!
//! What goes out is one of two kinds of [`Memory`], and the kind decides the capsule:
//! - [`Memory::Writable`] is made only from the core's [`WritableSpan`], which only an owned
//!   buffer (a staging buffer a lease owns alone) or a private copy-on-write map can make: a
//!   write through torch's tensor reaches nothing but that memory. Exported as the consumer asks
//!   (DLPack 1.x `"dltensor_versioned"`, or the legacy `"dltensor"`).
//! - [`Memory::ReadOnly`] is bytes only known as `&[u8]` (shared with the core's own readers):
//!   exported only in a versioned capsule with `DLPACK_FLAG_BITMASK_READ_ONLY` set; a consumer
//!   that cannot take that flag (no `max_version`, or one below 1.0) is refused.
//!
//! Tensors coming in (`Borrowed`) are read from the legacy capsule torch gives without arguments.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;

use trash_panda::io::WritableSpan;

use crate::errors::{raise, Kind};

const DLTENSOR: &CStr = c"dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
const KDL_CPU: i32 = 1;
const KDL_UINT: u8 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the tensor's memory.
pub(crate) const DLPACK_FLAG_READ_ONLY: u64 = 1;
/// The DLPack version our versioned capsules speak.
const DLPACK_MAJOR: u32 = 1;
const DLPACK_MINOR: u32 = 0;

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

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
#[derive(Debug)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

/// Memory an owner shows torch, and whether torch may write it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Memory {
    /// Memory torch may write: an owned buffer or a private map (see [`WritableSpan`]).
    Writable(WritableSpan),
    /// Memory torch must only read (exported with the read-only flag).
    ReadOnly { ptr: *const u8, len: usize },
}

impl Memory {
    /// Bytes torch may only read.
    pub(crate) fn read_only(bytes: &[u8]) -> Self {
        Memory::ReadOnly {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Memory::Writable(span) => span.len(),
            Memory::ReadOnly { len, .. } => *len,
        }
    }

    pub(crate) fn is_read_only(&self) -> bool {
        matches!(self, Memory::ReadOnly { .. })
    }
}

/// Owner of exported bytes: anything that keeps them valid while torch holds a view.
pub(crate) trait ByteOwner: Send + Sync + 'static {
    /// The owned bytes, the same on every call, valid and unmoved for as long as the owner lives.
    /// Writable memory can only be a core [`WritableSpan`]; anything else is read-only.
    fn memory(&self) -> Memory;
}

/// What a capsule owns: the managed tensor torch reads (`M`), its shape, and the keep-alive.
struct Export<M> {
    managed: M,
    shape: [i64; 1],
    _owner: Arc<dyn ByteOwner>,
}

/// The managed tensors of both capsule kinds, for one export path.
trait Managed: Sized + 'static {
    const NAME: &'static CStr;
    fn new(dl_tensor: DlTensor, flags: u64) -> Self;
    fn dl_tensor(&mut self) -> &mut DlTensor;
    fn set_ctx(&mut self, ctx: *mut c_void);
    fn ctx(&self) -> *mut c_void;
    /// Frees the export (the deleter torch calls, or we do for an unconsumed capsule).
    ///
    /// # Safety
    /// `managed` must be the `managed` field of a live `Box<Export<Self>>` leaked by
    /// `export_capsule`, and this must be its only free.
    unsafe fn delete(managed: *mut Self);
}

impl Managed for DlManagedTensor {
    const NAME: &'static CStr = DLTENSOR;
    fn new(dl_tensor: DlTensor, _flags: u64) -> Self {
        DlManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export::<DlManagedTensor>),
        }
    }
    fn dl_tensor(&mut self) -> &mut DlTensor {
        &mut self.dl_tensor
    }
    fn set_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
    unsafe fn delete(managed: *mut Self) {
        // SAFETY: the caller's contract: `managed` is live and freed once.
        unsafe { ((*managed).deleter.expect("set at export"))(managed) }
    }
}

impl Managed for DlManagedTensorVersioned {
    const NAME: &'static CStr = DLTENSOR_VERSIONED;
    fn new(dl_tensor: DlTensor, flags: u64) -> Self {
        DlManagedTensorVersioned {
            version: DlPackVersion {
                major: DLPACK_MAJOR,
                minor: DLPACK_MINOR,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export::<DlManagedTensorVersioned>),
            flags,
            dl_tensor,
        }
    }
    fn dl_tensor(&mut self) -> &mut DlTensor {
        &mut self.dl_tensor
    }
    fn set_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
    unsafe fn delete(managed: *mut Self) {
        // SAFETY: the caller's contract: `managed` is live and freed once.
        unsafe { ((*managed).deleter.expect("set at export"))(managed) }
    }
}

unsafe extern "C" fn delete_export<M: Managed>(managed: *mut M) {
    // SAFETY: `managed` lives inside the boxed `Export<M>` that `export` leaked, and its
    // `manager_ctx` holds that box's address. DLPack calls the deleter exactly once (the
    // consumer, or our capsule destructor for an unconsumed capsule), so the box is freed once.
    unsafe {
        let export = (*managed).ctx().cast::<Export<M>>();
        drop(Box::from_raw(export));
    }
}

unsafe extern "C" fn capsule_destructor<M: Managed>(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule. If a consumer took the tensor it renamed
    // the capsule ("used_...") and now owns the deleter; only an unconsumed capsule (still named
    // `M::NAME`) is ours to free, and its pointer is the `M` that `export_capsule` stored.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr()).cast::<M>();
            M::delete(managed);
        }
    }
}

/// Whether a consumer's `max_version` asks for a versioned (DLPack 1.x) capsule.
pub(crate) fn wants_versioned(max_version: Option<(u32, u32)>) -> bool {
    matches!(max_version, Some((major, _)) if major >= DLPACK_MAJOR)
}

/// Makes a capsule that shows the owner's bytes as a 1-D uint8 CPU tensor: versioned when the
/// consumer's `max_version` allows it (and then read-only for read-only memory), else legacy,
/// which read-only memory refuses (it could not carry the flag).
pub(crate) fn export_capsule(
    py: Python<'_>,
    owner: Arc<dyn ByteOwner>,
    max_version: Option<(u32, u32)>,
) -> PyResult<Py<PyAny>> {
    let memory = owner.memory();
    if wants_versioned(max_version) {
        let flags = if memory.is_read_only() {
            DLPACK_FLAG_READ_ONLY
        } else {
            0
        };
        return export::<DlManagedTensorVersioned>(py, owner, memory, flags);
    }
    if memory.is_read_only() {
        return Err(raise(
            Kind::Argument,
            "__dlpack__: these bytes are read-only, which only a DLPack 1.0 capsule can say: \
             ask with max_version=(1, 0) (torch.from_dlpack does)",
        ));
    }
    export::<DlManagedTensor>(py, owner, memory, 0)
}

fn export<M: Managed>(
    py: Python<'_>,
    owner: Arc<dyn ByteOwner>,
    memory: Memory,
    flags: u64,
) -> PyResult<Py<PyAny>> {
    let len = memory.len();
    let len_i64 = i64::try_from(len).map_err(|_| raise(Kind::Argument, "tensor too large"))?;
    // DLPack's `data` is `void*` for both kinds; for read-only memory the flag (set above, and the
    // only way such memory leaves) is the consumer's promise not to write through it.
    let data: *mut c_void = match memory {
        Memory::Writable(span) => span.as_mut_ptr().cast(),
        Memory::ReadOnly { ptr, .. } => ptr.cast_mut().cast(),
    };
    let dl_tensor = DlTensor {
        data,
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
    };
    let mut export = Box::new(Export {
        managed: M::new(dl_tensor, flags),
        shape: [len_i64],
        _owner: owner,
    });
    // The shape lives in the same heap allocation, so its address is stable once boxed.
    export.managed.dl_tensor().shape = export.shape.as_mut_ptr();
    let raw = Box::into_raw(export);
    // SAFETY: `raw` is a valid, uniquely owned `Export<M>`; storing its own address as the
    // context lets the deleter find and free it.
    let managed = unsafe {
        (*raw).managed.set_ctx(raw.cast());
        std::ptr::addr_of_mut!((*raw).managed)
    };
    // SAFETY: `managed` stays valid until the deleter runs; the capsule destructor runs it only
    // if no consumer took ownership. On failure we free the export ourselves.
    unsafe {
        let capsule = ffi::PyCapsule_New(
            managed.cast(),
            M::NAME.as_ptr(),
            Some(capsule_destructor::<M>),
        );
        if capsule.is_null() {
            M::delete(managed);
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

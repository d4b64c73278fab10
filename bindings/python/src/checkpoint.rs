//! `trash_panda._core.Checkpoint`: the tensor index of a checkpoint and zero-copy views of it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use trash_panda::checkpoint::{Checkpoint, TensorInfo};
use trash_panda::io::{MappedFile, Need, WritableSpan};
use trash_panda::DType;

use crate::dlpack::{export_capsule, ByteOwner, Memory};
use crate::errors::{raise, Kind, ToPyErr};
use crate::gil::without_gil;

/// One tensor's entry in the index.
#[pyclass(name = "TensorInfo", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyTensorInfo {
    /// The tensor's name in the checkpoint, e.g. "model.layers.3.mlp.up_proj.weight".
    #[pyo3(get)]
    name: String,
    /// The dtype as written in the header ("BF16", "F8_E4M3", ...).
    #[pyo3(get)]
    dtype: String,
    /// Elements along each dimension, outermost first; empty for a scalar.
    #[pyo3(get)]
    shape: Vec<usize>,
    /// The path of the checkpoint file that holds it.
    #[pyo3(get)]
    file: PathBuf,
    /// Index of `file` in the checkpoint's files.
    #[pyo3(get)]
    file_index: usize,
    /// Offset of its first byte in `file`, counted from the file's start (header included).
    #[pyo3(get)]
    start: u64,
    /// Offset one past its last byte in `file`.
    #[pyo3(get)]
    end: u64,
    /// The order the model takes its rows in, when not the file's: row `r` of the weight is row
    /// `rows[r]` of the stored tensor (set by `reordered`).
    #[pyo3(get)]
    rows: Option<Vec<u32>>,
    /// The checkpoint's name of the tensor this entry is a part of (set by `sliced`); None when
    /// the entry is a whole tensor of the checkpoint.
    #[pyo3(get)]
    source: Option<String>,
}

impl PyTensorInfo {
    /// The tensor's name in the checkpoint.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The dtype as written in the header.
    pub(crate) fn dtype(&self) -> &str {
        &self.dtype
    }

    /// Offset of the first byte in its file.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// What the planner needs of this tensor, under the model's name `name`.
    pub(crate) fn sizes(&self, name: String) -> PyResult<trash_panda::plan::TensorSizes> {
        let dtype = DType::from_name(&self.dtype).ok_or_else(|| {
            raise(
                Kind::Dtype,
                format!("tensor {name:?}: unknown dtype {:?}", self.dtype),
            )
        })?;
        let sizes = trash_panda::plan::TensorSizes::new(name, dtype, &self.shape)
            .at(self.file_index, self.start);
        Ok(if self.rows.is_some() {
            sizes.reordered()
        } else {
            sizes
        })
    }
}

#[pymethods]
impl PyTensorInfo {
    /// Bytes of its data in the file: `end - start`.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.end - self.start
    }

    /// The same tensor taken by the model with its rows in another order: row `r` of the weight
    /// is row `rows[r]` of the stored tensor, which has at least two dimensions and as many rows
    /// as `rows` gives.
    fn reordered(&self, rows: Vec<u32>) -> PyResult<Self> {
        if !trash_panda::rules::is_row_order(&self.shape, &rows) {
            let stored = self.shape.first().copied().unwrap_or(1);
            return Err(raise(
                Kind::Argument,
                format!(
                    "tensor {:?} of shape {:?}: rows must give one stored row (below {stored}) for \
                     each of its {stored} rows, got {} rows",
                    self.name,
                    self.shape,
                    rows.len()
                ),
            ));
        }
        Ok(PyTensorInfo {
            rows: Some(rows),
            ..self.clone()
        })
    }

    /// Rows `first..first + count` of the tensor (outermost dimension), as an entry of their
    /// own named `name`: their bytes are one run of the file's, whatever the dtype (a GGML
    /// type's blocks lie along the rows). How one tensor of a file holds several of a model's
    /// (a fused projection split in three).
    fn sliced(&self, first: usize, count: usize, name: String) -> PyResult<Self> {
        let rows = self.shape.first().copied().unwrap_or(1);
        let nbytes = self.end - self.start;
        if self.shape.is_empty() || first + count > rows || self.rows.is_some() {
            return Err(raise(
                Kind::Argument,
                format!(
                    "tensor {:?} of shape {:?}: rows {first}..{} are not rows of it (or its rows \
                     are reordered already)",
                    self.name,
                    self.shape,
                    first + count
                ),
            ));
        }
        let row_bytes = if rows == 0 { 0 } else { nbytes / rows as u64 };
        let mut shape = self.shape.clone();
        shape[0] = count;
        Ok(PyTensorInfo {
            name,
            shape,
            start: self.start + first as u64 * row_bytes,
            end: self.start + (first + count) as u64 * row_bytes,
            source: Some(self.source.clone().unwrap_or_else(|| self.name.clone())),
            ..self.clone()
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "TensorInfo(name={:?}, dtype={:?}, shape={:?}, nbytes={})",
            self.name,
            self.dtype,
            self.shape,
            self.end - self.start
        )
    }
}

/// A slice of a private (copy-on-write) map of a checkpoint file, kept alive by torch.
struct MapSlice {
    /// Keeps the map (and so `span`) alive and unmoved.
    _map: Arc<MappedFile>,
    /// Made by the map itself, which only a private map can: torch may write into its view,
    /// and those writes land in this process's own copies of the pages, never in the file.
    span: WritableSpan,
}

impl ByteOwner for MapSlice {
    fn memory(&self) -> Memory {
        Memory::Writable(self.span)
    }
}

/// The bytes of one tensor, handed to torch through `__dlpack__`.
#[pyclass(name = "TensorBytes", module = "trash_panda._core", frozen)]
pub(crate) struct PyTensorBytes {
    owner: Arc<dyn ByteOwner>,
}

impl std::fmt::Debug for PyTensorBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorBytes")
            .field("len", &self.owner.memory().len())
            .finish()
    }
}

impl PyTensorBytes {
    pub(crate) fn from_owner(owner: Arc<dyn ByteOwner>) -> Self {
        PyTensorBytes { owner }
    }
}

#[pymethods]
impl PyTensorBytes {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Py<PyAny>>,
        max_version: Option<Py<PyAny>>,
        dl_device: Option<Py<PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, dl_device);
        let max_version = match max_version {
            Some(v) => Some(v.extract::<(u32, u32)>(py).map_err(|_| {
                raise(
                    Kind::Argument,
                    "TensorBytes.__dlpack__: max_version must be a (major, minor) tuple",
                )
            })?),
            None => None,
        };
        if copy == Some(true) {
            return Err(raise(
                Kind::Argument,
                "TensorBytes.__dlpack__: copy=True is not supported",
            ));
        }
        export_capsule(py, Arc::clone(&self.owner), max_version)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (1, 0)
    }

    fn __len__(&self) -> usize {
        self.owner.memory().len()
    }

    /// True when torch must only read these bytes (its capsule carries DLPack's read-only flag):
    /// memory the core reads too, such as the in-memory RAM tier.
    #[getter]
    fn read_only(&self) -> bool {
        self.owner.memory().is_read_only()
    }
}

/// An opened checkpoint.
#[pyclass(name = "Checkpoint", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyCheckpoint {
    inner: Checkpoint,
    /// Maps are made on first use and shared by every view of the same file.
    maps: Mutex<HashMap<usize, Arc<MappedFile>>>,
}

impl PyCheckpoint {
    fn info(&self, t: &TensorInfo) -> PyTensorInfo {
        PyTensorInfo {
            name: t.name.clone(),
            dtype: t.dtype.safetensors_name().to_string(),
            shape: t.shape.clone(),
            file: self.inner.files()[t.file].clone(),
            file_index: t.file,
            start: t.start,
            end: t.end,
            rows: None,
            source: None,
        }
    }

    fn lookup(&self, name: &str) -> PyResult<&TensorInfo> {
        self.inner.get(name).ok_or_else(|| {
            raise(
                Kind::Checkpoint,
                format!(
                    "{}: no tensor named {name:?}",
                    self.inner.files()[0].display()
                ),
            )
        })
    }
}

#[pymethods]
impl PyCheckpoint {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let inner = without_gil(py, || Checkpoint::open(&path)).map_err(ToPyErr::to_py)?;
        Ok(PyCheckpoint {
            inner,
            maps: Mutex::new(HashMap::new()),
        })
    }

    /// The files of the checkpoint (one, or the shards).
    #[getter]
    fn files(&self) -> Vec<PathBuf> {
        self.inner.files().to_vec()
    }

    fn __len__(&self) -> usize {
        self.inner.tensors().len()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.inner.get(name).is_some()
    }

    /// The metadata of a GGUF file as a dict of its scalar values (strings, numbers, bools;
    /// arrays such as the vocabulary are left out); None for a safetensors checkpoint.
    fn gguf_metadata<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(file) = self.inner.gguf() else {
            return Ok(None);
        };
        let out = PyDict::new(py);
        for (key, value) in &file.metadata {
            if let Some(s) = value.as_str() {
                out.set_item(key, s)?;
            } else if let Some(b) = value.as_bool() {
                out.set_item(key, b)?;
            } else if let Some(i) = value.as_i64() {
                out.set_item(key, i)?;
            } else if let Some(u) = value.as_u64() {
                out.set_item(key, u)?;
            } else if let Some(f) = value.as_f64() {
                out.set_item(key, f)?;
            }
        }
        Ok(Some(out))
    }

    /// Every tensor, by file and then by offset.
    fn tensors(&self) -> Vec<PyTensorInfo> {
        self.inner.tensors().iter().map(|t| self.info(t)).collect()
    }

    /// The entry of one tensor.
    fn info_of(&self, name: &str) -> PyResult<PyTensorInfo> {
        Ok(self.info(self.lookup(name)?))
    }

    /// The tensor's bytes as a zero-copy view of a private map of its file. With a `lane`, its
    /// pages are read in now, holding a place in the lane's drive queue as a read needed now
    /// (so the drive serves it in turn with the models' reads); without, they are read when
    /// first touched.
    #[pyo3(signature = (name, lane=None))]
    fn view(
        &self,
        py: Python<'_>,
        name: &str,
        lane: Option<&crate::io::PyReadLane>,
    ) -> PyResult<PyTensorBytes> {
        let t = self.lookup(name)?;
        let map = {
            let mut maps = self
                .maps
                .lock()
                .map_err(|_| raise(Kind::Read, "map cache poisoned"))?;
            match maps.get(&t.file) {
                Some(m) => Arc::clone(m),
                None => {
                    let path = self.inner.files()[t.file].clone();
                    let m = Arc::new(
                        without_gil(py, || MappedFile::open_private(&path))
                            .map_err(ToPyErr::to_py)?,
                    );
                    maps.insert(t.file, Arc::clone(&m));
                    m
                }
            }
        };
        let (start, len) = (t.start as usize, t.nbytes() as usize);
        if start + len > map.bytes().len() {
            return Err(raise(
                Kind::Checkpoint,
                format!("{}: tensor {:?} ends at byte {} but the file has {} bytes (was it truncated after opening?)",
                    self.inner.files()[t.file].display(), t.name, t.end, map.bytes().len()),
            ));
        }
        if let Some(lane) = lane {
            let lane = lane.inner.clone();
            let map = &map;
            without_gil(py, move || {
                let _place = lane.acquire(Need::Now);
                if map.populate(start..start + len).is_err() {
                    // No populate call here (see `MappedFile::populate`): one fault per page.
                    let bytes = &map.bytes()[start..start + len];
                    let sum = bytes.iter().step_by(4096).fold(0u8, |a, b| a ^ b);
                    std::hint::black_box(sum);
                }
            });
        }
        let span = map.writable(start, start + len).map_err(ToPyErr::to_py)?;
        Ok(PyTensorBytes {
            owner: Arc::new(MapSlice { _map: map, span }),
        })
    }

    /// Raises CheckpointError if the file holding tensor `name` no longer reaches its end
    /// (truncated or rewritten since it was opened): reading a view of it would crash.
    fn check_holds(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let t = self.lookup(name)?;
        without_gil(py, || self.inner.check_holds(t)).map_err(ToPyErr::to_py)
    }

    /// None while every file is the one whose header was read; else which file changed and how
    /// (rewritten, replaced, resized or gone): blocks read again by the old header's offsets
    /// would not be the tensors it names.
    fn changed(&self, py: Python<'_>) -> Option<String> {
        without_gil(py, || self.inner.changed()).map(|c| c.to_string())
    }

    /// Drops the maps made by `view`; views already given to torch keep theirs alive.
    fn close(&self) -> PyResult<()> {
        self.maps
            .lock()
            .map_err(|_| raise(Kind::Read, "map cache poisoned"))?
            .clear();
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "Checkpoint({} file(s), {} tensors)",
            self.inner.files().len(),
            self.inner.tensors().len()
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCheckpoint>()?;
    m.add_class::<PyTensorInfo>()?;
    m.add_class::<PyTensorBytes>()?;
    Ok(())
}
